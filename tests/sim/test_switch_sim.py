"""The whole switch under amaranth.sim: the directed protocol cases and a random mix, each scored
against the numpy reference model (frames out of every port, and every counter)."""

import pytest

from cais.params import SwitchParams
from cais.sim.backends import run_backend
from cais.sim.directed import directed_cases

from buildsets import DEFAULT, WIDE

# amaranth.sim runs the whole switch at a few thousand cycles per second, so this file is the slow tier's
# pure-Python check of the whole switch, on the cheapest builds: every directed case on the 2 x 512 switch
# without float units (its float frames are then BAD_CODE drops, on the model too), and two cases that
# exercise the float lanes on switches with them (the 2 x 512 one is the only whole switch with wide float lanes
# the suite runs). The Verilator regression (test_switch_verilator.py) runs every case on the 4 x 64 switch with
# float units and on the 2 x 512 and 16 x 64 ones without.
pytestmark = pytest.mark.slow

PARAM_SETS = {
    "p2_w512_int": SwitchParams(ports=2, data_width=512, slots=16, float_units=False),
}
# (parameter set, case): fp16/bf16 accumulated in fp32 through the fold chain and its final rounding, and
# the 512-bit switch's one-beat frames reusing a set back to back.
FLOAT_CASES = [("p4_w64", "float_sum_bf16_acc32"), ("p2_w512", "back_to_back_same_set")]
FLOAT_PARAM_SETS = {"p4_w64": DEFAULT, "p2_w512": WIDE}


def run_parts(params, *parts, **link_kw):
    """Run parts of cais.sim.suite on the amaranth.sim link; fail with every problem found."""
    records = run_backend("amaranth", params, "cais.sim.suite:suite_job", {"parts": list(parts)}, **link_kw)
    failed = [f"{r['name']}: " + "; ".join(r["problems"]) for r in records if r["problems"]]
    assert records and not failed, "\n".join(failed)
    return records


CASES = [case.name for case in directed_cases(SwitchParams())]
#: The directed cases in three runs (one elaboration and simulation each: a case alone spends most of its
#: time building the simulation), balanced across the suite's workers.
CASE_GROUPS = 3


@pytest.mark.parametrize("pname", PARAM_SETS)
@pytest.mark.parametrize("group", range(CASE_GROUPS))
def test_directed(pname, group):
    names = CASES[group::CASE_GROUPS]
    records = run_parts(PARAM_SETS[pname], {"kind": "directed", "cases": names})
    assert [r["name"] for r in records] == names           # every case of the group ran


@pytest.mark.parametrize("pname, name", FLOAT_CASES)
def test_directed_float_units(pname, name):
    run_parts(FLOAT_PARAM_SETS[pname], {"kind": "directed", "cases": [name]})


@pytest.mark.parametrize("pname", PARAM_SETS)
def test_random_mix_with_idle_and_backpressure(pname):
    # back-pressure differs per port: one sink mostly stalled, one always ready (cais.sim.suite)
    records = run_parts(PARAM_SETS[pname], {"kind": "mix", "seed": 7, "frames_per_port": 8, "idle": 0.25,
                                            "backpressure": "mix"}, seed=11)
    assert len(records[0]["log"]) > 8
