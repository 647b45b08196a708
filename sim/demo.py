"""`make sim`: all-reduce an int32 tensor across the ports of the Verilated switch and report.

    python -m cais.sim.demo [--ports N] [--elements N] [--op sum|max|min] [--window N] [--seed N] [--waves]

Builds (or reuses) the Verilator model of the switch, runs the cocotb workload in ``cais.tb.demo`` (each
port is a worker with a window of outstanding chunks), checks the result against numpy and prints the
traffic each worker sent next to what a ring all-reduce would send.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from cais import protocol as proto
from cais.params import ParamError, SwitchParams


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def parse_args(argv):
    ap = _Parser(prog="python -m cais.sim.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=_positive, default=SwitchParams.ports, help="ports = workers (2..16)")
    ap.add_argument("--data-width", type=_positive, default=SwitchParams.data_width, help="bits per beat")
    ap.add_argument("--elements", type=_positive, default=65536, help="int32 elements per worker")
    ap.add_argument("--op", choices=[o.name.lower() for o in proto.ReduceOp], default="sum")
    ap.add_argument("--window", type=_positive, default=32,
                    help="chunks in flight per worker = the group's slot quota (a power of two)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--waves", action="store_true", help="write a VCD of the run")
    args = ap.parse_args(argv)
    try:
        params = SwitchParams(ports=args.ports, data_width=args.data_width)
    except ParamError as e:
        ap.error(str(e))
    if args.window & (args.window - 1) or args.window > params.slots:
        ap.error(f"--window {args.window}: must be a power of two no larger than the {params.slots} slots")
    return args, params


def main(argv=None) -> int:
    args, params = parse_args(argv)
    from cais.sim.build import build_switch, run_test

    t0 = time.perf_counter()
    build = build_switch(params, waves=args.waves)
    print(f"Verilator model: {build.build_dir} ({'cached' if build.cached else f'built in {time.perf_counter() - t0:.0f} s'})")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        job = {"params": params.as_dict(), "elements": args.elements, "op": args.op, "window": args.window,
               "seed": args.seed, "out": str(out)}
        print(f"all-reduce ({args.op}) of {args.elements} int32 elements on each of {params.ports} ports...",
              flush=True)
        try:
            run = run_test(build, "cais.tb.demo", "all_reduce_demo", extra_env={"CAIS_DEMO": json.dumps(job)})
        except AssertionError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
        summary = json.loads(out.read_text())
    report(params, args, summary)
    if args.waves and run.waves_file:
        print(f"waveform: {run.waves_file}")
    return 0 if summary["correct"] else 1


def report(params: SwitchParams, args, s: dict) -> None:
    P = params.ports
    c = s["counters"]
    tensor_bytes = 4 * args.elements
    ring_payload = 2 * (P - 1) * tensor_bytes / P
    per_frame = params.max_payload
    # The ring sends its 2(N-1) blocks of M/N bytes as ordinary frames of up to a full Ethernet payload.
    ring_mtu = params.max_frame - proto.ETH_HEADER_BYTES
    ring_frames = 2 * (P - 1) * -(-tensor_bytes // P // ring_mtu)
    ring_bytes = ring_payload + ring_frames * proto.ETH_HEADER_BYTES
    print()
    print(f"result: {'CORRECT' if s['correct'] else 'WRONG'} (every port's result equals numpy's {args.op})")
    print(f"chunks per worker: {s['chunks']} of {per_frame} B; window {args.window}; "
          f"duplicate results discarded: {s['duplicate_results']}")
    print()
    print(f"{'':>4} {'worker sent':>21} {'worker received':>21}   {'ring all-reduce':>15}")
    print(f"{'port':>4} {'frames':>10} {'bytes':>10} {'frames':>10} {'bytes':>10}   "
          f"{'bytes sent':>15} {'ratio':>6}")
    for p in range(P):
        ratio = c["RX_BYTES"][p] / ring_bytes
        print(f"{p:>4} {c['RX_FRAMES'][p]:>10} {c['RX_BYTES'][p]:>10} {c['TX_FRAMES'][p]:>10} {c['TX_BYTES'][p]:>10}"
              f"   {ring_bytes:>15.0f} {ratio:>6.3f}")
    print(f"(ring all-reduce sends 2(N-1)/N of the tensor per rank; payload-only limit of the ratio "
          f"N/(2(N-1)) = {P / (2 * (P - 1)):.3f})")
    in_beats = sum(c["RX_BYTES"]) / params.beat_bytes
    print()
    print(f"cycles to completion: {s['cycles']}; ingress beats per cycle: {in_beats / s['cycles']:.3f} (limit 1.0)")
    print(f"simulated cycles per wall second: {s['cycles'] / s['wall_s']:.0f}")
    print(f"completed chunks {c['COMPLETED']}, contributions {c['CONTRIBUTIONS']}, duplicates {c['DUPLICATES']}, "
          f"drops {sum(v for k, v in c.items() if k.startswith('DROP_'))}, slots in use {c['SLOTS_IN_USE']}")


if __name__ == "__main__":
    sys.exit(main())
