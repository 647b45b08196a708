"""The whole switch under amaranth.sim: a random mix and the directed cases that exercise the float lanes, each
scored against the numpy reference model (frames out of every port, and every counter)."""

import pytest

from cais.params import SwitchParams
from cais.sim.backends import run_backend

from buildsets import DEFAULT, WIDE

# amaranth.sim runs the whole switch at a few thousand cycles per second, so this file is the slow tier's
# pure-Python check of the whole switch, on the cheapest builds: a random mix on the 2 x 512 switch without float
# units, and two directed cases that exercise the float lanes on switches with them (the 2 x 512 one is the only
# whole switch with wide float lanes the suite runs). Every directed case runs on the exported Verilog of the
# same source: the Verilator regression (test_switch_verilator.py) on the 4 x 64 switch with float units and on
# the 2 x 512 and 16 x 64 ones without, and the cocotb link (test_link_identity.py) on the 4 x 64 one. Other
# amaranth.sim runs of the whole switch: tests/sim/test_backends.py, test_switch_timing.py, test_mixed_egress.py.
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


@pytest.mark.parametrize("pname, name", FLOAT_CASES)
def test_directed_float_units(pname, name):
    run_parts(FLOAT_PARAM_SETS[pname], {"kind": "directed", "cases": [name]})


@pytest.mark.parametrize("pname", PARAM_SETS)
def test_random_mix_with_idle_and_backpressure(pname):
    # back-pressure differs per port: one sink mostly stalled, one always ready (cais.sim.suite)
    records = run_parts(PARAM_SETS[pname], {"kind": "mix", "seed": 7, "frames_per_port": 8, "idle": 0.25,
                                            "backpressure": "mix"}, seed=11)
    assert len(records[0]["log"]) > 8
