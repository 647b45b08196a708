"""Three implementations of :class:`cais.link.SwitchLink` that a driver cannot tell apart, and one runner.

* :class:`ModelLink` -- the numpy reference model (:class:`cais.sim.refmodel.SwitchModel`) with a simple
  time model. Nothing ever suspends: run a driver on it with :func:`run_model` (``run_sync``).
* :class:`AmaranthLink` -- the Amaranth :class:`cais.hdl.switch.Switch` under amaranth.sim, used from
  inside a running simulation: :func:`run_amaranth` builds the simulator and calls ``await main(link)``.
* :class:`CocotbLink` -- the exported Verilog (``cais_switch``) under cocotb + Verilator, used from inside
  a cocotb test: :func:`run_cocotb` builds (cached) and runs ``cais.tb.cosim:cosim_main``, which creates
  the link and awaits the entry point ``main(link, job)`` named by a ``"module:function"`` string.

:func:`run_backend` runs such an entry point on any of the three, so callers use them identically::

    result = run_backend("amaranth", SwitchParams(), "cais.sim.backends:selftest_main", {"seed": 1})

The contract the three share (what a driver may rely on):

* ``cycle`` is 0 when the link is handed to the driver, after the switch left reset and finished its
  slot-state sweep (``slots + 2`` cycles), and counts clock cycles from there. Register accesses take
  cycles too (a few per access on every backend).
* ``send(port, frame)`` never blocks: the frame is queued behind the port's earlier frames and sent at
  one beat per cycle as soon as the port's ingress takes it.
* ``take_received()`` returns the frames that finished leaving the switch since the last call, ordered
  by (cycle finished, port, order of arrival). Egress ports are always ready unless ``backpressure`` is
  given to the runner (amaranth and cocotb backends only).
* ``read(addr)``/``write(addr, value)`` are 32-bit register accesses. Reading ``BUSY`` returns 1 also while
  the link still holds frames queued for an ingress port that the switch has not taken yet, so
  ``while await link.read(BUSY): await link.advance(n)`` waits for everything sent (on every backend).
* Timing differs between backends (the model's is approximate, see :class:`ModelLink`); which frames
  come out of each port, and every counter, do not.
"""

from __future__ import annotations

import heapq
import importlib
import importlib.util
import json
import os
import random
import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable

from cais.link import DEFAULT_CLOCK_HZ, run_sync
from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.registers import read_counters as cais_read_counters

from .amaranth_harness import axil_read, axil_write
from .refmodel import SwitchModel

__all__ = [
    "ModelLink", "AmaranthLink", "CocotbLink",
    "run_model", "run_amaranth", "run_cocotb", "run_backend", "load_entry", "amaranth_vcd_path",
    "BACKENDS", "COSIM_JOB_ENV", "CosimError", "selftest_main", "read_counters", "wait_idle",
]

BACKENDS = ("model", "amaranth", "cocotb", "verilator")
#: Environment variable naming the JSON job file that :func:`run_cocotb` hands to ``cais.tb.cosim``.
COSIM_JOB_ENV = "CAIS_COSIM_JOB"


def _beats(nbytes: int, beat_bytes: int) -> int:
    return max(1, -(-nbytes // beat_bytes))


def _busy_addr(params: SwitchParams) -> int:
    return register_map(params)["BUSY"].address()


def _check_port(params: SwitchParams, port: int) -> int:
    if not isinstance(port, int) or not 0 <= port < params.ports:
        raise ValueError(f"port={port!r}: out of range 0..{params.ports - 1}")
    return port


# ====================================================================================== reference model


class ModelLink:
    """The reference model behind a time model; every method returns without suspending.

    Time model (approximate, deterministic; close to the RTL's store-and-forward pipeline):

    * Ingress: each port is a wire of one beat per cycle. A frame sent at cycle ``c`` starts when the
      port's earlier frames have gone (not before ``c``) and has fully arrived ``beats`` cycles later.
    * Core: frames are processed one at a time in order of full arrival (ties: lower port first, then
      order of sending), one beat per cycle, so frames from different ports serialise. The model's
      ``receive`` runs when the core has finished the frame (registers read afterwards see its effect).
    * Egress: an output frame's first beat leaves ``EGRESS_LATENCY`` cycles after the core finished the
      input frame, or when the egress port finished its previous frame, whichever is later; it is
      received once its last beat has left (``+ beats``). docs/interface.md: the RTL's first result
      beat leaves ``beats + 9 + L`` cycles after the last input beat, L being the slot ALU's latency (4
      with float units, 0 without); the model uses 9 for every frame (a timing approximation: results
      leave up to 4 cycles early, forwarded frames do not pass the ALU).
    * Registers: each access takes ``reg_cycles`` cycles (the RTL's AXI4-Lite takes about as many).

    Work is done lazily: whenever the link is used, every frame whose core pass ended by ``cycle`` is
    processed first, so the outcome does not depend on how ``advance`` calls are split.
    """

    EGRESS_LATENCY = 9

    def __init__(self, params: SwitchParams = SwitchParams(), clock_hz: float = DEFAULT_CLOCK_HZ, *,
                 reg_cycles: int = 4, model: SwitchModel | None = None):
        self.params = params
        self.clock_hz = clock_hz
        self.model = model if model is not None else SwitchModel(params)
        self.reg_cycles = reg_cycles
        self._busy_addr = _busy_addr(params)
        self._cycle = 0
        self._seq = 0                                   # tie-breaker: order of sending / emitting
        self._wire_free = [0] * params.ports            # cycle each ingress wire is free again
        self._egress_free = [0] * params.ports          # cycle each egress wire is free again
        self._core_free = 0
        self._arrivals: list[tuple[int, int, int, bytes]] = []   # heap: (arrived, port, seq, frame)
        self._out: list[tuple[int, int, int, bytes]] = []        # heap: (delivered, port, seq, frame)

    @property
    def cycle(self) -> int:
        return self._cycle

    def send(self, port: int, frame: bytes) -> None:
        _check_port(self.params, port)
        frame = bytes(frame)
        start = max(self._cycle, self._wire_free[port])
        end = start + _beats(len(frame), self.params.beat_bytes)
        self._wire_free[port] = end
        heapq.heappush(self._arrivals, (end, port, self._seq, frame))
        self._seq += 1

    def _process(self) -> None:
        B = self.params.beat_bytes
        while self._arrivals:
            arrived, port, _, frame = self._arrivals[0]
            done = max(arrived, self._core_free) + _beats(len(frame), B)
            # A frame sent from now on arrives after `cycle` >= done: this one is really next.
            if done > self._cycle:
                return
            heapq.heappop(self._arrivals)
            self._core_free = done
            for out_port, data in self.model.receive(port, frame):
                first = max(done + self.EGRESS_LATENCY, self._egress_free[out_port])
                last = first + _beats(len(data), B)
                self._egress_free[out_port] = last
                heapq.heappush(self._out, (last, out_port, self._seq, data))
                self._seq += 1

    def take_received(self) -> list[tuple[int, bytes]]:
        self._process()
        got = []
        while self._out and self._out[0][0] <= self._cycle:
            _, port, _, data = heapq.heappop(self._out)
            got.append((port, data))
        return got

    @property
    def busy(self) -> bool:
        """A frame is on an ingress wire, in the core, or not yet out of an egress port."""
        self._process()
        return bool(self._arrivals) or any(t > self._cycle for t, *_ in self._out)

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        self._cycle += int(cycles)

    async def read(self, addr: int) -> int:
        self._process()
        if int(addr) & ~3 == self._busy_addr:
            value = int(self.busy)
        else:
            value = self.model.read(addr)
        self._cycle += self.reg_cycles
        return value

    async def write(self, addr: int, value: int) -> None:
        self._process()
        self.model.write(addr, value)
        self._cycle += self.reg_cycles


#: Options of the simulator backends that have no meaning for the model; :func:`run_model` ignores them so
#: that callers can pass the same options to every backend.
SIMULATOR_ONLY_OPTIONS = ("seed", "idle", "backpressure", "vcd", "waves", "keep_run")


def run_model(params: SwitchParams, main: Callable[[Any], Awaitable], **kw):
    """Run ``await main(link)`` on a fresh :class:`ModelLink`; return main's result.

    ``kw`` go to :class:`ModelLink` (``clock_hz``, ``reg_cycles``, ``model``); the simulator-only options
    (``seed``, ``idle``, ``backpressure``, ``vcd``, ``waves``, ``keep_run``) are accepted and ignored.
    """
    kw = {k: v for k, v in kw.items() if k not in SIMULATOR_ONLY_OPTIONS}
    return run_sync(main(ModelLink(params, **kw)))


# ====================================================================================== amaranth.sim


class AmaranthLink:
    """:class:`cais.hdl.switch.Switch` under amaranth.sim. Create it with :func:`run_amaranth`.

    Only the testbench that runs ``main`` may call the link's coroutines (they await ``ctx.tick()``).
    One background testbench plays every port's source (sending the queued frames) and sink (collecting
    the egress).
    """

    def __init__(self, params: SwitchParams, dut, *, clock_hz: float = DEFAULT_CLOCK_HZ, seed: int = 0,
                 idle: float = 0.0, backpressure: float = 0.0):
        self.params = params
        self.clock_hz = clock_hz
        self.dut = dut
        self.ctx = None                                   # the main testbench's context, set by the runner
        self.idle, self.backpressure = idle, backpressure
        self._seed = seed
        self._busy_addr = _busy_addr(params)
        self._cycle = 0
        self._seq = 0
        self._tx = [deque() for _ in range(params.ports)]
        self._sending = [False] * params.ports
        self._rx: list[tuple[int, int, int, bytes]] = []

    @property
    def cycle(self) -> int:
        return self._cycle

    def send(self, port: int, frame: bytes) -> None:
        _check_port(self.params, port)
        self._tx[port].append(bytes(frame))

    def take_received(self) -> list[tuple[int, bytes]]:
        got, self._rx = sorted(self._rx), []
        return [(port, data) for _, port, _, data in got]

    @property
    def pending(self) -> bool:
        """Frames queued for (or being sent to) an ingress port."""
        return any(self._tx) or any(self._sending)

    # ------------------------------------------------------------------ time and registers
    async def _tick(self, *signals):
        values = await self.ctx.tick().sample(*signals)
        self._cycle += 1
        return values[2:]

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        if cycles:
            await self.ctx.tick().repeat(int(cycles))
            self._cycle += int(cycles)

    async def write(self, addr: int, value: int) -> None:
        await axil_write(self._tick, self.ctx, self.dut.s_axil, addr, value)

    async def read(self, addr: int) -> int:
        pending = self.pending
        rdata = await axil_read(self._tick, self.ctx, self.dut.s_axil, addr)
        value = int(rdata)
        if int(addr) & ~3 == self._busy_addr and (pending or self.pending):
            value |= 1
        return value

    # ------------------------------------------------------------------ the wires
    def _wires(self):
        """One background testbench for every port's source and sink (one await per cycle for all of
        them). It stamps each received frame with its own cycle count, which advances during a long
        ``advance`` too, so ``take_received`` orders frames by when they finished."""
        P, B = self.params.ports, self.params.beat_bytes
        s_axis, m_axis = self.dut.s_axis, self.dut.m_axis
        idle_rng = [random.Random(f"{self._seed}/idle/{p}") for p in range(P)]
        bp_rng = [random.Random(f"{self._seed}/backpressure/{p}") for p in range(P)]
        sampled = [sig for p in range(P) for sig in (s_axis[p].tready, m_axis[p].tvalid, m_axis[p].tdata,
                                                     m_axis[p].tkeep, m_axis[p].tlast)]

        async def run(ctx):
            frame = [b""] * P          # frame being sent per port
            offset = [0] * P           # its next beat's byte offset
            shown = [False] * P        # a beat is on s_axis (tvalid = 1)
            ready = [True] * P
            rx = [bytearray() for _ in range(P)]
            now = 0
            for p in range(P):
                ctx.set(m_axis[p].tready, 1)
            while True:
                for p in range(P):
                    if not self._sending[p] and self._tx[p]:
                        frame[p], offset[p] = self._tx[p].popleft(), 0
                        self._sending[p] = True
                    if self._sending[p]:
                        show = not (self.idle and idle_rng[p].random() < self.idle)
                        if show:
                            data = frame[p]
                            chunk = data[offset[p]:offset[p] + B]
                            ctx.set(s_axis[p].tdata, int.from_bytes(chunk, "little"))
                            ctx.set(s_axis[p].tkeep, (1 << len(chunk)) - 1)
                            ctx.set(s_axis[p].tlast, offset[p] + B >= len(data))
                        if show != shown[p]:
                            ctx.set(s_axis[p].tvalid, show)
                            shown[p] = show
                    if self.backpressure:
                        r = bp_rng[p].random() >= self.backpressure
                        if r != ready[p]:
                            ctx.set(m_axis[p].tready, r)
                            ready[p] = r
                values = (await ctx.tick().sample(*sampled))[2:]
                now += 1
                for p in range(P):
                    s_ready, valid, tdata, tkeep, tlast = values[5 * p:5 * p + 5]
                    if shown[p] and s_ready:
                        offset[p] += B
                        if offset[p] >= len(frame[p]):
                            self._sending[p] = False
                            ctx.set(s_axis[p].tvalid, 0)
                            shown[p] = False
                    if valid and ready[p]:
                        n = _keep_bytes(int(tkeep), B, bool(tlast), p)
                        rx[p] += int(tdata).to_bytes(B, "little")[:n]
                        if tlast:
                            self._rx.append((now, p, self._seq, bytes(rx[p])))
                            self._seq += 1
                            rx[p] = bytearray()
        return run


def _keep_bytes(keep: int, beat_bytes: int, last: bool, port: int) -> int:
    """Bytes a beat carries; raise if its tkeep breaks the AXI4-Stream framing of docs/interface.md."""
    n = bin(keep).count("1")
    if keep != (1 << n) - 1 or n == 0 or (not last and n != beat_bytes):
        raise AssertionError(f"egress port {port}: bad tkeep {keep:#x} on a {'last' if last else 'middle'} beat")
    return n


def amaranth_vcd_path(params: SwitchParams) -> Path:
    """Where ``run_amaranth(..., waves=True)`` writes its waveform: ``<build>/sim/<slug>_amaranth/dump.vcd``."""
    from .build import build_root
    return build_root() / "sim" / f"{params.slug()}_amaranth" / "dump.vcd"


def run_amaranth(params: SwitchParams, main: Callable[[AmaranthLink], Awaitable], *, seed: int = 0,
                 vcd: str | os.PathLike | None = None, waves: bool = False, idle: float = 0.0,
                 backpressure: float = 0.0, clock_hz: float = DEFAULT_CLOCK_HZ, keep_run: bool = False):
    """Simulate :class:`cais.hdl.switch.Switch` and run ``await main(link)``; return its result.

    ``idle`` and ``backpressure`` are the probabilities of an idle cycle on a source and of tready low
    on a sink, each cycle (seeded by ``seed`` and the port). ``vcd`` names a waveform file to write;
    ``waves=True`` without ``vcd`` writes :func:`amaranth_vcd_path`. ``keep_run`` is accepted for
    symmetry with :func:`run_cocotb` and ignored.
    """
    from amaranth.sim import Simulator

    from cais.hdl.switch import Switch

    if waves and vcd is None:
        vcd = amaranth_vcd_path(params)
        vcd.parent.mkdir(parents=True, exist_ok=True)

    dut = Switch(params)
    link = AmaranthLink(params, dut, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure)
    sim = Simulator(dut)
    sim.add_clock(1 / clock_hz)
    sim.add_testbench(link._wires(), background=True)
    outcome = {}

    async def testbench(ctx):
        await ctx.tick().repeat(params.slots + 2)      # the slot-state sweep after reset
        link.ctx = ctx
        outcome["result"] = await main(link)

    sim.add_testbench(testbench)
    if vcd:
        with sim.write_vcd(str(vcd)):
            sim.run()
    else:
        sim.run()
    return outcome["result"]


# ====================================================================================== cocotb + Verilator


class CocotbLink:
    """The exported ``cais_switch`` under cocotb. Create it inside a cocotb test with :meth:`start`.

    ``send`` hands the frame to the port's ``AxiStreamSource`` with ``send_nowait`` (its queue is
    unbounded and its own coroutine feeds the bus), a background coroutine per port records what the
    port's ``AxiStreamSink`` receives, and ``AxiLiteMaster`` does the register accesses.
    """

    def __init__(self, dut, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, period_ns: int = 10,
                 seed: int = 0, idle: float = 0.0, backpressure: float = 0.0):
        import logging
        import warnings

        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.")
        from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamSink, AxiStreamSource

        self.params = params
        self.clock_hz = clock_hz
        self.dut = dut
        self.period_ns = period_ns
        self._busy_addr = _busy_addr(params)
        self._t0_ps = 0
        self._seq = 0
        self._rx: list[tuple[int, int, int, bytes]] = []
        P = params.ports
        self.sources = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_p{p}"), dut.clk, dut.rst)
                        for p in range(P)]
        self.sinks = [AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_p{p}"), dut.clk, dut.rst)
                      for p in range(P)]
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        for bfm in (*self.sources, *self.sinks):
            bfm.log.setLevel(logging.WARNING)
        for log in (self.axil.write_if.log, self.axil.read_if.log):
            log.setLevel(logging.WARNING)
        for p in range(P):
            if idle:
                self.sources[p].set_pause_generator(_pauses(idle, f"{seed}/idle/{p}"))
            if backpressure:
                self.sinks[p].set_pause_generator(_pauses(backpressure, f"{seed}/backpressure/{p}"))

    @classmethod
    async def start(cls, dut, params: SwitchParams, **kw) -> "CocotbLink":
        """Start the clock, reset the switch, wait for its slot-state sweep and start the collectors."""
        import cocotb
        from cocotb.clock import Clock
        from cocotb.triggers import ClockCycles

        link = cls(dut, params, **kw)
        Clock(dut.clk, link.period_ns, unit="ns").start()
        dut.rst.value = 1
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        await ClockCycles(dut.clk, params.slots + 2)
        link._t0_ps = link._now_ps()
        for p in range(params.ports):
            cocotb.start_soon(link._collect(p))
        return link

    @staticmethod
    def _now_ps() -> int:
        from cocotb.simtime import get_sim_time
        return int(round(get_sim_time("ps")))

    @property
    def cycle(self) -> int:
        return (self._now_ps() - self._t0_ps) // (self.period_ns * 1000)

    def send(self, port: int, frame: bytes) -> None:
        from cocotbext.axi import AxiStreamFrame
        _check_port(self.params, port)
        self.sources[port].send_nowait(AxiStreamFrame(bytes(frame)))

    def take_received(self) -> list[tuple[int, bytes]]:
        got, self._rx = sorted(self._rx), []
        return [(port, data) for _, port, _, data in got]

    @property
    def pending(self) -> bool:
        return not all(src.idle() for src in self.sources)

    async def _collect(self, port: int):
        B = self.params.beat_bytes
        sink = self.sinks[port]
        while True:
            frame = await sink.recv(compact=False)
            keep = list(frame.tkeep)
            n = len(keep)
            for i in range(0, n, B):
                lanes = keep[i:i + B]
                _keep_bytes(sum(bool(bit) << j for j, bit in enumerate(lanes)), B, i + B >= n, port)
            data = bytes(b for b, k in zip(frame.tdata, keep) if k)
            self._rx.append((self.cycle, port, self._seq, data))
            self._seq += 1

    async def advance(self, cycles: int) -> None:
        from cocotb.triggers import ClockCycles
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        if cycles:
            await ClockCycles(self.dut.clk, int(cycles))

    async def read(self, addr: int) -> int:
        pending = self.pending
        value = int(await self.axil.read_dword(int(addr)))
        if int(addr) & ~3 == self._busy_addr and (pending or self.pending):
            value |= 1
        return value

    async def write(self, addr: int, value: int) -> None:
        await self.axil.write_dword(int(addr), int(value))


def _pauses(probability: float, seed: str):
    rng = random.Random(seed)
    while True:
        yield int(rng.random() < probability)


class CosimError(AssertionError):
    """The cocotb run of an entry point failed; the message ends with the simulator log's tail."""


def _entry_sys_path(module: str) -> list[str]:
    """The folder to put on ``sys.path`` so that ``module`` imports in the simulator process as it does
    here (a test module collected by pytest, say); empty when its file is not laid out by its name."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return []
    origin = Path(spec.origin).resolve()
    parts = module.split(".")
    tail = Path(*parts, "__init__.py") if origin.name == "__init__.py" else Path(*parts[:-1], parts[-1] + ".py")
    root = origin
    for _ in tail.parts:
        root = root.parent
    return [str(root)] if (root / tail).resolve() == origin else []


def run_cocotb(params: SwitchParams, entry: str, job: dict, *, waves: bool = False, seed: int = 0,
               idle: float = 0.0, backpressure: float = 0.0, clock_hz: float = DEFAULT_CLOCK_HZ,
               keep_run: bool = False):
    """Run the entry point ``"module:function"`` (``async def main(link, job)``) on the Verilated switch.

    Builds with :func:`cais.sim.build.build_switch` (cached), runs the cocotb test
    ``cais.tb.cosim:cosim_main`` and returns main's (JSON-serialisable) result as read back from JSON.
    Raises :class:`CosimError` with the log's tail when the run fails. The run folder is removed after a
    successful run unless ``waves`` or ``keep_run`` is set.
    """
    from .build import build_switch, run_test

    module = entry.partition(":")[0]
    build = build_switch(params, waves=waves)
    with tempfile.TemporaryDirectory(prefix="cais-cosim-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps({
            "params": params.as_dict(), "entry": entry, "job": job, "out": str(out_file),
            "sys_path": _entry_sys_path(module), "seed": seed, "idle": idle, "backpressure": backpressure,
            "clock_hz": clock_hz}))
        try:
            run = run_test(build, "cais.tb.cosim", "cosim_main", extra_env={COSIM_JOB_ENV: str(job_file)})
        except AssertionError as exc:
            raise CosimError(f"{entry} on cocotb ({params.slug()}) failed: {exc}") from None
        if not out_file.is_file():
            raise CosimError(f"{entry} on cocotb ({params.slug()}): the test passed but wrote no result; "
                             f"log {run.log_file}")
        result = json.loads(out_file.read_text())
    if not (waves or keep_run):
        shutil.rmtree(run.run_dir, ignore_errors=True)
    return result


# ====================================================================================== one entry for all


def load_entry(entry: str | Callable) -> Callable:
    """The function named by ``"package.module:function"`` (a callable passes through)."""
    if callable(entry):
        return entry
    module, sep, name = str(entry).partition(":")
    if not sep or not module or not name:
        raise ValueError(f"entry={entry!r}: expected 'module:function'")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"entry={entry!r}: {obj!r} is not callable")
    return obj


def run_backend(kind: str, params: SwitchParams, entry: str, job: dict, **kw):
    """Run ``await main(link, job)`` (``entry`` = ``"module:function"``) on backend ``kind``.

    ``kind`` is ``"model"``, ``"amaranth"`` or ``"cocotb"``; ``kw`` go to :func:`run_model` (ModelLink
    options), :func:`run_amaranth` or :func:`run_cocotb`. The result is returned as it comes back from
    JSON on every backend (tuples become lists, dict keys strings), so results compare across backends.
    """
    if kind == "cocotb":
        if not isinstance(entry, str):
            raise TypeError("the cocotb backend needs the entry point as a 'module:function' string")
        return run_cocotb(params, entry, job, **kw)
    main = load_entry(entry)
    if kind == "verilator":
        from .links.verilator import run_verilator
        result = run_verilator(params, lambda link: main(link, job), **kw)
    elif kind == "model":
        result = run_model(params, lambda link: main(link, job), **kw)
    elif kind == "amaranth":
        result = run_amaranth(params, lambda link: main(link, job), **kw)
    else:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(BACKENDS)}")
    return json.loads(json.dumps(result))


# ====================================================================================== a self-test


async def read_counters(link) -> dict[str, int | list[int]]:
    """Every COUNTER register, read over the link; per-port registers as lists."""
    return await cais_read_counters(link.read, register_map(link.params), kinds=(Kind.COUNTER,))


async def wait_idle(link, *, step: int = 16, limit: int = 100_000) -> bool:
    """Advance ``step`` cycles at a time until ``BUSY`` reads 0, or until ``cycle`` reaches ``limit`` with the
    switch busy; return whether the switch went idle. ``limit=0`` is a quick check: one read decides.
    (BUSY is exact in every cycle, docs/interface.md: one read that returns 0 means nothing is inside.)
    """
    busy = register_map(link.params)["BUSY"].address()
    while True:
        if not await link.read(busy):
            return True
        if link.cycle >= limit:
            return False
        await link.advance(step)


async def selftest_main(link, job: dict) -> dict:
    """One all-reduce chunk: program a rule, send one contribution per port, collect, check with numpy.

    ``job``: ``seed`` (0), ``payload_len`` bytes (64), ``group`` (1), ``red_op`` name ("SUM"), ``limit``
    cycles to wait for the results (20000), ``faults`` (FaultSpec fields; wraps the link in a
    :class:`cais.sim.faults.FaultyLink`). Returns ``correct`` (every port got exactly the numpy result),
    ``received`` (sorted [port, frame hex]), ``counters``, ``cycles`` and ``fault_stats``.
    """
    import numpy as np

    from cais import protocol as proto
    from cais.tables import Rule, rule_writes, slot_clear_writes

    from .traffic import host_mac

    if job.get("faults") is not None:
        from .faults import FaultSpec, FaultyLink
        link = FaultyLink(link, FaultSpec(**job["faults"]))
    P = link.params
    regmap = register_map(P)
    group, plen = int(job.get("group", 1)), int(job.get("payload_len", 64))
    op = proto.ReduceOp[str(job.get("red_op", "SUM")).upper()]
    everyone = (1 << P.ports) - 1
    writes = slot_clear_writes(regmap, 0, 1)
    writes += rule_writes(regmap, 0, Rule.for_group(group, everyone, everyone, base=0, count_log2=0, red_op=op))
    for addr, value in writes:
        await link.write(addr, value)

    rng = np.random.default_rng(int(job.get("seed", 0)))
    values = rng.integers(-2**31, 2**31, (P.ports, plen // 4), dtype=np.int64)
    hdr = proto.CaisHeader(group_id=group, layer_id=3, chunk_id=0, total_chunks=1, seq_num=0,
                           payload_len=plen, red_op=op)
    for p in range(P.ports):
        link.send(p, proto.build_frame(hdr, values[p].astype(">i4").tobytes(), src=host_mac(p), pad=True))

    reduce = {proto.ReduceOp.SUM: np.sum, proto.ReduceOp.MAX: np.max, proto.ReduceOp.MIN: np.min}[op]
    expected = ((reduce(values, axis=0) + 2**31) % 2**32 - 2**31).astype(np.int32)
    received: list[tuple[int, bytes]] = []
    limit = int(job.get("limit", 20000))
    # Wait for a result on every port, or until the switch is idle and no fault injector holds a frame.
    while link.cycle < limit:
        await link.advance(32)
        received += link.take_received()
        if len({p for p, _ in received}) == P.ports:
            break
        if not getattr(link, "holding", 0) and await wait_idle(link, limit=0):
            break
    await wait_idle(link, limit=limit)
    received += link.take_received()

    correct = sorted(p for p, _ in received) == list(range(P.ports))
    for _, data in received:
        frame = proto.parse_frame(data)
        correct &= (frame.cais is not None and frame.cais.flags == proto.Flags.RESULT
                    and np.array_equal(np.frombuffer(frame.payload, ">i4"), expected))
    return {
        "correct": bool(correct),
        "received": sorted([p, data.hex()] for p, data in received),
        "counters": await read_counters(link),
        "cycles": link.cycle,
        "fault_stats": dict(getattr(link, "stats", {})),
    }
