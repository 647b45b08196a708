"""`make sim`: ranks all-reduce a tensor through the switch with the driver and controller in charge.

    python -m cais.sim.cosim [--ranks 4] [--elements 262144] [--op sum] [--dtype int32] [--backend verilator|cocotb|amaranth|model]
                             [--loss 0.0] [--seed 1] [--collectives 1] [--config cais.toml] [--waves] [--no-pgo]
                             [--float-mode native|quantize] [--accumulate fp32|wire] [--reproducible]
                             [--topology single|leaf-spine] [--leaves 2] [--ranks-per-leaf 4]
                              [--leaf-backend model|verilator] [--spine-backend model|verilator] [--jumbo]

The default runs on the Verilated switch driven from C++ (cais.sim.links.verilator): 4 ranks, 256K int32
elements each. `--backend cocotb` runs the same Verilog under cocotb (cycle-identical, slower), `--backend
model` the numpy reference model, `--backend amaranth` the Amaranth design under amaranth.sim. `--loss` drops that fraction of frames on every port, in and out (seeded). `--dtype` is int32,
int16, int8 (exact, checked against numpy), float32, float16, bfloat16 (bf16) (reduced by the switch's
float units with `--float-mode native`, the default, when it has them; else quantized on the hosts) or
float64 (always quantized) (docs/driver.md). `--accumulate fp32` (default) sums fp16/bf16 in fp32 and
rounds once; `wire` rounds after every addition. `--reproducible` makes float results independent of the
arrival order; they are then checked bit for bit against a numpy fold in rank order, otherwise against
the exact reduction within a bound.

The Verilated switch is the profile-guided build (cais.sim.build.build_native: compiled twice, the second
time from the profile of a training job; the first `make sim` takes that much longer); `--no-pgo` takes the
plain build of the tests.

`--jumbo` runs the jumbo build (cais.params.JUMBO: 1,024-byte payloads, 16 slots) with 1,024-byte chunks
(unless `--config` sets a chunk_size other than the default): each rank's bytes come within 1% of the
all-reduce limit N/(2(N-1)) of a ring's, against 9.5% at the default 256-byte payloads.

`--topology leaf-spine` runs `--leaves` x `--ranks-per-leaf` ranks through an aggregation tree of
reference-model switches (leaves and a spine, docs/protocol.md section 13; `--ranks` is then ignored), with
the faults on every hop, and compares its cycles and bytes with one switch of that many ports and with the
host ring on the same tree (cais.sim.tree). `--leaf-backend verilator` runs the leaves on the Verilated RTL
(a build with the uplink action), `--spine-backend verilator` the spine; `--backend verilator` both, and
`--backend model` (the default with leaf-spine) neither unless those say otherwise.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from cais import protocol as proto
from cais.cmdline import Parser, integer, number
from cais.config import Config, ConfigError
from cais.params import JUMBO, SwitchParams
from cais.sim.workload import DTYPE_ALIASES, DTYPES

BACKENDS = {"verilator": "verilator", "cocotb": "cocotb", "amaranth": "amaranth", "model": "model"}
ENTRY = "cais.sim.workload:all_reduce_job"


def parse_args(argv):
    ap = Parser(prog="python -m cais.sim.cosim", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=integer(1), default=4, help="ranks, one per switch port (2..16)")
    ap.add_argument("--elements", type=integer(1), default=256 * 1024, help="elements per rank")
    ap.add_argument("--op", choices=[o.name.lower() for o in proto.ReduceOp], default="sum")
    ap.add_argument("--dtype", choices=list(DTYPES) + list(DTYPE_ALIASES), default="int32",
                    help="element type (float64 always, other floats without float units: host-side quantization)")
    ap.add_argument("--float-mode", choices=["native", "quantize"],
                    help="floats: the switch's float units (native, the default) or host-side quantization")
    ap.add_argument("--accumulate", choices=["fp32", "wire"],
                    help="fp16/bf16 SUM: accumulate in fp32 and round once (default), or round every addition")
    ap.add_argument("--reproducible", action="store_true",
                    help="results independent of the arrival order (fold in port order)")
    ap.add_argument("--backend", choices=list(BACKENDS),
                    help="the switch: verilator (the default), cocotb, amaranth or model (leaf-spine: model, the "
                         "default there, or verilator: every switch of the tree)")
    ap.add_argument("--topology", choices=["single", "leaf-spine"], default="single",
                    help="one switch, or an aggregation tree of leaves under a spine")
    ap.add_argument("--leaves", type=integer(2), default=2, help="leaf-spine: leaf switches (2..16)")
    ap.add_argument("--ranks-per-leaf", type=integer(1), default=4, help="leaf-spine: ranks on each leaf")
    ap.add_argument("--leaf-backend", choices=["model", "verilator"],
                    help="leaf-spine: the leaves on the model or on the Verilated RTL (default: --backend's)")
    ap.add_argument("--spine-backend", choices=["model", "verilator"],
                    help="leaf-spine: the spine on the model or on the Verilated RTL (default: --backend's)")
    ap.add_argument("--loss", type=number(0.0, 1.0), default=0.0, help="frame loss rate per port, each direction")
    ap.add_argument("--duplicate", type=number(0.0, 1.0), default=0.0, help="frame duplication rate per port")
    ap.add_argument("--reorder", type=number(0.0, 1.0), default=0.0, help="frame reordering rate per port")
    ap.add_argument("--collectives", type=integer(1), default=1, help="all-reduces in a row")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--config", type=Path, help="TOML file with a [cais] table of driver settings")
    ap.add_argument("--offload", choices=["auto", "always", "never"], help="override the offload decision")
    ap.add_argument("--waves", action="store_true", help="write a VCD (verilator and amaranth backends)")
    ap.add_argument("--no-pgo", dest="pgo", action="store_false",
                    help="the verilator backend's plain build (no profile-guided second compile)")
    ap.add_argument("--jumbo", action="store_true",
                    help=f"the jumbo build ({', '.join(f'{k} {v}' for k, v in JUMBO.items())}), chunks of its "
                         f"max_payload")
    args = ap.parse_args(argv)
    if args.loss + args.duplicate + args.reorder > 1.0:
        ap.error("--loss + --duplicate + --reorder must not exceed 1 (each frame suffers at most one fault)")
    if args.topology == "leaf-spine":
        if args.backend not in (None, "model", "verilator"):
            ap.error(f"--backend {args.backend}: --topology leaf-spine runs on the model or verilator")
        tree_backend = args.backend or "model"
        args.leaf_backend = args.leaf_backend or tree_backend
        args.spine_backend = args.spine_backend or tree_backend
        args.backend = "model"      # the one-switch comparison run
        from cais.controller.tree import TreeError, TreeTopology
        try:
            args.ranks = TreeTopology(args.leaves, args.ranks_per_leaf).ranks
        except TreeError as e:
            ap.error(str(e))
    args.backend = args.backend or "verilator"
    if not 2 <= args.ranks <= 16:
        ap.error(f"--ranks {args.ranks}: must be between 2 and 16 (one rank per switch port)")
    args.dtype = DTYPE_ALIASES.get(args.dtype, args.dtype)
    params = SwitchParams(ports=args.ranks, **(JUMBO if args.jumbo else {}))
    if args.jumbo and args.topology == "leaf-spine":
        ap.error("--jumbo: runs on one switch (--topology single); the leaf-spine tree is built of default "
                 "switches")
    overrides = {"offload": args.offload} if args.offload else {}
    if args.float_mode:
        overrides["float_mode"] = args.float_mode
    if args.accumulate:
        overrides["accumulate"] = args.accumulate
    if args.reproducible:
        overrides["reproducible"] = True
    try:
        if args.jumbo and Config.load(args.config).chunk_size == Config().chunk_size:
            overrides["chunk_size"] = params.max_payload     # the file did not choose another chunk size
        config = Config.load(args.config, **overrides)
    except ConfigError as e:
        ap.error(str(e))
    if config.chunk_size > params.max_payload:
        ap.error(f"chunk_size={config.chunk_size} exceeds the switch's max payload {params.max_payload}")
    return args, params, config


def main(argv=None) -> int:
    args, params, config = parse_args(argv)
    if args.topology == "leaf-spine":
        from cais.sim.tree import main_leaf_spine
        return main_leaf_spine(args, config)
    from cais.sim.backends import run_backend

    kind = BACKENDS[args.backend]
    print(f"CAIS co-simulation: {args.ranks} ranks x {args.elements} {args.dtype} elements, {args.op}, "
          f"{args.collectives} collective(s), backend {args.backend}, loss {args.loss:.1%}, seed {args.seed}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        job = {"ranks": args.ranks, "elements": args.elements, "op": args.op, "dtype": args.dtype,
               "collectives": args.collectives,
               "seed": args.seed, "loss": args.loss, "duplicate": args.duplicate, "reorder": args.reorder,
               "config": config.as_dict(), "progress": str(progress)}
        box, stop = {}, threading.Event()

        def work():
            try:
                extra = {"pgo": args.pgo} if kind == "verilator" else {}
                box["summary"] = run_backend(kind, params, ENTRY, job, waves=args.waves, **extra)
            except BaseException as e:   # reported below
                box["error"] = e
            finally:
                stop.set()

        t0 = time.perf_counter()
        threading.Thread(target=work, daemon=True).start()
        while not stop.wait(2.0):
            state = progress.read_text().split() if progress.exists() else None
            elapsed = time.perf_counter() - t0
            if state:
                print(f"  ... {elapsed:5.0f} s: {state[0]}/{state[1]} collectives done; current one "
                      f"{state[2]}/{state[3]} chunk results in; cycle {state[4]}", file=sys.stderr, flush=True)
            else:
                print(f"  ... {elapsed:5.0f} s: building and running", file=sys.stderr, flush=True)
    if "error" in box:
        print(f"FAILED: {box['error']}", file=sys.stderr)
        return 1
    report(params, args, box["summary"])
    if args.waves:
        from cais.sim.build import build_root
        dumps = sorted(build_root().glob("sim/**/*.vcd"), key=lambda path: path.stat().st_mtime)
        print(f"waveform: {dumps[-1] if dumps else 'not written'}")
    return 0 if box["summary"]["correct"] else 1


def report(params: SwitchParams, args, s: dict) -> None:
    P = s["ranks"]
    c = s["counters"]
    st = s["stats"]
    print()
    dtype = s.get("dtype", "int32")
    routes = s.get("routes", s["paths"])
    native = not any("quantized" in r for r in routes)
    if dtype.startswith("int"):
        claim = f"equals numpy's {s['op']}"
    elif native and s.get("reproducible"):
        claim = f"equals the {s['op']} folded in rank order, bit for bit"
    elif s["op"] != "sum":
        claim = f"equals the exact {s['op']}"
    else:
        claim = f"is within the {'rounding' if native else 'documented'} bound of the exact sum"
    print(f"result: {'CORRECT' if s['correct'] else 'WRONG'}: every rank's result {claim} "
          f"(sha256 {s['result_sha256'][:16]}); path: {', '.join(routes)}")
    if not dtype.startswith("int"):
        settings = (f"float_mode {s.get('float_mode')}, accumulate {s.get('accumulate')}, reproducible "
                    f"{s.get('reproducible')}, switch float units {'yes' if s.get('float_units') else 'no'}")
        print(f"  {dtype}: {settings}")
        if s["op"] == "sum" and not (native and s.get("reproducible")):
            print(f"  {dtype}: largest error {s['max_error']:.3g} (vs the exact sum), largest bound "
                  f"{s['max_bound']:.3g}, largest error/bound {s['max_error_over_bound']:.3f}")
    print()
    print(f"{'rank':>4} {'frames sent':>11} {'bytes sent':>11} {'retransmits':>11}   "
          f"{'ring would send':>15} {'ratio':>6}")
    for r in range(P):
        ring = s["ring_bytes_per_rank"]
        print(f"{r:>4} {s['frames_sent'][r]:>11} {s['bytes_sent'][r]:>11} {s['retransmissions'][r]:>11}   "
              f"{ring:>15} {s['bytes_sent'][r] / ring if ring else 0:>6.3f}")
    limit = P / (2 * (P - 1))
    worst = max(s["bytes_sent"]) / s["ring_bytes_per_rank"] if s["ring_bytes_per_rank"] else 0.0
    print(f"(limit of the ratio for large tensors: N/(2(N-1)) = {limit:.3f}; the largest ratio here is "
          f"{worst / limit:.3f} times it; max_payload {params.max_payload} bytes)")
    in_beats = sum(-(-b // params.beat_bytes) for b in c["RX_BYTES"])
    print()
    print(f"cycles to completion: {s['cycles']} ({s['cycles'] / s['clock_hz'] * 1e6:.1f} us at "
          f"{s['clock_hz'] / 1e6:.2f} MHz); ingress beats per cycle: {in_beats / max(1, s['cycles']):.3f} "
          f"(limit {params.ports}: every port at line rate)")
    print(f"simulated cycles per wall second: {s['cycles'] / max(s['wall_s'], 1e-9):.0f}")
    injected = {k: v for k, v in s['faults'].items() if v and not k.endswith('_frames')}
    print(f"faults injected: {injected or 'none'}")
    print()
    print("controller:")
    print(f"  SRAM in use {st['sram_usage']:.1%} of sets, allocated {st['sram_allocated']:.1%} of slots; "
          f"reduced {st['bytes_reduced'] / max(s['cycles'] / s['clock_hz'], 1e-12) / 1e9:.2f} GB/s over the run; "
          f"average queue delay {st['avg_queue_delay_s'] * 1e6:.2f} us; fallback ratio {st['fallback_ratio']:.1%}")
    drops = {k: v for k, v in st["drops"].items() if v}
    print(f"  drops by reason: {drops or 'none'}")
    print(f"  completed chunks {c['COMPLETED']}, contributions {c['CONTRIBUTIONS']}, duplicates {c['DUPLICATES']}, "
          f"results re-sent {c['RESULTS_RESENT']}")
    for d in s["decisions"]:
        print(f"  decision: group {d['group']} collective {d['op_seq']}: "
              f"{'switch' if d['offload'] else 'host ring'} ({d['reason']})")
    for e in s["events"]:
        print(f"  event at {e['time_s'] * 1e6:.1f} us: {e['event']}")


if __name__ == "__main__":
    sys.exit(main())
