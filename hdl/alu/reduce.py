"""The integer reduce ALU: combines a beat of incoming elements with the beat stored in a slot set."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

__all__ = ["ReduceALU", "byteswap", "INTEGER_TYPES", "SPLIT_ABOVE"]

# Integer element types and their widths in bytes, from the protocol's one definition.
INTEGER_TYPES = {dt: proto.ELEMENT_BYTES[dt] for dt in (proto.DType.INT32, proto.DType.INT16, proto.DType.INT8)}


#: Elements wider than this many bits have their sum and compare split in two halves (carry chains of half
#: the length before the register rank; the fold reader's int32 compare was its limit).
SPLIT_ABOVE = 16


def byteswap(value, nbytes: int):
    """Reverse the bytes of ``value``: the wire is big-endian, AXI4-Stream puts byte 0 in the low bits."""
    return Cat(*(value[8 * i:8 * i + 8] for i in reversed(range(nbytes))))


class ReduceALU(wiring.Component):
    """Element-wise reduction of two beats of big-endian signed integers.

    The beat holds int32, int16 or int8 elements (``dtype``); element ``i`` is payload bytes
    ``i*n .. i*n+n-1`` for n-byte elements. SUM wraps modulo 2**(8n) (two's complement), or, with
    ``saturate``, clamps to the type's range; MAX and MIN compare as signed.

    Wrap-around is exact whenever the final sum fits the type, whatever the intermediate sums did (the
    arithmetic is modulo 2**(8n), which is associative); saturation bounds the error when the final sum
    does not fit, but can be wrong when only an intermediate sum overflowed. docs/numerics.md shows both
    on the sequence 7 - 5 + 5 + 5 - 3 - 7.

    ``stages=0``: combinational. ``stages=1``: a register rank after the sums and compares (carry
    chains; an int32's in two halves of 16 bits), before the choice of the result (the high half's sum by
    the low half's carry, op, saturation, dtype: a few LUT levels); ``result`` is then that of the inputs
    presented one clock edge earlier, and a new beat may enter every cycle.

    Members
    -------
    a, b : In(data_width)
        Two beats in wire byte order (``a`` the stored values, ``b`` the incoming ones).
    op : In(4)
        A :class:`cais.protocol.ReduceOp`.
    dtype : In(4)
        A :class:`cais.protocol.DType` of :data:`INTEGER_TYPES` (0, INT32, when left unconnected).
    saturate : In(1)
        SUM saturates instead of wrapping.
    result : Out(data_width)
        ``a op b``, in wire byte order.
    """

    def __init__(self, data_width: int, stages: int = 0):
        if stages not in (0, 1):
            raise ValueError(f"stages must be 0 or 1, not {stages}")
        self.data_width, self.stages = data_width, stages
        super().__init__({"a": In(data_width), "b": In(data_width), "op": In(4), "dtype": In(4),
                          "saturate": In(1), "result": Out(data_width)})

    @property
    def latency(self) -> int:
        return self.stages

    def elaborate(self, platform):
        m = Module()

        def cut(value, name):
            # the register rank (stages=1) or a wire
            s = Signal(len(value), name=name, reset_less=True)      # data: a valid bit travels beside it
            if self.stages:
                m.d.sync += s.eq(value)
            else:
                m.d.comb += s.eq(value)
            return s

        op, sat, dtype = cut(self.op, "op_r"), cut(self.saturate, "saturate_r"), cut(self.dtype, "dtype_r")
        a_r, b_r = cut(self.a, "a_r"), cut(self.b, "b_r")
        per_type = {}
        for dt, nbytes in INTEGER_TYPES.items():
            bits = 8 * nbytes
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            out = Signal(self.data_width, name=f"{dt.name.lower()}_result")
            for lane in range(self.data_width // bits):
                sl = slice(lane * bits, (lane + 1) * bits)
                a = byteswap(self.a[sl], nbytes).as_signed()
                b = byteswap(self.b[sl], nbytes).as_signed()
                # Before the rank: the sum (one more bit than the type) and the order of a and b (one
                # compare serves MAX and MIN: equal operands make either choice right).
                total, a_gt_b = self._sum_and_order(m, cut, a, b, bits, f"{dt.name.lower()}_{{}}{lane}")
                a_, b_ = byteswap(a_r[sl], nbytes), byteswap(b_r[sl], nbytes)
                # After it: the sum is above hi (below lo) when its two top bits read 01 (10).
                top = total[bits - 1:bits + 1]
                clamped = Mux(top == 0b01, Const(hi, bits), Mux(top == 0b10, Const(lo, bits), total[:bits]))
                r = Signal(bits, name=f"{dt.name.lower()}_lane{lane}")
                with m.Switch(op):
                    with m.Case(proto.ReduceOp.MAX):
                        m.d.comb += r.eq(Mux(a_gt_b, a_, b_))
                    with m.Case(proto.ReduceOp.MIN):
                        m.d.comb += r.eq(Mux(a_gt_b, b_, a_))
                    with m.Default():
                        m.d.comb += r.eq(Mux(sat, clamped, total[:bits]))
                m.d.comb += out[sl].eq(byteswap(r, nbytes))
            per_type[dt] = out
        with m.Switch(dtype):
            for dt, out in per_type.items():
                with m.Case(dt):
                    m.d.comb += self.result.eq(out)
        return m

    @staticmethod
    def _sum_and_order(m, cut, a, b, bits, name):
        """``a + b`` (``bits + 1`` bits, signed) and ``a > b`` (signed) of two ``bits``-bit signed values,
        through ``cut``. Elements wider than :data:`SPLIT_ABOVE` bits are split in two halves so that no carry
        chain before the cut is longer than a half: the low halves' sum (with its carry out) and the high
        halves' sum for either carry in (a carry-select adder), the high halves' order and equality and the
        low halves' unsigned order; after the cut the carry picks the high sum and the high halves decide
        the order unless they are equal (one LUT level each)."""
        if bits <= SPLIT_ABOVE:
            return cut(a + b, name.format("sum")), cut(a > b, name.format("gt"))
        h = bits // 2
        k = bits - h
        a_lo, b_lo, a_hi, b_hi = a[:h], b[:h], a[h:].as_signed(), b[h:].as_signed()
        lo = cut(a_lo + b_lo, name.format("sum_lo"))                       # h + 1 bits: the carry on top
        hi0 = cut((a_hi + b_hi)[:k + 1], name.format("sum_hi0"))           # k + 1 bits, signed
        hi1 = cut((a_hi + b_hi + 1)[:k + 1], name.format("sum_hi1"))
        gt_hi, eq_hi = cut(a_hi > b_hi, name.format("gt_hi")), cut(a_hi == b_hi, name.format("eq_hi"))
        gt_lo = cut(a_lo > b_lo, name.format("gt_lo"))
        total = Signal(bits + 1, name=name.format("sum"))
        m.d.comb += total.eq(Cat(lo[:h], Mux(lo[h], hi1, hi0)))
        return total, gt_hi | (eq_hi & gt_lo)
