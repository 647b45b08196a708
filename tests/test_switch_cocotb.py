"""The exported switch (Verilog from ``cais.hdl.top.SwitchTop``) under Verilator and cocotb.

Each (parameter set x testcase) is one simulator run of a cocotb test in
``cais.tb.test_timing``; the Verilator build of a parameter set is cached
(``cais.sim.build``) and shared by its testcases and by pytest-xdist workers. Run with
``pytest tests/test_switch_cocotb.py -n 2``; ``-m "not verilator"`` skips them.
``CAIS_SEED`` overrides the cocotb random seed (default 1), which seeds the traffic of every test.
"""

from __future__ import annotations

import json
import os

import pytest

from cais.params import SwitchParams
from cais.sim.build import BuildInfo, build_switch, run_test

# Verilator builds, cold, on 2 cores: p16_w128 ~60 s (over 100 s when the machine is busy), the others
# ~25 s. Should the 16-port build need trimming, rules=4 (~45 s) is the safe cut: the directed cases and
# the random mix need 3 rules and one MAC entry per port.
PARAM_SETS = {
    "p16_w128": SwitchParams(ports=16, data_width=128, slots=32),
    "p4_w64": SwitchParams(),
    "p2_w512": SwitchParams(ports=2, data_width=512, slots=16),
}

TESTCASES = [
    "test_timing.test_result_latency",
    "test_timing.test_held_port_never_stalls_others",
    "test_timing.test_busy_register",
]

SEED = int(os.environ.get("CAIS_SEED", "1"))

_builds: dict[SwitchParams, BuildInfo] = {}


def switch_build(params: SwitchParams) -> BuildInfo:
    """``build_switch(params)``, looked up once per process (the build cache itself is on disk)."""
    if params not in _builds:
        _builds[params] = build_switch(params)
    return _builds[params]


@pytest.mark.verilator
@pytest.mark.parametrize("testcase", TESTCASES)
@pytest.mark.parametrize("pname", list(PARAM_SETS))
def test_switch_cocotb(pname, testcase):
    params = PARAM_SETS[pname]
    module, name = testcase.split(".")
    run_test(switch_build(params), f"cais.tb.{module}", name,
             extra_env={"CAIS_PARAMS": json.dumps(params.as_dict())}, seed=SEED)
