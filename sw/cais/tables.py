"""Rule-table and MAC-table entries, and the register writes that program them.

The functions here are pure: they turn an entry into a list of ``(address, value)`` register writes built
from the register map's fields (never hard-coded offsets). Any backend applies them with its own bus::

    for addr, value in rule_writes(regmap, 0, Rule.for_group(7, 0b1111, 0b1111, base=0, count_log2=3)):
        bus.write(addr, value)            # or: await bus.write(addr, value)
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import DType, ReduceOp
from .registers import RegisterMap

__all__ = ["Rule", "MacEntry", "rule_writes", "mac_writes", "slot_clear_writes"]


def _check_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name}={value!r}: must be an integer")
    if value < 0:
        raise ValueError(f"{owner}.{name}={value!r}: must not be negative")
    return value


def _check_match(owner: str, name: str, pair) -> tuple[int, int]:
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise ValueError(f"{owner}.{name}={pair!r}: must be a (value, mask) tuple")
    _check_int(owner, f"{name}.value", pair[0])
    _check_int(owner, f"{name}.mask", pair[1])
    return pair


@dataclass(frozen=True)
class Rule:
    """One rule-table entry.

    A rule matches a CAIS frame when, for each of group_id, layer_id and chunk_id,
    ``(field & mask) == (value & mask)``; a mask of 0 is a wildcard. ``contributors`` and ``results`` are
    port bitmaps (bit p = port p). The group's slot quota is ``2**count_log2`` slots starting at ``base``.
    All-reduce frames must carry ``dtype`` and ``red_op``; ``acc_fp32`` accumulates fp16/bf16 in fp32
    (rounded once when the result leaves), ``saturate`` clamps int16/int8 sums, ``reproducible`` folds the
    contributions in port order so the result does not depend on arrival order (docs/numerics.md);
    ``uplink`` sends a completed set's fold to the parent switch instead of multicasting it (an aggregation
    tree's leaf, docs/protocol.md section 13).
    """
    group: tuple[int, int] = (0, 0)
    layer: tuple[int, int] = (0, 0)
    chunk: tuple[int, int] = (0, 0)
    contributors: int = 0
    results: int = 0
    base: int = 0
    count_log2: int = 0
    dtype: DType = DType.INT32
    red_op: ReduceOp = ReduceOp.SUM
    acc_fp32: bool = False
    saturate: bool = False
    reproducible: bool = False
    uplink: bool = False

    def __post_init__(self):
        for name in ("group", "layer", "chunk"):
            _check_match("Rule", name, getattr(self, name))
        for name in ("contributors", "results", "base", "count_log2"):
            _check_int("Rule", name, getattr(self, name))
        for name, enum in (("dtype", DType), ("red_op", ReduceOp)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value not in set(enum):
                raise ValueError(f"Rule.{name}={value!r}: must be one of {', '.join(e.name for e in enum)}")
            object.__setattr__(self, name, enum(value))
        for name in ("acc_fp32", "saturate", "reproducible", "uplink"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Rule.{name}={getattr(self, name)!r}: must be True or False")

    @classmethod
    def for_group(cls, group_id: int, contributors: int, results: int | None = None, base: int = 0,
                  count_log2: int = 0, **kind) -> "Rule":
        """A rule that matches every frame of ``group_id`` (any layer, any chunk).

        ``results`` defaults to ``contributors`` (an all-reduce among the same ports).
        """
        _check_int("Rule", "group", group_id)
        if group_id > 0xFF:
            raise ValueError(f"Rule.group={group_id!r}: a group_id is 8 bits (0..255)")
        return cls(group=(group_id, 0xFF), contributors=contributors,
                   results=contributors if results is None else results, base=base, count_log2=count_log2,
                   **kind)

    @property
    def slot_count(self) -> int:
        return 1 << self.count_log2


@dataclass(frozen=True)
class MacEntry:
    """One MAC-table entry: ordinary frames to ``mac`` leave on ``port``."""
    mac: int
    port: int

    def __post_init__(self):
        _check_int("MacEntry", "mac", self.mac)
        _check_int("MacEntry", "port", self.port)
        if self.mac >= 1 << 48:
            raise ValueError(f"MacEntry.mac={self.mac:#x}: a MAC address is 48 bits")


def _fit(regmap: RegisterMap, reg: str, fld: str, value: int, what: str) -> int:
    width = regmap[reg].field(fld).width
    if not 0 <= value < (1 << width):
        raise ValueError(f"{what}={value:#x}: does not fit {reg}.{fld} ({width} bits)")
    return value


def _ports_mask(regmap: RegisterMap, value: int, what: str) -> int:
    ports = regmap.params.ports
    if value >> ports:
        raise ValueError(f"{what}={value:#x}: names a port >= {ports} (the switch has {ports} ports)")
    return value


def _index(count: int, index, what: str) -> int:
    _check_int(what.split(".")[0], what.split(".")[-1], index)
    if index >= count:
        raise ValueError(f"{what}={index}: out of range 0..{count - 1}")
    return index


def rule_writes(regmap: RegisterMap, index: int, rule: Rule | None = None, valid: bool = True
                ) -> list[tuple[int, int]]:
    """Register writes that store ``rule`` in rule-table entry ``index`` (valid or not).

    ``rule`` may be None with ``valid=False`` to invalidate an entry (the staging registers are then
    written with an all-zero rule).
    """
    if rule is None:
        if valid:
            raise ValueError("rule=None: only allowed with valid=False")
        rule = Rule()
    if not isinstance(rule, Rule):
        raise ValueError(f"rule={rule!r}: must be a Rule")
    _index(regmap.params.rules, index, "rule.index")
    for name, reg in (("group", "RULE_GROUP"), ("layer", "RULE_LAYER"), ("chunk", "RULE_CHUNK")):
        value, mask = getattr(rule, name)
        _fit(regmap, reg, "value", value, f"Rule.{name}.value")
        _fit(regmap, reg, "mask", mask, f"Rule.{name}.mask")
    for name in ("contributors", "results"):
        _fit(regmap, "RULE_PORTS", name, getattr(rule, name), f"Rule.{name}")
        _ports_mask(regmap, getattr(rule, name), f"Rule.{name}")
    _fit(regmap, "RULE_SLOTS", "base", rule.base, "Rule.base")
    _fit(regmap, "RULE_SLOTS", "count_log2", rule.count_log2, "Rule.count_log2")

    def w(reg, **fields):
        r = regmap[reg]
        return (r.address(), r.pack(**fields))

    return [
        w("RULE_GROUP", value=rule.group[0], mask=rule.group[1]),
        w("RULE_LAYER", value=rule.layer[0], mask=rule.layer[1]),
        w("RULE_CHUNK", value=rule.chunk[0], mask=rule.chunk[1]),
        w("RULE_PORTS", contributors=rule.contributors, results=rule.results),
        w("RULE_SLOTS", base=rule.base, count_log2=rule.count_log2),
        w("RULE_TYPE", dtype=rule.dtype, red_op=rule.red_op, acc_fp32=int(rule.acc_fp32),
          saturate=int(rule.saturate), reproducible=int(rule.reproducible), uplink=int(rule.uplink)),
        w("RULE_WRITE", index=index, valid=int(bool(valid))),
    ]


def mac_writes(regmap: RegisterMap, index: int, entry: MacEntry | None = None, valid: bool = True
               ) -> list[tuple[int, int]]:
    """Register writes that store ``entry`` in MAC-table entry ``index`` (valid or not).

    ``entry`` may be None with ``valid=False`` to invalidate an entry.
    """
    if entry is None:
        if valid:
            raise ValueError("entry=None: only allowed with valid=False")
        entry = MacEntry(0, 0)
    if not isinstance(entry, MacEntry):
        raise ValueError(f"entry={entry!r}: must be a MacEntry")
    _index(regmap.params.mac_entries, index, "mac.index")
    if entry.port >= regmap.params.ports:
        raise ValueError(f"MacEntry.port={entry.port}: out of range 0..{regmap.params.ports - 1}")
    _fit(regmap, "MAC_WRITE", "port", entry.port, "MacEntry.port")
    lo, hi = regmap["MAC_ADDR_LO"], regmap["MAC_ADDR_HI"]
    lo_w, hi_w = lo.field("mac").width, hi.field("mac").width
    cmd = regmap["MAC_WRITE"]
    return [
        (lo.address(), lo.pack(mac=entry.mac & ((1 << lo_w) - 1))),
        (hi.address(), hi.pack(mac=(entry.mac >> lo_w) & ((1 << hi_w) - 1))),
        (cmd.address(), cmd.pack(index=index, port=entry.port, valid=int(bool(valid)))),
    ]


def slot_clear_writes(regmap: RegisterMap, base: int, count: int) -> list[tuple[int, int]]:
    """Register writes that empty slots ``base .. base + count - 1`` (both shadow sets of each)."""
    _check_int("slot_clear", "base", base)
    _check_int("slot_clear", "count", count)
    slots = regmap.params.slots
    if base + count > slots:
        raise ValueError(f"slot_clear.base={base}, count={count}: slots {base}..{base + count - 1} "
                         f"exceed the switch's {slots} slots")
    reg = regmap["SLOT_CLEAR"]
    return [(reg.address(), reg.pack(slot=s)) for s in range(base, base + count)]
