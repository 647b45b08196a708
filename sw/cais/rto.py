"""Retransmission timeouts that follow the measured round trip (RFC 6298), shared by the engines.

The configured ``timeout_ms`` is the initial timeout, used until round trips have been measured. A
fixed timer is wrong both ways: under load the round trip through the switch grows (every rank's frames
queue behind each other in the one pipeline) and a short timer repeats frames that were never lost,
adding to the queue; when the switch is fast a long timer leaves a lost frame's window stalled for
nothing. So, as TCP does (RFC 6298): SRTT and RTTVAR are smoothed from round trips of frames sent once
(Karn's rule: a repeated frame's answer cannot be matched to one transmission), RTO = SRTT +
max(G, 4 RTTVAR) with G = ``SRTT * margin`` (where RFC 6298 has the clock granularity; 0 by default),
never below ``initial * floor`` (``floor`` 1: the timer only ever grows past the configured one; and not
below ``initial`` until ``warmup`` round trips were measured, since the first answers of a burst come
back faster than its last) nor above ``initial * ceiling``, and a frame's timeout doubles with each
retry, up to ``cap`` times the RTO and never above ``cap`` times the configured timeout (RFC 6298's upper
bound on the RTO); a backed-off RTO (below) is a frame's least timeout, not a factor of its doubling.

A timer that expires backs off the RTO itself, not only the repeated frame's own timeout (RFC 6298 5.5,
with Karn's algorithm: the backed-off RTO is kept until a frame sent once is answered). Without it, a
sender whose frames all wait in a queue longer than the RTO repeats every one of them, and no frame is
answered after one transmission, so no round trip is ever measured: the timer never learns the queue. The
host ring (cais.ring) backs off at most once per RTO. The switch engine does not: its recovery from random
loss is the timeout itself (a lost chunk holds its slot and every peer's window until it is repeated), and
backing off on every expiry doubled the time of `make sim ARGS="--loss 0.05 --duplicate 0.05 --reorder
0.05"` (1,164,436 -> 2,505,774 cycles with one doubling at most, 2,535,525 up to the ceiling). Nor does it
keep a chunk's own backoff until that chunk's result (tried: a chunk's repeats mostly wait for a peer's
loss, not its own, and one rank's long timer then stalls every peer's window: 4 ranks with 5% loss and
duplication took 4 to 8 times as long in tests/sw/test_allreduce_engine.py's loop). One case needs more
than Karn's rule: a path slower than the configured timeout from the start, where every chunk is repeated
before its answer and no round trip is ever measured (Verilated switches: round trips of 0.1-1 s against
the deployed 50 ms, docs/protocol.md 13.7). Once a whole window of results came only for repeated chunks
with no round trip measured yet, each such result's time since its chunk's first transmission is taken as a
sample (:meth:`RetransmitTimer.bound`: an upper bound, the round trip plus at most the repeats' timeouts),
and the RTO may from then on grow past the configured timeout, up to ``cap`` times it. A rank's next
collective on the same path starts from the last one's timer (:meth:`RetransmitTimer.adopt`; RFC 9040's
temporal sharing), not from the configured timeout again.

The margin G matters where the round trip is steady: a switch that serves a window of chunks at a fixed
rate answers each one after the same time, RTTVAR falls to nothing and SRTT + 4 RTTVAR to the round trip
itself, so any hiccup of the switch (a frame's worth) times out every chunk waiting; each repeat the switch
re-serves lengthens the queue, no chunk is then answered after one transmission, and the timer, without a
sample, stays where it was. The switch engine keeps an eighth of the round trip above it
(cais.allreduce.SWITCH_RTO_MARGIN: RFC 9002's time threshold, 9/8 of the round trip, for the same reason).
Measured on the Verilated leaf-spine tree (docs/protocol.md 13.7): a steady round trip of 14.75 us with
RTTVAR 0.01 us put the RTO 1.5 cycles above it, and the repeats made the default run 36 times slower; with
the margin (1.84 us) nothing is repeated. A stall longer than the margin still feeds the queue (a model
switch behind one generator that stalls 20 us once: 1,164 re-served results for 256 chunks; 5 us: 3,084, a
chunk repeated 19 times, the run 9 times as long), and what stops it costs the lossy runs more, measured on
`make sim ARGS="--loss 0.05 --duplicate 0.05 --reorder 0.05"` (1,173,835 cycles): upper bounds taken after
any window answered only after repeats (20 us: 256 re-served) made it 1,794,072; a duplicate result for a
repeated chunk taken as that chunk's round trip (RFC 3522's spurious-timeout detection; 20 us: 384)
2,213,947; the per-chunk backoff above, 4-8 times as long. So upper bounds are taken only while no round
trip was measured.

The bounds matter to a group: a round trip through the switch ends when the group's last contribution
arrives, so a rank's measured round trips include its peers' retransmission waits. With 10% loss on 8
ranks most chunks wait for some peer's repeat, every rank's samples hold the others' timeouts, and the
timers feed each other until they reach the bound (without one: seconds, while the peers that wait for
a silent rank give up). The switch engine (cais.allreduce) therefore uses ``ceiling`` 1: measured round
trips only shorten its timer, the configured timeout is the longest one a lossy group repeats at (unless
no round trip could be measured at all: above).
"""

from __future__ import annotations

__all__ = ["RetransmitTimer"]

ALPHA, BETA, K = 1 / 8, 1 / 4, 4   # RFC 6298's gains


class RetransmitTimer:
    def __init__(self, initial_s: float, cap: int = 64, floor: float = 1.0, warmup: int = 0,
                 ceiling: float | None = None, margin: float = 0.0):
        if not initial_s > 0:
            raise ValueError(f"initial timeout {initial_s}: must be positive")
        if not margin >= 0:
            raise ValueError(f"RTO margin {margin}: must not be negative")
        self.initial_s, self.cap, self.floor, self.warmup, self.margin = initial_s, cap, floor, warmup, margin
        self.ceiling_factor = float(cap if ceiling is None else ceiling)
        if not floor <= self.ceiling_factor:
            raise ValueError(f"RTO floor {floor} above its ceiling {self.ceiling_factor}")
        self.samples = 0
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.backoffs = 0                  # doublings of the RTO since the last sample
        self.bounds = 0                    # upper-bound samples taken (bound)
        self._update()

    def sample(self, rtt: float) -> None:
        """A round trip of a frame that was sent once."""
        self.samples += 1
        self.backoffs = 0
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = (1 - BETA) * self.rttvar + BETA * abs(self.srtt - rtt)
            self.srtt = (1 - ALPHA) * self.srtt + ALPHA * rtt
        self._update()

    def bound(self, rtt: float) -> None:
        """An upper bound of the round trip: a repeated frame's answer timed from its first transmission,
        taken when no frame sent once was answered for a whole window (Karn's rule then leaves the timer
        nothing to learn from). Taken as a sample. If no round trip had been measured before, the configured
        timeout is shorter than the path's first round trip: the ceiling is lifted to the cap (RFC 6298's
        upper bound) from then on."""
        self.bounds += 1
        if self.srtt is None:
            self.ceiling_factor = float(self.cap)
        self.sample(rtt)

    def adopt(self, other: "RetransmitTimer") -> None:
        """Start from what `other` measured on the same path (its last collective's timer): SRTT, RTTVAR,
        the samples' count and a lifted ceiling, as TCP starts a connection from the round trips cached for
        its destination (RFC 9040's temporal sharing)."""
        if other.srtt is not None:
            self.srtt, self.rttvar, self.samples = other.srtt, other.rttvar, other.samples
        self.ceiling_factor = max(self.ceiling_factor, other.ceiling_factor)
        self._update()

    def back_off(self) -> None:
        """A timer expired: double the RTO until the next sample (never past the ceiling)."""
        if self.rto < self.initial_s * self.ceiling_factor:
            self.backoffs += 1
            self._update()

    def _update(self) -> None:
        """Recompute :attr:`measured` and :attr:`rto` from the state (called by every method that changes
        it: the engines read them for every frame, the state changes far less often). A sample per result
        runs it, so the bounds are applied with comparisons: Python 3.11's builtin min and max cost about ten
        times as much per call."""
        if self.srtt is None:
            base = self.initial_s
        else:
            margin, spread = self.srtt * self.margin, K * self.rttvar
            base = self.srtt + (margin if margin >= spread else spread)     # SRTT + max(G, K * RTTVAR)
            least = self.initial_s * (self.floor if self.samples >= self.warmup else 1.0)
            if base < least:
                base = least
        ceiling = self.initial_s * self.ceiling_factor
        #: The RTO the round trips say, within the floor and the ceiling, without the backoff.
        self.measured = base if base < ceiling else ceiling
        #: The RTO: :attr:`measured` doubled per backoff, never past the ceiling.
        rto = self.measured * 2 ** self.backoffs
        self.rto = rto if rto < ceiling else ceiling

    @property
    def longest(self) -> float:
        """The longest timeout this timer ever gives."""
        return self.initial_s * self.cap

    def timeout(self, retries: int) -> float:
        """How long to wait for the answer to a frame sent `retries` times before: the measured RTO doubled
        per retry, or the backed-off RTO if that is longer (the two doublings do not compound)."""
        return min(self.longest, max(self.rto, self.measured * min(self.cap, 2 ** retries)))
