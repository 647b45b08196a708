"""The whole switch under amaranth.sim: the directed protocol cases and a random mix, each scored
against the numpy reference model (frames out of every port, and every counter)."""

import pytest

from cais.params import SwitchParams
from cais.sim.amaranth_harness import SwitchSim
from cais.sim.directed import accounting_problems, counter_problems, directed_cases, score_case
from cais.sim.traffic import compare, random_mix, replay

# The float lanes make amaranth.sim about ten times slower per cycle, so every case runs on switches built
# without them (their float frames are then BAD_CODE drops, on the model too), and the cases that exercise
# the float lanes, the ALU pipeline's forwarding and stalls, and the reproducible fold also run with them.
# The Verilator tests (test_switch_cocotb.py) run every case on switches with float units.
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


def run_case(params, case, **sim_kw):
    result = {}

    async def scenario(s):
        result["problems"] = await score_case(s, params, case)

    SwitchSim(params, **sim_kw).run(scenario)
    assert not result["problems"], f"{case.name}: " + "; ".join(result["problems"])


@pytest.mark.parametrize("pname", PARAM_SETS)
@pytest.mark.parametrize("name", [case.name for case in directed_cases(SwitchParams())])
def test_directed(pname, name):
    params = PARAM_SETS[pname]
    case = next(c for c in directed_cases(params) if c.name == name)
    run_case(params, case)


@pytest.mark.parametrize("pname, name", FLOAT_CASES)
def test_directed_float_units(pname, name):
    params = FLOAT_PARAM_SETS[pname]
    case = next(c for c in directed_cases(params) if c.name == name)
    run_case(params, case)


@pytest.mark.parametrize("pname", PARAM_SETS)
def test_random_mix_with_idle_and_backpressure(pname):
    params = PARAM_SETS[pname]
    scen = random_mix(params, seed=7, frames_per_port=8)
    # back-pressure differs per port: one sink mostly stalled, one always ready
    backpressure = [0.8, 0.0] + [0.25] * (params.ports - 2)
    sim = SwitchSim(params, idle=0.25, backpressure=backpressure, seed=11)
    result = {}

    async def scenario(s):
        await s.apply(scen.writes)
        for port, frames in enumerate(scen.frames):
            for frame in frames:
                s.send(port, frame)
        await s.drain()
        result["counters"] = await s.counters()

    sim.run(scenario)
    model, expected = replay(scen)
    assert not compare(expected, sim.rx)
    assert not counter_problems(result["counters"], model.counters())
    assert not accounting_problems(result["counters"])
