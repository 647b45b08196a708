"""The C++-driven Verilator link and the cocotb link are cycle-identical.

For the same stimulus (every directed case under idle and back-pressure, and a seeded random mix under
per-port back-pressure) both must send the same frames out of the same ports with the same
first and last beat cycles, and both must pass the regression against the reference model. One cocotb
launch runs the whole job, on the default build (the switch testbench's too): the cocotb link moves whole
beats whatever their width, and the other builds' cycles are checked on the C++ link against the model
(tests/sim/test_switch_verilator.py), whose figures this identity ties to the cocotb link.
"""

from __future__ import annotations

import pytest

from cais.sim.backends import run_backend

from buildsets import DEFAULT

PAUSED = [
    {"kind": "directed", "seed": 2, "idle": 0.2, "backpressure": 0.3},
    {"kind": "mix", "seed": 3, "idle": 0.25, "backpressure": "mix", "frames_per_port": 40},
]
# Every directed case under idle and back-pressure, where the links' pause patterns must agree too (the plain
# run would add a third of the cocotb run and nothing the pauses do not also cover).
JOB = {"parts": PAUSED}
LINK_SEED = 9


@pytest.mark.verilator
def test_cpp_link_and_cocotb_link_are_cycle_identical():
    params = DEFAULT
    fast = run_backend("verilator", params, "cais.sim.suite:suite_job", JOB, seed=LINK_SEED)
    slow = run_backend("cocotb", params, "cais.sim.suite:suite_job", JOB, seed=LINK_SEED)
    for name, records in (("verilator", fast), ("cocotb", slow)):
        failed = [f"{r['name']} {r['patterns']}: {'; '.join(r['problems'])}" for r in records if r["problems"]]
        assert not failed, f"{name} link: " + "\n".join(failed)
    assert [r["name"] for r in fast] == [r["name"] for r in slow]
    assert sum(len(r["log"]) for r in fast) > 100            # the comparison covers real traffic
    assert any(r["patterns"]["idle"] for r in fast)
    for a, b in zip(fast, slow):
        first = next((i for i, (x, y) in enumerate(zip(a["log"], b["log"])) if x != y), None)
        where = (f"; first difference at frame {first}: verilator {a['log'][first][0]}@{a['log'][first][2:]}, "
                 f"cocotb {b['log'][first][0]}@{b['log'][first][2:]}" if first is not None else "")
        assert a["log"] == b["log"] and a["cycles"] == b["cycles"], (
            f"{a['name']} {a['patterns']}: {len(a['log'])} vs {len(b['log'])} frames, cycles {a['cycles']} vs "
            f"{b['cycles']}{where}")
