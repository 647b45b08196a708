"""The slot ALU: the read-modify-write arithmetic between the slot memory's read and its write."""

import functools
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

from ..common.pipeline import delay_line, register_copy
from .fpu import BF16, FP16, FP32, NUMPY_ZERO_TIE, FloatAdder, FloatMaxMin, FloatNarrow, FloatWiden, MaxMinOp
from .reduce import ReduceALU, byteswap

__all__ = ["SlotALU", "slot_alu_latency", "FADD_STAGES", "NARROW_STAGES"]

#: Pipeline stages of the slot ALU's float adders (FloatAdder.CUTS) unless told otherwise: the most, for
#: the clock (the fold chain builds these).
FADD_STAGES = 6

#: Register ranks inside the narrowing of float32 results to fp16/bf16 (FloatNarrow's ``stages``): one
#: before the alignment shift (after the shift distance's carry chains), one after it. The slot ALU's and
#: the result row's narrowings are built with it, and their latencies count it.
NARROW_STAGES = 2


class SlotALU(wiring.Component):
    """One payload row combined with the slot word it accumulates into, bit-exact with :mod:`cais.numerics`.

    A slot word is ``2 * data_width`` bits, two granules of ``W = data_width`` bits (granule 0 in the low
    bits). Rows and words are in AXI byte order (byte 0 in bits 7:0) and hold big-endian elements: element
    ``i`` of ``n``-byte elements is bytes ``n*i .. n*i+n-1`` (see :func:`cais.hdl.alu.reduce.byteswap`).

    * **Wire-format modes** (int32/int16/int8, fp32, and fp16/bf16 without ``acc_fp32``): granule
      ``granule`` of the result is ``numerics.combine(dtype, op, acc_granule, row, saturate)``, or ``row``
      unchanged with ``store``; ``we = 1 << granule``. (The other granule of ``result`` repeats it.)
    * **fp32 accumulation** (fp16/bf16 with ``acc_fp32``): the whole word holds ``W/16`` float32
      accumulators, accumulator ``i`` (word bytes ``4i .. 4i+3``) belonging to row element ``i``. The result
      is ``numerics.combine(FP32, op, acc, numerics.widen(dtype, row))``, or ``widen(dtype, row)`` with
      ``store``; ``we = 0b11``.

    The float arithmetic runs in ``W/16`` float32 lanes, each a :class:`~cais.hdl.alu.fpu.FloatAdder` and a
    :class:`~cais.hdl.alu.fpu.FloatMaxMin`: fp32 wire mode uses lanes ``0 .. W/32-1``; fp16/bf16 wire mode
    widens both operands, combines in float32 and narrows the result (exactly numpy's float16 arithmetic,
    and correctly rounded because 24 >= 2p + 2); fp32 accumulation widens the row element only. The
    ``-0``/``+0`` tie of max/min returns the operand numpy returns for the format the reference computes
    in (:data:`~cais.hdl.alu.fpu.NUMPY_ZERO_TIE`: float16 for fp16 wire mode, float32 otherwise). NaN results
    are the canonical quiet NaN of the output format; ``store`` passes a row's NaN payloads unchanged in the
    wire-format modes.

    Every result appears :attr:`latency` clock edges after its inputs, whatever the dtype and op (the
    integer, max/min and store results are delayed to match the adder), and a new row may enter every
    cycle. With float units the pipeline is: the inputs registered; the widening's classification and
    leading-zero count (and the integer ALU's sums) registered; the operands, widened and formatted,
    registered; the adder's ``fadd_stages`` (max/min and the integer result beside it); the lane results
    registered; the narrowing to the wire format in :data:`NARROW_STAGES` + 1 = 3 stages (the shift
    distance, the alignment, then the rounding and the packing into the output register):
    ``latency = fadd_stages + 5 + NARROW_STAGES``. No input reaches an output or the adder without
    a register rank between. Without float units only the integer ALU is built, in four stages (the
    inputs registered, the sums and compares registered, each lane's joined sum and order registered,
    then the result chosen into the output register: ``latency = 4``), and float dtypes give don't-care
    results.

    ``store_only=True`` builds the store path alone (the first stage of a fold chain, which has no
    accumulator before it): every row is stored, as with ``store`` high, whatever ``store`` and ``acc``
    say; the latency is the same.

    Members
    -------
    i_valid : In(1)
        The inputs hold a row to combine.
    acc : In(2 * data_width)
        The slot word read for this row, both granules.
    row : In(data_width)
        The incoming payload row.
    granule : In(1)
        The granule of the word the row belongs to (wire-format modes).
    dtype : In(4)
        A :class:`cais.protocol.DType`.
    op : In(4)
        A :class:`cais.protocol.ReduceOp`.
    acc_fp32 : In(1)
        fp16/bf16: the word holds float32 accumulators. Ignored for the other dtypes.
    saturate : In(1)
        Integer SUM saturates instead of wrapping.
    store : In(1)
        First contribution: the result is the row as it came (widened with ``acc_fp32``).
    o_valid : Out(1)
        ``i_valid`` of the inputs presented :attr:`latency` cycles earlier (a reset drops the rows in flight).
    result : Out(2 * data_width)
        The new slot word for those inputs; only the granules enabled in ``we`` are meaningful.
    we : Out(2)
        Granule write enables of ``result`` (0 while ``o_valid`` is low).
    """

    def __init__(self, data_width: int, float_units: bool = True, fadd_stages: int = FADD_STAGES,
                 store_only: bool = False):
        if data_width < 64 or data_width % 32:
            raise ValueError(f"data_width must be a multiple of 32 of at least 64, not {data_width}")
        if fadd_stages not in FloatAdder.CUTS:
            raise ValueError(f"fadd_stages must be one of {sorted(FloatAdder.CUTS)}, not {fadd_stages}")
        self.data_width = data_width
        self.float_units = float_units
        self.fadd_stages = fadd_stages
        self.store_only = store_only
        W = data_width
        super().__init__({
            "i_valid": In(1), "acc": In(2 * W), "row": In(W), "granule": In(1),
            "dtype": In(4), "op": In(4), "acc_fp32": In(1), "saturate": In(1), "store": In(1),
            "o_valid": Out(1), "result": Out(2 * W), "we": Out(2),
        })

    @property
    def latency(self) -> int:
        """Clock edges from the inputs to their ``result``, ``we`` and ``o_valid``."""
        return slot_alu_latency(self.float_units, self.fadd_stages)

    def elaborate(self, platform):
        m = Module()
        s = self._inputs(m, platform)
        if not self.float_units:
            self._integer_only(m, s)
        else:
            self._float_operands(m, s, platform)
            self._float_lanes(m, s)
            self._narrow_and_pack(m, s)
        return m

    @staticmethod
    def _reg(m, value, name, reset_less=True, cycles=1):
        # (a constant data value stays a constant: the store-only stage's store and accumulator)
        return delay_line(m, value, cycles, name, reset_less=reset_less)

    def _inputs(self, m, platform):
        """Stage 0, in every build: the inputs registered (in a fold chain the stage before chooses this
        stage's accumulator right in front of them), and the granule the wire-format modes read decided
        in front of the register (``s.hi``: ``granule`` and not fp32 accumulation), so that the 2W-bit
        choice of the accumulator granule hangs on one flip-flop, not on the dtype's decode. With float
        units the integer ALU reads a copy of its own of the accumulator (``s.acc_int``:
        :func:`~cais.hdl.common.pipeline.register_copy`), so that neither the float lanes' operands nor
        the integer ALU's compares wait for a net spread over both (the fold chain's limit was the
        accumulator register into an int8 compare, 5.5 ns on its first net); in every build it reads a
        copy of the granule per 32-bit group (``s.hi_int``). Returns the namespace the other stages
        share."""
        reg = functools.partial(self._reg, m)
        s = SimpleNamespace()
        W = self.data_width
        s.granule, s.row = reg(self.granule, "in_granule"), reg(self.row, "in_row")
        s.dtype, s.op = reg(self.dtype, "in_dtype"), reg(self.op, "in_op")
        s.acc_fp32 = reg(self.acc_fp32, "in_acc_fp32")
        s.saturate = reg(self.saturate, "in_saturate")
        if self.store_only:
            s.store, s.acc, s.hi = Const(1), Const(0, 2 * W), Const(0)
            s.acc_int, s.hi_int = s.acc, [s.hi] * -(-W // 32)
        else:
            s.store, s.acc = reg(self.store, "in_store"), reg(self.acc, "in_acc")
            hi = self.granule & ~(_is_half(self.dtype) & self.acc_fp32)
            # the integer ALU's granule choice: a copy of hi per 32-bit group, beside that group's muxes
            # (the float switch measured 3.44 + 2.32 ns of routing from one in_hi_int over a fold stage's
            # 64 muxes into the int32 compare's pieces); the float lanes' choice (s.hi) is a register of
            # its own
            s.hi_int = [register_copy(m, hi, f"in_hi_int{g}", platform) for g in range(-(-W // 32))]
            if self.float_units:
                s.hi = reg(hi, "in_hi")
                s.acc_int = register_copy(m, self.acc, "in_acc_int", platform)
            else:
                s.acc_int = s.acc
        s.valid = reg(self.i_valid, "in_valid", reset_less=False)
        return s

    def _integer_only(self, m, s):
        """Without float units. Stage 1: the granule and the integer ALU's sums and compares (its first
        register rank); stage 2: the pieces joined (its second); stage 3: the result chosen (op,
        saturation, dtype, store), into the output register."""
        reg = functools.partial(self._reg, m)
        W = self.data_width
        acc32 = _is_half(s.dtype) & s.acc_fp32
        m.submodules.int_alu = int_alu = ReduceALU(W, stages=2)
        m.d.comb += [int_alu.a.eq(_granule_of(s.acc_int, s.hi_int, W)),
                     int_alu.b.eq(s.row), int_alu.op.eq(s.op),
                     int_alu.dtype.eq(s.dtype), int_alu.saturate.eq(s.saturate)]
        d = int_alu.latency                   # what travels beside the ALU is delayed to meet its result
        we_r = reg(Mux(acc32, 0b11, Mux(s.granule, 0b10, 0b01)), "we", cycles=d)
        row_r, store_r = reg(s.row, "row", cycles=d), reg(s.store, "store", cycles=d)
        valid_r = reg(s.valid, "valid", reset_less=False, cycles=d)
        wire_result = Mux(store_r, row_r, int_alu.result)
        result = Signal(2 * W, name="result_r", reset_less=True)
        m.d.sync += [
            self.o_valid.eq(valid_r),
            result.eq(Cat(wire_result, wire_result)),
            self.we.eq(Mux(valid_r, we_r, 0)),
        ]
        m.d.comb += self.result.eq(result)

    def _float_operands(self, m, s, platform):
        """Stages 1 and 2: the widening's classification and leading-zero count (FloatWiden's register
        rank), the integer ALU's sums and compares (ReduceALU's), then every lane's float32 operands, the
        integer result and the controls, registered (``s.operands``, ``s.r_*``)."""
        reg = functools.partial(self._reg, m)
        W, DT = self.data_width, proto.DType
        dtype, op, acc, row, granule, store = s.dtype, s.op, s.acc, s.row, s.granule, s.store
        is_half = _is_half(dtype)
        acc32 = Signal()
        m.d.comb += acc32.eq(is_half & s.acc_fp32)
        we = Mux(acc32, 0b11, Mux(granule, 0b10, 0b01))

        # The granule the wire-format modes combine with. fp32 accumulation reads lanes 0 .. W/32-1 from
        # granule 0 through the same mux (lanes W/32 .. W/16-1 read granule 1 directly).
        a_gran = Signal(W)
        m.d.comb += a_gran.eq(Mux(s.hi, acc[W:], acc[:W]))

        is_fp32 = dtype == DT.FP32
        is_bf16 = dtype == DT.BF16
        half_wire = is_half & ~s.acc_fp32
        # Results that come out of the float lanes; the others (integers, wire-format store) take the
        # wire_result path.
        lane_form = (is_fp32 | is_half) & ~(store & ~acc32)
        use_adder = (op == proto.ReduceOp.SUM) & ~store
        # Which operand wins a -0/+0 tie: FloatMaxMin follows float32; fp16 wire mode follows float16.
        s.tie16 = tie16 = NUMPY_ZERO_TIE[FP16]
        fix_tie = half_wire & ~is_bf16 if tie16 != NUMPY_ZERO_TIE[FP32] else Const(0)

        # Stage 1: the integer ALU (on its own copy of the accumulator), the widening's first rank, the
        # controls beside them.
        m.submodules.int_alu = int_alu = ReduceALU(W, stages=1)
        int_gran = _granule_of(s.acc_int, s.hi_int, W) if not self.store_only else a_gran
        m.d.comb += [int_alu.a.eq(int_gran), int_alu.b.eq(row), int_alu.op.eq(op),
                     int_alu.dtype.eq(dtype), int_alu.saturate.eq(s.saturate)]
        bf16_1, half_wire_1, is_half_1 = reg(is_bf16, "bf16_1"), reg(half_wire, "half_wire_1"), reg(is_half, "half_1")
        row_1, store_1 = reg(row, "row_1"), reg(store, "store_1")

        def widened(bits16, name):
            # A wire fp16/bf16 element (native bit order) as float32, exactly, one clock edge later.
            w16, wbf = FloatWiden(FP16, FP32, stages=1), FloatWiden(BF16, FP32, stages=1)
            m.submodules[f"{name}_widen16"] = w16
            m.submodules[f"{name}_widenbf"] = wbf
            m.d.comb += [w16.a.eq(bits16), wbf.a.eq(bits16)]
            return Mux(bf16_1, wbf.result, w16.result)

        # Stage 2: the operands of every lane as float32, the integer result and the controls, registered.
        s.operands, s.mm_operands = [], []
        for i in range(W // 16):
            # Operands of lane i as float32: a from the word, b from the row. Lanes W/32 .. W/16-1 only
            # serve fp16/bf16 (a 32-bit element i of the word lies in granule 1 there).
            a16 = byteswap(a_gran[16 * i:16 * i + 16], 2)
            b16 = byteswap(row[16 * i:16 * i + 16], 2)
            a32 = reg(byteswap((acc if i >= W // 32 else a_gran)[32 * i:32 * i + 32], 4), f"lane{i}_a32")
            b32 = reg(byteswap(row[32 * i:32 * i + 32], 4) if i < W // 32 else Const(0, 32), f"lane{i}_b32")
            a_in = Mux(half_wire_1, widened(a16, f"lane{i}_a"), a32)
            b_in = Mux(is_half_1, widened(b16, f"lane{i}_b"), b32)
            s.operands.append((reg(a_in, f"lane{i}_a"), reg(b_in, f"lane{i}_b")))
            # max/min and the bypass read a copy of their own (register_copy), beside the magnitude
            # compare, not the adder's operands spread over its stages (the fold chain's max/min was the
            # float switch's limit at 88.98 MHz: 30 logic steps, 2.88 ns logic + 7.84 ns routing; a store-only
            # stage has no max/min)
            s.mm_operands.append(s.operands[-1] if self.store_only else
                                 (register_copy(m, a_in, f"lane{i}_mm_in_a", platform),
                                  register_copy(m, b_in, f"lane{i}_mm_in_b", platform)))
        s.r_wire = reg(Mux(store_1, row_1, int_alu.result), "wire")
        s.r_valid = reg(s.valid, "valid", reset_less=False, cycles=2)
        s.r_store, s.r_fix_tie = reg(store, "store", cycles=2), reg(fix_tie, "fix_tie", cycles=2)
        s.r_min = reg(op == proto.ReduceOp.MIN, "min", cycles=2)
        s.r_lane_form, s.r_use_adder = reg(lane_form, "lane_form", cycles=2), reg(use_adder, "use_adder", cycles=2)
        s.r_acc32, s.r_fp32 = reg(acc32, "acc32", cycles=2), reg(is_fp32, "fp32", cycles=2)
        s.r_bf16, s.r_we = reg(is_bf16, "bf16", cycles=2), reg(we, "we", cycles=2)

    def _float_lanes(self, m, s):
        """Stages 3 .. L+2: the adders, max/min and store beside them, delayed to meet their results; stage
        L+3: each lane's result registered (``s.lanes``, ``s.wire_row`` and the controls ``s.out``).

        The results that do not come from the adder (max/min, store, the wire-format path) need no more
        than a choice among the operands, the canonical NaN and the wire row, so with L >= 1 that choice
        is made in two steps: max/min's order and the controls decide, per lane, which value it is (two
        flip-flops), registered with the operands (the wire row in the place of ``a`` outside the lane
        form); a cycle later the registered selects pick it (two LUT levels) into the delay
        line's remaining L - 1 registers. The selects depend on the lane's own operands, so no flip-flop
        drives more than a lane. The latency does not change."""
        reg = functools.partial(self._reg, m)
        W, L = self.data_width, self.fadd_stages

        def delay(value, name, reset_less=True, cycles=L):
            # A chain of registers (none when cycles == 0) beside the adder: one write point whatever the path.
            return delay_line(m, value, cycles, name, reset_less=reset_less)

        # Per lane: the value the bypass takes, from the operands (a, b), the canonical NaN or the wire row.
        split = L >= 1                       # the choice decided a cycle before the selection
        bypass_lanes, adders = [], []
        for i, ((add_a, add_b), (a, b)) in enumerate(zip(s.operands, s.mm_operands)):
            lane_form = s.r_lane_form
            if self.store_only:
                # Every row is stored: the lane is the row's operand b (widened with fp32 accumulation).
                bypass_lanes.append(Mux(lane_form, b, s.r_wire[32 * i:32 * i + 32] if 32 * i < W else 0))
                continue
            m.submodules[f"lane{i}_fadd"] = add = FloatAdder(FP32, self.fadd_stages)
            m.d.comb += [add.a.eq(add_a), add.b.eq(add_b), add.i_valid.eq(s.r_valid)]
            adders.append(add)

            m.submodules[f"lane{i}_maxmin"] = mm = FloatMaxMin(FP32, NUMPY_ZERO_TIE[FP32])
            m.d.comb += [mm.a.eq(a), mm.b.eq(b), mm.op.eq(Mux(s.r_min, MaxMinOp.MIN, MaxMinOp.MAX))]
            # A -0/+0 tie differs only in the sign bit, so the float16 rule takes the other zero. store (with
            # fp32 accumulation the widened row is lane b) takes b whatever it holds. Outside the lane form
            # (integers, wire-format store) the lane carries its part of the wire row in a's place, and
            # picks it.
            tie = s.r_fix_tie & (a[:31] == 0) & (b[:31] == 0)
            pick_b = lane_form & (s.r_store | Mux(tie, s.tie16 == "b", mm.pick_b))
            nan = lane_form & ~s.r_store & mm.nan
            a = Mux(lane_form, a, s.r_wire[32 * i:32 * i + 32] if 32 * i < W else 0)
            if split:
                a, b = reg(a, f"lane{i}_mm_a"), reg(b, f"lane{i}_mm_b")
                pick_b, nan = reg(pick_b, f"lane{i}_pick_b"), reg(nan, f"lane{i}_pick_nan")
            bypass_lanes.append(Mux(nan, FP32.qnan, Mux(pick_b, b, a)))

        # The non-adder results travel through one delay line, lanes (float32, native bit order) or the
        # wire-format row in the low W bits.
        bypass = Signal(2 * W)
        m.d.comb += bypass.eq(Cat(*bypass_lanes))
        d_bypass = delay(bypass, "bypass", cycles=L - 1 if split and not self.store_only else L)
        d_use_adder = Const(0) if self.store_only else delay(s.r_use_adder, "use_adder")
        d_ctl = [delay(v, n) for v, n in ((s.r_lane_form, "lane_form"), (s.r_acc32, "acc32"), (s.r_fp32, "fp32"),
                                          (s.r_bf16, "bf16"), (s.r_we, "we"))]
        d_valid = delay(s.r_valid, "valid", reset_less=False)

        s.lanes = [reg(Mux(d_use_adder, adders[i].result, d_bypass[32 * i:32 * i + 32]) if adders
                       else d_bypass[32 * i:32 * i + 32], f"lane{i}_result")
                   for i in range(W // 16)]
        s.wire_row = reg(d_bypass[:W], "wire_row")
        s.out = [reg(v, f"out_{k}") for k, v in enumerate(d_ctl)]      # lane_form, acc32, fp32, bf16, we
        s.out_valid = reg(d_valid, "out_valid", reset_less=False)

    def _narrow_and_pack(self, m, s):
        """Stages L+4 .. L+4+NARROW_STAGES: narrowed to the wire format (the narrowing has register ranks of
        its own, which the rest meets) and packed back in the wire or accumulator layout, into the output
        register."""
        reg = functools.partial(self._reg, m)
        W = self.data_width
        lane_form_r, acc32_r, fp32_r, bf16_r, we_r, valid_r, wire_row = (
            reg(v, f"narrow_{k}", reset_less=k != 5, cycles=NARROW_STAGES)
            for k, v in enumerate((*s.out, s.out_valid, s.wire_row)))
        word32, row16, rowbf = [], [], []
        for i, lane in enumerate(s.lanes):
            word32.append(byteswap(reg(lane, f"lane{i}_wide", cycles=NARROW_STAGES), 4))
            n16 = FloatNarrow(FP32, FP16, stages=NARROW_STAGES)
            nbf = FloatNarrow(FP32, BF16, stages=NARROW_STAGES)
            m.submodules[f"lane{i}_narrow16"] = n16
            m.submodules[f"lane{i}_narrowbf"] = nbf
            m.d.comb += [n16.a.eq(lane), nbf.a.eq(lane)]
            row16.append(byteswap(n16.result, 2))
            rowbf.append(byteswap(nbf.result, 2))
        new_gran = Signal(W)
        with m.If(~lane_form_r):
            m.d.comb += new_gran.eq(wire_row)
        with m.Elif(fp32_r):
            m.d.comb += new_gran.eq(Cat(*word32[:W // 32]))
        with m.Elif(bf16_r):
            m.d.comb += new_gran.eq(Cat(*rowbf))
        with m.Else():
            m.d.comb += new_gran.eq(Cat(*row16))
        result = Signal(2 * W, name="result_r", reset_less=True)
        m.d.sync += [
            result.eq(Mux(acc32_r, Cat(*word32), Cat(new_gran, new_gran))),
            self.we.eq(Mux(valid_r, we_r, 0)),
            self.o_valid.eq(valid_r),
        ]
        m.d.comb += self.result.eq(result)


def _is_half(dtype):
    return (dtype == proto.DType.FP16) | (dtype == proto.DType.BF16)


def _granule_of(acc, hi_copies, width: int):
    """The accumulator's high granule (``acc[width:]``) or low one, each 32-bit group chosen by its own copy
    of the choice (``hi_copies[g]``)."""
    return Cat(*(Mux(hi, acc[width + 32 * g:width + min(32 * g + 32, width)], acc[32 * g:min(32 * g + 32, width)])
                 for g, hi in enumerate(hi_copies)))


def slot_alu_latency(float_units: bool, fadd_stages: int = FADD_STAGES) -> int:
    """:attr:`SlotALU.latency` of a slot ALU so built, without building it."""
    return fadd_stages + 5 + NARROW_STAGES if float_units else 4
