"""The co-simulation workload: ranks all-reduce seeded tensors through a switch backend.

``all_reduce_job(link, job)`` is the entry point every backend runs (``cais.sim.backends.run_backend``):
it wraps the link with the job's faults, builds the world (controller + one communicator per rank),
runs the collectives, checks every rank's result against numpy and returns a JSON-serialisable summary.
The same job gives the same summary on every backend (apart from timing figures).

Job keys: ranks, elements, op, dtype ("int32" default, "int16", "int8", "float16", "float32", "float64",
"bfloat16" or "bf16"), collectives (how many all-reduces in a row), seed, loss, duplicate, reorder (per
port, ingress and egress), config (Config overrides: float_mode, accumulate, reproducible, saturate, ...),
progress (a file to write progress to), fold_groups (a tree's leaves: lists of ranks, in port order; the
switches fold each leaf's ranks, then the leaves' partials, docs/protocol.md section 13).

Checks (every rank must also get the same bits):

* integers: equal to numpy's sum (wrapping) / max / min. With ``saturate``, int16/int8 sums clamp: with
  ``reproducible`` the reference is the clamped fold in rank order, without it the inputs are kept small
  enough that no partial sum in any order leaves the type's range.
* native floats (the switch's float units, or the host ring with the same numerics) with
  ``reproducible``: bit for bit the fold of the contributions in rank order, computed here independently
  with plain numpy (float32 / float16 additions, fp32 accumulation then one ``astype(float16)``; bf16
  through float32 with cais.numerics' conversions only).
* with ``fold_groups`` (an aggregation tree) the switch path's reference is the fold of each group's
  fold, in group order (floats: bit for bit whether or not ``reproducible`` is asked, as every switch
  folds in port order; saturating sums: clamped at every step of that fold).
* native floats without ``reproducible``: SUM within a bound for any order of additions, per element
  (:func:`native_sum_bound`), reported as the largest error against the exact (``math.fsum``) sum and the
  largest error/bound; MAX/MIN equal to the exact maximum/minimum (a zero may have either sign present).
* quantized floats (host-side quantization, :mod:`cais.quantize`): within the documented bound per
  element (SUM), or bit for bit the exact maximum/minimum, -0 below +0 (MAX/MIN).

The summary's ``routes`` says how the collectives ran: "switch native", "switch quantized", "ring" (native
numerics on the host ring) or "ring quantized".
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from cais import numerics
from cais import protocol as proto
from cais import quantize
from cais.comm import World
from cais.config import Config

from .faults import FaultSpec, FaultyLink

__all__ = ["all_reduce_job", "reference_reduce", "ring_bytes_per_rank", "float_inputs", "check_float_results",
           "rank_order_fold", "native_sum_bound", "check_native_float_results", "DTYPES"]

DTYPES = ("int32", "int16", "int8", "float16", "float32", "float64", "bfloat16")
DTYPE_ALIASES = {"bf16": "bfloat16"}
INT_TYPES = {"int32": np.int32, "int16": np.int16, "int8": np.int8}
# unit roundoff (half an ulp of 1) and smallest subnormal of each float wire type
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
TINY = {"float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}


def reference_reduce(arrays, op: proto.ReduceOp) -> np.ndarray:
    """The exact integer reduction, wrapped to the arrays' type (int32, int16 or int8)."""
    dtype = arrays[0].dtype
    bits = 8 * dtype.itemsize
    acc = np.stack([a.astype(np.int64) for a in arrays])
    out = {proto.ReduceOp.SUM: acc.sum(0), proto.ReduceOp.MAX: acc.max(0), proto.ReduceOp.MIN: acc.min(0)}[op]
    return ((out + 2**(bits - 1)) % 2**bits - 2**(bits - 1)).astype(dtype)


def saturating_fold(arrays, op: proto.ReduceOp) -> np.ndarray:
    """Integer reduction in rank order with every sum clamped to the type's range."""
    info = np.iinfo(arrays[0].dtype)
    acc = arrays[0].astype(np.int64)
    for a in arrays[1:]:
        acc = np.clip(acc + a, info.min, info.max) if op == proto.ReduceOp.SUM else (
            np.maximum(acc, a) if op == proto.ReduceOp.MAX else np.minimum(acc, a))
    return acc.astype(arrays[0].dtype)


def grouped_fold(arrays, groups, fold):
    """A tree's result: ``fold`` over the groups' ``fold`` results, each group's ranks in the order given."""
    return fold([fold([arrays[r] for r in group]) for group in groups])


def float_inputs(rng, ranks: int, elements: int, dtype, per_chunk: int) -> list[np.ndarray]:
    """Seeded float data: normal values times 2**[-8, 8] (a magnitude spread within chunks), about 2% zeros
    of either sign, and chunk 1 all zeros on every rank (when there is one)."""
    out = []
    for _ in range(ranks):
        x = rng.standard_normal(elements) * np.ldexp(1.0, rng.integers(-8, 9, elements))
        zeros = rng.random(elements) < 0.02
        x[zeros] = np.where(rng.random(zeros.sum()) < 0.5, -0.0, 0.0)
        x[per_chunk:2 * per_chunk] = 0.0
        out.append(x.astype(dtype))
    return out


def _as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a wire array as float64 (bf16 given as uint16 bits)."""
    if dtype == "bfloat16":
        return numerics.bf16_to_f32(a).astype(np.float64)
    return a.astype(np.float64)


def rank_order_fold(arrays, op: proto.ReduceOp, dtype: str, acc_fp32: bool) -> np.ndarray:
    """The reproducible result: the contributions folded in rank order, ``acc = acc op x_r``, with plain
    numpy (float32 / float16 arithmetic; bf16 through float32, rounded to bf16 after every step unless
    accumulated in fp32). `arrays` are float32 / float16 arrays or bf16 uint16 bits; returns the same type."""
    def f(acc, x):
        if op == proto.ReduceOp.SUM:
            return acc + x
        return np.maximum(acc, x) if op == proto.ReduceOp.MAX else np.minimum(acc, x)

    wide = acc_fp32 and op == proto.ReduceOp.SUM
    if dtype == "bfloat16":
        vals = [numerics.bf16_to_f32(a) for a in arrays]
        acc = vals[0]
        for v in vals[1:]:
            acc = f(acc, v) if wide else numerics.bf16_to_f32(numerics.f32_to_bf16(f(acc, v)))
        return numerics.f32_to_bf16(acc)
    if dtype == "float16" and wide:
        acc = arrays[0].astype(np.float32)
        for a in arrays[1:]:
            acc = acc + a.astype(np.float32)
        return acc.astype(np.float16)
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = f(acc, a)
    return acc


def native_sum_bound(arrays, dtype: str, acc_fp32: bool) -> tuple[np.ndarray, np.ndarray]:
    """(exact sum, bound) per element for a SUM of N contributions in any order and association.

    Each addition rounds to nearest with unit roundoff u (sums in the subnormal range are exact), so a
    chain of N - 1 additions is off by at most ``gamma(N-1) * sum|x|``, ``gamma(k) = k u / (1 - k u)``
    (Higham, Accuracy and Stability of Numerical Algorithms, 4.2). In the wire type (fp32, or fp16/bf16
    rounded at every step): ``gamma_wire(N-1) sum|x|``. fp16/bf16 accumulated in fp32 and rounded once:
    ``gamma_32(N-1) sum|x| + u_wire (|exact| + gamma_32(N-1) sum|x|) + tiny_wire / 2``.
    """
    vals = np.stack([_as_float(a, dtype) for a in arrays])
    n = len(arrays)
    exact = np.array([math.fsum(col) for col in vals.T]) if vals.size else np.zeros(0)
    total = np.abs(vals).sum(0)

    def gamma(u):
        k = (n - 1) * u
        return k / (1 - k)
    if acc_fp32 and dtype != "float32":
        g = gamma(UNIT_ROUNDOFF["float32"]) * total
        bound = g + UNIT_ROUNDOFF[dtype] * (np.abs(exact) + g) + TINY[dtype] / 2
    else:
        bound = gamma(UNIT_ROUNDOFF[dtype]) * total
    return exact, bound


def check_native_float_results(results, arrays, op: proto.ReduceOp, dtype: str, *, acc_fp32: bool,
                               reproducible: bool, paths: set, groups=None) -> dict:
    """Check results of the native float path (see the module docstring). `paths`: "switch" / "ring"."""
    same = all(np.array_equal(r.reshape(-1).view(np.uint8), results[0].reshape(-1).view(np.uint8))
               for r in results)
    flat = [r.reshape(-1) for r in results]
    if groups and paths == {"switch"}:      # a tree's fixed fold, whatever was asked
        reproducible = True
    if reproducible:
        if groups and paths == {"switch"}:
            want = grouped_fold(arrays, groups, lambda a: rank_order_fold(a, op, dtype, acc_fp32))
        else:
            want = rank_order_fold(arrays, op, dtype, acc_fp32)
        ok = all(np.array_equal(r.view(np.uint8), want.view(np.uint8)) for r in flat)
        err = max((float(np.max(np.abs(_as_float(r, dtype) - _as_float(want, dtype)), initial=0.0))
                   for r in flat), default=0.0)
        return {"ok": ok and same, "max_error": err if not ok else 0.0, "max_bound": 0.0,
                "max_error_over_bound": 0.0 if ok else float("inf")}
    if op == proto.ReduceOp.SUM:
        # the switch accumulates as the rule says; the ring always rounds to the wire type
        bounds = []
        if "switch" in paths:
            bounds.append(native_sum_bound(arrays, dtype, acc_fp32))
        if "ring" in paths or not bounds:
            bounds.append(native_sum_bound(arrays, dtype, False))
        exact = bounds[0][0]
        bound = np.max([b for _, b in bounds], axis=0)
        err = np.max([np.abs(_as_float(r, dtype) - exact) for r in flat], axis=0)
        ok = bool(np.all(err <= bound))
        ratio = float(np.max(err / np.where(bound > 0, bound, 1.0))) if err.size else 0.0
        return {"ok": ok and same, "max_error": float(err.max(initial=0.0)),
                "max_bound": float(bound.max(initial=0.0)), "max_error_over_bound": ratio}
    stack = np.stack([_as_float(a, dtype) for a in arrays])
    ref = stack.max(0) if op == proto.ReduceOp.MAX else stack.min(0)
    ok = True
    for r in flat:
        v = _as_float(r, dtype)
        ok &= bool(np.array_equal(v, ref))      # -0 == +0: which zero wins depends on the order
        zero = v == 0                           # but it is one of the zeros present
        present = (stack == 0) & (np.signbit(stack) == np.signbit(v)[None, :])
        ok &= bool(np.all(~zero | present.any(0)))
    return {"ok": ok and same, "max_error": 0.0 if ok else float("inf"), "max_bound": 0.0,
            "max_error_over_bound": 0.0 if ok else float("inf")}


def check_float_results(results, arrays, op: proto.ReduceOp, per_chunk: int, dtype: str | None = None) -> dict:
    """Compare every rank's quantized float result with the exact reduction of `arrays` (see the module's
    docstring). `dtype` "bfloat16": arrays and results are bf16 bits, quantized as float32 and the result
    rounded to bf16 once more."""
    bf16 = dtype == "bfloat16"
    if bf16:
        results = [numerics.bf16_to_f32(r) for r in results]
        arrays = [numerics.bf16_to_f32(a) for a in arrays]
    dtype, n = arrays[0].dtype, len(arrays)
    stack = np.stack([a.reshape(-1).astype(np.float64) for a in arrays])
    same = all(np.array_equal(r.view(np.uint8), results[0].view(np.uint8)) for r in results)
    if op == proto.ReduceOp.SUM:
        exact = np.array([math.fsum(col) for col in stack.T])
        e_max = np.max([quantize.chunk_exponents(a, per_chunk) for a in arrays], axis=0)
        bound = quantize.sum_error_bound(e_max, n, per_chunk, dtype, exact)
        if bf16:   # the float32 result rounded once more, to bf16
            bound = bound + UNIT_ROUNDOFF["bfloat16"] * (np.abs(exact) + bound) + TINY["bfloat16"] / 2
        err = np.max([np.abs(r.reshape(-1).astype(np.float64) - exact) for r in results], axis=0)
        ok = bool(np.all(err <= bound))
        ratio = float(np.max(err / np.where(bound > 0, bound, 1.0))) if err.size else 0.0
        return {"ok": ok and same, "max_error": float(err.max(initial=0.0)),
                "max_bound": float(bound.max(initial=0.0)), "max_error_over_bound": ratio}
    ref = stack.max(0) if op == proto.ReduceOp.MAX else stack.min(0)
    zero = ref == 0          # the tie -0/+0: MAX gives +0 if any rank has +0, MIN gives -0 if any has -0
    plus = ((stack == 0) & ~np.signbit(stack)).any(0)
    minus = ((stack == 0) & np.signbit(stack)).any(0)
    want_neg = ~plus if op == proto.ReduceOp.MAX else minus
    ref = np.where(zero, np.where(want_neg, -0.0, 0.0), ref).astype(dtype)
    ok = all(np.array_equal(r.reshape(-1).view(np.uint8), ref.view(np.uint8)) for r in results)
    return {"ok": ok and same, "max_error": 0.0 if ok else float("inf"), "max_bound": 0.0,
            "max_error_over_bound": 0.0 if ok else float("inf")}


def ring_bytes_per_rank(nbytes: int, ranks: int, mtu_payload: int = 1484, header: int = 30) -> int:
    """Bytes a rank of a ring all-reduce sends without loss: 2(N-1) blocks of about M/N bytes, in frames
    of at most `mtu_payload` bytes with `header` bytes each (acknowledgements not counted)."""
    if ranks < 2:
        return 0
    block = -(-nbytes // ranks)
    frames = max(1, -(-block // mtu_payload))
    return 2 * (ranks - 1) * (block + frames * header)


def route_label(path: str, mode: str) -> str:
    """"switch native", "switch quantized", "ring" (native numerics on the hosts) or "ring quantized"."""
    if mode == "quantized":
        return f"{path} quantized"
    return "switch native" if path == "switch" else "ring"


def make_inputs(rng, dtype: str, ranks: int, elements: int, per_chunk: int, *, small_ints: bool = False):
    """One collective's inputs: a list of per-rank arrays in the wire type (bf16 as uint16 bits)."""
    if dtype in INT_TYPES:
        t = INT_TYPES[dtype]
        info = np.iinfo(t)
        lo, hi = (-(info.max // ranks), info.max // ranks + 1) if small_ints else (info.min, info.max + 1)
        return [rng.integers(lo, hi, elements, dtype=np.int64).astype(t) for _ in range(ranks)]
    if dtype == "bfloat16":
        return [numerics.f32_to_bf16(x) for x in float_inputs(rng, ranks, elements, np.float32, per_chunk)]
    return float_inputs(rng, ranks, elements, np.dtype(dtype), per_chunk)


async def all_reduce_job(link, job: dict) -> dict:
    ranks = job.get("ranks", link.params.ports)
    op = proto.ReduceOp[job.get("op", "sum").upper()]
    elements = job["elements"]
    collectives = job.get("collectives", 1)
    config = Config.load(**job.get("config", {}))
    faults = FaultSpec(drop=job.get("loss", 0.0), duplicate=job.get("duplicate", 0.0),
                       reorder=job.get("reorder", 0.0), seed=job.get("seed", 0))
    flink = FaultyLink(link, faults) if faults.active else link
    dtype = job.get("dtype", "int32")
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)} (or bf16)")
    per_chunk = config.chunk_size // 4
    groups = job.get("fold_groups")
    rng = np.random.default_rng(job.get("seed", 0))
    saturate = config.saturate and dtype in ("int16", "int8") and op == proto.ReduceOp.SUM
    small = saturate and not config.reproducible
    inputs = [make_inputs(rng, dtype, ranks, elements, per_chunk, small_ints=small) for _ in range(collectives)]
    wire_name = "bf16" if dtype == "bfloat16" else None
    progress_file = job.get("progress")
    world = World(flink, ranks=ranks, config=config)
    done = [0] * ranks
    routes = [[None] * collectives for _ in range(ranks)]

    def rank_main(comm):
        out = []
        for k in range(collectives):
            work = comm.all_reduce(inputs[k][comm.rank], op=op, async_op=True, dtype=wire_name)
            out.append(work.wait())
            routes[comm.rank][k] = (work.path, work.numerics)
            done[comm.rank] += 1
        return out

    def report_progress(w: World):
        chunks, total = w.progress()
        with open(progress_file, "w") as f:
            f.write(f"{min(done)} {collectives} {chunks} {total} {link.cycle}\n")

    if progress_file:
        world.progress_hook = report_progress

    wall0, cpu0 = time.perf_counter(), time.process_time()
    cycle0 = link.cycle
    results = await world.run(rank_main)
    cycles = link.cycle - cycle0
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stats = await world.controller.evaluate(world.now)

    accuracy = {}
    if dtype in INT_TYPES:
        def want(k):
            if saturate and config.reproducible:
                if groups and {routes[r][k][0] for r in range(ranks)} == {"switch"}:
                    return grouped_fold(inputs[k], groups, lambda a: saturating_fold(a, op))
                return saturating_fold(inputs[k], op)
            return reference_reduce(inputs[k], op)
        correct = all(np.array_equal(results[r][k], want(k)) for r in range(ranks) for k in range(collectives))
    else:
        checks = []
        for k in range(collectives):
            res = [results[r][k] for r in range(ranks)]
            if routes[0][k][1] == "quantized":
                checks.append(check_float_results(res, inputs[k], op, per_chunk, dtype))
            else:
                checks.append(check_native_float_results(
                    res, inputs[k], op, dtype, acc_fp32=config.accumulate == "fp32",
                    reproducible=config.reproducible, paths={routes[r][k][0] for r in range(ranks)},
                    groups=groups))
        correct = all(c["ok"] for c in checks)
        accuracy = {key: max(c[key] for c in checks) for key in ("max_error", "max_bound", "max_error_over_bound")}
    digest = hashlib.sha256(b"".join(results[r][k].tobytes() for r in range(ranks)
                                     for k in range(collectives))).hexdigest()
    counters = stats.pop("counters")
    route_names = sorted({route_label(path, mode) for row in routes for path, mode in row})
    itemsize = inputs[0][0].dtype.itemsize
    return {
        "ranks": ranks, "elements": elements, "op": op.name.lower(), "dtype": dtype, "collectives": collectives,
        "float_mode": config.float_mode, "accumulate": config.accumulate, "reproducible": config.reproducible,
        "saturate": config.saturate, "float_units": world.controller.float_units,
        "correct": bool(correct), "result_sha256": digest, **accuracy,
        "cycles": cycles, "wall_s": wall, "cpu_s": cpu, "clock_hz": link.clock_hz,
        "frames_sent": world.frames_sent, "bytes_sent": world.bytes_sent,
        "retransmissions": world.retransmissions,
        "paths": sorted({c["path"] for c in world.collectives}),
        "routes": route_names,
        "ring_bytes_per_rank": ring_bytes_per_rank(itemsize * elements, ranks) * collectives,
        "faults": dict(getattr(flink, "stats", {})),
        "counters": counters, "stats": stats, "rule_retypes": world.controller.retypes,
        "decisions": [{"time_s": t, "group": g, "op_seq": s, "offload": d.offload, "score": d.score,
                       "reason": d.reason, "kind": str(d.kind)} for t, g, s, d in world.controller.decisions],
        "events": [{"time_s": t, "event": e} for t, e in world.controller.events],
    }
