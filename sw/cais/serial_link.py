"""The register half of :class:`cais.link.SwitchLink` over a serial port: the FPGA board's UART bridge
(:class:`cais.hdl.board.uart_bridge.UartAxiLiteBridge`, framing :mod:`cais.uartproto`, docs/board.md).

``cais-controller --switch serial:/dev/ttyUSB0[@BAUD]`` drives the board's switch through a
:class:`SerialLink`; :func:`cais.controller.switch.open_switch_link` picks it from the address. The port is
opened with termios (raw, 8N1, no flow control): no dependency beyond the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import termios
import threading
import time

from .endpoint import EndpointError, RefusedError
from .link import run_sync
from .registers import read_params
from .uartproto import REPLY_BYTES, TIMEOUT_BYTE_TIMES, Command, FrameError, Status, decode_reply, encode_request

__all__ = ["SerialLink", "SerialLinkError", "BusError", "SERIAL_PREFIX", "DEFAULT_BAUD", "is_serial_address",
           "parse_serial_address"]

SERIAL_PREFIX = "serial:"
#: The bridge's rate when the address names none (the board top's UART, docs/board.md).
DEFAULT_BAUD = 115200


class SerialLinkError(EndpointError):
    """The serial port could not be opened, or the board gave no good reply after every retry."""


class BusError(RefusedError):
    """The board refused a register access (status BUS_ERROR); the message names the address."""


def is_serial_address(address: str) -> bool:
    return str(address).startswith(SERIAL_PREFIX)


def _speed(baud: int) -> int:
    speed = getattr(termios, f"B{baud}", None)
    if speed is None:
        rates = sorted(int(n[1:]) for n in dir(termios) if n[:1] == "B" and n[1:].isdigit() and int(n[1:]) >= 9600)
        raise ValueError(f"{baud} baud is not a rate the serial driver offers ({', '.join(map(str, rates))})")
    return speed


def parse_serial_address(address: str) -> tuple[str, int]:
    """``serial:PATH[@BAUD]`` -> (path, baud); ValueError with a one-line reason otherwise."""
    text = str(address).strip()
    if not text.startswith(SERIAL_PREFIX):
        raise ValueError(f"{text!r} is not a serial address (serial:/dev/ttyUSB0[@{DEFAULT_BAUD}])")
    path, baud = text[len(SERIAL_PREFIX):], DEFAULT_BAUD
    head, at, tail = path.rpartition("@")
    if at:
        if not tail.isdigit() or int(tail) == 0:
            raise ValueError(f"{text}: the baud rate after @ must be a positive whole number, not {tail!r}")
        path, baud = head, int(tail)
    if not path:
        raise ValueError(f"{text}: a device path is needed, e.g. serial:/dev/ttyUSB0@{DEFAULT_BAUD}")
    _speed(baud)
    return path, baud


def _open_port(path: str, baud: int) -> int:
    """The port opened raw, 8N1, no flow control, non-blocking; OSError / ValueError naming ``path``."""
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        if not os.isatty(fd):
            raise ValueError(f"{path} is not a serial port (not a terminal device)")
        iflag, oflag, cflag, lflag, _, _, cc = termios.tcgetattr(fd)
        speed = _speed(baud)
        cflag = (cflag & ~(termios.CSIZE | termios.PARENB | termios.CSTOPB | getattr(termios, "CRTSCTS", 0))
                 | termios.CS8 | termios.CREAD | termios.CLOCAL)
        cc[termios.VMIN], cc[termios.VTIME] = 0, 0
        termios.tcsetattr(fd, termios.TCSANOW, [0, 0, cflag, 0, speed, speed, cc])
        termios.tcflush(fd, termios.TCIOFLUSH)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SerialLink:
    """The register half of :class:`cais.link.SwitchLink` over the board's UART bridge.

    Same contract as :class:`cais.controller.switch.ControlLink`: the coroutines never suspend (blocking
    reads with a deadline), so :func:`cais.link.run_sync` runs them; ``cycle`` is wall time in clock cycles.
    At start it asks the bridge for the clock (CLOCK) and reads the CONST registers
    (:func:`cais.registers.read_params`: ID, VERSION's major, every build parameter).

    A request whose reply does not come within ``timeout``, comes garbled (a wrong length or check byte), or
    says the request arrived damaged (BAD_CHECKSUM, TIMEOUT, UNKNOWN_COMMAND) is sent again after a resync:
    bytes are read and dropped until the line has been quiet for ``quiet`` seconds, so a late reply is
    never taken for the next request's. Retried writes are harmless for every register but AGED_POP, whose
    write pops one event: a write whose reply was lost may pop two (docs/board.md). BUS_ERROR is not
    retried: :class:`BusError` names the address.

    Members
    -------
    params : SwitchParams
        As the CONST registers say.
    clock_hz : float
        The bridge's (the switch's) clock, from CLOCK.
    timeout : float
        Seconds a request waits for its reply.
    retries : int
        Further tries after a failed one.
    quiet : float
        Seconds of silence that end a resync.
    failures : int
        Tries that got no usable reply.
    reconnects : int
        Always 0 (a serial port is not reconnected).
    backend : str
        ``serial:PATH@BAUD``.
    around_io : callable
        A context manager factory entered around every request (see ControlLink).
    """

    def __init__(self, path: str, baud: int = DEFAULT_BAUD, *, timeout: float = 1.0, retries: int = 3,
                 quiet: float | None = None, retry_for: float = 0.0):
        self.path, self.baud, self.timeout, self.retries = path, int(baud), float(timeout), int(retries)
        # at least twice the bridge's own timeout, so a request it holds half-received has been dropped
        self.quiet = quiet if quiet is not None else 2 * TIMEOUT_BYTE_TIMES * 10 / self.baud + 0.02
        self.backend = f"{SERIAL_PREFIX}{path}@{self.baud}"
        self.failures = self.reconnects = 0
        self.around_io = contextlib.nullcontext
        self._lock = threading.Lock()
        self._fd = self._open(retry_for)
        try:
            self.clock_hz = float(self._transact(Command.CLOCK, 0))
            if self.clock_hz <= 0:
                raise SerialLinkError(f"{self.backend}: the bridge reports a clock of {self.clock_hz:.0f} Hz")
            self.params = run_sync(read_params(self.read))
        except ValueError as e:
            self.close()
            raise SerialLinkError(f"{self.backend}: {e}") from None
        except BaseException:
            self.close()
            raise
        self._t0 = time.monotonic()

    def _open(self, retry_for: float) -> int:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                return _open_port(self.path, self.baud)
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise SerialLinkError(f"{self.backend}: no such serial port") from None
                time.sleep(0.2)
            except ValueError as e:
                raise SerialLinkError(f"{self.backend}: {e}") from None
            except OSError as e:
                raise SerialLinkError(f"{self.backend}: cannot open the serial port: {e.strerror or e}") from None

    @property
    def cycle(self) -> int:
        return int((time.monotonic() - self._t0) * self.clock_hz)

    async def read(self, addr: int) -> int:
        return self._transact(Command.READ, int(addr))

    async def write(self, addr: int, value: int) -> None:
        self._transact(Command.WRITE, int(addr), int(value))

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # ------------------------------------------------------------------ the line
    def _transact(self, command: Command, addr: int, data: int | None = None) -> int:
        """One request, tried up to 1 + ``retries`` times; the reply's data."""
        request = encode_request(command, addr, data)
        what = f"{command.name} {addr:#06x}" if command is not Command.CLOCK else "CLOCK"
        with self.around_io(), self._lock:
            if self._fd is None:
                raise SerialLinkError(f"{self.backend}: the port is closed")
            last = ""
            for attempt in range(1 + self.retries):
                if attempt:
                    self._resync()
                self._drop_waiting()
                self._send(request)
                try:
                    status, value = decode_reply(self._receive(REPLY_BYTES, time.monotonic() + self.timeout))
                except (FrameError, TimeoutError) as e:
                    self.failures += 1
                    last = str(e)
                    continue
                if status is Status.OK:
                    return value
                if status is Status.BUS_ERROR:
                    raise BusError(f"{self.backend}: register {addr:#06x}: the switch refused the "
                                   f"{'write' if command is Command.WRITE else 'read'} (BUS_ERROR: no register "
                                   f"there, or the address is not a word of the map)")
                self.failures += 1
                last = f"the bridge answered {status.name}"
        raise SerialLinkError(f"{self.backend}: {what}: no good reply in {1 + self.retries} tries (last: {last})")

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + self.timeout
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except BlockingIOError:
                if not select.select([], [self._fd], [], max(0.0, deadline - time.monotonic()))[1]:
                    raise SerialLinkError(f"{self.backend}: the port takes no bytes") from None
            except OSError as e:
                raise SerialLinkError(f"{self.backend}: write failed: {e.strerror or e}") from None

    def _receive(self, count: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                raise TimeoutError(f"no reply within {self.timeout:g} s ({len(out)} of {count} bytes)")
            out += self._read_some(count - len(out))
        return bytes(out)

    def _read_some(self, limit: int) -> bytes:
        try:
            return os.read(self._fd, limit)
        except BlockingIOError:
            return b""
        except OSError as e:
            if e.errno == errno.EIO:          # a pty whose other side is closed, an unplugged adapter
                raise SerialLinkError(f"{self.backend}: the port is gone ({e.strerror})") from None
            raise

    def _drop_waiting(self) -> None:
        while self._read_some(256):
            pass

    def _resync(self) -> None:
        """Drop bytes until the line has been quiet for ``quiet`` seconds."""
        while select.select([self._fd], [], [], self.quiet)[0]:
            if not self._read_some(256):
                time.sleep(self.quiet / 10)     # readable but empty (a pty with no peer): do not spin
