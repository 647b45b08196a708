"""Leaf-spine co-simulation: the ranks all-reduce through a tree of switches (docs/protocol.md section 13).

``run_tree(job)`` builds the tree of ``job`` (``leaves``, ``ranks_per_leaf``; the switches' build from
``params``, SwitchParams fields; ``leaf_uplink`` False builds leaves without the uplink action, a tree
that cannot aggregate; ``leaf_backend`` "verilator" puts every leaf on the Verilated RTL (a build with the
uplink action, ranks_per_leaf + 1 ports); ``spine_backend`` "verilator" puts the spine on the Verilated RTL,
``TreeTopology.spine_params_on``: the default build's) on
:class:`cais.sim.links.fabric.FabricLink`, with the job's faults (``loss``,
``duplicate``, ``reorder``, ``seed``) on every hop: the ranks' wires (as in a single-switch job) and both
directions of every switch-to-switch wire. It runs :func:`cais.sim.workload.all_reduce_job` there: the
ranks, the driver and the controller are those of one switch; the controller's rules become the tree's
through :class:`cais.controller.tree.TreeBus`. A tree that cannot aggregate (``TreeBus.check``) keeps
every collective on the host ring (``offload = never``), whose frames cross the tree.

The summary is the single-switch job's, plus ``tree``: the topology, whether it aggregated (``built``,
``reason``), each switch's counters, the hop faults, and the conservation check: with every collective on
the switches, each leaf counts chunks x (its ranks + 1) CONTRIBUTIONS (the parent's result is one) and
chunks PARTIALS_SENT, the spine chunks x leaves CONTRIBUTIONS, and every switch chunks COMPLETED,
whatever the faults.
"""

from __future__ import annotations

import numpy as np

from cais.allreduce import chunk_count
from cais.config import Config
from cais.link import DEFAULT_CLOCK_HZ
from cais.controller.tree import TreeTopology
from cais.params import SwitchParams

from .faults import FaultSpec
from .links.fabric import FabricLink, run_fabric
from .workload import DTYPE_ALIASES, all_reduce_job

__all__ = ["run_tree", "tree_job", "topology_of", "conservation"]

#: Offsets added to the job's seed for the hops' faults, so the hops and the ranks' wires draw apart.
HOP_SEED = 7919


BACKENDS = ("model", "verilator")
SPINE_BACKENDS = BACKENDS       # (the name it had when only the spine could be Verilated)


def topology_of(job: dict) -> TreeTopology:
    from dataclasses import replace
    base = SwitchParams(**job.get("params", {}))
    topology = TreeTopology(job["leaves"], job["ranks_per_leaf"], base=base)
    leaf = topology.leaf_params if job.get("leaf_uplink", True) else replace(topology.leaf_params, uplink=False)
    spine = topology.spine_params_on(job.get("spine_backend", "model"))
    return TreeTopology(job["leaves"], job["ranks_per_leaf"], base=base, leaf_params=leaf, spine_params=spine)


def conservation(topology: TreeTopology, counters: list[dict], chunks: int) -> list[str]:
    """What breaks the per-switch conservation of module docstring (empty: none)."""
    problems = []
    for i, c in enumerate(counters):
        leaf = i < topology.leaves
        name = f"leaf {i}" if leaf else "spine"
        want = {"CONTRIBUTIONS": chunks * (topology.ranks_per_leaf + 1 if leaf else topology.leaves),
                "COMPLETED": chunks}
        if leaf:
            want["PARTIALS_SENT"] = chunks
        problems += [f"{name}: {k} {c[k]} != {v}" for k, v in want.items() if c[k] != v]
    return problems


async def tree_job(link: FabricLink, job: dict) -> dict:
    problem = await link.bus.check()
    if problem:
        job = dict(job, config=dict(job.get("config", {}), offload="never"))
    t = link.topology
    groups = [list(range(leaf * t.ranks_per_leaf, (leaf + 1) * t.ranks_per_leaf)) for leaf in range(t.leaves)]
    summary = await all_reduce_job(link, dict(job, ranks=t.ranks, fold_groups=groups))
    counters = await link.switch_counters()
    config = Config.load(**job.get("config", {}))
    dtype = DTYPE_ALIASES.get(job.get("dtype", "int32"), job.get("dtype", "int32"))
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    on_switch = summary["paths"] == ["switch"] and summary["routes"] == ["switch native"]
    chunks = job.get("collectives", 1) * chunk_count(job["elements"], itemsize, config.chunk_size // itemsize
                                                      * itemsize) if on_switch else 0
    problems = conservation(link.topology, counters, chunks) if on_switch else []
    summary["tree"] = {
        "leaves": link.topology.leaves, "ranks_per_leaf": link.topology.ranks_per_leaf,
        "spine_backend": job.get("spine_backend", "model"), "leaf_backend": job.get("leaf_backend", "model"),
        "built": problem is None, "reason": problem or "every leaf has the uplink action",
        "switch_counters": counters, "hop_faults": dict(link.hop_stats), "unwired": link.unwired,
        "chunks": chunks, "conservation": problems,
    }
    summary["correct"] = bool(summary["correct"] and not problems and not link.unwired)
    return summary


def run_tree(job: dict) -> dict:
    """Run ``job`` (module docstring) on a fresh leaf-spine fabric; return the summary."""
    hop = FaultSpec(drop=job.get("loss", 0.0), duplicate=job.get("duplicate", 0.0), reorder=job.get("reorder", 0.0),
                    seed=job.get("seed", 0) + HOP_SEED)
    topology = topology_of(job)
    kinds = {}
    for role in ("leaf", "spine"):
        kinds[role] = job.get(f"{role}_backend", "model")
        if kinds[role] not in BACKENDS:
            raise ValueError(f"{role}_backend={kinds[role]!r}: expected one of {', '.join(BACKENDS)}")
    if kinds == {"leaf": "model", "spine": "model"}:
        return run_fabric(topology, lambda link: tree_job(link, job), hop_faults=hop)
    from .links.verilator import VerilatorLink
    clock_hz = job.get("clock_hz", DEFAULT_CLOCK_HZ)
    links = []
    try:
        for i in range(topology.switches):
            role = "leaf" if i < topology.leaves else "spine"
            links.append(VerilatorLink(topology.params(i), clock_hz=clock_hz) if kinds[role] == "verilator" else None)
        return run_fabric(topology, lambda link: tree_job(link, job), hop_faults=hop, switch_links=links)
    finally:
        for link in links:
            if link is not None:
                link.close()


def _job(args, config: Config) -> dict:
    return {"leaves": args.leaves, "ranks_per_leaf": args.ranks_per_leaf, "elements": args.elements, "op": args.op,
            "dtype": args.dtype, "collectives": args.collectives, "seed": args.seed, "loss": args.loss,
            "duplicate": args.duplicate, "reorder": args.reorder, "config": config.as_dict(),
            "spine_backend": args.spine_backend, "leaf_backend": args.leaf_backend,
            "single_backend": args.leaf_backend}


def compare(job: dict) -> dict:
    """The tree, one switch with a port per rank, and the host ring on the tree, on the same job: their
    summaries by name ("leaf-spine", "one switch", "host ring"). The one switch runs on
    ``job["single_backend"]`` ("model" unless given)."""
    from .backends import run_backend
    ranks = job["leaves"] * job["ranks_per_leaf"]
    single = SwitchParams(**dict(job.get("params", {}), ports=ranks))
    return {
        "leaf-spine": run_tree(job),
        "one switch": run_backend(job.get("single_backend", "model"), single, "cais.sim.workload:all_reduce_job",
                                  dict(job, ranks=ranks)),
        "host ring": run_tree(dict(job, config=dict(job.get("config", {}), offload="never"))),
    }


def main_leaf_spine(args, config: Config) -> int:
    """`make sim ARGS="--topology leaf-spine ..."`: the tree's job, its comparison, a report; 0 if CORRECT."""
    job = _job(args, config)
    print(f"CAIS leaf-spine co-simulation: {args.leaves} leaves x {args.ranks_per_leaf} ranks = {args.ranks} ranks x "
          f"{args.elements} {args.dtype} elements, {args.op}, {args.collectives} collective(s), "
          f"{'Verilated RTL' if args.leaf_backend == 'verilator' else 'model'} leaves, "
          f"{'Verilated RTL' if args.spine_backend == 'verilator' else 'model'} spine, "
          f"faults on every hop: loss {args.loss:.1%}, duplication {args.duplicate:.1%}, reordering "
          f"{args.reorder:.1%}, seed {args.seed}", flush=True)
    runs = compare(job)
    s = runs["leaf-spine"]
    t = s["tree"]
    print()
    print(f"result: {'CORRECT' if s['correct'] else 'WRONG'}: every rank's result equals the reference "
          f"({'the tree fold' if not args.dtype.startswith('int') else 'numpy'}; sha256 {s['result_sha256'][:16]}); "
          f"path: {', '.join(s['routes'])}")
    print(f"tree: {'aggregating' if t['built'] else 'not used, host ring'} ({t['reason']})")
    print()
    names = ["CONTRIBUTIONS", "COMPLETED", "PARTIALS_SENT", "PARTIALS_RESENT", "DUPLICATES", "RESULTS_RESENT"]
    print(f"{'switch':>8} " + " ".join(f"{n:>15}" for n in names) + "  drops")
    for i, c in enumerate(t["switch_counters"]):
        name = f"leaf {i}" if i < args.leaves else "spine"
        drops = {k[5:]: v for k, v in c.items() if k.startswith("DROP_") and v}
        print(f"{name:>8} " + " ".join(f"{c[n]:>15}" for n in names) + f"  {drops or 'none'}")
    if t["chunks"]:
        print(f"conservation ({t['chunks']} chunks): "
              + ("holds at every switch" if not t["conservation"] else "; ".join(t["conservation"])))
    print(f"faults injected: ranks' wires {({k: v for k, v in s['faults'].items() if v and not k.endswith('_frames')} or 'none')}; "
          f"switch-to-switch wires {({k: v for k, v in t['hop_faults'].items() if v and k != 'frames'} or 'none')}")
    print()
    base = runs["leaf-spine"]
    print(f"{'run':<24} {'cycles':>10} {'vs tree':>8} {'bytes per rank':>15} {'vs tree':>8}  result")
    for name, r in runs.items():
        label = (f"{name} ({args.ranks} ports{', RTL' if args.leaf_backend == 'verilator' else ''})"
                 if name == "one switch" else name)
        b = sum(r["bytes_sent"]) / len(r["bytes_sent"])
        b0 = sum(base["bytes_sent"]) / len(base["bytes_sent"])
        print(f"{label:<24} {r['cycles']:>10} {r['cycles'] / max(1, base['cycles']):>8.3f} {b:>15.0f} "
              f"{b / max(1.0, b0):>8.3f}  {'CORRECT' if r['correct'] else 'WRONG'} ({', '.join(r['routes'])})")
    print(f"(cycles at {s['clock_hz'] / 1e6:.2f} MHz; bytes per rank: what each rank sent, retransmissions included)")
    return 0 if all(r["correct"] for r in runs.values()) else 1
