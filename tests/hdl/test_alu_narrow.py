# amaranth: UnusedElaboratable=no
"""ReduceALU's int16 and int8 lanes against numpy, wrapping and saturating, and the overflow example of
docs/numerics.md (the 4-bit sequence 7 - 5 + 5 + 5 - 3 - 7, true sum 2, scaled to int8 and int16)."""

import numpy as np
import pytest

from cais.hdl.alu.reduce import ReduceALU
from cais.protocol import DType, ReduceOp

from blocksim import run
from tiers import sweep

TYPES = {DType.INT16: (">i2", 16), DType.INT8: ("i1", 8)}


def beat_of(values, be) -> int:
    return int.from_bytes(np.asarray(values, dtype=np.int64).astype(be).tobytes(), "little")


def values_of(word, be, n) -> np.ndarray:
    size = np.dtype(be).itemsize
    return np.frombuffer(int(word).to_bytes(size * n, "little"), dtype=be).astype(np.int64)


def reference(op, a, b, bits, saturate):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if op == ReduceOp.MAX:
        return np.maximum(a, b)
    if op == ReduceOp.MIN:
        return np.minimum(a, b)
    exact = a + b
    return np.clip(exact, lo, hi) if saturate else (exact - lo) % (1 << bits) + lo


def evaluate(width, dtype, op, saturate, pairs, stages=0):
    """pairs: list of (a_values, b_values); returns the results as int64 arrays. The pairs enter back to
    back, one per cycle, and each result is read ``stages`` clock edges after its pair (the inputs by then
    hold later pairs, or zeros: the result must not depend on them)."""
    be, bits = TYPES[dtype]
    dut = ReduceALU(width, stages=stages)
    zeros = np.zeros(width // bits, dtype=np.int64)
    out = []

    async def tb(ctx):
        ctx.set(dut.dtype, int(dtype))
        ctx.set(dut.op, int(op))
        ctx.set(dut.saturate, int(saturate))
        for cycle in range(len(pairs) + stages):
            a, b = pairs[cycle] if cycle < len(pairs) else (zeros, zeros)
            ctx.set(dut.a, beat_of(a, be))
            ctx.set(dut.b, beat_of(b, be))
            if cycle >= stages:
                out.append(values_of(ctx.get(dut.result), be, width // bits))
            if stages:
                await ctx.tick()

    run(dut, tb, clock=bool(stages))
    return out


OPS = [(ReduceOp.SUM, False), (ReduceOp.SUM, True), (ReduceOp.MAX, False), (ReduceOp.MIN, False)]


# make test-fast: every operator on int8 lanes at 64 bits, and int16 wrapping sums at 512
@pytest.mark.parametrize("width,dtype,op,saturate", sweep(
    [(w, t, op, sat) for op, sat in OPS for t in TYPES for w in (64, 512)],
    fast=lambda w, t, op, sat: (w, t) == (64, DType.INT8) or (w, t, op, sat) == (512, DType.INT16, ReduceOp.SUM, False),
    ids=lambda w, t, op, sat: f"{op.name}{'_sat' if sat else ''}-{t.name}-{w}"))
def test_random_and_extremes(width, dtype, op, saturate):
    be, bits = TYPES[dtype]
    n = width // bits
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    rng = np.random.default_rng(bits * 7 + width + int(op) + saturate)
    special = np.array([lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi])
    scale = 64 / width                     # as many lane samples at 512 bits as at 64, in an eighth of the settles
    pairs = [(rng.choice(special, n), rng.choice(special, n)) for _ in range(int(100 * scale))]
    pairs += [(rng.integers(lo, hi + 1, n), rng.integers(lo, hi + 1, n)) for _ in range(int(300 * scale))]
    got = evaluate(width, dtype, op, saturate, pairs)
    for (a, b), g in zip(pairs, got):
        np.testing.assert_array_equal(g, reference(op, a, b, bits, saturate), err_msg=f"a={a} b={b}")


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("op,saturate", [(ReduceOp.SUM, False), (ReduceOp.SUM, True), (ReduceOp.MAX, False),
                                         (ReduceOp.MIN, False)])
def test_registered_rank(stages, dtype, op, saturate):
    """stages=1 and 2: the same function, one or two clock edges later, one pair per cycle."""
    be, bits = TYPES[dtype]
    n = 64 // bits
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    rng = np.random.default_rng(bits + int(op) + 2 * saturate)
    special = np.array([lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi])
    pairs = [(rng.choice(special, n), rng.choice(special, n)) for _ in range(60)]
    pairs += [(rng.integers(lo, hi + 1, n), rng.integers(lo, hi + 1, n)) for _ in range(60)]
    got = evaluate(64, dtype, op, saturate, pairs, stages=stages)
    assert ReduceALU(64, stages=stages).latency == stages
    for (a, b), g in zip(pairs, got):
        np.testing.assert_array_equal(g, reference(op, a, b, bits, saturate), err_msg=f"a={a} b={b}")


def test_int32_unchanged_by_default():
    dut = ReduceALU(64)

    async def tb(ctx):   # dtype and saturate left unconnected: int32, wrapping
        ctx.set(dut.a, beat_of([2**31 - 1, -5], ">i4"))
        ctx.set(dut.b, beat_of([1, 3], ">i4"))
        assert list(values_of(ctx.get(dut.result), ">i4", 2)) == [-2**31, -2]

    run(dut, tb, clock=False)


SEQUENCE_4BIT = [7, -5, 5, 5, -3, -7]   # true sum 2; 7 - 5 + 5 + 5 = 12 overflows 4 bits


@pytest.mark.parametrize("dtype,expected_wrap,expected_saturate", [
    # scaled by 2**(bits-4): true sum 2 * 16 = 32 (int8), 2 * 4096 = 8192 (int16)
    (DType.INT8, 32, -33),
    (DType.INT16, 8192, -8193),
])
def test_overflow_example(dtype, expected_wrap, expected_saturate):
    """Accumulate the scaled sequence in arrival order, as a slot does, in both SUM modes.

    Hand derivation for int8 (x16: 112, -80, 80, 80, -48, -112): wrapping, 112 - 80 + 80 + 80 = 192
    wraps to -64, then -112, then -224 wraps to 32 = the true sum; saturating, 192 clamps to 127, then
    127 - 48 - 112 = -33. int16 (x4096) is the same with 32767: 28672 + ... saturates to -8193.
    """
    be, bits = TYPES[dtype]
    scale = 1 << (bits - 4)
    for saturate, expected in ((False, expected_wrap), (True, expected_saturate)):
        acc = SEQUENCE_4BIT[0] * scale
        for value in SEQUENCE_4BIT[1:]:
            [(acc_lanes)] = evaluate(64, dtype, ReduceOp.SUM, saturate,
                                     [([acc] * (64 // bits), [value * scale] * (64 // bits))])
            acc = int(acc_lanes[0])
        assert acc == expected
    assert sum(SEQUENCE_4BIT) * scale == expected_wrap
