"""Frame-level access to the Amaranth switch under amaranth.sim.

Each port gets a background source (a queue of frames to send) and sink (the frames received); the
scenario, an async function, programs registers over AXI4-Lite and waits for the traffic to drain.
The same register helpers (:class:`cais.registers.RegisterFile`, :mod:`cais.tables`) drive this harness,
the cocotb testbench and the reference model.
"""

from __future__ import annotations

import random
from collections import deque

from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from cais.hdl.switch import Switch
from cais.params import SwitchParams
from cais.registers import read_counters, register_map

from .traffic import TxFrame, beats_of

__all__ = ["SwitchSim", "axil_write", "axil_read"]


async def axil_write(tick, ctx, bus, addr: int, value: int) -> int:
    """One AXI4-Lite write on `bus` in amaranth.sim; returns BRESP. `tick(*signals)` advances one clock
    and returns the signals' values sampled before the edge (callers count cycles in it)."""
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    aw = w = False
    while not (aw and w):
        awready, wready = await tick(bus.awready, bus.wready)
        if awready and not aw:
            aw = True
            ctx.set(bus.awvalid, 0)
        if wready and not w:
            w = True
            ctx.set(bus.wvalid, 0)
    while True:
        bvalid, bresp = await tick(bus.bvalid, bus.bresp)
        if bvalid:
            break
    ctx.set(bus.bready, 0)
    return int(bresp)


async def axil_read(tick, ctx, bus, addr: int) -> int:
    """One AXI4-Lite read on `bus` in amaranth.sim (see :func:`axil_write`)."""
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    while not (await tick(bus.arready))[0]:
        pass
    ctx.set(bus.arvalid, 0)
    while True:
        rvalid, rdata = await tick(bus.rvalid, bus.rdata)
        if rvalid:
            break
    ctx.set(bus.rready, 0)
    return int(rdata)


class _Counted(Elaboratable):
    """The switch beside a free-running cycle counter, so every process stamps events alike."""

    def __init__(self, dut):
        self.dut = dut
        self.cycle = Signal(64)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.d.sync += self.cycle.eq(self.cycle + 1)
        return m


class SwitchSim:
    """Run a scenario against :class:`cais.hdl.switch.Switch` in amaranth.sim.

    `idle` and `backpressure`, when given, are probabilities of inserting an idle cycle on a source and
    of deasserting tready on a sink (seeded), as the verilog-axis testbenches do; `backpressure` may be a
    list with one probability per port. A port in ``hold``
    keeps its sink's tready low until the scenario removes it.

    Cycle stamps (cycle n is the n-th clock period of the simulation; a handshake is stamped with the
    cycle in which tvalid and tready were both high): ``tx_times[p]`` holds (first, last) beat of every
    frame sent on port p, ``rx_times[p]`` the same for every frame received, ``gaps[p]`` the cycles in which
    port p's sink was ready in the middle of a frame but tvalid was low. With ``trace_busy`` the BUSY
    register's value of every cycle is kept in ``busy_trace``.
    """

    def __init__(self, params: SwitchParams = SwitchParams(), *, idle: float = 0.0,
                 backpressure: float | list[float] = 0.0, seed: int = 0, trace_busy: bool = False):
        self.params = params
        self.dut = Switch(params)
        self._top = _Counted(self.dut)
        self.tx = [deque() for _ in range(params.ports)]
        self.rx = [[] for _ in range(params.ports)]
        self.tx_times = [[] for _ in range(params.ports)]
        self.rx_times = [[] for _ in range(params.ports)]
        self.gaps = [0] * params.ports
        self.hold: set[int] = set()
        self.trace_busy = trace_busy
        self.busy_trace: list[int] = []
        self.idle = idle
        self.backpressure = (list(backpressure) if isinstance(backpressure, (list, tuple))
                             else [backpressure] * params.ports)
        self.rng = random.Random(seed)
        self.cycles = 0
        self.ctx = None

    # ---------------------------------------------------------------- frames
    def send(self, port: int, frame: TxFrame | bytes):
        """Queue a frame on a port."""
        self.tx[port].append(frame if isinstance(frame, TxFrame) else TxFrame(bytes(frame)))

    def busy(self) -> bool:
        return any(self.tx) or self._in_flight

    # ---------------------------------------------------------------- AXI4-Lite
    async def write(self, addr: int, value: int):
        return await axil_write(self._tick, self.ctx, self.dut.s_axil, addr, value)

    async def read(self, addr: int) -> int:
        return await axil_read(self._tick, self.ctx, self.dut.s_axil, addr)

    async def _tick(self, *signals):
        return (await self.ctx.tick().sample(*signals))[2:]

    async def counters(self) -> dict:
        """Every COUNTER and LEVEL register, shaped like ``SwitchModel.counters()``."""
        return await read_counters(self.read, register_map(self.params))

    async def apply(self, writes):
        for addr, value in writes:
            await self.write(addr, value)

    async def drain(self, quiet: int = 8, limit: int = 200_000):
        """Wait until every source is empty, BUSY is 0 and no port has moved a beat for `quiet` cycles."""
        still = 0
        for _ in range(limit):
            await self.ctx.tick()
            still = 0 if self.busy() or self._activity or self.ctx.get(self.dut.busy) else still + 1
            self._activity = False
            if still >= quiet:
                return
        raise TimeoutError("switch did not drain")

    # ---------------------------------------------------------------- processes
    def _source(self, port):
        async def run(ctx):
            bus = self.dut.s_axis[port]
            B = self.params.beat_bytes
            while True:
                if not self.tx[port]:
                    self._in_flight_ports.discard(port)
                    await ctx.tick()
                    continue
                self._in_flight_ports.add(port)
                frame = self.tx[port].popleft()
                stamps = []
                for tdata, tkeep, tlast in beats_of(frame, B):
                    while self.idle and self.rng.random() < self.idle:
                        ctx.set(bus.tvalid, 0)
                        await ctx.tick()
                    ctx.set(bus.tdata, tdata)
                    ctx.set(bus.tkeep, tkeep)
                    ctx.set(bus.tlast, tlast)
                    ctx.set(bus.tvalid, 1)
                    while True:
                        _, _, ready, cycle = await ctx.tick().sample(bus.tready, self._top.cycle)
                        if ready:
                            break
                    stamps.append(cycle)
                    self._activity = True
                self.tx_times[port].append((stamps[0], stamps[-1]))
                ctx.set(bus.tvalid, 0)
        return run

    def _sink(self, port):
        async def run(ctx):
            bus = self.dut.m_axis[port]
            buf = bytearray()
            first = None
            while True:
                bp = self.backpressure[port]
                ready = port not in self.hold and not (bp and self.rng.random() < bp)
                ctx.set(bus.tready, ready)
                _, _, valid, tdata, tkeep, tlast, cycle = await ctx.tick().sample(
                    bus.tvalid, bus.tdata, bus.tkeep, bus.tlast, self._top.cycle)
                if ready and not valid and first is not None:
                    self.gaps[port] += 1
                if valid and ready:
                    self._activity = True
                    first = cycle if first is None else first
                    n = bin(tkeep).count("1")
                    buf += int(tdata).to_bytes(self.params.beat_bytes, "little")[:n]
                    if tlast:
                        self.rx[port].append(bytes(buf))
                        self.rx_times[port].append((first, cycle))
                        buf = bytearray()
                        first = None
        return run

    @property
    def _in_flight(self):
        return bool(self._in_flight_ports)

    def _busy_monitor(self):
        async def run(ctx):
            while True:
                _, _, busy, cycle = await ctx.tick().sample(self.dut.busy, self._top.cycle)
                assert cycle == len(self.busy_trace)
                self.busy_trace.append(int(busy))
        return run

    def run(self, scenario, *, vcd: str | None = None):
        """Run `scenario(sim)` (an async function) to completion."""
        self._in_flight_ports = set()
        self._activity = False
        sim = Simulator(self._top)
        sim.add_clock(1e-8)
        for p in range(self.params.ports):
            sim.add_testbench(self._source(p), background=True)
            sim.add_testbench(self._sink(p), background=True)
        if self.trace_busy:
            sim.add_testbench(self._busy_monitor(), background=True)

        async def main(ctx):
            self.ctx = ctx
            await ctx.tick().repeat(2)
            await scenario(self)

        sim.add_testbench(main)
        if vcd:
            with sim.write_vcd(vcd):
                sim.run()
        else:
            sim.run()
