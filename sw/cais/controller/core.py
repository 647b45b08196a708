"""The controller: composes the parts and runs the per-collective and periodic work across them.

One controller serves every rank. It

- programs the MAC table with every host's address (the fallback ring's frames are unicast; the switch
  binds each address to its host's port and, with every host in the table, floods no host frame) and, per
  group, one rule and a slot quota (:mod:`.rulebook`; a group that gets no quota or no rule stays on the
  hosts);
- reads the FEATURES register at start (``float_units``: does this switch reduce fp32/fp16/bf16?
  ``reproducible``: does it serve reproducible rules?); what the switch says wins over the configured
  :class:`~cais.params.SwitchParams`;
- decides, for every collective, whether it goes through the switch (:mod:`.policy`) and tells every
  rank the same answer, with the collective's first chunk sequence number and chunk payload; coordinates
  the fall back of a collective whose chunk ran out of retries, and empties the group's slots before the
  group's next collective uses them again (:mod:`.registry`);
- keeps each group's rule typed for the collective that uses it: a collective whose kind (element type,
  operator, acc_fp32, saturate, reproducible: :class:`~cais.allreduce.CollectiveKind`) differs from the
  rule's is held (``decide`` answers None) until :meth:`Controller.service` has rewritten the rule, so no
  rank sends a frame of the new kind to the old rule. The retype holds only that group's decisions, and
  waits until no late frame of the group's previous collective can still be inside the switch: the switch
  is idle (BUSY), or :meth:`Controller.drain_time` has passed since that collective finished on every
  rank. Other groups' traffic neither is held nor holds it;
- notices a switch reset (EPOCH reads 0) and programs the switch again;
- finds dead ranks through aged sets and unfinished collectives (:mod:`.aging`);
- keeps the accounting and the statistics operators expect (:mod:`.statistics`), re-evaluated every
  ``reevaluate_interval_ms`` (the threshold raised while slot memory stays above 80% in use; the alerts
  log once when they fire and once when they clear).

All methods that touch the switch are coroutines awaiting only the link's ``read``/``write``.
"""

from __future__ import annotations

import collections
import logging

from ..allreduce import CollectiveKind, chunk_count, chunk_payload
from ..config import Config
from ..link import SwitchLink
from ..registers import read_counters
from ..tables import MacEntry, Rule, mac_writes
from .aging import AgingWatcher
from .policy import OffloadDecision, OffloadPolicy, Reason
from .registry import GroupInfo, GroupRegistry
from .rulebook import RuleBook, group_rule
from .statistics import Statistics
from .switch import SwitchAccess

__all__ = ["Controller", "DECISIONS_KEPT"]

log = logging.getLogger("cais.controller")

DECISIONS_KEPT = 4096       # recent decisions kept for cais-cli show-decisions (decision_count counts them all)


class Controller:
    """The parts (module docstring) and the flows that cross them.

    Members
    -------
    switch : SwitchAccess
    registry : GroupRegistry
        Groups, their collectives, finishers and dropped ranks.
    rules : RuleBook
        Rule entries and slot quotas.
    policy : OffloadPolicy
        The score, the threshold, the decisions' tally.
    aging : AgingWatcher
    statistics : Statistics
    decisions : collections.deque
        The last DECISIONS_KEPT (time, group, op_seq, OffloadDecision).
    decision_count : int
        Decisions made since start.
    events : list[tuple[float, str]]
        Warnings, threshold changes, drops, resets.
    """

    def __init__(self, link: SwitchLink, config: Config, rank_ports: list[int], rank_macs: list[int], *,
                 drop_dead: bool = True):
        self.switch = SwitchAccess(link)
        self.link, self.params, self.regs = link, self.switch.params, self.switch.regs
        self.rank_ports, self.rank_macs = list(rank_ports), list(rank_macs)
        self.events: list[tuple[float, str]] = []
        self.policy = OffloadPolicy(self.params, link.clock_hz, config)
        self.statistics: Statistics
        self.registry = GroupRegistry(self.events, lambda info, op, now: self.statistics.account(info, op, now))
        self.statistics = Statistics(self.regs, self.params, self.policy, self.registry, self.events)
        self.rules = RuleBook(self.switch, config, self.registry.groups)
        self.aging = AgingWatcher(self.switch, config, self.registry, self.rank_ports, drop_dead=drop_dead)
        self._config = config
        self.decisions: collections.deque = collections.deque(maxlen=DECISIONS_KEPT)
        self.decision_count = 0
        self._retypes: dict[int, CollectiveKind] = {}   # group -> kind its rule must get before it goes on
        self.retypes = 0                                 # rule rewrites done (statistics, tests)
        self.resets = 0                                  # switch resets noticed (EPOCH read 0) and repaired
        self._next_eval = 0.0
        self._next_epoch_check = 0.0

    # ---------------------------------------------------------------- the parts' state, by its old names
    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        self._config = config
        for part in (self.policy, self.rules, self.aging):
            part.config = config

    groups = property(lambda self: self.registry.groups)
    dropped = property(lambda self: self.registry.dropped)
    operator_rules = property(lambda self: self.rules.operator_rules)
    slots_allocated = property(lambda self: self.rules.slots_allocated)
    latency = property(lambda self: self.statistics.latency)
    queue_delay = property(lambda self: self.policy.queue_delay)
    alerts = property(lambda self: self.statistics.alerts)
    aged = property(lambda self: self.aging.aged)
    age_unit = property(lambda self: self.aging.age_unit)
    dtypes = property(lambda self: self.policy.dtypes)
    threshold = property(lambda self: self.policy.threshold)
    float_units = property(lambda self: self.policy.float_units)
    reproducible = property(lambda self: self.policy.reproducible)
    next_evaluation = property(lambda self: self._next_eval, doc="When :meth:`service` next re-evaluates.")
    group_rule = staticmethod(group_rule)

    def capacity(self, kind: CollectiveKind) -> int:
        return self.policy.capacity(kind)

    def drain_time(self) -> float:
        return self.policy.drain_time()

    def report_rtts(self, rtts: list[float]) -> None:
        self.policy.report_rtts(rtts)

    def tick(self, now: float) -> None:
        """Tell the controller the time (the service calls it on every request)."""
        self.registry.tick(now)

    fell_back = property(lambda self: self.registry.fell_back)
    all_finished = property(lambda self: self.registry.all_finished)
    op_epoch = property(lambda self: self.registry.op_epoch)
    finished = property(lambda self: self.registry.finished)
    request_fallback = property(lambda self: self.registry.request_fallback)
    aging_check_s = property(lambda self: self.aging.check_s)
    aging_scan_s = property(lambda self: self.aging.scan_s)
    detection_bound_s = property(lambda self: self.aging.detection_bound_s)
    age_units = property(lambda self: self.aging.age_units)
    check_rule = property(lambda self: self.rules.check_rule)
    add_rule = property(lambda self: self.rules.add_rule)
    dump_rules = property(lambda self: self.rules.dump_rules)
    stats = property(lambda self: self.statistics.stats)

    def drop_ranks(self, group_id: int, ranks, now: float, why: str, *, redo: bool) -> list[int]:
        return self.registry.drop_ranks(group_id, ranks, now, why, redo=redo, rank_ports=self.rank_ports)

    def next_timer(self) -> float | None:
        """When dead-rank work is next due while a collective waits (None: nothing waits)."""
        return self.aging.next_timer(self._held)

    def _held(self, group_id: int) -> bool:
        """The group's rule waits to be retyped or its slots to be emptied."""
        return group_id in self._retypes or group_id in self.registry.blocked

    @property
    def pending(self) -> bool:
        """Register work is waiting (a rule to retype, slots to empty): decisions may be held."""
        return bool(self._retypes or self.registry.cleanups)

    def pending_work(self) -> list[str]:
        """The register work that is waiting, one line each (for hang reports)."""
        return ([f"group {g}: rule waits for the group's frames to drain to be retyped to {k}"
                 for g, k in sorted(self._retypes.items())]
                + [f"group {g}: slots wait to be emptied" for g in self.registry.cleanups])

    # ---------------------------------------------------------------- set-up
    async def _program_macs(self) -> None:
        """Every host's MAC entry: its frames are routed to its port, and its address is bound to that port
        (the switch drops a frame with that source from any other port: SPOOFED_SOURCE). With every host in
        the table, host frames go only to table entries (MAC_POLICY.host_strict), never flooded."""
        for rank, (port, mac) in enumerate(zip(self.rank_ports, self.rank_macs)):
            if rank >= self.params.mac_entries:
                break   # further hosts are flooded (unknown unicast)
            await self.switch.apply(mac_writes(self.regs, rank, MacEntry(mac, port)))
        every = len(self.rank_macs) <= self.params.mac_entries
        if not every:
            log.warning("%d hosts, %d MAC entries: hosts %d.. are not bound to their ports and their host frames "
                        "are flooded", len(self.rank_macs), self.params.mac_entries, self.params.mac_entries)
        await self.switch.write("MAC_POLICY", self.regs["MAC_POLICY"].pack(host_strict=int(every)))

    async def start(self) -> None:
        """Check the switch and program every host's MAC address."""
        ident = await self.switch.read("ID")
        if ident != self.regs["ID"].reset:
            raise RuntimeError(f"no CAIS switch on the link: ID register reads {ident:#x}")
        fields = self.regs["FEATURES"].unpack(await self.switch.read("FEATURES"))
        self.policy.float_units, self.policy.reproducible = bool(fields["float_units"]), bool(fields["reproducible"])
        await self._program_macs()
        await self.aging.program()
        await self.switch.write("EPOCH", 1)
        self._next_eval = self.config.reevaluate_interval_ms / 1000.0

    def _check_ranks(self, ranks: tuple[int, ...], what: str) -> None:
        for r in ranks:
            if not 0 <= r < len(self.rank_ports):
                raise ValueError(f"{what}: rank {r} does not exist")

    async def create_group(self, ranks: list[int]) -> GroupInfo:
        """Give a group an id, a rule and a slot quota (or a reason why it stays on the hosts)."""
        ranks = tuple(ranks)
        if len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(f"group ranks {list(ranks)}: must be distinct and not empty")
        self._check_ranks(ranks, f"group ranks {list(ranks)}")
        group_id = self.rules.free_group_id(set(self.groups))
        if group_id is None:
            raise RuntimeError("no free group id (255 groups exist)")
        info = GroupInfo(group_id, ranks, tuple(self.rank_ports[r] for r in ranks))
        rule_index = self.rules.free_rule_index()
        base, count = self.rules.quota()
        if rule_index is None:
            info.why_not, info.host_reason = "rule table full", Reason.NO_RULE
        elif base is None:
            info.why_not = f"slot memory above sram_usage_limit={self.config.sram_usage_limit}"
            info.host_reason = Reason.NO_SLOTS
        else:
            info.base, info.count_log2, info.rule_index = base, count.bit_length() - 1, rule_index
            await self.rules.program_group(info)
        self.groups[group_id] = info
        log.info("group %d: ranks %s, %s", group_id, list(ranks),
                 f"slots {base}..{base + count - 1}" if info.offloadable else f"host only ({info.why_not})")
        return info

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
        self._check_ranks(ranks, f"group {group_id}")
        info = GroupInfo(group_id, ranks, tuple(self.rank_ports[r] for r in ranks), next_seq=int(next_seq),
                         first_op=int(next_op))
        if base is not None and rule_index is not None:
            count = 1 << count_log2
            if not (0 <= base and base + count <= self.params.slots and 0 <= rule_index < self.params.rules):
                raise ValueError(f"group {group_id}: slots {base}+{count} or rule {rule_index} outside the switch")
            if self.rules.taken(rule_index, base, count):
                raise ValueError(f"group {group_id}: its rule {rule_index} or slots {base}+{count} are taken")
            info.base, info.count_log2, info.rule_index = base, count_log2, rule_index
            await self.rules.program_group(info)
        else:
            info.why_not, info.host_reason = "host only before the restart", Reason.RESTARTED
        self.groups[group_id] = info
        log.info("group %d: adopted after a restart (ranks %s)", group_id, list(ranks))
        return info

    async def remove_group(self, group_id: int) -> None:
        """Free a group (its job ended): its rule entry invalidated, its slots emptied and given back, its
        collectives' state forgotten (its accounting stays in the controller's totals)."""
        info = self.registry.forget(group_id)
        self._retypes.pop(group_id, None)
        self.aging.suspects.pop(group_id, None)
        await self.rules.release_group(info)

    async def del_rule(self, index: int) -> Rule:
        return await self.rules.del_rule(index)

    # ---------------------------------------------------------------- per collective
    def decide(self, group_id: int, op_seq: int, nbytes: int, now: float,
               kind: CollectiveKind | None = None) -> OffloadDecision | None:
        """Where collective `op_seq` of a group runs; the same answer for every rank. None: ask again
        later (the group's slots are being emptied after a fall back, or its rule is being retyped for
        this collective's `kind`, default int32 SUM). `nbytes` is the collective's size on the wire."""
        kind = kind or CollectiveKind()
        reg = self.registry
        if (group_id, op_seq) in reg.ops:
            return None if group_id in self._retypes else reg.ops[(group_id, op_seq)].decision
        # One collective of a group at a time on the switch: the next waits until every rank finished the
        # previous one (and its slots are emptied if it fell back). A waiting retype holds only its group.
        reg.tick(now)
        if group_id not in self.groups:
            raise ValueError(f"group {group_id}: no such group")
        info = self.groups[group_id]
        if (group_id in self._retypes or group_id in reg.blocked
                or (op_seq > info.first_op and not reg.all_finished(group_id, op_seq - 1))):
            return None
        decision = self.policy.choose(nbytes, len(info.ranks), kind, info.host_reason, info.why_not)
        if decision.offload:
            # Sequence numbers advance over offloaded collectives only, so the slots see no holes.
            decision.chunk_bytes = chunk_payload(self.config.chunk_size, self.capacity(kind), kind.itemsize)
            decision.seq_base = info.next_seq
            info.next_seq += chunk_count(nbytes // kind.itemsize, kind.itemsize, decision.chunk_bytes)
        reg.record(group_id, op_seq, decision, nbytes, now)
        self.decisions.append((now, group_id, op_seq, decision))
        self.decision_count += 1
        log.debug("group %d collective %d -> %s: %s", group_id, op_seq, decision.path, decision.reason)
        if decision.offload and kind != info.kind:
            self._retypes[group_id] = kind      # service() rewrites the rule; then the decision is given
            return None
        return decision

    # ---------------------------------------------------------------- periodic work
    async def prefetch(self, now: float) -> dict:
        """The reads :meth:`service` at `now` wants (EPOCH when the reset check is due, the counters when an
        evaluation is due), touching no state: the service does them without its lock, so a slow switch
        holds up nobody else."""
        pre = {}
        if now >= self._next_epoch_check:
            pre["EPOCH"] = await self.switch.read("EPOCH")
        if now >= self._next_eval:
            pre["counters"] = await self.read_counters()
        return pre

    async def service(self, now: float, pre: dict | None = None) -> None:
        """Pending register work, and the periodic re-evaluation when it is due (`pre`: the reads of
        :meth:`prefetch`, used instead of reading again)."""
        pre = pre or {}
        self.registry.tick(now)
        if now >= self._next_epoch_check:          # a reset is noticed within one retransmission timeout
            await self.check_reset(now, pre.get("EPOCH"))
            self._next_epoch_check = now + self.config.timeout_ms / 1000.0
        await self.aging.service(now)
        reg = self.registry
        while reg.cleanups:
            group_id = reg.cleanups.pop(0)
            info = self.groups.get(group_id)
            if info is not None:
                await self.rules.empty(info)
                if info.rule_stale:         # ranks were dropped: only the ranks left contribute
                    await self.rules.program_group(info, empty=False)
                    info.rule_stale = False
            reg.blocked.discard(group_id)
        if self._retypes:
            ready = [g for g in sorted(self._retypes) if self._drained(g, now)]
            if len(ready) < len(self._retypes) and await self.switch_idle():
                ready = sorted(self._retypes)
            for group_id in ready:
                await self.retype(group_id, self._retypes.pop(group_id))
        if now >= self._next_eval:
            await self.evaluate(now, pre.get("counters"))
            self._next_eval = now + self.config.reevaluate_interval_ms / 1000.0

    async def switch_idle(self) -> bool:
        """No frame on a wire, in the switch or held by the link (a fault injector's reordering)."""
        if getattr(self.link, "holding", 0):
            return False
        return await self.switch.read("BUSY") == 0

    def _drained(self, group_id: int, now: float) -> bool:
        """No late frame of the group's previous collective can still be in the switch (module docstring)."""
        return now - self.registry.quiet_since.get(group_id, 0.0) >= self.drain_time()

    async def retype(self, group_id: int, kind: CollectiveKind) -> None:
        """Program the group's rule for collectives of `kind`, emptying its slots first when the fold
        changes in a way a frame's header does not show (element type, acc_fp32, saturate): a result
        resent for a late retransmission is folded again from the contributions the sets keep, with the
        rule as it is then."""
        info = self.groups[group_id]
        old = info.kind
        info.kind = kind
        await self.rules.program_group(info, empty=(old.dtype, old.acc_fp32, old.saturate)
                                       != (kind.dtype, kind.acc_fp32, kind.saturate))
        self.retypes += 1
        log.debug("group %d: rule %d retyped %s -> %s", group_id, info.rule_index, old, kind)

    async def check_reset(self, now: float, epoch: int | None = None) -> bool:
        """Whether the switch was reset since it was programmed (EPOCH reads 0); if so, program it again:
        the MAC entries, and for every group its slots emptied and its rule as it was. Chunks in flight
        lost their partial sets with the reset; the drivers' retransmissions fill them again (or their
        retries run out and they fall back to the host ring). `epoch`: EPOCH as just read (None: read it)."""
        if (await self.switch.read("EPOCH") if epoch is None else epoch) != 0:
            return False
        await self._program_macs()
        await self.rules.reprogram()
        await self.aging.program()
        self.aging.reset()
        self.statistics.extender.rebase()
        self.resets += 1
        await self.switch.write("EPOCH", self.resets + 1)
        self.events.append((now, f"switch reset noticed (EPOCH read 0): {len(self.groups)} groups and "
                                 f"{len(self.operator_rules)} operator rules programmed again"))
        log.warning("switch reset noticed: programmed again")
        return True

    async def read_counters(self) -> dict:
        """The switch's counters and levels as the registers read (32 bits, wrapping)."""
        return await read_counters(self.link.read, self.regs)

    async def evaluate(self, now: float, counters: dict | None = None) -> dict:
        """Read the counters (unless given, as just read), update the statistics (64-bit totals), adapt the
        threshold, warn."""
        if counters is None:
            counters = await self.read_counters()
        st = self.statistics.evaluate(now, counters, self.slots_allocated)
        st["groups"] = {g: self.group_counters(g) for g in sorted(self.groups)}
        return st

    def group_counters(self, group_id: int) -> dict:
        """The accounting of one group (:meth:`Statistics.group_counters`)."""
        return self.statistics.group_counters(self.groups[group_id], group_id in self._retypes)
