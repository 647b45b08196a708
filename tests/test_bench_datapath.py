"""bench/bench_datapath.py --json: one JSON object whose figures match the documented ones."""

import json

import pytest

from cais.params import SwitchParams
from cais.sim.timing import documented_latency

from benchscripts import assert_refused, load_script


@pytest.mark.verilator
def test_json_figures(capsys):
    bench = load_script("bench_datapath")
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    params = SwitchParams()
    assert out["params"] == params.as_dict()
    P = params.ports
    # every port at line rate: the bar is 0.98 of a beat per cycle on every port
    assert all(load["beats_per_cycle"] >= 0.98 * P for load in out["loads"]), out["loads"]
    assert out["latency_cycles"] == documented_latency(params, params.max_payload)  # docs/interface.md: 96
    banks = P * params.slots * 2 * params.max_payload * 8            # one bank per port, two sets per slot
    assert out["memory_bits"]["contribution banks (bits)"] == banks
    for name in ("allreduce", "forward", "mix", "short"):
        assert all(x >= 0.98 for x in out["per_port_beats_per_cycle"][name]), name
    assert out["baseline_per_port_beats_per_cycle"] == 1 / P


@pytest.mark.parametrize("argv, needle", [(["--chunks", "3"], "--chunks: 3 must be at least 8"),
                                          (["--ports", "99"], "ports"), (["--backend", "fpga"], "invalid choice")])
def test_bad_arguments_are_refused(argv, needle, capsys):
    assert_refused(load_script("bench_datapath").main, argv, needle, capsys)
