"""Export the switch to Verilog, and optionally lint the result with Verilator.

Command line (also ``make verilog`` / ``make lint``)::

    python -m cais.hdl.export [--ports N] [--data-width BITS] [...] [--out DIR] [--name NAME] [--lint]
    python -m cais.hdl.export --block {ingress,sram,alu,csr,switch} [...]

writes ``<out>/<name>.v`` and ``<out>/<name>.params.json``. With ``--block`` one block of the switch
(:data:`cais.hdl.blocks.BLOCKS`: the header parser, the SRAM buffer, the reduce ALU's fold chain,
the AXI4-Lite register block) is written instead, as a top of its own with plain ports
(``<out>/cais_<block>.v`` unless ``--name`` says otherwise).  Every field of
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
from pathlib import Path


from ..cmdline import Parser, add_param_arguments, params_from_args
from ..params import SwitchParams

__all__ = ["DEFAULT_NAME", "LINT_WAIVERS", "write_verilog", "generate_verilog", "generate_block", "write_integration_files",
           "render_fusesoc_core", "lint_verilog", "main"]

DEFAULT_NAME = "cais_switch"

#: Verilator warnings waived by ``--lint`` (``-Wall`` otherwise), each with the reason.
LINT_WAIVERS: tuple[tuple[str, str], ...] = (
    ("DECLFILENAME", "Amaranth writes every submodule into the one <name>.v file"),
    ("PROCASSINIT", "Amaranth gives registers an initial value in the declaration and assigns them in processes"),
    ("UNUSEDSIGNAL", "Amaranth keeps named intermediate signals and unused slices of wide values"),
    ("WIDTHTRUNC", "Amaranth's arithmetic widens results; the truncation on assignment is intended"),
    ("WIDTHEXPAND", "Amaranth relies on Verilog's implicit zero extension of narrower operands"),
    ("CASEINCOMPLETE", "Amaranth assigns every signal its default before a `casez`, so uncovered values hold it"),
    ("UNSIGNED", "Amaranth keeps a compare that a constant operand makes constant (e.g. 0 > x after folding)"),
)


def write_verilog(component, path: str | os.PathLike, name: str = DEFAULT_NAME, platform=None) -> Path:
    """Convert an ``amaranth.lib.wiring.Component`` to Verilog with top module *name*, written to *path*.

    *platform* is handed to every ``elaborate``: None (the default) for the Verilog simulations use,
    :data:`cais.hdl.common.bram.ECP5_SYNTHESIS` for an ECP5 synthesis (block RAMs with their output register
    become DP16KD instances, which only yosys' ECP5 flow knows).

    The file is written atomically (temporary file, then rename), so a concurrent reader never sees a
    half-written file.  Returns the path.
    """
    from amaranth.back import verilog

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(component, name=name, platform=platform)
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


def generate_block(block: str, params: SwitchParams, path: str | os.PathLike, name: str | None = None) -> Path:
    """Write block ``block`` of :data:`cais.hdl.blocks.BLOCKS` built for *params* to *path*, top module *name*
    (default the block's own, e.g. ``cais_alu``); ``switch`` is :func:`generate_verilog`. Returns the path."""
    from .blocks import BLOCKS, block_top

    if block not in BLOCKS:
        raise ValueError(f"unknown block {block!r}; one of {', '.join(BLOCKS)}")
    name = name or BLOCKS[block][1]
    if block == "switch":
        return generate_verilog(params, path, name)
    return write_verilog(block_top(block, params), path, name)


def write_integration_files(params: SwitchParams, verilog: str | os.PathLike,
                            name: str = DEFAULT_NAME) -> tuple[Path, Path]:
    """Beside the Verilog: ``<name>_regs.h`` (the register map for firmware, :func:`cais.regdoc.render_c_header`)
    and ``<name>.core`` (a FuseSoC CAPI2 core file naming the Verilog, its top and the lint waivers), so an
    FPGA project can take the switch in with ``fusesoc library add``. Returns both paths."""
    from ..regdoc import render_c_header
    from ..registers import register_map

    verilog = Path(verilog)
    header = verilog.with_name(f"{name}_regs.h")
    _atomic_write(header, render_c_header(register_map(params), name))
    core = verilog.with_name(f"{name}.core")
    _atomic_write(core, render_fusesoc_core(params, verilog.name, header.name, name))
    return header, core


def render_fusesoc_core(params: SwitchParams, verilog: str, header: str, name: str = DEFAULT_NAME) -> str:
    """A FuseSoC CAPI2 core description of the exported switch (the parameters are built into the Verilog)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("cais")
    except PackageNotFoundError:
        release = "0.0.0"
    waivers = "".join(f"\n          - -Wno-{code}" for code, _ in LINT_WAIVERS)
    return (f"CAPI=2:\n"
            f"# Generated by python -m cais.hdl.export ({params.slug()}); do not edit.\n"
            f"name: cais:switch:{name}:{release}\n"
            f"description: CAIS in-network aggregation switch, {params.ports} ports x {params.data_width}-bit "
            f"AXI4-Stream, AXI4-Lite control\n"
            f"filesets:\n"
            f"  rtl:\n"
            f"    files:\n"
            f"      - {verilog}: {{file_type: verilogSource}}\n"
            f"      - {header}: {{file_type: cSource, is_include_file: true}}\n"
            f"targets:\n"
            f"  default:\n"
            f"    filesets: [rtl]\n"
            f"    toplevel: {name}\n"
            f"  lint:\n"
            f"    default_tool: verilator\n"
            f"    filesets: [rtl]\n"
            f"    toplevel: {name}\n"
            f"    tools:\n"
            f"      verilator:\n"
            f"        mode: lint-only\n"
            f"        verilator_options:\n"
            f"          - -Wall{waivers}\n")


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
    add_param_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("build/verilog"),
                        help="output folder (default build/verilog)")
    parser.add_argument("--name", default=None,
                        help=f"top module and file name (default {DEFAULT_NAME}; with --block, cais_<block>)")
    parser.add_argument("--block", default="switch", choices=_block_names(),
                        help="write one block as a top of its own (default: the whole switch)")
    parser.add_argument("--lint", action="store_true",
                        help="also run `verilator --lint-only -Wall` (documented waivers) and exit with its status")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    from .blocks import BLOCKS

    args.name = args.name or BLOCKS[args.block][1]
    if not args.name.isidentifier():
        parser.error(f"--name {args.name!r}: must be a plain Verilog identifier")
    params = params_from_args(parser, args)
    if args.block != "switch":
        path = generate_block(args.block, params, args.out / f"{args.name}.v", args.name)
        print(f"wrote {path} ({args.block}, {params.slug()})")
        return lint_verilog(path, args.name) if args.lint else 0
    path = generate_verilog(params, args.out / f"{args.name}.v", args.name)
    header, core = write_integration_files(params, path, args.name)
    print(f"wrote {path}, {_params_json_path(path).name}, {header.name} and {core.name} ({params.slug()})")
    if args.lint:
        status = lint_verilog(path, args.name)
        print(f"verilator lint: {'clean' if status == 0 else f'failed (exit status {status})'}")
        return status
    return 0


# --- helpers ----------------------------------------------------------------------------------------------------


def _block_names() -> list[str]:
    from .blocks import BLOCKS

    return list(BLOCKS)


def _params_json_path(path: Path) -> Path:
    return path.with_name(path.stem + ".params.json")


def _params_record(params: SwitchParams, name: str) -> dict:
    return {
        "name": name,
        "params": params.as_dict(),
        "derived": {key: getattr(params, key)
                    for key in ("beat_bytes", "rows_per_set", "max_frame_beats", "ingress_depth", "egress_depth",
                                "result_frame_beats", "result_queue_depth")},
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
