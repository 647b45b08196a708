"""Retransmission timeouts that follow the measured round trip (RFC 6298), shared by the engines.

The configured ``timeout_ms`` is the initial timeout, used until round trips have been measured. A
fixed timer is wrong both ways: under load the round trip through the switch grows (every rank's frames
queue behind each other in the one pipeline) and a short timer repeats frames that were never lost,
adding to the queue; when the switch is fast a long timer leaves a lost frame's window stalled for
nothing. So, as TCP does (RFC 6298): SRTT and RTTVAR are smoothed from round trips of frames sent once
(Karn's rule: a repeated frame's answer cannot be matched to one transmission), RTO = SRTT + 4 RTTVAR,
never below ``initial * floor`` (``floor`` 1: the timer only ever grows past the configured one; and
not below ``initial`` until ``warmup`` round trips were measured, since the first answers of a burst
come back faster than its last), and a frame's timeout doubles with each retry, up to ``cap`` times the
RTO.
"""

from __future__ import annotations

__all__ = ["RetransmitTimer"]

ALPHA, BETA, K = 1 / 8, 1 / 4, 4   # RFC 6298's gains


class RetransmitTimer:
    def __init__(self, initial_s: float, cap: int = 64, floor: float = 1.0, warmup: int = 0):
        if not initial_s > 0:
            raise ValueError(f"initial timeout {initial_s}: must be positive")
        self.initial_s, self.cap, self.floor, self.warmup = initial_s, cap, floor, warmup
        self.samples = 0
        self.srtt: float | None = None
        self.rttvar = 0.0

    def sample(self, rtt: float) -> None:
        """A round trip of a frame that was sent once."""
        self.samples += 1
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = (1 - BETA) * self.rttvar + BETA * abs(self.srtt - rtt)
            self.srtt = (1 - ALPHA) * self.srtt + ALPHA * rtt

    @property
    def rto(self) -> float:
        if self.srtt is None:
            return self.initial_s
        floor = self.floor if self.samples >= self.warmup else 1.0
        return max(self.initial_s * floor, self.srtt + K * self.rttvar)

    def timeout(self, retries: int) -> float:
        """How long to wait for the answer to a frame sent `retries` times before."""
        return self.rto * min(self.cap, 2 ** retries)
