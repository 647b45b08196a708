"""Aggregation trees (docs/protocol.md section 13) on reference-model switches: completion cycles of a
leaf-spine tree against one switch with the same ranks and against the host ring, and the extra latency of
one tree level, derived and measured.

    python bench/bench_tree.py [--ranks 8 16] [--leaves 2] [--elements 16384] [--seed 1] [--json]

For each rank count N (4..16, a multiple of ``--leaves``) the tree has ``--leaves`` leaves (default 2) of
N/leaves ranks under a spine (:class:`cais.controller.tree.TreeTopology`). Completion: the same all-reduce job
(N ranks x ``elements`` int32) on the tree (:func:`cais.sim.tree.run_tree`), on one N-port switch and on the
host ring crossing the tree. Latency: one 256-byte chunk, every rank sending at cycle 0, the cycle the first
beat of the result reaches the ranks, on one switch and on the tree; the derivation adds the links' documented
latencies (:func:`cais.sim.timing.documented_latency`, per switch build) and the frames' beats, as the model's
time model (:class:`cais.sim.links.model.ModelLink`) and the fabric
(:class:`cais.sim.links.fabric.FabricLink`: a frame crosses a switch-to-switch wire once it has left the
sender, so each hop costs its beats) define them. ``--backend verilator`` measures the same on the Verilated
RTL: every switch of the tree (leaves with the uplink action, N/leaves + 1 ports; the spine the default 4-port
build, at least a port per leaf) and the one switch of N ports (a build per rank count: the first run builds
them, minutes each). The derivation stays the model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # noqa: E402 - run from a checkout

from cais import protocol as proto
from cais.cmdline import Parser, integer
from cais.controller.tree import TreeTopology
from cais.link import run_sync
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.links.fabric import FabricLink
from cais.sim.links.model import ModelLink
from cais.sim.timing import documented_latency
from cais.sim.tree import compare, topology_of
from cais.tables import Rule, rule_writes

PAYLOAD = 256           # bytes of the latency probe's chunk (64 int32)


def parse_args(argv=None):
    ap = Parser(prog="bench/bench_tree.py", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=integer(4), nargs="+", default=[8, 16],
                    help="rank counts (4..16, multiples of --leaves): --leaves leaves of N/leaves ranks each")
    ap.add_argument("--leaves", type=integer(2), default=2, help="leaf switches under the spine (default 2)")
    ap.add_argument("--elements", type=integer(1), default=16384, help="int32 elements per rank")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", choices=["model", "verilator"], default="model",
                    help="the switches: reference models (default) or the Verilated RTL")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = ap.parse_args(argv)
    for n in args.ranks:
        if n % args.leaves or n > 16:
            ap.error(f"--ranks {n}: must be a multiple of --leaves {args.leaves} and at most 16 ({args.leaves} "
                     f"leaves of N/{args.leaves} ranks)")
    return args


def _beats(nbytes: int, params: SwitchParams) -> int:
    return -(-nbytes // params.beat_bytes)


def derived_latency(topology: TreeTopology) -> dict:
    """First beat of the result at the ranks, in cycles from the contributions' first beat (cycle 0)."""
    leaf, spine = topology.leaf_params, topology.spine_params
    single = SwitchParams(ports=topology.ranks)
    frame = proto.HEADERS_BYTES + PAYLOAD
    b = _beats(frame, leaf)
    one = b - 1 + documented_latency(single, PAYLOAD)
    # leaf: the partial's first beat; it crosses the wire whole, the spine takes its beats again, decides;
    # the result back the same way; the leaf's result to its ranks
    partial = b - 1 + documented_latency(leaf, PAYLOAD)
    at_spine = partial + b + b                       # fully out of the leaf, then fully into the spine
    result = at_spine - 1 + documented_latency(spine, PAYLOAD)
    at_leaf = result + b + b
    tree = at_leaf - 1 + documented_latency(leaf, PAYLOAD)
    return {"one_switch": one, "tree": tree, "extra": tree - one}


async def _probe(link, ranks: int, regs) -> int:
    for addr, value in rule_writes(regs, 0, Rule.for_group(1, (1 << ranks) - 1, base=0, count_log2=0)):
        await link.write(addr, value)
    if isinstance(link, FabricLink):
        await link.write(regs["EPOCH"].address(), 1)       # the tree's uplinks
    start = link.cycle
    values = np.arange(PAYLOAD // 4, dtype=">i4")
    for r in range(ranks):
        hdr = proto.CaisHeader(group_id=1, seq_num=0, payload_len=PAYLOAD)
        link.send(r, proto.build_frame(hdr, values.tobytes(), src=0x02_00_00_00_01_00 | r))
    firsts: dict[int, int] = {}
    while len(firsts) < ranks and link.cycle - start < 100_000:
        await link.advance(1)
        for got in link.take_stamped():
            firsts.setdefault(got.port, got.first)
    if len(firsts) < ranks:
        raise RuntimeError(f"latency probe: only {len(firsts)} of {ranks} ranks got a result")
    return min(firsts.values()) - start


def measured_latency(topology: TreeTopology, backend: str = "model") -> dict:
    if backend == "model":
        single = ModelLink(SwitchParams(ports=topology.ranks), reg_cycles=0)
        one = run_sync(_probe(single, topology.ranks, register_map(single.params)))
        fabric = FabricLink(topology, reg_cycles=0)
        tree = run_sync(_probe(fabric, topology.ranks, fabric.bus.regs))
        return {"one_switch": one, "tree": tree, "extra": tree - one}
    from cais.sim.links.verilator import VerilatorLink
    links = [VerilatorLink(SwitchParams(ports=topology.ranks))]
    try:
        one = run_sync(_probe(links[0], topology.ranks, register_map(links[0].params)))
        links += [VerilatorLink(topology.params(i)) for i in range(topology.switches)]
        fabric = FabricLink(topology, reg_cycles=0, switch_links=links[1:])
        tree = run_sync(_probe(fabric, topology.ranks, fabric.bus.regs))
    finally:
        for link in links:
            link.close()
    return {"one_switch": one, "tree": tree, "extra": tree - one}


def run(args) -> dict:
    rows = []
    for n in args.ranks:
        job = {"leaves": args.leaves, "ranks_per_leaf": n // args.leaves, "elements": args.elements,
               "seed": args.seed}
        if args.backend == "verilator":
            job.update(leaf_backend="verilator", spine_backend="verilator", single_backend="verilator")
        topology = topology_of(job)
        runs = compare(job)
        rows.append({
            "ranks": n, "leaves": args.leaves, "ranks_per_leaf": n // args.leaves, "elements": args.elements,
            "cycles": {name: r["cycles"] for name, r in runs.items()},
            "correct": {name: r["correct"] for name, r in runs.items()},
            "bytes_per_rank": {name: sum(r["bytes_sent"]) / len(r["bytes_sent"]) for name, r in runs.items()},
            "latency_derived": derived_latency(topology),
            "latency_measured": measured_latency(topology, args.backend),
        })
    return {"backend": args.backend, "rows": rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return 0
    kind = "reference-model switches" if args.backend == "model" else "the Verilated RTL"
    print(f"Aggregation trees on {kind}: {args.elements} int32 elements per rank, {args.leaves} leaves")
    print()
    print(f"{'ranks':>5} {'tree cycles':>12} {'one switch':>11} {'ratio':>6} {'host ring':>10} {'ratio':>6}  all correct")
    for r in out["rows"]:
        c = r["cycles"]
        print(f"{r['ranks']:>5} {c['leaf-spine']:>12} {c['one switch']:>11} {c['one switch'] / c['leaf-spine']:>6.3f} "
              f"{c['host ring']:>10} {c['host ring'] / c['leaf-spine']:>6.3f}  {all(r['correct'].values())}")
    print()
    print("latency of one 256-byte chunk (first result beat at the ranks, cycles from the first contribution beat)")
    print(f"{'ranks':>5} {'one switch':>11} {'tree':>6} {'extra level':>12}   derived: {'one':>5} {'tree':>6} {'extra':>6}")
    for r in out["rows"]:
        m, d = r["latency_measured"], r["latency_derived"]
        print(f"{r['ranks']:>5} {m['one_switch']:>11} {m['tree']:>6} {m['extra']:>12}   derived: "
              f"{d['one_switch']:>5} {d['tree']:>6} {d['extra']:>6}")
    return 0 if all(all(r["correct"].values()) for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
