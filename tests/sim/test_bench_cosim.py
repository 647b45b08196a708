"""bench/bench_cosim.py: bad arguments are refused with one line; --json gives cycles per second per link
and the switch-against-ring figures, consistent with each other."""

import json

import pytest

from benchscripts import assert_refused, load_script
from cais.params import SwitchParams
from cais.sim.build import build_native

bench = load_script("bench_cosim")

BAD = [
    (["--links", "model,fpga"], "--links: unknown fpga"),
    (["--ranks", "1"], "every count must be between 2 and 16"),
    (["--ranks", "two"], "a comma-separated list of integers"),
    (["--elements", "0"], "--elements"),
    (["--bare-cycles", "10"], "must be at least 1000"),
    (["--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv, needle", BAD)
def test_bad_arguments_are_refused(argv, needle, capsys):
    assert_refused(bench.parse_args, argv, needle, capsys)


@pytest.mark.verilator
def test_json_figures(capsys):
    assert bench.main(["--json", "--links", "model,verilator_cpp,bare_cpp", "--elements", "4096",
                       "--ranks", "4", "--ring-elements", "4096", "--bare-cycles", "100000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["cycles_per_s"]) == {"model", "verilator_cpp", "bare_cpp"}
    assert out["links"]["bare_cpp"]["cycles"] == 100000
    assert all(rate > 0 for rate in out["cycles_per_s"].values())
    assert out["ratios"]["verilator_cpp/bare_cpp"] == pytest.approx(
        out["cycles_per_s"]["verilator_cpp"] / out["cycles_per_s"]["bare_cpp"])
    links = out["links"]
    assert all(links[name]["cycles_per_cpu_s"] > 0 for name in ("verilator_cpp", "bare_cpp"))
    assert out["cpu_ratios"]["verilator_cpp/bare_cpp"] == pytest.approx(
        links["verilator_cpp"]["cycles_per_cpu_s"] / links["bare_cpp"]["cycles_per_cpu_s"])
    # the model and the RTL take (nearly) the same cycles for the same job: the model's timing is close
    model, rtl = out["links"]["model"]["cycles"], out["links"]["verilator_cpp"]["cycles"]
    assert abs(model - rtl) / rtl < 0.05
    switch, ring = out["switch_vs_ring"]
    assert (switch["path"], ring["path"]) == ("switch", "ring")
    assert switch["bytes_per_rank"] < ring["bytes_per_rank"]          # the point of in-network aggregation
    # the C++ rows ran the profile-guided build: compiled from the training job's counts of the model's
    # code (g++'s files, one per compiled model file), the job's all-reduces on the instrumented library
    assert out["pgo"] is True
    pgo = build_native(SwitchParams(ports=4), pgo=True)
    assert pgo.cached and pgo.library.parent.name.endswith("_cpp_pgo")
    counts = sorted(p.name for p in (pgo.build_dir / "profile").glob("*.gcda"))
    assert any("Vswitch___024root__0" in name for name in counts) and any("harness" in name for name in counts)
    assert "-fprofile-use=" in (pgo.build_dir / "build.log").read_text().splitlines()[0]
    assert "-fprofile-generate=" in (pgo.build_dir / "build_profile.log").read_text().splitlines()[0]
