"""PyTorch through the switch: ``import cais.torch`` registers a torch.distributed backend named "cais".

::

    import torch.distributed as dist, cais.torch
    dist.init_process_group("cais")              # env:// as torchrun sets it, plus CAIS_IFACE, CAIS_SWITCH
    model = torch.nn.parallel.DistributedDataParallel(model)      # gradient buckets through the switch

The backend is a :class:`torch.distributed.ProcessGroup` written in Python (no C++ extension, no patch
to torch; docs/torch.md). It turns CPU tensors into numpy views (no copy when contiguous) and hands them
to the collectives of CAIS: in a process of its own, :mod:`cais.dist` (raw Ethernet to the switch,
one coordinator hosted by rank 0); in the co-simulation, a :class:`cais.comm.Communicator` passed as
``pg_options=cais.torch.Options(communicator=comm)``. Which path each collective takes (docs/torch.md,
"Paths"):

* all_reduce SUM, AVG, MAX, MIN of float32, float16, bfloat16, int32, int16, int8: the switch (or the
  host ring when the controller says so); int64: the switch's int32 lanes, exactly (16-bit limbs; MAX/MIN
  by a high and a tied low word); float64 MAX/MIN: the switch, exactly (order keys);
* float64 SUM/AVG, PRODUCT, BAND, BOR, BXOR (and any type the switch has no lanes for): the host path,
  an all-gather and the same fold in group order on every rank (exact, identical bits everywhere);
* broadcast, all_gather(_into_tensor/_single): the switch's forwarding; reduce_scatter(_tensor/_single):
  the host ring; reduce, gather, scatter, all_to_all, send/recv: composed (:mod:`cais.hostops`).

Every collective first checks, by one two-element int32 MAX all-reduce, that every rank of the group
called the same collective with the same shapes and types (else every rank raises
:class:`cais.hostops.ShapeMismatch`); ``CAIS_TORCH_CHECK=0`` leaves the check out.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from .. import hostops
from ..dist import SWITCH_OPS
from ..numerics import NATIVE
from ..protocol import DType

__all__ = ["BACKEND", "Options", "ProcessGroupCais", "backend_of", "path_of", "SWITCH_DTYPES", "CHECK_ENV"]

BACKEND = "cais"
CHECK_ENV = "CAIS_TORCH_CHECK"        # "0": no cross-rank shape check before each collective
# the switch's wire types (cais.numerics.NATIVE) as torch types: the host ring's reduce-scatter takes those
# numpy has (not bf16), the all-reduce all of them
_RING_DTYPES = tuple(torch.from_numpy(np.empty(0, d)).dtype for w, d in NATIVE.items() if w != DType.BF16)
SWITCH_DTYPES = _RING_DTYPES + (torch.bfloat16,)
_OPS = {tdist.ReduceOp.SUM: "sum", tdist.ReduceOp.AVG: "avg", tdist.ReduceOp.MAX: "max",
        tdist.ReduceOp.MIN: "min", tdist.ReduceOp.PRODUCT: "product", tdist.ReduceOp.BAND: "band",
        tdist.ReduceOp.BOR: "bor", tdist.ReduceOp.BXOR: "bxor"}


@dataclass
class Options:
    """``pg_options`` of ``init_process_group("cais", ...)``: `communicator` runs the group in the
    co-simulation (a :class:`cais.comm.Communicator`, one per rank thread) instead of the deployed driver;
    `check` overrides ``CAIS_TORCH_CHECK``."""
    communicator: Any = None
    check: bool | None = None


def _op_name(op) -> str:
    for key, name in _OPS.items():
        if op == key:
            return name
    name = getattr(getattr(op, "op", None), "name", None) or str(op)      # PREMUL_SUM comes as an object
    raise ValueError(f"cais backend: reduce op {name} is not supported (SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR, "
                     "BXOR)")


def path_of(dtype: torch.dtype, op: str) -> str:
    """Where an all-reduce of `dtype` with `op` goes: "switch" (the switch's lanes, or the host ring when
    the controller keeps the collective off the switch), "int64" (int64 as int32 limbs on the switch),
    "fold" (an all-gather and a local fold on every rank)."""
    if op in SWITCH_OPS and dtype in SWITCH_DTYPES:
        return "switch"
    if op in SWITCH_OPS and dtype == torch.int64:
        return "int64"
    if op in ("max", "min") and dtype == torch.float64:
        return "switch"          # exact by order keys (cais.quantize)
    return "fold"


def _check_tensor(t, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cais backend: {what}: expected a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"cais backend: {what}: a {t.device.type} tensor ({t.device}); this backend is "
                         "CPU only (move it with .cpu(), or use the cpu:cais,cuda:nccl device map)")
    if t.is_complex() or t.dtype in (torch.uint16, torch.uint32, torch.uint64) or t.dtype.is_floating_point \
            and t.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"cais backend: {what}: tensors of {t.dtype} are not supported (float32, float16, "
                        "bfloat16, float64, int64, int32, int16, int8, uint8, bool)")


class _Buf:
    """A tensor as a numpy array: a view when it is contiguous (reduced in place, no copy), else a
    contiguous copy written back by :meth:`done`. bfloat16 is viewed as its uint16 bit patterns."""

    def __init__(self, t: torch.Tensor, what: str):
        _check_tensor(t, what)
        self.tensor = t
        self.src = t if t.is_contiguous() else t.contiguous()
        self.bf16 = t.dtype == torch.bfloat16
        mem = self.src.detach()              # the same memory; numpy() refuses tensors that require grad
        self.array = mem.view(torch.uint16).numpy() if self.bf16 else mem.numpy()

    @property
    def wire(self):
        return "bf16" if self.bf16 else None

    def done(self) -> None:
        if self.src is not self.tensor:
            self.tensor.copy_(self.src)


def _check_contributors(work, n: int, what: str) -> None:
    """A deployed all-reduce a peer died in is redone by the ranks left (cais.dist): for training that
    result is wrong (a gradient missing), so the backend fails it, naming who is left."""
    ranks = getattr(work, "ranks", None)
    if ranks is not None and len(ranks) < n:
        from ..comm import CollectiveError
        raise CollectiveError(f"cais backend: {what}: a rank of the group died during it (only ranks {ranks} "
                              f"of {n} contributed); the group cannot go on")


def _completed(value) -> "tdist.Work":
    fut = Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class _Completer:
    """One thread per process group that waits for the deployed driver's outstanding works in order and
    completes their torch futures (the driver's own progress thread moves the frames)."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="cais-torch-completer", daemon=True)
        self._thread.start()

    def submit(self, work, finish, value) -> "tdist.Work":
        fut = Future()
        self._queue.put((work, finish, value, fut))
        return _create_work_from_future(fut)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, finish, value, fut = item
            try:
                work.wait()
                finish()
            except BaseException as e:      # noqa: BLE001 - handed to the waiter
                fut.set_exception(e)
            else:
                fut.set_result(value)

    def close(self) -> None:
        """Return once every submitted work is complete (its tensor written, its future set): the rank must
        not leave CAIS while a collective it started still needs it (its peers' ring steps, say)."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:     # not from a future's callback
            self._thread.join()


class ProcessGroupCais(tdist.ProcessGroup):
    """A torch process group whose collectives run through CAIS.

    Members
    -------
    prims : DistPrimitives | CommPrimitives
        The collectives of this rank (:mod:`cais.hostops` names what they offer).
    group : cais Group | None
        The CAIS group (None: every rank).
    global_ranks : list[int]
        The group's ranks in the world, in group order.
    check : bool
        Whether each collective first checks that every rank agrees on it (module docstring).
    history : list[dict]
        Per all-reduce (DDP: per gradient bucket): its bytes, dtype and path ("switch", "ring", "int64",
        "fold"); :meth:`path_counts` sums them up.
    """

    def __init__(self, rank: int, size: int, prims, group, global_ranks, check: bool = True):
        super().__init__(rank, size)
        self.prims, self.group, self.global_ranks, self.check = prims, group, list(global_ranks), check
        self.history: list[dict] = []       # per all-reduce: bytes, dtype, the path it took
        from ..dist import DistPrimitives
        self._deployed = isinstance(prims, DistPrimitives)
        self._completer = _Completer() if self._deployed else None

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"ProcessGroupCais(rank={self.rank()}, size={self.size()}, ranks={self.global_ranks})"

    # ------------------------------------------------------------------ helpers
    def _global(self, group_rank: int) -> int:
        if not 0 <= group_rank < len(self.global_ranks):
            raise ValueError(f"cais backend: rank {group_rank} is not in this group of {len(self.global_ranks)}")
        return self.global_ranks[group_rank]

    def _agree(self, kind: str, *parts) -> None:
        if self.check:
            hostops.check_consistent(self.prims, hostops.signature(kind, *parts), f"cais backend: {kind}",
                                     self.group)

    @staticmethod
    def _sig(t: torch.Tensor) -> tuple:
        return tuple(t.shape), str(t.dtype)

    def _record(self, path: str | None, nbytes: int, dtype) -> None:
        self.history.append({"kind": "all_reduce", "bytes": int(nbytes), "path": path or "?", "dtype": str(dtype)})

    def path_counts(self) -> dict[str, int]:
        """All-reduces per path taken so far: "switch", "ring" (the controller kept it on the hosts),
        "int64" (limbs through the switch), "fold" (all-gather and local fold)."""
        return dict(Counter(h["path"] for h in self.history))

    def _dist_async(self, start, bufs: list[_Buf], value, on_done=None):
        """Start a deployed collective (`start()` returns the driver's Work) and complete the torch Work
        when its result is in."""
        work = start()
        from .. import dist as cd
        pg = cd._get()
        if work in pg.outstanding:
            pg.outstanding.remove(work)      # the completer waits for it, not synchronize()

        def finish():
            if on_done is not None:
                on_done(work)
            for b in bufs:
                b.done()
        return self._completer.submit(work, finish, value)

    # ------------------------------------------------------------------ all-reduce
    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM)
        if len(tensors) != 1:
            raise ValueError(f"cais backend: allreduce takes one tensor per process, not {len(tensors)}")
        return self._allreduce_one(tensors[0], op, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM)
        for t in tensors:
            self._allreduce_one(t, op, tensors).wait()
        return _completed(tensors)

    def _allreduce_one(self, t: torch.Tensor, op: str, value):
        buf = _Buf(t, "all_reduce")
        path = path_of(t.dtype, op)
        if path == "fold" and op.startswith("b") and (t.is_floating_point()):
            raise TypeError(f"cais backend: all_reduce {op.upper()}: bitwise ops take integer or bool tensors, "
                            f"not {t.dtype}")
        self._agree("all_reduce", op, *self._sig(t))
        nbytes, taken = buf.array.nbytes, path
        if path == "int64":
            hostops.int64_all_reduce(self.prims, buf.array.reshape(-1), op, self.group)
        elif path == "fold":
            hostops.fold_all_reduce(self.prims, buf.array, op, self.group)
        elif self._deployed:
            from .. import dist as cd
            n = len(self.global_ranks)

            def on_done(work):
                _check_contributors(work, n, "all_reduce")
                self._record(work.path, nbytes, t.dtype)
            return self._dist_async(lambda: cd.all_reduce(buf.array, op, self.group, async_op=True, dtype=buf.wire),
                                    [buf], value, on_done)
        else:
            taken = self.prims.all_reduce(buf.array, op, self.group, dtype=buf.wire)
        self._record(taken, nbytes, t.dtype)
        buf.done()
        return _completed(value)

    # ------------------------------------------------------------------ broadcast, gathers
    def broadcast(self, tensors, opts=None):
        src = self._global(opts.rootRank if opts is not None else 0)
        for t in tensors:
            buf = _Buf(t, "broadcast")
            self._agree("broadcast", src, *self._sig(t))
            if self._deployed:
                from .. import dist as cd
                work = self._dist_async(lambda: cd.broadcast(buf.array, src, self.group, async_op=True), [buf],
                                        tensors)
                if len(tensors) == 1:
                    return work
                work.wait()
            else:
                self.prims.broadcast(buf.array, src, self.group)
                buf.done()
        return _completed(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("cais backend: allgather takes one input tensor (and one output list) per process")
        outs, t = output_tensors[0], input_tensors[0]
        n = len(self.global_ranks)
        if len(outs) != n:
            raise ValueError(f"cais backend: all_gather: {len(outs)} output tensors for a group of {n}")
        for o in outs:
            _check_tensor(o, "all_gather output")
            if o.shape != t.shape or o.dtype != t.dtype:
                raise ValueError(f"cais backend: all_gather: output {tuple(o.shape)} {o.dtype}, input "
                                 f"{tuple(t.shape)} {t.dtype}: must be equal")
        stacked = torch.empty((n,) + tuple(t.shape), dtype=t.dtype)
        self._gather_into(stacked, t)
        for o, row in zip(outs, stacked):
            o.copy_(row)
        return _completed(output_tensors)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        n = len(self.global_ranks)
        if output_tensor.numel() != n * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
            raise ValueError(f"cais backend: all_gather_into_tensor: output {tuple(output_tensor.shape)} "
                             f"{output_tensor.dtype} for {n} x input {tuple(input_tensor.shape)} {input_tensor.dtype}")
        out = _Buf(output_tensor, "all_gather_into_tensor output")
        self._gather_into(out.src.view((n,) + tuple(input_tensor.shape)), input_tensor)
        out.done()
        return _completed(output_tensor)

    _allgather_base = all_gather_single

    def _gather_into(self, stacked: torch.Tensor, t: torch.Tensor) -> None:
        inp = _Buf(t, "all_gather input")
        self._agree("all_gather", *self._sig(t))
        arr = stacked.view(torch.uint16).numpy() if inp.bf16 else stacked.numpy()
        if self._deployed:
            from .. import dist as cd
            cd.all_gather(arr, inp.array, self.group)
        else:
            self.prims.all_gather(arr, inp.array, self.group)

    # ------------------------------------------------------------------ reduce-scatter
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM)
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("cais backend: reduce_scatter takes one output tensor (and one input list) per process")
        out, blocks = output_tensors[0], input_tensors[0]
        n = len(self.global_ranks)
        if len(blocks) != n or any(b.shape != out.shape or b.dtype != out.dtype for b in blocks):
            raise ValueError(f"cais backend: reduce_scatter: expected {n} input tensors shaped like the output "
                             f"{tuple(out.shape)} {out.dtype}")
        self._reduce_scatter(out, torch.stack([b.contiguous() for b in blocks]), op)
        return _completed(output_tensors)

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else tdist.ReduceOp.SUM)
        n = len(self.global_ranks)
        if input_tensor.numel() != n * output_tensor.numel() or input_tensor.dtype != output_tensor.dtype:
            raise ValueError(f"cais backend: reduce_scatter_tensor: input {tuple(input_tensor.shape)} "
                             f"{input_tensor.dtype} for {n} x output {tuple(output_tensor.shape)} {output_tensor.dtype}")
        self._reduce_scatter(output_tensor, input_tensor, op)
        return _completed(output_tensor)

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, out: torch.Tensor, full: torch.Tensor, op: str) -> None:
        o, f = _Buf(out, "reduce_scatter output"), _Buf(full, "reduce_scatter input")
        self._agree("reduce_scatter", op, *self._sig(out))
        if out.dtype not in _RING_DTYPES or op not in SWITCH_OPS:
            # no ring lanes for it: the whole all-reduce (by its own path), then this rank's block
            total = full.contiguous().clone()
            self._allreduce_one(total, op, [total]).wait()
            out.copy_(total.reshape(len(self.global_ranks), -1)[self.rank()]
                      .reshape(out.shape))
            return
        if self._deployed:
            from .. import dist as cd
            cd.reduce_scatter(o.array, f.array, op, self.group)
        else:
            self.prims.reduce_scatter(o.array, f.array, op, self.group)
        o.done()

    # ------------------------------------------------------------------ barrier
    def barrier(self, opts=None):
        self._agree("barrier")
        token = np.ones(1, np.int32)
        self.prims.all_reduce(token, "sum", self.group)
        if int(token[0]) != len(self.global_ranks):
            raise RuntimeError(f"cais backend: barrier counted {int(token[0])} ranks of {len(self.global_ranks)}")
        return _completed(None)

    # ------------------------------------------------------------------ composed collectives
    def reduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp)
        dst = self._global(opts.rootRank)
        t = tensors[0]
        keep = None if self.prims.rank == dst else t.clone()
        self._allreduce_one(t, op, tensors).wait()
        if keep is not None:
            t.copy_(keep)           # as gloo: only dst's tensor holds the result
        return _completed(tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        dst = self._global(opts.rootRank)
        t = input_tensors[0]
        n = len(self.global_ranks)
        stacked = torch.empty((n,) + tuple(t.shape), dtype=t.dtype)
        self._gather_into(stacked, t)
        if self.prims.rank == dst:
            outs = output_tensors[0]
            if len(outs) != n:
                raise ValueError(f"cais backend: gather: {len(outs)} output tensors for a group of {n}")
            for o, row in zip(outs, stacked):
                o.copy_(row)
        return _completed(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        src = self._global(opts.rootRank)
        out = output_tensors[0]
        n = len(self.global_ranks)
        if self.prims.rank == src:
            blocks = input_tensors[0]
            if len(blocks) != n or any(b.shape != out.shape or b.dtype != out.dtype for b in blocks):
                raise ValueError(f"cais backend: scatter: rank {src} needs {n} tensors shaped like the output")
            stacked = torch.stack([b.contiguous() for b in blocks])
        else:
            stacked = torch.empty((n,) + tuple(out.shape), dtype=out.dtype)
        opts_b = tdist.BroadcastOptions()
        opts_b.rootRank = self.global_ranks.index(src)
        self.broadcast([stacked], opts_b).wait()
        out.copy_(stacked[self.rank()])
        return _completed(output_tensors)

    def alltoall(self, output_tensor_list, input_tensor_list, opts=None):
        n = len(self.global_ranks)
        if len(input_tensor_list) != n or len(output_tensor_list) != n:
            raise ValueError(f"cais backend: all_to_all: {n} input and output tensors expected")
        shapes = {(tuple(t.shape), t.dtype) for t in list(input_tensor_list) + list(output_tensor_list)}
        if len(shapes) != 1:
            raise ValueError("cais backend: all_to_all: equal tensors only (one shape and type)")
        out = torch.empty((n,) + tuple(input_tensor_list[0].shape), dtype=input_tensor_list[0].dtype)
        self._all_to_all(out, torch.stack([t.contiguous() for t in input_tensor_list]))
        for o, row in zip(output_tensor_list, out):
            o.copy_(row)
        return _completed(output_tensor_list)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = len(self.global_ranks)
        for name, splits, t in (("output", output_split_sizes, output), ("input", input_split_sizes, input)):
            if splits and len(set(splits)) != 1:
                raise ValueError(f"cais backend: all_to_all_single: uneven {name} splits {list(splits)}: equal "
                                 "blocks only")
            if t.shape[0] % n:
                raise ValueError(f"cais backend: all_to_all_single: {name} dim 0 ({t.shape[0]}) is not a "
                                 f"multiple of the group size {n}")
        o = _Buf(output, "all_to_all output")
        self._all_to_all(o.src.view((n, -1)), input.contiguous().view((n, -1)))
        o.done()
        return _completed(output)

    alltoall_base = all_to_all_single

    def _all_to_all(self, out: torch.Tensor, blocks: torch.Tensor) -> None:
        n = len(self.global_ranks)
        everyone = torch.empty((n,) + tuple(blocks.shape), dtype=blocks.dtype)
        self._gather_into(everyone, blocks)
        out.copy_(everyone[:, self.rank()])

    def send(self, tensors, dst, tag=0):
        peer = self._global(dst)
        buf = _Buf(tensors[0], "send")
        hostops.send(self.prims, buf.array.copy(), peer)
        return _completed(tensors)

    def recv(self, tensors, src, tag=0):
        peer = self._global(src)
        buf = _Buf(tensors[0], "recv")
        hostops.recv(self.prims, buf.array, peer)
        buf.done()
        return _completed(tensors)

    def shutdown(self) -> None:
        """torch.distributed.destroy_process_group(): the world group of a deployed rank leaves CAIS too."""
        if self._completer is not None:
            self._completer.close()
            self._completer = None
            if self.group is None:
                from .. import dist as cd
                cd.destroy_process_group()


def backend_of(group=None) -> ProcessGroupCais:
    """The :class:`ProcessGroupCais` of a torch group (None: the default group); TypeError if it is not
    a "cais" group."""
    pg = group if group is not None else tdist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupCais):
        raise TypeError(f"{pg!r} is not a 'cais' process group")
    return pg


# ---------------------------------------------------------------------- registration
def _store_host(store) -> str | None:
    """The host of torch's rendezvous store when it is a TCP store (env:// and tcp://: rank 0's host,
    where the coordinator goes), else None (file://, a store of the caller's)."""
    while isinstance(store, tdist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, tdist.TCPStore) else None


def _create(opts, options):
    """The backend's constructor (torch's extended API): the world group joins CAIS (the deployed driver,
    or the co-simulation rank of ``Options.communicator``); a subgroup is a CAIS group of the same ranks."""
    from .. import dist as cd
    options = options if isinstance(options, Options) else Options()
    check = options.check if options.check is not None else os.environ.get(CHECK_ENV, "1") != "0"
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    try:
        default = tdist.distributed_c10d._get_default_group()
    except (ValueError, RuntimeError):
        default = None
    if isinstance(default, ProcessGroupCais):           # a subgroup: the world's primitives
        prims = default.prims
        group = prims.new_group(ranks)
        return ProcessGroupCais(opts.group_rank, opts.group_size, prims, group, ranks,
                                check if options.check is not None else default.check)
    if options.communicator is not None:
        prims = hostops.CommPrimitives(options.communicator)
    else:
        if not cd.is_initialized():
            cd.init(rank=opts.group_rank, world_size=opts.group_size, master_addr=_store_host(opts.store))
        prims = cd.primitives()
    if len(ranks) != prims.world_size:
        raise ValueError(f"cais backend: the first 'cais' group must be the world ({prims.world_size} ranks), "
                         f"not ranks {ranks}")
    return ProcessGroupCais(opts.group_rank, opts.group_size, prims, None, ranks, check)


tdist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
