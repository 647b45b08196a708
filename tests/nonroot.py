"""A non-root user for the security tests (issue 29): the tests that need one fail, never skip, where the
machine cannot provide it."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

__all__ = ["nonroot_uid"]

USER = "cais-test"


def nonroot_uid() -> int:
    """The uid of ``nobody``, else of a user ``cais-test`` created here (useradd); the test fails with the
    reason when the test process is not root or no such user can be had."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it acts as another, non-root user (setpriv)")
    for name in ("nobody", USER):
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        if uid != 0:
            return uid
    out = subprocess.run(["useradd", "--system", "--no-create-home", USER], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"no non-root user to test with, and useradd {USER} failed: {out.stderr.strip()}")
    return pwd.getpwnam(USER).pw_uid
