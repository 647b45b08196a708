"""The control plane: programs the switch, watches it, and decides what to offload.

A package of small parts, each with its contract in its docstring, composed by :class:`Controller`:

- :mod:`.switch` -- the link and the register map, writes applied in order;
- :mod:`.rulebook` -- rule entries and slot quotas under ``slots_per_group`` and ``sram_usage_limit``,
  operator rules (:class:`RuleConflict`);
- :mod:`.registry` -- groups, ranks, their collectives, who finished, dropped ranks, pending cleanups;
- :mod:`.policy` -- the offload score, the threshold and each :class:`OffloadDecision` with its reason
  code (:class:`Reason`);
- :mod:`.aging` -- dead ranks from the switch's aged sets and from unfinished collectives;
- :mod:`.statistics` -- accounting by group and by path, 64-bit counters, alerts;
- :mod:`.core` -- :class:`Controller`, the flows across them (decide, service, resets, retypes).
"""

from ..allreduce import CollectiveKind
from .core import Controller
from .policy import (DRAIN_TIMEOUTS, MEMORY_PRESSURE, THRESHOLD_CAP, THRESHOLD_STEP, OffloadDecision, OffloadPolicy,
                     Reason, offload_score, decision_line)
from .registry import Collective, GroupInfo, GroupRegistry
from .rulebook import RuleBook, RuleConflict
from .statistics import FALLBACK_WARNING, CounterExtender, Statistics
from .aging import AGING_CHECKS, AgingWatcher

__all__ = ["Controller", "GroupInfo", "OffloadDecision", "Reason", "CollectiveKind", "offload_score", "RuleConflict",
           "OffloadPolicy", "GroupRegistry", "Collective", "RuleBook", "Statistics", "CounterExtender", "AgingWatcher", "decision_line",
           "DRAIN_TIMEOUTS", "MEMORY_PRESSURE", "THRESHOLD_CAP", "THRESHOLD_STEP", "FALLBACK_WARNING", "AGING_CHECKS"]
