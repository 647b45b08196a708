"""DDP communication hooks that work on any process group ("cais", gloo, ...).

::

    from cais.torch import hooks
    ddp.register_comm_hook(None, hooks.allreduce_hook)                  # the mean (divide, then SUM)
    ddp.register_comm_hook(hooks.BlockFPState(), hooks.block_fp_hook)   # exact integer sums

:func:`block_fp_hook` carries float32 gradients as block floating point integers (:mod:`cais.quantize`,
the driver's own quantizer): per block of ``elements_per_block`` elements an int32 MAX all-reduce of the
blocks' exponents gives every rank the same scale, then an int32 SUM all-reduce of the scaled, rounded
gradients. Integer sums are exact and associative, so the result does not depend on the order in which
the switch (or the ring, or gloo) adds the contributions: bit-identical across runs, rank orders and
backends, and equal to :func:`block_fp_reference` computed in numpy. The price is the rounding of each
gradient to the block's grid: at most half a quantum, ``2**(e_max + k - 31)`` with ``k = ceil(log2 N)``
(docs/driver.md, "Floating-point arrays").
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist
from torch.futures import Future  # DDP checks the hooks' return annotation: a real type, not a string

from .. import quantize

__all__ = ["allreduce_hook", "BlockFPState", "block_fp_hook", "block_fp_mean", "block_fp_reference"]

DEFAULT_BLOCK = 256          # elements per shared exponent (a 1 KiB chunk of float32)


def _group(pg):
    return pg if pg is not None else tdist.group.WORLD


def allreduce_hook(process_group, bucket) -> Future[torch.Tensor]:
    """The mean of the bucket over the group: divided by the group size, then an async SUM all-reduce
    (as torch's own ``default_hooks.allreduce_hook``; DDP without a hook multiplies by 1/N instead), through
    whatever backend `process_group` (None: the world) has."""
    group = _group(process_group)
    buf = bucket.buffer()
    buf.div_(group.size())
    work = tdist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


@dataclass
class BlockFPState:
    """State of :func:`block_fp_hook`: the group (None: the world) and the elements per shared exponent.
    ``buckets`` counts the buckets it reduced."""
    process_group: object = None
    elements_per_block: int = DEFAULT_BLOCK
    buckets: int = 0


def block_fp_mean(e_max: np.ndarray, q_sum: np.ndarray, n: int, per_block: int) -> np.ndarray:
    """The mean of `n` ranks' gradients from the SUM of their quantized values: dequantized to float32
    (rounded once), then divided by `n` in float32."""
    total = quantize.dequantize(q_sum, e_max, n, per_block, np.float32)
    return (total / np.float32(n)).astype(np.float32)


def block_fp_reference(grads: list[np.ndarray], per_block: int = DEFAULT_BLOCK) -> np.ndarray:
    """What :func:`block_fp_hook` gives every rank for one parameter whose float32 gradients on the ranks
    are `grads`, in numpy alone."""
    n = len(grads)
    e_max = np.max(np.stack([quantize.chunk_exponents(g, per_block) for g in grads]), axis=0).astype(np.int32)
    q_sum = np.sum(np.stack([quantize.quantize(g, e_max, n, per_block).astype(np.int64) for g in grads]), axis=0)
    return block_fp_mean(e_max, q_sum.astype(np.int32), n, per_block)


def block_fp_hook(state: BlockFPState, bucket) -> Future[torch.Tensor]:
    """Reduce a float32 gradient bucket as block floating point integers (module docstring); the future
    holds the bucket with the mean. The blocks are cut within each parameter's gradient, so the result
    does not depend on how DDP lays out its buckets (it rebuilds them after the first step). Raises
    ValueError on every rank of the group when any rank's gradients hold NaN or inf (integers cannot carry
    them), TypeError for other types than float32."""
    state = state if state is not None else BlockFPState()
    group = _group(state.process_group)
    n = group.size()
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError(f"block_fp_hook: float32 gradients only, not {buf.dtype}")
    per = state.elements_per_block
    grads = [g.detach().reshape(-1).numpy() for g in bucket.gradients()] or [buf.detach().numpy()]
    if sum(g.size for g in grads) != buf.numel():
        raise ValueError("block_fp_hook: the bucket's gradients do not fill its buffer")
    # NaN/inf travel as a flag after the exponents, so that every rank raises, not only the one that has
    # them (its peers would wait in this all-reduce for a rank that went on to its next collective)
    finite = all(np.isfinite(g).all() for g in grads)
    exps = [quantize.chunk_exponents(g if finite else np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0), per)
            .astype(np.int32) for g in grads]
    e_all = torch.from_numpy(np.concatenate(exps + [np.array([0 if finite else 1], np.int32)]))
    tdist.all_reduce(e_all, op=tdist.ReduceOp.MAX, group=group)
    if e_all[-1]:
        raise ValueError(f"block_fp_hook: {'this rank' if not finite else 'another rank'}'s gradients hold NaN "
                         "or inf: integers cannot carry them (every rank of the group raises this)")
    e_max = np.split(e_all.numpy()[:-1], np.cumsum([e.size for e in exps])[:-1])
    q_all = torch.from_numpy(np.concatenate([quantize.quantize(g, e, n, per).astype(np.int32)
                                             for g, e in zip(grads, e_max)]))
    tdist.all_reduce(q_all, op=tdist.ReduceOp.SUM, group=group)
    sums = np.split(q_all.numpy(), np.cumsum([g.size for g in grads])[:-1])
    mean = np.concatenate([block_fp_mean(e, q, n, per) for e, q in zip(e_max, sums)])
    buf.copy_(torch.from_numpy(mean))
    state.buckets += 1
    fut = Future()
    fut.set_result(buf)
    return fut
