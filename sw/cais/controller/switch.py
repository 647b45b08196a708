"""The controller's hands on the switch: its link, its register map, and writes applied in order.

Contract: every register access of the controller's parts goes through one :class:`SwitchAccess`, whose
methods are coroutines awaiting only the link's ``read``/``write``; nothing is cached here.
:class:`ControlLink` is that link over cais-switch's control endpoint (the service's switch);
:class:`cais.serial_link.SerialLink` over an FPGA board's UART. :func:`open_switch_link` picks one from the
address the command lines take (``--switch``).
"""

from __future__ import annotations

import contextlib
import threading
import time

from ..endpoint import EndpointError, RefusedError, connect, parse_address
from ..link import SwitchLink
from ..params import SwitchParams
from ..registers import RegisterMap, register_map
from ..serial_link import SerialLink, is_serial_address, parse_serial_address

__all__ = ["ControlLink", "SwitchAccess", "open_switch_link", "check_switch_address"]


def check_switch_address(text: str):
    """A ``--switch`` address checked without opening it: ``serial:PATH[@BAUD]`` (the board's UART) or a
    control endpoint (:func:`cais.endpoint.parse_address`); ValueError with a one-line reason."""
    return parse_serial_address(text) if is_serial_address(text) else parse_address(text)


def open_switch_link(address: str, *, retry_for: float = 0.0):
    """The register link to the switch at ``address``: a :class:`SerialLink` for ``serial:PATH[@BAUD]``, else
    a :class:`ControlLink` to cais-switch's control endpoint. EndpointError (or ValueError for a malformed
    address) with a one-line message when it cannot be reached."""
    if is_serial_address(address):
        path, baud = parse_serial_address(address)
        return SerialLink(path, baud, retry_for=retry_for)
    return ControlLink(address, retry_for=retry_for)


class ControlLink:
    """The register half of :class:`cais.link.SwitchLink` over a switch's control endpoint.

    Its coroutines never suspend (blocking socket calls), so :func:`cais.link.run_sync` runs them. ``cycle``
    is wall time in switch clock cycles: the controller's timers are real time here.

    The control protocol answers requests in order on one connection, without request ids. A request that
    fails without an answer (no reply within `timeout`, the connection closed, a reply that is not JSON or
    lacks what the request asks for) may still be answered later, so the connection is dropped at once
    and the next request opens a new one: a late reply is never read as another request's answer.

    Members
    -------
    params : SwitchParams
        As the switch reports them (``info``).
    clock_hz : float
    timeout : float
        Seconds a request waits for its answer.
    failures : int
        Requests that got no usable answer (each dropped the connection).
    reconnects : int
        Connections opened again after a failure.
    around_io : callable
        A context manager factory entered around every request (the coordinator's gives its state lock up
        while the switch answers); by default it does nothing.
    """

    def __init__(self, address: str, *, timeout: float = 10.0, retry_for: float = 0.0):
        self.address, self.timeout = address, float(timeout)
        self.failures = self.reconnects = 0
        self._lock = threading.Lock()
        self.around_io = contextlib.nullcontext
        self._conn = connect(address, timeout=timeout, retry_for=retry_for, name="switch control endpoint")
        info = self._request("info")
        try:
            self.params = SwitchParams(**info["params"])
            self.clock_hz = float(info["clock_hz"])
        except (KeyError, TypeError, ValueError) as e:
            raise EndpointError(f"switch control endpoint {address}: its info answer is not understood ({e})") from None
        self.backend = info.get("backend", "?")
        self._t0 = time.monotonic()

    @property
    def cycle(self) -> int:
        return int((time.monotonic() - self._t0) * self.clock_hz)

    def _request(self, op: str, want: str | None = None, **fields) -> dict:
        """One request and its answer (`want`: a field the answer must carry as an integer)."""
        with self.around_io(), self._lock:
            if self._conn is None:
                self._conn = connect(self.address, timeout=self.timeout, name="switch control endpoint")
                self.reconnects += 1
            conn = self._conn
            conn.sock.settimeout(self.timeout)
            try:
                reply = conn.request(op, **fields)
                if not isinstance(reply, dict) or (want is not None and (
                        isinstance(reply.get(want), bool) or not isinstance(reply.get(want), int))):
                    raise EndpointError(f"{conn.name}: {op}: the answer has no integer {want!r}: {reply!r:.80}")
                return reply
            except RefusedError:
                raise               # an answer ("ok": false): the connection is still in step
            except (EndpointError, ValueError, AttributeError) as e:
                self._conn = None   # out of step: whatever comes later on it belongs to this request
                conn.close()
                self.failures += 1
                if isinstance(e, EndpointError):
                    raise
                raise EndpointError(f"{conn.name}: {op}: the answer is not a JSON object ({e})") from None

    async def read(self, addr: int) -> int:
        return int(self._request("read", "value", addr=int(addr))["value"])

    async def write(self, addr: int, value: int) -> None:
        self._request("write", addr=int(addr), value=int(value))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SwitchAccess:
    """Members
    -------
    link : SwitchLink
    params : cais.params.SwitchParams
    regs : RegisterMap
    """

    def __init__(self, link: SwitchLink):
        self.link = link
        self.params = link.params
        self.regs: RegisterMap = register_map(self.params)

    @property
    def clock_hz(self) -> float:
        return self.link.clock_hz

    async def apply(self, writes) -> None:
        """(address, value) writes, in order."""
        for addr, value in writes:
            await self.link.write(addr, value)

    async def read(self, name: str, element: int = 0) -> int:
        return await self.link.read(self.regs[name].address(element))

    async def write(self, name: str, value: int) -> None:
        await self.link.write(self.regs[name].address(), value)
