"""The numpy reference model behind a simple time model: the link for the driver without a simulator.

Imports nothing of amaranth or cocotb (numpy only), so the driver and the model install and run alone.
"""

from __future__ import annotations

import heapq
from typing import Any, Awaitable, Callable

from cais.link import DEFAULT_CLOCK_HZ, run_sync
from cais.params import SwitchParams
from cais.protocol import Flags, OpType, parse_frame

from ..refmodel import SwitchModel
from ..timing import FORWARD_LATENCY as SWITCH_FORWARD_LATENCY, documented_latency
from .base import LinkBase, Received, Sent, check_frame

__all__ = ["ModelLink", "run_model", "SIMULATOR_ONLY_OPTIONS"]


def _beats(nbytes: int, beat_bytes: int) -> int:
    return max(1, -(-nbytes // beat_bytes))


class ModelLink(LinkBase):
    """The reference model behind a time model; every method returns without suspending.

    Time model (approximate, deterministic; close to the RTL's store-and-forward pipeline):

    * Ingress: each port is a wire of one beat per cycle. A frame sent at cycle ``c`` starts when the
      port's earlier frames have gone (not before ``c``) and has fully arrived ``beats`` cycles later.
    * Lanes: each port's frames are decided in order of full arrival (ties: lower port first, then order
      of sending; the model's ``receive`` runs then, so registers read afterwards see its effect) and
      streamed by the port's lane, one beat per cycle: a frame starts when it has arrived and the lane
      finished the port's previous frame. Ports do not wait for each other (docs/interface.md).
    * Egress: a forwarded frame's first beat leaves ``FORWARD_LATENCY`` cycles after its lane started it
      (the RTL's :data:`cais.hdl.latency.FORWARD_LATENCY` from its last beat in, for a lone frame);
      a result's (or a tree leaf's partial's) first beat leaves docs/interface.md's result latency
      (:func:`cais.sim.timing.documented_latency`) after the completing frame's last beat, plus the cycles
      that frame waited for its lane; either waits for the egress port's previous frame only (each port
      sends its results and forwarded frames on its own, docs/core-design.md section 5: no frame waits for
      another port). An output frame is received once its last beat has left (``+ beats``).
    * Registers: each access takes ``reg_cycles`` cycles (the RTL's AXI4-Lite takes about as many).

    Work is done lazily: whenever the link is used, every frame decided by ``cycle`` is processed first,
    so the outcome does not depend on how ``advance`` calls are split.
    """

    #: Cycles from a frame's start in its lane (the cycle after its last beat, when the lane is free) to its
    #: first beat out when forwarded: the switch's forward latency counts from the last beat.
    FORWARD_LATENCY = SWITCH_FORWARD_LATENCY - 1

    def __init__(self, params: SwitchParams = SwitchParams(), clock_hz: float = DEFAULT_CLOCK_HZ, *,
                 reg_cycles: int = 4, model: SwitchModel | None = None):
        super().__init__(params, clock_hz)
        self.model = model if model is not None else SwitchModel(params)
        self.reg_cycles = reg_cycles
        self._cycle = 0
        self._seq = 0                                   # tie-breaker: order of sending / emitting
        self._wire_free = [0] * params.ports            # cycle each ingress wire is free again
        self._egress_free = [0] * params.ports          # cycle each egress wire is free again
        self._lane_free = [0] * params.ports            # cycle each lane finished its last frame
        self._arrivals: list[tuple] = []        # heap: (arrived, port, seq, frame, (bad_keep, bad_fcs))
        self._out: list[tuple] = []             # heap: (delivered, port, seq, first beat, frame)
        self._sent: list[Sent] = []             # ingress stamps, handed out once in the past

    @property
    def cycle(self) -> int:
        return self._cycle

    def send(self, port: int, frame: bytes, *, bad_keep: bool = False, bad_fcs: bool = False,
             not_before: int = 0) -> None:
        self.check_port(port)
        frame = check_frame(frame, self.params.beat_bytes, bad_keep)
        start = max(self._cycle, self._wire_free[port], int(not_before))
        end = start + _beats(len(frame), self.params.beat_bytes)
        self._wire_free[port] = end
        heapq.heappush(self._arrivals, (end, port, self._seq, frame, (bad_keep, bad_fcs)))
        self._sent.append(Sent(port, start, end - 1))
        self._seq += 1

    def _next_done(self) -> int | None:
        """The cycle the next arrived frame is decided (None: nothing arrives)."""
        return self._arrivals[0][0] if self._arrivals else None

    def _process(self) -> None:
        B = self.params.beat_bytes
        while self._arrivals and self._arrivals[0][0] <= self._cycle:
            arrived, port, _, frame, (bad_keep, bad_fcs) = heapq.heappop(self._arrivals)
            self.model.advance_to(arrived)          # the model's clock (set aging) follows the link's
            start = max(arrived, self._lane_free[port])
            self._lane_free[port] = start + _beats(len(frame), B)
            for out_port, data in self.model.receive(port, frame, framing_ok=not bad_keep, fcs_ok=not bad_fcs):
                hdr = parse_frame(data).cais
                # a result, or a tree leaf's partial (the only all-reduce frame a switch sends that is not
                # a result): folded from the banks first
                if hdr is not None and (hdr.flags & Flags.RESULT or hdr.op_type == OpType.ALL_REDUCE):
                    ready = start - 1 + documented_latency(self.params, hdr.payload_len)
                else:
                    ready = start + self.FORWARD_LATENCY
                first = max(ready, self._egress_free[out_port])
                last = first + _beats(len(data), B)
                self._egress_free[out_port] = last
                heapq.heappush(self._out, (last, out_port, self._seq, first, data))
                self._seq += 1
        self.model.advance_to(self._cycle)

    def next_event(self) -> int | None:
        """The next cycle after ``cycle`` at which a frame is decided or finishes leaving the switch (None:
        nothing is on its way). Frames sent later can only add events; a fabric of several switches
        (:mod:`cais.sim.links.fabric`) steps from event to event with it."""
        self._process()
        later = [t for t, *_ in self._out if t > self._cycle]
        if self._arrivals:
            later.append(self._arrivals[0][0])
        return min(later) if later else None

    def read_now(self, addr: int) -> int:
        """A register read that takes no cycles (a fabric charges its accesses' time to every switch at
        once); BUSY reads the link's :attr:`busy`."""
        self._process()
        return int(self.busy) if int(addr) & ~3 == self._busy_addr else self.model.read(addr)

    def write_now(self, addr: int, value: int) -> None:
        """A register write that takes no cycles (see :meth:`read_now`)."""
        self._process()
        self.model.write(addr, value)

    def take_stamped(self) -> list[Received]:
        self._process()
        got = []
        while self._out and self._out[0][0] <= self._cycle:
            last, port, _, first, data = heapq.heappop(self._out)
            got.append(Received(port, data, first, last - 1))
        return got

    def take_sent(self) -> list[Sent]:
        """The frames the ingress wires took by now (the model's wires never stall)."""
        due = [s for s in self._sent if s.last < self._cycle]
        self._sent = [s for s in self._sent if s.last >= self._cycle]
        return due

    @property
    def pending(self) -> bool:
        return bool(self._arrivals)

    @property
    def busy(self) -> bool:
        """A frame is on an ingress wire, in its lane, or not yet out of an egress port."""
        self._process()
        return (bool(self._arrivals) or any(t > self._cycle for t in self._lane_free)
                or any(t > self._cycle for t, *_ in self._out))

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        self._cycle += int(cycles)

    async def advance_to_frame(self, cycles: int) -> int:
        """Advance up to ``cycles`` cycles, stopping after the first cycle in which a frame finished
        leaving the switch (frames already out do not count); return the cycles advanced."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        start, end = self._cycle, self._cycle + int(cycles)
        self._process()
        out_before = sum(1 for t, *_ in self._out if t <= start)
        while self._cycle < end:
            later = [t for t, *_ in self._out if t > self._cycle]
            target = min([end] + later)
            done = self._next_done()
            if done is not None:     # the next frame decided may emit output: look then
                target = min(target, done)
            self._cycle = max(target, self._cycle + 1)
            self._process()
            if sum(1 for t, *_ in self._out if t <= self._cycle) > out_before:
                break
        return self._cycle - start

    async def read(self, addr: int) -> int:
        self._process()
        if int(addr) & ~3 == self._busy_addr:
            value = int(self.busy)
        else:
            value = self.model.read(addr)
        self._cycle += self.reg_cycles
        return value

    def set_patterns(self, idle=0.0, backpressure=0.0) -> None:
        """Accepted for symmetry with the simulator links; the model's wires never pause."""

    async def reset(self, settle: int | None = None) -> None:
        """A fresh model and empty wires at cycle 0 (as the simulator links' reset; the model has no
        sweep, so ``settle`` changes nothing)."""
        self.__init__(self.params, self.clock_hz, reg_cycles=self.reg_cycles)

    async def write(self, addr: int, value: int) -> None:
        self._process()
        self.model.write(addr, value)
        self._cycle += self.reg_cycles


#: Options of the simulator links that have no meaning for the model; :func:`run_model` ignores them so
#: that callers can pass the same options to every backend.
SIMULATOR_ONLY_OPTIONS = ("seed", "idle", "backpressure", "vcd", "waves", "keep_run")


def run_model(params: SwitchParams, main: Callable[[Any], Awaitable], **kw):
    """Run ``await main(link)`` on a fresh :class:`ModelLink`; return main's result.

    ``kw`` go to :class:`ModelLink` (``clock_hz``, ``reg_cycles``, ``model``); the simulator-only options
    (``seed``, ``idle``, ``backpressure``, ``vcd``, ``waves``, ``keep_run``) are accepted and ignored.
    """
    kw = {k: v for k, v in kw.items() if k not in SIMULATOR_ONLY_OPTIONS}
    return run_sync(main(ModelLink(params, **kw)))
