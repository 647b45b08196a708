"""The PyTorch example (make train) and its bench: the command-line contract. (The end-to-end path they
drive, torchrun ranks through cais-switch in namespaces, is tests/system/test_torch_deployed.py's.)"""

import pytest

from benchscripts import assert_refused, load_script


def load_example():
    return load_script("bench_torch").load_example()        # the bench loads the example: one loader


@pytest.mark.parametrize("argv, needle", [(["--ranks", "1"], "--ranks"), (["--epochs", "0"], "--epochs"),
                                          (["--ranks", "17"], "--ranks: 17: one switch port per rank"),
                                          (["--runs", "nccl"], "--runs: nccl"),
                                          (["--plot", "/proc/no-such-folder/loss.png"], "--plot")])
def test_example_refuses_bad_arguments(argv, needle, capsys):
    assert_refused(load_example().main, argv, needle, capsys)


@pytest.mark.parametrize("argv, needle", [(["--backend", "fpga"], "--backend"), (["--ranks", "17"], "--ranks: 17")])
def test_bench_refuses_bad_arguments(argv, needle, capsys):
    assert_refused(load_script("bench_torch").parse_args, argv, needle, capsys)
