"""Export the switch to Verilog, and optionally lint the result with Verilator.

Command line (also ``make verilog`` / ``make lint``)::

    python -m cais.hdl.export [--ports N] [--data-width BITS] [...] [--out DIR] [--name NAME] [--lint]

writes ``<out>/<name>.v`` and ``<out>/<name>.params.json``.  Every field of
:class:`cais.params.SwitchParams` is an option (``data_width`` -> ``--data-width``) with the same default.
A parameter set the switch cannot be built with is refused with a one-line message and exit status 2.

The same :func:`generate_verilog` is used by the simulation build cache (:mod:`cais.sim.build`), so the
Verilog that is tested is the Verilog that is exported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path


from ..cli import Parser, boolean, integer
from ..params import ParamError, SwitchParams

__all__ = ["DEFAULT_NAME", "LINT_WAIVERS", "write_verilog", "generate_verilog", "lint_verilog", "main"]

DEFAULT_NAME = "cais_switch"

#: Verilator warnings waived by ``--lint`` (``-Wall`` otherwise), each with the reason.
LINT_WAIVERS: tuple[tuple[str, str], ...] = (
    ("DECLFILENAME", "Amaranth writes every submodule into the one <name>.v file"),
    ("PROCASSINIT", "Amaranth gives registers an initial value in the declaration and assigns them in processes"),
    ("UNUSEDSIGNAL", "Amaranth keeps named intermediate signals and unused slices of wide values"),
    ("WIDTHTRUNC", "Amaranth's arithmetic widens results; the truncation on assignment is intended"),
    ("WIDTHEXPAND", "Amaranth relies on Verilog's implicit zero extension of narrower operands"),
    ("CASEINCOMPLETE", "Amaranth assigns every signal its default before a `casez`, so uncovered values hold it"),
)


def write_verilog(component, path: str | os.PathLike, name: str = DEFAULT_NAME) -> Path:
    """Convert an ``amaranth.lib.wiring.Component`` to Verilog with top module *name*, written to *path*.

    The file is written atomically (temporary file, then rename), so a concurrent reader never sees a
    half-written file.  Returns the path.
    """
    from amaranth.back import verilog

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(component, name=name)
    _atomic_write(path, text)
    return path


def generate_verilog(params: SwitchParams, path: str | os.PathLike, name: str = DEFAULT_NAME) -> Path:
    """Build ``cais.hdl.top.SwitchTop(params)`` and write it to *path* as Verilog, top module *name*.

    Also writes ``<path without .v>.params.json``: ``{"name", "params", "derived"}``; reload the
    parameters with ``SwitchParams(**data["params"])``.  Returns the path of the Verilog file.
    """
    from .top import SwitchTop

    path = Path(path)
    write_verilog(SwitchTop(params), path, name)
    _atomic_write(_params_json_path(path), json.dumps(_params_record(params, name), indent=2) + "\n")
    return path


def lint_verilog(path: str | os.PathLike, top: str = DEFAULT_NAME, *,
                 waivers: tuple[tuple[str, str], ...] = LINT_WAIVERS, extra_args: tuple[str, ...] = ()) -> int:
    """Run ``verilator --lint-only -Wall`` with *waivers* on *path*; returns Verilator's exit status."""
    from .toolchain import setup_verilator_env

    exe = setup_verilator_env()
    cmd = [str(exe), "--lint-only", "-Wall", "--top-module", top,
           *(f"-Wno-{code}" for code, _why in waivers), *extra_args, str(path)]
    print(" ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=False).returncode


# --- command line ---------------------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m cais.hdl.export",
                     description="Export the CAIS switch to Verilog (and optionally lint it with Verilator).")
    defaults = SwitchParams()
    group = parser.add_argument_group("switch parameters (see cais.params.SwitchParams)")
    for f in fields(SwitchParams):
        default = getattr(defaults, f.name)
        flag = isinstance(default, bool)
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=boolean if flag else integer(),
                           default=default, metavar="BOOL" if flag else "N",
                           help=f"default {str(default).lower() if flag else default}")
    parser.add_argument("--out", type=Path, default=Path("build/verilog"),
                        help="output folder (default build/verilog)")
    parser.add_argument("--name", default=DEFAULT_NAME,
                        help=f"top module and file name (default {DEFAULT_NAME})")
    parser.add_argument("--lint", action="store_true",
                        help="also run `verilator --lint-only -Wall` (documented waivers) and exit with its status")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not args.name.isidentifier():
        parser.error(f"--name {args.name!r}: must be a plain Verilog identifier")
    try:
        params = SwitchParams(**{f.name: getattr(args, f.name) for f in fields(SwitchParams)})
    except ParamError as exc:
        parser.error(str(exc))
    path = generate_verilog(params, args.out / f"{args.name}.v", args.name)
    print(f"wrote {path} and {_params_json_path(path)} ({params.slug()})")
    if args.lint:
        status = lint_verilog(path, args.name)
        print(f"verilator lint: {'clean' if status == 0 else f'failed (exit status {status})'}")
        return status
    return 0


# --- helpers ----------------------------------------------------------------------------------------------------


def _params_json_path(path: Path) -> Path:
    return path.with_name(path.stem + ".params.json")


def _params_record(params: SwitchParams, name: str) -> dict:
    return {
        "name": name,
        "params": params.as_dict(),
        "derived": {key: getattr(params, key)
                    for key in ("beat_bytes", "rows_per_set", "max_frame_beats", "ingress_depth", "egress_depth")},
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
