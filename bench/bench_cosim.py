"""Co-simulation benchmark: in-network all-reduce against the host ring, on the Verilated switch.

For N = 2, 4, 8 ranks (one per port) it runs the same all-reduce twice through the driver and
controller, once forced onto the switch and once forced onto the host ring (whose frames the same
switch forwards), and prints bytes sent per rank, cycles to completion, and the co-simulation's
simulated cycles per second next to a bare clock-only cocotb run of the same model in the same process.

    python bench/bench_cosim.py [--elements 16384] [--ranks 2,4,8] [--backend verilator|amaranth|model]
"""

from __future__ import annotations

import argparse
import sys

from cais.params import SwitchParams
from cais.sim.backends import run_backend

ENTRY = "cais.sim.workload:all_reduce_job"
BACKENDS = {"verilator": "cocotb", "amaranth": "amaranth", "model": "model"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=16384, help="int32 elements per rank")
    ap.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts (2..16)")
    ap.add_argument("--backend", choices=list(BACKENDS), default="verilator")
    args = ap.parse_args(argv)
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: a comma-separated list of integers")
    if any(not 2 <= n <= 16 for n in ranks):
        ap.error(f"--ranks {args.ranks}: every count must be between 2 and 16")
    if args.elements < 1:
        ap.error("--elements must be at least 1")
    kind = BACKENDS[args.backend]

    print(f"CAIS co-simulation benchmark: {args.elements} int32 elements per rank, backend {args.backend}")
    print()
    print(f"{'N':>3} {'path':>7} {'bytes/rank':>11} {'ratio':>6} {'limit':>6} {'cycles':>9} {'cycles/s':>9} "
          f"{'bare clock cycles/s':>20}")
    for n in ranks:
        params = SwitchParams(ports=n)
        rows = {}
        for path in ("always", "never"):
            job = {"ranks": n, "elements": args.elements, "op": "sum", "seed": 1,
                   "config": {"offload": path}, "bare_clock_cycles": 20000 if kind == "cocotb" else 0}
            s = run_backend(kind, params, ENTRY, job)
            if not s["correct"]:
                raise SystemExit(f"N={n}, {path}: wrong result")
            rows[path] = s
        ring_bytes = sum(rows["never"]["bytes_sent"]) / n
        for path, label in (("always", "switch"), ("never", "ring")):
            s = rows[path]
            per_rank = sum(s["bytes_sent"]) / n
            bare = s.get("bare_clock_cycles_per_s")
            print(f"{n:>3} {label:>7} {per_rank:>11.0f} {per_rank / ring_bytes:>6.3f} "
                  f"{n / (2 * (n - 1)) if label == 'switch' else 1.0:>6.3f} {s['cycles']:>9} "
                  f"{s['cycles'] / s['wall_s']:>9.0f} {f'{bare:.0f}' if bare else '-':>20}")
    print()
    print("ratio: bytes a rank sends divided by what it sends on the host ring (acknowledgements included);")
    print("limit: N/(2(N-1)), the payload-only ratio for large tensors; headers are 30 B per 256 B chunk on")
    print("the switch and 30 B per 1484 B fragment on the ring.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
