"""Command-line entry points refuse bad arguments with a message and exit status 2, never a traceback."""

import subprocess
import sys

import pytest

CASES = [
    (["-m", "cais.sim.demo", "--ports", "1"], "ports=1"),
    (["-m", "cais.sim.demo", "--elements", "0"], "--elements"),
    (["-m", "cais.sim.demo", "--op", "avg"], "--op"),
    (["-m", "cais.sim.demo", "--window", "3"], "--window 3"),
    (["-m", "cais.sim.demo", "--data-width", "100"], "data_width=100"),
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
