"""The whole switch: cais.hdl.top.SwitchTop (the exported ``cais_switch``: AXI4-Stream ``s_axis_p*`` /
``m_axis_p*``, AXI4-Lite ``s_axil``) under cocotbext-axi models: an AxiStreamSource and an AxiStreamSink per
port and an AxiLiteMaster.

The cases are cais.sim.directed's (the protocol's directed cases, shared with the amaranth.sim and C++ link
regressions): each programs a rule and the MAC table through the registers (cais.tables' rule_writes /
mac_writes / slot_clear_writes), then sends batches of contributions, forwarded and malformed frames; each
batch drains (the BUSY register reads 0) before the next. cais.sim.directed.score_case scores them against the
reference model (cais.sim.refmodel.SwitchModel fed the same frames): the frames out of every port bit for bit
(as multisets per batch: the order across ports is the switch's choice), then every counter and gauge of the
register map read over AXI4-Lite, and the accounting invariant. Every group runs plain, with idle insertion on
the sources and the AXI4-Lite requests, with back-pressure on the sinks and the AXI4-Lite responses, and both.
"""

from __future__ import annotations

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiResp, AxiStreamBus, AxiStreamFrame, AxiStreamSink, \
    AxiStreamSource

from cais.registers import read_counters, register_map
from cais.sim.directed import directed_cases, score_case
from cais.sim.traffic import TxFrame
from cais.tb.common import (IDLE_BACKPRESSURE, clock_and_reset, quiet_bfms, set_axil_pauses, set_backpressure,
                            set_idle, tb_params)

#: groups of cais.sim.directed cases, one cocotb test per group x idle x back-pressure
GROUPS = {
    "reduce": ["basic_sum", "basic_max", "basic_min", "sum_wraps", "back_to_back_same_set"],
    "retransmit": ["repeat_ignored", "late_repeat_answered", "both_sets_in_flight", "slot_clear"],
    "forward": ["ordinary_forwarded", "allgather_broadcast_forwarded", "one_worker_group", "foreign_port_rejected"],
    "malformed": ["malformed_bad_fcs", "malformed_bad_framing", "malformed_runt", "malformed_oversize",
                  "malformed_no_rule", "malformed_bad_dtype", "tag_mismatch_rejected"],
    "numerics": ["float_sum_fp16_acc32", "int16_sum_wrap_saturate", "reproducible_fold"],
}
DRAIN_LIMIT = 20_000           # cycles a batch may take to drain


class TB:
    """Clock, reset and the models of the switch; the harness cais.sim.directed.score_case drives."""

    def __init__(self, dut):
        self.dut = dut
        self.params = P = tb_params()
        self.regmap = register_map(P)
        quiet_bfms(dut)
        self.sources = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_p{p}"), dut.clk, dut.rst)
                        for p in range(P.ports)]
        self.sinks = [AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_p{p}"), dut.clk, dut.rst)
                      for p in range(P.ports)]
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.rx: list[list[bytes]] = [[] for _ in range(P.ports)]

    async def start(self, idle: bool, backpressure: bool):
        await clock_and_reset(self.dut)
        for source in self.sources:
            set_idle(source, idle)
        for sink in self.sinks:
            set_backpressure(sink, backpressure)
        set_axil_pauses(self.axil, idle, backpressure)
        await self.settle()

    async def reset(self):
        """Reset the switch between cases (the clock keeps running)."""
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await self.settle()
        self.rx = [[] for _ in range(self.params.ports)]

    async def settle(self):
        # the slot-state sweep after reset visits every slot once (it does not set BUSY)
        await ClockCycles(self.dut.clk, self.params.slots + 8)

    # ---- the harness of cais.sim.directed.score_case
    async def write(self, addr: int, value: int) -> None:
        resp = await self.axil.write(addr, int(value).to_bytes(4, "little"))
        assert resp.resp == AxiResp.OKAY, f"write {addr:#x}: {resp.resp}"

    async def read(self, addr: int) -> int:
        resp = await self.axil.read(addr, 4)
        assert resp.resp == AxiResp.OKAY, f"read {addr:#x}: {resp.resp}"
        return int.from_bytes(resp.data, "little")

    async def apply(self, writes) -> None:
        for addr, value in writes:
            await self.write(addr, value)

    def send(self, port: int, frame: TxFrame) -> None:
        """Queue the frame on the port's source: tuser on a bad-FCS frame, and for a bad-keep frame the last
        beat's bytes one lane up (lane 0's tkeep clear), as cais.sim.traffic.beats_of sends it."""
        data, keep = list(frame.data), [1] * len(frame.data)
        if frame.bad_keep:
            start = (len(data) - 1) // self.params.beat_bytes * self.params.beat_bytes
            data.insert(start, 0)
            keep.insert(start, 0)
        self.sources[port].send_nowait(AxiStreamFrame(bytes(data), tkeep=keep, tuser=int(frame.bad_fcs)))

    async def drain(self) -> None:
        """Until every source has sent everything and BUSY reads 0; then take what the sinks received."""
        busy = self.regmap["BUSY"].address()
        for _ in range(DRAIN_LIMIT // 16):
            if all(s.empty() and not s.active for s in self.sources) and not await self.read(busy):
                break
            await ClockCycles(self.dut.clk, 16)
        else:
            raise AssertionError(f"the switch did not drain within {DRAIN_LIMIT} cycles")
        await RisingEdge(self.dut.clk)
        for port, sink in enumerate(self.sinks):
            while not sink.empty():
                self.rx[port].append(bytes(sink.recv_nowait().tdata))
        assert not any(sink.active for sink in self.sinks), "a frame still partly received with BUSY 0"

    async def counters(self) -> dict:
        return await read_counters(self.read, self.regmap)


@cocotb.test()
@cocotb.parametrize(group=list(GROUPS), **IDLE_BACKPRESSURE)
async def directed(dut, group, idle, backpressure):
    tb = TB(dut)
    await tb.start(idle, backpressure)
    cases = {c.name: c for c in directed_cases(tb.params, seed=list(GROUPS).index(group))}
    failed = []
    for i, name in enumerate(GROUPS[group]):
        if i:
            await tb.reset()
        problems = await score_case(tb, tb.params, cases[name])
        failed += [f"{name}: {p}" for p in problems]
    assert not failed, "\n".join(failed[:10])
