"""The exported Verilog, Verilated with a C++ harness that runs the clock loop: the fast link.

:func:`cais.sim.build.build_native` compiles ``cais_switch`` and ``harness.cpp`` into a shared library
(cached per parameter set); :class:`VerilatorLink` loads it with ctypes. Python crosses into C++ once per
``advance`` (which also hands over the frames sent since the last call, as one batch) and per register
access, never per cycle nor per frame: the frames that came out are read in place from the harness's
buffers, and the cycle count and the rest of its state from a status block of 64-bit words the harness
keeps up to date in this link's memory. The harness applies the per-cycle rules of
:mod:`cais.sim.links.wires` (the cocotb link runs the same rules in Python, and a test checks that both
give identical frames in identical cycles).

Nothing here suspends: run a driver on this link with :func:`run_verilator` (``run_sync``), like the model.
"""

from __future__ import annotations

import ctypes
import os
from array import array
from pathlib import Path
from typing import Any, Awaitable, Callable

from cais.link import DEFAULT_CLOCK_HZ, run_sync
from cais.params import SwitchParams

from .base import LinkBase, LinkError, Received, Sent, check_frame
from .wires import RESET_CYCLES, per_port, threshold

__all__ = ["VerilatorLink", "run_verilator", "load_library"]

_u64, _u32, _int, _vp, _str = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
_SIGNATURES = {
    "cais_ports": (_int, []), "cais_beat_bytes": (_int, []), "cais_status_fields": (_str, []),
    "cais_new": (_vp, [_u64, _vp]), "cais_free": (None, [_vp]),
    "cais_reset": (None, [_vp, _u64, _u64]),
    "cais_set_pattern": (None, [_vp, _int, _u64, _u64]), "cais_set_hold": (None, [_vp, _int, _u64]),
    "cais_send": (None, [_vp, _str, _str, _u64]),
    "cais_run": (_u64, [_vp, _u64, _int, _str, _str, _u64]), "cais_bare_clock": (None, [_vp, _u64]),
    "cais_error": (_str, [_vp]),
    "cais_write": (_u32, [_vp, _u32, _u32]), "cais_read": (_u32, [_vp, _u32, ctypes.POINTER(_u32)]),
    "cais_trace_open": (_int, [_vp, _str]),
}
_loaded: dict[Path, ctypes.CDLL] = {}
_status_types: dict[Path, type] = {}


def load_library(params: SwitchParams, *, waves: bool = False, pgo: bool = False,
                 path: Path | None = None) -> ctypes.CDLL:
    """Build (cached) and load the C++-driven model of ``params`` (profile-guided with ``pgo``: see
    :func:`cais.sim.build.build_native`), or load the one at ``path`` (built for ``params``)."""
    from ..build import build_native

    if path is None:
        path = build_native(params, waves=waves, pgo=pgo).library
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


def status_type(lib: ctypes.CDLL) -> type:
    """The harness's status block as a ctypes Structure: one 64-bit field per name of its
    ``cais_status_fields()`` (the one definition, in harness.cpp), in that order."""
    key = Path(lib._name)
    kind = _status_types.get(key)
    if kind is None:
        names = lib.cais_status_fields().decode().split()
        kind = _status_types[key] = type("Status", (ctypes.Structure,), {"_fields_": [(n, _u64) for n in names]})
    return kind


class VerilatorLink(LinkBase):
    """A :class:`cais.link.SwitchLink` on the C++-driven Verilated switch.

    ``seed``, ``idle`` and ``backpressure`` (a probability, or one per port) give the same pause patterns
    as on the cocotb link; ``vcd`` names a waveform file (the library is then built with tracing); ``pgo``
    takes the profile-guided build (:func:`cais.sim.build.build_native`), ``library`` a library already
    built for ``params`` (the profile-guided build's training job runs on its instrumented one).
    """

    def __init__(self, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, seed: int = 0,
                 idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
                 vcd: str | os.PathLike | None = None, pgo: bool = False, library: Path | None = None):
        super().__init__(params, clock_hz)
        self._ports = params.ports
        self._lib = load_library(params, waves=vcd is not None, pgo=pgo, path=library)
        # the harness writes its state here (this memory outlives it: the last values stay readable)
        self._status = status_type(self._lib)()
        self._out: list[bytes] = []          # frames sent since the last call into the harness
        self._out_meta = array("Q")          # four words each: port, length, flags, not_before
        self._h = self._lib.cais_new(int(seed) & (2**64 - 1), ctypes.addressof(self._status))
        if vcd is not None:
            Path(vcd).parent.mkdir(parents=True, exist_ok=True)
            self._lib.cais_trace_open(self._h, str(vcd).encode())
        self.set_patterns(idle, backpressure)
        self._lib.cais_reset(self._h, RESET_CYCLES, params.slots + 2)

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
        return self._status.cycle

    @property
    def pending(self) -> bool:
        return bool(self._out) or self._status.sending != 0

    @property
    def read_accepted(self) -> int:
        return self._status.read_accepted

    def send(self, port: int, frame: bytes, *, bad_keep: bool = False, bad_fcs: bool = False,
             not_before: int = 0) -> None:
        """Queue a frame (see :meth:`cais.sim.links.wires.WireLink.send`); it goes to the harness with the
        next call that runs the clock, before its first cycle."""
        if type(frame) is not bytes or not frame or bad_keep or type(port) is not int or not 0 <= port < self._ports:
            # anything but the common case (a non-empty bytes frame to a port in range) gets the full checks
            self.check_port(port)
            frame = check_frame(frame, self.params.beat_bytes, bad_keep)
        self._out.append(frame)
        self._out_meta.extend((port, len(frame), (1 if bad_keep else 0) | (2 if bad_fcs else 0),
                               max(0, int(not_before)) if not_before else 0))

    def _batch(self) -> tuple:
        """The frames sent since the last call into the harness, as its batch arguments (bytes back to back,
        the four-word records, the count; ``None, None, 0`` for none), and forgotten here."""
        out = self._out
        if not out:
            return None, None, 0
        batch = b"".join(out), self._out_meta.tobytes(), len(out)
        out.clear()
        del self._out_meta[:]
        return batch

    def _flush(self) -> None:
        """Hand the frames sent since the last call to the harness."""
        if self._out:
            self._lib.cais_send(self._h, *self._batch())

    def _take(self, stamped: bool) -> list:
        """The frames that left the switch since the last call, read from the harness's buffers."""
        st = self._status
        n = st.rx_frames
        if st.rx_taken == n:                 # none, or read already (the harness drops them when it runs)
            return []
        data = ctypes.string_at(st.rx_data, st.rx_bytes)
        words = iter(memoryview(ctypes.string_at(st.rx_meta, 32 * n)).cast("Q").tolist())
        got, at = [], 0
        for port, first, last, size in zip(words, words, words, words):
            got.append(Received(port, data[at:at + size], first, last) if stamped else (port, data[at:at + size]))
            at += size
        st.rx_taken = n
        return got

    def take_stamped(self) -> list[Received]:
        return self._take(True)

    def take_received(self) -> list[tuple[int, bytes]]:
        return self._take(False)

    def take_sent(self) -> list[Sent]:
        st = self._status
        n = st.tx_frames
        if st.tx_taken == n:
            return []
        words = iter(memoryview(ctypes.string_at(st.tx_meta, 24 * n)).cast("Q").tolist())
        st.tx_taken = n
        return [Sent(port, first, last) for port, first, last in zip(words, words, words)]

    def _run(self, cycles: int, stop_on_frame: int) -> int:
        ran = self._lib.cais_run(self._h, cycles, stop_on_frame, *self._batch())
        self._check()
        return ran

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        self._run(int(cycles), 0)

    async def advance_to_frame(self, cycles: int) -> int:
        """Run up to ``cycles`` cycles, stopping after the first cycle in which a frame finished leaving
        the switch; return the cycles run."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        return self._run(int(cycles), 1)

    async def _read_register(self, addr: int) -> int:
        self._flush()
        resp = _u32()
        value = self._lib.cais_read(self._h, addr, ctypes.byref(resp))
        self._check()
        return value

    async def _write_register(self, addr: int, value: int) -> int:
        self._flush()
        resp = self._lib.cais_write(self._h, addr, value & 0xFFFF_FFFF)
        self._check()
        return resp

    async def reset(self, settle: int | None = None) -> None:
        """Forget queued and partial frames, reset the switch and wait for its sweep: cycle 0 again
        (``settle``: cycle 0 that many cycles after reset instead; 0: the first cycle with ``rst`` low)."""
        self._batch()                        # forgotten, not sent
        self._lib.cais_reset(self._h, RESET_CYCLES, self.params.slots + 2 if settle is None else int(settle))

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
        self._flush()
        self._lib.cais_bare_clock(self._h, int(cycles))

    def _check(self) -> None:
        if self._status.error:
            raise LinkError(self._lib.cais_error(self._h).decode())


def run_verilator(params: SwitchParams, main: Callable[[VerilatorLink], Awaitable], *, seed: int = 0,
                  idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
                  clock_hz: float = DEFAULT_CLOCK_HZ, vcd: str | os.PathLike | None = None,
                  waves: bool = False, pgo: bool = False, **_ignored: Any):
    """Run ``await main(link)`` on a fresh :class:`VerilatorLink`; return main's result. ``waves`` without
    ``vcd`` writes ``<build>/sim/<slug>_cpp_waves/dump.vcd``; ``pgo`` runs the profile-guided build
    (without waves)."""
    if waves and vcd is None:
        from ..build import build_root
        vcd = build_root() / "sim" / f"{params.slug()}_cpp_waves" / "dump.vcd"
    link = VerilatorLink(params, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure, vcd=vcd,
                         pgo=pgo)
    try:
        return run_sync(main(link))
    finally:
        link.close()
