"""The reduce ALU: the fold chain (cais.hdl.alu.fold.FoldChain, with SlotALU / ReduceALU / the FPU behind it; top
``cais_alu``) against cais.numerics, the project's bit-exact numerics reference.

Each item is one row of every port, a random contributor mask and the rule's arithmetic; the expected word is
``numerics.accumulate`` applied in ascending port order over the contributors (docs/numerics.md section 11):
the row in the low data_width bits, or float32 accumulators over the whole word with acc_fp32. Rows are random
elements with each format's special values mixed in (zeros, extremes; for floats cais.sim.operands' catalogue:
NaNs, infinities, subnormals). Every dtype x operator the build has (float build: all six dtypes; integer
build: int32/int16/int8) runs with the source back to back and with idle insertion (tvalid low 3 cycles of 4);
the chain has no tready, so there is no back-pressure to apply. Every result's cycle is checked too: the chain
takes a set of rows per cycle and returns each ``ports * L + 1`` edges later, L the slot ALU's documented
latency (fadd_stages + 7 with float units, 4 without).
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamMonitor, AxiStreamSource

from cais import numerics
from cais.hdl.blocks import fold_input_fields
from cais.protocol import DType, ReduceOp
from cais.hdl.alu.slot_alu import FADD_STAGES
from cais.sim.operands import INT_BITS, random_row
from cais.tb.common import CLOCK_NS, clock_and_reset, quiet_bfms, set_idle, tb_params

ITEMS = 48                      # items per case


def _build_dtypes():
    try:
        float_units = tb_params().float_units
    except RuntimeError:        # imported outside a run (e.g. by a linter): name every case
        float_units = True
    return list(DType) if float_units else list(INT_BITS)


DTYPES = _build_dtypes()


def expected(item: dict, W: int) -> tuple[int, int]:
    """(word, the bits that matter): the port-order fold of cais.numerics."""
    acc = None
    for p, row in enumerate(item["rows"]):
        if item["mask"] >> p & 1:
            values = numerics.decode(item["dtype"], row.to_bytes(W // 8, "little"))
            acc = numerics.accumulate(item["dtype"], item["op"], acc, values, acc_fp32=item["acc_fp32"],
                                      saturate=item["saturate"])
    wide = numerics.widens(item["dtype"], item["acc_fp32"])
    data = numerics.encode(DType.FP32 if wide else item["dtype"], np.asarray(acc))
    return int.from_bytes(data, "little"), (1 << (2 * W if wide else W)) - 1


class TB:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.params = P = tb_params()
        self.rng = random.Random(seed)
        self.ports, self.width = P.ports, P.data_width
        quiet_bfms(dut)
        self.fields = fold_input_fields(self.ports, self.width)
        assert len(dut.s_axis__tdata) == sum(b for _, b in self.fields)
        # one beat per item: a single "byte" as wide as the bus
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis", bus_separator="__"), dut.clk, dut.rst,
                                      byte_lanes=1)
        self.monitor = AxiStreamMonitor(AxiStreamBus.from_prefix(dut, "m_axis", bus_separator="__"), dut.clk,
                                        dut.rst, byte_lanes=1)
        stage = FADD_STAGES + 7 if P.float_units else 4
        self.latency = self.ports * stage + 1
        self.taken = []            # sim time of every edge that took a set of rows (tvalid high; no tready)

    async def watch_input(self):
        while True:
            await RisingEdge(self.dut.clk)
            if self.dut.s_axis__tvalid.value == 1:
                self.taken.append(get_sim_time())             # in steps (ps)

    def pack(self, item: dict) -> int:
        values = {f"row{p}": row for p, row in enumerate(item["rows"])}
        values.update(mask=item["mask"], dtype=int(item["dtype"]), op=int(item["op"]),
                      acc_fp32=int(item["acc_fp32"]), saturate=int(item["saturate"]))
        word, at = 0, 0
        for name, bits in self.fields:
            assert 0 <= values[name] < 1 << bits
            word |= values[name] << at
            at += bits
        return word

    def item(self, dtype: DType, op: ReduceOp) -> dict:
        rng = self.rng
        half = dtype in (DType.FP16, DType.BF16)
        return {"rows": [random_row(rng, dtype, self.width) for _ in range(self.ports)],
                "mask": rng.randrange(1, 1 << self.ports), "dtype": dtype, "op": op,
                "acc_fp32": half and rng.random() < 0.5,
                "saturate": dtype in INT_BITS and op == ReduceOp.SUM and rng.random() < 0.5}


@cocotb.test()
@cocotb.parametrize(dtype=DTYPES, op=list(ReduceOp), idle=[False, True])
async def fold(dut, dtype, op, idle):
    tb = TB(dut, seed=DTYPES.index(dtype) * 8 + int(op) * 2 + idle)
    await clock_and_reset(dut)
    cocotb.start_soon(tb.watch_input())
    set_idle(tb.source, idle)
    items = [tb.item(dtype, op) for _ in range(ITEMS)]
    for item in items:
        await tb.source.send(AxiStreamFrame([tb.pack(item)]))
    await tb.source.wait()
    await ClockCycles(dut.clk, tb.latency + 4)
    got = []
    while not tb.monitor.empty():
        got.append(tb.monitor.recv_nowait())
    assert len(got) == len(items), f"{len(got)} results for {len(items)} items"
    assert len(tb.taken) == len(items), f"{len(tb.taken)} sets of rows taken for {len(items)} items"
    for i, (item, taken, frame_out) in enumerate(zip(items, tb.taken, got)):
        want, care = expected(item, tb.width)
        word = frame_out.tdata[0] & care
        assert word == want, (f"item {i} {dtype.name} {op.name} mask {item['mask']:#b} acc_fp32={item['acc_fp32']} "
                              f"saturate={item['saturate']}: got {word:#x}, want {want:#x}")
        # rows sampled by edge c are sampled out by edge c + latency (the monitor records that edge)
        cycles, rest = divmod(frame_out.sim_time_start - taken, CLOCK_NS * 1000)   # steps: ps
        assert rest == 0
        assert cycles == tb.latency, f"item {i}: result {cycles} cycles after the rows, want {tb.latency}"
