"""Floating-point all-reduce by host-side quantization (cais.quantize, docs/driver.md).

Unit tests of the quantizer with the switch's int32 sum done here in int64 (and checked to stay inside
int32), then end to end through the driver on the reference model (with loss) and once on the RTL.
"""

import math

import numpy as np
import pytest

from cais import quantize as qz
from cais.comm import World
from cais.config import Config
from cais.link import run_sync
from cais.params import SwitchParams
from cais.sim.backends import ModelLink, run_backend

ENTRY = "cais.sim.workload:all_reduce_job"
PER_CHUNK = 64                      # the driver's default: chunk_size 256 bytes / 4
FLOATS = (np.float16, np.float32, np.float64)
INT32_MAX = 2**31 - 1


def switch_sum(arrays, n=None, per_chunk=PER_CHUNK):
    """What the driver does, with the int32 collectives done here: (result, e_max, int64 sum of q)."""
    n = n or len(arrays)
    e_max = np.max([qz.chunk_exponents(a, per_chunk) for a in arrays], axis=0)
    qs = [qz.quantize(a, e_max, n, per_chunk).astype(np.int64) for a in arrays]
    total = np.sum(qs, axis=0)
    assert np.all(np.abs(total) <= INT32_MAX), "the int32 sum would overflow"
    return qz.dequantize(total.astype(np.int32), e_max, n, per_chunk, arrays[0].dtype), e_max, total


def exact_sum(arrays):
    stack = np.stack([a.reshape(-1).astype(np.float64) for a in arrays])
    return np.array([math.fsum(col) for col in stack.T])


def assert_within_bound(arrays, per_chunk=PER_CHUNK):
    result, e_max, _ = switch_sum(arrays, per_chunk=per_chunk)
    exact = exact_sum(arrays)
    bound = qz.sum_error_bound(e_max, len(arrays), per_chunk, arrays[0].dtype, exact)
    err = np.abs(result.astype(np.float64) - exact)
    assert np.all(err <= bound), (err.max(), bound[np.argmax(err - bound)])
    return err, bound


# ------------------------------------------------------------------------------------------ SUM
def test_exponent_per_chunk():
    x = np.zeros(3 * PER_CHUNK + 5, dtype=np.float32)
    x[3] = 1.0                      # 1 < 2**1
    x[PER_CHUNK + 7] = -0.75        # 0.75 < 2**0
    x[3 * PER_CHUNK + 1] = 3.0      # last, partial chunk
    assert list(qz.chunk_exponents(x, PER_CHUNK)) == [1, 0, qz.ZERO_CHUNK, 2]
    assert qz.chunk_exponents(np.zeros(0, np.float32), PER_CHUNK).size == 0


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", range(2, 17))
def test_no_overflow_at_the_extreme(dtype, n):
    """Every rank at the largest magnitude below 2**e (which rounds up to the quantum limit) and every
    rank at the edge of the dtype's range: the int32 sum stays in range, each |q| <= floor((2**31-1)/N)."""
    info = np.finfo(dtype)
    for top in (np.float64(1.0), np.float64(info.max), np.float64(info.smallest_subnormal) * 8):
        below = np.nextafter(dtype(top), dtype(0)) if top == 1.0 else dtype(top)
        for sign in (1, -1):
            arrays = [np.full(PER_CHUNK + 3, sign * below, dtype=dtype) for _ in range(n)]
            e_max = np.max([qz.chunk_exponents(a, PER_CHUNK) for a in arrays], axis=0)
            q = qz.quantize(arrays[0], e_max, n, PER_CHUNK).astype(np.int64)
            assert np.all(np.abs(q) <= INT32_MAX // n)
            assert np.all(np.abs(q) <= 2 ** (30 - qz.ceil_log2(n)))
            assert np.all(np.abs(n * q) <= INT32_MAX)
            if top == info.max:    # the exact sum is beyond the dtype's range: +-inf, as a float sum gives
                result = switch_sum(arrays)[0]
                assert np.all(np.isinf(result)) and np.all(np.sign(result) == sign)
            else:
                assert_within_bound(arrays)


@pytest.mark.parametrize("dtype,spreads", [(np.float32, (0, 8, 30, 100)), (np.float64, (0, 8, 60, 600)),
                                           (np.float16, (0, 4, 12))])
@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_error_within_bound(dtype, spreads, n):
    rng = np.random.default_rng(n)
    for spread in spreads:
        arrays = [(rng.standard_normal(5 * PER_CHUNK + 17) * np.ldexp(1.0, rng.integers(-spread, spread + 1,
                                                                                           5 * PER_CHUNK + 17)))
                  .astype(dtype) for _ in range(n)]
        err, bound = assert_within_bound(arrays)
        assert err.max() > 0   # the test is not vacuous
    # the quantization part of the bound, relative to 2**e_max, is N * 2**(k - 31) < N**2 * 2**-30
    assert n * 2.0 ** (qz.ceil_log2(n) - 31) < n * n * 2.0 ** -30


def test_bound_formula():
    e = np.array([0, 5, qz.ZERO_CHUNK], dtype=np.int32)
    b = qz.sum_error_bound(e, 4, 1, np.float64, np.zeros(3))
    tiny = np.finfo(np.float64).smallest_subnormal / 2
    assert b[0] - tiny == 4 * 2.0 ** (0 + 2 - 31) * (1 + np.finfo(np.float64).eps / 2)
    assert b[2] == tiny                             # all-zero chunk: only the (vanishing) cast term
    assert list(qz.chunk_shifts(e, 4)) == [28, 23, 0]   # s = 30 - ceil(log2 4) - e_max


@pytest.mark.parametrize("dtype", FLOATS)
def test_zero_chunks_and_signs(dtype):
    """All-zero chunks (sentinel exponent) give +0 exactly; x and -x cancel exactly; negatives work."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(3 * PER_CHUNK) * 10).astype(dtype)
    a[PER_CHUNK:2 * PER_CHUNK] = -0.0
    b = -a
    c = np.zeros_like(a)
    result, e_max, total = switch_sum([a, b, c])
    assert e_max[1] == qz.ZERO_CHUNK
    assert np.all(total == 0) and np.all(result == 0) and not np.signbit(result).any()
    neg = -np.abs(a)
    assert_within_bound([neg, neg, neg])
    assert np.all(switch_sum([neg, neg])[0] <= 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormal_inputs(dtype):
    info = np.finfo(dtype)
    tiny = np.float64(info.smallest_subnormal)
    rng = np.random.default_rng(7)
    arrays = [(tiny * rng.integers(-1000, 1000, 2 * PER_CHUNK)).astype(dtype) for _ in range(4)]
    assert np.any((arrays[0] != 0) & (np.abs(arrays[0]) < info.tiny))       # really subnormal
    err, _ = assert_within_bound(arrays)
    # quanta of 2**-s are far below the dtype's subnormal step here: the float64 result is exact
    result, e_max, total = switch_sum(arrays)
    assert np.all(qz.dequantize(total.astype(np.int32), e_max, 4, PER_CHUNK, np.float64) == exact_sum(arrays))
    # mixed with normal values in the same chunk: still within the bound
    arrays[1][::3] = dtype(1.5)
    assert_within_bound(arrays)


@pytest.mark.parametrize("bad,word", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf")])
def test_sum_refuses_nan_and_inf(bad, word):
    x = np.ones(10, dtype=np.float32)
    x[4] = bad
    with pytest.raises(ValueError, match=word):
        qz.chunk_exponents(x, PER_CHUNK)
    with pytest.raises(ValueError, match=word):
        qz.quantize(x, np.array([1], dtype=np.int32), 2, PER_CHUNK)


def test_quantize_checks_its_exponents():
    x = np.full(4, 3.0, dtype=np.float32)
    with pytest.raises(ValueError, match="e_max"):
        qz.quantize(x, np.array([1], dtype=np.int32), 2, PER_CHUNK)    # 3 is not < 2**1
    with pytest.raises(ValueError, match="all zeros"):
        qz.quantize(x, np.array([qz.ZERO_CHUNK], dtype=np.int32), 2, PER_CHUNK)


# ------------------------------------------------------------------------------------------ MAX / MIN
SPECIALS = [-np.inf, -np.finfo(np.float32).max, -1.5, -np.finfo(np.float32).tiny, -1e-45, -0.0, 0.0, 1e-45,
            np.finfo(np.float32).tiny, 1.0, 1.5, np.finfo(np.float32).max, np.inf]


def test_order_keys_are_monotone():
    x = np.array(SPECIALS, dtype=np.float32)
    keys = qz.order_keys(x)
    assert np.all(np.diff(keys.astype(np.int64)) > 0)          # strictly increasing, -0 just below +0
    assert list(keys[5:7]) == [-1, 0]
    back = qz.from_order_keys(keys, np.float32)
    assert np.array_equal(back.view(np.int32), x.view(np.int32))
    hi, lo = qz.order_keys64(x.astype(np.float64))
    pairs = list(zip(hi.tolist(), lo.tolist()))
    assert pairs == sorted(pairs) and len(set(pairs)) == len(pairs)
    assert np.array_equal(qz.from_order_keys64(hi, lo).view(np.int64), x.astype(np.float64).view(np.int64))


def _extreme(arrays, op_is_max):
    """The driver's MAX/MIN with the int32 reductions done here."""
    red = np.max if op_is_max else np.min
    dtype = arrays[0].dtype
    if dtype == np.float64:
        words = [qz.order_keys64(a) for a in arrays]
        hi = red([w[0] for w in words], axis=0)
        lo = red([qz.tied_low_keys(w[0], w[1], hi, op_is_max) for w in words], axis=0)
        return qz.from_order_keys64(hi, lo)
    return qz.from_order_keys(red([qz.order_keys(a) for a in arrays], axis=0), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_exact(dtype):
    rng = np.random.default_rng(11)
    info = np.finfo(dtype)
    specials = np.array([-np.inf, -info.max, -1.5, -info.tiny, -info.smallest_subnormal, -0.0, 0.0,
                         info.smallest_subnormal, info.tiny, 1.0, 1.5, info.max, np.inf], dtype=dtype)
    for n in (2, 3, 5):
        arrays = []
        for _ in range(n):
            a = (rng.standard_normal(500) * np.ldexp(1.0, rng.integers(-12, 12, 500))).astype(dtype)
            a[:len(specials)] = rng.permutation(specials)
            # values a few ulps apart: float64's differ only in the low word of the key (the second step)
            a[-20:] = 1.0 + rng.integers(-3, 4, 20) * info.eps
            arrays.append(a)
        stack = np.stack(arrays)
        for op_is_max in (True, False):
            got = _extreme(arrays, op_is_max)
            want = stack.max(0) if op_is_max else stack.min(0)
            assert got.dtype == dtype and np.array_equal(got, want)   # numerically exact (-0 == +0 here)


@pytest.mark.parametrize("dtype", FLOATS)
def test_signed_zeros(dtype):
    """MAX(-0, +0) = +0 and MIN(-0, +0) = -0 (IEEE 754-2019 maximum/minimum), in either order."""
    a = np.array([-0.0, 0.0, -0.0, 0.0], dtype=dtype)
    b = np.array([0.0, -0.0, -0.0, 0.0], dtype=dtype)
    assert list(np.signbit(_extreme([a, b], True))) == [False, False, True, False]
    assert list(np.signbit(_extreme([a, b], False))) == [True, True, True, False]


def test_max_min_refuse_nan_allow_inf():
    x = np.array([1.0, np.nan], dtype=np.float32)
    with pytest.raises(ValueError, match="NaN"):
        qz.order_keys(x)
    with pytest.raises(ValueError, match="NaN"):
        qz.order_keys64(x.astype(np.float64))
    inf = np.array([np.inf, -np.inf], dtype=np.float16)
    assert np.array_equal(_extreme([inf, inf[::-1]], True), [np.inf, np.inf])


# ------------------------------------------------------------------------------------------ the driver
def _world(ranks, **config):
    return World(ModelLink(SwitchParams(ports=4)), ranks=ranks,
                 config=Config(**{"offload": "always", "float_mode": "quantize", **config}))


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype", FLOATS)
def test_driver_float_sum_and_extremes(ranks, dtype):
    rng = np.random.default_rng(ranks)
    data = [(rng.standard_normal((3, 250)) * np.ldexp(1.0, rng.integers(-6, 7, (3, 250)))).astype(dtype)
            for _ in range(ranks)]
    ops = ("sum", "max", "min") if dtype == np.float32 else ("sum",)

    def fn(comm):
        out = {op: comm.all_reduce(data[comm.rank], op=op) for op in ops}
        work = comm.all_reduce(data[comm.rank], async_op=True)
        assert work.is_completed()         # float collectives run their steps before returning
        out["async"] = work.wait()
        out["path"] = work.path
        return out

    results = run_sync(_world(ranks).run(fn))
    flat = [d.reshape(-1) for d in data]
    want_sum, e_max, _ = switch_sum(flat)
    bound = qz.sum_error_bound(e_max, ranks, PER_CHUNK, dtype, exact_sum(flat))
    for r in results:
        assert r["sum"].dtype == dtype and r["sum"].shape == (3, 250)
        assert np.array_equal(r["sum"].reshape(-1), want_sum) and np.array_equal(r["async"], r["sum"])
        assert np.all(np.abs(r["sum"].reshape(-1).astype(np.float64) - exact_sum(flat)) <= bound)
        assert r["path"] == "switch"
        if dtype == np.float32:
            assert np.array_equal(r["max"], np.max(data, axis=0)) and np.array_equal(r["min"], np.min(data, axis=0))


def test_driver_group_of_three_and_ring():
    """N is the group's size (3: not a power of two), and the host ring gives the same bits."""
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(300).astype(np.float32) for _ in range(4)]

    def fn(comm):
        trio = comm.new_group([0, 1, 2]) if comm.rank < 3 else None
        return comm.all_reduce(data[comm.rank], group=trio) if trio else None

    want = switch_sum(data[:3])[0]
    for offload in ("always", "never"):
        results = run_sync(_world(4, offload=offload).run(fn))
        assert all(np.array_equal(r, want) for r in results[:3]) and results[3] is None


def test_driver_refuses_other_dtypes_and_nan():
    def bad_dtype(comm):
        comm.all_reduce(np.zeros(3, dtype=np.int64))

    def nan(comm):
        comm.all_reduce(np.full(3, np.nan, dtype=np.float32))

    with pytest.raises(TypeError, match="int64"):
        run_sync(_world(2).run(bad_dtype))
    with pytest.raises(ValueError, match="NaN"):
        run_sync(_world(2).run(nan))


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float16", "sum"), ("float64", "sum"),
                                      ("float32", "max"), ("float32", "min"), ("float64", "max")])
def test_workload_with_loss(ranks, dtype, op):
    job = {"ranks": ranks, "elements": 2000, "op": op, "dtype": dtype, "seed": 4, "loss": 0.05,
           "collectives": 2, "config": {"offload": "always", "float_mode": "quantize"}}
    s = run_backend("model", SwitchParams(ports=4), ENTRY, job)
    assert s["correct"], s
    assert s["dtype"] == dtype and s["paths"] == ["switch"] and sum(s["retransmissions"]) > 0
    assert s["max_error"] <= s["max_bound"] and s["max_error_over_bound"] <= 1.0
    if op != "sum":
        assert s["max_error"] == 0.0


@pytest.mark.verilator
def test_rtl_float_sum():
    job = {"ranks": 4, "elements": 300, "op": "sum", "dtype": "float32", "seed": 2,
           "config": {"offload": "always", "float_mode": "quantize"}}
    rtl = run_backend("verilator", SwitchParams(ports=4), ENTRY, job)     # the default build, shared
    model = run_backend("model", SwitchParams(ports=4), ENTRY, job)
    assert rtl["correct"] and rtl["paths"] == ["switch"], rtl
    assert rtl["result_sha256"] == model["result_sha256"]
