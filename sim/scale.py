"""Faults at scale and a switch reset in the middle of a collective (``make faults``).

``python -m cais.sim.scale`` runs, on the C++-driven Verilated switch (``--backend model`` for the
reference model):

* faults at scale: 8 ranks all-reduce 1,000 chunks (64,000 int32) with 10% loss, 5% duplication and 5%
  reordering on every port, both directions. Pass: every rank's result equals numpy's, the switch
  accepted each (chunk, rank) contribution exactly once (CONTRIBUTIONS = chunks x ranks: no double
  count although thousands of duplicates arrive), completed every chunk once, and its counters satisfy
  the accounting invariant (every frame received is forwarded, a contribution, a duplicate or a drop).
* reset: 4 ranks, the switch reset (tables, slots, frames in flight: everything) when a given fraction of
  the chunks is done. Pass: the controller notices it (EPOCH reads 0), programs the switch again, and
  every rank's result is still exact.

Both are deterministic for a seed (the faults are a function of the seed and the frames).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from cais.comm import World
from cais.config import Config
from cais.params import SwitchParams
from cais.protocol import ReduceOp

from .directed import accounting_problems
from .faults import FaultSpec, FaultyLink
from .workload import reference_reduce

__all__ = ["ResettingLink", "scale_job", "reset_job", "check_scale", "check_reset", "main"]


class ResettingLink:
    """A link that resets the switch behind it once, at the first ``advance`` after ``trigger(link)``
    says so, and keeps its cycle count going (the switch's own count starts at 0 again)."""

    def __init__(self, inner, trigger):
        self._inner, self._trigger = inner, trigger
        self._offset = 0
        self.reset_at: int | None = None

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def cycle(self) -> int:
        return self._inner.cycle + self._offset

    async def _maybe_reset(self) -> None:
        if self.reset_at is None and self._trigger(self):
            self.reset_at = self.cycle
            await self._inner.reset()
            self._offset = self.reset_at - self._inner.cycle

    async def advance(self, cycles: int) -> None:
        await self._maybe_reset()
        await self._inner.advance(cycles)

    async def advance_to_frame(self, cycles: int) -> int:
        await self._maybe_reset()
        return await self._inner.advance_to_frame(cycles)


def _inputs(ranks: int, elements: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-2**31, 2**31, elements, dtype=np.int64).astype(np.int32) for _ in range(ranks)]


async def _all_reduce_checked(world, data) -> tuple[bool, list[str]]:
    """One all-reduce (SUM) of ``data[rank]`` on every rank of ``world``: whether every result equals
    numpy's, and the paths the ranks took (sorted, each once)."""
    paths = [None] * len(data)

    def rank_main(comm):
        work = comm.all_reduce(data[comm.rank], async_op=True)
        out = work.wait()
        paths[comm.rank] = work.path
        return out

    results = await world.run(rank_main)
    want = reference_reduce(data, ReduceOp.SUM)
    return all(np.array_equal(r, want) for r in results), sorted(set(paths))


async def scale_job(link, job: dict) -> dict:
    """``job``: ranks, chunks, loss, duplicate, reorder, seed. Returns the summary :func:`check_scale` reads."""
    ranks, seed = job["ranks"], job.get("seed", 0)
    config = Config(offload="always", retry_limit=job.get("retry_limit", 64))
    elements = job["chunks"] * (config.chunk_size // 4)
    flink = FaultyLink(link, FaultSpec(drop=job["loss"], duplicate=job["duplicate"], reorder=job["reorder"],
                                       seed=seed))
    data = _inputs(ranks, elements, seed)
    world = World(flink, ranks=ranks, config=config)
    exact, paths = await _all_reduce_checked(world, data)
    counters = await world.controller.read_counters()
    return {"ranks": ranks, "chunks": job["chunks"], "elements": elements,
            "exact": exact, "paths": paths,
            "counters": counters, "faults": dict(flink.stats), "cycles": link.cycle,
            "retransmissions": int(sum(world.retransmissions))}


def check_scale(s: dict) -> list[str]:
    """What a faults-at-scale summary must show (empty: passed)."""
    c = s["counters"]
    problems = [] if s["exact"] else ["a rank's result differs from numpy's"]
    if s["paths"] != ["switch"]:
        problems.append(f"paths {s['paths']}: expected the switch only")
    if c["CONTRIBUTIONS"] != s["chunks"] * s["ranks"]:
        problems.append(f"CONTRIBUTIONS {c['CONTRIBUTIONS']} != chunks x ranks {s['chunks'] * s['ranks']}: "
                        "a contribution counted twice or lost")
    if c["COMPLETED"] != s["chunks"]:
        problems.append(f"COMPLETED {c['COMPLETED']} != chunks {s['chunks']}")
    if not c["DUPLICATES"] or not s["faults"].get("ingress_duplicated"):
        problems.append("no duplicates reached the switch: the run checks nothing about double counts")
    return problems + accounting_problems(c)


async def reset_job(link, job: dict) -> dict:
    """``job``: ranks, chunks, seed, at (fraction of the chunks done when the switch is reset)."""
    ranks, seed = job["ranks"], job.get("seed", 0)
    config = Config(offload="always", retry_limit=job.get("retry_limit", 64))
    elements = job["chunks"] * (config.chunk_size // 4)
    data = _inputs(ranks, elements, seed)
    holder = {}

    def trigger(_link):
        world = holder.get("world")
        if world is None:
            return False
        done, total = world.progress()
        return total > 0 and done >= job["at"] * total

    rlink = ResettingLink(link, trigger)
    world = holder["world"] = World(rlink, ranks=ranks, config=config)
    exact, paths = await _all_reduce_checked(world, data)
    return {"ranks": ranks, "chunks": job["chunks"], "exact": exact,
            "paths": paths, "reset_at": rlink.reset_at, "resets_noticed": world.controller.resets,
            "events": [e for _, e in world.controller.events], "cycles": rlink.cycle}


def check_reset(s: dict) -> list[str]:
    problems = [] if s["exact"] else ["a rank's result differs from numpy's"]
    if s["reset_at"] is None:
        problems.append("the switch was never reset: the run checks nothing")
    if s["paths"] != ["switch"]:
        problems.append(f"paths {s['paths']}: expected the switch only (programmed again after the reset)")
    if s["resets_noticed"] != 1:
        problems.append(f"the controller noticed {s['resets_noticed']} resets, expected 1")
    return problems


def main(argv=None) -> int:
    from .backends import run_backend
    ap = argparse.ArgumentParser(prog="python -m cais.sim.scale", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("verilator", "model"), default="verilator")
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.chunks < 8:
        ap.error(f"--chunks {args.chunks}: must be at least 8")
    bad = 0
    runs = (("faults at scale", SwitchParams(ports=8), "cais.sim.scale:scale_job", check_scale,
             {"ranks": 8, "chunks": args.chunks, "loss": 0.10, "duplicate": 0.05, "reorder": 0.05, "seed": args.seed}),
            ("reset mid-collective", SwitchParams(ports=4), "cais.sim.scale:reset_job", check_reset,
             {"ranks": 4, "chunks": max(8, args.chunks // 4), "at": 0.5, "seed": args.seed}))
    for name, params, entry, check, job in runs:
        t0 = time.monotonic()
        s = run_backend(args.backend, params, entry, job)
        problems = check(s)
        bad += bool(problems)
        shown = {k: v for k, v in s.items() if k not in ("counters", "events")}
        print(f"{name} ({args.backend}, {time.monotonic() - t0:.1f} s): {'ok' if not problems else 'FAILED'}")
        print("  " + json.dumps(shown))
        if "counters" in s:
            print("  counters: " + ", ".join(f"{k}={v}" for k, v in s["counters"].items() if v and not isinstance(v, list)))
        for p in problems:
            print("  " + p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
