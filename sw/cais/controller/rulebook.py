"""The rule book: which rule entries and slots belong to whom, under the quotas and the SRAM usage limit.

Contract: :class:`RuleBook` is the only part that writes rule entries and empties quotas. It hands out a
free rule index and an aligned range of slots (``slots_per_group``, halved until a range fits, never
beyond ``sram_usage_limit`` of the slot memory), serves operator rules beside the groups' (refusing one
that would overlap a group's rule, quota or frames, :class:`RuleConflict`) and lists every valid entry.
The groups themselves live in the registry (:mod:`.registry`); the rule book reads them.
"""

from __future__ import annotations

from ..config import Config
from ..tables import Rule, rule_writes, slot_clear_writes
from .registry import GroupInfo
from .switch import SwitchAccess

__all__ = ["RuleBook", "RuleConflict", "group_rule", "matches_group"]


class RuleConflict(ValueError):
    """An operator rule collides with a group's or another rule's index, slots or frames."""


def matches_group(rule: Rule, group_id: int) -> bool:
    value, mask = rule.group
    return (group_id & mask) == (value & mask)


def group_rule(info: GroupInfo) -> Rule:
    """The rule a group's entry holds: every frame of the group, its ports, its quota, its kind."""
    mask = sum(1 << p for p in info.ports)
    return Rule.for_group(info.group_id, contributors=mask, results=mask, base=info.base,
                          count_log2=info.count_log2, **info.kind.rule_fields())


class RuleBook:
    """Members
    -------
    operator_rules : dict[int, Rule]
        Rule index -> rule an operator added.
    groups : dict[int, GroupInfo]
        The registry's groups (read only here).
    """

    def __init__(self, switch: SwitchAccess, config: Config, groups: dict[int, GroupInfo]):
        self.switch, self.config, self.groups = switch, config, groups
        self.params = switch.params
        self.operator_rules: dict[int, Rule] = {}

    # ------------------------------------------------------------ allocation
    def free_rule_index(self) -> int | None:
        used = {g.rule_index for g in self.groups.values()} | set(self.operator_rules)
        return next((i for i in range(self.params.rules) if i not in used), None)

    def free_group_id(self, used: set[int]) -> int | None:
        """The first group id in 1..255 neither a group nor an operator rule's match takes."""
        return next((g for g in range(1, 256) if g not in used
                     and not any(matches_group(r, g) for r in self.operator_rules.values())), None)

    def slot_ranges(self) -> list[tuple[int, int]]:
        """[lo, hi) of every quota in use: the groups' and the operator rules'."""
        return ([(g.base, g.base + g.slot_count) for g in self.groups.values() if g.base is not None]
                + [(r.base, r.base + r.slot_count) for r in self.operator_rules.values()])

    @property
    def slots_allocated(self) -> int:
        """Slots in the quotas of the groups and the operator rules."""
        return sum(hi - lo for lo, hi in self.slot_ranges())

    def allocate(self, count: int) -> int | None:
        """First aligned free range of `count` slots within the memory limit."""
        limit = int(self.params.slots * self.config.sram_usage_limit)
        used = sorted(self.slot_ranges())
        for base in range(0, limit - count + 1, count):
            if all(base + count <= lo or base >= hi for lo, hi in used):
                return base
        return None

    def quota(self) -> tuple[int | None, int]:
        """(base, count) of the largest quota up to ``slots_per_group`` that fits (base None: none)."""
        count = min(self.config.slots_per_group, self.params.slots)
        while count >= 1:
            base = self.allocate(count)
            if base is not None:
                return base, count
            count //= 2
        return None, 0

    def taken(self, rule_index: int, base: int, count: int) -> bool:
        """Whether a rule index or a slot range is in use (a group re-registering after a restart)."""
        return any(g.rule_index == rule_index for g in self.groups.values()) or any(
            base < hi and lo < base + count for lo, hi in self.slot_ranges())

    # ------------------------------------------------------------ a group's entry
    async def program_group(self, info: GroupInfo, *, empty: bool = True) -> None:
        """Write the group's rule (its quota emptied first with `empty`)."""
        if empty:
            await self.empty(info)
        await self.switch.apply(rule_writes(self.switch.regs, info.rule_index, group_rule(info)))

    async def empty(self, info: GroupInfo) -> None:
        await self.switch.apply(slot_clear_writes(self.switch.regs, info.base, info.slot_count))

    async def release_group(self, info: GroupInfo) -> None:
        """Invalidate the group's entry and empty its quota (the group is gone)."""
        if info.rule_index is not None:
            await self.switch.apply(rule_writes(self.switch.regs, info.rule_index, None, valid=False))
        if info.base is not None:
            await self.empty(info)

    # ------------------------------------------------------------ operator rules
    def _index(self, index) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.params.rules:
            raise ValueError(f"rule index {index!r}: not in 0..{self.params.rules - 1}")
        return index

    def _owner(self, index: int) -> GroupInfo | None:
        return next((g for g in self.groups.values() if g.rule_index == index), None)

    def check_rule(self, index: int, rule: Rule) -> None:
        """Why an operator rule at `index` cannot be added (ValueError), or nothing."""
        self._index(index)
        rule_writes(self.switch.regs, index, rule)          # the register fields' own checks (ports, widths)
        owner = self._owner(index)
        if owner is not None:
            raise RuleConflict(f"rule {index} belongs to group {owner.group_id}")
        if index in self.operator_rules:
            raise RuleConflict(f"rule {index} exists: del-rule {index} first")
        if rule.count_log2 > 16 or rule.base + rule.slot_count > self.params.slots:
            raise ValueError(f"slots {rule.base}+2**{rule.count_log2}: beyond the switch's {self.params.slots} slots")
        lo, hi = rule.base, rule.base + rule.slot_count
        for g in self.groups.values():
            if g.base is not None and lo < g.base + g.slot_count and g.base < hi:
                raise RuleConflict(f"slots {lo}..{hi - 1} overlap group {g.group_id}'s quota {g.base}..{g.base + g.slot_count - 1}")
            if matches_group(rule, g.group_id):
                raise RuleConflict(f"group match {rule.group[0]}/{rule.group[1]:#x} would take group {g.group_id}'s frames")
        for i, r in self.operator_rules.items():
            if lo < r.base + r.slot_count and r.base < hi:
                raise RuleConflict(f"slots {lo}..{hi - 1} overlap rule {i}'s {r.base}..{r.base + r.slot_count - 1}")

    async def add_rule(self, index: int, rule: Rule) -> None:
        """Program an operator rule (its quota emptied first); refused (ValueError, nothing written) when
        :meth:`check_rule` says so."""
        self.check_rule(index, rule)
        await self.switch.apply(slot_clear_writes(self.switch.regs, rule.base, rule.slot_count))
        await self.switch.apply(rule_writes(self.switch.regs, index, rule))
        self.operator_rules[index] = rule

    async def del_rule(self, index: int) -> Rule:
        """Invalidate an operator rule (a group's rule goes with its group only)."""
        self._index(index)
        owner = self._owner(index)
        if owner is not None:
            raise RuleConflict(f"rule {index} belongs to group {owner.group_id}: it goes with the group")
        if index not in self.operator_rules:
            raise KeyError(f"rule {index}: no such rule")
        rule = self.operator_rules[index]
        await self.switch.apply(rule_writes(self.switch.regs, index, None, valid=False))
        await self.switch.apply(slot_clear_writes(self.switch.regs, rule.base, rule.slot_count))
        return self.operator_rules.pop(index)

    def dump_rules(self) -> list[tuple[int, str, Rule]]:
        """(index, owner, rule) of every valid entry the controller programmed, by index."""
        out = [(g.rule_index, f"group {g.group_id}", group_rule(g)) for g in self.groups.values()
               if g.rule_index is not None]
        out += [(i, "operator", r) for i, r in self.operator_rules.items()]
        return sorted(out, key=lambda t: t[0])

    async def reprogram(self) -> None:
        """After a switch reset: every group's quota emptied and its rule written, every operator rule."""
        for _, info in sorted(self.groups.items()):
            if info.offloadable:
                await self.program_group(info)
        for index, rule in sorted(self.operator_rules.items()):
            await self.switch.apply(rule_writes(self.switch.regs, index, rule))
