# amaranth: UnusedElaboratable=no
"""cais.hdl.alu.slot_alu.SlotALU against the numpy reference cais.numerics, bit for bit.

Rows stream into the ALU one per cycle, back to back (with a few bubbles), every row with its own random
dtype/op/acc_fp32/saturate/store/granule, so the control has to travel down the pipeline with its data;
each result is read ``latency`` cycles after its row and compared with ``numerics.accumulate`` (which is
``combine`` or, with store, the row itself, widened with acc_fp32), together with ``we`` and ``o_valid``.
Operands mix random bits with the edge generators of tests/hdl/test_fpu.py (signed zeros, infinities, NaNs
with payloads, subnormals, largest finite values, rounding ties, cancellation) and the integer extremes.

amaranth.sim runs this design at only a few hundred cycles per second, so the default run is small:
``CAIS_SLOT_ALU_VECTORS`` (default 1000) rows per dtype at W=64, a fraction of that for the other
configurations. Set it higher for a long run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
from amaranth.hdl import Cat, ClockDomain, Elaboratable, Module, Signal
from amaranth.sim import Simulator

from cais import numerics
from cais.hdl.alu.fpu import BF16, FP16, FP32, NUMPY_ZERO_TIE
from cais.hdl.alu.slot_alu import SlotALU
from cais.protocol import DType, ReduceOp

from cais.sim.operands import FLOAT_FMT, INT_BITS, acc32_pairs, all_pairs, catalogue, float_pairs, int_pairs, random_pairs
from test_fpu import ref_add

VECTORS = int(os.environ.get("CAIS_SLOT_ALU_VECTORS", "1000"))
HALF = (DType.FP16, DType.BF16)
ELEM_BITS = {**INT_BITS, DType.FP32: 32, DType.FP16: 16, DType.BF16: 16}
UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


# ============================================================================ harness
class Harness(Elaboratable):
    """The ALU with its inputs packed into one signal ``x`` and outputs into ``y`` (one ``ctx.set`` and
    one ``ctx.get`` a cycle: each write makes the simulator settle the whole design), and a ``sync``
    domain (``rst`` reachable by the testbench) even when the ALU is combinational."""

    INPUTS = ("acc", "row", "granule", "dtype", "op", "acc_fp32", "saturate", "store", "i_valid")

    def __init__(self, dut: SlotALU):
        self.dut = dut
        self.x = Signal(sum(len(getattr(dut, n)) for n in self.INPUTS))
        self.y = Signal(len(dut.result) + 3)
        self.sync = ClockDomain("sync")

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.sync
        m.submodules.dut = d = self.dut
        m.d.comb += [Cat(*(getattr(d, n) for n in self.INPUTS)).eq(self.x),
                     self.y.eq(Cat(d.result, d.we, d.o_valid))]
        return m

    def pack(self, row) -> int:
        x, pos = 0, 0
        for n in self.INPUTS:
            x |= int(getattr(row, n)) << pos
            pos += len(getattr(self.dut, n))
        return x


@dataclass
class Row:
    dtype: DType
    op: ReduceOp
    acc_fp32: int
    saturate: int
    store: int
    granule: int
    i_valid: int = 1
    acc: int = 0
    row: int = 0
    want: int | None = None      # expected granule (wire modes) or word (fp32 accumulation)

    @property
    def acc32(self) -> bool:
        return bool(self.acc_fp32) and self.dtype in HALF


def simulate(dut: SlotALU, rows: list[Row]):
    """Present one row per cycle; returns the (result, we, o_valid) seen ``latency`` cycles after each
    row, and what the outputs showed during the first ``latency`` cycles."""
    h = Harness(dut)
    L = dut.latency
    W2 = 2 * dut.data_width
    words = [h.pack(r) for r in rows]
    seen = []

    async def tb(ctx):
        for x in words + [0] * L:
            ctx.set(h.x, x)
            seen.append(ctx.get(h.y))
            await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    out = [(y & ((1 << W2) - 1), (y >> W2) & 3, y >> (W2 + 2)) for y in seen]
    return out[L:], out[:L]


def check(dut: SlotALU, rows: list[Row]):
    got, head = simulate(dut, rows)
    assert all(v == 0 and we == 0 for _, we, v in head), "o_valid/we set before the first row came out"
    W = dut.data_width
    failures = []
    for i, (r, (res, we, valid)) in enumerate(zip(rows, got)):
        if valid != r.i_valid:
            failures.append(f"row {i}: o_valid {valid}, i_valid was {r.i_valid}")
        elif not r.i_valid:
            if we:
                failures.append(f"row {i}: we={we:#b} without o_valid")
        elif r.acc32:
            if (res, we) != (r.want, 0b11):
                failures.append(describe(i, r, W, res, we, 0b11))
        else:
            part = (res >> (W * r.granule)) & ((1 << W) - 1)
            if (part, we) != (r.want, 1 << r.granule):
                failures.append(describe(i, r, W, part, we, 1 << r.granule))
        if len(failures) >= 8:
            break
    assert not failures, "\n".join(failures)


def describe(i, r: Row, W, got, we, want_we):
    def elems(word, nbytes, n):
        return " ".join(int(word).to_bytes(nbytes, "little")[k:k + n].hex() for k in range(0, nbytes, n))
    n = ELEM_BITS[r.dtype] // 8
    wide = 4 if r.acc32 else n
    gbytes = 2 * W // 8 if r.acc32 else W // 8
    acc = r.acc if r.acc32 else (r.acc >> (W * r.granule)) & ((1 << W) - 1)
    return (f"row {i}: {r.dtype.name} {r.op.name} acc_fp32={r.acc_fp32} saturate={r.saturate} store={r.store} "
            f"granule={r.granule}\n  acc  {elems(acc, gbytes, wide)}\n  row  {elems(r.row, W // 8, n)}\n"
            f"  got  {elems(got, gbytes, wide)} we={we:#04b}\n  want {elems(r.want, gbytes, wide)} "
            f"we={want_we:#04b}")


# ============================================================================ operands
def to_bytes(bits: np.ndarray, width: int) -> bytes:
    """Big-endian elements of ``width`` bits (the wire's order)."""
    return np.asarray(bits, np.uint64).astype(UINT[width]).astype(np.dtype(UINT[width]).newbyteorder(">")).tobytes()


def random_rows(W: int, dtypes, n: int, seed: int, *, store_rate=0.2, bubble_rate=0.08) -> list[Row]:
    """``n`` rows of random kinds (all ops, acc_fp32, saturate, store, granule) and operands, with the
    expected results from cais.numerics."""
    rng = np.random.default_rng(seed)
    rows = [Row(DType(rng.choice(dtypes)), ReduceOp(int(rng.integers(3))), int(rng.integers(2)),
                int(rng.integers(2)), int(rng.random() < store_rate), int(rng.integers(2)),
                int(rng.random() >= bubble_rate)) for _ in range(n)]
    # Operands, generated in bulk for each (dtype, fp32 accumulation) mode.
    for mode in {(r.dtype, r.acc32) for r in rows}:
        dtype, acc32 = mode
        group = [r for r in rows if (r.dtype, r.acc32) == mode]
        bits = ELEM_BITS[dtype]
        k = W // bits
        if acc32:
            a, b = acc32_pairs(dtype, k * len(group), rng)
            a_bits = 32
        elif dtype in INT_BITS:
            a, b = int_pairs(bits, k * len(group), rng)
            a_bits = bits
        else:
            a, b = float_pairs(FLOAT_FMT[dtype], k * len(group), rng)
            a_bits = bits
        for j, r in enumerate(group):
            acc = to_bytes(a[j * k:(j + 1) * k], a_bits)
            if not acc32:       # the other granule holds anything; it must not matter
                other = rng.bytes(W // 8)
                acc = acc + other if r.granule == 0 else other + acc
            r.acc = int.from_bytes(acc, "little")
            r.row = int.from_bytes(to_bytes(b[j * k:(j + 1) * k], bits), "little")
    expect(rows, W)
    return rows


def expect(rows: list[Row], W: int):
    """Fill in ``want``: numerics.accumulate of each row on its accumulator (None with store), vectorised
    over the rows of each kind."""
    kinds = {}
    for r in rows:
        kinds.setdefault((r.dtype, r.op, r.acc_fp32, r.saturate, r.store), []).append(r)
    for (dtype, op, acc_fp32, saturate, store), group in kinds.items():
        acc32 = group[0].acc32
        nb = W // 8
        row_vals = numerics.decode(dtype, b"".join(r.row.to_bytes(nb, "little") for r in group))
        if store:
            acc_vals = None
        elif acc32:
            acc_vals = numerics.decode(DType.FP32, b"".join(r.acc.to_bytes(2 * nb, "little") for r in group))
        else:
            acc_vals = numerics.decode(dtype, b"".join(
                (r.acc >> (W * r.granule)).to_bytes(2 * nb, "little")[:nb] for r in group))
        out = numerics.accumulate(dtype, op, acc_vals, row_vals, acc_fp32=bool(acc_fp32), saturate=bool(saturate))
        data = numerics.encode(DType.FP32 if acc32 else dtype, out)
        size = len(data) // len(group)
        assert size == (2 * nb if acc32 else nb)
        for j, r in enumerate(group):
            r.want = int.from_bytes(data[j * size:(j + 1) * size], "little")


# ============================================================================ the reference's premises
def test_numpy_float16_sum_is_float32_sum_rounded_once():
    """The design computes an fp16 sum as FloatNarrow(FloatAdder(FP32)) of the widened operands: that is
    numpy's float16 ``+`` (and numerics.combine) bit for bit, NaNs aside (canonical in both)."""
    rng = np.random.default_rng(1)
    a, b = random_pairs(FP16, 400_000, 2)
    ca, cb = all_pairs(catalogue(FP16))
    a = np.concatenate([a, ca.astype(np.uint16), rng.integers(0, 1 << 16, 100_000).astype(np.uint16)])
    b = np.concatenate([b, cb.astype(np.uint16), rng.integers(0, 1 << 16, 100_000).astype(np.uint16)])
    fa, fb = a.view(np.float16), b.view(np.float16)
    with np.errstate(all="ignore"):
        direct = (fa + fb).view(np.uint16)
        via32 = (fa.astype(np.float32) + fb.astype(np.float32)).astype(np.float16).view(np.uint16)
    nan = np.isnan(direct.view(np.float16))
    assert np.array_equal(nan, np.isnan(via32.view(np.float16)))
    assert np.array_equal(direct[~nan], via32[~nan])
    ref = numerics.combine(DType.FP16, ReduceOp.SUM, fa, fb).view(np.uint16)
    assert np.array_equal(ref[~nan], direct[~nan]) and (ref[nan] == FP16.qnan).all()
    # bf16 through float32 is correctly rounded too (24 >= 2 * 8 + 2): the exact integer reference agrees
    a, b = random_pairs(BF16, 4000, 3)
    got = numerics.combine(DType.BF16, ReduceOp.SUM, a, b)
    assert [int(g) for g in got] == [ref_add(BF16, int(x), int(y)) for x, y in zip(a, b)]


def test_reference_zero_ties():
    """The -0/+0 tie of max/min in each mode, as numerics computes it: float16 returns the stored operand,
    float32 (fp32, bf16 and every fp32 accumulation) the incoming one. SlotALU follows NUMPY_ZERO_TIE."""
    pz, nz = np.array([0x0000, 0x8000], np.uint16)
    for op in (ReduceOp.MAX, ReduceOp.MIN):
        r16 = numerics.combine(DType.FP16, op, np.array([nz, pz]).view(np.float16),
                               np.array([pz, nz]).view(np.float16)).view(np.uint16)
        assert list(r16) == ([nz, pz] if NUMPY_ZERO_TIE[FP16] == "a" else [pz, nz])
        rbf = numerics.combine(DType.BF16, op, np.array([nz, pz]), np.array([pz, nz]))
        assert list(rbf) == ([pz, nz] if NUMPY_ZERO_TIE[FP32] == "b" else [nz, pz])
        r32 = numerics.combine(DType.FP32, op, np.float32([-0.0, 0.0]), np.float32([0.0, -0.0]))
        assert list(np.signbit(r32)) == ([False, True] if NUMPY_ZERO_TIE[FP32] == "b" else [True, False])
    assert NUMPY_ZERO_TIE[FP16] != NUMPY_ZERO_TIE[FP32]       # else SlotALU's tie patch is dead logic


# ============================================================================ construction
def test_latency_attribute():
    # inputs registered, widening split in two (classification and count, then the operands registered),
    # the adder's stages, lane results registered, narrowing (the shift distance, the alignment, then the
    # rounding into the output register)
    assert SlotALU(64).latency == 13                            # FADD_STAGES = 6
    assert SlotALU(64, fadd_stages=0).latency == 7
    assert SlotALU(128, fadd_stages=5).latency == 12
    assert SlotALU(64, float_units=False).latency == 4          # inputs registered, the integer ALU's three stages
    assert SlotALU(512, float_units=False, fadd_stages=6).latency == 4
    with pytest.raises(ValueError):
        SlotALU(64, fadd_stages=7)
    with pytest.raises(ValueError):
        SlotALU(48)
    dut = SlotALU(256)
    assert (len(dut.acc), len(dut.row), len(dut.result), len(dut.we)) == (512, 256, 512, 2)
    assert (len(dut.dtype), len(dut.op), len(dut.granule), len(dut.acc_fp32)) == (4, 4, 1, 1)


# ============================================================================ hand-derived rows
def hx(s: str) -> int:
    """A row or word from its bytes in wire order (byte 0 first), as the ALU sees it (byte 0 in bits 7:0)."""
    return int.from_bytes(bytes.fromhex(s.replace(" ", "")), "little")


GARBAGE = "a5" * 8
DIRECTED = [
    # (dtype, op, acc_fp32, saturate, store, granule, acc word bytes, row bytes, want granule/word bytes)
    # int16: element i is bytes 2i..2i+1, most significant first; granule 1 is the word's second half.
    (DType.INT16, ReduceOp.SUM, 0, 0, 0, 1, GARBAGE + "000a 0014 001e 7fff", "0001 0002 0003 0001",
     "000b 0016 0021 8000"),
    (DType.INT16, ReduceOp.SUM, 0, 1, 0, 1, GARBAGE + "000a 0014 001e 7fff", "0001 0002 0003 0001",
     "000b 0016 0021 7fff"),
    (DType.INT8, ReduceOp.SUM, 1, 1, 0, 0, "80 80 7f 7f 01 ff 00 10" + GARBAGE, "ff 80 01 7f 7f 01 00 f0",
     "80 80 7f 7f 7f 00 00 00"),
    (DType.INT8, ReduceOp.MAX, 0, 0, 0, 0, "80 80 7f 7f 01 ff 00 10" + GARBAGE, "ff 80 01 7f 7f 01 00 f0",
     "ff 80 7f 7f 7f 01 00 10"),
    (DType.INT32, ReduceOp.MIN, 0, 0, 0, 0, "80000000 ffffffff" + GARBAGE, "7fffffff 00000001",
     "80000000 ffffffff"),
    # fp32 accumulation of fp16: fp32 element i of the whole word (granule 0 first) <-> row element i.
    # 1 + 1 = 2; 1 + -2 = -1; 0 + 2^-24 (fp16 subnormal) = 2^-24; -inf + inf = NaN.
    (DType.FP16, ReduceOp.SUM, 1, 0, 0, 1, "3f800000 3f800000 00000000 ff800000", "3c00 c000 0001 7c00",
     "40000000 bf800000 33800000 7fc00000"),
    (DType.BF16, ReduceOp.MAX, 1, 0, 0, 0, "3f800000 3f800001 80000000 7f800001", "3f80 3f80 0000 0000",
     "3f800000 3f800001 00000000 7fc00000"),
    (DType.FP16, ReduceOp.SUM, 1, 0, 1, 0, GARBAGE * 2, "7d00 8001 3c00 fc00",        # store widens (sNaN)
     "7fc00000 b3800000 3f800000 ff800000"),
    # wire-format store: the row unchanged, NaN payloads included
    (DType.FP32, ReduceOp.SUM, 0, 0, 1, 1, GARBAGE * 2, "7f800001 ffc12345", "7f800001 ffc12345"),
    (DType.FP16, ReduceOp.MIN, 0, 0, 1, 0, GARBAGE * 2, "7d00 fe01 0000 8000", "7d00 fe01 0000 8000"),
    # fp16 sums, ties to even: 1 + 2^-11 = 1, (1 + 2^-10) + 2^-11 = 1 + 2^-9; 65504 + 16 = inf; sNaN + 1
    (DType.FP16, ReduceOp.SUM, 0, 0, 0, 0, "3c00 3c01 7bff 7c01" + GARBAGE, "1000 1000 4c00 3c00",
     "3c00 3c02 7c00 7e00"),
    # bf16: 1 + 2^-8 = 1 (tie, even), max + half its ulp = inf, -0 + -0 = -0, 1 + -1 = +0
    (DType.BF16, ReduceOp.SUM, 0, 0, 0, 1, GARBAGE + "3f80 7f7f 8000 3f80", "3b80 7b00 8000 bf80",
     "3f80 7f80 8000 0000"),
    # -0/+0 ties: fp16 keeps the stored operand, bf16 and fp32 take the incoming one (numpy's choice)
    (DType.FP16, ReduceOp.MAX, 0, 0, 0, 0, "8000 0000 8000 0000" + GARBAGE, "0000 8000 3c00 bc00",
     "8000 0000 3c00 0000"),
    (DType.FP16, ReduceOp.MIN, 0, 0, 0, 0, "8000 0000 8000 0000" + GARBAGE, "0000 8000 3c00 bc00",
     "8000 0000 8000 bc00"),
    (DType.BF16, ReduceOp.MAX, 0, 0, 0, 0, "8000 0000 8000 0000" + GARBAGE, "0000 8000 3f80 bf80",
     "0000 8000 3f80 0000"),
    (DType.FP32, ReduceOp.MIN, 0, 0, 0, 0, "80000000 00000000" + GARBAGE, "00000000 80000000",
     "00000000 80000000"),
    (DType.FP16, ReduceOp.MIN, 1, 0, 0, 0, "80000000 00000000 7fc00000 3f800000", "0000 8000 fc00 7e01",
     "00000000 80000000 7fc00000 7fc00000"),
]


@pytest.mark.parametrize("fadd_stages", [3, 0])
def test_hand_derived_rows(fadd_stages):
    """Rows whose results were worked out by hand (byte order, granule and accumulator placement, store,
    rounding, specials, zero ties), checked against the RTL and against cais.numerics itself."""
    rows = []
    for dtype, op, acc_fp32, sat, store, gran, acc, row, want in DIRECTED:
        rows.append(Row(dtype, op, acc_fp32, sat, store, gran, 1, hx(acc), hx(row), hx(want)))
    hand = [r.want for r in rows]
    expect(rows, 64)
    assert [r.want for r in rows] == hand, "cais.numerics disagrees with a hand-derived row"
    check(SlotALU(64, fadd_stages=fadd_stages), rows)


# ============================================================================ random streams
@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_random_w64(dtype):
    """Every op x acc_fp32 x saturate x store x granule of one dtype, mixed row by row."""
    rows = random_rows(64, [dtype], VECTORS, seed=100 + int(dtype))
    kinds = {(r.op, r.acc_fp32, r.saturate, r.store) for r in rows if r.i_valid}
    assert len(kinds) == 24 or VECTORS < 500
    check(SlotALU(64), rows)


@pytest.mark.slow
def test_random_w128():
    rows = random_rows(128, list(DType), max(60, VECTORS // 4), seed=7)
    check(SlotALU(128), rows)


@pytest.mark.parametrize("fadd_stages", [0, 1])
def test_random_fadd_stages(fadd_stages):
    """Other adder depths: the whole ALU follows (plus its output register)."""
    dut = SlotALU(64, fadd_stages=fadd_stages)
    assert dut.latency == fadd_stages + 7
    check(dut, random_rows(64, list(DType), max(60, VECTORS // 3), seed=20 + fadd_stages))


def test_integers_only():
    """float_units=False: latency 4 (the inputs registered, the integer ALU in three stages), the integer types exact."""
    dut = SlotALU(64, float_units=False)
    assert dut.latency == 4
    check(dut, random_rows(64, list(INT_BITS), 2 * VECTORS, seed=5))


def test_reset_drops_rows_in_flight():
    """A synchronous reset empties the pipeline: the rows in flight never show o_valid (nor we), the rows
    after it come out normally."""
    dut = SlotALU(64)
    L = dut.latency
    rows = random_rows(64, list(DType), 30, seed=11, bubble_rate=0)
    R = 12                                  # the cycle whose clock edge resets
    h = Harness(dut)
    seen = []

    async def tb(ctx):
        for c, r in enumerate(rows):
            ctx.set(h.x, h.pack(r))
            ctx.set(h.sync.rst, c == R)
            seen.append(ctx.get(h.y))
            await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    for c, y in enumerate(seen):
        dropped = c < L or R < c <= R + L
        assert (y >> 130, (y >> 128) & 3 != 0) == ((0, False) if dropped else (1, True)), (c, hex(y >> 128))
        if not dropped:
            r = rows[c - L]
            res = y & ((1 << 128) - 1)
            assert (res if r.acc32 else (res >> (64 * r.granule)) & ((1 << 64) - 1)) == r.want, (c, r)


def test_store_only_stores_whatever_store_says():
    """store_only (a fold chain's first stage): every row is stored as with store high (the row as it came,
    widened with acc_fp32), with store presented low and garbage accumulators; the latency is the full
    ALU's. The expected rows come from numerics.accumulate with no accumulator."""
    dut = SlotALU(64, store_only=True)
    assert dut.latency == SlotALU(64).latency
    rows = random_rows(64, list(DType), max(60, VECTORS // 4), seed=31)
    for r in rows:
        r.store = 1
    expect(rows, 64)
    assert any(r.acc32 for r in rows) and any(not r.acc32 for r in rows)
    for r in rows:
        r.store = 0                     # what the ALU is shown: it must not matter
    check(dut, rows)
