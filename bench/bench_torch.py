"""PyTorch through the switch: DDP step time and bytes per rank, "cais" against gloo, same machine and run.

Runs the worked example's training (examples/train_digits.py: an MLP on scikit-learn's digits, DDP, one
gradient bucket per step) with torchrun on RANKS rank processes, once on the "cais" backend through
cais-switch on veth pairs in network namespaces and once on torch's gloo backend (TCP on the host
namespace's loopback), and prints per backend: the median step time (forward, backward with the bucket's
all-reduce, SGD step), the bytes each rank's interface sent (gloo: the loopback's bytes over the ranks,
its ranks share it) and the fraction of gradient buckets the switch reduced (the rest: the host ring, as
the controller decided). Root (namespaces). ``--json`` prints one JSON object instead. These are figures
of the Python rank processes and the model switch on one machine, not of a NIC.

    python bench/bench_torch.py [--ranks 4] [--epochs 2] [--backend model|verilator] [--json]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from cais.cmdline import Parser, integer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=load_example().rank_count, default=4)
    ap.add_argument("--epochs", type=integer(1), default=2)
    ap.add_argument("--backend", choices=("model", "verilator"), default="model", help="cais-switch's backend")
    ap.add_argument("--offload", choices=("always", "auto", "never"), default="always",
                    help="the controller's offload policy for the cais run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    ex = load_example()
    try:
        results = ex.run_jobs(args.ranks, args.epochs, args.backend, ["cais", "gloo"],
                              log=lambda *a: print(*a, file=sys.stderr), offload=args.offload)
    except RuntimeError as e:            # cais-switch did not start: the reason is its log's tail
        raise SystemExit(f"bench_torch: {e}") from None
    rows = ex.summary(results)
    figures = {tag: {"step_ms": row["step_ms"], "sent_bytes_per_rank": row["sent_bytes_per_rank"],
                     "switch_fraction": row["switch_fraction"], "bucket_paths": row["bucket_paths"],
                     "final_loss": row["loss"][-1], "accuracy": row["accuracy"],
                     "steps_per_rank": results[tag][0]["steps"]} for tag, row in rows.items()}
    if args.json:
        print(json.dumps({"ranks": args.ranks, "epochs": args.epochs, "backend": args.backend, "offload": args.offload,
                          "runs": figures}))
        return 0
    print(f"DDP on {args.ranks} ranks, {args.epochs} epochs, cais-switch --backend {args.backend}, "
          f"offload={args.offload}")
    print(f"{'backend':<8}{'step ms':>9}{'switch':>8}  bytes sent per rank")
    for tag, f in figures.items():
        frac = "-" if f["switch_fraction"] is None else f"{f['switch_fraction']:.0%}"
        print(f"{tag:<8}{f['step_ms']:>9.2f}{frac:>8}  {f['sent_bytes_per_rank']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
