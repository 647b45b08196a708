"""The co-simulation workload: ranks all-reduce seeded tensors through a switch backend.

``all_reduce_job(link, job)`` is the entry point every backend runs (``cais.sim.backends.run_backend``):
it wraps the link with the job's faults, builds the world (controller + one communicator per rank),
runs the collectives, checks every rank's result against numpy and returns a JSON-serialisable summary.
The same job gives the same summary on every backend (apart from timing figures).

Job keys: ranks, elements, op, dtype ("int32" default, "float16", "float32", "float64"), collectives
(how many all-reduces in a row), seed, loss, duplicate, reorder (per port, ingress and egress), config
(Config overrides), progress (a file to write progress to).

int32 results must equal numpy's exactly. Float results (host-side quantization, :mod:`cais.quantize`)
are checked against the exact sum (``math.fsum`` of the inputs) within the documented bound per element
(SUM), or must equal the exact maximum/minimum bit for bit, -0 below +0 (MAX/MIN); every rank must get
the same bits. The summary reports the largest error seen, the largest bound and their largest ratio.
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from cais import protocol as proto
from cais import quantize
from cais.comm import World
from cais.config import Config

from .faults import FaultSpec, FaultyLink

__all__ = ["all_reduce_job", "reference_reduce", "ring_bytes_per_rank", "float_inputs", "check_float_results"]

DTYPES = ("int32", "float16", "float32", "float64")


def reference_reduce(arrays, op: proto.ReduceOp) -> np.ndarray:
    acc = np.stack([a.astype(np.int64) for a in arrays])
    out = {proto.ReduceOp.SUM: acc.sum(0), proto.ReduceOp.MAX: acc.max(0), proto.ReduceOp.MIN: acc.min(0)}[op]
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)


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


def check_float_results(results, arrays, op: proto.ReduceOp, per_chunk: int) -> dict:
    """Compare every rank's float result with the exact reduction of `arrays` (see the module's docstring)."""
    dtype, n = arrays[0].dtype, len(arrays)
    stack = np.stack([a.reshape(-1).astype(np.float64) for a in arrays])
    same = all(np.array_equal(r.view(np.uint8), results[0].view(np.uint8)) for r in results)
    if op == proto.ReduceOp.SUM:
        exact = np.array([math.fsum(col) for col in stack.T])
        e_max = np.max([quantize.chunk_exponents(a, per_chunk) for a in arrays], axis=0)
        bound = quantize.sum_error_bound(e_max, n, per_chunk, dtype, exact)
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


async def all_reduce_job(link, job: dict) -> dict:
    ranks = job.get("ranks", link.params.ports)
    op = proto.ReduceOp[job.get("op", "sum").upper()]
    elements = job["elements"]
    collectives = job.get("collectives", 1)
    config = Config.load(**job.get("config", {}))
    faults = FaultSpec(drop=job.get("loss", 0.0), duplicate=job.get("duplicate", 0.0),
                       reorder=job.get("reorder", 0.0), seed=job.get("seed", 0))
    flink = FaultyLink(link, faults)
    dtype = job.get("dtype", "int32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    per_chunk = config.chunk_size // 4
    rng = np.random.default_rng(job.get("seed", 0))
    if dtype == "int32":
        inputs = [[rng.integers(-2**31, 2**31, elements, dtype=np.int64).astype(np.int32) for _ in range(ranks)]
                  for _ in range(collectives)]
    else:
        inputs = [float_inputs(rng, ranks, elements, np.dtype(dtype), per_chunk) for _ in range(collectives)]
    progress_file = job.get("progress")
    world = World(flink, ranks=ranks, config=config)
    done = [0] * ranks

    def rank_main(comm):
        out = []
        for k in range(collectives):
            out.append(comm.all_reduce(inputs[k][comm.rank], op=op))
            done[comm.rank] += 1
        return out

    def report_progress(w: World):
        chunks, total = w.progress()
        with open(progress_file, "w") as f:
            f.write(f"{min(done)} {collectives} {chunks} {total} {link.cycle}\n")

    if progress_file:
        world.progress_hook = report_progress

    wall0 = time.perf_counter()
    cycle0 = link.cycle
    results = await world.run(rank_main)
    cycles = link.cycle - cycle0
    wall = time.perf_counter() - wall0
    stats = await world.controller.evaluate(world.now)

    accuracy = {}
    if dtype == "int32":
        correct = all(np.array_equal(results[r][k], reference_reduce(inputs[k], op))
                      for r in range(ranks) for k in range(collectives))
    else:
        checks = [check_float_results([results[r][k] for r in range(ranks)], inputs[k], op, per_chunk)
                  for k in range(collectives)]
        correct = all(c["ok"] for c in checks)
        accuracy = {key: max(c[key] for c in checks) for key in ("max_error", "max_bound", "max_error_over_bound")}
    digest = hashlib.sha256(b"".join(results[r][k].tobytes() for r in range(ranks)
                                     for k in range(collectives))).hexdigest()
    counters = stats.pop("counters")
    return {
        "ranks": ranks, "elements": elements, "op": op.name.lower(), "dtype": dtype, "collectives": collectives,
        "correct": bool(correct), "result_sha256": digest, **accuracy,
        "cycles": cycles, "wall_s": wall, "clock_hz": link.clock_hz,
        "frames_sent": world.frames_sent, "bytes_sent": world.bytes_sent,
        "retransmissions": world.retransmissions,
        "paths": sorted({c["path"] for c in world.collectives}),
        "ring_bytes_per_rank": ring_bytes_per_rank(4 * elements, ranks) * collectives,
        "faults": dict(flink.stats),
        "counters": counters, "stats": stats,
        "decisions": [{"time_s": t, "group": g, "op_seq": s, "offload": d.offload, "score": d.score,
                       "reason": d.reason} for t, g, s, d in world.controller.decisions],
        "events": [{"time_s": t, "event": e} for t, e in world.controller.events],
    }
