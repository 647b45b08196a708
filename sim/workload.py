"""The co-simulation workload: ranks all-reduce seeded tensors through a switch backend.

``all_reduce_job(link, job)`` is the entry point every backend runs (``cais.sim.backends.run_backend``):
it wraps the link with the job's faults, builds the world (controller + one communicator per rank),
runs the collectives, checks every rank's result against numpy and returns a JSON-serialisable summary.
The same job gives the same summary on every backend (apart from timing figures).

Job keys: ranks, elements, op, collectives (how many all-reduces in a row), seed, loss, duplicate,
reorder (per port, ingress and egress), config (Config overrides), progress (a file to write progress to).
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from cais import protocol as proto
from cais.comm import World
from cais.config import Config

from .faults import FaultSpec, FaultyLink

__all__ = ["all_reduce_job", "reference_reduce", "ring_bytes_per_rank"]


def reference_reduce(arrays, op: proto.ReduceOp) -> np.ndarray:
    acc = np.stack([a.astype(np.int64) for a in arrays])
    out = {proto.ReduceOp.SUM: acc.sum(0), proto.ReduceOp.MAX: acc.max(0), proto.ReduceOp.MIN: acc.min(0)}[op]
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)


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
    rng = np.random.default_rng(job.get("seed", 0))
    inputs = [[rng.integers(-2**31, 2**31, elements, dtype=np.int64).astype(np.int32) for _ in range(ranks)]
              for _ in range(collectives)]
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

    correct = all(np.array_equal(results[r][k], reference_reduce(inputs[k], op))
                  for r in range(ranks) for k in range(collectives))
    digest = hashlib.sha256(b"".join(results[r][k].tobytes() for r in range(ranks)
                                     for k in range(collectives))).hexdigest()
    counters = stats.pop("counters")
    return {
        "ranks": ranks, "elements": elements, "op": op.name.lower(), "collectives": collectives,
        "correct": bool(correct), "result_sha256": digest,
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
