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
* dead rank: 4 ranks, one killed (:meth:`cais.comm.World.kill`, as SIGKILL) when a given fraction of the
  chunks is done. Pass: a set ages without its contribution, the controller drops it, the survivors redo
  the collective on the host ring and each gets the reduction of the survivors' inputs, within the bound
  of :func:`dead_rank_bound_s` after the kill; their next collective runs on the switch, exact; the
  dead rank's sets are freed and the counters conserve (docs/reliability.md, "Dead ranks").

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

__all__ = ["ResettingLink", "KillingLink", "scale_job", "reset_job", "dead_rank_job", "check_scale", "check_reset",
           "check_dead_rank", "dead_rank_bound_s", "main"]


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


class KillingLink:
    """A link that calls ``trigger()`` before every ``advance`` (the world's thread: where
    :meth:`cais.comm.World.kill` may be called)."""

    def __init__(self, inner, trigger):
        self._inner, self._trigger = inner, trigger

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def advance(self, cycles: int) -> None:
        self._trigger()
        await self._inner.advance(cycles)

    async def advance_to_frame(self, cycles: int) -> int:
        self._trigger()
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


def dead_rank_bound_s(controller, survivors: int, nbytes: int) -> float:
    """How long after a rank's death the survivors have their result at the latest (lossless wires): the
    survivors' last accepted contributions (their windows, in flight at the death: one initial timeout),
    then the controller's detection bound (age, the switch's scan, two checks: Controller.detection_bound_s),
    then the redo on the host ring: 2 (n - 1) steps of nbytes / n bytes, each within one initial timeout
    plus twice its transfer at the link's bandwidth (headers and ACKs share the wire)."""
    bandwidth = controller.params.data_width / 8 * controller.link.clock_hz
    step = controller.config.timeout_s + 2 * nbytes / survivors / bandwidth
    return controller.config.timeout_s + controller.detection_bound_s() + 2 * (survivors - 1) * step


async def dead_rank_job(link, job: dict) -> dict:
    """``job``: ranks, chunks, victim, at (fraction of the chunks done when the victim is killed),
    set_age_ms, seed, loss (0: none; a drop rate on every port, both directions). Two all-reduces (SUM) on
    every rank; the victim dies in the first."""
    ranks, victim, seed = job["ranks"], job["victim"], job.get("seed", 0)
    config = Config(offload="always", set_age_ms=job["set_age_ms"])
    elements = job["chunks"] * (config.chunk_size // 4)
    first, second = _inputs(ranks, elements, seed), _inputs(ranks, elements, seed + 1)
    holder = {}

    def trigger():
        world = holder["world"]
        done, total = world.progress()
        if victim not in world.killed and total > 0 and done >= job["at"] * total:
            world.kill(victim)

    if job.get("loss"):
        link = FaultyLink(link, FaultSpec(drop=job["loss"], seed=seed))
    world = holder["world"] = World(KillingLink(link, trigger), ranks=ranks, config=config)
    paths = {}

    def rank_main(comm):
        outs = []
        for op, data in enumerate((first, second)):
            work = comm.all_reduce(data[comm.rank], async_op=True)
            outs.append(work.wait())
            paths[(comm.rank, op)] = work.path
        return outs

    results = await world.run(rank_main)
    ctl = world.controller
    survivors = [r for r in range(ranks) if r != victim]
    # the first collective: redone by the survivors (their inputs only), or, if the victim died after its
    # last contribution, completed by the switch with it
    redone = [reference_reduce([d[r] for r in survivors], ReduceOp.SUM) for d in (first, second)]
    everyone = reference_reduce(first, ReduceOp.SUM)
    finish = {(c["rank"], c["op_seq"]): c["time_s"] for c in world.collectives}
    counters = (await ctl.evaluate(world.now))["counters"]
    return {"ranks": ranks, "chunks": job["chunks"], "victim": victim,
            "killed_s": world.killed.get(victim), "victim_result": results[victim] is not None,
            "exact": [all(np.array_equal(results[r][op], redone[op]) for r in survivors) for op in (0, 1)],
            "first_with_victim": all(np.array_equal(results[r][0], everyone) for r in survivors),
            "paths": {f"{r}:{op}": p for (r, op), p in sorted(paths.items())},
            "finished_s": {str(r): finish.get((r, 0)) for r in survivors},
            "dropped": [[t, g, r, why] for t, g, r, why in ctl.dropped],
            "aged": ctl.aged, "bound_s": dead_rank_bound_s(ctl, len(survivors), elements * 4),
            "age_s": config.set_age_s, "timeout_s": config.timeout_s,
            "groups": [ctl.group_counters(g) for g in sorted(ctl.groups)],
            "counters": counters, "cycles": link.cycle}


def check_dead_rank(s: dict) -> list[str]:
    """What a dead-rank summary must show (empty: passed)."""
    problems = []
    survivors = [r for r in range(s["ranks"]) if r != s["victim"]]
    c = s["counters"]
    if s["killed_s"] is None:
        return ["the victim was never killed: the run checks nothing"]
    # Died before its last contribution: a set ages without it, the survivors redo the first collective on
    # the ring. After it: every chunk completed with it, it never finishes, the switch's result stands.
    redo = s["paths"][f"{survivors[0]}:0"] == "ring"
    if not (s["exact"][0] if redo else s["first_with_victim"]) or not s["exact"][1]:
        problems.append(f"exact {s['exact']}, with the victim {s['first_with_victim']}: a survivor's result is "
                        f"not the sum of the survivors' inputs ({'redone' if redo else 'the switch with the victim'})")
    if s["victim_result"]:
        problems.append("the killed rank returned a result")
    if [d[2] for d in s["dropped"]] != [s["victim"]]:
        problems.append(f"dropped {s['dropped']}: expected the victim {s['victim']} alone, once")
    elif ("aged sets" if redo else "did not finish") not in s["dropped"][0][3]:
        problems.append(f"dropped because {s['dropped'][0][3]!r}: not what a {'redo' if redo else 'completion'} "
                        "follows")
    if redo and (not s["aged"] or s["aged"][0]["missing"] != [s["victim"]]):
        problems.append(f"aged {s['aged'][:2]}: the first aged set must miss the victim only")
    for r in survivors:
        done = s["finished_s"][str(r)]
        if done is None or not done - s["killed_s"] <= s["bound_s"]:
            problems.append(f"rank {r} finished at {done} s, killed at {s['killed_s']} s: not within the bound "
                            f"{s['bound_s']:.6f} s")
        if s["paths"][f"{r}:0"] != s["paths"][f"{survivors[0]}:0"] or s["paths"][f"{r}:1"] != "switch":
            problems.append(f"rank {r} paths {s['paths'][f'{r}:0']}, {s['paths'][f'{r}:1']}: expected every "
                            "survivor's first on one path, the second on the switch")
    if s["dropped"] and not s["dropped"][0][0] - s["killed_s"] >= s["age_s"] - s["timeout_s"]:
        problems.append(f"the victim was dropped {s['dropped'][0][0] - s['killed_s']:.6f} s after its death: "
                        f"earlier than the set age {s['age_s']} s allows")
    if c["AGED_TOTAL"] != sum(c["AGED"]) or (redo and not c["AGED_TOTAL"]):
        problems.append(f"AGED_TOTAL {c['AGED_TOTAL']}, sum AGED {sum(c['AGED'])}: not equal, or no set aged")
    if c["SLOTS_IN_USE"] != sum(c["SETS_IN_USE"]):
        problems.append(f"SLOTS_IN_USE {c['SLOTS_IN_USE']} != sum SETS_IN_USE {c['SETS_IN_USE']}")
    group = s["groups"][0]
    if group["ranks"] != survivors or list(group["dropped"]) != [str(s["victim"])]:
        problems.append(f"group ranks {group['ranks']}, dropped {group['dropped']}: expected {survivors}")
    if c["COMPLETED"] < s["chunks"]:
        problems.append(f"COMPLETED {c['COMPLETED']}: the survivors' second collective did not run on the switch")
    return problems + accounting_problems(c)


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
             {"ranks": 4, "chunks": max(8, args.chunks // 4), "at": 0.5, "seed": args.seed}),
            ("dead rank", SwitchParams(ports=4), "cais.sim.scale:dead_rank_job", check_dead_rank,
             {"ranks": 4, "chunks": max(8, args.chunks // 4), "victim": 3, "at": 0.5, "set_age_ms": 2.0,
              "seed": args.seed}))
    for name, params, entry, check, job in runs:
        t0 = time.monotonic()
        s = run_backend(args.backend, params, entry, job)
        problems = check(s)
        bad += bool(problems)
        shown = {k: v for k, v in s.items() if k not in ("counters", "events", "aged", "groups")}
        print(f"{name} ({args.backend}, {time.monotonic() - t0:.1f} s): {'ok' if not problems else 'FAILED'}")
        print("  " + json.dumps(shown))
        if "counters" in s:
            print("  counters: " + ", ".join(f"{k}={v}" for k, v in s["counters"].items() if v and not isinstance(v, list)))
        for p in problems:
            print("  " + p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
