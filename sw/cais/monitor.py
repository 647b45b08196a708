"""Monitoring pieces of the controller that need nothing but the standard library: a window of samples
with exact quantiles, and alerts that fire once when a threshold is crossed and clear once when back.

The Prometheus side (histograms with buckets, the text endpoint) is :mod:`cais.service`; these are what
``stats()`` and ``cais-cli show-stats`` print (P50 / P99 of the recent samples, exact, not interpolated
from buckets).
"""

from __future__ import annotations

import collections
import math

__all__ = ["Samples", "Alert", "quantile"]


def quantile(values, q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of `values`: the smallest value with at least q of the
    values at or below it; None for no values."""
    data = sorted(values)
    if not data:
        return None
    return data[max(0, math.ceil(q * len(data)) - 1)]


class Samples:
    """The last `window` samples of one quantity, and how many were ever added.

    Members
    -------
    count : int
        Samples added since start (the window keeps the last ``window`` of them).
    total : float
        Their sum.
    listeners : list
        Called with every new sample (the service's Prometheus histograms).
    """

    def __init__(self, window: int = 4096):
        self._values: collections.deque[float] = collections.deque(maxlen=window)
        self.count = 0
        self.total = 0.0
        self.listeners: list = []

    def add(self, value: float) -> None:
        self._values.append(float(value))
        self.count += 1
        self.total += float(value)
        for listener in self.listeners:
            listener(float(value))

    def __len__(self) -> int:
        return len(self._values)

    def quantile(self, q: float) -> float | None:
        return quantile(self._values, q)

    def summary(self) -> dict:
        """count, p50, p99, max of the window (None when empty)."""
        return {"count": self.count, "p50": self.quantile(0.50), "p99": self.quantile(0.99),
                "max": max(self._values) if self._values else None}


class Alert:
    """A threshold on one quantity: :meth:`update` returns a message the first time the value goes above
    `threshold` and the first time it is back at or below, None otherwise (no repeats while it stays).

    Members
    -------
    name : str
    threshold : float
    active : bool
        Above the threshold at the last update.
    fired, cleared : int
        How often it fired and cleared.
    """

    def __init__(self, name: str, threshold: float, what: str):
        self.name, self.threshold, self.what = name, threshold, what
        self.active = False
        self.fired = self.cleared = 0
        self.value: float | None = None

    def update(self, value: float) -> str | None:
        self.value = value
        if not self.active and value > self.threshold:
            self.active, self.fired = True, self.fired + 1
            return f"ALERT {self.name}: {self.what} {value:.0%} exceeds {self.threshold:.0%}"
        if self.active and value <= self.threshold:
            self.active, self.cleared = False, self.cleared + 1
            return f"CLEARED {self.name}: {self.what} {value:.0%} back at or below {self.threshold:.0%}"
        return None

    def as_dict(self) -> dict:
        return {"name": self.name, "threshold": self.threshold, "active": self.active, "value": self.value,
                "fired": self.fired, "cleared": self.cleared}
