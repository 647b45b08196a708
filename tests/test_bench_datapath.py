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
    assert [load["beats_per_cycle"] for load in out["loads"]] == [1.0, 1.0, 1.0]   # one beat per cycle
    assert out["latency_cycles"] == documented_latency(params, params.max_payload)  # docs/interface.md: 49
    assert out["memory_bits"]["slot memory (bits)"] == params.slots * 2 * params.max_payload * 8
    # every port loaded at once: one shared core takes one beat per cycle (docs/interface.md) and its
    # round-robin arbiter shares it evenly, 1/ports of line rate each (until the line-rate core)
    for name in ("allreduce", "forward", "mix"):
        assert out["core_beats_per_cycle"][name] == pytest.approx(1.0, abs=0.01)
        assert out["per_port_beats_per_cycle"][name] == pytest.approx([1 / params.ports] * params.ports, abs=0.01)


@pytest.mark.parametrize("argv, needle", [(["--chunks", "3"], "--chunks: 3 must be at least 8"),
                                          (["--ports", "99"], "ports"), (["--backend", "fpga"], "invalid choice")])
def test_bad_arguments_are_refused(argv, needle, capsys):
    assert_refused(load_script("bench_datapath").main, argv, needle, capsys)
