"""The UART framing (cais.uartproto) against frames worked out by hand, the ``--switch serial:`` address checks,
and cais.serial_link.SerialLink over a pty against a board stand-in: a thread on the pty's master side that
decodes requests and answers from the reference model's registers (cais.sim.refmodel), optionally garbling
or dropping replies. The RTL bridge behind a pty is tb/uart's check."""

from __future__ import annotations

import os
import threading

import pytest

from cais.controller.switch import check_switch_address, open_switch_link
from cais.endpoint import EndpointError
from cais.params import SwitchParams
from cais.registers import MAGIC, register_map
from cais.serial_link import BusError, SerialLink, SerialLinkError, parse_serial_address
from cais.sim.refmodel import SwitchModel
from cais.uartproto import (REQUEST_BYTES, Command, FrameError, Status, crc8, decode_reply, decode_request,
                            encode_reply, encode_request)


# ---------------------------------------------------------------------- framing, against hand-worked bytes
def test_crc8_catalogue_check():
    # CRC-8/SMBUS's published check value: the CRC of the ASCII string "123456789" is 0xF4
    assert crc8(b"123456789") == 0xF4
    assert crc8(b"") == 0
    assert crc8(b"\x01") == 0x07          # one bit at x^0, times x^8, mod x^8+x^2+x+1: the polynomial itself


def test_frames_by_hand():
    # READ 0x3c: 52 00 00 00 3c, check 0x8a (long division by 0x107, worked apart from crc8)
    assert encode_request(Command.READ, 0x3C) == bytes.fromhex("52 0000003c 8a")
    assert encode_request(Command.WRITE, 0x3C, 0x12345678) == bytes.fromhex("57 0000003c 12345678 2b")
    assert encode_request(Command.CLOCK) == bytes.fromhex("43 00000000 6e")
    assert encode_reply(Status.OK, MAGIC) == bytes.fromhex("00 43414953 14")
    assert encode_reply(Status.BUS_ERROR) == bytes.fromhex("03 00000000 a6")
    assert decode_request(bytes.fromhex("57 0000003c 12345678 2b")) == (Command.WRITE, 0x3C, 0x12345678)
    assert decode_reply(bytes.fromhex("00 12345678 1c")) == (Status.OK, 0x12345678)
    assert REQUEST_BYTES == {Command.READ: 6, Command.WRITE: 10, Command.CLOCK: 6}


@pytest.mark.parametrize("frame,why", [
    ("52 0000003c 8b", "bad check byte 0x8b, want 0x8a"),
    ("58 0000003c 00", "unknown command byte 0x58"),
    ("52 0000003c", "READ: 5 bytes, want 6"),
])
def test_bad_requests_named(frame, why):
    with pytest.raises(FrameError, match=why):
        decode_request(bytes.fromhex(frame))


def test_bad_replies_and_arguments():
    with pytest.raises(FrameError, match="reply of 5 bytes"):
        decode_reply(bytes.fromhex("00 12345678"))
    with pytest.raises(FrameError, match="bad check byte"):
        decode_reply(bytes.fromhex("00 12345678 1d"))
    with pytest.raises(FrameError, match="unknown status byte 0x09"):
        decode_reply(bytes([9, 0, 0, 0, 0]) + bytes([crc8(bytes([9, 0, 0, 0, 0]))]))
    with pytest.raises(ValueError, match="WRITE: data is required"):
        encode_request(Command.WRITE, 0)
    with pytest.raises(ValueError, match="address 4294967296 is not a 32-bit"):
        encode_request(Command.READ, 1 << 32)


# ---------------------------------------------------------------------- addresses
def test_serial_addresses():
    assert parse_serial_address("serial:/dev/ttyUSB0") == ("/dev/ttyUSB0", 115200)
    assert parse_serial_address("serial:/dev/ttyUSB0@921600") == ("/dev/ttyUSB0", 921600)
    assert check_switch_address("serial:/dev/ttyACM1@9600") == ("/dev/ttyACM1", 9600)
    check_switch_address("/run/cais/switch.sock")          # an endpoint address still passes


@pytest.mark.parametrize("address,why", [
    ("serial:", "a device path is needed"),
    ("serial:@115200", "a device path is needed"),
    ("serial:/dev/ttyUSB0@fast", "the baud rate after @ must be a positive whole number, not 'fast'"),
    ("serial:/dev/ttyUSB0@0", "must be a positive whole number"),
    ("serial:/dev/ttyUSB0@123456", "123456 baud is not a rate the serial driver offers"),
])
def test_bad_serial_addresses(address, why):
    with pytest.raises(ValueError, match=why):
        check_switch_address(address)


def test_open_errors_are_one_line(tmp_path):
    with pytest.raises(SerialLinkError, match=r"serial:/nonexistent/tty@115200: no such serial port"):
        open_switch_link("serial:/nonexistent/tty")
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(SerialLinkError, match="is not a serial port"):
        open_switch_link(f"serial:{plain}")


def test_controller_command_line_errors(capsys):
    from cais.service import main
    with pytest.raises(SystemExit):
        main(["--switch", "serial:/dev/ttyUSB0@fast", "--http", "127.0.0.1:0", "--world-size", "2"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--switch" in err and "positive whole number" in err and "Traceback" not in err


# ---------------------------------------------------------------------- SerialLink over a pty
class FakeBoard:
    """The bridge's side of the line on a pty master: whole requests decoded, registers of the reference model,
    BUS_ERROR for addresses not in the map; ``mangle`` (a list of actions) garbles or drops the next replies."""

    def __init__(self, clock_hz: int = 125_000_000, params: SwitchParams = SwitchParams()):
        # the slave stays open here too: a pty master whose slave nobody holds reads EIO
        self.master, self._slave = os.openpty()
        self.slave_path = os.ttyname(self._slave)
        self.model, self.clock_hz = SwitchModel(params), clock_hz
        regs = register_map(params)
        self.mapped = {r.address(i) for r in regs for i in range(r.count)}
        self.mangle: list[str] = []
        self.requests: list[bytes] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        buf = bytearray()
        while not self._stop:
            try:
                buf += os.read(self.master, 64)
            except OSError:
                return
            while buf and len(buf) >= REQUEST_BYTES.get(buf[0], 1):
                if buf[0] not in REQUEST_BYTES:
                    del buf[0]
                    continue
                n = REQUEST_BYTES[buf[0]]
                frame, buf = bytes(buf[:n]), buf[n:]
                self.requests.append(frame)
                self._answer(frame)

    def _answer(self, frame):
        command, addr, data = decode_request(frame)
        if command is Command.CLOCK:
            reply = encode_reply(Status.OK, self.clock_hz)
        elif addr not in self.mapped:
            reply = encode_reply(Status.BUS_ERROR)
        elif command is Command.READ:
            reply = encode_reply(Status.OK, self.model.read(addr))
        else:
            self.model.write(addr, data)
            reply = encode_reply(Status.OK)
        action = self.mangle.pop(0) if self.mangle else None
        if action == "drop":
            return
        if action == "flip":
            reply = bytes([reply[0], reply[1] ^ 0x10]) + reply[2:]
        os.write(self.master, reply)

    def close(self):
        self._stop = True
        os.close(self.master)
        os.close(self._slave)


@pytest.fixture
def board():
    b = FakeBoard()
    yield b
    b.close()


def test_serial_link_params_reads_and_writes(board):
    from cais.link import run_sync
    link = SerialLink(board.slave_path, timeout=1.0, quiet=0.05)
    try:
        assert link.params == SwitchParams()
        assert link.clock_hz == 125e6
        epoch = register_map()["EPOCH"].address()
        run_sync(link.write(epoch, 0xCAFE))
        assert board.model.read(epoch) == 0xCAFE
        assert run_sync(link.read(epoch)) == 0xCAFE
        # a garbled reply and a lost one: each request is sent again after a resync
        board.mangle = ["flip", "drop"]
        assert run_sync(link.read(epoch)) == 0xCAFE
        assert link.failures == 2
        assert board.requests[-3:] == [encode_request(Command.READ, epoch)] * 3
        with pytest.raises(BusError, match="register 0x0ffc: the switch refused the read"):
            run_sync(link.read(0xFFC))
        assert isinstance(BusError("x"), EndpointError)
    finally:
        link.close()


def test_serial_link_gives_up_naming_the_request(board):
    from cais.link import run_sync
    link = SerialLink(board.slave_path, timeout=0.3, retries=1, quiet=0.02)
    try:
        board.mangle = ["drop", "drop"]
        with pytest.raises(SerialLinkError, match=r"READ 0x003c: no good reply in 2 tries \(last: no reply"):
            run_sync(link.read(0x3C))
    finally:
        link.close()


def test_serial_link_refuses_a_foreign_device():
    board = FakeBoard()
    board.model.read = lambda addr: 0x12345678          # ID is not "CAIS"
    try:
        with pytest.raises(SerialLinkError, match=r"ID reads 0x12345678, not 0x43414953"):
            SerialLink(board.slave_path, timeout=2.0, quiet=0.05)
    finally:
        board.close()
