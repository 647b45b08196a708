"""Command-line entry points refuse bad arguments with a message and exit status 2, never a traceback."""

import subprocess
import sys

import pytest

CASES = [
    (["-m", "cais.sim.cosim", "--ranks", "1"], "--ranks 1"),
    (["-m", "cais.sim.cosim", "--ranks", "17"], "--ranks 17"),
    (["-m", "cais.sim.cosim", "--elements", "0"], "--elements"),
    (["-m", "cais.sim.cosim", "--op", "avg"], "--op"),
    (["-m", "cais.sim.cosim", "--backend", "fpga"], "--backend"),
    (["-m", "cais.sim.cosim", "--loss", "1.5"], "--loss"),
    (["-m", "cais.sim.cosim", "--loss", "0.6", "--duplicate", "0.6"], "must not exceed 1"),
    (["-m", "cais.sim.cosim", "--config", "/nonexistent.toml"], "cannot read"),
    (["-m", "cais.sim.cosim", "--dtype", "int64"], "--dtype"),
    (["-m", "cais.sim.cosim", "--dtype", "float8"], "--dtype"),
    (["-m", "cais.sim.cosim", "--accumulate", "fp64"], "--accumulate"),
    (["-m", "cais.sim.cosim", "--float-mode", "fast"], "--float-mode"),
    (["-m", "cais.sim.cosim", "--reproducible", "yes"], "unrecognized arguments: yes"),
    (["-m", "cais.hdl.export", "--ports", "17"], "ports=17"),
    (["-m", "cais.hdl.export", "--data-width", "abc"], "data-width"),
    (["-m", "cais.hdl.export", "--float-units", "maybe"], "'maybe' is not a boolean"),
    (["bench/bench_datapath.py", "--ports", "0"], "ports=0"),
    (["-m", "cais.sim.fuzz", "--frames", "0"], "--frames 0"),
    (["-m", "cais.sim.fuzz", "--seed", "x"], "--seed"),
    (["-m", "cais.sim.scale", "--chunks", "3"], "--chunks 3"),
    (["-m", "cais.sim.scale", "--backend", "fpga"], "--backend"),
    (["-m", "cais.formal.prove", "--mutant", "nope"], "--mutant"),
]


@pytest.mark.parametrize("argv,needle", CASES)
def test_bad_arguments_refused(argv, needle):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_native_types_end_to_end(tmp_path):
    """`make sim` on the model: bf16 with fp32 accumulation and reproducible order, checked bit for bit."""
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "500",
                           "--dtype", "bf16", "--reproducible", "--loss", "0.02", "--offload", "always"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CORRECT" in proc.stdout and "bit for bit" in proc.stdout and "path: switch native" in proc.stdout
    assert "accumulate fp32, reproducible True" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "500",
                           "--dtype", "float16", "--float-mode", "quantize", "--accumulate", "wire",
                           "--offload", "always"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "path: switch quantized" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "300",
                           "--dtype", "int8", "--op", "min", "--offload", "never"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "equals numpy's min" in proc.stdout and "path: ring" in proc.stdout, proc.stdout


@pytest.mark.parametrize("spelling, value", [("false", False), ("No", False), ("0", False), ("off", False),
                                             ("true", True), ("YES", True), ("1", True), ("on", True)])
def test_export_takes_boolean_parameters(tmp_path, monkeypatch, spelling, value):
    """make verilog ARGS="--float-units false": every usual spelling of a boolean."""
    from cais.hdl import export

    built = []

    def fake_generate(params, path, name):           # the parameters are what is checked, not the Verilog
        built.append(params)
        return path

    monkeypatch.setattr(export, "generate_verilog", fake_generate)
    assert export.main(["--float-units", spelling, "--out", str(tmp_path)]) == 0
    assert built[0].float_units is value
