"""The "cais" torch.distributed backend on the co-simulation (every rank a thread, the reference model of
the switch; cais.sim.torch_ranks): every collective against numpy, DDP against gloo, the block floating point
hook's bit-exactness, async works, and the errors (docs/torch.md)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

import cais.torch as ct
from cais.config import Config
from cais.hostops import ShapeMismatch
from cais.torch import hooks
from cais.sim.torch_ranks import run_ranks

N = 3
ELEMS = 6


def inputs(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input: small integers times (rank + 1), exact in every type (bf16 and fp16 too); their
    sum over an odd number of ranks is a multiple of it, so AVG is exact as well."""
    if dtype == torch.bool:
        return torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.bool) ^ torch.tensor(rank % 2 == 1)
    return (torch.tensor([1, -2, 3, 7, -5, 4]) * (rank + 1)).to(dtype)


def numpy_of(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


REDUCE = {"sum": lambda a: np.sum(a, axis=0), "max": lambda a: np.max(a, axis=0), "min": lambda a: np.min(a, axis=0),
          "product": lambda a: np.prod(a, axis=0), "band": lambda a: np.bitwise_and.reduce(a, axis=0),
          "bor": lambda a: np.bitwise_or.reduce(a, axis=0), "bxor": lambda a: np.bitwise_xor.reduce(a, axis=0)}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR}
CASES = [(d, op) for d in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8,
                           torch.int64, torch.float64) for op in ("sum", "avg", "max", "min")]
CASES += [(torch.int32, "product"), (torch.float32, "product"), (torch.int64, "band"), (torch.int32, "bor"),
          (torch.int8, "bxor"), (torch.bool, "bor")]


WIDE64 = [[2**62 + r, (1 << 40) + r, -(1 << 33) - r, 2**63 - 1 - r, -2**63 + r, (r - 1) << 32, 2**60 + 3 * r + 1,
           -2**60 - 3 * r - 2] for r in range(N)]


def int64_avg_reference(rows) -> list[int]:
    """AVG of int64 in Python integers: the sum wrapped to int64, divided by N truncating toward zero."""
    out = []
    for column in zip(*rows):
        total = (sum(column) + 2**63) % 2**64 - 2**63
        out.append(abs(total) // N * (1 if total >= 0 else -1))
    return out


def expected(dtype, op) -> np.ndarray:
    stack = np.stack([numpy_of(inputs(r, dtype)) for r in range(N)])
    if op == "avg":
        total = np.sum(stack.astype(np.float64), axis=0)
        return (total / N).astype(stack.dtype) if stack.dtype.kind == "f" else np.trunc(total / N).astype(stack.dtype)
    return REDUCE[op](stack).astype(stack.dtype)


def test_inputs_make_exact_averages():
    """The premise of the expectations: every case's sum over the ranks is a multiple of N."""
    total = sum(inputs(r, torch.int64) for r in range(N))
    assert N % 2 == 1 and (total % N == 0).all()


def every_collective(rank: int) -> dict:
    out = {"all_reduce": {}}
    for dtype, op in CASES:
        t = inputs(rank, dtype)
        dist.all_reduce(t, op=OPS[op])
        out["all_reduce"][f"{dtype}-{op}"] = numpy_of(t).tolist()
    # int64 beyond int32: sums that wrap modulo 2**64, MAX/MIN decided in the low word or by the sign, AVG
    # of sums beyond float64's 53 bits
    wide64 = torch.tensor(WIDE64[rank], dtype=torch.int64)
    for op in ("sum", "max", "min", "avg"):
        t = wide64.clone()
        dist.all_reduce(t, op=OPS[op])
        out[f"int64_{op}"] = t.tolist()
    # not contiguous: a strided view is reduced, the elements between untouched
    wide = torch.zeros(2 * ELEMS, dtype=torch.int32)
    wide[::2] = inputs(rank, torch.int32)
    dist.all_reduce(wide[::2])
    out["strided"] = wide.tolist()
    b = torch.arange(5, dtype=torch.float16) * (rank + 1)
    dist.broadcast(b, src=2)
    out["broadcast"] = b.tolist()
    gl = [torch.zeros(3, dtype=torch.bfloat16) for _ in range(N)]
    dist.all_gather(gl, torch.full((3,), rank + 0.5, dtype=torch.bfloat16))
    out["all_gather"] = [x.float().tolist() for x in gl]
    big = torch.zeros(N * 2, dtype=torch.int64)
    dist.all_gather_into_tensor(big, torch.tensor([rank, -rank], dtype=torch.int64))
    out["all_gather_into_tensor"] = big.tolist()
    rs = torch.zeros(2, dtype=torch.float32)
    dist.reduce_scatter(rs, [torch.tensor([10.0 * i + rank, rank]) for i in range(N)])
    out["reduce_scatter"] = rs.tolist()
    rst = torch.zeros(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(rst, torch.arange(2 * N, dtype=torch.int64) * (rank + 1), op=dist.ReduceOp.MAX)
    out["reduce_scatter_tensor"] = rst.tolist()
    dist.barrier()
    red = torch.full((4,), rank + 1, dtype=torch.int32)
    dist.reduce(red, dst=1)
    out["reduce"] = red.tolist()
    gathered = [torch.zeros(2) for _ in range(N)] if rank == 0 else None
    dist.gather(torch.tensor([rank, rank * 2.0]), gathered, dst=0)
    out["gather"] = [g.tolist() for g in gathered] if gathered else None
    sc = torch.zeros(3, dtype=torch.int16)
    dist.scatter(sc, [torch.full((3,), 100 + i, dtype=torch.int16) for i in range(N)] if rank == 1 else None, src=1)
    out["scatter"] = sc.tolist()
    a2a = [torch.zeros(2, dtype=torch.int32) for _ in range(N)]
    dist.all_to_all(a2a, [torch.tensor([10 * rank + j, -j], dtype=torch.int32) for j in range(N)])
    out["all_to_all"] = [x.tolist() for x in a2a]
    single = torch.zeros(N, dtype=torch.float32)
    dist.all_to_all_single(single, torch.arange(N, dtype=torch.float32) + 100 * rank)
    out["all_to_all_single"] = single.tolist()
    if rank == 0:
        dist.send(torch.tensor([7.5, -1.0]), dst=2)
    elif rank == 2:
        got = torch.zeros(2)
        dist.recv(got, src=0)
        out["recv"] = got.tolist()
    pair = dist.new_group([0, 2])
    if rank in (0, 2):
        v = torch.full((3,), float(rank + 1))
        dist.all_reduce(v, group=pair)
        out["pair"] = v.tolist()
        bb = torch.full((2,), float(rank))
        dist.broadcast(bb, src=2, group=pair)        # a global rank, as torch's API has it
        out["pair_broadcast"] = bb.tolist()
    w = dist.all_reduce(torch.ones(4, dtype=torch.int8), async_op=True)
    w.wait()
    out["async"] = w.get_future().value()[0].tolist()
    out["paths"] = ct.backend_of().path_counts()
    return out


@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")   # the old names, still torch's API
@pytest.mark.parametrize("offload", ["always", "never"])
def test_every_collective_against_numpy(offload):
    """Every collective with the switch taking every all-reduce it can, then with none (the host ring)."""
    outs = run_ranks(every_collective, N, config=Config(offload=offload))
    for rank, out in enumerate(outs):
        for dtype, op in CASES:
            want = expected(dtype, op)
            got = np.array(out["all_reduce"][f"{dtype}-{op}"], dtype=want.dtype)
            assert np.array_equal(got, want), (rank, dtype, op, got, want)
        with np.errstate(over="ignore"):
            for op in ("sum", "max", "min"):
                assert out[f"int64_{op}"] == REDUCE[op](np.array(WIDE64, np.int64)).tolist(), op
        assert out["int64_avg"] == int64_avg_reference(WIDE64)
        strided = np.zeros(2 * ELEMS, np.int32)
        strided[::2] = expected(torch.int32, "sum")
        assert out["strided"] == strided.tolist()
        assert out["broadcast"] == (np.arange(5) * 3.0).tolist()
        assert out["all_gather"] == [[r + 0.5] * 3 for r in range(N)]
        assert out["all_gather_into_tensor"] == [v for r in range(N) for v in (r, -r)]
        assert out["reduce_scatter"] == [N * 10.0 * rank + sum(range(N)), sum(range(N))]
        assert out["reduce_scatter_tensor"] == (np.arange(2 * N) * N)[2 * rank:2 * rank + 2].tolist()
        assert out["reduce"] == ([sum(range(1, N + 1))] * 4 if rank == 1 else [rank + 1] * 4)
        assert out["gather"] == ([[r, r * 2.0] for r in range(N)] if rank == 0 else None)
        assert out["scatter"] == [100 + rank] * 3
        assert out["all_to_all"] == [[10 * j + rank, -rank] for j in range(N)]
        assert out["all_to_all_single"] == [100.0 * j + rank for j in range(N)]
        assert out.get("recv") == ([7.5, -1.0] if rank == 2 else None)
        if rank in (0, 2):
            assert out["pair"] == [4.0] * 3 and out["pair_broadcast"] == [2.0, 2.0]
        assert out["async"] == [N] * 4
        native = ("switch", "ring") if offload == "always" else ("ring", "switch")
        assert out["paths"][native[0]] > 0 and native[1] not in out["paths"], out["paths"]
        # int64: its 4 ops, the 4 wide ones and reduce_scatter_tensor; fold: float64 SUM/AVG, 2 PRODUCT, 4 bitwise
        assert out["paths"]["int64"] == 4 + 4 + 1 and out["paths"]["fold"] == 2 + 2 + 4, out["paths"]


def test_paths_are_documented_per_dtype_and_op():
    assert ct.path_of(torch.float32, "sum") == "switch" and ct.path_of(torch.bfloat16, "avg") == "switch"
    assert ct.path_of(torch.int64, "sum") == "int64" and ct.path_of(torch.float64, "max") == "switch"
    assert ct.path_of(torch.float64, "sum") == "fold" and ct.path_of(torch.int32, "product") == "fold"


# ---------------------------------------------------------------------- DDP
STEPS, BATCH, FEATURES, CLASSES = 3, 8, 10, 4


def make_model():
    """The same initial parameters on every call, from a generator of its own: the rank threads build
    their models at once, and torch's global generator would hand them interleaved draws."""
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def train(rank: int, hook=None) -> list:
    """A few DDP steps; the final parameters (as lists)."""
    model = make_model()
    if rank != 0:                                    # DDP's broadcast from rank 0 must undo this
        with torch.no_grad():
            for p in model.parameters():
                p.add_(rank)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(hooks.BlockFPState(), hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


GLOO = r"""
import json, os, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[4])
import test_torch as T
from cais.torch import hooks
rank, n, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
out = {hook: [p.reshape(-1).view("uint32").tolist() for p in T.train(rank, fn)]
       for hook, fn in (("plain", None), ("blockfp", hooks.block_fp_hook))}
print(json.dumps(out), flush=True)
# Both ranks are past every collective before either leaves; then leave without gloo's teardown, which
# aborted once in CI ("terminate called without an active exception") after the answer was printed.
dist.barrier()
os._exit(0)
"""


def gloo_run(tmp_path, ranks: int) -> dict:
    """The same trainings on torch's gloo backend, one process per rank: {"plain" | "blockfp": each rank's
    parameters}."""
    procs = [subprocess.Popen([sys.executable, "-c", GLOO, str(r), str(ranks), str(tmp_path / "store"),
                               os.path.dirname(__file__)], stdout=subprocess.PIPE, text=True)
             for r in range(ranks)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * ranks, outs
    shapes = [p.shape for p in make_model().parameters()]
    runs = [json.loads(o.splitlines()[-1]) for o in outs]
    return {hook: [[np.array(a, np.uint32).view(np.float32).reshape(s) for a, s in zip(run[hook], shapes)]
                   for run in runs] for hook in ("plain", "blockfp")}


@pytest.mark.slow             # two gloo rank processes (each imports torch): ~15 s on a busy machine
def test_ddp_trains_like_gloo_and_the_block_fp_hook_is_bit_exact(tmp_path):
    """2 ranks, 3 SGD steps of a small MLP. The float path: every rank ends with the same parameters, and
    gloo's within 1e-6 (the sums' rounding order differs). The block floating point hook: the same bits on
    the switch, with the ranks on the switch's ports in the other order, and on gloo."""
    ranks = 2
    cais_plain = run_ranks(train, ranks)
    cais_bfp = run_ranks(lambda r: train(r, hooks.block_fp_hook), ranks)
    cais_bfp_swapped = run_ranks(lambda r: train(r, hooks.block_fp_hook), ranks, rank_ports=[3, 0])
    gloo = gloo_run(tmp_path, ranks)
    gloo_plain, gloo_bfp = gloo["plain"], gloo["blockfp"]
    for r in range(ranks):
        for a, b in zip(cais_plain[r], cais_plain[0]):
            assert np.array_equal(a, b)
        for a, g in zip(cais_plain[r], gloo_plain[r]):
            np.testing.assert_allclose(a, g, rtol=0, atol=1e-6)
        for a, b, g in zip(cais_bfp[r], cais_bfp_swapped[r], gloo_bfp[r]):
            assert a.tobytes() == b.tobytes() == g.tobytes()
    # the ranks did move the parameters (the comparison above is not of untrained models)
    assert not np.allclose(cais_plain[0][0], make_model()[0].weight.detach().numpy())


def test_block_fp_hook_equals_the_numpy_reference():
    """Two DDP steps with the hook (DDP rebuilds its buckets after the first): every rank's gradient of
    each parameter is block_fp_reference of the ranks' local gradients of it (computed here without any
    communication), bit for bit."""
    got = run_ranks(lambda r: ddp_grads(r, lambda ddp: ddp.register_comm_hook(hooks.BlockFPState(),
                                                                               hooks.block_fp_hook)), N)
    for step in range(2):
        local = [local_grads(r, step) for r in range(N)]
        for k in range(len(local[0])):
            want = hooks.block_fp_reference([local[r][k] for r in range(N)])
            for g in got:
                assert g[step][k].tobytes() == want.tobytes(), (step, k)
            # and it is the mean, to the block's grid
            np.testing.assert_allclose(want, np.mean([local[r][k] for r in range(N)], axis=0), atol=1e-6)


def local_grads(rank, step):
    """Rank `rank`'s gradients at `step` of the initial model, computed alone (no communication)."""
    model = make_model()
    x, y = batch(rank, step)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.reshape(-1).numpy() for p in model.parameters()]


def ddp_grads(rank, register=None, steps=2):
    """The gradients DDP leaves on each parameter for `steps` batches of the initial model (no optimizer
    step); `register(ddp)` installs a hook."""
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if register is not None:
        register(ddp)
    out = []
    for step in range(steps):
        model.zero_grad()
        x, y = batch(rank, step)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        out.append([p.grad.reshape(-1).numpy().copy() for p in model.parameters()])
    return out


def test_allreduce_hook_is_the_mean_as_torchs_own_hook():
    """hooks.allreduce_hook on the "cais" group: each gradient is the mean of the ranks' local gradients
    (numpy, to float32 rounding) and bit for bit what torch's own allreduce_hook gives (DDP without a hook
    multiplies by 1/N instead of dividing: the last bit may differ)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    got = run_ranks(lambda r: ddp_grads(r, lambda ddp: ddp.register_comm_hook(None, hooks.allreduce_hook)), N)
    plain = run_ranks(lambda r: ddp_grads(r, lambda ddp: ddp.register_comm_hook(None, default_hooks.allreduce_hook)), N)
    for step in range(2):
        local = [local_grads(r, step) for r in range(N)]
        for k in range(len(local[0])):
            want = np.mean([local[r][k] for r in range(N)], axis=0)
            for g, p in zip(got, plain):
                np.testing.assert_allclose(g[step][k], want, rtol=0, atol=1e-6)
                assert g[step][k].tobytes() == p[step][k].tobytes(), (step, k)


# ---------------------------------------------------------------------- errors
def test_bad_tensors_and_ops_are_named():
    """Through torch's own all_reduce: another device, a type and an op the backend has not, each an error
    naming it on every rank; the group goes on after them. (torch passes complex tensors as real pairs
    for SUM: they work, see test_complex_goes_as_real_pairs.)"""
    def fn(rank):
        errors = []
        for t, op in ((torch.empty(3, device="meta"), dist.ReduceOp.SUM),      # no CUDA here: the same check
                      (torch.zeros(2, dtype=torch.uint32), dist.ReduceOp.SUM),
                      (torch.ones(2), dist._make_nccl_premul_sum(2.0))):
            try:
                dist.all_reduce(t, op=op)
                errors.append(None)
            except (TypeError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")
        t = torch.ones(3)
        dist.all_reduce(t)
        return errors, t.tolist()

    for errors, after in run_ranks(fn, 2):
        assert errors[0].startswith("ValueError") and "a meta tensor" in errors[0] and "CPU only" in errors[0]
        assert errors[1].startswith("TypeError") and "torch.uint32" in errors[1]
        assert errors[2].startswith("ValueError") and "reduce op PREMUL_SUM is not supported" in errors[2]
        assert after == [2.0] * 3
    with pytest.raises(TypeError, match="complex64"):
        ct._Buf(torch.zeros(2, dtype=torch.complex64), "all_reduce")


def test_complex_goes_as_real_pairs():
    def fn(rank):
        c = torch.tensor([1 + 2j, -3j], dtype=torch.complex64) * (rank + 1)
        dist.all_reduce(c)
        return c.tolist()

    assert run_ranks(fn, 2) == [[3 + 6j, -9j]] * 2


def test_mismatched_shapes_and_unsupported_ops_fail_every_rank():
    def fn(rank):
        errors = []
        try:
            dist.all_reduce(torch.ones(4 if rank != 1 else 5))
        except ShapeMismatch as e:
            errors.append(str(e))
        try:
            dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
        except TypeError as e:
            errors.append(str(e))
        t = torch.ones(3)                          # the group goes on after both
        dist.all_reduce(t)
        return errors, t.tolist()

    for errors, after in run_ranks(fn, N):
        assert len(errors) == 2 and "disagree" in errors[0] and "torch.float32" in errors[1], errors
        assert after == [float(N)] * 3


def test_docs_in_process_example_runs():
    """docs/torch.md's run_ranks example gives what its comment says."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent.parent / "docs" / "torch.md").read_text()
    code = re.search(r"## In-process.*?```python\n(.*?)```", text, re.S).group(1)
    printed = []
    exec(compile(code, "docs/torch.md", "exec"), {"print": printed.append})
    assert printed == [[[6.0] * 4] * 3]


def test_contiguous_tensors_are_handed_over_without_a_copy():
    """The driver gets a numpy view of a contiguous tensor's own memory (bf16 as its bit patterns); only a
    strided tensor goes through a contiguous copy."""
    t = torch.arange(6, dtype=torch.float32)
    assert np.shares_memory(ct._Buf(t, "x").array, t.numpy())
    b = torch.zeros(4, dtype=torch.bfloat16)
    assert np.shares_memory(ct._Buf(b, "x").array, b.view(torch.int16).numpy())
    w = torch.zeros(8, requires_grad=True)
    assert np.shares_memory(ct._Buf(w, "x").array, w.detach().numpy())
    strided = torch.zeros(8)[::2]
    assert not np.shares_memory(ct._Buf(strided, "x").array, strided.numpy())


def test_completer_close_waits_for_the_works_it_was_given():
    """destroy_process_group() must not leave CAIS under a deployed collective still running: closing the
    completer returns only once every work it was handed has finished (tensor written, future set)."""
    class Done:
        def wait(self):
            return None

    completer = ct._Completer()
    finished = []
    works = [completer.submit(Done(), lambda i=i: finished.append(i), i) for i in range(50)]
    completer.close()
    assert finished == list(range(50))
    assert [w.get_future().value() for w in works] == list(range(50))


def test_send_meeting_send_fails_both_ranks():
    """An isend/isend exchange meets send with send: both ranks raise ShapeMismatch naming send/recv (before
    the check both got zeros, silently); the same exchange ordered (one rank receives first) delivers."""
    def fn(rank):
        peer = 1 - rank
        mine, got = torch.full((3,), float(rank + 10)), torch.zeros(3)
        try:
            for req in (dist.isend(mine, peer), dist.irecv(got, peer)):
                req.wait()
            error = None
        except ShapeMismatch as e:
            error = str(e)
        for step in ((dist.send, mine), (dist.recv, got)) if rank == 0 else ((dist.recv, got), (dist.send, mine)):
            step[0](step[1], peer)
        return error, got.tolist()

    for rank, (error, got) in enumerate(run_ranks(fn, 2)):
        assert error and "send/recv between ranks 0 and 1" in error, error
        assert got == [float(1 - rank + 10)] * 3


def test_block_fp_hook_nan_on_one_rank_fails_every_rank():
    """Rank 1's gradients hold NaN: the hook raises ValueError on both ranks (not only on rank 1, leaving
    rank 0 in an all-reduce rank 1 never joins), and the group goes on."""
    def fn(rank):
        model = make_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(hooks.BlockFPState(), hooks.block_fp_hook)
        x, y = batch(rank, 0)
        if rank == 1:
            x[0, 0] = float("nan")
        try:
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            error = None
        except (ValueError, RuntimeError) as e:
            error = str(e)
        t = torch.ones(2)
        dist.all_reduce(t)
        return error, t.tolist()

    (e0, after0), (e1, after1) = run_ranks(fn, 2)
    assert e0 and "another rank's gradients hold NaN or inf" in e0, e0
    assert e1 and "this rank's gradients hold NaN or inf" in e1, e1
    assert after0 == after1 == [2.0, 2.0]
