"""The cocotb testbenches of tb/ (one per block, cais.tb.run.TESTBENCHES), run through cocotb's public runner
on cached Verilator builds: each case of a testbench is a cocotb test; this wrapper fails naming the cases that
failed (and fails when none ran)."""

from __future__ import annotations

import pytest

from cais.tb.run import TESTBENCHES, run_tb

CASES = [(block, pname) for block, sets in TESTBENCHES.items() for pname in sets]


@pytest.mark.verilator
@pytest.mark.parametrize("block,pname", CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_testbench(block, pname):
    result = run_tb(block, pname)
    assert result.tests >= 4, f"{block}: only {result.tests} cocotb cases ran"
