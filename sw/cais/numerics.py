"""The element arithmetic of the switch, in numpy: the reference the RTL is checked against.

One definition of what a reduction does to the elements of a payload (docs/numerics.md is its prose):

* int32, int16, int8: SUM wraps modulo 2**bits, or with ``saturate`` clamps to the type's range; MAX/MIN
  compare as signed.
* fp32, fp16: numpy's own ``+``, ``maximum``, ``minimum`` on float32 / float16 (IEEE 754, round to nearest
  even, subnormals kept; numpy computes a float16 sum in float32 and rounds once, which is exact because
  24 >= 2 * 11 + 2 bits), except that every NaN result is the canonical quiet NaN of the format.
* bf16 (no numpy type): widened exactly to float32, combined there, rounded to bf16 to nearest even (so
  max/min treat +-0 like float32, and a sum is correctly rounded: 24 >= 2 * 8 + 2).
* ``acc_fp32`` (fp16/bf16 only): the slot keeps float32 accumulators (:func:`widen` of each
  contribution, combined as fp32) and :func:`narrow` rounds once when the result leaves.

Payloads are big-endian on the wire. The arithmetic works on *values*: int arrays, float32/float16
arrays, and bf16 as uint16 bit patterns; :func:`decode` and :func:`encode` convert from and to the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .protocol import DType, ReduceOp, numpy_dtype

__all__ = ["QNAN_BITS", "NATIVE", "native_dtype", "wire_dtype", "widens", "acc_dtype", "FloatFormat", "FLOAT_FORMATS",
           "decode", "encode", "combine", "widen", "narrow", "accumulate", "fold", "result_values",
           "bf16_to_f32", "f32_to_bf16"]

# Canonical quiet NaN of each float format: sign 0, exponent all ones, fraction 1 0..0.
QNAN_BITS = {DType.FP32: 0x7FC0_0000, DType.FP16: 0x7E00, DType.BF16: 0x7FC0}
_INT = {DType.INT32: np.int32, DType.INT16: np.int16, DType.INT8: np.int8}
# The numpy type of the values of each wire type (what decode returns; bf16: uint16 bit patterns, as numpy
# has no bfloat16). The wire's own, big-endian, type is cais.protocol.numpy_dtype.
NATIVE = {DType.INT32: np.dtype(np.int32), DType.INT16: np.dtype(np.int16), DType.INT8: np.dtype(np.int8),
          DType.FP32: np.dtype(np.float32), DType.FP16: np.dtype(np.float16), DType.BF16: np.dtype(np.uint16)}
# uint16 is left out: bf16 bits must be named explicitly, a uint16 array is not taken for bf16
_BY_NUMPY = {t: d for d, t in NATIVE.items() if d != DType.BF16}


def native_dtype(dtype: DType) -> np.dtype:
    """The numpy type of the values of wire type `dtype` (bf16: uint16 bit patterns)."""
    return NATIVE[DType(dtype)]


def wire_dtype(array_dtype) -> DType | None:
    """The wire type whose values a numpy array of `array_dtype` holds (None: no unambiguous one)."""
    return _BY_NUMPY.get(np.dtype(array_dtype).newbyteorder("="))


def widens(dtype: DType, acc_fp32: bool) -> bool:
    """Whether a slot accumulates in float32: ``acc_fp32`` means something for fp16/bf16 only."""
    return bool(acc_fp32) and dtype in (DType.FP16, DType.BF16)


def acc_dtype(dtype: DType, acc_fp32: bool = False) -> np.dtype:
    """The numpy type of a slot's accumulator: float32 when it :func:`widens`, else the values'."""
    return np.dtype(np.float32) if widens(dtype, acc_fp32) else native_dtype(dtype)


@dataclass(frozen=True)
class FloatFormat:
    """A binary IEEE 754 interchange format: `width` bits, `m` significand bits (with the hidden one)."""
    width: int
    m: int

    @property
    def exp_bits(self) -> int:
        return self.width - self.m

    @property
    def emax(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        return 1 - self.emax

    @property
    def etiny(self) -> int:
        """The exponent of the smallest subnormal."""
        return self.emin - self.m + 1

    @property
    def tiny(self) -> float:
        """The smallest subnormal."""
        return 2.0 ** self.etiny

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def max(self) -> float:
        """The largest finite value."""
        return (2 - 2.0 ** (1 - self.m)) * 2.0 ** self.emax

    @property
    def exp_mask(self) -> int:
        """The exponent field of a bit pattern."""
        return ((1 << self.exp_bits) - 1) << (self.m - 1)

    @property
    def bits_type(self) -> np.dtype:
        """The unsigned numpy type of a bit pattern."""
        return np.dtype(f"uint{self.width}")


FLOAT_FORMATS = {DType.FP32: FloatFormat(32, 24), DType.FP16: FloatFormat(16, 11), DType.BF16: FloatFormat(16, 8)}


def decode(dtype: DType, payload: bytes) -> np.ndarray:
    """Wire bytes -> values (native byte order; bf16 as uint16 bits)."""
    return np.frombuffer(bytes(payload), dtype=numpy_dtype(dtype)).astype(native_dtype(dtype))


def encode(dtype: DType, values: np.ndarray) -> bytes:
    """Values -> wire bytes."""
    return np.asarray(values, dtype=native_dtype(dtype)).astype(numpy_dtype(dtype)).tobytes()


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact: a bf16 is the top half of a float32 (NaN becomes the canonical float32 NaN)."""
    f = (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)
    return _canonical(f, DType.FP32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even; overflow gives infinity, NaN the canonical NaN."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(QNAN_BITS[DType.BF16]), rounded).astype(np.uint16)


def _canonical(values: np.ndarray, fmt: DType) -> np.ndarray:
    values = np.asarray(values)
    nan = np.isnan(values)
    if not nan.any():
        return values
    bits_type = np.uint32 if values.dtype == np.float32 else np.uint16
    out = values.copy()
    out.view(bits_type)[nan] = QNAN_BITS[fmt]
    return out


def widen(dtype: DType, values: np.ndarray) -> np.ndarray:
    """fp16/bf16 values -> float32, exactly (NaN canonical)."""
    dtype = DType(dtype)
    if dtype == DType.FP16:
        return _canonical(np.asarray(values, dtype=np.float16).astype(np.float32), DType.FP32)
    if dtype == DType.BF16:
        return bf16_to_f32(values)
    raise ValueError(f"dtype={dtype!r}: only fp16 and bf16 are widened")


def narrow(dtype: DType, values: np.ndarray) -> np.ndarray:
    """float32 -> fp16/bf16 values, round to nearest even, once (NaN canonical)."""
    dtype = DType(dtype)
    with np.errstate(over="ignore"):
        if dtype == DType.FP16:
            return _canonical(np.asarray(values, dtype=np.float32).astype(np.float16), DType.FP16)
    if dtype == DType.BF16:
        return f32_to_bf16(values)
    raise ValueError(f"dtype={dtype!r}: only fp16 and bf16 are narrowed")


def _float_op(op: ReduceOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if op == ReduceOp.SUM:
            return a + b
        if op == ReduceOp.MAX:
            return np.maximum(a, b)
        if op == ReduceOp.MIN:
            return np.minimum(a, b)
    raise ValueError(f"red_op={op!r}: not a reduction")


def combine(dtype: DType, op: ReduceOp, a: np.ndarray, b: np.ndarray, saturate: bool = False) -> np.ndarray:
    """``a op b`` element by element in the wire format (``a`` the stored values, ``b`` the incoming)."""
    dtype, op = DType(dtype), ReduceOp(op)
    if dtype in _INT:
        t = _INT[dtype]
        a64, b64 = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if op == ReduceOp.MAX:
            return np.maximum(a64, b64).astype(t)
        if op == ReduceOp.MIN:
            return np.minimum(a64, b64).astype(t)
        if op != ReduceOp.SUM:
            raise ValueError(f"red_op={op!r}: not a reduction")
        info = np.iinfo(t)
        total = a64 + b64
        if saturate:
            return np.clip(total, info.min, info.max).astype(t)
        bits = 8 * np.dtype(t).itemsize
        return (((total - info.min) % (1 << bits)) + info.min).astype(t)
    if dtype == DType.FP32:
        return _canonical(_float_op(op, np.asarray(a, np.float32), np.asarray(b, np.float32)), DType.FP32)
    if dtype == DType.FP16:
        return _canonical(_float_op(op, np.asarray(a, np.float16), np.asarray(b, np.float16)), DType.FP16)
    if dtype == DType.BF16:
        return f32_to_bf16(_float_op(op, bf16_to_f32(a), bf16_to_f32(b)))
    raise ValueError(f"dtype={dtype!r}: not an element type")


def accumulate(dtype: DType, op: ReduceOp, acc: np.ndarray | None, values: np.ndarray, *,
               acc_fp32: bool = False, saturate: bool = False) -> np.ndarray:
    """One contribution into a slot's accumulator: ``values`` (wire values) into ``acc`` (None: empty).

    The accumulator is in the wire format, or float32 with ``acc_fp32`` for fp16/bf16; the first
    contribution is stored as it came (widened with ``acc_fp32``).
    """
    dtype = DType(dtype)
    if widens(dtype, acc_fp32):
        wide = widen(dtype, values)
        return wide if acc is None else combine(DType.FP32, op, acc, wide)
    if acc is None:
        return np.array(values, dtype=NATIVE[dtype])
    return combine(dtype, op, acc, values, saturate)


def fold(dtype: DType, op: ReduceOp, contributions, *, acc_fp32: bool = False,
         saturate: bool = False) -> np.ndarray:
    """The accumulator of a set that took ``contributions`` in the order given: the first as it came,
    each further one combined (:func:`accumulate`); :func:`result_values` gives what leaves the switch."""
    acc = None
    for values in contributions:
        acc = accumulate(dtype, op, acc, values, acc_fp32=acc_fp32, saturate=saturate)
    return acc


def result_values(dtype: DType, acc: np.ndarray, *, acc_fp32: bool = False) -> np.ndarray:
    """The accumulator as it leaves the switch, in the wire format's values."""
    dtype = DType(dtype)
    if widens(dtype, acc_fp32):
        return narrow(dtype, acc)
    return np.asarray(acc, dtype=NATIVE[dtype])
