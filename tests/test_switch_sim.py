"""The whole switch under amaranth.sim: the directed protocol cases and a random mix, each scored
against the numpy reference model (frames out of every port, and every counter)."""

import pytest

from cais.params import SwitchParams
from cais.sim.backends import run_backend
from cais.sim.directed import directed_cases

# The float lanes make amaranth.sim about ten times slower per cycle, so every case runs on switches built
# without them (their float frames are then BAD_CODE drops, on the model too), and the cases that exercise
# the float lanes, the ALU pipeline's forwarding and stalls, and the reproducible fold also run with them.
# The Verilator tests (test_switch_verilator.py) run every case on switches with float units.
PARAM_SETS = {
    "p4_w64_int": SwitchParams(float_units=False),
    "p2_w512_int": SwitchParams(ports=2, data_width=512, slots=16, float_units=False),
}
# (parameter set, case): the 512-bit switch's one-beat frames are the ones that make the pipeline forward
# and wait, so it runs the cases that reuse a set back to back.
FLOAT_CASES = [
    ("p4_w64", name) for name in (
        "back_to_back_same_set", "late_repeat_answered", "type_mismatch_dtype", "payload_too_long",
        "float_sum_fp32", "float_sum_fp16", "float_sum_fp16_acc32", "float_sum_bf16", "float_sum_bf16_acc32",
        "int8_sum_wrap_saturate", "reproducible_fold", "float_max_zero_ties")
] + [("p2_w512", name) for name in ("back_to_back_same_set", "reproducible_fold")]
FLOAT_PARAM_SETS = {
    "p4_w64": SwitchParams(),
    "p2_w512": SwitchParams(ports=2, data_width=512, slots=16),
}


def run_parts(params, *parts, **link_kw):
    """Run parts of cais.sim.suite on the amaranth.sim link; fail with every problem found."""
    records = run_backend("amaranth", params, "cais.sim.suite:suite_job", {"parts": list(parts)}, **link_kw)
    failed = [f"{r['name']}: " + "; ".join(r["problems"]) for r in records if r["problems"]]
    assert records and not failed, "\n".join(failed)
    return records


@pytest.mark.parametrize("pname", PARAM_SETS)
@pytest.mark.parametrize("name", [case.name for case in directed_cases(SwitchParams())])
def test_directed(pname, name):
    run_parts(PARAM_SETS[pname], {"kind": "directed", "cases": [name]})


@pytest.mark.parametrize("pname, name", FLOAT_CASES)
def test_directed_float_units(pname, name):
    run_parts(FLOAT_PARAM_SETS[pname], {"kind": "directed", "cases": [name]})


@pytest.mark.parametrize("pname", PARAM_SETS)
def test_random_mix_with_idle_and_backpressure(pname):
    # back-pressure differs per port: one sink mostly stalled, one always ready (cais.sim.suite)
    records = run_parts(PARAM_SETS[pname], {"kind": "mix", "seed": 7, "frames_per_port": 8, "idle": 0.25,
                                            "backpressure": "mix"}, seed=11)
    assert len(records[0]["log"]) > 8
