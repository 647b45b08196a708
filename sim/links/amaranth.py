"""The Amaranth design (:class:`cais.hdl.switch.Switch`) under amaranth.sim.

:class:`AmaranthLink` runs the per-cycle rules of :mod:`cais.sim.links.wires` in one amaranth.sim
testbench: its methods tick the clock themselves, so only the testbench that owns the link may call
them. :func:`run_amaranth` runs ``await main(link)`` on a simulator of the switch.

Building that simulator (elaborating the switch and compiling it to Python) costs 4-22 CPU-seconds, more
than most runs on it, so each process keeps the simulators it built (:class:`SwitchBench`, the last
:data:`KEPT_BENCHES` parameter sets) and resets one for the next run: ``Simulator.reset`` puts every
signal and memory back to its initial value and restarts the clock and the testbench, so a run on a
reused simulator is the run on a new one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Awaitable, Callable

from cais.link import DEFAULT_CLOCK_HZ
from cais.params import SwitchParams

from .wires import AXIL_INPUTS, RESET_CYCLES, WireLink

__all__ = ["AmaranthLink", "SwitchBench", "run_amaranth", "amaranth_vcd_path", "KEPT_BENCHES"]


class AmaranthLink(WireLink):
    """A :class:`cais.link.SwitchLink` on :class:`cais.hdl.switch.Switch` in amaranth.sim (see :mod:`.wires`).

    The link drives the ``sync`` domain's reset (``rst``), as the other links drive the exported top's
    ``rst``: ``RESET_CYCLES`` cycles high, then the slot-state sweep's ``slots + 2`` cycles.
    """

    def __init__(self, params: SwitchParams, dut, *, clock_hz: float = DEFAULT_CLOCK_HZ, seed: int = 0,
                 idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
                 trace_busy: bool = False, rst=None):
        self.dut = dut
        self.rst = rst                       # the sync domain's reset signal
        self.ctx = None                      # the running testbench's context, set by run_amaranth
        P = params.ports
        self._sampled_signals = ([dut.s_axis[p].tready for p in range(P)]
                                 + [s for p in range(P) for s in (dut.m_axis[p].tvalid, dut.m_axis[p].tdata,
                                                                  dut.m_axis[p].tkeep, dut.m_axis[p].tlast)]
                                 + [getattr(dut.s_axil, name) for name in AXIL_INPUTS]
                                 + ([dut.busy] if trace_busy else []))
        self._values: tuple = ()
        #: With ``trace_busy``: the switch's BUSY signal in every cycle simulated, from the first (white-box:
        #: cycle c of the link is ``busy_trace[start_cycle + c]``).
        self.busy_trace: list[int] | None = [] if trace_busy else None
        #: Cycles simulated before the link's cycle 0 (reset and the slot-state sweep).
        self.start_cycle = 0
        super().__init__(params, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure)

    def _set_beat(self, port: int, data: int, keep: int, last: bool, user: bool) -> None:
        bus = self.dut.s_axis[port]
        self.ctx.set(bus.tdata, data)
        self.ctx.set(bus.tkeep, keep)
        self.ctx.set(bus.tlast, int(last))
        self.ctx.set(bus.tuser, int(user))

    def _set_valid(self, port: int, valid: bool) -> None:
        self.ctx.set(self.dut.s_axis[port].tvalid, int(valid))

    def _set_ready(self, port: int, ready: bool) -> None:
        self.ctx.set(self.dut.m_axis[port].tready, int(ready))

    def _set_bus(self, **values: int) -> None:
        for name, value in values.items():
            self.ctx.set(getattr(self.dut.s_axil, name), value)

    def _set_reset(self, value: int) -> None:
        self.ctx.set(self.rst, value)

    async def _edge(self) -> None:
        self._values = (await self.ctx.tick().sample(*self._sampled_signals))[2:]
        if self.busy_trace is not None:
            self.busy_trace.append(int(self._values[-1]))

    def _s_ready(self, port: int) -> bool:
        return bool(self._values[port])

    def _m_valid(self, port: int) -> bool:
        return bool(self._values[self.params.ports + 4 * port])

    def _beat(self, port: int) -> tuple[int, int, bool]:
        i = self.params.ports + 4 * port
        return int(self._values[i + 1]), int(self._values[i + 2]), bool(self._values[i + 3])

    def _bus_sample(self) -> dict:
        base = 5 * self.params.ports
        return {name: int(self._values[base + i]) for i, name in enumerate(AXIL_INPUTS)}


def amaranth_vcd_path(params: SwitchParams) -> Path:
    """Where ``run_amaranth(..., waves=True)`` writes its waveform: ``<build>/sim/<slug>_amaranth/dump.vcd``."""
    from ..build import build_root
    return build_root() / "sim" / f"{params.slug()}_amaranth" / "dump.vcd"


#: Simulators a process keeps for reuse, the most recently used parameter sets (tests/sim's seven sets ran in
#: one process of 0.3 GB at most with four kept).
KEPT_BENCHES = 4
_benches: dict[tuple, "SwitchBench"] = {}


class SwitchBench:
    """:class:`cais.hdl.switch.Switch` elaborated and compiled for amaranth.sim once, run many times.

    The simulator has a ``sync`` clock of ``clock_hz`` and one testbench, which runs the job of the
    current :meth:`run`; every run after the first starts from ``Simulator.reset``.
    """

    def __init__(self, params: SwitchParams, clock_hz: float):
        from amaranth.hdl import ClockDomain, Module
        from amaranth.sim import Simulator

        from cais.hdl.switch import Switch

        self.params = params
        self.dut = Switch(params)
        top = Module()
        top.domains.sync = sync = ClockDomain("sync")
        top.submodules.switch = self.dut
        self.rst = sync.rst
        self.sim = Simulator(top)
        self.sim.add_clock(1 / clock_hz)
        self.sim.add_testbench(self._testbench)
        self._job: Callable[[Any], Awaitable] | None = None
        self._fresh = True

    async def _testbench(self, ctx) -> None:
        await self._job(ctx)

    def run(self, job: Callable[[Any], Awaitable], vcd: str | os.PathLike | None = None) -> None:
        """Simulate until ``await job(ctx)`` returns, from the initial state."""
        if not self._fresh:
            self.sim.reset()
        self._fresh = False
        self._job = job
        try:
            if vcd:
                with self.sim.write_vcd(str(vcd)):
                    self.sim.run()
            else:
                self.sim.run()
        finally:
            self._job = None


def _bench(params: SwitchParams, clock_hz: float) -> SwitchBench:
    """This process's simulator for ``params`` (taken out of the kept ones: a run that fails leaves the
    simulator mid-cycle, so it goes back only once its run has returned)."""
    bench = _benches.pop((params, clock_hz), None)
    return bench if bench is not None else SwitchBench(params, clock_hz)


def _keep(bench: SwitchBench, clock_hz: float) -> None:
    _benches[(bench.params, clock_hz)] = bench
    while len(_benches) > KEPT_BENCHES:
        del _benches[next(iter(_benches))]           # the least recently used


def run_amaranth(params: SwitchParams, main: Callable[[AmaranthLink], Awaitable], *, seed: int = 0,
                 vcd: str | os.PathLike | None = None, waves: bool = False, idle: float | list[float] = 0.0,
                 backpressure: float | list[float] = 0.0, clock_hz: float = DEFAULT_CLOCK_HZ,
                 trace_busy: bool = False, settle: int | None = None, **_ignored: Any):
    """Simulate :class:`cais.hdl.switch.Switch` and run ``await main(link)``; return its result.

    ``idle`` and ``backpressure`` are the probabilities of an idle cycle on a source and of tready low
    on a sink (one value, or one per port; seeded by ``seed``). ``vcd`` names a waveform file to write;
    ``waves=True`` without ``vcd`` writes :func:`amaranth_vcd_path`. ``trace_busy`` keeps the BUSY signal
    of every cycle in ``link.busy_trace``; ``settle`` (default ``slots + 2``, the slot-state sweep) is the
    number of cycles after reset before the link's cycle 0 (0: the driver starts during the sweep).
    """
    if waves and vcd is None:
        vcd = amaranth_vcd_path(params)
        vcd.parent.mkdir(parents=True, exist_ok=True)
    bench = _bench(params, clock_hz)
    dut = bench.dut
    link = AmaranthLink(params, dut, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure,
                        trace_busy=trace_busy, rst=bench.rst)
    settle = params.slots + 2 if settle is None else int(settle)
    outcome = {}

    async def job(ctx):
        link.ctx = ctx
        for p in range(params.ports):
            ctx.set(dut.m_axis[p].tready, 1)
        await link._reset(settle)
        link.start_cycle = RESET_CYCLES + settle
        outcome["result"] = await main(link)

    bench.run(job, vcd)
    _keep(bench, clock_hz)
    return outcome["result"]
