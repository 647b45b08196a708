"""bench/bench_numerics.py: bad arguments are refused (exit 2, one line, no traceback); the checker finds a
wrong, missing or misordered result (fed a "switch" made of the reference model, then tampered with); and one
small row on the Verilated switch checks clean (the verilator-marked test; seconds once the build is cached)."""

import pytest

from benchscripts import assert_refused, assert_refused_by_process, load_script

from cais import protocol as proto
from cais.params import SwitchParams
from cais.sim.refmodel import SwitchModel

bench = load_script("bench_numerics")
PARAMS = SwitchParams()

BAD = [
    (["--elements", "0"], "--elements: 0 must be at least 1"),
    (["--elements", "many"], "is not an integer"),
    (["--seed", "-1"], "--seed: -1 must be at least 0"),
    (["--only", "fp64.sum.wire"], "'fp64.sum.wire' matches no row"),
    (["--only", "fp16.*,nosuch"], "'nosuch' matches no row"),
    (["--only", ","], "no row named"),
    (["--load-chunks", "4"], "--load-chunks: 4 must be at least 8"),
    (["--jobs", "0"], "--jobs: 0 must be at least 1"),
    (["--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_arguments_refused(argv, needle, capsys):
    assert_refused(bench.parse_args, argv, needle, capsys)


def test_bad_arguments_refused_from_the_command_line():
    assert_refused_by_process("bench_numerics", ["--only", "int4.*"], "--only", timeout=120)


def test_rows_and_selection():
    names = list(bench.ROWS)
    assert len(names) == len(set(names)) == 51
    assert {"int8.sum.saturate", "fp16.max.acc_fp32", "bf16.min.reproducible+acc_fp32"} <= set(names)
    assert not any(n.startswith(("fp32", "int")) and "acc_fp32" in n for n in names)
    assert not any("saturate" in n and ".sum." not in n for n in names)
    args = bench.parse_args(["--only", "fp16.sum.*", "--only", "int8.max.wire,fp16.sum.wire"])
    assert [r.name for r in args.rows] == ["int8.max.wire", "fp16.sum.wire", "fp16.sum.acc_fp32",
                                           "fp16.sum.reproducible", "fp16.sum.reproducible+acc_fp32"]


def test_sram_costs_at_the_defaults():
    """A chunk takes one 256-byte shadow set in each of the 4 ports' banks: 4 * 256 * 8 bits, 32 per byte."""
    R = bench.ROWS
    for name in ("fp32.sum.wire", "fp16.sum.acc_fp32", "int8.min.reproducible", "bf16.max.reproducible+acc_fp32"):
        assert bench.sram(PARAMS, R[name]) == (256, 8192, 32.0), name


# ---------------------------------------------------------------- the checker, against a model "switch"


def model_switch(plan):
    """What a perfect switch sends back for *plan*: the reference model, fed every phase in order."""
    P = PARAMS.ports

    def run(writes, frames):
        model = SwitchModel(PARAMS)
        for addr, value in writes:
            model.write(addr, value)
        out = []
        for port, frame in frames:
            out += model.receive(port, frame)
        return out

    load = plan["load"]["frames"]
    K = len(load[0])
    lat = plan["latency"]["frames"]
    return {
        "check": run(plan["check"]["writes"], plan["check"]["sequence"]),
        "load": run(plan["load"]["writes"], [(p, load[p][c]) for c in range(K) for p in range(P)]),
        "load_results": [100 + 40 * c for c in range(K)],
        "latency": run(plan["latency"]["writes"], [(p, lat[p]) for p in range(P)]),
        "latency_in": 10, "latency_out": 50,
    }


def _tamper(frame: bytes, offset: int = 0) -> bytes:
    i = proto.HEADERS_BYTES + offset
    return frame[:i] + bytes([frame[i] ^ 0x01]) + frame[i + 1:]


@pytest.mark.parametrize("name", ["fp16.sum.wire", "int8.sum.saturate", "fp32.max.reproducible"])
def test_checker_passes_the_reference_and_catches_errors(name):
    row = bench.ROWS[name]
    plan = bench.plan_row(PARAMS, row, 40, 3, 8)
    got = model_switch(plan)
    clean = bench.check_row(PARAMS, row, plan, got)
    assert clean["problems"] == [] and clean["mismatches"] == 0 and clean["load_bad"] == 0
    assert clean["random_elements"] >= 40 and clean["edge_elements"] > 100
    assert clean["latency"] == 39 and clean["beats_per_cycle"] > 0

    # One flipped payload bit in one port's copy of one result: exactly one element mismatches.
    bad = dict(got, check=list(got["check"]))
    port, frame = bad["check"][5]
    bad["check"][5] = (port, _tamper(frame, 1))
    res = bench.check_row(PARAMS, row, plan, bad)
    assert res["mismatches"] == 1 and res["problems"]

    # A result frame lost: missing, and every element of that chunk counts.
    bad = dict(got, check=got["check"][1:])
    res = bench.check_row(PARAMS, row, plan, bad)
    assert res["missing"] == 1 and res["mismatches"] == plan["n"]

    # A wrong result in the throughput run.
    bad = dict(got, load=[(p, _tamper(f)) if i == 3 else (p, f) for i, (p, f) in enumerate(got["load"])])
    assert bench.check_row(PARAMS, row, plan, bad)["load_bad"] == 1


def test_checker_refuses_the_fold_of_another_order():
    """fp32 SUM folded in another order than the ports' (here: descending) is a mismatch."""
    from cais import numerics
    row = bench.ROWS["fp32.sum.wire"]
    plan = bench.plan_row(PARAMS, row, 64, 5, 8)
    got = model_switch(plan)
    first = {p: f for p, f in plan["check"]["sequence"] if proto.parse_frame(f).cais.seq_num == 0}
    values = [numerics.decode(row.dtype, proto.parse_frame(first[p]).payload) for p in range(PARAMS.ports)]
    descending = bench._fold(row, values[::-1])
    assert descending != bench._fold(row, values), "this seed's chunk 0 is order-blind"
    check = [(p, f[:proto.HEADERS_BYTES] + descending if proto.parse_frame(f).cais.seq_num == 0 else f)
             for p, f in got["check"]]
    res = bench.check_row(PARAMS, row, plan, dict(got, check=check))
    assert res["mismatches"] > 0 and res["missing"] == 0


# ---------------------------------------------------------------- the Verilated switch


@pytest.mark.verilator
def test_one_small_row_on_the_verilated_switch():
    row = bench.ROWS["bf16.sum.acc_fp32"]
    plan = bench.plan_row(PARAMS, row, 64, 1, 8)
    got = bench.simulate(PARAMS, [plan], jobs=1, log=lambda _: None)[row.name]
    res = bench.check_row(PARAMS, row, plan, got)
    assert res["problems"] == [] and res["mismatches"] == 0
    # 64 random elements asked for: one chunk, which holds max_payload / 2 = 128 bf16 elements
    assert res["random_elements"] == 128 and res["edge_elements"] >= 2744
    assert 0.9 * PARAMS.ports < res["beats_per_cycle"] <= PARAMS.ports      # every port at line rate
    assert res["latency"] > res["frame_beats"]
    # The same received frames with one bit flipped must fail the check.
    got["check"][0] = (got["check"][0][0], _tamper(got["check"][0][1]))
    assert bench.check_row(PARAMS, row, plan, got)["mismatches"] == 1


def test_tables():
    rows = [bench.ROWS["fp16.max.reproducible+acc_fp32"], bench.ROWS["int16.sum.saturate"]]
    results = []
    for row in rows:
        plan = bench.plan_row(PARAMS, row, 20, 2, 8)
        results.append(bench.check_row(PARAMS, row, plan, model_switch(plan)))
    table = bench.numerics_table(PARAMS, rows, results)
    assert "fp16.max.reproducible+acc_fp32" in table and "32.0" in table and "FAILED" not in table
    assert "reproducible+acc_fp32" in bench.mode_table(PARAMS, rows, results)
    fake = {"part": "LFE5U-45F CABGA381", "lut4": 100, "ff": 50, "wrapper_ffs": 0, "bram": 4, "dsp": 0,
            "fmax_mhz": 50.0, "wall_s": 1.0, "cached": True, "critical_path": None}
    area = bench.area_table({"switch": fake, "switch_int": dict(fake, lut4=90, bram=2)}, {}, {})
    lines = {line.split("  ")[0].strip(): line.split() for line in area.splitlines()}
    assert lines["float units (switch - switch_int)"][-4:] == ["10", "0", "2", "0"]
    assert lines["slot_alu"][-2:] == ["not", "run"]
    failed = bench.area_table({"switch": fake}, {}, {"switch_int": "nextpnr failed"})
    assert "switch_int: FAILED: nextpnr failed" in failed


@pytest.mark.verilator
def test_json_output(capsys):
    import json

    assert bench.main(["--json", "--no-area", "--only", "int8.max.wire", "--elements", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["rows"]
    assert row["name"] == "int8.max.wire" and row["mismatches"] == 0 and not row["problems"]
    assert row["beats_per_cycle"] >= 0.98 * PARAMS.ports             # every port at line rate
