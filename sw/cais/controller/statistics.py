"""Statistics: the controller's accounting and what it reads from the switch's counters.

Contract: :class:`Statistics` accounts every collective once, when every rank of its group finished it
(per group, and totals by path: ``switch`` reduced there, ``fallback`` offloaded then redone on the
host ring, ``host`` decided for the host ring), keeps the recent collective latencies, and at each
:meth:`evaluate` turns the switch's counters into 64-bit running totals (:class:`CounterExtender`),
builds the statistics dict (:meth:`stats`, ``cais-cli show-stats``, /v1/stats) and updates the alerts.
Bytes are exact: each offloaded chunk that does not fall back completes once in the switch with one
contribution per member. Every total only grows, so Prometheus' ``rate()`` works on it.
"""

from __future__ import annotations

import logging

from ..allreduce import chunk_count
from ..monitor import Alert, Samples
from ..protocol import DropReason
from ..registers import REGISTER_BITS, Kind, RegisterMap
from .policy import MEMORY_PRESSURE, OffloadPolicy
from .registry import Collective, GroupInfo, GroupRegistry

__all__ = ["Statistics", "CounterExtender", "COLLECTIVE_PATHS", "FALLBACK_WARNING"]

log = logging.getLogger("cais.controller")

FALLBACK_WARNING = 0.10     # warn above this fallback ratio
COLLECTIVE_PATHS = ("switch", "fallback", "host")   # where a finished collective ran (the label ``path``)


class CounterExtender:
    """The switch's counters are REGISTER_BITS wide and wrap; this keeps 64-bit (unbounded) totals by
    adding the modular difference between two reads. It is exact while no counter advances by
    2**REGISTER_BITS or more between two reads (the controller reads them every
    ``reevaluate_interval_ms``: 4 GiB of one port's bytes in 100 ms would be 340 Gbit/s).

    The first read of a counter is taken as its total (a controller restarted with ``--recover`` goes
    on from what the switch counted); :meth:`rebase` after a switch reset, whose counters restart at 0.
    """

    def __init__(self, regs: RegisterMap, bits: int = REGISTER_BITS):
        self.names = {r.name for r in regs if r.kind is Kind.COUNTER}
        self.modulus = 1 << bits
        self.last: dict[tuple[str, int], int] = {}
        self.total: dict[tuple[str, int], int] = {}

    def _extend(self, key: tuple[str, int], raw: int) -> int:
        last = self.last.get(key)
        self.total[key] = raw if last is None else self.total[key] + (raw - last) % self.modulus
        self.last[key] = raw
        return self.total[key]

    def extend(self, counters: dict) -> dict:
        """``counters`` (the shape of :func:`cais.registers.read_counters`) with every COUNTER extended;
        levels as read."""
        out = {}
        for name, value in counters.items():
            if name not in self.names:
                out[name] = value
            elif isinstance(value, list):
                out[name] = [self._extend((name, i), v) for i, v in enumerate(value)]
            else:
                out[name] = self._extend((name, 0), value)
        return out

    def rebase(self) -> None:
        """The switch was reset: every counter restarts from 0 (the totals go on)."""
        self.last = {k: 0 for k in self.last}


class Statistics:
    """Members
    -------
    latency : Samples
        Collective latency, s: first decision to the last rank's finished.
    alerts : dict[str, Alert]
        ``sram_pressure`` and ``fallback_ratio``.
    collectives, bytes : dict[str, int]
        Finished collectives and their wire bytes, by path (COLLECTIVE_PATHS).
    counters : dict
        The switch's counters at the last evaluation, extended to 64 bits.
    """

    def __init__(self, regs: RegisterMap, params, policy: OffloadPolicy, registry: GroupRegistry, events: list):
        self.regs, self.params, self.policy, self.registry, self.events = regs, params, policy, registry, events
        self.latency = Samples()
        self.alerts = {"sram_pressure": Alert("sram_pressure", MEMORY_PRESSURE, "slot sets in use"),
                       "fallback_ratio": Alert("fallback_ratio", FALLBACK_WARNING, "fallback ratio")}
        self.collectives = dict.fromkeys(COLLECTIVE_PATHS, 0)
        self.bytes = dict.fromkeys(COLLECTIVE_PATHS, 0)
        self.extender = CounterExtender(regs)
        self.counters: dict = {}
        self._stats: dict = {}

    def account(self, info: GroupInfo, op: Collective, now: float) -> None:
        """A collective every rank of its group finished (the registry calls this once per collective)."""
        self.latency.add(max(0.0, now - op.started))
        path = "host" if not op.decision.offload else "fallback" if op.fell_back else "switch"
        self.collectives[path] += 1
        self.bytes[path] += op.nbytes
        info.collectives += 1
        info.offloaded += op.decision.offload
        info.fell_back += op.fell_back
        if path == "switch":
            kind = op.decision.kind
            chunks = chunk_count(op.nbytes // kind.itemsize, kind.itemsize, op.decision.chunk_bytes)
            info.completions += chunks
            info.contributions += chunks * op.members
            info.bytes_reduced += op.nbytes

    def evaluate(self, now: float, raw: dict, slots_allocated: int) -> dict:
        """The statistics from the counters just read (`raw`, as the registers read), alerts updated."""
        counters = self.counters = self.extender.extend(raw)
        in_use = counters["SLOTS_IN_USE"] / (2 * self.params.slots)
        offloaded = [op for op in self.registry.ops.values() if op.decision.offload]
        fallback_ratio = sum(op.fell_back for op in offloaded) / len(offloaded) if offloaded else 0.0
        rtts = self.policy.rtts
        self._stats = {
            "time_s": now,
            "sram_usage": in_use,
            "sram_allocated": slots_allocated / self.params.slots,
            "avg_queue_delay_s": self.policy.queue_delay_s(),
            "min_rtt_s": min(rtts) if rtts else None,
            "bytes_reduced": self.bytes["switch"],
            "collectives_by_path": dict(self.collectives),
            "bytes_by_path": dict(self.bytes),
            "decisions": {f"{path}/{code}": n for (path, code), n in sorted(self.policy.tally.items())},
            "queue_delay_s": self.policy.queue_delay.summary(),
            "collective_latency_s": self.latency.summary(),
            "fallback_ratio": fallback_ratio,
            "collectives": len(self.registry.ops),
            "offloaded": len(offloaded),
            "threshold": self.policy.threshold,
            "sets_aged": counters["AGED_TOTAL"],
            "aged_events_lost": counters["AGED_LOST"],
            "ranks_dropped": len(self.registry.dropped),
            "drops": {r.name: counters[f"DROP_{r.name}"] for r in DropReason},
            "ports": [{"rx_frames": counters["RX_FRAMES"][p], "rx_bytes": counters["RX_BYTES"][p],
                       "tx_frames": counters["TX_FRAMES"][p], "tx_bytes": counters["TX_BYTES"][p]}
                      for p in range(self.params.ports)],
            "counters": counters,
        }
        message = self.policy.adapt(in_use)
        if message:
            self.events.append((now, message))
        for alert, value in ((self.alerts["sram_pressure"], in_use), (self.alerts["fallback_ratio"], fallback_ratio)):
            msg = alert.update(value)
            if msg:
                self.events.append((now, msg))
                (log.warning if alert.active else log.info)(msg)
        self._stats["alerts"] = [a.as_dict() for a in self.alerts.values()]
        return self._stats

    def group_counters(self, info: GroupInfo, retype_pending: bool) -> dict:
        """The accounting of one group, its quota and, from the switch's counters of the last evaluation,
        its sets in use (SETS_IN_USE of its rule entry: the non-empty sets of the slots its frames wrote
        last) and its sets aged (AGED of its rule entry)."""
        g = info
        entry = self.counters.get("SETS_IN_USE"), self.counters.get("AGED")
        in_use, aged = ((e[g.rule_index] if e is not None and g.rule_index is not None else 0) for e in entry)
        return {"group_id": g.group_id, "ranks": list(g.ranks), "ports": list(g.ports), "rule_index": g.rule_index,
                "base": g.base, "slots": g.slot_count if g.base is not None else 0, "why_not": g.why_not,
                "host_reason": g.host_reason.value if g.host_reason else None,
                "sets_in_use": in_use, "sets_allocated": 2 * g.slot_count if g.base is not None else 0,
                "kind": str(g.kind), "collectives": g.collectives, "offloaded": g.offloaded,
                "fell_back": g.fell_back, "completions": g.completions, "contributions": g.contributions,
                "bytes_reduced": g.bytes_reduced, "next_seq": g.next_seq,
                "retype_pending": retype_pending, "sets_aged": aged,
                "dropped": {str(r): why for r, why in sorted(g.dropped.items())}}

    def stats(self) -> dict:
        return dict(self._stats)

