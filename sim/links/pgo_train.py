"""The training job of a profile-guided build of the C++-driven model (:func:`cais.sim.build.build_native`
with ``pgo``): all-reduces through the driver and controller on the instrumented library, as ``make sim``
runs them, so the profile counts the model's work under traffic (a bare clock loop would count an idle
switch). g++'s counters are written when this process exits.

    python -m cais.sim.links.pgo_train LIBRARY PARAMS_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ...params import SwitchParams

__all__ = ["TRAINING_ELEMENTS", "training_jobs", "train", "main"]

#: Elements per rank of each training all-reduce: a few hundred chunks (about 10k cycles at the defaults).
TRAINING_ELEMENTS = 16384


def training_jobs(params: SwitchParams) -> list[dict]:
    """The all-reduces of the training run: int32 sums, and fp32 sums when the build has float units."""
    ranks = min(4, params.ports)
    dtypes = ["int32"] + (["float32"] if params.float_units else [])
    return [{"ranks": ranks, "elements": TRAINING_ELEMENTS, "op": "sum", "dtype": dtype, "seed": 1,
             "config": {"offload": "always"}} for dtype in dtypes]


def train(library: Path, params: SwitchParams) -> None:
    """Run :func:`training_jobs` on ``library``; raise if one comes back wrong (a model that computes wrong
    results is no model to optimise for)."""
    from ..workload import all_reduce_job
    from cais.link import run_sync
    from .verilator import VerilatorLink

    for job in training_jobs(params):
        link = VerilatorLink(params, library=library)
        try:
            summary = run_sync(all_reduce_job(link, job))
        finally:
            link.close()
        if not summary["correct"]:
            raise RuntimeError(f"training job {job} on {library}: wrong all-reduce result")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m cais.sim.links.pgo_train LIBRARY PARAMS_JSON", file=sys.stderr)
        return 2
    train(Path(argv[0]), SwitchParams(**json.loads(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
