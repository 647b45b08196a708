"""Floating-point units for the reduce datapath: adder, max/min, widening and narrowing conversions.

Every unit works on one element (a lane) of a binary interchange format described by :class:`FloatFormat`
(FP32, FP16, BF16). The arithmetic is IEEE 754 with round-to-nearest, ties-to-even, gradual underflow
(subnormal operands and results are never flushed) and the special values of the standard. The rules this
module fixes where IEEE 754 or numpy leave a choice (docs/numerics.md is their prose form):

* **NaN results.** Every NaN a unit produces is the *canonical quiet NaN* of its output format: sign 0,
  exponent all ones, fraction ``1 0...0`` (0x7FC00000 FP32, 0x7E00 FP16, 0x7FC0 BF16), whatever the NaN
  operands were (quiet or signalling, any sign or payload). The result's bits then do not depend on which
  operand arrives first, which a switch cannot control.
* **Signed zeros of max/min.** numpy's ``maximum``/``minimum`` treat -0 and +0 as equal and return one of
  the two operands; which one depends on the dtype (see :data:`NUMPY_ZERO_TIE`). :class:`FloatMaxMin`
  follows numpy by default.

Bit numbering: a value's bit ``width-1`` is the sign, the exponent field sits below it, the fraction in
the low ``man_bits`` bits (the usual IEEE layout, as numpy's ``view(np.uint32)`` / ``view(np.uint16)``).
Lanes are in this native order; byte swapping for the wire is the caller's business (see
:func:`cais.hdl.alu.reduce.byteswap`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "FloatFormat", "FP32", "FP16", "BF16", "NUMPY_ZERO_TIE",
    "leading_zeros", "FloatAdder", "MaxMinOp", "FloatMaxMin", "FloatWiden", "FloatNarrow",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exp_bits`` exponent bits, ``man_bits`` fraction bits."""

    exp_bits: int
    man_bits: int

    def __post_init__(self):
        if self.exp_bits < 2 or self.man_bits < 1:
            raise ValueError(f"unsupported format: exp_bits={self.exp_bits}, man_bits={self.man_bits}")

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self) -> int:
        """The all-ones exponent field (infinities and NaNs)."""
        return (1 << self.exp_bits) - 1

    @property
    def inf(self) -> int:
        """Bits of +infinity (OR ``1 << (width-1)`` for -infinity)."""
        return self.exp_max << self.man_bits

    @property
    def qnan(self) -> int:
        """Bits of the canonical quiet NaN: sign 0, exponent all ones, fraction MSB set, rest 0."""
        return self.inf | (1 << (self.man_bits - 1))

    @property
    def name(self) -> str:
        return {(8, 23): "FP32", (5, 10): "FP16", (8, 7): "BF16"}.get(
            (self.exp_bits, self.man_bits), f"E{self.exp_bits}M{self.man_bits}")

    def __str__(self):
        return self.name


FP32 = FloatFormat(8, 23)
FP16 = FloatFormat(5, 10)
BF16 = FloatFormat(8, 7)

#: Which operand numpy's ``maximum``/``minimum`` return when the operands compare equal, i.e. for -0.0
#: against +0.0 (numpy 2.4 on x86-64; tests/hdl/test_fpu.py measures it again). ``"b"``: the second operand
#: (float32: ``np.maximum(-0.0, 0.0) == +0.0``, ``np.maximum(0.0, -0.0) == -0.0``, ``minimum`` alike);
#: ``"a"``: the first (float16). BF16 is defined as float32 on the value widened with 16 zero bits.
NUMPY_ZERO_TIE = {FP32: "b", FP16: "a", BF16: "b"}


# --------------------------------------------------------------------------------------------- helpers
def leading_zeros(m: Module, value: Value, name: str = "lz") -> Signal:
    """Number of leading zeros of ``value`` (``len(value)`` when it is 0), a log-depth priority encoder.

    The tree pairs groups of ``2**k`` bits: a group's count is the upper half's count when the upper half
    holds a one, else ``2**(k-1)`` plus the lower half's count. A sentinel one below the LSB makes a zero
    input count ``len(value)``.
    """
    value = Value.cast(value)
    n = len(value)
    bits = [value[i] for i in reversed(range(n))] + [Const(1, 1)]      # MSB first, then the sentinel
    size = 2
    while size < len(bits):
        size *= 2
    bits += [Const(0, 1)] * (size - len(bits))
    # Leaves: pairs (hi, lo) -> any = hi | lo, count = ~hi (1 bit).
    nodes = [(bits[i] | bits[i + 1], ~bits[i]) for i in range(0, size, 2)]
    while len(nodes) > 1:
        nodes = [(vh | vl, Cat(Mux(vh, ch, cl), ~vh)) for (vh, ch), (vl, cl) in zip(nodes[0::2], nodes[1::2])]
    count = Signal(range(n + 1), name=name)
    m.d.comb += count.eq(nodes[0][1])
    return count


def _unpack(fmt: FloatFormat, value: Value) -> SimpleNamespace:
    """Fields and classes of a packed value (expressions, no logic of its own beyond compares)."""
    E, M = fmt.exp_bits, fmt.man_bits
    exp = value[M:M + E]
    man = value[:M]
    exp_zero = exp == 0
    exp_ones = exp == fmt.exp_max
    return SimpleNamespace(
        sign=value[M + E], exp=exp, man=man, mag=value[:M + E],
        nan=exp_ones & (man != 0), inf=exp_ones & (man == 0), zero=exp_zero & (man == 0), sub=exp_zero,
        eff_exp=Mux(exp_zero, 1, exp),           # subnormals share the exponent of the smallest binade
        sig=Cat(man, ~exp_zero),                 # significand with the hidden bit, man_bits + 1 bits
    )


class _Stages:
    """Places the register ranks of a pipeline: ``cut(boundary, **values)`` hands back signals that equal
    ``values`` one clock later when ``boundary`` is among the chosen cuts, and at once otherwise."""

    def __init__(self, m: Module, cuts):
        self.m, self.cuts = m, frozenset(cuts)

    def cut(self, boundary: str, **values) -> SimpleNamespace:
        out = {}
        for key, v in values.items():
            v = Value.cast(v)
            s = Signal(v.shape(), name=f"{boundary}_{key}", reset_less=(key != "valid"))
            if boundary in self.cuts:
                self.m.d.sync += s.eq(v)
            else:
                self.m.d.comb += s.eq(v)
            out[key] = s
        return SimpleNamespace(**out)


# ----------------------------------------------------------------------------------------------- adder
class FloatAdder(wiring.Component):
    """Pipelined IEEE 754 adder: ``result = a + b``, round to nearest even, one operation per cycle.

    Subnormal operands and results are exact (gradual underflow); results beyond the largest finite
    value become infinities; ``inf + -inf`` and NaN operands give the canonical quiet NaN
    (:attr:`FloatFormat.qnan`); an exact zero sum is +0 unless both operands are -0
    (``x + -x = +0``, ``-0 + -0 = -0``).

    The datapath has six steps; ``stages`` picks after which of them a register rank sits
    (:attr:`CUTS`), the last rank always being the output register. A result appears ``stages`` clock
    edges after its operands were presented, together with its ``o_valid``; a new operation may enter
    every cycle. ``stages=0`` is purely combinational (``o_valid = i_valid``).

    ========= ==================================================================================
    step      work
    ========= ==================================================================================
    swap      classify, compare magnitudes and swap so |x| >= |y|, exponent difference
    align     shift y right by the difference, OR the shifted-out bits into a sticky bit
    add       add or subtract the significands (with guard, round and sticky bits)
    count     leading-zero count of the sum, limited by the exponent (gradual underflow)
    normalize one left shift (a carry out of the sum needs none: the bit positions absorb it)
    round     round to nearest even, pack, overflow to infinity, special values
    ========= ==================================================================================

    The default ``stages=3`` registers after *align*, after *count* and after *round*.

    Members
    -------
    a, b : In(fmt.width)
        Operands, presented together with ``i_valid``.
    i_valid : In(1)
    result : Out(fmt.width)
        ``a + b`` of the operands presented ``stages`` cycles earlier.
    o_valid : Out(1)
        ``i_valid`` of those operands.
    """

    CUTS = {
        0: (),
        1: ("round",),
        2: ("add", "round"),
        3: ("align", "count", "round"),
        4: ("swap", "align", "count", "round"),
        5: ("swap", "align", "add", "count", "round"),
        6: ("swap", "align", "add", "count", "normalize", "round"),
    }

    def __init__(self, fmt: FloatFormat, stages: int = 3):
        if stages not in self.CUTS:
            raise ValueError(f"stages must be one of {sorted(self.CUTS)}, not {stages}")
        self.fmt = fmt
        self.stages = stages
        W = fmt.width
        super().__init__({"a": In(W), "b": In(W), "i_valid": In(1), "result": Out(W), "o_valid": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        E, M, W = fmt.exp_bits, fmt.man_bits, fmt.width
        N = M + 4           # significand with hidden bit, then guard, round and sticky positions
        Z = N + 1           # the sum, with a carry position on top
        p = _Stages(m, self.CUTS[self.stages])

        # swap: |x| >= |y| (magnitude order is the integer order of the bits below the sign). Both
        # operands' fields and both exponent differences are found beside the compare, which then only
        # selects: no unpacking or subtraction behind it.
        ua, ub = _unpack(fmt, self.a), _unpack(fmt, self.b)
        a_ge = ua.mag >= ub.mag
        d_ab, d_ba = (ua.eff_exp - ub.eff_exp)[:E], (ub.eff_exp - ua.eff_exp)[:E]
        sub = ua.sign ^ ub.sign
        s1 = p.cut(
            "swap", valid=self.i_valid, sig_x=Mux(a_ge, ua.sig, ub.sig), sig_y=Mux(a_ge, ub.sig, ua.sig),
            ex=Mux(a_ge, ua.eff_exp, ub.eff_exp), d=Mux(a_ge, d_ab, d_ba), sub=sub,
            sign=Mux(a_ge, ua.sign, ub.sign), zero_sign=ua.sign & ub.sign,
            nan=ua.nan | ub.nan | (ua.inf & ub.inf & sub), inf=ua.inf | ub.inf)

        # align: y_al = (sig_y << 3) >> d, with every shifted-out bit ORed into the sticky position (bit 0).
        # Guard, round and sticky suffice: for d >= 2 an effective subtraction needs at most one left
        # shift to normalize, and for d <= 1 no bit is shifted out (massive cancellation is exact). In a
        # subtraction x_ext has zeros below the guard, so bit 0 of the difference still equals the sticky.
        # A shift of N or more leaves nothing at the guard position and above: a shifter on the low five
        # bits of d (N < 32), its output cleared when a higher bit is set, and the sticky bit beside it:
        # sig_y bit i is shifted out when d > i + 3 (a compare with a constant; every i + 3 < N).
        assert N + 3 + M + 1 == 2 * N and N < 32
        top = (Cat(Const(0, N + 3), s1.sig_y) >> s1.d[:5])[N:2 * N]
        top = Mux(s1.d[5:] != 0, 0, top)
        sticky = Cat(*(s1.sig_y[i] & (s1.d > i + 3) for i in range(M + 1))).any()
        y_al = Cat(top[0] | sticky, top[1:])
        s2 = p.cut(
            "align", valid=s1.valid, sig_x=s1.sig_x, y_al=y_al, ex=s1.ex, sub=s1.sub,
            sign=s1.sign, zero_sign=s1.zero_sign, nan=s1.nan, inf=s1.inf)

        # add: one adder, x + y or x + ~y + 1; |x| >= |y| keeps the difference non-negative, and its
        # carry out (2**N) is dropped.
        x_ext = Cat(Const(0, 3), s2.sig_x)
        total = x_ext + (s2.y_al ^ s2.sub.replicate(N)) + s2.sub
        z = Cat(total[:N], total[N] & ~s2.sub)
        # Beside the add, for the count: a one at bit Z-1-ex (none when ex >= Z), so that the leading
        # zeros of z | limit are min(lz(z), ex) without a compare after the count; and ex + 1.
        limit = Const(1 << (Z - 1), Z) >> s2.ex
        s3 = p.cut("add", valid=s2.valid, z=z, limit=limit, ex1=s2.ex + 1, sign=s2.sign,
                   zero_sign=s2.zero_sign, nan=s2.nan, inf=s2.inf)

        # count: shifting left by L = min(lz, ex) puts the leading one on top (bit Z-1) with the exponent
        # ex + 1 - L, or, when that would fall below the smallest normal exponent, leaves a subnormal.
        L = leading_zeros(m, s3.z | s3.limit, name="sum_lz")
        s4 = p.cut("count", valid=s3.valid, z=s3.z, L=L, e_norm=(s3.ex1 - L)[:E + 1], zero=s3.z == 0,
                   sign=s3.sign, zero_sign=s3.zero_sign, nan=s3.nan, inf=s3.inf)

        # normalize: one shift. A set top bit means a normal result (exponent e_norm), else a subnormal
        # (exponent field 0). The carry case (L = 0) needs no right shift: the sticky bits absorb it.
        w = (s4.z << s4.L)[:Z]
        s5 = p.cut("normalize", valid=s4.valid, w=w, exp=Mux(w[Z - 1], s4.e_norm, 0), zero=s4.zero,
                   sign=s4.sign, zero_sign=s4.zero_sign, nan=s4.nan, inf=s4.inf)

        # round: w = [hidden | M fraction bits | guard | 3 sticky bits]. A carry out of the fraction
        # increments the exponent (into the next binade, from subnormal to normal, or to infinity).
        w = s5.w
        inc = w[3] & ((w[:3] != 0) | w[4])
        packed = (Cat(w[4:4 + M], s5.exp) + inc)[:E + M + 1]
        result = Signal(W, name="sum")
        # packed >= inf: the bits from the exponent field up read exp_max or more (no compare chain)
        overflow = packed[M + E:].any() | packed[M:M + E].all()
        with m.If(s5.nan):
            m.d.comb += result.eq(fmt.qnan)
        with m.Elif(s5.inf | overflow):
            m.d.comb += result.eq(Cat(Const(fmt.inf, E + M), s5.sign))
        with m.Elif(s5.zero):
            m.d.comb += result.eq(Cat(Const(0, E + M), s5.zero_sign))
        with m.Else():
            m.d.comb += result.eq(Cat(packed[:E + M], s5.sign))
        out = p.cut("round", valid=s5.valid, result=result)
        m.d.comb += [self.result.eq(out.result), self.o_valid.eq(out.valid)]
        return m


# ------------------------------------------------------------------------------------------ max / min
class MaxMinOp(enum.Enum, shape=1):
    """The ``op`` input of :class:`FloatMaxMin`."""
    MAX = 0
    MIN = 1


class FloatMaxMin(wiring.Component):
    """Maximum or minimum of two values with numpy's ``maximum``/``minimum`` semantics, combinational.

    A NaN operand gives the canonical quiet NaN. Otherwise the numerically larger (MAX) or smaller (MIN)
    operand is returned unchanged; operands that compare equal (-0 against +0; equal values have equal
    bits otherwise) return the operand named by ``zero_tie``:

    * ``"a"`` or ``"b"``: that operand, whatever the op. ``None`` (the default) picks numpy's choice for
      the format, :data:`NUMPY_ZERO_TIE` (``"b"`` for FP32 and BF16, ``"a"`` for FP16).
    * ``"ieee"``: -0 orders below +0 (IEEE 754-2019 maximum/minimum): max(-0, +0) = +0,
      min(-0, +0) = -0 in either operand order.

    The result is always one of three values, and the choice is an output too, so that a pipeline may
    register the choice and select among registered operands a cycle later: ``result`` is ``fmt.qnan``
    when ``nan``, else ``b`` when ``pick_b``, else ``a`` (with ``"ieee"`` a tie of two zeros picks the
    operand whose sign the rule gives; the two differ only in the sign bit).

    Members
    -------
    a, b : In(fmt.width)
    op : In(MaxMinOp)
    result : Out(fmt.width)
    nan : Out(1)
        An operand is a NaN: ``result`` is the canonical quiet NaN.
    pick_b : Out(1)
        Otherwise ``result`` is ``b`` (1) or ``a`` (0).
    """

    def __init__(self, fmt: FloatFormat, zero_tie: str | None = None):
        zero_tie = NUMPY_ZERO_TIE.get(fmt, "b") if zero_tie is None else zero_tie
        if zero_tie not in ("a", "b", "ieee"):
            raise ValueError(f"zero_tie must be 'a', 'b', 'ieee' or None, not {zero_tie!r}")
        self.fmt = fmt
        self.zero_tie = zero_tie
        W = fmt.width
        super().__init__({"a": In(W), "b": In(W), "op": In(MaxMinOp), "result": Out(W),
                          "nan": Out(1), "pick_b": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        ua, ub = _unpack(fmt, self.a), _unpack(fmt, self.b)
        both_zero = ua.zero & ub.zero
        mag_gt = ua.mag > ub.mag
        mag_lt = ua.mag < ub.mag
        # Signed-magnitude order with -0 == +0.
        a_lt_b = Mux(ua.sign != ub.sign, ua.sign & ~both_zero, Mux(ua.sign, mag_gt, mag_lt))
        b_lt_a = Mux(ua.sign != ub.sign, ub.sign & ~both_zero, Mux(ua.sign, mag_lt, mag_gt))
        is_min = self.op == MaxMinOp.MIN
        # The operands compare equal: the tie's operand (equal values other than zeros have equal bits).
        if self.zero_tie == "a":
            tie_b = Const(0)
        elif self.zero_tie == "b":
            tie_b = Const(1)
        else:
            neg = Mux(is_min, ua.sign | ub.sign, ua.sign & ub.sign)
            tie_b = both_zero & (ub.sign == neg)
        first, second = Mux(is_min, a_lt_b, b_lt_a), Mux(is_min, b_lt_a, a_lt_b)
        m.d.comb += [self.nan.eq(ua.nan | ub.nan),
                     self.pick_b.eq(~first & (second | tie_b)),
                     self.result.eq(Mux(self.nan, fmt.qnan, Mux(self.pick_b, self.b, self.a)))]
        return m


# ---------------------------------------------------------------------------------------- conversions
class FloatWiden(wiring.Component):
    """Exact conversion to a format with at least the exponent range and precision.

    FP16 -> FP32 normalizes FP16 subnormals (they are FP32 normals); BF16 -> FP32 appends 16 zero bits to
    finite values and infinities (subnormals stay subnormal). Zeros keep their sign; NaN gives the
    canonical quiet NaN of ``dst_fmt``. Combinational with ``stages=0``; with ``stages=1`` a register rank
    sits after the classification and the leading-zero count of a subnormal's fraction, before the
    normalizing shift (``result`` one clock edge after ``a``).

    Members
    -------
    a : In(src_fmt.width)
    result : Out(dst_fmt.width)
    """

    def __init__(self, src_fmt: FloatFormat, dst_fmt: FloatFormat, stages: int = 0):
        if dst_fmt.man_bits < src_fmt.man_bits or dst_fmt.exp_bits < src_fmt.exp_bits:
            raise ValueError(f"{dst_fmt} cannot hold every {src_fmt} value")
        if dst_fmt.exp_bits != src_fmt.exp_bits and dst_fmt.bias - src_fmt.bias - src_fmt.man_bits < 0:
            raise ValueError(f"{src_fmt} subnormals would not be {dst_fmt} normals")
        if stages not in (0, 1):
            raise ValueError(f"stages must be 0 or 1, not {stages}")
        self.src_fmt, self.dst_fmt, self.stages = src_fmt, dst_fmt, stages
        super().__init__({"a": In(src_fmt.width), "result": Out(dst_fmt.width)})

    def elaborate(self, platform):
        m = Module()
        S, D = self.src_fmt, self.dst_fmt
        u = _unpack(S, self.a)
        pad = D.man_bits - S.man_bits
        renorm = D.exp_bits != S.exp_bits            # subnormals become normals
        fields = {"sign": u.sign, "nan": u.nan, "top": u.exp == S.exp_max, "sub": u.sub, "man": u.man,
                  "exp": u.exp}
        if renorm:
            fields["lz"] = leading_zeros(m, u.man, name="sub_lz")
            fields["man_nz"] = u.man != 0
        f = {}
        for name, value in fields.items():
            value = Value.cast(value)
            r = Signal(len(value), name=f"{name}_r" if self.stages else f"{name}_w")
            if self.stages:
                m.d.sync += r.eq(value)
            else:
                m.d.comb += r.eq(value)
            f[name] = r
        exp = Signal(D.exp_bits)
        man = Signal(D.man_bits)
        with m.If(f["nan"]):
            m.d.comb += self.result.eq(D.qnan)
        with m.Else():
            m.d.comb += self.result.eq(Cat(man, exp, f["sign"]))
            with m.If(f["top"]):
                m.d.comb += [exp.eq(D.exp_max), man.eq(0)]
            with m.Elif(f["sub"]):
                if not renorm:
                    m.d.comb += man.eq(Cat(Const(0, pad), f["man"]))      # same range: stays subnormal
                else:
                    # The leading one at fraction bit M-1-lz becomes the hidden bit of a normal with the
                    # unbiased exponent -bias_s - lz. (A zero keeps exponent and fraction 0.)
                    lz = f["lz"]
                    with m.If(f["man_nz"]):
                        m.d.comb += [
                            exp.eq(D.bias - S.bias - lz),
                            man.eq(Cat(Const(0, pad), ((f["man"] << 1) << lz)[:S.man_bits])),
                        ]
            with m.Else():
                m.d.comb += [exp.eq(f["exp"] + (D.bias - S.bias)), man.eq(Cat(Const(0, pad), f["man"]))]
        return m


class FloatNarrow(wiring.Component):
    """Conversion to a format with less precision (and possibly less range), RNE.

    Values beyond the destination's largest finite value round to infinity, tiny values to subnormals or
    signed zeros (gradual underflow, a single rounding), NaN gives the canonical quiet NaN of ``dst_fmt``.
    Combinational with ``stages=0``; with ``stages=1`` a register rank sits between the alignment shift
    and the rounding (``result`` one clock edge after ``a``); with ``stages=2`` another one sits before
    the shift, after the shift distance (``under``: the exponent's compares and difference, carry chains)
    and the exponent field are found, so neither carry chain nor the shifter share a cycle
    (``result`` two clock edges after ``a``). :attr:`latency` is ``stages``.

    Members
    -------
    a : In(src_fmt.width)
    result : Out(dst_fmt.width)
    """

    def __init__(self, src_fmt: FloatFormat, dst_fmt: FloatFormat, stages: int = 0):
        if dst_fmt.man_bits > src_fmt.man_bits or dst_fmt.exp_bits > src_fmt.exp_bits:
            raise ValueError(f"{dst_fmt} is not narrower than {src_fmt}")
        if stages not in (0, 1, 2):
            raise ValueError(f"stages must be 0, 1 or 2, not {stages}")
        self.src_fmt, self.dst_fmt, self.stages = src_fmt, dst_fmt, stages
        super().__init__({"a": In(src_fmt.width), "result": Out(dst_fmt.width)})

    @property
    def latency(self) -> int:
        """Clock edges from ``a`` to its ``result``: the register ranks inside."""
        return self.stages

    def elaborate(self, platform):
        m = Module()
        S, D = self.src_fmt, self.dst_fmt
        Md = D.man_bits
        u = _unpack(S, self.a)
        # The significand goes right by r = d + under: d, the precision difference, is a constant; under
        # = min(umax, max(0, K - eff_exp)) more below the destination's normal range (K - eff_exp = 1 - t,
        # t the destination's biased exponent of the source binade). At r = R everything lands below the
        # guard bit. Only the variable part is a shifter; the sticky bit is the OR of the significand's
        # bits below r - 1, each enabled by a compare of ``under`` with a constant, beside the shifter.
        R = S.man_bits + 2
        d = S.man_bits - Md
        umax = R - d
        K = S.bias - D.bias + 1
        if K > 1:                                        # eff_exp >= 1: no underflow when K <= 1 (BF16)
            under = Signal(range(umax + 1), name="under")
            e = u.eff_exp
            ub = len(under)
            with m.If(e <= K - umax):
                m.d.comb += under.eq(umax)
            with m.Elif(e < K):
                # K - e is below 2**ub here: the low bits of the difference suffice
                m.d.comb += under.eq((Const(K % (1 << ub), ub) - e[:ub])[:ub])
        else:
            under = Const(0, 1)
        # The exponent field of the result before rounding: t for a normal (t >= 1 and the source normal),
        # 0 for a subnormal (kept's hidden bit is then 0).
        tw = S.exp_bits + 2
        base = Mux(~u.sub & (u.exp >= K), u.exp - (K - 1), 0)[:tw]
        sig, nan, inf, sign = u.sig, u.nan, u.inf, u.sign
        def rank(suffix, reset_less, **values):
            # a register rank over the values (a constant stays a constant), in the order given
            regs = []
            for name, value in values.items():
                if isinstance(value, Const):
                    regs.append(value)
                    continue
                r_ = Signal(len(value), name=f"{name}_{suffix}", reset_less=reset_less)
                m.d.sync += r_.eq(value)
                regs.append(r_)
            return regs

        if self.stages >= 2:
            # the first rank: the shift distance and the exponent field found, the shift not begun
            # (a constant ``under``, no underflow range, stays a constant)
            under, sig, base, nan, inf, sign = rank("r0", True, under=under, sig=sig, base=base, nan=nan,
                                                    inf=inf, sign=sign)
        shifted = Cat(Const(0, R), sig)[d:] >> under
        kept, guard = shifted[R:R + Md + 1], shifted[R - 1]
        sticky_bits = []
        for i in range(len(sig)):
            if i < d - 1:
                sticky_bits.append(sig[i])
            elif i - (d - 1) < umax:
                sticky_bits.append(sig[i] & (under > i - (d - 1)))
        sticky = Cat(*sticky_bits).any()
        # The rounding increment, and whether the rounded value reaches infinity: ``pre + inc >= D.inf``
        # with ``pre`` the unrounded field: pre >= D.inf (its bits from the exponent field up read exp_max
        # or more: no compare chain), or pre is the largest finite value and rounds up. Both are found
        # before the last rank, so that after it only the increment's carry chain and one choice remain.
        pre = Cat(kept[:Md], base)
        inc = guard & (sticky | kept[0])
        at_inf = pre[Md + D.exp_bits:].any() | pre[Md:Md + D.exp_bits].all()
        below_inf = pre == (D.exp_max << Md) - 1
        big = inf | at_inf | (below_inf & inc)
        if self.stages:
            pre, inc, big, nan, sign = rank("r", False, pre=pre, inc=inc, big=big, nan=nan, sign=sign)
        packed = Signal(D.width - 1, name="packed")
        m.d.comb += packed.eq(pre[:D.width - 1] + inc)
        with m.If(nan):
            m.d.comb += self.result.eq(D.qnan)
        with m.Elif(big):
            m.d.comb += self.result.eq(Cat(Const(D.inf, D.width - 1), sign))
        with m.Else():
            m.d.comb += self.result.eq(Cat(packed, sign))
        return m
