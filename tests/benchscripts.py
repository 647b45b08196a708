"""Shared checks for the tests of the bench/ scripts: loading a script as a module, and the command-line
contract every script keeps (a bad argument exits with status 2 and one line naming it, no traceback)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_script(name: str):
    """bench/<name>.py as module ``name`` (registered, so scripts that import each other share it)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return sys.modules[name]


def assert_refused(parse_args, argv: list[str], needle: str, capsys) -> None:
    """``parse_args(argv)`` exits with status 2 and prints one line containing ``needle``."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1, err          # one line, no usage dump


def assert_refused_by_process(name: str, argv: list[str], needle: str, timeout: float = 120) -> None:
    """Running bench/<name>.py with ``argv`` exits with status 2, names ``needle``, shows no traceback."""
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *argv], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
