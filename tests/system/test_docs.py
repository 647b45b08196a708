"""docs/protocol.md must not drift from cais.protocol: every code point, drop reason, header field and
byte offset defined in protocol.py has to appear in the document with its value."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from cais import protocol
from cais.protocol import (CAIS_HEADER_BYTES, ETH_HEADER_BYTES, ETHERTYPE, HEADER_FIELDS, RESERVED_FIELDS,
                           SUPPORTED_DTYPES, SUPPORTED_OPS, DropReason, DType, Flags, OpType, ReduceOp)
from cais.params import MAX_RULES, ParamError, SwitchParams
from cais.registers import COUNTER_EVENTS, register_map

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "protocol.md"
ENUMS = (OpType, DType, ReduceOp, Flags, DropReason)


@pytest.fixture(scope="module")
def lines():
    return DOC.read_text().splitlines()


def _word(text: str) -> re.Pattern:
    return re.compile(rf"(?<![\w.]){re.escape(text)}(?![\w.])")


def _value_forms(value: int) -> list[str]:
    return [str(value), f"0x{value:x}", f"0x{value:X}", f"0x{value:02x}", f"0x{value:02X}"]


def _table_rows(lines, name):
    """Table rows whose first cell is the member name (optionally in backticks)."""
    pat = re.compile(rf"^\|\s*`?{re.escape(name)}`?\s*\|")
    return [ln for ln in lines if pat.match(ln)]


@pytest.mark.parametrize("member", [m for e in ENUMS for m in e], ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_every_enum_member_documented_with_value(lines, member):
    rows = _table_rows(lines, member.name)
    assert rows, f"{type(member).__name__}.{member.name} has no table row in docs/protocol.md"
    forms = _value_forms(int(member))
    ok = [r for r in rows if any(_word(f).search(r.split("|")[2]) for f in forms)]
    assert ok, f"{member.name}: no table row gives its value {int(member)} in the second column: {rows}"


@pytest.mark.parametrize("member", list(OpType) + list(DType), ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_supported_column_matches(lines, member):
    supported = member in (SUPPORTED_OPS if isinstance(member, OpType) else SUPPORTED_DTYPES)
    row = _table_rows(lines, member.name)[0]
    cells = [c.strip() for c in row.split("|")]
    assert ("yes" if supported else "no") in cells, row


def test_every_drop_reason_named(lines):
    text = "\n".join(lines)
    for r in DropReason:
        assert _word(r.name).search(text), r.name
        assert f"DROP_{r.name}" in text or "DROP_<reason>" in text


def test_counters_named(lines):
    text = "\n".join(lines)
    for name, _ in COUNTER_EVENTS:
        if not name.startswith("DROP_"):
            assert f"`{name}`" in text, name
    for name in ("RX_FRAMES", "RX_BYTES", "TX_FRAMES", "TX_BYTES", "SLOTS_IN_USE"):
        assert f"`{name}`" in text, name


def _span(start: int, size: int) -> str:
    return str(start) if size == 1 else f"{start}..{start + size - 1}"


def test_header_field_offsets(lines):
    offset = 0
    for name, bits in HEADER_FIELDS:
        size = bits // 8
        rows = _table_rows(lines, name)
        assert rows, name
        cells = [c.strip() for c in rows[0].split("|")[1:-1]]
        assert cells[1] == str(bits), (name, cells)
        assert cells[2] == _span(ETH_HEADER_BYTES + offset, size), (name, cells)
        assert cells[3] == _span(offset, size), (name, cells)
        offset += size
    assert offset == CAIS_HEADER_BYTES


def test_reserved_split(lines):
    reserved = dict((n, i) for i, (n, _) in enumerate(HEADER_FIELDS))["reserved"]
    res_off = sum(b for _, b in HEADER_FIELDS[:reserved]) // 8
    msb = 15
    for name, bits in RESERVED_FIELDS:
        lsb = msb - bits + 1
        rows = _table_rows(lines, name)
        assert rows, name
        cells = [c.strip() for c in rows[0].split("|")[1:-1]]
        assert cells[1] == str(bits), (name, cells)
        byte = res_off + (15 - msb) // 8
        if bits == 8:
            assert cells[3] == str(byte), (name, cells)
        else:
            hi, lo = msb % 8, lsb % 8
            assert cells[3] == f"{byte}, bits {hi}:{lo}", (name, cells)
            assert cells[2] == f"{ETH_HEADER_BYTES + byte}, bits {hi}:{lo}", (name, cells)
        msb = lsb - 1


def test_constants_mentioned(lines):
    text = "\n".join(lines)
    assert f"0x{ETHERTYPE:04X}" in text
    assert f"`MIN_FRAME_BYTES` | {protocol.MIN_FRAME_BYTES}" in text
    assert str(protocol.MAX_FRAME_BYTES) in text
    assert "03:ca:15:00:00:" in text and "02:ca:15:00:00:00" in text
    assert protocol.mac_to_str(protocol.result_mac(0))[:15] == "03:ca:15:00:00:"
    assert protocol.mac_to_str(protocol.SWITCH_MAC_DEFAULT) == "02:ca:15:00:00:00"


INTERFACE = DOC.parent / "interface.md"
README = DOC.parent.parent / "README.md"


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("name", [f.name for f in fields(SwitchParams)])
def test_every_build_parameter_in_the_interface_table_and_readme(name):
    """docs/interface.md's parameter table has a row per SwitchParams field, with its option and default;
    README's list of parameters names every option."""
    rows = [ln for ln in INTERFACE.read_text().splitlines() if ln.startswith(f"| `{name}` (`{_option(name)}`) |")]
    assert len(rows) == 1, f"no row for {name} in interface.md's parameter table"
    default = getattr(SwitchParams(), name)
    cell = rows[0].split("|")[2].strip()
    assert cell == (str(default).lower() if isinstance(default, bool) else str(default)), (name, cell)
    assert f"`{_option(name)}`" in README.read_text(), f"README's parameter list omits {_option(name)}"


def test_rule_limit_documented_and_refused():
    """The rule limit in interface.md is the one SwitchParams refuses beyond, with a message naming it."""
    row = next(ln for ln in INTERFACE.read_text().splitlines() if ln.startswith("| `rules`"))
    assert f"1 to {MAX_RULES}" in row
    SwitchParams(rules=MAX_RULES)
    with pytest.raises(ParamError, match=rf"rules={MAX_RULES + 1}: must be between 1 and {MAX_RULES}"):
        SwitchParams(rules=MAX_RULES + 1)
    # the largest build's per-rule-entry registers stay inside the 1 KiB map (hand-derived: 0x304 + 8 x 31)
    regs = register_map(SwitchParams(rules=MAX_RULES))
    assert regs["AGED"].address(MAX_RULES - 1) == 0x3FC and regs.size == 0x400
