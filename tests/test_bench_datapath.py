"""bench/bench_datapath.py --json: one JSON object whose figures match the documented ones."""

import json

import pytest

from cais.params import SwitchParams
from cais.sim.timing import documented_latency

from benchscripts import load_script


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
