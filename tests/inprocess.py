"""A command-line entry point run in this process, for the catalogues that call one many times (a second
Python costs 0.4-0.6 s a call, more than the case): what ``subprocess.run`` would give for the separate
command, its exit status and output. The tests that check the installed command itself still run it."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

__all__ = ["run_main"]

REPO = Path(__file__).resolve().parents[1]


def run_main(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python *argv`` (``-m module args...`` or ``script.py args...``, a script's path from the repository's
    root) in this process, seeing ``env`` as its environment (default: this process's). An exception other
    than SystemExit propagates: the test fails with the traceback the command would have printed."""
    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (str(REPO / argv[0]), argv[1:])
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = [target, *args]
    code = 0
    try:
        with contextlib.ExitStack() as stack:
            if env is not None:
                stack.enter_context(mock.patch.dict(os.environ, env, clear=True))
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore", RuntimeWarning)      # "found in sys.modules": imported by other tests
            try:
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(target, run_name="__main__")
            except SystemExit as e:
                code = 0 if e.code is None else e.code
    finally:
        sys.argv = saved
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
