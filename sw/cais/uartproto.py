"""The framing of the UART control link (docs/board.md, "Control over UART"): the one definition the board's
RTL bridge (:mod:`cais.hdl.board.uart_bridge`), the host's :class:`cais.serial_link.SerialLink` and the tests
derive their command codes, status codes, lengths and checksum from.

A request is ``command, address (4 bytes), [data (4 bytes), WRITE only], check``; a reply is always
``status, data (4 bytes), check``. Address and data are big-endian (the most significant byte first on the
line, as the register map's docs write them). ``check`` is the CRC-8 of every byte before it in the frame
(polynomial x^8 + x^2 + x + 1 = 0x07, initial value 0, no reflection, no final XOR: CRC-8/SMBUS). A CRC
rather than an 8-bit sum because the sum misses two swapped bytes and any pair of errors that cancel (a bit
set in one byte and cleared in the same position of another); the CRC-8 catches every single and double
bit error and every burst of up to 8 bits in frames this short, for 8 XOR gates per bit in the RTL.
"""

from __future__ import annotations

import enum

__all__ = ["Command", "Status", "CRC8_POLY", "crc8", "REQUEST_BYTES", "REPLY_BYTES", "TIMEOUT_BYTE_TIMES",
           "encode_request", "decode_request", "encode_reply", "decode_reply", "FrameError"]

#: The CRC-8 generator polynomial without its x^8 term (CRC-8/SMBUS).
CRC8_POLY = 0x07


class Command(enum.IntEnum):
    """Request command bytes (ASCII letters, so a capture of the line reads)."""
    READ = 0x52       # 'R': read the 32-bit register at the address
    WRITE = 0x57      # 'W': write the data to the register at the address
    CLOCK = 0x43      # 'C': a ping: the reply's data is the bridge's (the switch's) clock in Hz; address ignored


class Status(enum.IntEnum):
    """Reply status bytes. Every status but OK means the request changed nothing."""
    OK = 0x00
    BAD_CHECKSUM = 0x01      # the request's check byte is wrong: no bus access
    UNKNOWN_COMMAND = 0x02   # the first byte is no Command: the bridge drops bytes until the line is quiet
    BUS_ERROR = 0x03         # the register block refused (AXI SLVERR or DECERR: no register there), or the
                             # address is not a multiple of 4 or out of the bus's range (no bus access)
    TIMEOUT = 0x04           # the line went quiet in the middle of a request: it is dropped, no bus access


#: Bytes of each request, the check byte included.
REQUEST_BYTES = {Command.READ: 6, Command.WRITE: 10, Command.CLOCK: 6}
#: Bytes of every reply, the check byte included.
REPLY_BYTES = 6
#: The line is "quiet" after this many byte times (10 bit times each) without a start bit: a request cut there
#: is answered TIMEOUT, and an unknown command is answered once the line is quiet. The RTL bridge may be
#: built with another value (its ``timeout_cycles``); this is its default, in byte times at its baud rate.
TIMEOUT_BYTE_TIMES = 64


class FrameError(ValueError):
    """A frame that cannot be decoded; the message says why."""


def crc8(data: bytes | bytearray, crc: int = 0) -> int:
    """CRC-8/SMBUS of ``data``, continuing from ``crc``: bits enter most significant first."""
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ CRC8_POLY) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _word(value: int, what: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFF_FFFF:
        raise ValueError(f"{what} {value!r} is not a 32-bit unsigned integer")
    return value.to_bytes(4, "big")


def encode_request(command: Command, address: int = 0, data: int | None = None) -> bytes:
    """The bytes of one request; ``data`` is given for WRITE and only for it."""
    command = Command(command)
    if (data is not None) != (command is Command.WRITE):
        raise ValueError(f"{command.name}: data is {'required' if command is Command.WRITE else 'not allowed'}")
    body = bytes([command]) + _word(address, "address") + (_word(data, "data") if data is not None else b"")
    return body + bytes([crc8(body)])


def decode_request(frame: bytes) -> tuple[Command, int, int | None]:
    """(command, address, data or None) of a whole request; :class:`FrameError` if it is not one."""
    frame = bytes(frame)
    if not frame:
        raise FrameError("empty request")
    try:
        command = Command(frame[0])
    except ValueError:
        raise FrameError(f"unknown command byte {frame[0]:#04x}") from None
    if len(frame) != REQUEST_BYTES[command]:
        raise FrameError(f"{command.name}: {len(frame)} bytes, want {REQUEST_BYTES[command]}")
    if crc8(frame) != 0:
        raise FrameError(f"{command.name}: bad check byte {frame[-1]:#04x}, want {crc8(frame[:-1]):#04x}")
    data = int.from_bytes(frame[5:9], "big") if command is Command.WRITE else None
    return command, int.from_bytes(frame[1:5], "big"), data


def encode_reply(status: Status, data: int = 0) -> bytes:
    body = bytes([Status(status)]) + _word(data, "data")
    return body + bytes([crc8(body)])


def decode_reply(frame: bytes) -> tuple[Status, int]:
    """(status, data) of a whole reply; :class:`FrameError` if its length, check byte or status is wrong."""
    frame = bytes(frame)
    if len(frame) != REPLY_BYTES:
        raise FrameError(f"reply of {len(frame)} bytes, want {REPLY_BYTES}")
    if crc8(frame) != 0:
        raise FrameError(f"reply with a bad check byte {frame[-1]:#04x}, want {crc8(frame[:-1]):#04x}")
    try:
        status = Status(frame[0])
    except ValueError:
        raise FrameError(f"reply with an unknown status byte {frame[0]:#04x}") from None
    return status, int.from_bytes(frame[1:5], "big")
