"""The fold chain of the per-port-bank core (docs/core-design.md, candidate B): one row of every port's
contribution, folded in ascending port order, one row per cycle (:class:`FoldChain`); then the rounding of
fp32 accumulators to the wire format as the row leaves (:class:`ResultRow`). F of docs/interface.md is the
two's latency.

The switch's fold reader (cais.hdl.alu.completion.FoldReader) builds it at its defaults; bench/bench_area.py
measures it on its own (``fold_chain``).
"""

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

from ..common.enums import DType, ReduceOp
from ..common.pipeline import delay_line
from .fpu import BF16, FP16, FP32, FloatNarrow
from .reduce import byteswap
from .slot_alu import FADD_STAGES, NARROW_STAGES, SlotALU, slot_alu_latency

__all__ = ["FoldChain", "ResultRow", "result_row_latency"]


class FoldChain(wiring.Component):
    """``rows[0..P-1]`` folded as ``acc = x[p0]; acc = acc (op) x[p1]; ...`` over the ports in ``mask``
    (ascending), with the arithmetic of :class:`cais.hdl.alu.slot_alu.SlotALU`: bit-exact with
    ``numerics.accumulate`` applied in port order (docs/numerics.md section 11).

    One :class:`SlotALU` per port in a pipeline: stage p takes the accumulator of stages 0..p-1 and port p's
    row (delayed to meet it), and either stores the row (no earlier contributor), combines it, or passes
    the accumulator on (port p not in ``mask``). A new set of rows may enter every cycle; the result
    leaves :attr:`latency` cycles later, registered.

    Members
    -------
    i_valid : In(1)
    rows : In(data_width).array(ports)
        Row r of every port's contribution (AXI byte order, big-endian elements).
    mask : In(ports)
        The contributors; at least one.
    dtype : In(DType); op : In(ReduceOp); acc_fp32 : In(1); saturate : In(1)
        The rule's arithmetic.
    o_valid : Out(1)
    result : Out(2 * data_width)
        The accumulator word as the slot memory holds it: the row in the low ``data_width`` bits in the
        wire-format modes; ``data_width / 16`` float32 accumulators with ``acc_fp32`` (rounded to the wire
        format by the result generator).
    """

    def __init__(self, ports: int, data_width: int, float_units: bool = True,
                 fadd_stages: int = FADD_STAGES):
        self.ports, self.data_width = ports, data_width
        self.float_units, self.fadd_stages = float_units, fadd_stages
        W = data_width
        super().__init__({
            "i_valid": In(1), "rows": In(W).array(ports), "mask": In(ports),
            "dtype": In(DType), "op": In(ReduceOp), "acc_fp32": In(1), "saturate": In(1),
            "o_valid": Out(1), "result": Out(2 * W),
        })

    @property
    def stage_latency(self) -> int:
        return slot_alu_latency(self.float_units, self.fadd_stages)

    @property
    def latency(self) -> int:
        """Clock edges from the rows to their result: one SlotALU per port, and the output register."""
        return self.ports * self.stage_latency + 1


    def elaborate(self, platform):
        m = Module()
        P, W, L = self.ports, self.data_width, self.stage_latency

        def delay(value, cycles, name):
            # only the valid bits are cleared by a reset (the rows in flight are dropped)
            return delay_line(m, value, cycles, name, reset_less=not name.startswith("valid"))

        # What travels down the chain with a set of rows: valid, the rule, the mask, "a contributor seen".
        valid, mask = Value.cast(self.i_valid), Value.cast(self.mask)
        kind = [self.dtype, self.op, self.acc_fp32, self.saturate]
        acc, seen = Signal(2 * W, name="acc_in"), Signal(name="seen_in")   # nothing before port 0
        for p in range(P):
            # Stage 0 has no accumulator before it: it stores (or passes on nothing), so only its store path
            # is built.
            m.submodules[f"stage{p}"] = alu = SlotALU(W, float_units=self.float_units, fadd_stages=self.fadd_stages,
                                                      store_only=p == 0)
            take = mask[p]
            m.d.comb += [
                alu.i_valid.eq(valid), alu.acc.eq(acc), alu.row.eq(delay(self.rows[p], p * L, f"row{p}")),
                alu.granule.eq(0), alu.store.eq(~seen),
                alu.dtype.eq(kind[0]), alu.op.eq(kind[1]), alu.acc_fp32.eq(kind[2]), alu.saturate.eq(kind[3]),
            ]
            # the rest of the chain's state follows the ALU's latency
            take_d, acc_d = delay(take, L, f"take{p}"), delay(acc, L, f"acc{p}")
            seen_d, valid = delay(seen, L, f"seen{p}"), delay(valid, L, f"valid{p}")
            mask, kind = delay(mask, L, f"mask{p}"), [delay(k, L, f"kind{p}_{i}") for i, k in enumerate(kind)]
            nxt_acc, nxt_seen = Signal(2 * W, name=f"acc{p + 1}"), Signal(name=f"seen{p + 1}")
            m.d.comb += [nxt_acc.eq(Mux(take_d, alu.result, acc_d)), nxt_seen.eq(seen_d | take_d)]
            acc, seen = nxt_acc, nxt_seen
        result = Signal(2 * W, name="result_r", reset_less=True)
        m.d.sync += [self.o_valid.eq(valid), result.eq(acc)]        # registered out
        m.d.comb += self.result.eq(result)
        return m


class ResultRow(wiring.Component):
    """One payload row of a result, from the fold chain's accumulator word, pipelined.

    In the wire format the row is the word's low ``data_width`` bits; fp16/bf16 accumulated in fp32 fill
    the whole word with W/16 float32 accumulators, which are rounded to the wire format here, once, as the
    result leaves (docs/numerics.md). With float units the rounding takes :attr:`latency` = 3 clock edges
    (the narrowing's :data:`~cais.hdl.alu.slot_alu.NARROW_STAGES` = 2 register ranks: the shift distance,
    then the alignment; then the rounding and the choice of the row, into the output register), and every
    row takes them, whatever its kind; without float units the row is the word's low bits,
    combinational (latency 0). A new word may enter every cycle.

    Members
    -------
    word : In(2 * data_width)
        The accumulator word (:attr:`cais.hdl.alu.fold.FoldChain.result`).
    acc_fp32 : In(1); dtype : In(4)
        How the set accumulates (presented with ``word``).
    row : Out(data_width)
        The row of the word presented :attr:`latency` cycles earlier.
    """

    def __init__(self, data_width: int, float_units: bool = True):
        self.data_width, self.float_units = data_width, float_units
        super().__init__({"word": In(2 * data_width), "acc_fp32": In(1), "dtype": In(4),
                          "row": Out(data_width)})

    @property
    def latency(self) -> int:
        """Clock edges from ``word`` to its ``row``."""
        return result_row_latency(self.float_units)

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        wire = self.word[:W]
        if not self.float_units:
            m.d.comb += self.row.eq(wire)
            return m
        # Stages 1 .. NARROW_STAGES (inside FloatNarrow): the shift distance, the alignment; the controls
        # and the wire row beside them.
        narrowed = {}
        for dtype, fmt in ((proto.DType.FP16, FP16), (proto.DType.BF16, BF16)):
            out = Signal(W, name=f"narrow_{dtype.name.lower()}")
            for i in range(W // 16):
                unit = m.submodules[f"narrow_{dtype.name.lower()}{i}"] = FloatNarrow(FP32, fmt, stages=NARROW_STAGES)
                m.d.comb += [unit.a.eq(byteswap(self.word[32 * i:32 * i + 32], 4)),
                             out[16 * i:16 * i + 16].eq(byteswap(unit.result, 2))]
            narrowed[dtype] = out
        # Data only (the caller's valid bits travel beside it): no register here needs a reset.
        wire_r = delay_line(m, wire, NARROW_STAGES, "wire")
        acc_r = delay_line(m, self.acc_fp32, NARROW_STAGES, "acc_fp32")
        bf16_r = delay_line(m, self.dtype == proto.DType.BF16, NARROW_STAGES, "bf16")
        # The last stage: the rounding and the choice, into the output register.
        row = Signal(W, reset_less=True)
        m.d.sync += row.eq(Mux(acc_r, Mux(bf16_r, narrowed[proto.DType.BF16], narrowed[proto.DType.FP16]),
                               wire_r))
        m.d.comb += self.row.eq(row)
        return m


def result_row_latency(float_units: bool) -> int:
    """:attr:`ResultRow.latency` of a ResultRow so built, without building it."""
    return NARROW_STAGES + 1 if float_units else 0
