"""Co-simulation benchmark: simulated cycles per second per link, and the switch against the host ring.

1. Link speed: the `make sim` job (4 ranks all-reduce int32 through the driver and controller) on every
   link side by side in one run: the reference model, amaranth.sim, cocotb + Verilator, the C++-driven
   Verilator link, and the bare C++ clock loop of the same Verilated model (no wire touched). The slow
   links (amaranth, cocotb) run a smaller tensor (--slow-elements); cycles per second is a per-cycle rate,
   so the figures compare.
2. Switch against ring: for N = 2, 4, 8 ranks the same all-reduce forced onto the switch and onto the
   host ring (whose frames the same switch forwards), on the C++-driven link: bytes sent per rank and
   cycles to completion.

The C++-driven link and the bare loop run the profile-guided build of the model (the one `make sim` runs,
cais.sim.build.build_native with pgo); `--no-pgo` measures the plain build of the tests instead.

Each rate is given per wall second and per CPU second of the process (its own threads only: a loaded
machine slows the first but hardly the second, so the CPU ratio link / bare is the one to compare across runs
on a shared machine).

    python bench/bench_cosim.py [--elements 262144] [--slow-elements 16384] [--ranks 2,4,8] [--ring-elements 16384]
                                [--links model,amaranth,cocotb,verilator_cpp,bare_cpp] [--bare-cycles 2000000]
                                [--no-pgo] [--json]
"""

from __future__ import annotations

import json
import sys
import time

from cais.cmdline import Parser, integer
from cais.params import SwitchParams
from cais.sim.backends import run_backend

ENTRY = "cais.sim.workload:all_reduce_job"
#: link name in the report -> backend of run_backend (bare_cpp is timed separately)
LINKS = {"model": "model", "amaranth": "amaranth", "cocotb": "cocotb", "verilator_cpp": "verilator",
         "bare_cpp": None}
SLOW = ("amaranth", "cocotb")
BARE_CYCLES = 2_000_000


def _job(ranks: int, elements: int, offload: str = "auto") -> dict:
    return {"ranks": ranks, "elements": elements, "op": "sum", "seed": 1, "config": {"offload": offload}}


def bare_cpp_rate(params: SwitchParams, cycles: int = BARE_CYCLES, pgo: bool = True) -> tuple[float, float]:
    """Cycles per wall second and per CPU second of the Verilated model with only its clock toggled, from C++."""
    from cais.sim.links.verilator import VerilatorLink

    link = VerilatorLink(params, pgo=pgo)
    try:
        link.bare_clock(1000)                       # warm up
        t0, c0 = time.perf_counter(), time.process_time()
        link.bare_clock(cycles)
        return cycles / (time.perf_counter() - t0), cycles / (time.process_time() - c0)
    finally:
        link.close()


def link_rates(links: list[str], elements: int, slow_elements: int, bare_cycles: int = BARE_CYCLES,
               pgo: bool = True) -> dict:
    params = SwitchParams(ports=4)
    rows = {}
    for name in links:
        if name == "bare_cpp":
            wall_rate, cpu_rate = bare_cpp_rate(params, bare_cycles, pgo)
            rows[name] = {"cycles_per_s": wall_rate, "cycles_per_cpu_s": cpu_rate, "elements": 0,
                          "cycles": bare_cycles, "wall_s": None, "correct": None}
            continue
        n = slow_elements if name in SLOW else elements
        t0 = time.perf_counter()
        s = run_backend(LINKS[name], params, ENTRY, _job(4, n), **({"pgo": pgo} if name == "verilator_cpp" else {}))
        wall = time.perf_counter() - t0
        if not s["correct"]:
            raise SystemExit(f"{name}: wrong all-reduce result")
        # the job's own wall clock covers the collective only (not building or starting a simulator)
        rows[name] = {"cycles_per_s": s["cycles"] / s["wall_s"],
                      "cycles_per_cpu_s": s["cycles"] / s["cpu_s"] if s.get("cpu_s") else None,
                      "elements": n, "cycles": s["cycles"], "wall_s": wall, "correct": True}
    return rows


def switch_vs_ring(ranks: list[int], elements: int, extra: dict | None = None) -> list[dict]:
    """Per N: the all-reduce forced onto the switch and onto the host ring, on the C++-driven link of
    ``SwitchParams(ports=N, **extra)`` (chunks of its max_payload)."""
    out = []
    for n in ranks:
        runs = {}
        params = SwitchParams(ports=n, **(extra or {}))
        for path in ("always", "never"):
            job = _job(n, elements, path)
            job["config"]["chunk_size"] = params.max_payload
            s = run_backend("verilator", params, ENTRY, job)
            if not s["correct"]:
                raise SystemExit(f"N={n}, offload {path}: wrong all-reduce result")
            runs[path] = s
        ring_bytes = sum(runs["never"]["bytes_sent"]) / n
        for path, label in (("always", "switch"), ("never", "ring")):
            s = runs[path]
            per_rank = sum(s["bytes_sent"]) / n
            out.append({"ranks": n, "path": label, "bytes_per_rank": per_rank, "ratio": per_rank / ring_bytes,
                        "limit": n / (2 * (n - 1)) if label == "switch" else 1.0, "cycles": s["cycles"],
                        "cycles_per_s": s["cycles"] / s["wall_s"]})
    return out


def parse_args(argv):
    ap = Parser(prog="bench/bench_cosim.py", description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=integer(1), default=262144,
                    help="int32 elements per rank (model, verilator_cpp)")
    ap.add_argument("--slow-elements", type=integer(1), default=16384,
                    help="int32 elements per rank on the slow links (amaranth, cocotb)")
    ap.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts for switch vs ring (2..16)")
    ap.add_argument("--ring-elements", type=integer(1), default=16384,
                    help="int32 elements per rank for switch vs ring")
    ap.add_argument("--bare-cycles", type=integer(1000), default=BARE_CYCLES,
                    help="cycles of the bare C++ clock loop (bare_cpp)")
    ap.add_argument("--links", default=",".join(LINKS), help=f"comma-separated subset of {', '.join(LINKS)}")
    ap.add_argument("--no-pgo", dest="pgo", action="store_false",
                    help="the plain build of the C++-driven model (verilator_cpp, bare_cpp), not the profile-guided one")
    ap.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    args = ap.parse_args(argv)
    try:
        args.ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else []
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: a comma-separated list of integers")
    if any(not 2 <= n <= 16 for n in args.ranks):
        ap.error(f"--ranks {args.ranks}: every count must be between 2 and 16")
    args.links = [name for name in args.links.split(",") if name]
    unknown = [name for name in args.links if name not in LINKS]
    if unknown:
        ap.error(f"--links: unknown {', '.join(unknown)}; choose from {', '.join(LINKS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rates = link_rates(args.links, args.elements, args.slow_elements, args.bare_cycles, args.pgo)
    ring = switch_vs_ring(args.ranks, args.ring_elements)
    cps = {name: row["cycles_per_s"] for name, row in rates.items()}
    ratios = {}
    if "verilator_cpp" in cps:
        for base in ("cocotb", "amaranth", "bare_cpp"):
            if base in cps:
                ratios[f"verilator_cpp/{base}"] = cps["verilator_cpp"] / cps[base]
    cpu_ratios = {}
    if "verilator_cpp" in rates and "bare_cpp" in rates and rates["verilator_cpp"]["cycles_per_cpu_s"]:
        cpu_ratios["verilator_cpp/bare_cpp"] = (rates["verilator_cpp"]["cycles_per_cpu_s"]
                                                / rates["bare_cpp"]["cycles_per_cpu_s"])
    if args.json:
        print(json.dumps({"cycles_per_s": cps, "ratios": ratios, "cpu_ratios": cpu_ratios, "links": rates,
                          "switch_vs_ring": ring,
                          "elements": args.elements, "slow_elements": args.slow_elements,
                          "ring_elements": args.ring_elements, "pgo": args.pgo}))
        return 0
    print(f"CAIS co-simulation benchmark: 4 ranks all-reduce int32 ({args.elements} elements per rank; "
          f"{args.slow_elements} on {', '.join(SLOW)}; the C++ model's {'profile-guided' if args.pgo else 'plain'} "
          f"build)")
    print()
    print(f"{'link':>14} {'elements':>9} {'cycles':>9} {'wall s':>7} {'cycles/s':>10} {'cycles/CPU s':>12}")
    for name, row in rates.items():
        wall = f"{row['wall_s']:.1f}" if row["wall_s"] is not None else "-"
        cpu = f"{row['cycles_per_cpu_s']:.0f}" if row["cycles_per_cpu_s"] else "-"
        print(f"{name:>14} {row['elements'] or '-':>9} {row['cycles']:>9} {wall:>7} {row['cycles_per_s']:>10.0f} "
              f"{cpu:>12}")
    for key, value in ratios.items():
        print(f"  {key}: {value:.2f}" + (f" (per CPU second: {cpu_ratios[key]:.2f})" if key in cpu_ratios else ""))
    if ring:
        print()
        print(f"switch against host ring, {args.ring_elements} int32 elements per rank, C++-driven link:")
        print(f"{'N':>3} {'path':>7} {'bytes/rank':>11} {'ratio':>6} {'limit':>6} {'cycles':>9} {'cycles/s':>9}")
        for r in ring:
            print(f"{r['ranks']:>3} {r['path']:>7} {r['bytes_per_rank']:>11.0f} {r['ratio']:>6.3f} {r['limit']:>6.3f} "
                  f"{r['cycles']:>9} {r['cycles_per_s']:>9.0f}")
        print()
        print("ratio: bytes a rank sends divided by what it sends on the host ring (acknowledgements included);")
        print("limit: N/(2(N-1)), the payload-only ratio for large tensors.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
