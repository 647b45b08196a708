# amaranth: UnusedElaboratable=no
"""cais.hdl.alu.fpu against independent references: numpy (float32/float16 arithmetic, conversions, maximum and
minimum) and, for BF16 (not a numpy type), an exact integer reference written here.

The integer reference decodes a value into ``(-1)**s * n * 2**k`` with Python integers, adds exactly and
rounds once to nearest even; it shares nothing with the RTL and is itself checked against numpy for FP32 and
FP16. NaN results must be NaN wherever the reference is NaN, and bit-exactly the canonical quiet NaN of the
output format (the rule of cais.hdl.alu.fpu; numpy's own NaN bits depend on the operands and the CPU).

Random vectors per format: ``CAIS_FPU_VECTORS`` (default 100000) adder pairs and the same number of
max/min pairs; narrowing uses ``max(50000, CAIS_FPU_VECTORS)`` random FP32 patterns. Widening is
exhaustive.
The simulator is driven with several copies of a unit side by side (one wide input, one wide output), so
each simulated cycle checks several vectors for a few Python calls.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from cais.hdl.alu.fpu import (BF16, FP16, FP32, NUMPY_ZERO_TIE, FloatAdder, FloatFormat, FloatMaxMin,
                          FloatNarrow, FloatWiden, MaxMinOp)
from cais.sim.operands import (UINT, all_pairs, catalogue, directed_add_pairs, maxmin_catalogue, maxmin_random,
                               random_pairs)

from tiers import sweep

# Random operand pairs per format (amaranth.sim, about 10k a second); CAIS_FPU_VECTORS=1000000 for a deeper run.
VECTORS = int(os.environ.get("CAIS_FPU_VECTORS", "30000"))
NARROW_VECTORS = max(20_000, VECTORS)
LANES = 8
FORMATS = (FP32, FP16, BF16)


# ============================================================================ integer reference (exact)
def fields(fmt: FloatFormat, bits: int):
    M, E = fmt.man_bits, fmt.exp_bits
    return (bits >> (M + E)) & 1, (bits >> M) & fmt.exp_max, bits & ((1 << M) - 1)


def is_nan(fmt, bits):
    _, e, f = fields(fmt, bits)
    return e == fmt.exp_max and f != 0


def is_inf(fmt, bits):
    _, e, f = fields(fmt, bits)
    return e == fmt.exp_max and f == 0


def exact(fmt, bits):
    """A finite value as (sign, n, k): (-1)**sign * n * 2**k."""
    s, e, f = fields(fmt, bits)
    if e == 0:
        return s, f, 1 - fmt.bias - fmt.man_bits
    return s, f | (1 << fmt.man_bits), e - fmt.bias - fmt.man_bits


def round_to(fmt, s, n, k):
    """Bits of (-1)**s * n * 2**k rounded once to nearest, ties to even (gradual underflow, overflow to inf)."""
    M, E = fmt.man_bits, fmt.exp_bits
    sign = s << (M + E)
    if n == 0:
        return sign
    lead = k + n.bit_length() - 1                      # exponent of the leading one
    q = max(lead, 1 - fmt.bias) - M                    # exponent of the result's last place
    if k >= q:
        mant = n << (k - q)
    else:
        sh = q - k
        mant, rem = n >> sh, n & ((1 << sh) - 1)
        half = 1 << (sh - 1)
        if rem > half or (rem == half and mant & 1):
            mant += 1
    if mant >> (M + 1):                                # rounding carried into the next binade
        mant >>= 1
        q += 1
    if mant >> M:
        ef = q + M + fmt.bias
        if ef >= fmt.exp_max:
            return sign | fmt.inf
        return sign | (ef << M) | (mant & ((1 << M) - 1))
    return sign | mant                                 # subnormal


def ref_add(fmt, a, b):
    if is_nan(fmt, a) or is_nan(fmt, b):
        return fmt.qnan
    if is_inf(fmt, a) and is_inf(fmt, b):
        return a if a == b else fmt.qnan
    if is_inf(fmt, a):
        return a
    if is_inf(fmt, b):
        return b
    sa, na, ka = exact(fmt, a)
    sb, nb, kb = exact(fmt, b)
    k = min(ka, kb)
    v = (-1) ** sa * (na << (ka - k)) + (-1) ** sb * (nb << (kb - k))
    if v == 0:
        return (sa & sb) << (fmt.width - 1)            # x + -x = +0, -0 + -0 = -0 (round to nearest)
    return round_to(fmt, int(v < 0), abs(v), k)


def ref_convert(src, dst, bits):
    if is_nan(src, bits):
        return dst.qnan
    if is_inf(src, bits):
        return (fields(src, bits)[0] << (dst.width - 1)) | dst.inf
    return round_to(dst, *exact(src, bits))


# ============================================================================ numpy references
def np_view(fmt, bits):
    return np.asarray(bits, dtype=UINT[fmt.width]).view({FP32: np.float32, FP16: np.float16}[fmt])


def ref_add_vec(fmt, a, b):
    """Reference sums (bits) of arrays of operand bits."""
    if fmt == BF16:
        return np.array([ref_add(fmt, int(x), int(y)) for x, y in zip(a, b)], dtype=np.uint16)
    with np.errstate(all="ignore"):
        return (np_view(fmt, a) + np_view(fmt, b)).view(UINT[fmt.width])


def ref_maxmin_vec(fmt, op, a, b):
    f = np.maximum if op == MaxMinOp.MAX else np.minimum
    if fmt == BF16:    # defined as float32 on the value widened by 16 zero bits
        wa = (np.asarray(a, np.uint32) << 16).view(np.float32)
        wb = (np.asarray(b, np.uint32) << 16).view(np.float32)
        r = f(wa, wb).view(np.uint32)
        return (r >> 16).astype(np.uint16), np.isnan(r.view(np.float32))
    r = f(np_view(fmt, a), np_view(fmt, b))
    return r.view(UINT[fmt.width]), np.isnan(r)


def is_nan_vec(fmt, bits):
    bits = np.asarray(bits, dtype=np.uint64)
    return ((bits >> fmt.man_bits) & fmt.exp_max == fmt.exp_max) & (bits & ((1 << fmt.man_bits) - 1) != 0)


def mismatches(fmt, got, want, want_nan=None, limit=8):
    """Indices where ``got`` differs from ``want``; where the reference is NaN, ``got`` must be the canonical
    quiet NaN (``want_nan`` defaults to the NaN-ness of ``want``)."""
    got, want = np.asarray(got, np.uint64), np.asarray(want, np.uint64)
    want_nan = is_nan_vec(fmt, want) if want_nan is None else np.asarray(want_nan)
    bad = np.where(want_nan, got != fmt.qnan, got != want)
    return np.flatnonzero(bad)[:limit]


def describe(fmt, idx, got, want, *ops):
    w = (fmt.width + 3) // 4
    return "\n".join(" ".join(f"{int(o[i]):0{w}x}" for o in ops) + f" -> got {int(got[i]):0{w}x}, "
                     f"want {int(want[i]):0{w}x}" for i in idx)


# ============================================================================ simulation harness
def with_sync_domain(dut=None) -> Module:
    """A module with a ``sync`` domain (a toggling register), holding ``dut`` if given."""
    m = Module()
    toggle = Signal()
    m.d.sync += toggle.eq(~toggle)
    if dut is not None:
        m.submodules.dut = dut
    return m


class Lanes(Elaboratable):
    """``k`` copies of a unit side by side: lane ``i`` takes bits ``[i*in_w, (i+1)*in_w)`` of ``x`` as the
    concatenation of its ``inputs`` (first input in the low bits) and drives ``result`` into ``y``;
    ``shared`` inputs (``op``, ``i_valid``) are broadcast. A ``sync`` domain always exists (a purely
    combinational unit can then still be clocked)."""

    def __init__(self, make, k, inputs, shared=()):
        self.units = [make() for _ in range(k)]
        u0 = self.units[0]
        self.inputs, self.k = inputs, k
        self.in_w = sum(len(getattr(u0, n)) for n in inputs)
        self.out_w = len(u0.result)
        self.x = Signal(self.in_w * k)
        self.y = Signal(self.out_w * k)
        self.shared = {n: Signal.like(getattr(u0, n), name=n) for n in shared}

    def elaborate(self, platform):
        m = with_sync_domain()
        for i, u in enumerate(self.units):
            m.submodules[f"lane{i}"] = u
            pos = i * self.in_w
            for n in self.inputs:
                port = getattr(u, n)
                m.d.comb += port.eq(self.x[pos:pos + len(port)])
                pos += len(port)
            m.d.comb += self.y[i * self.out_w:(i + 1) * self.out_w].eq(u.result)
            for n, s in self.shared.items():
                m.d.comb += getattr(u, n).eq(s)
        return m


def pack_words(arrays, k):
    """Per-lane operand arrays (each of a byte-multiple width) -> one int per group of ``k`` vectors."""
    n = len(arrays[0])
    n_pad = -n % k
    cols = [np.concatenate([np.asarray(a), np.zeros(n_pad, np.asarray(a).dtype)]).astype(
        np.asarray(a).dtype.newbyteorder("<")) for a in arrays]
    rows = np.empty((n + n_pad) // k, dtype=[(f"f{i}_{j}", c.dtype) for i in range(k) for j, c in enumerate(cols)])
    for i in range(k):
        for j, c in enumerate(cols):
            rows[f"f{i}_{j}"] = c[i::k]
    step = rows.dtype.itemsize
    buf = rows.tobytes()
    return [int.from_bytes(buf[i:i + step], "little") for i in range(0, len(buf), step)]


def unpack_words(words, out_w, k, n):
    dt = np.dtype(UINT[out_w]).newbyteorder("<")
    buf = b"".join(int(w).to_bytes(out_w * k // 8, "little") for w in words)
    return np.frombuffer(buf, dtype=dt)[:n].astype(UINT[out_w])


def simulate(lanes: Lanes, operands, shared=None, latency=0, clock=False):
    """Drive groups of vectors, one group per cycle (or per settle when ``clock`` is False); the result of a
    group is read ``latency`` cycles after it was presented."""
    n = len(operands[0])
    words = pack_words(operands, lanes.k)
    out = []

    async def tb(ctx):
        for name, value in (shared or {}).items():
            ctx.set(lanes.shared[name], value)
        if not clock:
            for w in words:
                ctx.set(lanes.x, w)
                out.append(ctx.get(lanes.y))
            return
        for w in words + [0] * latency:
            ctx.set(lanes.x, w)
            out.append(ctx.get(lanes.y))
            await ctx.tick()

    sim = Simulator(lanes)
    if clock:
        sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return unpack_words(out[latency:], lanes.out_w, lanes.k, n)


def run_adder(fmt, a, b, stages=3, k=LANES):
    lanes = Lanes(lambda: FloatAdder(fmt, stages), k, ("a", "b"), shared=("i_valid",))
    return simulate(lanes, (a, b), {"i_valid": 1}, latency=stages, clock=True)


def run_maxmin(fmt, op, a, b, k=LANES, zero_tie=None):
    lanes = Lanes(lambda: FloatMaxMin(fmt, zero_tie), k, ("a", "b"), shared=("op",))
    return simulate(lanes, (a, b), {"op": op})


def run_convert(cls, src, dst, a, k=16):
    return simulate(Lanes(lambda: cls(src, dst), k, ("a",)), (a,))


# ============================================================================ operand generators
# ============================================================================ the reference itself
@pytest.mark.parametrize("fmt", (FP32, FP16), ids=str)
def test_integer_reference_matches_numpy(fmt):
    """The exact integer reference (used for BF16) agrees with numpy where numpy has the type."""
    a, b = random_pairs(fmt, 20_000, seed=7)
    ca, cb = all_pairs(catalogue(fmt))
    a = np.concatenate([a, ca.astype(a.dtype)])
    b = np.concatenate([b, cb.astype(b.dtype)])
    want = ref_add_vec(fmt, a, b)
    mine = np.array([ref_add(fmt, int(x), int(y)) for x, y in zip(a, b)], dtype=UINT[fmt.width])
    bad = mismatches(fmt, mine, want)
    assert not len(bad), describe(fmt, bad, mine, want, a, b)
    if fmt == FP32:
        x = np.random.default_rng(3).integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32)
        x = np.concatenate([x, np.array(catalogue(FP32), np.uint32)])
        with np.errstate(all="ignore"):
            want16 = x.view(np.float32).astype(np.float16).view(np.uint16)
        mine16 = np.array([ref_convert(FP32, FP16, int(v)) for v in x], np.uint16)
        bad = mismatches(FP16, mine16, want16)
        assert not len(bad), describe(FP16, bad, mine16, want16, x)


def test_hand_derived_values():
    """A few results worked out by hand, so the references are anchored to something outside themselves."""
    cases = [
        (FP32, 0x3F800000, 0x33800000, 0x3F800000),   # 1 + 2^-24: tie, even -> 1
        (FP32, 0x3F800001, 0x33800000, 0x3F800002),   # (1 + 2^-23) + 2^-24: tie, odd -> up
        (FP32, 0x7F7FFFFF, 0x73000000, 0x7F800000),   # max + half ulp (2^103) -> inf
        (FP32, 0x00800000, 0x80000001, 0x007FFFFF),   # smallest normal - smallest subnormal
        (FP32, 0x7F800000, 0xFF800000, FP32.qnan),    # inf - inf
        (FP32, 0x80000000, 0x80000000, 0x80000000),   # -0 + -0
        (FP32, 0x3F800000, 0xBF800000, 0x00000000),   # 1 - 1 = +0
        (FP16, 0x3C00, 0x1000, 0x3C00),               # 1 + 2^-11: tie, even
        (FP16, 0x3C01, 0x1000, 0x3C02),
        (FP16, 0x7BFF, 0x4C00, 0x7C00),               # 65504 + 16 (half its ulp of 32): tie, odd -> inf
        (FP16, 0x7BFF, 0x4800, 0x7BFF),               # 65504 + 8 -> 65504
        (FP16, 0x03FF, 0x0001, 0x0400),               # largest subnormal + smallest = smallest normal
        (BF16, 0x3F80, 0x3B80, 0x3F80),               # 1 + 2^-8: tie, even
        (BF16, 0x3F81, 0x3B80, 0x3F82),
        (BF16, 0x7F7F, 0x7B00, 0x7F80),               # max + 2^119 (half its ulp of 2^120) -> inf
        (BF16, 0x7F7F, 0x7A80, 0x7F7F),               # max + 2^118 -> max
        (BF16, 0x3F80, 0x8001, 0x3F80),               # 1 - smallest subnormal
    ]
    for fmt, a, b, want in cases:
        assert ref_add(fmt, a, b) == want, (fmt, hex(a), hex(b))
        assert ref_add(fmt, b, a) == want, (fmt, hex(b), hex(a))
    a = {f: np.array([c[1] for c in cases if c[0] == f], UINT[f.width]) for f in FORMATS}
    b = {f: np.array([c[2] for c in cases if c[0] == f], UINT[f.width]) for f in FORMATS}
    for fmt in FORMATS:
        want = np.array([c[3] for c in cases if c[0] == fmt], UINT[fmt.width])
        got = run_adder(fmt, a[fmt], b[fmt], k=1)
        assert np.array_equal(got, want), (fmt, [hex(g) for g in got], [hex(w) for w in want])


# ============================================================================ adder
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_adder_edge_catalogue(fmt):
    pairs = directed_add_pairs(fmt)
    da = [p[0] for p in pairs] + [p[1] for p in pairs]          # both operand orders
    db = [p[1] for p in pairs] + [p[0] for p in pairs]
    names = [p[2] for p in pairs] * 2
    ca, cb = all_pairs(catalogue(fmt))
    a = np.concatenate([np.array(da, np.uint64), ca]).astype(UINT[fmt.width])
    b = np.concatenate([np.array(db, np.uint64), cb]).astype(UINT[fmt.width])
    got = run_adder(fmt, a, b)
    want = ref_add_vec(fmt, a, b)
    if fmt != BF16:        # the integer reference agrees with numpy on the catalogue
        mine = np.array([ref_add(fmt, int(x), int(y)) for x, y in zip(a, b)], dtype=UINT[fmt.width])
        assert not len(mismatches(fmt, mine, want))
    bad = mismatches(fmt, got, want)
    assert not len(bad), "\n".join(
        (names[i] if i < len(names) else "catalogue pair") + ": " + describe(fmt, [i], got, want, a, b)
        for i in bad)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_adder_random(fmt):
    a, b = random_pairs(fmt, VECTORS, seed=fmt.width + fmt.exp_bits)
    got = run_adder(fmt, a, b)
    want = ref_add_vec(fmt, a, b)
    bad = mismatches(fmt, got, want)
    assert not len(bad), describe(fmt, bad, got, want, a, b)
    # the distribution reached the interesting cases
    nan_ref = is_nan_vec(fmt, want)
    exp_field = (want.astype(np.uint64) >> fmt.man_bits) & fmt.exp_max
    assert ((exp_field == 0) & ~nan_ref).sum() > VECTORS // 50        # subnormal or zero sums
    assert ((want.astype(np.uint64) & ((1 << (fmt.width - 1)) - 1)) == fmt.inf).sum() > 0


# make test-fast: the combinational adder and the most registers
@pytest.mark.parametrize("stages", sweep(sorted(FloatAdder.CUTS), fast=lambda s: s in (0, max(FloatAdder.CUTS))))
def test_adder_every_stage_count(stages):
    """Every register placement computes the same function with latency ``stages``."""
    for fmt in (FP16, BF16):
        ca, cb = all_pairs(catalogue(fmt))
        ra, rb = random_pairs(fmt, 250, seed=stages)       # beside the 2,704 catalogue pairs
        a = np.concatenate([ca.astype(UINT[fmt.width]), ra])
        b = np.concatenate([cb.astype(UINT[fmt.width]), rb])
        got = run_adder(fmt, a, b, stages=stages)
        want = ref_add_vec(fmt, a, b)
        bad = mismatches(fmt, got, want)
        assert not len(bad), describe(fmt, bad, got, want, a, b)


@pytest.mark.parametrize("stages", [0, 1, 3, 6])
def test_adder_latency_and_throughput(stages):
    """o_valid follows i_valid exactly ``stages`` cycles later; back-to-back operations each produce a result
    in consecutive cycles, and bubbles stay bubbles."""
    fmt = FP32
    dut = FloatAdder(fmt, stages)
    rng = np.random.default_rng(11)
    n = 200
    a, b = random_pairs(fmt, n, seed=12)
    valid = [1] * 40 + [int(v) for v in rng.integers(0, 2, n - 40)]     # a back-to-back burst, then random bubbles
    want = ref_add_vec(fmt, a, b)
    seen = []

    async def tb(ctx):
        for i in range(n + stages + 2):
            if i < n:
                ctx.set(dut.a, int(a[i]))
                ctx.set(dut.b, int(b[i]))
                ctx.set(dut.i_valid, valid[i])
            else:
                ctx.set(dut.i_valid, 0)
            seen.append((ctx.get(dut.o_valid), ctx.get(dut.result)))
            await ctx.tick()

    sim = Simulator(with_sync_domain(dut))      # stages=0 has no register of its own
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    # after reset the pipeline is empty
    assert all(v == 0 for v, _ in seen[:stages])
    for i in range(n):
        ov, res = seen[i + stages]
        assert ov == valid[i], f"cycle {i + stages}: o_valid {ov}, operands of cycle {i} had i_valid {valid[i]}"
        if valid[i]:
            assert not len(mismatches(fmt, [res], [want[i]])), (i, hex(a[i]), hex(b[i]), hex(res), hex(want[i]))
    assert all(v == 0 for v, _ in seen[n + stages:])
    assert sum(v for v, _ in seen[stages:stages + 40]) == 40      # one result per cycle in the burst


def test_adder_rejects_unknown_stage_count():
    with pytest.raises(ValueError):
        FloatAdder(FP32, stages=7)


# ============================================================================ max / min
def test_numpy_signed_zero_rule_is_the_documented_one():
    """Measure which operand numpy returns for -0 vs +0 (arrays of several sizes and alignments, and scalars)
    and check cais.hdl.alu.fpu.NUMPY_ZERO_TIE says the same. If this fails, numpy on this machine behaves
    differently from the machine the rule was measured on; the RTL follows the constant."""
    for dt, fmt in ((np.float32, FP32), (np.float16, FP16)):
        rule = NUMPY_ZERO_TIE[fmt]
        rng = np.random.default_rng(5)
        for n in (1, 2, 3, 7, 8, 15, 16, 17, 31, 64, 1000):
            for off in (0, 1):
                a = rng.choice(np.array([0.0, -0.0], dt), n + off)[off:]
                b = np.negative(a)
                for f in (np.maximum, np.minimum):
                    r = f(a, b)
                    pick = b if rule == "b" else a
                    assert np.array_equal(np.signbit(r), np.signbit(pick)), (dt, f.__name__, n, off)
        for f in (np.maximum, np.minimum):
            for x, y in ((0.0, -0.0), (-0.0, 0.0)):
                r = f(dt(x), dt(y))
                assert np.signbit(r) == np.signbit(dt(y) if rule == "b" else dt(x)), (dt, f.__name__, x, y)
    assert NUMPY_ZERO_TIE[BF16] == NUMPY_ZERO_TIE[FP32]     # BF16 is defined through float32


@pytest.mark.parametrize("op", list(MaxMinOp), ids=lambda o: o.name)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_maxmin_against_numpy(fmt, op):
    ca, cb = all_pairs(maxmin_catalogue(fmt))
    ra, rb = maxmin_random(fmt, VECTORS, seed=fmt.width + int(op.value))
    a = np.concatenate([ca.astype(UINT[fmt.width]), ra])
    b = np.concatenate([cb.astype(UINT[fmt.width]), rb])
    got = run_maxmin(fmt, op, a, b)
    want, want_nan = ref_maxmin_vec(fmt, op, a, b)
    bad = mismatches(fmt, got, want, want_nan)
    assert not len(bad), describe(fmt, bad, got, want, a, b)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_maxmin_signed_zeros_hand_derived(fmt):
    """The four -0/+0 cases for both ops, spelled out from NUMPY_ZERO_TIE (and the 'ieee' option)."""
    pz, nz = 0, 1 << (fmt.width - 1)
    a = np.array([nz, pz, nz, pz], UINT[fmt.width])
    b = np.array([pz, nz, nz, pz], UINT[fmt.width])
    for op in MaxMinOp:
        got = run_maxmin(fmt, op, a, b, k=1)
        want = b if NUMPY_ZERO_TIE[fmt] == "b" else a
        assert np.array_equal(got, want), (fmt, op, got)
        got = run_maxmin(fmt, op, a, b, k=1, zero_tie="ieee")
        want = [pz, pz, nz, pz] if op == MaxMinOp.MAX else [nz, nz, nz, pz]
        assert list(got) == want, (fmt, op, got)


# ============================================================================ conversions
@pytest.mark.parametrize("src", (FP16, BF16), ids=str)
def test_widen_exhaustive(src):
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = run_convert(FloatWiden, src, FP32, x)
    if src == FP16:
        want = x.view(np.float16).astype(np.float32).view(np.uint32)
    else:
        want = x.astype(np.uint32) << 16                  # bf16 -> fp32 is appending 16 zero bits
    bad = mismatches(FP32, got, want)
    assert not len(bad), describe(FP32, bad, got, want, x)
    # and the values are exactly those of the integer decoding
    mine = np.array([ref_convert(src, FP32, int(v)) for v in x], np.uint32)
    assert not len(mismatches(FP32, mine, want))
    assert (got[is_nan_vec(src, x)] == FP32.qnan).all()


@pytest.mark.slow
@pytest.mark.parametrize("src", (FP16, BF16), ids=str)
def test_widen_and_narrow_registered(src):
    """stages=1 (a register rank inside): the same conversions, one clock edge later, one per cycle; the
    narrowing with stages=2 (a rank before the alignment shift too) two clock edges later."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    wide = simulate(Lanes(lambda: FloatWiden(src, FP32, stages=1), 16, ("a",)), (x,), {}, latency=1, clock=True)
    assert not len(mismatches(FP32, wide, run_convert(FloatWiden, src, FP32, x)))
    y = np.random.default_rng(5).integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32)
    y = np.concatenate([narrow_catalogue(src), y])
    want = run_convert(FloatNarrow, FP32, src, y)
    for stages in (1, 2):
        narrow = simulate(Lanes(lambda: FloatNarrow(FP32, src, stages=stages), 16, ("a",)), (y,), {},
                          latency=stages, clock=True)
        assert not len(mismatches(src, narrow, want)), stages


def narrow_catalogue(dst: FloatFormat) -> np.ndarray:
    """FP32 patterns around every rounding boundary of ``dst``: each finite ``dst`` value widened, the exact
    midpoints to its neighbour (ties) and one FP32 ulp either side of them, for a spread of binades
    including all of the subnormal range and the top (overflow) binade; plus the FP32 catalogue."""
    rng = np.random.default_rng(dst.width + dst.exp_bits)
    M = dst.man_bits
    pos = np.arange(0, dst.inf, dtype=np.uint64)          # every positive finite dst pattern
    exp_f = pos >> np.uint64(M)
    keep = (exp_f <= 2) | (exp_f >= dst.exp_max - 2) | (rng.random(len(pos)) < 0.05)
    pos = pos[keep]
    top = (dst.exp_max - dst.bias + 127) << 23             # FP32 bits of 2**(emax+1), the overflow binade
    vals = [ref_convert(dst, FP32, int(v)) for v in pos] + [top]
    lo = np.array(vals[:-1], np.int64)
    hi = np.array(vals[1:], np.int64)
    mid = lo + (hi - lo) // 2            # FP32 is linear in its bits within a binade; across one, hi - lo
    pts = np.concatenate([lo, mid - 1, mid, mid + 1, hi - 1])   # (the next binade's first value) still works
    pts = pts[(pts >= 0) & (pts < 0x7F800000)].astype(np.uint64)
    signed = np.concatenate([pts, pts | np.uint64(1 << 31)])
    return np.concatenate([signed, np.array(catalogue(FP32), np.uint64)]).astype(np.uint32)


def edge_binades(dst: FloatFormat, n: int, rng) -> np.ndarray:
    """Random FP32 values (both signs) in the binades where ``dst`` underflows, is subnormal, or overflows."""
    emin_sub = 1 - dst.bias - dst.man_bits                 # exponent of dst's smallest subnormal
    emax = dst.exp_max - 1 - dst.bias                      # exponent of dst's largest binade
    exps = [e for e in range(emin_sub - 3, 1 - dst.bias + 2)] + [emax - 1, emax, emax + 1]
    fields_ = np.array([min(max(e + 127, 0), 254) for e in exps], np.uint64)
    e = rng.choice(fields_, n)
    x = e << np.uint64(23) | rng.integers(0, 1 << 23, n, dtype=np.uint64) | (
        rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(31))
    return x.astype(np.uint32)


@pytest.mark.slow
@pytest.mark.parametrize("dst", (FP16, BF16), ids=str)
def test_narrow(dst):
    rng = np.random.default_rng(21)
    x = np.concatenate([narrow_catalogue(dst),
                        rng.integers(0, 2**32, NARROW_VECTORS, dtype=np.uint64).astype(np.uint32),
                        edge_binades(dst, NARROW_VECTORS // 10, rng)])
    got = run_convert(FloatNarrow, FP32, dst, x)
    if dst == FP16:
        with np.errstate(all="ignore"):
            want = x.view(np.float32).astype(np.float16).view(np.uint16)    # numpy: correctly rounded, RNE
    else:
        want = np.array([ref_convert(FP32, BF16, int(v)) for v in x], np.uint16)
    bad = mismatches(dst, got, want)
    assert not len(bad), describe(dst, bad, got, want, x)
    # the catalogue hit ties, overflow and underflow
    w = want.astype(np.uint64)
    assert ((w & 0x7FFF) == dst.inf).sum() > 10 and ((w >> np.uint64(dst.man_bits)) & dst.exp_max == 0).sum() > 100


@pytest.mark.slow
@pytest.mark.parametrize("dst", (FP16, BF16), ids=str)
def test_narrow_inverts_widen(dst):
    """Every non-NaN 16-bit pattern survives widening and narrowing unchanged."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = x[~is_nan_vec(dst, x)]
    wide = run_convert(FloatWiden, dst, FP32, x)
    back = run_convert(FloatNarrow, FP32, dst, wide)
    assert np.array_equal(back, x)


def test_conversion_rejects_wrong_direction():
    with pytest.raises(ValueError):
        FloatWiden(FP32, FP16)
    with pytest.raises(ValueError):
        FloatNarrow(FP16, FP32)
    with pytest.raises(ValueError):
        FloatWiden(FP16, BF16)


def test_register_ranks_beyond_those_built_are_refused():
    """The widening builds at most one register rank, the narrowing two: more must not pass as fewer."""
    with pytest.raises(ValueError, match="stages must be 0 or 1"):
        FloatWiden(FP16, FP32, stages=2)
    with pytest.raises(ValueError, match="stages must be 0, 1 or 2"):
        FloatNarrow(FP32, FP16, stages=3)
