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
    (["-m", "cais.hdl.export", "--ports", "17"], "ports=17"),
    (["-m", "cais.hdl.export", "--data-width", "abc"], "data-width"),
    (["bench/bench_datapath.py", "--ports", "0"], "ports=0"),
]


@pytest.mark.parametrize("argv,needle", CASES)
def test_bad_arguments_refused(argv, needle):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
