"""Run the cocotb testbenches of tb/ (the host side): build each block's Verilog with Verilator (cached per
block and parameter set, :func:`cais.sim.build.build_block`) and run its cocotb tests through cocotb's public
runner (:func:`cais.sim.build.run_test`).

Command line (``make tb``)::

    python -m cais.tb.run [--tb BLOCK] [--testcase NAME] [--params NAME]

``--testcase`` selects one test function with all its generated cases (``run_frames``) or one case
(``run_frames/idle=True/backpressure=False``). ``WAVES=1`` in the environment builds with VCD tracing
(a separate ``..._waves`` build) and leaves ``dump.vcd`` in each run's folder, printed at the end:
``build/tb/<block>_<params>_waves/runs/<module>.../dump.vcd``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass

from cais.params import SwitchParams

from .common import PARAMS_ENV

__all__ = ["TESTBENCHES", "TbResult", "run_tb", "main"]

#: block -> {parameter-set name: SwitchParams}; each set is one Verilator build.
TESTBENCHES: dict[str, dict[str, SwitchParams]] = {
    "ingress": {"w64": SwitchParams()},
    "sram": {"p4_w64": SwitchParams()},
    "alu": {"float_p4_w64": SwitchParams(), "int_p4_w128": SwitchParams(data_width=128, float_units=False)},
    "csr": {"p4": SwitchParams()},
    "egress": {"p4_w64": SwitchParams()},
    "switch": {"p4_w64": SwitchParams()},
    "uart": {"p4": SwitchParams()},
}


@dataclass
class TbResult:
    block: str
    pname: str
    build_seconds: float
    run_seconds: float
    cached: bool
    tests: int
    run_dir: object
    waves_file: object


def module_of(block: str) -> str:
    """The dotted name cocotb imports: ``cais.tb.<block>.test_<block>``."""
    return f"cais.tb.{block}.test_{block}"


def run_tb(block: str, pname: str | None = None, testcase: str | None = None, *, waves: bool = False,
           seed: int | None = 1) -> TbResult:
    """Build (cached) and run testbench ``block`` on parameter set ``pname`` (default: its first); raises
    AssertionError naming the failing cases."""
    from cais.sim.build import build_block, run_test

    sets = TESTBENCHES[block]
    pname = pname or next(iter(sets))
    params = sets[pname]
    t0 = time.monotonic()
    build = build_block(block, params, waves=waves)
    t1 = time.monotonic()
    test_filter = None if not testcase else rf"\.{re.escape(testcase)}(/|$)"
    run = run_test(build, module_of(block), extra_env={PARAMS_ENV: json.dumps(params.as_dict())},
                   seed=seed, test_filter=test_filter)
    t2 = time.monotonic()
    return TbResult(block, pname, t1 - t0, t2 - t1, build.cached, run.tests, run.run_dir, run.waves_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cais.tb.run", description="Run the cocotb testbenches of tb/.")
    parser.add_argument("--tb", choices=list(TESTBENCHES), help="one block's testbench (default: all)")
    parser.add_argument("--testcase", help="one test function or one generated case (default: all)")
    parser.add_argument("--params", help="one parameter set of the block (default: all of them)")
    args = parser.parse_args(argv)
    failed = 0
    for block in [args.tb] if args.tb else list(TESTBENCHES):
        for pname in [args.params] if args.params else list(TESTBENCHES[block]):
            if pname not in TESTBENCHES[block]:
                parser.error(f"--params {pname}: {block} has {', '.join(TESTBENCHES[block])}")
            try:
                r = run_tb(block, pname, args.testcase)
            except AssertionError as exc:
                failed += 1
                print(f"FAIL {block} {pname}: {exc}", file=sys.stderr)
                continue
            print(f"PASS {block} {pname}: {r.tests} cases, build {r.build_seconds:.1f} s"
                  f"{' (cached)' if r.cached else ''}, run {r.run_seconds:.1f} s; results {r.run_dir}"
                  + (f"; waves {r.waves_file}" if r.waves_file else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
