"""The group registry: the groups, their ranks, their collectives, who finished and who was dropped.

Contract: :class:`GroupRegistry` holds no register and writes none. It records each decided collective
(:class:`Collective`), which ranks finished it, whether it fell back, and when every rank of its group
finished it calls ``on_done(info, collective)`` once (the statistics account it). It drops dead ranks
from a group (the running collective redone by the ranks left, or standing as they finished it) and
keeps the queue of groups whose quota must be emptied before their next collective (``cleanups``; the
controller empties them and takes them off ``blocked``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from ..allreduce import CollectiveKind
from .policy import OffloadDecision, Reason

__all__ = ["GroupInfo", "Collective", "GroupRegistry"]

log = logging.getLogger("cais.controller")


@dataclass
class GroupInfo:
    group_id: int
    ranks: tuple[int, ...]
    ports: tuple[int, ...]
    base: int | None = None          # first slot of the quota; None: no quota (host ring only)
    count_log2: int = 0
    rule_index: int | None = None
    why_not: str = ""                # why the group has no quota (a sentence)
    host_reason: Reason | None = None   # the same as a code (None: it has a quota and a rule)
    kind: CollectiveKind = CollectiveKind()   # what the group's rule is programmed for now
    next_seq: int = 0                # seq_num of the next offloaded chunk (offloaded collectives only)
    first_op: int = 0                # op_seq of the first collective this controller saw (restart: > 0)
    collectives: int = 0             # accounting (cais.controller.statistics): collectives finished on every rank
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
class Collective:
    """One decided collective of a group, until every rank of the group finished it."""
    decision: OffloadDecision
    nbytes: int
    started: float = 0.0
    fell_back: bool = False
    finished: set = field(default_factory=set)
    epoch: int = 0                   # times ranks were dropped while it ran: the survivors redo it (comm.World)
    since: float | None = None       # when its wait for the last finishers began (first finish, fall back, redo)
    members: int = 0                 # ranks of the group when it was decided (each contributes to every chunk)
    accounted: bool = False


class GroupRegistry:
    """Members
    -------
    groups : dict[int, GroupInfo]
    ops : dict[tuple[int, int], Collective]
        (group, op_seq) -> its collective.
    latest : dict[int, int]
        Group -> op_seq of its latest decided collective.
    quiet_since : dict[int, float]
        Group -> when its last collective finished on every rank.
    cleanups : list[int]
        Groups whose quota must be emptied (in order); each is in ``blocked`` until it is.
    dropped : list[tuple[float, int, int, str]]
        (time, group, rank, why) of every dropped rank.
    now : float
        The latest time a caller gave.
    """

    def __init__(self, events: list, on_done: Callable[[GroupInfo, Collective, float], None]):
        self.events, self.on_done = events, on_done
        self.groups: dict[int, GroupInfo] = {}
        self.ops: dict[tuple[int, int], Collective] = {}
        self.latest: dict[int, int] = {}
        self.quiet_since: dict[int, float] = {}
        self.cleanups: list[int] = []
        self.blocked: set[int] = set()
        self.dropped: list[tuple[float, int, int, str]] = []
        self.now = 0.0

    def tick(self, now: float) -> None:
        self.now = max(self.now, now)

    def forget(self, group_id: int) -> GroupInfo:
        """Remove a group and every trace of its collectives (its accounting stays in the totals)."""
        info = self.groups.pop(group_id)
        self.blocked.discard(group_id)
        self.cleanups = [g for g in self.cleanups if g != group_id]
        for key in [k for k in self.ops if k[0] == group_id]:
            del self.ops[key]
        for table in (self.quiet_since, self.latest):
            table.pop(group_id, None)
        return info

    # ------------------------------------------------------------ collectives
    def record(self, group_id: int, op_seq: int, decision: OffloadDecision, nbytes: int, now: float) -> Collective:
        op = Collective(decision, nbytes, started=now, members=len(self.groups[group_id].ranks))
        self.ops[(group_id, op_seq)] = op
        self.latest[group_id] = op_seq
        return op

    def op(self, group_id: int, op_seq: int) -> Collective:
        op = self.ops.get((group_id, op_seq))
        if op is None:
            raise ValueError(f"group {group_id} collective {op_seq}: not decided yet")
        return op

    def fell_back(self, group_id: int, op_seq: int) -> bool:
        op = self.ops.get((group_id, op_seq))
        return bool(op and op.fell_back)

    def all_finished(self, group_id: int, op_seq: int) -> bool:
        info = self.groups.get(group_id)
        if info is not None and op_seq < info.first_op:
            return True          # before a restart: every rank re-registered after it (adopt_group)
        op = self.ops.get((group_id, op_seq))
        return op is not None and info is not None and set(info.ranks) <= op.finished

    def op_epoch(self, group_id: int, op_seq: int) -> int:
        """How many times ranks were dropped from the collective while it ran (0: never): a rank running
        it at another epoch redoes it on the host ring among the group's ranks left (comm.World)."""
        op = self.ops.get((group_id, op_seq))
        return op.epoch if op is not None else 0

    def request_fallback(self, group_id: int, op_seq: int, rank: int, now: float, why: str) -> None:
        """A rank gave up on the switch for this collective: every rank moves it to the host ring."""
        self.tick(now)
        op = self.op(group_id, op_seq)
        if not op.fell_back:
            op.fell_back = True
            op.since = now if op.since is not None else None   # the ring restarts the finishers' wait
            self.events.append((now, f"group {group_id} collective {op_seq}: falls back to the host ring "
                                     f"(rank {rank}: {why})"))
            log.warning("group %d collective %d falls back to the host ring: rank %d %s", group_id, op_seq,
                        rank, why)

    def finished(self, rank: int, group_id: int, op_seq: int) -> None:
        info = self.groups.get(group_id)
        if info is None:
            raise ValueError(f"group {group_id}: no such group")
        if op_seq < info.first_op and (group_id, op_seq) not in self.ops:
            return               # decided before a restart: nothing of it is accounted here
        op = self.op(group_id, op_seq)
        if rank in info.dropped:
            return               # dropped as dead: it no longer counts (nor holds anyone)
        if rank not in info.ranks:
            raise ValueError(f"group {group_id}: rank {rank} is not a member")
        if rank in op.finished:
            return
        op.finished.add(rank)
        if op.since is None:
            op.since = self.now
        self.maybe_done(group_id, op)

    def maybe_done(self, group_id: int, op: Collective) -> None:
        """Once every rank of the group finished it: accounted (once), and the quota emptied when chunks
        may have been abandoned (a fall back) or the contributors change (ranks dropped)."""
        info = self.groups[group_id]
        if op.accounted or not set(info.ranks) <= op.finished:
            return
        op.accounted = True
        self.quiet_since[group_id] = self.now
        self.on_done(info, op, self.now)
        if (op.fell_back or info.rule_stale) and info.offloadable:
            self.schedule_cleanup(group_id)

    def schedule_cleanup(self, group_id: int) -> None:
        if group_id not in self.blocked:
            self.blocked.add(group_id)
            self.cleanups.append(group_id)

    def running(self):
        """(group, op_seq, collective) of every group's latest collective not finished on every rank."""
        for group_id, op_seq in list(self.latest.items()):
            op = self.ops[(group_id, op_seq)]
            if group_id in self.groups and not op.accounted:
                yield group_id, op_seq, op

    # ------------------------------------------------------------ dead ranks
    def drop_ranks(self, group_id: int, ranks, now: float, why: str, *, redo: bool,
                   rank_ports: list[int]) -> list[int]:
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
        info.ports = tuple(rank_ports[r] for r in info.ranks)
        for r in dead:
            info.dropped[r] = why
            self.dropped.append((now, group_id, r, why))
        info.rule_stale = info.offloadable
        latest = self.latest.get(group_id)
        op = self.ops.get((group_id, latest)) if latest is not None else None
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
            self.maybe_done(group_id, op)
        if op is None or op.accounted:
            self.schedule_cleanup(group_id)
        return dead
