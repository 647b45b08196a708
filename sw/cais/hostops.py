"""The collectives the switch has no operation for, made of the ones it has (docs/torch.md, "Paths").

The switch reduces int32/int16/int8/fp32/fp16/bf16 with SUM, MAX and MIN and forwards broadcast and
all-gather frames. Everything else is composed here, once, over a small set of *primitives* that both the
deployed driver (:mod:`cais.dist`) and the in-process co-simulation (:class:`cais.comm.Communicator`,
through :class:`CommPrimitives`) offer:

* int64 all-reduce, exactly: SUM/AVG as four 16-bit limbs in int32 lanes (exact for groups of fewer than
  32768 ranks; the sum wraps modulo 2**64 as int64 arithmetic does), MAX/MIN as a high and a tied low
  int32 word (two switch all-reduces);
* PRODUCT, the bitwise ops (BAND, BOR, BXOR), float64 SUM/AVG and any other exact-or-nothing case:
  an all-gather of every rank's bytes (forwarded by the switch), then the same fold in group order on
  every rank, so every rank gets the same bits (:func:`fold_all_reduce`);
* reduce, gather, scatter, all_to_all, send/recv: an all-reduce, all-gather or broadcast and a local
  selection (send/recv use a two-rank group made on first use, as NCCL makes its point-to-point
  communicators, and check first that the two calls match: a send blocks until the peer's recv);
* :func:`check_consistent`: one two-element int32 MAX all-reduce that tells whether every rank of the
  group called the same collective with the same shape and type (else every rank raises, no hang).

All of them are blocking and write their result in place.

Primitives (what an object passed as `p` offers): ``rank``; ``group_ranks(group)`` (global ranks in group
order); ``all_reduce(arr, op, group)`` for the wire types, op "sum", "max", "min" or "avg" (returns
the path it took, "switch" or "ring");
``broadcast(arr, src, group)`` (src a global rank); ``all_gather(out, arr, group)`` (out of shape
``(n, *arr.shape)``); ``new_group(ranks)``.
"""

from __future__ import annotations

import zlib

import numpy as np

from .dist import _avg
from .numerics import wire_dtype

__all__ = ["FOLD_OPS", "fold_all_reduce", "int64_all_reduce", "reduce", "gather", "scatter", "all_to_all",
           "send", "recv", "check_consistent", "signature", "CommPrimitives", "ShapeMismatch", "LIMB_BITS",
           "MAX_LIMB_RANKS"]

LIMB_BITS = 16                      # int64 SUM: 4 limbs; n * (2**16 - 1) must fit in int32
MAX_LIMB_RANKS = (2**31 - 1) // (2**LIMB_BITS - 1)

# local folds of :func:`fold_all_reduce`, applied in group order
FOLD_OPS = {
    "sum": np.add, "avg": np.add, "product": np.multiply, "max": np.maximum, "min": np.minimum,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}


class ShapeMismatch(ValueError):
    """The ranks of a group called different collectives, or the same one with different shapes or types."""


def _index(p, group) -> tuple[list[int], int]:
    ranks = list(p.group_ranks(group))
    return ranks, ranks.index(p.rank)


def fold_all_reduce(p, arr: np.ndarray, op: str, group=None) -> None:
    """All-reduce `arr` (any numpy type) in place by gathering every rank's values and folding them in
    group order: exact and identical on every rank (floats: the same rounding everywhere). AVG divides the
    sum by the group size (integers truncated toward zero)."""
    if op not in FOLD_OPS:
        raise ValueError(f"op {op!r}: expected one of {', '.join(FOLD_OPS)}")
    if op.startswith("b") and arr.dtype.kind not in "iub":
        raise TypeError(f"{op.upper()} is a bitwise op: integer or bool tensors only, not {arr.dtype}")
    ranks, _ = _index(p, group)
    stacked = np.empty((len(ranks),) + arr.shape, arr.dtype)
    p.all_gather(stacked, arr, group)
    acc = stacked[0].copy()
    fold = FOLD_OPS[op]
    with np.errstate(over="ignore"):
        for row in stacked[1:]:
            acc = fold(acc, row).astype(arr.dtype)
    if op == "avg":
        acc = _avg(acc, len(ranks), None)
    arr[...] = acc


def int64_all_reduce(p, arr: np.ndarray, op: str, group=None) -> None:
    """All-reduce an int64 array in place through the switch's int32 lanes, exactly (module docstring)."""
    if arr.dtype != np.int64:
        raise TypeError(f"int64_all_reduce: int64 arrays only, not {arr.dtype}")
    ranks, _ = _index(p, group)
    flat = arr.reshape(-1)
    if op in ("sum", "avg"):
        if len(ranks) > MAX_LIMB_RANKS:
            raise ValueError(f"int64 SUM over {len(ranks)} ranks: the limb sums are exact for at most "
                             f"{MAX_LIMB_RANKS} ranks")
        u = flat.view(np.uint64)
        mask = np.uint64((1 << LIMB_BITS) - 1)
        limbs = np.stack([((u >> np.uint64(LIMB_BITS * k)) & mask).astype(np.int32) for k in range(4)])
        p.all_reduce(limbs, "sum", group)
        total = np.zeros(flat.size, np.uint64)
        with np.errstate(over="ignore"):
            for k in range(4):          # carries ripple in by the additions, modulo 2**64
                total += limbs[k].astype(np.uint64) << np.uint64(LIMB_BITS * k)
        out = total.view(np.int64)
        if op == "avg":
            out = _avg(out, len(ranks), None)
        flat[...] = out
        return
    if op not in ("max", "min"):
        raise ValueError(f"int64 all-reduce: op {op!r} goes by fold_all_reduce (sum, avg, max, min here)")
    hi = (flat >> 32).astype(np.int32)
    lo = ((flat & 0xFFFF_FFFF) - 2**31).astype(np.int32)        # unsigned order as signed int32
    hi_red = hi.copy()
    p.all_reduce(hi_red, op, group)
    identity = np.iinfo(np.int32).min if op == "max" else np.iinfo(np.int32).max
    lo_red = np.where(hi == hi_red, lo, np.int32(identity)).astype(np.int32)
    p.all_reduce(lo_red, op, group)
    flat[...] = (hi_red.astype(np.int64) << 32) | (lo_red.astype(np.int64) + 2**31)


def reduce(p, arr: np.ndarray, dst: int, op: str, group=None) -> None:
    """Reduce into rank `dst`'s `arr` (a global rank); the other ranks' `arr` keeps their input."""
    ranks, _ = _index(p, group)
    if dst not in ranks:
        raise ValueError(f"reduce: dst={dst} is not in the group {ranks}")
    keep = None if p.rank == dst else arr.copy()
    p.all_reduce(arr, op, group)
    if keep is not None:
        arr[...] = keep


def gather(p, arr: np.ndarray, out: np.ndarray | None, dst: int, group=None) -> None:
    """Rank `dst` gets every rank's `arr` in `out` (shape ``(n, *arr.shape)``); the others pass None."""
    ranks, _ = _index(p, group)
    if dst not in ranks:
        raise ValueError(f"gather: dst={dst} is not in the group {ranks}")
    if p.rank == dst and (out is None or out.shape != (len(ranks),) + arr.shape or out.dtype != arr.dtype):
        raise ValueError(f"gather: rank {dst} needs an output of shape {(len(ranks),) + arr.shape} and "
                         f"type {arr.dtype}")
    stacked = out if p.rank == dst else np.empty((len(ranks),) + arr.shape, arr.dtype)
    p.all_gather(stacked, arr, group)


def scatter(p, out: np.ndarray, blocks: np.ndarray | None, src: int, group=None) -> None:
    """Rank i of the group gets block i of rank `src`'s `blocks` (shape ``(n, *out.shape)``) in `out`."""
    ranks, me = _index(p, group)
    if src not in ranks:
        raise ValueError(f"scatter: src={src} is not in the group {ranks}")
    shape = (len(ranks),) + out.shape
    if p.rank == src:
        if blocks is None or blocks.shape != shape or blocks.dtype != out.dtype:
            raise ValueError(f"scatter: rank {src} needs blocks of shape {shape} and type {out.dtype}")
        buf = np.ascontiguousarray(blocks).copy()
    else:
        buf = np.empty(shape, out.dtype)
    p.broadcast(buf, src, group)
    out[...] = buf[me]


def all_to_all(p, out: np.ndarray, blocks: np.ndarray, group=None) -> None:
    """Rank i sends block j of its `blocks` (shape ``(n, ...)``) to rank j, which finds it as block i of
    its `out` (same shape). Equal blocks only."""
    ranks, me = _index(p, group)
    n = len(ranks)
    if blocks.shape[:1] != (n,) or out.shape != blocks.shape or out.dtype != blocks.dtype:
        raise ValueError(f"all_to_all: input and output must both have {n} equal blocks of one type "
                         f"(input {blocks.shape} {blocks.dtype}, output {out.shape} {out.dtype})")
    everyone = np.empty((n,) + blocks.shape, blocks.dtype)
    p.all_gather(everyone, np.ascontiguousarray(blocks), group)
    out[...] = everyone[:, me]


def _pair(p, peer: int):
    if peer == p.rank:
        raise ValueError(f"send/recv: rank {peer} is this rank")
    pairs = p.__dict__.setdefault("_pairs", {})
    key = (min(p.rank, peer), max(p.rank, peer))
    if key not in pairs:
        pairs[key] = p.new_group(list(key))
    return pairs[key]


def _check_p2p(p, arr: np.ndarray, src: int, dst: int, pair) -> None:
    """Both ends of a send/recv agree on who sends and on the shape and type; else both raise
    :class:`ShapeMismatch` (two sends meeting, as an isend/isend exchange, would otherwise be one broadcast
    with two roots: a wrong answer, not an error)."""
    check_consistent(p, signature("send/recv", src, dst, arr.shape, str(arr.dtype)),
                     f"send/recv between ranks {min(src, dst)} and {max(src, dst)}: a send must meet the other "
                     "rank's recv of the same shape and type (a send waits for that recv: two ranks that both "
                     "send first, isend then irecv, meet send with send)", pair)


def send(p, arr: np.ndarray, dst: int) -> None:
    """Send `arr` to rank `dst` (which calls :func:`recv` with an array of the same size and type); returns
    once `dst` has received it."""
    pair = _pair(p, dst)
    _check_p2p(p, arr, p.rank, dst, pair)
    p.broadcast(np.ascontiguousarray(arr).copy(), p.rank, pair)


def recv(p, arr: np.ndarray, src: int) -> None:
    """Receive into `arr` what rank `src` sends."""
    pair = _pair(p, src)
    _check_p2p(p, arr, src, p.rank, pair)
    p.broadcast(arr, src, pair)


def signature(kind: str, *parts) -> int:
    """A 31-bit digest of a collective's kind and its shapes/types (what every rank must agree on)."""
    return zlib.crc32(repr((kind,) + parts).encode()) & 0x7FFF_FFFF


def check_consistent(p, sig: int, what: str, group=None) -> None:
    """Raise :class:`ShapeMismatch` on every rank unless every rank of the group passed the same `sig`."""
    probe = np.array([sig, -sig], np.int32)
    p.all_reduce(probe, "max", group)
    if probe[0] != -probe[1]:
        raise ShapeMismatch(f"{what}: the ranks of the group disagree on the collective, its shape or its "
                            f"type (this rank's signature {sig:#x}, the largest {int(probe[0]):#x}, the smallest "
                            f"{int(-probe[1]):#x}): every rank must call the same collective with the same "
                            "shapes and types")


class CommPrimitives:
    """The primitives on a co-simulation rank (:class:`cais.comm.Communicator`). The switch model reduces;
    broadcast and all-gather are an exact SUM of the bytes as int32 (int8 for sizes not a multiple of 4)
    in which every rank but the sender contributes zeros."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        self.world_size = comm.world_size

    def group_ranks(self, group) -> list[int]:
        return list(range(self.world_size)) if group is None else list(group.ranks)

    def new_group(self, ranks):
        return self.comm.new_group(ranks)

    def all_reduce(self, arr: np.ndarray, op: str, group=None, dtype=None) -> str | None:
        """In place; returns the path it took ("switch" or "ring")."""
        work = self.comm.all_reduce(arr, op="sum" if op == "avg" else op, group=group, dtype=dtype, async_op=True)
        self.comm._outstanding.remove(work)
        total = work.wait()
        if op == "avg":
            total = _avg(total, len(self.group_ranks(group)), dtype)
        arr[...] = total
        return work.path

    def _bytes_sum(self, buf: np.ndarray, group) -> np.ndarray:
        raw = buf.reshape(-1).view(np.uint8)
        lanes = raw.view(np.int32) if raw.size % 4 == 0 else raw.view(np.int8)
        return np.asarray(self.comm.all_reduce(lanes, op="sum", group=group)).view(np.uint8)

    def broadcast(self, arr: np.ndarray, src: int, group=None) -> None:
        ranks, _ = _index(self, group)
        if src not in ranks:
            raise ValueError(f"broadcast: src={src} is not in the group {ranks}")
        mine = np.ascontiguousarray(arr) if self.rank == src else np.zeros(arr.shape, arr.dtype)
        arr[...] = self._bytes_sum(mine.copy(), group).view(arr.dtype).reshape(arr.shape)

    def all_gather(self, out: np.ndarray, arr: np.ndarray, group=None) -> None:
        ranks, me = _index(self, group)
        stacked = np.zeros((len(ranks),) + arr.shape, arr.dtype)
        stacked[me] = arr
        out[...] = self._bytes_sum(stacked, group).view(arr.dtype).reshape(stacked.shape)

    def reduce_scatter(self, out: np.ndarray, full: np.ndarray, op: str, group=None) -> None:
        ranks, me = _index(self, group)
        if wire_dtype(full.dtype) is None:
            raise TypeError(f"reduce_scatter: cannot reduce {full.dtype}")
        total = full.reshape(-1).copy()
        self.all_reduce(total, op, group)
        out.reshape(-1)[...] = total.reshape(len(ranks), -1)[me]
