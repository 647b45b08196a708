"""The aging watcher: dead ranks, found through the switch's aged sets and through unfinished collectives.

Contract: :class:`AgingWatcher` programs AGING from ``set_age_ms``, reads the aged-set event queue
(:meth:`check_aged`, every :meth:`check_s`) and drops from a group the ranks missing from every set of
the group that aged by the next check after the first (a live rank whose frame was lost misses from one
set, a dead one from all); :meth:`finish_age` drops the ranks that never finish a collective their peers
finished more than the set age ago. Dropping goes through the registry; the watcher keeps the events.
"""

from __future__ import annotations

from ..config import Config
from ..registers import aging_period
from .registry import GroupRegistry
from .switch import SwitchAccess

__all__ = ["AgingWatcher", "AGING_CHECKS"]

AGING_CHECKS = 16           # aging registers read this many times per set age (the detection bound's check period)


class AgingWatcher:
    """Members
    -------
    aged : list[dict]
        The last 1024 aged-set events read (time, slot, set, rule, ports, group, missing).
    age_unit : int
        Cycles per AGING.age unit (a constant of the register map).
    drop_dead : bool
        Drop the ranks the events show dead (False: only report them).
    """

    def __init__(self, switch: SwitchAccess, config: Config, registry: GroupRegistry, rank_ports: list[int],
                 *, drop_dead: bool = True):
        self.switch, self.config, self.registry, self.rank_ports = switch, config, registry, rank_ports
        self.drop_dead = drop_dead
        self.age_unit = switch.regs["AGE_UNIT"].reset
        self.aged: list[dict] = []
        self.total = 0                   # AGED_TOTAL when the aged-set queue was last drained
        self.checks = 0                  # aging checks done (the suspects' settle is one check)
        self.suspects: dict[int, tuple[int, set]] = {}   # group -> (check of its first aged event, ranks missing from all)
        self.next_check = 0.0

    # ------------------------------------------------------------ timing
    def check_s(self) -> float:
        """How often the aging registers are read: AGING_CHECKS times per set age, and at least as often
        as the reset check (``timeout_ms``) would allow."""
        return max(self.config.timeout_s, self.config.set_age_s / AGING_CHECKS)

    def scan_s(self) -> float:
        """How much later than the age the switch may age a set: its scanner's period (AGING's bound)."""
        return aging_period(self.switch.params) / self.switch.clock_hz

    def detection_bound_s(self) -> float:
        """The longest time from a set's last accepted contribution to the controller dropping the ranks
        missing from it: the age, the switch's scan (AGING's documented bound), the check that reads the
        event, and one more check over which the group's events are gathered."""
        return self.config.set_age_s + self.scan_s() + 2 * self.check_s()

    def age_units(self) -> int:
        """``set_age_ms`` in units of the switch's AGE_UNIT cycles at its clock (rounded up; 0: off)."""
        if not self.config.set_age_ms:
            return 0
        field = self.switch.regs["AGING"].field("age")
        clock = self.switch.clock_hz
        units = -(-round(self.config.set_age_s * clock) // self.age_unit)
        limit = (1 << field.width) - 1
        if units > limit:
            most = limit * self.age_unit / clock * 1000
            raise ValueError(f"set_age_ms={self.config.set_age_ms:g}: at most {most:.1f} ms for this switch "
                             f"(AGING.age is {field.width} bits of {self.age_unit} cycles at {clock / 1e6:g} MHz)")
        return units

    async def program(self) -> None:
        """AGING from the configuration: the age, and free (an aged set is emptied, so the dead rank's
        sets do not stay taken)."""
        units = self.age_units()
        await self.switch.write("AGING", self.switch.regs["AGING"].pack(age=units, free=int(units > 0)))

    def reset(self) -> None:
        """The switch was reset: its AGED_TOTAL starts again from 0."""
        self.total = 0

    # ------------------------------------------------------------ the checks
    async def service(self, now: float) -> None:
        """The aged-set check when due, then the finish age."""
        if self.config.set_age_ms and now >= self.next_check:
            await self.check_aged(now)
            self.next_check = now + self.check_s()
        self.finish_age(now)

    async def check_aged(self, now: float) -> None:
        """Read the aged-set events (AGED_TOTAL, then the queue: AGED_EVENT, AGED_PORTS, AGED_POP) and drop
        the ranks missing from a group's aged sets (module docstring)."""
        sw, regs = self.switch, self.switch.regs
        total = await sw.read("AGED_TOTAL")
        if total != self.total:
            self.total = total
            while True:
                e = regs["AGED_EVENT"].unpack(await sw.read("AGED_EVENT"))
                if not e["valid"]:
                    break
                bitmap = regs["AGED_PORTS"].unpack(await sw.read("AGED_PORTS"))["ports"]
                await sw.write("AGED_POP", 0)
                self._event(now, e["slot"], e["set"], e["rule"], bitmap)
        self.checks += 1
        groups = self.registry.groups
        for group_id, (first, missing) in list(self.suspects.items()):
            if first < self.checks - 1 or group_id not in groups:     # gathered over one more check
                del self.suspects[group_id]
                if group_id in groups and missing and self.drop_dead:
                    self.registry.drop_ranks(group_id, missing, now, f"missing from its aged sets (set_age_ms="
                                             f"{self.config.set_age_ms:g})", redo=True, rank_ports=self.rank_ports)

    def _event(self, now: float, slot: int, s: int, rule: int, bitmap: int) -> None:
        info = next((g for g in self.registry.groups.values() if g.rule_index == rule), None)
        record = {"time_s": now, "slot": slot, "set": s, "rule": rule, "ports": bitmap,
                  "group": None if info is None else info.group_id, "missing": []}
        self.aged.append(record)
        del self.aged[:-1024]
        if info is None:
            return                      # an operator rule's set: reported in the statistics only
        missing = {r for r, p in zip(info.ranks, info.ports) if not bitmap >> p & 1}
        record["missing"] = sorted(missing)
        self.registry.events.append((now, f"group {info.group_id}: set {slot}.{s} aged with ports {bitmap:#x}, "
                                          f"missing rank(s) {sorted(missing)}"))
        first, before = self.suspects.get(info.group_id, (self.checks, missing))
        self.suspects[info.group_id] = (first, before & missing)

    def finish_age(self, now: float) -> None:
        """Ranks that never finish a collective the others finished longer than the set age ago: dead after
        their last contribution (no set waits for them, so none ages)."""
        if not self.config.set_age_ms or not self.drop_dead:
            return
        for group_id, op_seq, op in self.registry.running():
            if op.since is None or now - op.since <= self.config.set_age_s:
                continue
            info = self.registry.groups[group_id]
            late = [r for r in info.ranks if r not in op.finished]
            self.registry.drop_ranks(group_id, late, now, f"did not finish collective {op_seq} within set_age_ms="
                                     f"{self.config.set_age_ms:g} of its peers", redo=False, rank_ports=self.rank_ports)

    def next_timer(self, held) -> float | None:
        """When dead-rank work is next due while a collective waits (None: nothing waits): the next aging
        check (an offloaded collective whose group `held(group)` does not hold), or a finish-age deadline."""
        if not self.config.set_age_ms or not self.drop_dead:
            return None
        earliest = None          # (the world asks once per step: comparisons, no list and min)
        for group_id, _, op in self.registry.running():
            if op.decision.offload and not held(group_id):
                if earliest is None or self.next_check < earliest:
                    earliest = self.next_check    # its sets may age
            if op.since is not None:
                due = op.since + self.config.set_age_s + 1e-9
                if earliest is None or due < earliest:
                    earliest = due
        return earliest
