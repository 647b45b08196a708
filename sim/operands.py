"""Operand generators for the float and integer units: the special-value catalogues, named edge pairs and
random pairs that stress rounding, cancellation, subnormals and overflow.

One definition shared by the unit tests (tests/hdl/test_fpu.py, tests/hdl/test_slot_alu.py) and the numerics
benchmark (bench/bench_numerics.py). Values are bit patterns (numpy unsigned integers).
"""

from __future__ import annotations

import numpy as np

from cais.hdl.alu.fpu import BF16, FP16, FP32, FloatFormat
from cais.protocol import DType

__all__ = ["FLOAT_FMT", "INT_BITS", "UINT", "catalogue", "random_row", "directed_add_pairs", "random_pairs", "all_pairs", "maxmin_catalogue",
           "maxmin_random", "int_pairs", "float_pairs", "acc32_pairs"]

FLOAT_FMT = {DType.FP32: FP32, DType.FP16: FP16, DType.BF16: BF16}
INT_BITS = {DType.INT32: 32, DType.INT16: 16, DType.INT8: 8}
UINT = {32: np.uint32, 16: np.uint16}


def catalogue(fmt: FloatFormat) -> list[int]:
    """Special and boundary values of a format (bits), both signs."""
    M, E = fmt.man_bits, fmt.exp_max
    one = fmt.bias << M
    mags = [
        0, 1, 2, 3, (1 << M) - 1, (1 << (M - 1)),          # zero, smallest subnormals, largest subnormal
        1 << M, (1 << M) + 1, (2 << M) - 1,                # smallest normals, end of the first binade
        one, one + 1, one - 1, one + (1 << (M - 1)),       # 1, 1 + ulp, 1 - ulp/2, 1.5
        one + (1 << M) - 1, one + (1 << M),                # 2 - ulp, 2
        (fmt.bias - M - 1) << M, (fmt.bias - M - 2) << M,  # ulp/2 and ulp/4 of 1
        (E - 1) << M | ((1 << M) - 1), (E - 1) << M | ((1 << M) - 2), (E - 1) << M,   # largest finite
        (E - 1 - M - 1) << M,                              # half an ulp of the largest finite
        fmt.inf,
        fmt.qnan, fmt.inf | 1, fmt.inf | (1 << (M - 1)) | 5, fmt.inf | ((1 << (M - 1)) - 1),   # NaNs q/s
    ]
    return [s << (fmt.width - 1) | v for v in mags for s in (0, 1)]


def directed_add_pairs(fmt: FloatFormat) -> list[tuple[int, int, str]]:
    """Named operand pairs of the adder's edge catalogue (compared with the reference like the rest)."""
    M, W = fmt.man_bits, fmt.width
    neg = 1 << (W - 1)
    one = fmt.bias << M
    ulp_half = (fmt.bias - M - 1) << M
    max_f = (fmt.exp_max - 1) << M | ((1 << M) - 1)
    min_n = 1 << M
    max_s = (1 << M) - 1
    return [
        (min_n, neg | 1, "smallest normal - smallest subnormal = largest subnormal"),
        (max_s, 1, "largest subnormal + smallest subnormal = smallest normal"),
        (max_s, max_s, "subnormal + subnormal -> normal"),
        (3, neg | 5, "subnormal - subnormal -> negative subnormal"),
        (1, 1, "smallest subnormal doubled"),
        (1, neg | 1, "smallest subnormal - itself = +0"),
        (min_n | 1, neg | min_n, "normal - normal -> smallest subnormal"),
        (one, ulp_half, "tie, even below: 1 + ulp/2 = 1"),
        (one + 1, ulp_half, "tie, odd below: (1 + ulp) + ulp/2 = 1 + 2 ulp"),
        (one, ulp_half + 1, "just above the tie: rounds up"),
        (one, neg | ulp_half, "1 - ulp/2 is exact (binade below)"),
        (one, neg | ((fmt.bias - M - 2) << M), "1 - ulp/4: tie in the binade below, rounds to 1"),
        (one, neg | ((fmt.bias - M - 2) << M | 1), "1 - ulp/4 - tiny: sticky under a 1-bit normalization"),
        (one, neg | 1, "1 - smallest subnormal: huge exponent difference, rounds to 1"),
        (one + 1, neg | one, "cancellation to one ulp (large normalization shift)"),
        (one + (1 << M) - 1, (fmt.bias - M) << M, "(2 - ulp) + ulp = 2: carry into the exponent"),
        (one + (1 << M) - 1, ulp_half, "(2 - ulp) + ulp/2: tie, odd, rounds up into the next binade"),
        (one | (1 << (M - 1)), one | (1 << (M - 1)), "1.5 + 1.5 = 3"),
        (max_f, max_f, "overflow to infinity"),
        (neg | max_f, neg | max_f, "overflow to -infinity"),
        (max_f, (fmt.exp_max - 1 - M - 1) << M, "largest + half its ulp: tie, odd, rounds to infinity"),
        (max_f, (fmt.exp_max - 1 - M - 2) << M, "largest + quarter ulp: stays largest"),
        (fmt.inf, neg | fmt.inf, "inf - inf = NaN"),
        (neg | fmt.inf, fmt.inf, "-inf + inf = NaN"),
        (fmt.inf, fmt.inf, "inf + inf = inf"),
        (fmt.inf, neg | max_f, "inf + finite = inf"),
        (neg | fmt.inf, one, "-inf + finite = -inf"),
        (fmt.qnan, one, "quiet NaN + x"),
        (one, fmt.inf | 1, "x + signalling NaN"),
        (neg | fmt.inf | 3, fmt.inf, "signalling NaN + inf"),
        (neg | fmt.qnan | 1, fmt.inf | 2, "NaN + NaN"),
        (neg, 0, "-0 + +0 = +0"),
        (0, neg, "+0 + -0 = +0"),
        (neg, neg, "-0 + -0 = -0"),
        (0, 0, "+0 + +0 = +0"),
        (neg | one, one, "x + -x = +0"),
        (max_f, neg | max_f, "max + -max = +0"),
        (neg | 7, 7, "subnormal -x + x = +0"),
        (neg, 5, "-0 + subnormal"),
        (neg | 5, 0, "-subnormal + +0"),
    ]


def random_pairs(fmt: FloatFormat, n: int, seed: int):
    """Four equal parts: random bit patterns; near-equal magnitudes (mostly opposite signs: cancellation);
    subnormal-heavy (exponent fields 0..2); exponents within a few significand widths of each other."""
    rng = np.random.default_rng(seed)
    W, M, E = fmt.width, fmt.man_bits, fmt.exp_bits
    q = n // 4
    top = 1 << W
    sign = np.uint64(1) << np.uint64(W - 1)
    mag_mask = np.uint64(top // 2 - 1)

    def r(lo, hi, size):
        return rng.integers(lo, hi, size, dtype=np.uint64)

    a1, b1 = r(0, top, q), r(0, top, q)
    a2 = r(0, top, q)
    delta = rng.integers(-8, 9, q)
    mag2 = np.clip((a2 & mag_mask).astype(np.int64) + delta, 0, int(mag_mask)).astype(np.uint64)
    b2 = mag2 | np.where(rng.random(q) < 0.8, (a2 & sign) ^ sign, a2 & sign)
    a3 = r(0, 3, q) << np.uint64(M) | r(0, 1 << M, q) | r(0, 2, q) * sign
    b3 = r(0, 3, q) << np.uint64(M) | r(0, 1 << M, q) | r(0, 2, q) * sign
    m4 = n - 3 * q
    e4 = r(0, (1 << E) - 1, m4).astype(np.int64)
    e4b = np.clip(e4 + rng.integers(-(M + 6), M + 7, m4), 0, (1 << E) - 2).astype(np.uint64)
    a4 = e4.astype(np.uint64) << np.uint64(M) | r(0, 1 << M, m4) | r(0, 2, m4) * sign
    b4 = e4b << np.uint64(M) | r(0, 1 << M, m4) | r(0, 2, m4) * sign
    a = np.concatenate([a1, a2, a3, a4]).astype(UINT[W])
    b = np.concatenate([b1, b2, b3, b4]).astype(UINT[W])
    return a, b


def all_pairs(values):
    va, vb = np.meshgrid(np.array(values, dtype=np.uint64), np.array(values, dtype=np.uint64))
    return va.ravel(), vb.ravel()


def maxmin_catalogue(fmt):
    M = fmt.man_bits
    return catalogue(fmt) + [s << (fmt.width - 1) | v for s in (0, 1) for v in (5 << M | 7, 5 << M | 8, 6 << M)]


def maxmin_random(fmt, n, seed):
    rng = np.random.default_rng(seed)
    W = fmt.width
    sign = 1 << (W - 1)
    q = n // 3
    a1 = rng.integers(0, 1 << W, q, dtype=np.uint64)
    b1 = rng.integers(0, 1 << W, q, dtype=np.uint64)
    # same magnitude (equal values, +x vs -x, -0 vs +0), and neighbours
    a2 = rng.integers(0, 1 << W, q, dtype=np.uint64)
    b2 = (a2 + rng.integers(0, 2, q, dtype=np.uint64) * sign + rng.integers(0, 2, q, dtype=np.uint64)) % (1 << W)
    # zeros, subnormals, infinities and NaNs against everything
    small = np.array(catalogue(fmt), np.uint64)
    m = n - 2 * q
    a3 = rng.choice(small, m)
    b3 = np.where(rng.random(m) < 0.5, rng.choice(small, m), rng.integers(0, 1 << W, m, dtype=np.uint64))
    swap = rng.random(m) < 0.5
    a3, b3 = np.where(swap, b3, a3), np.where(swap, a3, b3)
    return (np.concatenate([a1, a2, a3]).astype(UINT[W]), np.concatenate([b1, b2, b3]).astype(UINT[W]))


def int_pairs(bits: int, n: int, rng):
    """Bit patterns of signed operand pairs: random, extremes, equal, neighbours, overflowing sums."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    special = np.array([lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi, hi // 2 + 1, lo // 2 - 1], np.int64)
    a = rng.integers(lo, hi, n, endpoint=True)
    b = rng.integers(lo, hi, n, endpoint=True)
    pick = rng.random(n)
    a = np.where(pick < 0.3, rng.choice(special, n), a)
    b = np.where(pick > 0.7, rng.choice(special, n), b)
    b = np.where((pick > 0.40) & (pick < 0.45), a, b)
    b = np.where((pick > 0.45) & (pick < 0.50), np.clip(a + rng.integers(-2, 3, n), lo, hi), b)
    mask = (1 << bits) - 1
    return (a & mask).astype(np.uint64), (b & mask).astype(np.uint64)


def float_pairs(fmt, n: int, rng):
    """Bit patterns: adder edge cases (cancellation, subnormals, near exponents), max/min cases (equal
    magnitudes), pairs of the special-value catalogue and of signed zeros, in random operand order."""
    seed = int(rng.integers(1 << 31))
    ra, rb = random_pairs(fmt, max(n, 4), seed)
    ma, mb = maxmin_random(fmt, max(n, 3), seed + 1)
    ca, cb = all_pairs(catalogue(fmt))
    za, zb = all_pairs([0, 1 << (fmt.width - 1)])      # -0/+0: the operand max/min return on a tie
    pool_a = [ra.astype(np.uint64), ma.astype(np.uint64), ca, za]
    pool_b = [rb.astype(np.uint64), mb.astype(np.uint64), cb, zb]
    src = rng.choice(4, n, p=[0.35, 0.3, 0.25, 0.1])
    pick = [rng.integers(0, len(p), n) for p in pool_a]
    a = np.choose(src, [p[i] for p, i in zip(pool_a, pick)])
    b = np.choose(src, [p[i] for p, i in zip(pool_b, pick)])
    swap = rng.random(n) < 0.5
    return np.where(swap, b, a), np.where(swap, a, b)


def acc32_pairs(dtype: DType, n: int, rng):
    """(float32 accumulator, fp16/bf16 element) pairs: the accumulator is a widened element of a half-format
    edge pair (exact cancellations and ties), that plus random low bits (rounding in float32), or any
    float32 (random bits, the float32 catalogue)."""
    fmt = FLOAT_FMT[dtype]
    ha, hb = float_pairs(fmt, n, rng)
    if dtype == DType.FP16:
        with np.errstate(all="ignore"):
            wa = ha.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32).astype(np.uint64)
    else:
        wa = ha << np.uint64(16)
    noisy = wa ^ rng.integers(0, 1 << 14, n, dtype=np.uint64)
    any32 = np.where(rng.random(n) < 0.5, rng.integers(0, 1 << 32, n, dtype=np.uint64),
                     rng.choice(np.array(catalogue(FP32), np.uint64), n))
    src = rng.choice(3, n, p=[0.4, 0.3, 0.3])
    return np.choose(src, [wa, noisy, any32]), hb


def random_row(rng, dtype: DType, width: int) -> int:
    """A ``width``-bit row of random elements of ``dtype`` (``rng``: a random.Random), each of them a
    special value of its type 30% of the time (the float catalogue; an integer's 0, 1, -1 and extremes),
    elements big-endian as on the wire, the row's bytes in AXI order (byte 0 in the low bits)."""
    if dtype in INT_BITS:
        bits = INT_BITS[dtype]
        special = [0, 1, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1]
    else:
        bits = FLOAT_FMT[dtype].width
        special = catalogue(FLOAT_FMT[dtype])
    elems = [rng.choice(special) if rng.random() < 0.3 else rng.getrandbits(bits) for _ in range(width // bits)]
    return int.from_bytes(b"".join(e.to_bytes(bits // 8, "big") for e in elems), "little")
