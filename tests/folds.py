"""Independent numpy references for the driver's tests: reductions folded in a given order.

Plain numpy arithmetic in the wire type (float32 / float16 additions and np.maximum / np.minimum with the
accumulator as first operand, as a switch slot or a ring partial combines); bf16 goes through float32 with
cais.numerics' bit conversions only (numpy has no bf16). Every NaN-free input gives the exact bits the
switch and the host ring are specified to give.
"""

import numpy as np

from cais import numerics
from cais import protocol as proto

SUM, MAX, MIN = proto.ReduceOp.SUM, proto.ReduceOp.MAX, proto.ReduceOp.MIN


def _f(op, a, b):
    if op == SUM:
        return a + b
    return np.maximum(a, b) if op == MAX else np.minimum(a, b)


def fold(arrays, op, dtype, acc_fp32=False, saturate=False):
    """``((x0 op x1) op x2) ...`` in the order given, in the wire type `dtype` (a DType); bf16 arrays are
    uint16 bits; with `acc_fp32` (fp16/bf16) accumulated in float32 and rounded once at the end (for
    MAX/MIN that changes only which zero a -0/+0 tie keeps: float32's rule instead of float16's)."""
    op = proto.ReduceOp[op.upper()] if isinstance(op, str) else proto.ReduceOp(op)
    dtype = proto.DType(dtype)
    if dtype in (proto.DType.INT32, proto.DType.INT16, proto.DType.INT8):
        t = arrays[0].dtype
        info = np.iinfo(t)
        acc = arrays[0].astype(np.int64)
        for a in arrays[1:]:
            acc = _f(op, acc, a.astype(np.int64))
            if op == SUM:
                acc = np.clip(acc, info.min, info.max) if saturate else (acc - info.min) % (1 << 8 * t.itemsize) + info.min
        return acc.astype(t)
    wide = acc_fp32
    if dtype == proto.DType.BF16:
        vals = [numerics.bf16_to_f32(a) for a in arrays]
        acc = vals[0]
        for v in vals[1:]:
            acc = _f(op, acc, v)
            if not wide:
                acc = numerics.bf16_to_f32(numerics.f32_to_bf16(acc))
        return numerics.f32_to_bf16(acc)
    if dtype == proto.DType.FP16 and wide:
        acc = arrays[0].astype(np.float32)
        for a in arrays[1:]:
            acc = _f(op, acc, a.astype(np.float32))
        return acc.astype(np.float16)
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = _f(op, acc, a)
    return acc


def ring_fold(arrays, op, dtype, saturate=False):
    """The host ring's result (docs/ring.md): block b (np.array_split rule) is the fold of the ranks'
    block b in ring order starting at rank b, rounded to the wire type at every step."""
    n = len(arrays)
    out = np.empty_like(arrays[0])
    for b, idx in enumerate(np.array_split(np.arange(len(arrays[0])), n)):
        if idx.size:
            out[idx] = fold([arrays[(b + j) % n][idx] for j in range(n)], op, dtype, saturate=saturate)
    return out


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
