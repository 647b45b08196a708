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
    # docs/interface.md's example: 158 cycles for a 256-byte payload at 4 x 64 with float units
    assert out["latency_cycles"] == out["documented_latency_cycles"] == 158
    assert documented_latency(params, params.max_payload) == 158
    banks = P * params.slots * 2 * params.max_payload * 8            # one bank per port, two sets per slot
    assert out["memory_bits"]["contribution banks (bits)"] == banks
    # the result queues: per port two results of 36 beats (30 + 256 bytes at 8 bytes a beat) -> 128 beats
    # of 64 data + 8 keep + 1 last bits
    assert out["memory_bits"]["result queues (bits)"] == 4 * 128 * 73
    loads = ("allreduce", "forward", "mix", "results_and_forwarding", "results_and_forwarding_short",
             "results_and_forwarding_random", "short")
    assert set(out["per_port_beats_per_cycle"]) == set(loads)
    for name in loads:
        # at 4 x 64 no load asks the decision for more than one header per cycle (the shortest mix: per
        # port a 36-beat contribution and an 8-beat frame, 4 x 2 headers per 44 cycles), so the bar is
        # line rate on every port
        assert out["decision_bound_per_port"][name] == 1.0, name
        assert len(out["per_port_beats_per_cycle"][name]) == P
        assert all(x >= 0.98 for x in out["per_port_beats_per_cycle"][name]), name
    for name in ("mix", "results_and_forwarding", "results_and_forwarding_short", "results_and_forwarding_random"):
        # the measured window holds both kinds of frames, on the order of one result per port per chunk
        assert out["in_window"][name]["results"] >= P, name
        assert out["in_window"][name]["forwarded"] >= P, name
    assert out["in_window"]["allreduce"]["forwarded"] == 0 and out["in_window"]["forward"]["results"] == 0
    assert out["baseline_per_port_beats_per_cycle"] == 1 / P


@pytest.mark.parametrize("ports, width, load, bound", [
    # 8 x 256: a 286-byte contribution is 9 beats, a 60-byte frame 2 (two on every other chunk: one per
    # chunk on average): two headers per 11 beats per port,
    # 8 ports at line rate would ask 16/11 headers per cycle, so each port gets 11/16 of line rate
    (8, 256, "results_and_forwarding_short", 11 / 16),
    # ... and with 1514-byte frames (48 beats): 16 headers per 57 cycles, below 1
    (8, 256, "results_and_forwarding", 1.0),
    # 3 x 128: 18 + 4 beats per 2 headers, 3 ports ask 6 headers per 22 cycles, below 1
    (3, 128, "results_and_forwarding_short", 1.0),
    # 16 x 128: 18 + 4 beats, 16 ports: 32 headers per 22 cycles -> 22/32
    (16, 128, "results_and_forwarding_short", 22 / 32),
])
def test_decision_bound(ports, width, load, bound):
    bench = load_script("bench_datapath")
    params = SwitchParams(ports=ports, data_width=width)
    assert bench.decision_bound(params, load, params.max_payload) == pytest.approx(bound)


def test_stagger_puts_the_ports_out_of_step():
    """Port p starts p/ports of a chunk's beats late, in frames the switch accepts; lockstep loads none."""
    bench = load_script("bench_datapath")
    params = SwitchParams()
    # a chunk of results_and_forwarding at 4 x 64: 36 beats and, on average, one 1514-byte frame (190
    # beats) = 226; port 3: 3 x 226 // 4 = 169 beats
    frames = bench.stagger_frames(params, "results_and_forwarding", 256, 3)
    assert sum(frames) == 169 * 8 and all(60 <= n <= 1514 for n in frames)
    assert bench.stagger_frames(params, "results_and_forwarding", 256, 0) == []
    assert bench.stagger_frames(params, "allreduce", 256, 3) == []


@pytest.mark.parametrize("argv, needle", [(["--chunks", "3"], "--chunks: 3 must be at least 8"),
                                          (["--ports", "99"], "ports"), (["--backend", "fpga"], "invalid choice")])
def test_bad_arguments_are_refused(argv, needle, capsys):
    assert_refused(load_script("bench_datapath").main, argv, needle, capsys)


def test_summary_figures_by_hand():
    """--summary's per-build arithmetic: 64 x 90 MHz = 5.76 Gb/s a port; a 256-byte contribution is 36
    beats (286 bytes at 8 a beat) of 64 int32, so at 1.0 beat per cycle a job gets 64/36 elements a cycle;
    a 1,024-byte one 132 beats of 256."""
    bench = load_script("bench_datapath")
    row = bench.build_figures(SwitchParams(), 90.0, 1.0, 0.5)
    assert row["port_gbps"] == pytest.approx(5.76)
    assert row["int32_elements_per_s"] == pytest.approx(64 / 36 * 90e6)
    assert row["fp32_elements_per_s"] == pytest.approx(0.5 * 64 / 36 * 90e6)
    assert row["int32_vs_switchml"] == pytest.approx(64 / 36 * 90e6 / 2.8e9)
    jumbo = bench.build_figures(SwitchParams(max_payload=1024, slots=16), 80.0, 0.99, None)
    assert jumbo["int32_elements_per_s"] == pytest.approx(0.99 * 256 / 132 * 80e6)
    assert jumbo["fp32_elements_per_s"] is None and jumbo["fp32_vs_switchml"] is None
    assert bench.build_figures(SwitchParams(), None, 1.0, None)["int32_elements_per_s"] is None


@pytest.mark.parametrize("argv, needle", [(["--summary", "--ranks", "2,x"], "--ranks '2,x'"),
                                          (["--summary", "--ranks", "1,4"], "between 2 and 16"),
                                          (["--summary", "--seeds", "0"], "--seeds")])
def test_summary_bad_arguments_are_refused(argv, needle, capsys):
    assert_refused(load_script("bench_datapath").main, argv, needle, capsys)


def test_summary_takes_the_area_figures_from_a_bench_area_run(tmp_path):
    """--area-json: the builds' rows from bench_area --json's output (its last line), none placed again; a
    file that is not such output is refused naming it."""
    bench = load_script("bench_datapath")
    rows = {name: {"fmax_mhz": mhz, "seeds": {"1": mhz}, "bram": 100 + i, "lut4": 1}
            for i, (name, mhz) in enumerate(zip(bench.SUMMARY_BUILDS, (78.7, 90.3, 77.0)))}
    path = tmp_path / "area.json"
    path.write_text("tools: ...\n" + json.dumps({"results": rows}) + "\n")
    got = bench.area_fmax(list(bench.SUMMARY_BUILDS), 1, log=lambda *a: None, area_json=path)
    assert got == rows
    path.write_text("no json here\n")
    with pytest.raises(SystemExit, match="area.json: not the output of bench_area.py --json"):
        bench.area_fmax(list(bench.SUMMARY_BUILDS), 1, log=lambda *a: None, area_json=path)
