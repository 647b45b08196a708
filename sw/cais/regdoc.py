"""Render the register map as Markdown: the source of docs/registers.md.

    python -m cais.regdoc > docs/registers.md              # the default SwitchParams
    python -m cais.regdoc --ports 8 --slots 128            # another build

tests/sw/test_registers.py checks that docs/registers.md equals ``render_markdown(register_map())``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import fields

from .cmdline import Parser, add_param_arguments, params_from_args
from .params import SwitchParams
from .registers import COUNTER_EVENTS, MAGIC, VERSION, Kind, Register, RegisterMap, register_map

__all__ = ["GROUPS", "render_markdown", "render_c_header", "main"]

# The sections of the document: (title, first register of the section, introduction). A section holds
# every register from its first register (by offset) up to the next section's first register.
GROUPS = (
    ("Identification and build parameters", "ID",
     "Constants: the magic number, the map version and the parameters the switch was built with."),
    ("Switch configuration and commands", "SWITCH_MAC_LO",
     "Global settings and slot management."),
    ("Rule table", "RULE_GROUP",
     "Rules are written through staging registers: write RULE_GROUP, RULE_LAYER, RULE_CHUNK, RULE_PORTS, "
     "RULE_SLOTS and RULE_TYPE, then RULE_WRITE copies them into one entry. The staging registers keep their "
     "values, so entries that differ in one field need only that field rewritten."),
    ("MAC table", "MAC_ADDR_LO",
     "MAC-table entries route ordinary frames; they are written through staging registers like rules."),
    ("More build parameters", "MAX_FRAME",
     "Constants added after the first map, so that every build parameter can be read from the registers."),
    ("Switch-core counters and gauges", COUNTER_EVENTS[0][0],
     "One counter per drop reason (the reasons are checked in this order; the first that applies is "
     "counted) and per switch-core event, then gauges of the current state."),
    ("Per-port counters", "RX_FRAMES",
     "Register arrays, one element per port: port p's element is at offset + p * stride."),
    ("Per-rule-entry state", "SETS_IN_USE",
     "Register arrays, one element per rule entry (p below is the entry's index): entry e's element is at "
     "offset + e * stride."),
)

BUS_FACTS = (
    "All registers are 32 bits wide. Offsets are byte addresses, multiples of 4, relative to the base "
    "of the switch's AXI4-Lite control port (32-bit data).",
    "Only whole-word accesses: a write with `wstrb` other than `0b1111` is dropped and answered "
    "`SLVERR`; bits 1:0 of the address are ignored.",
    "An address that holds no register answers `DECERR` (reads return 0, writes have no effect). "
    "Every other access answers `OKAY`: reads of write-only (wo) registers return 0 and writes to "
    "read-only (ro) registers are ignored.",
    "Bits outside a register's fields are reserved: they read 0 and writes to them are ignored. A "
    "register without listed fields uses all 32 bits.",
    "Counters count up from 0 after reset, wrap modulo 2**32 and are never cleared while the switch "
    "runs: software reads them twice and takes the difference modulo 2**32.",
    "A register array (per-port registers) has `count` elements; element i is at "
    "`offset + i * stride`.",
    "Kinds: const = a build parameter or constant, config = state software writes, command = a write "
    "triggers an action, counter = an event counter, level = a live gauge of switch state.",
    "A partial write (`wstrb` not `0b1111`) answers `SLVERR` whatever its address, an unmapped one "
    "included, and writes nothing.",
    "The control port handles one access at a time: the response comes three clock cycles (`bvalid`) or "
    "four (`rvalid`) after the request is accepted (cycle 0; for a write, the cycle in which the later of AW "
    "and W is accepted). A read returns the register's value of cycle 1 (its multiplexers take two "
    "registered steps, so that reading registers spread over the chip is not one long path); a write's "
    "value or command takes effect in cycle 2. AW and W may arrive in either order, and a write whose AW or W was accepted is finished "
    "before any read is taken. When a read (AR) and a write (AW or W) are valid in the same cycle the read "
    "goes first, unless the access before was a read taken while a write waited: then the write goes "
    "first. So neither starves; they alternate. While the SLOT_CLEAR queue is full (four clears waiting, "
    "see SLOT_CLEAR) no write is accepted (AWREADY and WREADY stay low; reads are still served): a write "
    "waits for room rather than being lost.",
)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _bits(f) -> str:
    msb = f.lsb + f.width - 1
    return f"{msb}" if f.width == 1 else f"{msb}:{f.lsb}"


def _offset(reg: Register) -> str:
    if reg.count == 1:
        return f"`{reg.offset:#05x}`"
    return f"`{reg.offset:#05x} + {reg.stride:#x} * p`"


def _reset(reg: Register) -> str:
    if reg.kind in (Kind.COMMAND,):
        return "-"
    if reg.kind is Kind.LEVEL:
        return "live"
    if reg.kind is Kind.CONST and reg.reset < 0x1_0000:
        return f"`{reg.reset:#x}` ({reg.reset})"
    return f"`{reg.reset:#x}`"


def _fields(reg: Register) -> str:
    if not reg.fields:
        return "`31:0`"
    parts = []
    for f in sorted(reg.fields, key=lambda f: f.lsb, reverse=True):
        text = f"`{_bits(f)}` {f.name}"
        if f.doc:
            text += f": {f.doc}"
        parts.append(text)
    return "<br>".join(_cell(p) for p in parts)


def _groups(regmap: RegisterMap):
    regs = sorted(regmap, key=lambda r: r.offset)
    names = {r.name for r in regs}
    starts = [(title, regmap[first].offset, intro) for title, first, intro in GROUPS if first in names]
    starts.sort(key=lambda g: g[1])
    if not starts or starts[0][1] > regs[0].offset:
        starts.insert(0, ("Registers", regs[0].offset, ""))
    for k, (title, start, intro) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else None
        members = [r for r in regs if r.offset >= start and (end is None or r.offset < end)]
        if members:
            yield title, intro, members


def render_markdown(regmap: RegisterMap) -> str:
    """The register map as a Markdown document (ends with a newline)."""
    P = regmap.params
    default = SwitchParams()
    changed = [f"--{f.name.replace('_', '-')} {getattr(P, f.name)}" for f in fields(P)
               if getattr(P, f.name) != getattr(default, f.name)]
    command = " ".join(["python -m cais.regdoc", *changed])
    params = ", ".join(f"{f.name}={getattr(P, f.name)}" for f in fields(P))
    addr_bits = (regmap.size - 1).bit_length()

    out = []
    out.append("# CAIS control and status registers")
    out.append("")
    out.append(f"Generated from `cais.registers.register_map()` by `{command} > docs/registers.md`; "
               "do not edit by hand.")
    out.append("")
    out.append(f"Build parameters: {params}.")
    out.append("")
    out.append(f"The map spans {regmap.size} bytes (`{regmap.size - 1:#x}`, {addr_bits} address bits).")
    out.append("")
    out.append("## Bus")
    out.append("")
    for fact in BUS_FACTS:
        out.append(f"- {fact}")
    out.append("")
    out.append("## Summary")
    out.append("")
    out.append("| Section | Offsets | Registers |")
    out.append("|---|---|---|")
    groups = list(_groups(regmap))
    for title, _intro, regs in groups:
        first = regs[0].offset
        last = max(r.offset + (r.count - 1) * r.stride for r in regs)
        out.append(f"| {_cell(title)} | `{first:#05x}`-`{last + 3:#05x}` | {len(regs)} |")
    out.append("")
    for title, intro, regs in groups:
        out.append(f"## {title}")
        out.append("")
        if intro:
            out.append(intro)
            out.append("")
        out.append("| Offset | Name | Access | Kind | Reset | Description | Fields (bits, name) |")
        out.append("|---|---|---|---|---|---|---|")
        for r in regs:
            name = r.name if r.count == 1 else f"{r.name}[p]"
            doc = r.doc
            if r.count > 1:
                doc += f" Array: {r.count} elements, stride `{r.stride:#x}`."
            out.append(f"| {_offset(r)} | {name} | {r.access.value} | {r.kind.value} | {_reset(r)} "
                       f"| {_cell(doc)} | {_fields(r)} |")
        out.append("")
        arrays = [r for r in regs if r.count > 1]
        if arrays:
            counts = {r.count for r in arrays}
            n = max(counts)
            out.append("Addresses per element:")
            out.append("")
            out.append("| Index | " + " | ".join(r.name for r in arrays) + " |")
            out.append("|---|" + "---|" * len(arrays))
            for i in range(n):
                cells = [f"`{r.address(i):#05x}`" if i < r.count else "" for r in arrays]
                out.append(f"| {i} | " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _c_comment(text: str) -> str:
    return text.replace("*/", "* /")


def render_c_header(regmap: RegisterMap, name: str = "cais_switch") -> str:
    """The register map as a C header: byte addresses (arrays as macros of the index), field shifts and
    masks, reset values and constants, and the build parameters. For firmware on the FPGA's CPU."""
    P = regmap.params
    guard = re.sub(r"\W", "_", name).upper() + "_REGS_H"
    lines = [f"/* Generated by cais.regdoc for {name} ({P.slug()}); do not edit. The CAIS switch's register",
             " * map on its AXI4-Lite port (docs/registers.md): byte addresses, 32-bit registers. */",
             f"#ifndef {guard}", f"#define {guard}", "",
             f"#define CAIS_MAGIC 0x{MAGIC:08X}u",
             f"#define CAIS_VERSION 0x{VERSION:08X}u", ""]
    lines += [f"#define CAIS_PARAM_{key.upper()} {int(value)}" for key, value in P.as_dict().items()]
    lines.append("")
    for reg in sorted(regmap.registers, key=lambda r: r.offset):
        first = reg.doc.split(". ")[0].rstrip(".")
        lines.append(f"/* {reg.name} ({reg.access.name}, {reg.kind.name.lower()}): {_c_comment(first)} */")
        base = f"CAIS_REG_{reg.name}"
        if reg.count > 1:
            lines.append(f"#define {base}(i) (0x{reg.offset:03X}u + (i) * 0x{reg.stride:X}u)")
            lines.append(f"#define {base}_COUNT {reg.count}")
        else:
            lines.append(f"#define {base} 0x{reg.offset:03X}u")
        if reg.kind in (Kind.CONST, Kind.CONFIG):
            lines.append(f"#define {base}_RESET 0x{reg.reset:08X}u")
        for f in reg.fields:
            lines.append(f"#define {base}_{f.name.upper()}_SHIFT {f.lsb}")
            lines.append(f"#define {base}_{f.name.upper()}_MASK 0x{f.mask:08X}u")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = Parser(prog="python -m cais.regdoc",
                    description="Print the register map as Markdown (docs/registers.md) or as a C header.")
    add_param_arguments(parser)
    parser.add_argument("--c-header", action="store_true", help="print a C header instead of Markdown")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")
    args = parser.parse_args(argv)
    regmap = register_map(params_from_args(parser, args))
    text = render_c_header(regmap) if args.c_header else render_markdown(regmap)
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
