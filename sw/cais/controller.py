"""The control plane: programs the switch, watches it, and decides what to offload.

One controller serves every rank. It

- programs the MAC table with every host's address (the fallback ring's frames are unicast) and, per
  group, one rule and a slot quota (``slots_per_group`` slots, never beyond ``sram_usage_limit`` of the
  slot memory; a group that gets no quota or no rule stays on the hosts);
- reads the FEATURES register at start (``float_units``: does this switch reduce fp32/fp16/bf16?
  ``reproducible``: does it serve reproducible rules?); what the switch says wins over the configured
  :class:`~cais.params.SwitchParams`;
- decides, for every collective, whether it goes through the switch (the kind must be one this switch
  reduces and whose set capacity holds at least one element; then the score below) and tells every rank
  the same answer, with the collective's first chunk sequence number and chunk payload; coordinates the
  fall back of a collective whose chunk ran out of retries, and empties the group's slots before the
  group's next collective uses them again;
- keeps each group's rule typed for the collective that uses it: a collective whose kind (element type,
  operator, acc_fp32, saturate, reproducible: :class:`~cais.allreduce.CollectiveKind`) differs from the
  rule's is held (``decide`` answers None) until :meth:`service` has rewritten the rule (``RULE_TYPE`` and
  ``RULE_WRITE``; the slots emptied first when the accumulator layout changes), so no rank sends a frame
  of the new kind to the old rule. One collective of a group is on the switch at a time, so the group's
  previous collective has finished on every rank when the retype is asked for. The retype is isolated:
  it holds only that group's decisions, and it waits until no late frame of the group's previous
  collective can still be inside the switch: the switch is idle (BUSY), or :meth:`drain_time` has passed
  since that collective finished on every rank (no rank retransmits once it has every result, and a
  frame's time in the switch is part of a round trip: :data:`DRAIN_TIMEOUTS` x the longer of the initial
  retransmission timeout and the longest recent round trip). Other groups' traffic neither is held nor
  holds it;
- keeps per-group accounting (collectives, offloaded, fallbacks, chunk completions and contributions,
  bytes reduced: exact, since each offloaded chunk that does not fall back completes once in the switch
  with one contribution per member) and the recent collective latencies (first decision to the last
  rank's ``finished``) and queueing delays (first-chunk round trip minus the smallest);
- serves operator rules beside the groups' (:meth:`add_rule`, :meth:`del_rule`, :meth:`dump_rules`),
  refusing one that would overlap a group's rule, quota or frames;
- reads the switch's counters every ``reevaluate_interval_ms`` and keeps the statistics operators expect
  (:meth:`stats`), raising the offload threshold while slot memory stays above 80% in use; the alerts
  (:class:`cais.monitor.Alert`: slot memory pressure, fallback ratio above 10%) log once when they fire
  and once when they clear.

The offload score, for a collective of D bytes over N ranks (docs/driver.md)::

    BW        link bandwidth, bytes/s (data_width / 8 x clock)
    a         one-way latency through the switch, s (min round trip / 2, measured; a default before)
    Q         queueing delay in the switch, s: the average round trip of the first chunk of the recent
              collectives minus the smallest (what a collective meets when it starts)
    T_hosts   = 2 (N - 1) (a + D / (N BW))          the ring: 2(N-1) steps of D/N bytes
    T_switch  = 2 a + D / BW + Q                     one round trip carrying D bytes
    score     = (1 - T_switch / T_hosts) x (1 - 1/N) time saved, weighted by the traffic saved
    offload when score > threshold (offload_threshold, raised under memory pressure)

All methods that touch the switch are coroutines awaiting only the link's ``read``/``write``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .allreduce import CollectiveKind, chunk_count, chunk_payload
from .config import Config
from .link import SwitchLink
from .monitor import Alert, Samples
from .protocol import DropReason, supported_dtypes
from .registers import RegisterMap, aging_period, read_counters, register_map
from .tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

__all__ = ["Controller", "GroupInfo", "Decision", "CollectiveKind", "offload_score", "RuleConflict"]

log = logging.getLogger("cais.controller")

MEMORY_PRESSURE = 0.80      # sets in use above this fraction raise the threshold
FALLBACK_WARNING = 0.10     # warn above this fallback ratio
THRESHOLD_STEP = 0.05
THRESHOLD_CAP = 0.95
AGING_CHECKS = 16           # aging registers read this many times per set age (the detection bound's check period)
DRAIN_TIMEOUTS = 2          # a retype goes on this many round trips (or initial timeouts) after the group's last frame


@dataclass
class GroupInfo:
    group_id: int
    ranks: tuple[int, ...]
    ports: tuple[int, ...]
    base: int | None = None          # first slot of the quota; None: no quota (host ring only)
    count_log2: int = 0
    rule_index: int | None = None
    why_not: str = ""                # why the group has no quota
    kind: CollectiveKind = CollectiveKind()   # what the group's rule is programmed for now
    next_seq: int = 0                # seq_num of the next offloaded chunk (offloaded collectives only)
    first_op: int = 0                # op_seq of the first collective this controller saw (restart: > 0)
    collectives: int = 0             # accounting (module docstring): collectives finished on every rank
    offloaded: int = 0               # of which went through the switch
    fell_back: int = 0               # of which fell back to the host ring
    completions: int = 0             # chunks the switch completed for the group (offloaded, not fallen back)
    contributions: int = 0           # contributions the switch accepted for them (chunks x members)
    bytes_reduced: int = 0           # bytes of those collectives (the wire format)
    dropped: dict = field(default_factory=dict)   # rank -> why the controller dropped it (dead: aging)
    rule_stale: bool = False         # ranks were dropped: the rule's contributors change at the next cleanup

    @property
    def slot_count(self) -> int:
        return 1 << self.count_log2

    @property
    def offloadable(self) -> bool:
        return self.base is not None and self.rule_index is not None


@dataclass
class Decision:
    offload: bool
    score: float
    threshold: float
    reason: str
    seq_base: int = 0          # offloaded: seq_num of the collective's first chunk
    chunk_bytes: int = 0       # offloaded: payload of a full chunk (chunk_size cut to the set capacity)
    kind: CollectiveKind = CollectiveKind()


@dataclass
class _Op:
    decision: Decision
    nbytes: int
    started: float = 0.0
    fell_back: bool = False
    finished: set = field(default_factory=set)
    epoch: int = 0                   # times ranks were dropped while it ran: the survivors redo it (comm.World)
    since: float | None = None       # when its wait for the last finishers began (first finish, fall back, redo)
    members: int = 0                 # ranks of the group when it was decided (each contributes to every chunk)
    accounted: bool = False


class RuleConflict(ValueError):
    """An operator rule collides with a group's or another rule's index, slots or frames."""


def _matches_group(rule: Rule, group_id: int) -> bool:
    value, mask = rule.group
    return (group_id & mask) == (value & mask)


def offload_score(nbytes: int, ranks: int, bandwidth: float, latency: float, queue_delay: float) -> float:
    """The score of the module docstring (dimensionless; higher favours the switch)."""
    if ranks < 2:
        return 0.0
    t_hosts = 2 * (ranks - 1) * (latency + nbytes / (ranks * bandwidth))
    t_switch = 2 * latency + nbytes / bandwidth + queue_delay
    return (1 - t_switch / t_hosts) * (1 - 1 / ranks)


class Controller:
    def __init__(self, link: SwitchLink, config: Config, rank_ports: list[int], rank_macs: list[int], *,
                 drop_dead: bool = True):
        self.link = link
        self.drop_dead = drop_dead    # drop the ranks aged sets or unfinished collectives show dead
        self.config = config
        self.params = link.params
        self.regs: RegisterMap = register_map(self.params)
        self.rank_ports = list(rank_ports)
        self.rank_macs = list(rank_macs)
        self.groups: dict[int, GroupInfo] = {}
        self.threshold = config.offload_threshold
        self.decisions: list[tuple[float, int, int, Decision]] = []   # (time, group, op_seq, decision)
        self.events: list[tuple[float, str]] = []                      # warnings and threshold changes
        self._ops: dict[tuple[int, int], _Op] = {}
        self._cleanups: list[int] = []           # groups whose slots must be emptied
        self._blocked: set[int] = set()          # groups waiting for a cleanup
        self._next_eval = 0.0
        self._last = None                        # (time, counters) of the last evaluation
        self._stats = {}
        self._counters: dict = {}                # the switch's counters read by the last evaluation
        self._rtts: list[float] = []
        self._switch_bytes = 0
        self._retypes: dict[int, CollectiveKind] = {}   # group -> kind its rule must get before it goes on
        self.retypes = 0                                 # rule rewrites done (statistics, tests)
        self.float_units = bool(self.params.float_units)  # read from FEATURES by start()
        self.reproducible = True                          # read from FEATURES by start()
        self.latency = Samples()       # collective latency, s: first decision to the last rank's finished
        self.queue_delay = Samples()   # first-chunk round trip minus the smallest, s
        self.alerts = {"sram_pressure": Alert("sram_pressure", MEMORY_PRESSURE, "slot sets in use"),
                       "fallback_ratio": Alert("fallback_ratio", FALLBACK_WARNING, "fallback ratio")}
        self.operator_rules: dict[int, Rule] = {}       # rule index -> rule added by an operator
        self._reduced_bytes = 0
        self._now = 0.0                                  # the latest time a caller gave
        self._quiet_since: dict[int, float] = {}         # group -> when its last collective finished
        self.resets = 0                                   # switch resets noticed (EPOCH read 0) and repaired
        self._next_epoch_check = 0.0
        self._latest: dict[int, int] = {}                # group -> op_seq of its latest decided collective
        self._next_aging_check = 0.0
        self._aged_total = 0                             # AGED_TOTAL when the aged-set queue was last drained
        self._checks = 0                                 # aging checks done (the suspects' settle is one check)
        self.age_unit = self.regs["AGE_UNIT"].reset      # cycles per AGING.age unit (a constant of the map)
        self._suspects: dict[int, tuple[int, set]] = {}  # group -> (check of its first aged event, ranks missing from all)
        self.aged: list[dict] = []                       # every aged-set event read (time, slot, set, rule, ...)
        self.dropped: list[tuple[float, int, int, str]] = []   # (time, group, rank, why) of every dropped rank

    @property
    def dtypes(self):
        """The element types this switch reduces (FEATURES.float_units)."""
        return supported_dtypes(self.float_units)

    @property
    def pending(self) -> bool:
        """Register work is waiting (a rule to retype, slots to empty): decisions may be held."""
        return bool(self._retypes or self._cleanups)

    def pending_work(self) -> list[str]:
        """The register work that is waiting, one line each (for hang reports)."""
        return ([f"group {g}: rule waits for the group's frames to drain to be retyped to {k}"
                 for g, k in sorted(self._retypes.items())]
                + [f"group {g}: slots wait to be emptied" for g in self._cleanups])

    # ---------------------------------------------------------------- set-up
    async def _apply(self, writes):
        for addr, value in writes:
            await self.link.write(addr, value)

    async def start(self) -> None:
        """Check the switch and program every host's MAC address."""
        ident = await self.link.read(self.regs["ID"].address())
        if ident != self.regs["ID"].reset:
            raise RuntimeError(f"no CAIS switch on the link: ID register reads {ident:#x}")
        features = self.regs["FEATURES"]
        fields = features.unpack(await self.link.read(features.address()))
        self.float_units, self.reproducible = bool(fields["float_units"]), bool(fields["reproducible"])
        for rank, (port, mac) in enumerate(zip(self.rank_ports, self.rank_macs)):
            if rank >= self.params.mac_entries:
                break   # further hosts are flooded (unknown unicast)
            await self._apply(mac_writes(self.regs, rank, MacEntry(mac, port)))
        await self._program_aging()
        await self.link.write(self.regs["EPOCH"].address(), 1)
        self._next_eval = self.config.reevaluate_interval_ms / 1000.0

    def _allocate(self, count: int) -> int | None:
        """First aligned free range of `count` slots within the memory limit."""
        limit = int(self.params.slots * self.config.sram_usage_limit)
        used = sorted(self._slot_ranges())
        for base in range(0, limit - count + 1, count):
            if all(base + count <= lo or base >= hi for lo, hi in used):
                return base
        return None

    async def create_group(self, ranks: list[int]) -> GroupInfo:
        """Give a group an id, a rule and a slot quota (or a reason why it stays on the hosts)."""
        ranks = tuple(ranks)
        if len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(f"group ranks {list(ranks)}: must be distinct and not empty")
        for r in ranks:
            if not 0 <= r < len(self.rank_ports):
                raise ValueError(f"group ranks {list(ranks)}: rank {r} does not exist")
        used_ids = set(self.groups)
        group_id = next((g for g in range(1, 256) if g not in used_ids
                         and not any(_matches_group(r, g) for r in self.operator_rules.values())), None)
        if group_id is None:
            raise RuntimeError("no free group id (255 groups exist)")
        ports = tuple(self.rank_ports[r] for r in ranks)
        info = GroupInfo(group_id, ranks, ports)
        used_rules = {g.rule_index for g in self.groups.values()} | set(self.operator_rules)
        rule_index = next((i for i in range(self.params.rules) if i not in used_rules), None)
        count = min(self.config.slots_per_group, self.params.slots)
        base = None
        while count >= 1 and base is None:
            base = self._allocate(count)
            if base is None:
                count //= 2
        if rule_index is None:
            info.why_not = "rule table full"
        elif base is None:
            info.why_not = f"slot memory above sram_usage_limit={self.config.sram_usage_limit}"
        else:
            info.base, info.count_log2, info.rule_index = base, count.bit_length() - 1, rule_index
            await self._apply(slot_clear_writes(self.regs, base, count))
            await self._apply(rule_writes(self.regs, rule_index, self.group_rule(info)))
        self.groups[group_id] = info
        log.info("group %d: ranks %s, %s", group_id, list(ranks),
                 f"slots {base}..{base + count - 1}" if info.offloadable else f"host only ({info.why_not})")
        return info

    @property
    def slots_allocated(self) -> int:
        """Slots in the quotas of the groups and the operator rules."""
        return sum(hi - lo for lo, hi in self._slot_ranges())

    def _slot_ranges(self) -> list[tuple[int, int]]:
        """[lo, hi) of every quota in use: the groups' and the operator rules'."""
        return ([(g.base, g.base + g.slot_count) for g in self.groups.values() if g.base is not None]
                + [(r.base, r.base + r.slot_count) for r in self.operator_rules.values()])

    @staticmethod
    def group_rule(info: GroupInfo) -> Rule:
        """The rule a group's entry holds: every frame of the group, its ports, its quota, its kind."""
        mask = sum(1 << p for p in info.ports)
        return Rule.for_group(info.group_id, contributors=mask, results=mask, base=info.base,
                              count_log2=info.count_log2, **info.kind.rule_fields())

    async def adopt_group(self, group_id: int, ranks: list[int], base: int | None, count_log2: int,
                          rule_index: int | None, next_seq: int, next_op: int) -> GroupInfo:
        """Take over a group the ranks re-register after a controller restart (docs/controller.md): the
        same id, ranks, quota and rule entry; its rule rewritten for int32 SUM (the rule table is write
        only: the kind is not readable, so the next collective of another kind retypes it), its slots
        emptied (no collective of it runs while its ranks re-register), sequence numbers going on from
        `next_seq` (no late frame's seq_num can meet a new chunk's) and collectives from `next_op`."""
        ranks = tuple(int(r) for r in ranks)
        if group_id in self.groups:
            old = self.groups[group_id]
            if (old.ranks, old.base, old.count_log2, old.rule_index) != (ranks, base, count_log2, rule_index):
                raise ValueError(f"group {group_id}: re-registered as ranks {list(ranks)} slots {base} "
                                 f"rule {rule_index}, but another rank registered it differently")
            old.next_seq, old.first_op = max(old.next_seq, next_seq), max(old.first_op, next_op)
            return old
        if not 1 <= group_id <= 255:
            raise ValueError(f"group {group_id}: not in 1..255")
        for r in ranks:
            if not 0 <= r < len(self.rank_ports):
                raise ValueError(f"group {group_id}: rank {r} does not exist")
        info = GroupInfo(group_id, ranks, tuple(self.rank_ports[r] for r in ranks), next_seq=int(next_seq),
                         first_op=int(next_op))
        if base is not None and rule_index is not None:
            count = 1 << count_log2
            if not (0 <= base and base + count <= self.params.slots and 0 <= rule_index < self.params.rules):
                raise ValueError(f"group {group_id}: slots {base}+{count} or rule {rule_index} outside the switch")
            if any(g.rule_index == rule_index for g in self.groups.values()) or any(
                    base < hi and lo < base + count for lo, hi in self._slot_ranges()):
                raise ValueError(f"group {group_id}: its rule {rule_index} or slots {base}+{count} are taken")
            info.base, info.count_log2, info.rule_index = base, count_log2, rule_index
            await self._apply(slot_clear_writes(self.regs, base, count))
            await self._apply(rule_writes(self.regs, rule_index, self.group_rule(info)))
        else:
            info.why_not = "host only before the restart"
        self.groups[group_id] = info
        log.info("group %d: adopted after a restart (ranks %s)", group_id, list(ranks))
        return info

    # ---------------------------------------------------------------- operator rules
    def check_rule(self, index: int, rule: Rule) -> None:
        """Why an operator rule at `index` cannot be added (ValueError), or nothing."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.params.rules:
            raise ValueError(f"rule index {index!r}: not in 0..{self.params.rules - 1}")
        rule_writes(self.regs, index, rule)          # the register fields' own checks (ports, widths)
        owner = next((g for g in self.groups.values() if g.rule_index == index), None)
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
            if _matches_group(rule, g.group_id):
                raise RuleConflict(f"group match {rule.group[0]}/{rule.group[1]:#x} would take group {g.group_id}'s frames")
        for i, r in self.operator_rules.items():
            if lo < r.base + r.slot_count and r.base < hi:
                raise RuleConflict(f"slots {lo}..{hi - 1} overlap rule {i}'s {r.base}..{r.base + r.slot_count - 1}")

    async def add_rule(self, index: int, rule: Rule) -> None:
        """Program an operator rule (its quota emptied first); refused (ValueError, nothing written) when
        :meth:`check_rule` says so."""
        self.check_rule(index, rule)
        await self._apply(slot_clear_writes(self.regs, rule.base, rule.slot_count))
        await self._apply(rule_writes(self.regs, index, rule))
        self.operator_rules[index] = rule

    async def del_rule(self, index: int) -> Rule:
        """Invalidate an operator rule (a group's rule goes with its group only)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.params.rules:
            raise ValueError(f"rule index {index!r}: not in 0..{self.params.rules - 1}")
        owner = next((g for g in self.groups.values() if g.rule_index == index), None)
        if owner is not None:
            raise RuleConflict(f"rule {index} belongs to group {owner.group_id}: it goes with the group")
        if index not in self.operator_rules:
            raise KeyError(f"rule {index}: no such rule")
        rule = self.operator_rules[index]
        await self._apply(rule_writes(self.regs, index, None, valid=False))
        await self._apply(slot_clear_writes(self.regs, rule.base, rule.slot_count))
        return self.operator_rules.pop(index)

    def dump_rules(self) -> list[tuple[int, str, Rule]]:
        """(index, owner, rule) of every valid entry the controller programmed, by index."""
        out = [(g.rule_index, f"group {g.group_id}", self.group_rule(g)) for g in self.groups.values()
               if g.rule_index is not None]
        out += [(i, "operator", r) for i, r in self.operator_rules.items()]
        return sorted(out, key=lambda t: t[0])

    async def remove_group(self, group_id: int) -> None:
        """Free a group (its job ended): its rule entry invalidated, its slots emptied and given back, its
        collectives' state forgotten (its accounting stays in the controller's totals)."""
        info = self.groups.pop(group_id)
        self._retypes.pop(group_id, None)
        self._blocked.discard(group_id)
        self._cleanups = [g for g in self._cleanups if g != group_id]
        for key in [k for k in self._ops if k[0] == group_id]:
            del self._ops[key]
        for table in (self._quiet_since, self._latest, self._suspects):
            table.pop(group_id, None)
        if info.rule_index is not None:
            await self._apply(rule_writes(self.regs, info.rule_index, None, valid=False))
        if info.base is not None:
            await self._apply(slot_clear_writes(self.regs, info.base, info.slot_count))

    # ---------------------------------------------------------------- per collective
    def _bandwidth(self) -> float:
        return self.params.data_width / 8 * self.link.clock_hz

    def _latency(self) -> float:
        if self._rtts:
            return min(self._rtts) / 2
        # before any measurement: a frame of max payload in and out, plus the pipeline
        beats = -(-(self.params.max_payload + 30) // self.params.beat_bytes)
        return (2 * beats + 10) / self.link.clock_hz

    def _queue_delay(self) -> float:
        if not self._rtts:
            return 0.0
        return sum(self._rtts) / len(self._rtts) - min(self._rtts)

    def capacity(self, kind: CollectiveKind) -> int:
        """Payload bytes a set of a rule of this kind holds: ``max_payload`` for every kind (each port's
        contribution has a bank of its own, docs/core-design.md), but 0 for a reproducible kind when
        FEATURES.reproducible is 0, whatever the configured parameters say."""
        if kind.reproducible and not self.reproducible:
            return 0
        return self.params.max_payload

    def why_not_offloadable(self, kind: CollectiveKind) -> str:
        """Why this switch cannot reduce collectives of `kind` ("" if it can)."""
        if kind.dtype not in self.dtypes:
            return (f"{kind.dtype.name.lower()}: this switch has no float units (FEATURES.float_units = 0)"
                    if kind.is_float else f"{kind.dtype.name.lower()}: not reduced by this switch")
        if chunk_payload(self.config.chunk_size, self.capacity(kind), kind.itemsize) < kind.itemsize:
            no_fold = kind.reproducible and not self.reproducible
            return (f"{kind}: a set of this switch holds {self.capacity(kind)} bytes of payload, less than "
                    f"one element" + (" (FEATURES.reproducible = 0)" if no_fold else ""))
        return ""

    def decide(self, group_id: int, op_seq: int, nbytes: int, now: float,
               kind: CollectiveKind | None = None) -> Decision | None:
        """Where collective `op_seq` of a group runs; the same answer for every rank. None: ask again
        later (the group's slots are being emptied after a fall back, or its rule is being retyped for
        this collective's `kind`, default int32 SUM). `nbytes` is the collective's size on the wire."""
        kind = kind or CollectiveKind()
        key = (group_id, op_seq)
        if key in self._ops:
            return None if group_id in self._retypes else self._ops[key].decision
        # One collective of a group at a time on the switch: the next waits until every rank finished the
        # previous one (and its slots are emptied if it fell back). A waiting retype holds only its group.
        self._now = max(self._now, now)
        if group_id not in self.groups:
            raise ValueError(f"group {group_id}: no such group")
        info = self.groups[group_id]
        if (group_id in self._retypes or group_id in self._blocked
                or (op_seq > info.first_op and not self.all_finished(group_id, op_seq - 1))):
            return None
        unsupported = self.why_not_offloadable(kind)
        if not info.offloadable:
            decision = Decision(False, 0.0, self.threshold, f"host only: {info.why_not}", kind=kind)
        elif unsupported:
            decision = Decision(False, 0.0, self.threshold, f"host only: {unsupported}", kind=kind)
        else:
            score = offload_score(nbytes, len(info.ranks), self._bandwidth(), self._latency(), self._queue_delay())
            if self.config.offload == "auto":
                offload = score > self.threshold
                why = f"score {score:.3f} {'>' if offload else '<='} threshold {self.threshold:.3f}"
            else:
                offload = self.config.offload == "always"
                why = f"offload={self.config.offload} (score {score:.3f})"
            decision = Decision(offload, score, self.threshold, why, kind=kind)
            if offload:
                # Sequence numbers advance over offloaded collectives only, so the slots see no holes.
                decision.chunk_bytes = chunk_payload(self.config.chunk_size, self.capacity(kind), kind.itemsize)
                decision.seq_base = info.next_seq
                info.next_seq += chunk_count(nbytes // kind.itemsize, kind.itemsize, decision.chunk_bytes)
        self._ops[key] = _Op(decision, nbytes, started=now, members=len(info.ranks))
        self._latest[group_id] = op_seq
        self.decisions.append((now, group_id, op_seq, decision))
        if decision.offload and kind != info.kind:
            self._retypes[group_id] = kind      # service() rewrites the rule; then the decision is given
            return None
        return decision

    def fell_back(self, group_id: int, op_seq: int) -> bool:
        op = self._ops.get((group_id, op_seq))
        return bool(op and op.fell_back)

    def request_fallback(self, group_id: int, op_seq: int, rank: int, now: float, why: str) -> None:
        """A rank gave up on the switch for this collective: every rank moves it to the host ring."""
        self._now = max(self._now, now)
        op = self._op(group_id, op_seq)
        if not op.fell_back:
            op.fell_back = True
            op.since = now if op.since is not None else None   # the ring restarts the finishers' wait
            self.events.append((now, f"group {group_id} collective {op_seq}: falls back to the host ring "
                                     f"(rank {rank}: {why})"))
            log.warning("group %d collective %d falls back to the host ring: rank %d %s", group_id, op_seq,
                        rank, why)

    def _op(self, group_id: int, op_seq: int) -> _Op:
        op = self._ops.get((group_id, op_seq))
        if op is None:
            raise ValueError(f"group {group_id} collective {op_seq}: not decided yet")
        return op

    def all_finished(self, group_id: int, op_seq: int) -> bool:
        info = self.groups.get(group_id)
        if info is not None and op_seq < info.first_op:
            return True          # before a restart: every rank re-registered after it (adopt_group)
        op = self._ops.get((group_id, op_seq))
        return op is not None and info is not None and set(info.ranks) <= op.finished

    def op_epoch(self, group_id: int, op_seq: int) -> int:
        """How many times ranks were dropped from the collective while it ran (0: never): a rank running
        it at another epoch redoes it on the host ring among the group's ranks left (comm.World)."""
        op = self._ops.get((group_id, op_seq))
        return op.epoch if op is not None else 0

    def finished(self, rank: int, group_id: int, op_seq: int) -> None:
        info = self.groups.get(group_id)
        if info is None:
            raise ValueError(f"group {group_id}: no such group")
        if op_seq < info.first_op and (group_id, op_seq) not in self._ops:
            return               # decided before a restart: nothing of it is accounted here
        op = self._op(group_id, op_seq)
        if rank in info.dropped:
            return               # dropped as dead: it no longer counts (nor holds anyone)
        if rank not in info.ranks:
            raise ValueError(f"group {group_id}: rank {rank} is not a member")
        if rank in op.finished:
            return
        op.finished.add(rank)
        if op.since is None:
            op.since = self._now
        self._maybe_done(group_id, op)

    def _maybe_done(self, group_id: int, op: _Op) -> None:
        """The accounting of a collective once every rank of its group finished it (once)."""
        info = self.groups[group_id]
        if op.accounted or not set(info.ranks) <= op.finished:
            return
        op.accounted = True
        self._quiet_since[group_id] = self._now
        self.latency.add(max(0.0, self._now - op.started))
        info.collectives += 1
        info.offloaded += op.decision.offload
        info.fell_back += op.fell_back
        if op.decision.offload and not op.fell_back:
            self._switch_bytes += op.nbytes
            self._reduced_bytes += op.nbytes
            kind = op.decision.kind
            chunks = chunk_count(op.nbytes // kind.itemsize, kind.itemsize, op.decision.chunk_bytes)
            info.completions += chunks
            info.contributions += chunks * op.members
            info.bytes_reduced += op.nbytes
        if (op.fell_back or info.rule_stale) and info.offloadable:
            # Abandoned chunks may hold sets: empty the quota (and give the rule the ranks left) before
            # the next collective.
            self._schedule_cleanup(group_id)

    def _schedule_cleanup(self, group_id: int) -> None:
        if group_id not in self._blocked:
            self._blocked.add(group_id)
            self._cleanups.append(group_id)

    def report_rtts(self, rtts: list[float]) -> None:
        for rtt in rtts:
            if not rtt >= 0.0:              # also NaN
                raise ValueError(f"round trip {rtt!r}: must be a number >= 0")
        self._rtts.extend(float(r) for r in rtts)
        del self._rtts[:-4096]
        low = min(self._rtts) if self._rtts else 0.0
        for rtt in rtts:
            self.queue_delay.add(rtt - low)

    def tick(self, now: float) -> None:
        """Tell the controller the time (the service calls it on every request)."""
        self._now = max(self._now, now)

    # ---------------------------------------------------------------- periodic work
    async def switch_idle(self) -> bool:
        """No frame on a wire, in the switch or held by the link (a fault injector's reordering)."""
        if getattr(self.link, "holding", 0):
            return False
        return await self.link.read(self.regs["BUSY"].address()) == 0

    async def retype(self, group_id: int, kind: CollectiveKind) -> None:
        """Program the group's rule for collectives of `kind`, emptying its slots first when the fold
        changes in a way a frame's header does not show (element type, acc_fp32, saturate): a result
        resent for a late retransmission is folded again from the contributions the sets keep, with the
        rule as it is then."""
        info = self.groups[group_id]
        old = info.kind
        if (old.dtype, old.acc_fp32, old.saturate) != (kind.dtype, kind.acc_fp32, kind.saturate):
            await self._apply(slot_clear_writes(self.regs, info.base, info.slot_count))
        info.kind = kind
        await self._apply(rule_writes(self.regs, info.rule_index, self.group_rule(info)))
        self.retypes += 1
        log.debug("group %d: rule %d retyped %s -> %s", group_id, info.rule_index, old, kind)

    @property
    def next_evaluation(self) -> float:
        """When (seconds of switch time) :meth:`service` next re-evaluates the offload decisions."""
        return self._next_eval

    def drain_time(self) -> float:
        """How long after a group's last collective no frame of it can still be in the switch: DRAIN_TIMEOUTS
        x the longer of the initial retransmission timeout and the longest recent round trip (a frame's
        time in the switch is part of its round trip)."""
        return DRAIN_TIMEOUTS * max([self.config.timeout_s] + self._rtts[-256:])

    def _drained(self, group_id: int, now: float) -> bool:
        """No late frame of the group's previous collective can still be in the switch (module docstring)."""
        return now - self._quiet_since.get(group_id, 0.0) >= self.drain_time()

    async def check_reset(self, now: float) -> bool:
        """Whether the switch was reset since it was programmed (EPOCH reads 0); if so, program it again:
        the MAC entries, and for every group its slots emptied and its rule as it was. Chunks in flight
        lost their partial sets with the reset; the drivers' retransmissions fill them again (or their
        retries run out and they fall back to the host ring)."""
        epoch = self.regs["EPOCH"]
        if await self.link.read(epoch.address()) != 0:
            return False
        for rank, (port, mac) in enumerate(zip(self.rank_ports, self.rank_macs)):
            if rank < self.params.mac_entries:
                await self._apply(mac_writes(self.regs, rank, MacEntry(mac, port)))
        for group_id, info in sorted(self.groups.items()):
            if info.offloadable:
                await self._apply(slot_clear_writes(self.regs, info.base, info.slot_count))
                await self._apply(rule_writes(self.regs, info.rule_index, self.group_rule(info)))
        for index, rule in sorted(self.operator_rules.items()):
            await self._apply(rule_writes(self.regs, index, rule))
        await self._program_aging()
        self._aged_total = 0
        self.resets += 1
        await self.link.write(epoch.address(), self.resets + 1)
        self.events.append((now, f"switch reset noticed (EPOCH read 0): {len(self.groups)} groups and "
                                 f"{len(self.operator_rules)} operator rules programmed again"))
        log.warning("switch reset noticed: programmed again")
        return True

    async def service(self, now: float) -> None:
        """Pending register work, and the periodic re-evaluation when it is due."""
        self._now = max(self._now, now)
        if now >= self._next_epoch_check:          # a reset is noticed within one retransmission timeout
            await self.check_reset(now)
            self._next_epoch_check = now + self.config.timeout_ms / 1000.0
        if self.config.set_age_ms and now >= self._next_aging_check:
            await self.check_aged(now)
            self._next_aging_check = now + self.aging_check_s()
        self._finish_age(now)
        while self._cleanups:
            group_id = self._cleanups.pop(0)
            info = self.groups.get(group_id)
            if info is not None:
                await self._apply(slot_clear_writes(self.regs, info.base, info.slot_count))
                if info.rule_stale:         # ranks were dropped: only the ranks left contribute
                    await self._apply(rule_writes(self.regs, info.rule_index, self.group_rule(info)))
                    info.rule_stale = False
            self._blocked.discard(group_id)
        if self._retypes:
            ready = [g for g in sorted(self._retypes) if self._drained(g, now)]
            if len(ready) < len(self._retypes) and await self.switch_idle():
                ready = sorted(self._retypes)
            for group_id in ready:
                await self.retype(group_id, self._retypes.pop(group_id))
        if now >= self._next_eval:
            await self.evaluate(now)
            self._next_eval = now + self.config.reevaluate_interval_ms / 1000.0

    # ---------------------------------------------------------------- dead ranks (set aging)
    def aging_check_s(self) -> float:
        """How often :meth:`service` reads the aging registers: AGING_CHECKS times per set age, and at
        least as often as the reset check (``timeout_ms``) would allow."""
        return max(self.config.timeout_s, self.config.set_age_s / AGING_CHECKS)

    def detection_bound_s(self) -> float:
        """The longest time from a set's last accepted contribution to the controller dropping the ranks
        missing from it: the age, the switch's scan (AGING's documented bound), the check that reads the
        event, and one more check over which the group's events are gathered."""
        return self.config.set_age_s + self.aging_scan_s() + 2 * self.aging_check_s()

    def drop_ranks(self, group_id: int, ranks, now: float, why: str, *, redo: bool) -> list[int]:
        """Drop ranks from a group as dead: the group goes on with the ranks left. With `redo` (a set of
        its running collective aged without their contributions) that collective is redone by the ranks
        left on the host ring, each from its own input (:meth:`op_epoch` tells them); without (they never
        finished a collective every other rank finished) it stands as the ranks left finished it. The
        group's rule gets the ranks left as contributors and its quota is emptied before its next
        collective. Returns the ranks dropped (members only, once each)."""
        info = self.groups[group_id]
        dead = [r for r in sorted(set(ranks)) if r in info.ranks]
        if not dead:
            return []
        info.ranks = tuple(r for r in info.ranks if r not in dead)
        info.ports = tuple(self.rank_ports[r] for r in info.ranks)
        for r in dead:
            info.dropped[r] = why
            self.dropped.append((now, group_id, r, why))
        info.rule_stale = info.offloadable
        latest = self._latest.get(group_id)
        op = self._ops.get((group_id, latest)) if latest is not None else None
        self.events.append((now, f"group {group_id}: rank(s) {dead} dropped ({why}); ranks left {list(info.ranks)}"))
        log.warning("group %d: rank(s) %s dropped (%s)", group_id, dead, why)
        if op is not None and not op.accounted:
            if redo:
                op.epoch += 1
                op.fell_back = True
                op.finished.clear()
                op.since = None
                self.events.append((now, f"group {group_id} collective {latest}: redone on the host ring by "
                                         f"ranks {list(info.ranks)}"))
            self._maybe_done(group_id, op)
        if op is None or op.accounted:
            self._schedule_cleanup(group_id)
        return dead

    def _finish_age(self, now: float) -> None:
        """Ranks that never finish a collective the others finished longer than the set age ago: dead after
        their last contribution (no set waits for them, so none ages)."""
        if not self.config.set_age_ms or not self.drop_dead:
            return
        for group_id, op_seq in list(self._latest.items()):
            op = self._ops[(group_id, op_seq)]
            info = self.groups.get(group_id)
            if info is None or op.accounted or op.since is None or now - op.since <= self.config.set_age_s:
                continue
            late = [r for r in info.ranks if r not in op.finished]
            self.drop_ranks(group_id, late, now, f"did not finish collective {op_seq} within set_age_ms="
                            f"{self.config.set_age_ms:g} of its peers", redo=False)

    def next_timer(self) -> float | None:
        """When the controller next has dead-rank work due while a collective waits (None: nothing waits):
        the next aging check, or a finish-age deadline. The co-simulation wakes then."""
        if not self.config.set_age_ms or not self.drop_dead:
            return None
        times = []
        for group_id, op_seq in self._latest.items():
            op = self._ops[(group_id, op_seq)]
            if op.accounted or group_id not in self.groups:
                continue
            if op.decision.offload and group_id not in self._retypes and group_id not in self._blocked:
                times.append(self._next_aging_check)     # its sets may age
            if op.since is not None:
                times.append(op.since + self.config.set_age_s + 1e-9)
        return min(times) if times else None

    def age_units(self) -> int:
        """``set_age_ms`` in units of the switch's AGE_UNIT cycles at its clock (rounded up; 0: off)."""
        if not self.config.set_age_ms:
            return 0
        field = self.regs["AGING"].field("age")
        units = -(-round(self.config.set_age_s * self.link.clock_hz) // self.age_unit)
        limit = (1 << field.width) - 1
        if units > limit:
            most = limit * self.age_unit / self.link.clock_hz * 1000
            raise ValueError(f"set_age_ms={self.config.set_age_ms:g}: at most {most:.1f} ms for this switch "
                             f"(AGING.age is {field.width} bits of {self.age_unit} cycles at "
                             f"{self.link.clock_hz / 1e6:g} MHz)")
        return units

    async def _program_aging(self) -> None:
        """AGING from the configuration: the age, and free (an aged set is emptied, so the dead rank's
        sets do not stay taken)."""
        units = self.age_units()
        await self.link.write(self.regs["AGING"].address(), self.regs["AGING"].pack(age=units, free=int(units > 0)))

    def aging_scan_s(self) -> float:
        """How much later than the age the switch may age a set: its scanner's period (AGING's bound)."""
        return aging_period(self.params) / self.link.clock_hz

    async def check_aged(self, now: float) -> None:
        """Read the aged-set events (AGED_TOTAL, then the queue: AGED_EVENT, AGED_PORTS, AGED_POP) and drop
        the ranks missing from a group's aged sets: the ranks missing from every set of the group that
        aged by the next check after the first of them (a live rank whose frame was lost misses from one
        set, a dead one from all of them)."""
        read, regs = self.link.read, self.regs
        total = await read(regs["AGED_TOTAL"].address())
        if total != self._aged_total:
            self._aged_total = total
            event, ports = regs["AGED_EVENT"], regs["AGED_PORTS"]
            while True:
                e = event.unpack(await read(event.address()))
                if not e["valid"]:
                    break
                bitmap = ports.unpack(await read(ports.address()))["ports"]
                await self.link.write(regs["AGED_POP"].address(), 0)
                self._aged_event(now, e["slot"], e["set"], e["rule"], bitmap)
        self._checks += 1
        for group_id, (first, missing) in list(self._suspects.items()):
            if first < self._checks - 1 or group_id not in self.groups:     # gathered over one more check
                del self._suspects[group_id]
                if group_id in self.groups and missing and self.drop_dead:
                    self.drop_ranks(group_id, missing, now, f"missing from its aged sets (set_age_ms="
                                    f"{self.config.set_age_ms:g})", redo=True)

    def _aged_event(self, now: float, slot: int, s: int, rule: int, bitmap: int) -> None:
        info = next((g for g in self.groups.values() if g.rule_index == rule), None)
        record = {"time_s": now, "slot": slot, "set": s, "rule": rule, "ports": bitmap,
                  "group": None if info is None else info.group_id, "missing": []}
        self.aged.append(record)
        del self.aged[:-1024]
        if info is None:
            return                      # an operator rule's set: reported in the statistics only
        missing = {r for r, p in zip(info.ranks, info.ports) if not bitmap >> p & 1}
        record["missing"] = sorted(missing)
        self.events.append((now, f"group {info.group_id}: set {slot}.{s} aged with ports {bitmap:#x}, "
                                 f"missing rank(s) {sorted(missing)}"))
        first, before = self._suspects.get(info.group_id, (self._checks, missing))
        self._suspects[info.group_id] = (first, before & missing)

    async def read_counters(self) -> dict:
        return await read_counters(self.link.read, self.regs)

    async def evaluate(self, now: float) -> dict:
        """Read the counters, update the statistics, adapt the threshold, warn."""
        counters = await self.read_counters()
        self._counters = counters
        sets = 2 * self.params.slots
        in_use = counters["SLOTS_IN_USE"] / sets
        offloaded = [op for op in self._ops.values() if op.decision.offload]
        fallback_ratio = sum(op.fell_back for op in offloaded) / len(offloaded) if offloaded else 0.0
        # bytes actually reduced (each collective in its own wire format and chunk size), per second
        if self._last is not None:
            t0, _, b0 = self._last
            throughput = (self._reduced_bytes - b0) / max(now - t0, 1e-12)
        else:
            throughput = self._reduced_bytes / max(now, 1e-12)
        allocated = sum(g.slot_count for g in self.groups.values() if g.base is not None)
        self._stats = {
            "time_s": now,
            "sram_usage": in_use,
            "sram_allocated": allocated / self.params.slots,
            "reduce_throughput_Bps": throughput,
            "avg_queue_delay_s": self._queue_delay(),
            "min_rtt_s": min(self._rtts) if self._rtts else None,
            "bytes_reduced": self._reduced_bytes,
            "queue_delay_s": self.queue_delay.summary(),
            "collective_latency_s": self.latency.summary(),
            "fallback_ratio": fallback_ratio,
            "collectives": len(self._ops),
            "offloaded": len(offloaded),
            "threshold": self.threshold,
            "sets_aged": counters["AGED_TOTAL"],
            "aged_events_lost": counters["AGED_LOST"],
            "ranks_dropped": len(self.dropped),
            "drops": {r.name: counters[f"DROP_{r.name}"] for r in DropReason},
            "ports": [{"rx_frames": counters["RX_FRAMES"][p], "rx_bytes": counters["RX_BYTES"][p],
                       "tx_frames": counters["TX_FRAMES"][p], "tx_bytes": counters["TX_BYTES"][p]}
                      for p in range(self.params.ports)],
            "counters": counters,
            "groups": {g: self.group_counters(g) for g in sorted(self.groups)},
        }
        if in_use > MEMORY_PRESSURE:
            new = min(THRESHOLD_CAP, self.threshold + THRESHOLD_STEP)
        else:
            new = max(self.config.offload_threshold, self.threshold - THRESHOLD_STEP)
        if new != self.threshold:
            self.events.append((now, f"threshold {self.threshold:.2f} -> {new:.2f} (slot sets in use {in_use:.0%})"))
            self.threshold = new
        for alert, value in ((self.alerts["sram_pressure"], in_use), (self.alerts["fallback_ratio"], fallback_ratio)):
            msg = alert.update(value)
            if msg:
                self.events.append((now, msg))
                (log.warning if alert.active else log.info)(msg)
        self._stats["alerts"] = [a.as_dict() for a in self.alerts.values()]
        self._last = (now, counters, self._reduced_bytes)
        return self._stats

    def group_counters(self, group_id: int) -> dict:
        """The accounting of one group (module docstring), its quota and, from the switch's counters of
        the last evaluation, its sets in use (SETS_IN_USE of its rule entry: the non-empty sets of the
        slots its frames wrote last) and its sets aged (AGED of its rule entry)."""
        g = self.groups[group_id]
        entry = self._counters.get("SETS_IN_USE"), self._counters.get("AGED")
        in_use, aged = ((e[g.rule_index] if e is not None and g.rule_index is not None else 0) for e in entry)
        return {"group_id": g.group_id, "ranks": list(g.ranks), "ports": list(g.ports), "rule_index": g.rule_index,
                "base": g.base, "slots": g.slot_count if g.base is not None else 0, "why_not": g.why_not,
                "sets_in_use": in_use, "sets_allocated": 2 * g.slot_count if g.base is not None else 0,
                "kind": str(g.kind), "collectives": g.collectives, "offloaded": g.offloaded,
                "fell_back": g.fell_back, "completions": g.completions, "contributions": g.contributions,
                "bytes_reduced": g.bytes_reduced, "next_seq": g.next_seq,
                "retype_pending": group_id in self._retypes, "sets_aged": aged,
                "dropped": {str(r): why for r, why in sorted(g.dropped.items())}}

    def stats(self) -> dict:
        """The statistics of the last evaluation (call :meth:`evaluate` for fresh ones)."""
        return dict(self._stats)
