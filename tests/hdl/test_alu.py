"""ReduceALU against numpy: int32 lanes, big-endian on the wire, SUM wrapping, MAX/MIN signed.

The reference works in int64 and wraps explicitly, so it shares nothing with the RTL but the byte order
of docs/protocol.md: payload bytes 4i..4i+3 of a beat are lane i, most significant byte first, and byte 0
of the beat is tdata[7:0].
"""

import numpy as np
import pytest

from cais.hdl.alu.reduce import ReduceALU
from cais.protocol import ReduceOp

from blocksim import run

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
SPECIAL = np.array([INT32_MIN, INT32_MIN + 1, -65536, -2, -1, 0, 1, 2, 0x7FFF, 0x8000, 0x00FF_FF00,
                    0x1234_5678, INT32_MAX - 1, INT32_MAX], dtype=np.int64)
WIDTHS = (64, 512)
RANDOM_LANES_PER_OP = 8_000


def beat_of(lanes) -> int:
    """Beat (int, byte 0 in bits 7:0) carrying ``lanes`` as big-endian int32."""
    return int.from_bytes(np.asarray(lanes, dtype=np.int64).astype(">i4").tobytes(), "little")


def lanes_of(word: int, nlanes: int) -> np.ndarray:
    return np.frombuffer(int(word).to_bytes(4 * nlanes, "little"), dtype=">i4").astype(np.int64)


def reference(op: ReduceOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if op == ReduceOp.SUM:
        return (a + b + 2**31) % 2**32 - 2**31
    if op == ReduceOp.MAX:
        return np.where(a >= b, a, b)
    if op == ReduceOp.MIN:
        return np.where(a <= b, a, b)
    raise AssertionError(op)


def check_vectors(width: int, cases):
    """``cases``: list of (op, a_lanes, b_lanes) with len == lanes; checks result against the reference."""
    dut = ReduceALU(width)
    nl = width // 32
    failures = []

    async def tb(ctx):
        current_op = None
        for op, a, b in cases:
            if op != current_op:
                ctx.set(dut.op, int(op))
                current_op = op
            ctx.set(dut.a, beat_of(a))
            ctx.set(dut.b, beat_of(b))
            got = lanes_of(ctx.get(dut.result), nl)
            want = reference(op, a, b)
            if not np.array_equal(got, want) and len(failures) < 5:
                failures.append(f"{op.name} a={list(a)} b={list(b)}: got {list(got)}, want {list(want)}")

    run(dut, tb, clock=False)
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- directed
@pytest.mark.parametrize("width", WIDTHS)
def test_byte_order_hand_derived(width):
    """Raw beats, no helpers: lane 0 is bytes 0..3 of the beat, byte 0 (bits 7:0) its most significant."""
    nbytes = width // 8
    dut = ReduceALU(width)

    async def tb(ctx):
        # a: lane 0 = 80 00 00 00 = INT32_MIN; b: lane 0 = 00 00 00 01 = 1. Other lanes 0.
        a = 0x80
        b = 0x01 << 24
        ctx.set(dut.a, a)
        ctx.set(dut.b, b)
        ctx.set(dut.op, ReduceOp.MAX)
        assert ctx.get(dut.result) == b            # 1 > INT32_MIN (little-endian would say 128 > 2**24)
        ctx.set(dut.op, ReduceOp.MIN)
        assert ctx.get(dut.result) == a
        ctx.set(dut.op, ReduceOp.SUM)
        assert ctx.get(dut.result) == a | b        # 80 00 00 01

        # Carry crosses bytes upward in significance, i.e. towards lower byte lanes:
        # 00 00 00 ff + 00 00 00 01 = 00 00 01 00.
        ctx.set(dut.a, 0xFF << 24)
        ctx.set(dut.b, 0x01 << 24)
        assert ctx.get(dut.result) == 0x01 << 16
        # 7f ff ff ff + 00 00 00 01 = 80 00 00 00 (INT32_MAX + 1 wraps to INT32_MIN), in the last lane.
        top = 8 * (nbytes - 4)
        ctx.set(dut.a, 0xFFFFFF7F << top)
        ctx.set(dut.b, 0x01000000 << top)
        assert ctx.get(dut.result) == 0x80 << top
        # ff ff ff ff (-1) + ff ff ff ff (-1) = ff ff ff fe (-2) in every lane: no carry between lanes.
        ones = (1 << width) - 1
        ctx.set(dut.a, ones)
        ctx.set(dut.b, ones)
        assert ctx.get(dut.result) == ones ^ int.from_bytes(bytes([0, 0, 0, 1] * (nbytes // 4)), "little")

    run(dut, tb, clock=False)


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_overflow_and_extremes(width):
    nl = width // 32
    explicit = {
        ReduceOp.SUM: [(INT32_MAX, 1, INT32_MIN), (INT32_MIN, -1, INT32_MAX), (INT32_MIN, INT32_MIN, 0),
                       (INT32_MAX, INT32_MAX, -2), (-1, 1, 0), (-1, -1, -2), (0, 0, 0), (INT32_MAX, INT32_MIN, -1)],
        ReduceOp.MAX: [(INT32_MIN, INT32_MAX, INT32_MAX), (-1, 0, 0), (-1, INT32_MIN, -1), (INT32_MIN, INT32_MIN,
                       INT32_MIN), (0, 1, 1), (-2, -1, -1)],
        ReduceOp.MIN: [(INT32_MIN, INT32_MAX, INT32_MIN), (-1, 0, -1), (-1, INT32_MIN, INT32_MIN),
                       (INT32_MAX, INT32_MAX, INT32_MAX), (0, 1, 0), (-2, -1, -2)],
    }
    # the hand-derived table agrees with the reference (so the reference is checked too)
    for op, rows in explicit.items():
        for a, b, want in rows:
            assert reference(op, [a], [b])[0] == want, (op, a, b)
            assert reference(op, [b], [a])[0] == want, (op, b, a)

    cases = []
    for op, rows in explicit.items():
        for a, b, _ in rows:
            cases.append((op, [a] * nl, [b] * nl))
            cases.append((op, [b] * nl, [a] * nl))
    # every pair of special values, in every lane position
    pa, pb = np.meshgrid(SPECIAL, SPECIAL)
    pa, pb = pa.ravel(), pb.ravel()
    for op in ReduceOp:
        for shift in range(nl):
            a, b = np.roll(pa, shift), np.roll(pb, shift)
            for i in range(0, len(a) - nl + 1, nl):
                cases.append((op, a[i:i + nl], b[i:i + nl]))
    check_vectors(width, cases)


# ----------------------------------------------------------------------------- random
@pytest.mark.slow
@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name)
@pytest.mark.parametrize("width", WIDTHS)
def test_random(width, op):
    nl = width // 32
    rng = np.random.default_rng(1000 * width + int(op))
    n = RANDOM_LANES_PER_OP // nl
    a = rng.integers(INT32_MIN, INT32_MAX, (n, nl), endpoint=True, dtype=np.int64)
    b = rng.integers(INT32_MIN, INT32_MAX, (n, nl), endpoint=True, dtype=np.int64)
    # a quarter of the lanes from the extremes, some equal pairs, some near-equal pairs
    pick = rng.random((n, nl))
    a = np.where(pick < 0.25, rng.choice(SPECIAL, (n, nl)), a)
    b = np.where(pick > 0.85, rng.choice(SPECIAL, (n, nl)), b)
    b = np.where((pick > 0.40) & (pick < 0.45), a, b)
    b = np.where((pick > 0.45) & (pick < 0.50), np.clip(a + rng.integers(-2, 3, (n, nl)), INT32_MIN, INT32_MAX), b)
    check_vectors(width, [(op, a[i], b[i]) for i in range(n)])
