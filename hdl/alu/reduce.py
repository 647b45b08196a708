"""The integer reduce ALU: combines a beat of incoming elements with the beat stored in a slot set."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

from ..common.pipeline import register_copy
from ..control.tables import or_tree

__all__ = ["ReduceALU", "byteswap", "INTEGER_TYPES", "PIECE_BITS"]

# Integer element types and their widths in bytes, from the protocol's one definition.
INTEGER_TYPES = {dt: proto.ELEMENT_BYTES[dt] for dt in (proto.DType.INT32, proto.DType.INT16, proto.DType.INT8)}


#: Elements wider than this many bits have their sum and compare split in pieces of this many bits (carry
#: chains of a byte before the register rank: the fold reader's int32 compare, then the high half's of two,
#: were its limit).
PIECE_BITS = 8


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
    chains, in pieces of :data:`PIECE_BITS`), before the choice of the result (the pieces' sums by their
    carries, op, saturation, dtype: a few LUT levels); ``result`` is then that of the inputs presented one
    clock edge earlier, and a new beat may enter every cycle. ``stages=2``: a second rank after the pieces
    are joined (each lane's sum and order, the operands and the controls), before the saturation, the
    choice by op and the choice by dtype (the integer switch's fold chain measured 8 LUT levels from the
    first rank into its result register: 7.4-8.6 ns of routing on two placements).

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
        if stages not in (0, 1, 2):
            raise ValueError(f"stages must be 0, 1 or 2, not {stages}")
        self.data_width, self.stages = data_width, stages
        super().__init__({"a": In(data_width), "b": In(data_width), "op": In(4), "dtype": In(4),
                          "saturate": In(1), "result": Out(data_width)})

    @property
    def latency(self) -> int:
        return self.stages

    def elaborate(self, platform):
        m = Module()

        def rank(value, name, present):
            # a register rank (present) or a wire
            s = Signal(len(value), name=name, reset_less=True)      # data: a valid bit travels beside it
            if present:
                m.d.sync += s.eq(value)
            else:
                m.d.comb += s.eq(value)
            return s

        def cut(value, name):
            return rank(value, name, self.stages >= 1)

        def cut2(value, name):
            return rank(value, name, self.stages >= 2)

        # The controls, decoded before the rank: a copy per 32-bit group of the beat (register_copy), beside
        # that group's lanes, not one register fanned out over a row the fold chain spreads across the die
        # (the float switch's limit at 82.5 MHz: a fold stage's dtype register, then 4.9 + 2.8 ns of routing
        # into its lanes' result selects).
        types = list(INTEGER_TYPES)
        ctl = Cat(*(self.dtype == dt for dt in types), self.op == proto.ReduceOp.MAX,
                  self.op == proto.ReduceOp.MIN, self.saturate)
        groups = [register_copy(m, ctl, f"ctl{g}", platform) if self.stages else ctl
                  for g in range(-(-self.data_width // 32))]
        if self.stages == 2:
            groups = [register_copy(m, ctl_g, f"ctl{g}_2", platform) for g, ctl_g in enumerate(groups)]
        a_r, b_r = cut2(cut(self.a, "a_r"), "a_r2"), cut2(cut(self.b, "b_r"), "b_r2")
        per_type = []
        for t, (dt, nbytes) in enumerate(INTEGER_TYPES.items()):
            bits = 8 * nbytes
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            lanes = []
            for lane in range(self.data_width // bits):
                sl = slice(lane * bits, (lane + 1) * bits)
                g = groups[lane * bits // 32]
                is_type, is_max, is_min, sat = g[t], g[len(types)], g[len(types) + 1], g[len(types) + 2]
                a = byteswap(self.a[sl], nbytes).as_signed()
                b = byteswap(self.b[sl], nbytes).as_signed()
                # Before the rank: the sum (one more bit than the type) and the order of a and b (one
                # compare serves MAX and MIN: equal operands make either choice right).
                name = f"{dt.name.lower()}_{{}}{lane}"
                total, a_gt_b = self._sum_and_order(m, cut, a, b, bits, name)
                total, a_gt_b = cut2(total, name.format("sum_r2")), cut2(a_gt_b, name.format("gt_r2"))
                a_, b_ = byteswap(a_r[sl], nbytes), byteswap(b_r[sl], nbytes)
                # After it: the sum is above hi (below lo) when its two top bits read 01 (10).
                top = total[bits - 1:bits + 1]
                clamped = Mux(top == 0b01, Const(hi, bits), Mux(top == 0b10, Const(lo, bits), total[:bits]))
                r = Signal(bits, name=f"{dt.name.lower()}_lane{lane}")
                m.d.comb += r.eq(Mux(is_max, Mux(a_gt_b, a_, b_), Mux(is_min, Mux(a_gt_b, b_, a_),
                                                                      Mux(sat, clamped, total[:bits]))))
                # one-hot: the lanes of the beat's type pass, every other type's are 0 (no type: 0)
                lanes.append(Mux(is_type, byteswap(r, nbytes), 0))
            per_type.append(Cat(*lanes))
        m.d.comb += self.result.eq(or_tree(per_type))
        return m

    @staticmethod
    def _sum_and_order(m, cut, a, b, bits, name):
        """``a + b`` (``bits + 1`` bits, signed) and ``a > b`` (signed) of two ``bits``-bit signed values,
        through ``cut``. Elements wider than :data:`PIECE_BITS` are split in pieces of that many bits so that no
        carry chain before the cut is longer than a piece: the lowest piece's sum (with its carry out) and
        every higher piece's sum for either carry in (a carry-select adder), every piece's order (the top
        piece signed, the others unsigned) and every higher piece's equality; after the cut the carries
        pick the pieces' sums (one LUT level per piece), and the highest unequal piece decides the order
        (a LUT level per two pieces)."""
        n = bits // PIECE_BITS
        if n <= 1:
            return cut(a + b, name.format("sum")), cut(a > b, name.format("gt"))
        k = PIECE_BITS
        ua, ub = a.as_unsigned(), b.as_unsigned()
        pieces = [(ua[i * k:(i + 1) * k], ub[i * k:(i + 1) * k]) for i in range(n - 1)]
        top_a, top_b = a[(n - 1) * k:].as_signed(), b[(n - 1) * k:].as_signed()
        # before the cut
        lo = cut(pieces[0][0] + pieces[0][1], name.format("sum_p0"))                 # k + 1 bits: the carry on top
        mids = [(cut(pa + pb, name.format(f"sum_p{i}c0")), cut(pa + pb + 1, name.format(f"sum_p{i}c1")))
                for i, (pa, pb) in enumerate(pieces) if i]
        top = len(top_a)
        hi0 = cut((top_a + top_b)[:top + 1], name.format("sum_top_c0"))              # top + 1 bits, signed
        hi1 = cut((top_a + top_b + 1)[:top + 1], name.format("sum_top_c1"))
        gts = [cut(pa > pb, name.format(f"gt_p{i}")) for i, (pa, pb) in enumerate(pieces)]
        eqs = [None] + [cut(pa == pb, name.format(f"eq_p{i}")) for i, (pa, pb) in enumerate(pieces) if i]
        gt_top, eq_top = cut(top_a > top_b, name.format("gt_top")), cut(top_a == top_b, name.format("eq_top"))
        # after it: the carries through the pieces, the order from the top down
        parts, carry = [lo[:k]], lo[k]
        for s0, s1 in mids:
            parts.append(Mux(carry, s1[:k], s0[:k]))
            carry = Mux(carry, s1[k], s0[k])
        parts.append(Mux(carry, hi1, hi0))
        total = Signal(bits + 1, name=name.format("sum"))
        m.d.comb += total.eq(Cat(*parts))
        gt = gts[0]
        for i in range(1, n - 1):
            gt = gts[i] | (eqs[i] & gt)
        return total, gt_top | (eq_top & gt)
