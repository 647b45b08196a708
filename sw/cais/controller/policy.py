"""The offload policy: for one collective, the switch or the host ring, and why.

Contract: :meth:`OffloadPolicy.choose` is a pure function of the collective (size, ranks, kind), the
group (has it a quota and a rule?), what the switch reported (FEATURES, the round trips the ranks
measured) and the configuration; it returns an :class:`OffloadDecision` that carries its score, the
threshold in force, a reason code from the fixed set :class:`Reason` (the label of
``cais_offload_decisions_total``) and a sentence for people. It writes no register; the controller
gives the decision its sequence numbers.

The score, for a collective of D bytes over N ranks (docs/driver.md)::

    BW        link bandwidth, bytes/s (data_width / 8 x clock)
    a         one-way latency through the switch, s (min round trip / 2, measured; a default before)
    Q         queueing delay in the switch, s: the average round trip of the first chunk of the recent
              collectives minus the smallest (what a collective meets when it starts)
    T_hosts   = 2 (N - 1) (a + D / (N BW))          the ring: 2(N-1) steps of D/N bytes
    T_switch  = 2 a + D / BW + Q                     one round trip carrying D bytes
    score     = (1 - T_switch / T_hosts) x (1 - 1/N) time saved, weighted by the traffic saved
    offload when score > threshold (offload_threshold, raised under memory pressure)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..allreduce import CollectiveKind, chunk_payload
from ..config import Config
from ..monitor import Samples
from ..params import SwitchParams
from ..protocol import supported_dtypes

__all__ = ["OffloadDecision", "OffloadPolicy", "Reason", "offload_score", "PATHS", "decision_line",
           "MEMORY_PRESSURE", "THRESHOLD_STEP", "THRESHOLD_CAP", "DRAIN_TIMEOUTS"]

MEMORY_PRESSURE = 0.80      # sets in use above this fraction raise the threshold
THRESHOLD_STEP = 0.05
THRESHOLD_CAP = 0.95
DRAIN_TIMEOUTS = 2          # a retype goes on this many round trips (or initial timeouts) after the group's last frame
PATHS = ("switch", "host")  # where a decision sends a collective (the label ``path``)


class Reason(str, enum.Enum):
    """Why a collective goes where it goes: a fixed set (metric labels never carry free text)."""
    SCORE_ABOVE = "score_above_threshold"     # switch: the score beats the threshold
    SCORE_BELOW = "score_below_threshold"     # host: it does not
    ALWAYS = "offload_always"                 # switch: offload = "always"
    NEVER = "offload_never"                   # host: offload = "never"
    NO_RULE = "no_rule_entry"                 # host: the rule table was full when the group was made
    NO_SLOTS = "no_slots"                     # host: no slots left under sram_usage_limit
    RESTARTED = "host_only_before_restart"    # host: the group had no quota before a controller restart
    DTYPE = "dtype_not_reduced"               # host: this switch does not reduce the element type
    CAPACITY = "set_too_small"                # host: a set holds less than one element of the kind

    @property
    def path(self) -> str:
        return "switch" if self in (Reason.SCORE_ABOVE, Reason.ALWAYS) else "host"


@dataclass
class OffloadDecision:
    """Where one collective runs, with what decided it (the same answer for every rank)."""
    offload: bool
    score: float
    threshold: float
    reason: str                # a sentence for people
    code: Reason = Reason.SCORE_BELOW
    seq_base: int = 0          # offloaded: seq_num of the collective's first chunk
    chunk_bytes: int = 0       # offloaded: payload of a full chunk (chunk_size cut to the set capacity)
    kind: CollectiveKind = CollectiveKind()
    nbytes: int = 0            # the collective's size on the wire
    ranks: int = 0             # ranks of the group when it was decided

    @property
    def path(self) -> str:
        return "switch" if self.offload else "host"

    def as_dict(self) -> dict:
        """The JSON form the ranks and cais-cli get."""
        return {"offload": self.offload, "path": self.path, "code": self.code.value, "reason": self.reason,
                "score": self.score, "threshold": self.threshold, "seq_base": self.seq_base,
                "chunk_bytes": self.chunk_bytes, "nbytes": self.nbytes, "ranks": self.ranks, "kind": str(self.kind)}


def offload_score(nbytes: int, ranks: int, bandwidth: float, latency: float, queue_delay: float) -> float:
    """The score of the module docstring (dimensionless; higher favours the switch)."""
    if ranks < 2:
        return 0.0
    t_hosts = 2 * (ranks - 1) * (latency + nbytes / (ranks * bandwidth))
    t_switch = 2 * latency + nbytes / bandwidth + queue_delay
    return (1 - t_switch / t_hosts) * (1 - 1 / ranks)


class OffloadPolicy:
    """The score's inputs, the threshold and the decisions' tally (module docstring).

    Members
    -------
    threshold : float
        In force now: ``offload_threshold``, raised by :meth:`adapt` under memory pressure.
    float_units, reproducible : bool
        What the switch's FEATURES register says (the controller reads it at start).
    queue_delay : Samples
        First-chunk round trip minus the smallest, s (every reported round trip).
    tally : dict[tuple[str, str], int]
        Decisions by (path, reason code) since start.
    """

    def __init__(self, params: SwitchParams, clock_hz: float, config: Config):
        self.params, self.clock_hz, self.config = params, clock_hz, config
        self.threshold = config.offload_threshold
        self.float_units = bool(params.float_units)
        self.reproducible = True
        self.rtts: list[float] = []
        self.queue_delay = Samples()
        self.tally: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------ the score's inputs
    def bandwidth(self) -> float:
        return self.params.data_width / 8 * self.clock_hz

    def latency(self) -> float:
        if self.rtts:
            return min(self.rtts) / 2
        # before any measurement: a frame of max payload in and out, plus the pipeline
        beats = -(-(self.params.max_payload + 30) // self.params.beat_bytes)
        return (2 * beats + 10) / self.clock_hz

    def queue_delay_s(self) -> float:
        if not self.rtts:
            return 0.0
        return sum(self.rtts) / len(self.rtts) - min(self.rtts)

    def report_rtts(self, rtts: list[float]) -> None:
        for rtt in rtts:
            if not rtt >= 0.0:              # also NaN
                raise ValueError(f"round trip {rtt!r}: must be a number >= 0")
        self.rtts.extend(float(r) for r in rtts)
        del self.rtts[:-4096]
        low = min(self.rtts) if self.rtts else 0.0
        for rtt in rtts:
            self.queue_delay.add(rtt - low)

    def drain_time(self) -> float:
        """How long after a group's last collective no frame of it can still be in the switch: DRAIN_TIMEOUTS
        x the longer of the initial retransmission timeout and the longest recent round trip (a frame's
        time in the switch is part of its round trip)."""
        return DRAIN_TIMEOUTS * max([self.config.timeout_s] + self.rtts[-256:])

    # ------------------------------------------------------------ what the switch reduces
    @property
    def dtypes(self):
        """The element types this switch reduces (FEATURES.float_units)."""
        return supported_dtypes(self.float_units)

    def capacity(self, kind: CollectiveKind) -> int:
        """Payload bytes a set of a rule of this kind holds: ``max_payload`` for every kind (each port's
        contribution has a bank of its own, docs/core-design.md), but 0 for a reproducible kind when
        FEATURES.reproducible is 0, whatever the configured parameters say."""
        if kind.reproducible and not self.reproducible:
            return 0
        return self.params.max_payload

    def why_not_offloadable(self, kind: CollectiveKind) -> tuple[Reason | None, str]:
        """Why this switch cannot reduce collectives of `kind`: (code, sentence), or (None, "")."""
        if kind.dtype not in self.dtypes:
            return Reason.DTYPE, (f"{kind.dtype.name.lower()}: this switch has no float units (FEATURES.float_units = 0)"
                                  if kind.is_float else f"{kind.dtype.name.lower()}: not reduced by this switch")
        if chunk_payload(self.config.chunk_size, self.capacity(kind), kind.itemsize) < kind.itemsize:
            no_fold = kind.reproducible and not self.reproducible
            return Reason.CAPACITY, (f"{kind}: a set of this switch holds {self.capacity(kind)} bytes of payload, "
                                     f"less than one element" + (" (FEATURES.reproducible = 0)" if no_fold else ""))
        return None, ""

    # ------------------------------------------------------------ the decision
    def choose(self, nbytes: int, ranks: int, kind: CollectiveKind, host_reason: Reason | None,
               why_host: str) -> OffloadDecision:
        """The decision for a collective of `nbytes` over `ranks` of `kind`, in a group that runs on the
        hosts for `host_reason` (None: it has a quota and a rule). Counted in :attr:`tally`."""
        code, text = (host_reason, f"host only: {why_host}") if host_reason is not None else (None, "")
        score = 0.0
        if code is None:
            code, why = self.why_not_offloadable(kind)
            text = f"host only: {why}"
        if code is None:
            score = offload_score(nbytes, ranks, self.bandwidth(), self.latency(), self.queue_delay_s())
            if self.config.offload == "auto":
                code = Reason.SCORE_ABOVE if score > self.threshold else Reason.SCORE_BELOW
                text = (f"score {score:.3f} {'>' if code is Reason.SCORE_ABOVE else '<='} threshold "
                        f"{self.threshold:.3f} ({self.explain(nbytes, ranks)})")
            else:
                code = Reason.ALWAYS if self.config.offload == "always" else Reason.NEVER
                text = f"offload={self.config.offload} (score {score:.3f})"
        decision = OffloadDecision(code.path == "switch", score, self.threshold, text, code, kind=kind,
                                   nbytes=nbytes, ranks=ranks)
        key = (decision.path, code.value)
        self.tally[key] = self.tally.get(key, 0) + 1
        return decision

    def explain(self, nbytes: int, ranks: int) -> str:
        """The score's inputs in a few words: what a person needs to see why it is what it is."""
        bw, a, q = self.bandwidth(), self.latency(), self.queue_delay_s()
        t_hosts = 2 * (ranks - 1) * (a + nbytes / (ranks * bw))
        t_switch = 2 * a + nbytes / bw + q
        measured = f"measured over {len(self.rtts)} round trips" if self.rtts else "not measured yet"
        return (f"{nbytes} B over {ranks} ranks: T_switch {t_switch * 1e6:.1f} us vs T_hosts {t_hosts * 1e6:.1f} us; "
                f"latency {a * 1e6:.2f} us and queueing {q * 1e6:.2f} us {measured}")

    def adapt(self, in_use: float) -> str | None:
        """Raise the threshold a step while more than MEMORY_PRESSURE of the sets are in use, lower it a
        step back towards ``offload_threshold`` otherwise; the change in words, or None."""
        if in_use > MEMORY_PRESSURE:
            new = min(THRESHOLD_CAP, self.threshold + THRESHOLD_STEP)
        else:
            new = max(self.config.offload_threshold, self.threshold - THRESHOLD_STEP)
        if new == self.threshold:
            return None
        message = f"threshold {self.threshold:.2f} -> {new:.2f} (slot sets in use {in_use:.0%})"
        self.threshold = new
        return message


def decision_line(rank: int, group_id: int, op_seq: int, d: dict) -> str:
    """How a rank logs (INFO) the decision it got, in its JSON form (:meth:`OffloadDecision.as_dict`)."""
    return (f"rank {rank}: group {group_id} collective {op_seq} ({d['nbytes']} B) -> {d['path']} [{d['code']}] "
            f"score {d['score']:.3f} threshold {d['threshold']:.3f}: {d['reason']}")
