"""The exported Verilog, Verilated with a C++ harness that runs the clock loop: the fast link.

:func:`cais.sim.build.build_native` compiles ``cais_switch`` and ``harness.cpp`` into a shared library
(cached per parameter set); :class:`VerilatorLink` loads it with ctypes. Python crosses into C++ once per
frame sent or received, per register access and per ``advance``, never per cycle; the harness applies the
per-cycle rules of :mod:`cais.sim.links.wires` (the cocotb link runs the same rules in Python, and a test
checks that both give identical frames in identical cycles).

Nothing here suspends: run a driver on this link with :func:`run_verilator` (``run_sync``), like the model.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

from cais.link import DEFAULT_CLOCK_HZ, run_sync
from cais.params import SwitchParams

from .base import LinkBase, LinkError, Received, Sent, check_frame
from .wires import RESET_CYCLES, per_port, threshold

__all__ = ["VerilatorLink", "run_verilator", "load_library"]

_u64, _u32, _int, _vp = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "cais_ports": (_int, []), "cais_beat_bytes": (_int, []),
    "cais_new": (_vp, [_u64]), "cais_free": (None, [_vp]),
    "cais_reset": (None, [_vp, _u64, _u64]),
    "cais_set_pattern": (None, [_vp, _int, _u64, _u64]), "cais_set_hold": (None, [_vp, _int, _u64]),
    "cais_send": (None, [_vp, _int, ctypes.c_char_p, _u64, _int, _int, _u64]),
    "cais_run": (_u64, [_vp, _u64, _int]), "cais_bare_clock": (None, [_vp, _u64]),
    "cais_cycle": (_u64, [_vp]), "cais_read_accepted": (_u64, [_vp]), "cais_sending": (_int, [_vp]),
    "cais_error": (ctypes.c_char_p, [_vp]),
    "cais_rx_pop": (_u64, [_vp, ctypes.c_char_p, _u64, ctypes.POINTER(_int), ctypes.POINTER(_u64),
                           ctypes.POINTER(_u64)]),
    "cais_tx_pop": (_int, [_vp, ctypes.POINTER(_int), ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    "cais_write": (_u32, [_vp, _u32, _u32]), "cais_read": (_u32, [_vp, _u32, ctypes.POINTER(_u32)]),
    "cais_trace_open": (_int, [_vp, ctypes.c_char_p]),
}
_loaded: dict[Path, ctypes.CDLL] = {}


def load_library(params: SwitchParams, *, waves: bool = False) -> ctypes.CDLL:
    """Build (cached) and load the C++-driven model of ``params``."""
    from ..build import build_native

    path = build_native(params, waves=waves).library
    lib = _loaded.get(path)
    if lib is None:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        if (lib.cais_ports(), lib.cais_beat_bytes()) != (params.ports, params.beat_bytes):
            raise RuntimeError(f"{path} was built for {lib.cais_ports()} ports of {lib.cais_beat_bytes()} "
                               f"bytes, not {params.slug()}")
        _loaded[path] = lib
    return lib


class VerilatorLink(LinkBase):
    """A :class:`cais.link.SwitchLink` on the C++-driven Verilated switch.

    ``seed``, ``idle`` and ``backpressure`` (a probability, or one per port) give the same pause patterns
    as on the cocotb link; ``vcd`` names a waveform file (the library is then built with tracing).
    """

    def __init__(self, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, seed: int = 0,
                 idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
                 vcd: str | os.PathLike | None = None):
        super().__init__(params, clock_hz)
        self._lib = load_library(params, waves=vcd is not None)
        self._h = self._lib.cais_new(int(seed) & (2**64 - 1))
        if vcd is not None:
            Path(vcd).parent.mkdir(parents=True, exist_ok=True)
            self._lib.cais_trace_open(self._h, str(vcd).encode())
        self.set_patterns(idle, backpressure)
        self._lib.cais_reset(self._h, RESET_CYCLES, params.slots + 2)
        self._cycle = 0              # mirrors cais_cycle (asked for often: a ctypes call costs)
        self._int, self._first, self._last = _int(), _u64(), _u64()
        self._rx_buf = ctypes.create_string_buffer(params.max_frame)    # grown if a frame is longer

    def close(self) -> None:
        """Free the model (and close the waveform); the link is unusable afterwards."""
        if getattr(self, "_h", None):
            self._lib.cais_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    # ------------------------------------------------------------------ SwitchLink
    @property
    def cycle(self) -> int:
        return self._cycle

    @property
    def pending(self) -> bool:
        return bool(self._lib.cais_sending(self._h))

    @property
    def read_accepted(self) -> int:
        return self._lib.cais_read_accepted(self._h)

    def send(self, port: int, frame: bytes, *, bad_keep: bool = False, bad_fcs: bool = False,
             not_before: int = 0) -> None:
        """Queue a frame (see :meth:`cais.sim.links.wires.WireLink.send`)."""
        self.check_port(port)
        frame = check_frame(frame, self.params.beat_bytes, bad_keep)
        self._lib.cais_send(self._h, port, frame, len(frame), int(bad_keep), int(bad_fcs), max(0, int(not_before)))

    def take_stamped(self) -> list[Received]:
        pop, h, stamps = self._lib.cais_rx_pop, self._h, (ctypes.byref(self._int), ctypes.byref(self._first),
                                                          ctypes.byref(self._last))
        got = []
        while n := pop(h, self._rx_buf, len(self._rx_buf), *stamps):
            if n > len(self._rx_buf):
                self._rx_buf = ctypes.create_string_buffer(n)
                continue
            got.append(Received(self._int.value, ctypes.string_at(self._rx_buf, n), self._first.value,
                                self._last.value))
        return got

    def take_sent(self) -> list[Sent]:
        got = []
        while self._lib.cais_tx_pop(self._h, ctypes.byref(self._int), ctypes.byref(self._first),
                                    ctypes.byref(self._last)):
            got.append(Sent(self._int.value, self._first.value, self._last.value))
        return got

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        self._lib.cais_run(self._h, int(cycles), 0)
        self._cycle += int(cycles)
        self._check()

    async def advance_to_frame(self, cycles: int) -> int:
        """Run up to ``cycles`` cycles, stopping after the first cycle in which a frame finished leaving
        the switch; return the cycles run."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        ran = self._lib.cais_run(self._h, int(cycles), 1)
        self._cycle += ran
        self._check()
        return ran

    async def _read_register(self, addr: int) -> int:
        resp = _u32()
        value = self._lib.cais_read(self._h, addr, ctypes.byref(resp))
        self._cycle = self._lib.cais_cycle(self._h)
        self._check()
        return value

    async def _write_register(self, addr: int, value: int) -> int:
        resp = self._lib.cais_write(self._h, addr, value & 0xFFFF_FFFF)
        self._cycle = self._lib.cais_cycle(self._h)
        self._check()
        return resp

    async def reset(self, settle: int | None = None) -> None:
        """Forget queued and partial frames, reset the switch and wait for its sweep: cycle 0 again
        (``settle``: cycle 0 that many cycles after reset instead; 0: the first cycle with ``rst`` low)."""
        self._lib.cais_reset(self._h, RESET_CYCLES, self.params.slots + 2 if settle is None else int(settle))
        self._cycle = 0

    def set_patterns(self, idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0) -> None:
        P = self.params.ports
        idle, backpressure = per_port(idle, P, "idle"), per_port(backpressure, P, "backpressure")
        for p in range(P):
            self._lib.cais_set_pattern(self._h, p, threshold(idle[p]), threshold(backpressure[p]))

    def set_hold(self, port: int, hold: bool = True, *, until: int | None = None) -> None:
        """See :meth:`cais.sim.links.wires.WireLink.set_hold`."""
        end = (2**64 - 1 if hold else 0) if until is None else max(0, int(until))
        self._lib.cais_set_hold(self._h, self.check_port(port), end)

    def bare_clock(self, cycles: int) -> None:
        """Toggle the clock ``cycles`` times with no wire touched: the model's own speed, for benchmarks.
        The switch's state goes on from there (the link's ``cycle`` does not count these)."""
        self._lib.cais_bare_clock(self._h, int(cycles))

    def _check(self) -> None:
        error = self._lib.cais_error(self._h)
        if error:
            raise LinkError(error.decode())


def run_verilator(params: SwitchParams, main: Callable[[VerilatorLink], Awaitable], *, seed: int = 0,
                  idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
                  clock_hz: float = DEFAULT_CLOCK_HZ, vcd: str | os.PathLike | None = None,
                  waves: bool = False, **_ignored: Any):
    """Run ``await main(link)`` on a fresh :class:`VerilatorLink`; return main's result. ``waves`` without
    ``vcd`` writes ``<build>/sim/<slug>_cpp_waves/dump.vcd``."""
    if waves and vcd is None:
        from ..build import build_root
        vcd = build_root() / "sim" / f"{params.slug()}_cpp_waves" / "dump.vcd"
    link = VerilatorLink(params, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure, vcd=vcd)
    try:
        return run_sync(main(link))
    finally:
        link.close()
