"""Floating-point all-reduce over an int32 switch: host-side quantization, as SwitchML does.

Pure functions, no I/O. :meth:`cais.comm.Communicator.all_reduce` strings them together around the
int32 collectives; docs/driver.md ("Floating-point arrays") has the derivations in prose.

SUM (float16, float32, float64), two int32 collectives on the same group:

1. Each rank cuts its array into chunks of ``elements_per_chunk`` elements (the driver's chunks:
   ``chunk_size // 4``) and computes per chunk the exponent ``e`` with ``max |x| < 2**e``
   (:func:`chunk_exponents`; an all-zero chunk gives :data:`ZERO_CHUNK`).
2. An int32 MAX all-reduce of those exponents gives every rank the same ``e_max`` per chunk.
3. With ``k = ceil(log2 N)`` for N ranks, the chunk's shift is ``s = 30 - k - e_max``
   (:func:`chunk_shifts`) and each rank sends ``q = rint(x * 2**s)`` (round half to even) in an
   int32 SUM all-reduce (:func:`quantize`).
   No overflow: ``|x| < 2**e_max``, so ``|x * 2**s| < 2**(30 - k)``, an integer, hence
   ``|q| <= 2**(30 - k) <= floor((2**31 - 1) / N)`` and any partial sum of at most ``N <= 2**k`` of
   them is at most ``2**30 < 2**31 - 1`` in magnitude, whatever order the switch or the ring adds them in.
4. The result is ``q_sum * 2**-s`` in float64 (exact: ``|q_sum| <= 2**30``, apart from float64's own
   subnormal range), cast to the input dtype (:func:`dequantize`).
   Error: each ``q`` is off by at most half a quantum ``2**-s``, so before the cast
   ``|r - exact| <= N * 2**(-s - 1) = N * 2**(e_max + k - 31)``, i.e. at most ``N * 2**k * 2**-31 < N**2 * 2**-30``
   relative to ``2**e_max`` (the chunk's largest magnitude is at least ``2**(e_max - 1)``); the cast adds
   at most half an ulp of the output dtype (:func:`sum_error_bound`). A result beyond the dtype's range
   becomes +-inf, as a sum in that dtype would. Sums that are zero come out as +0.

NaN and +-inf cannot be carried by integers: SUM refuses them with ValueError (checked before any
frame is sent; every rank with such data raises).

MAX / MIN, exact, through order-preserving int32 keys (no scaling):

* float32 (and float16, widened to float32 exactly): the bit pattern ``b`` as int32, with the magnitude
  bits flipped when the sign is set (``b ^ 0x7FFFFFFF`` for ``b < 0``), orders like the floats
  (:func:`order_keys`); an int32 MAX/MIN of the keys is the float MAX/MIN, decoded by the same map.
  +-inf are ordinary keys (allowed). -0 orders below +0: MAX(-0, +0) = +0 and MIN(-0, +0) = -0 (IEEE
  754-2019 maximum/minimum). NaN is refused with ValueError.
* float64, also exact, in two int32 collectives: the 64-bit key's high word (signed) is reduced first,
  then the low word (offset to signed) of the ranks whose high word won; the others send the
  identity (INT32_MIN for MAX, INT32_MAX for MIN) (:func:`order_keys64`, :func:`tied_low_keys`,
  :func:`from_order_keys64`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["FLOAT_DTYPES", "ZERO_CHUNK", "check_finite", "check_no_nan", "chunk_exponents", "ceil_log2",
           "chunk_shifts", "quantize", "dequantize", "sum_error_bound", "order_keys", "from_order_keys",
           "order_keys64", "tied_low_keys", "from_order_keys64"]

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: Exponent of an all-zero chunk: below every real exponent (float64's smallest is -1073), so a MAX
#: over ranks ignores it, and far from int32's limits.
ZERO_CHUNK = -(2**30)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _float_dtype(x: np.ndarray) -> np.dtype:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"expected a float16, float32 or float64 array, not {x.dtype}")
    return x.dtype


def check_finite(x: np.ndarray) -> None:
    """Refuse NaN and +-inf (SUM): a quantized integer cannot carry them."""
    _float_dtype(x)
    if np.isnan(x).any():
        raise ValueError("all_reduce sum of a float array with NaN: integers through the switch cannot carry NaN")
    if np.isinf(x).any():
        raise ValueError("all_reduce sum of a float array with inf: integers through the switch cannot carry inf")


def check_no_nan(x: np.ndarray) -> None:
    """Refuse NaN (MAX/MIN; +-inf are fine there)."""
    _float_dtype(x)
    if np.isnan(x).any():
        raise ValueError("all_reduce max/min of a float array with NaN: NaN has no place in the order")


def _chunk_of(n: int, elements_per_chunk: int) -> tuple[int, np.ndarray]:
    """(chunk count, chunk index of every element)."""
    if elements_per_chunk < 1:
        raise ValueError(f"elements_per_chunk={elements_per_chunk}: must be at least 1")
    return -(-n // elements_per_chunk), np.arange(n) // elements_per_chunk


def chunk_exponents(x: np.ndarray, elements_per_chunk: int) -> np.ndarray:
    """Per chunk of `elements_per_chunk` elements: int32 ``e`` with ``max |x| < 2**e`` (``max |x| >=
    2**(e-1)``), or :data:`ZERO_CHUNK` if the chunk is all zeros. Refuses NaN/inf (ValueError)."""
    check_finite(x)
    flat = np.abs(x.reshape(-1).astype(np.float64))
    nchunks, _ = _chunk_of(flat.size, elements_per_chunk)
    pad = np.zeros(nchunks * elements_per_chunk)
    pad[:flat.size] = flat
    peak = pad.reshape(nchunks, elements_per_chunk).max(axis=1) if nchunks else pad[:0]
    _, e = np.frexp(peak)                    # peak = m * 2**e, 0.5 <= m < 1 (exact for subnormals too)
    return np.where(peak > 0, e, ZERO_CHUNK).astype(np.int32)


def ceil_log2(n: int) -> int:
    """``k = ceil(log2 n)``: the smallest k with ``n <= 2**k``."""
    if n < 1:
        raise ValueError(f"n={n}: at least one rank")
    return (n - 1).bit_length()


def chunk_shifts(e_max: np.ndarray, n: int) -> np.ndarray:
    """The shift ``s = 30 - ceil(log2 n) - e_max`` per chunk (0 for all-zero chunks): ``q = rint(x * 2**s)``."""
    e_max = np.asarray(e_max, dtype=np.int64)
    return np.where(e_max == ZERO_CHUNK, 0, 30 - ceil_log2(n) - e_max)


def quantize(x: np.ndarray, e_max: np.ndarray, n: int, elements_per_chunk: int) -> np.ndarray:
    """int32 ``rint(x * 2**s)`` (round half to even) with the chunk's shift from the group-wide `e_max`
    and `n` ranks; ``|q| <= 2**(30 - ceil(log2 n))``, so n of them sum without overflow."""
    check_finite(x)
    flat = x.reshape(-1).astype(np.float64)
    _, chunk = _chunk_of(flat.size, elements_per_chunk)
    e_max = np.asarray(e_max, dtype=np.int64)
    s = chunk_shifts(e_max, n)[chunk]
    if ((flat != 0) & (e_max[chunk] == ZERO_CHUNK)).any():
        raise ValueError("quantize: a non-zero element in a chunk whose agreed exponent says all zeros")
    q = np.rint(np.ldexp(flat, s))           # exact scaling by a power of two, then round half to even
    limit = 2.0 ** (30 - ceil_log2(n))
    if (np.abs(q) > limit).any():
        raise ValueError("quantize: an element is not below 2**e_max of its chunk (e_max too small)")
    return q.astype(np.int32)


def dequantize(q_sum: np.ndarray, e_max: np.ndarray, n: int, elements_per_chunk: int, dtype) -> np.ndarray:
    """``q_sum * 2**-s`` in float64, cast to `dtype` (+-inf beyond its range)."""
    q = np.asarray(q_sum).reshape(-1)
    _, chunk = _chunk_of(q.size, elements_per_chunk)
    s = chunk_shifts(e_max, n)[chunk]
    with np.errstate(over="ignore"):
        return np.ldexp(q.astype(np.float64), -s).astype(dtype)


def sum_error_bound(e_max: np.ndarray, n: int, elements_per_chunk: int, dtype, exact: np.ndarray) -> np.ndarray:
    """Per element, the largest ``|result - exact_sum|`` the SUM path can give (finite results).

    ``B = n * 2**(-s-1) = n * 2**(e_max + k - 31)`` (0 in all-zero chunks) for the quantization, plus the
    final rounding to `dtype` (and float64's own, in its subnormal range): ``u * (|exact| + B) + tiny / 2``
    with ``u = eps / 2`` the dtype's unit roundoff and ``tiny`` its smallest subnormal.
    """
    exact = np.abs(np.asarray(exact, dtype=np.float64).reshape(-1))
    _, chunk = _chunk_of(exact.size, elements_per_chunk)
    e = np.asarray(e_max, dtype=np.int64)[chunk]
    b = np.where(e == ZERO_CHUNK, 0.0, np.ldexp(float(n), np.where(e == ZERO_CHUNK, 0, e + ceil_log2(n) - 31)))
    info = np.finfo(dtype)
    return b + float(info.eps) / 2 * (exact + b) + float(info.smallest_subnormal) / 2


# ---------------------------------------------------------------------------------------- MAX / MIN
def order_keys(x: np.ndarray) -> np.ndarray:
    """int32 keys that order like the float16/float32 values (-0 just below +0; +-inf at the ends)."""
    if _float_dtype(x) == np.float64:
        raise TypeError("order_keys: float64 takes two words, use order_keys64")
    check_no_nan(x)
    b = x.reshape(-1).astype(np.float32).view(np.int32)
    return np.where(b < 0, b ^ np.int32(0x7FFFFFFF), b).astype(np.int32)


def from_order_keys(keys: np.ndarray, dtype) -> np.ndarray:
    """The floats of :func:`order_keys` keys (the map is its own inverse), as `dtype` (exact)."""
    k = np.asarray(keys, dtype=np.int32)
    return np.where(k < 0, k ^ np.int32(0x7FFFFFFF), k).astype(np.int32).view(np.float32).astype(dtype)


def order_keys64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 -> (high, low) int32 words of a 64-bit order key; (high, low) order lexicographically
    like the floats (both as signed int32: the low word is offset by 2**31)."""
    if _float_dtype(x) != np.float64:
        raise TypeError("order_keys64: float64 only")
    check_no_nan(x)
    b = x.reshape(-1).view(np.int64)
    key = np.where(b < 0, b ^ np.int64(0x7FFF_FFFF_FFFF_FFFF), b)
    hi = (key >> 32).astype(np.int32)
    lo = ((key & 0xFFFF_FFFF) - 2**31).astype(np.int32)
    return hi, lo


def tied_low_keys(hi: np.ndarray, lo: np.ndarray, hi_reduced: np.ndarray, op_is_max: bool) -> np.ndarray:
    """A rank's second-step words: its low word where its high word won, else the identity of the op."""
    identity = _INT32_MIN if op_is_max else _INT32_MAX
    return np.where(hi == np.asarray(hi_reduced).reshape(-1), lo, np.int32(identity)).astype(np.int32)


def from_order_keys64(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """The float64 values of reduced (high, low) key words."""
    key = (np.asarray(hi, dtype=np.int64).reshape(-1) << 32) | (np.asarray(lo, dtype=np.int64).reshape(-1) + 2**31)
    b = np.where(key < 0, key ^ np.int64(0x7FFF_FFFF_FFFF_FFFF), key)
    return b.astype(np.int64).view(np.float64)
