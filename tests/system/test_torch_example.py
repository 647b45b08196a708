"""The PyTorch example (make train) and its bench: the command-line contract, and a short run through
cais-switch in namespaces whose checks hold (root)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchscripts import assert_refused, load_script
from netns import require_root

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "train_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, needle", [(["--ranks", "1"], "--ranks"), (["--epochs", "0"], "--epochs"),
                                          (["--runs", "nccl"], "--runs: nccl")])
def test_example_refuses_bad_arguments(argv, needle, capsys):
    assert_refused(load_example().main, argv, needle, capsys)


def test_bench_refuses_bad_arguments(capsys):
    assert_refused(load_script("bench_torch").parse_args, ["--backend", "fpga"], "--backend", capsys)


@pytest.mark.slow
def test_example_short_run_checks_hold(tmp_path):
    """2 ranks, 1 epoch, the cais float run and the block-FP run: every rank ends with the same
    parameters, the block-FP run equals the numpy reference bit for bit, the buckets went through the
    switch, the loss fell."""
    require_root()
    p = subprocess.run([sys.executable, str(EXAMPLE), "--ranks", "2", "--epochs", "1", "--runs", "cais,cais-blockfp",
                        "--json", "--plot", str(tmp_path / "loss.png")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["checks"] and all(c["ok"] for c in out["checks"].values()), out["checks"]
    assert "block-FP: cais == numpy reference, bit for bit" in out["checks"]
    for run in out["runs"].values():
        assert run["switch_fraction"] == 1.0 and run["loss"][0] < 2.3, run      # ln(10) = 2.30: it learnt
    assert (tmp_path / "loss.png").stat().st_size > 0
