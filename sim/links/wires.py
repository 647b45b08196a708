"""The wires of a simulated switch, cycle by cycle: one definition every simulator link runs.

A :class:`WireLink` is a :class:`cais.link.SwitchLink` whose methods run the clock themselves: each
cycle it drives every port's AXI4-Stream source (the queued frames, with seeded idle cycles), every
sink's ``tready`` (seeded back-pressure, or held low), and the AXI4-Lite master, then lets the simulator
take one clock edge and updates from the values sampled before that edge. Subclasses only say how to
set and sample signals (:mod:`.cocotb` and :mod:`.amaranth`); ``harness.cpp`` mirrors the same rules in
C++ for :mod:`.verilator`. So the same stimulus gives identical frames with identical cycle stamps on
every link (``tests/sim/test_link_identity.py`` checks it).

The rules, per cycle ``c`` (the clock edge that takes ``cycle`` from c to c + 1):

* Source of port p: a beat on the bus stays until taken (AXI4-Stream). Otherwise, if the port has a
  frame to send (its first beat not before the frame's ``not_before`` cycle), it shows the next beat
  unless the idle pattern pauses it in cycle c; else tvalid is low.
* Sink of port p: ``tready = not held in c and not paused(c)``. A beat is taken when tvalid and tready are
  both high; a frame is stamped with the cycles of its first and last beat.
* Pauses are a pure function of (seed, stream, port, cycle) (:func:`paused`), so they do not depend on
  when the link is called. A probability p pauses when the 53-bit draw is below ``round(p * 2**53)``.
* AXI4-Lite, one access at a time: a write raises awvalid, wvalid and bready together and drops each
  valid after its handshake; once both are done it waits for bvalid. A read raises arvalid and rready,
  drops arvalid after its handshake, then waits for rvalid. Traffic keeps moving meanwhile.
"""

from __future__ import annotations

from collections import deque

from cais.link import DEFAULT_CLOCK_HZ
from cais.params import SwitchParams

from .base import LinkBase, Received, Sent, check_frame, keep_bytes

__all__ = ["splitmix64", "pause_key", "paused", "threshold", "Stream", "WireLink", "Received", "RESET_CYCLES",
           "AXIL_INPUTS", "AXIL_OUTPUTS"]

MASK64 = (1 << 64) - 1
#: The switch's AXI4-Lite inputs the master drives, and its outputs the master samples.
AXIL_OUTPUTS = ("awaddr", "wdata", "wstrb", "awvalid", "wvalid", "bready", "araddr", "arvalid", "rready")
AXIL_INPUTS = ("awready", "wready", "bvalid", "bresp", "arready", "rvalid", "rdata", "rresp")
#: Cycles the links hold ``rst`` high before the slot-state sweep.
RESET_CYCLES = 4


class Stream:
    """Which pattern a draw is for (the C++ harness numbers them alike)."""
    IDLE = 0
    BACKPRESSURE = 1


def splitmix64(x: int) -> int:
    """One step of SplitMix64 (Steele, Lea, Flood 2014) as a hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def pause_key(seed: int, stream: int, port: int) -> int:
    return splitmix64((seed & MASK64) ^ splitmix64((stream << 32) | port))


def threshold(probability: float) -> int:
    """The draw below which a cycle pauses, for a pause probability in [0, 1]."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"pause probability {probability!r}: must be between 0 and 1")
    return round(probability * (1 << 53))


def paused(key: int, limit: int, cycle: int) -> bool:
    """Whether the pattern with ``key`` and threshold ``limit`` pauses in ``cycle``."""
    return bool(limit) and (splitmix64((key + cycle) & MASK64) >> 11) < limit


def per_port(value, ports: int, name: str) -> list[float]:
    """One probability, or one per port, as a list of ``ports`` floats."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * ports
    if len(values) != ports:
        raise ValueError(f"{name}: {len(values)} values for {ports} ports")
    return [float(v) for v in values]


class _Port:
    __slots__ = ("queue", "frame", "bad_keep", "bad_fcs", "offset", "tx_first", "showing", "valid", "ready", "rx", "rx_first",
                 "idle_key", "idle_limit", "bp_key", "bp_limit", "hold_until")

    def __init__(self):
        self.queue: deque[tuple[bytes, bool, bool, int]] = deque()   # (frame, bad_keep, bad_fcs, not_before)
        self.frame = b""
        self.bad_keep = False
        self.bad_fcs = False
        self.offset = 0
        self.tx_first = 0
        self.showing = False
        self.valid = False          # the tvalid value last driven
        self.ready = True
        self.rx = bytearray()
        self.rx_first = 0
        self.hold_until = 0


class WireLink(LinkBase):
    """A SwitchLink that runs a simulator cycle by cycle with the rules of this module.

    Subclasses implement :meth:`_set_beat` (data, keep, last, user on port p's s_axis), :meth:`_set_valid`,
    :meth:`_set_ready`, :meth:`_set_bus` (the AXI4-Lite master's outputs), :meth:`_set_reset`, and
    :meth:`_edge` (take one clock edge), and the values sampled just before that edge: :meth:`_s_ready`,
    :meth:`_m_valid`, :meth:`_beat` (port p's m_axis tdata, tkeep, tlast) and :meth:`_bus_sample` (the
    AXI4-Lite master's inputs). They are asked for only when needed (a simulator read costs time).
    """

    def __init__(self, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, seed: int = 0,
                 idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0):
        super().__init__(params, clock_hz)
        self.seed = int(seed)
        P = params.ports
        self._ports = [_Port() for _ in range(P)]
        self._received: list[Received] = []
        self._sent: list[Sent] = []
        self._cycle = 0
        self.set_patterns(idle, backpressure)
        # AXI4-Lite master state: None when idle, else "write", "resp", "read", "data"
        self._bus_state: str | None = None
        self._aw_done = self._w_done = False
        self._bus_result = (0, 0)
        self.read_accepted = 0          # cycle of the last read's address handshake

    # ------------------------------------------------------------------ SwitchLink
    @property
    def cycle(self) -> int:
        return self._cycle

    def send(self, port: int, frame: bytes, *, bad_keep: bool = False, bad_fcs: bool = False,
             not_before: int = 0) -> None:
        """Queue a frame; ``bad_keep`` sends its last beat with tkeep moved up a lane (a framing error),
        ``bad_fcs`` with tuser high (the MAC saw a bad FCS); its first beat is not shown before cycle
        ``not_before`` (nor before the port's earlier frames)."""
        self.check_port(port)
        frame = check_frame(frame, self.params.beat_bytes, bad_keep)
        self._ports[port].queue.append((frame, bad_keep, bad_fcs, int(not_before)))

    async def reset(self, settle: int | None = None) -> None:
        """Forget queued and partial frames, reset the switch and wait for its sweep: cycle 0 again
        (``settle``: cycle 0 that many cycles after reset instead; 0: the first cycle with ``rst`` low)."""
        for p, port in enumerate(self._ports):
            port.queue.clear()
            port.frame, port.offset, port.showing = b"", 0, False
            if port.valid:
                self._set_valid(p, False)
                port.valid = False
        self._sent = []
        await self._reset(self.params.slots + 2 if settle is None else int(settle))

    @property
    def pending(self) -> bool:
        """A frame is queued for, or on the way into, an ingress port."""
        return any(port.queue or port.frame for port in self._ports)

    def take_stamped(self) -> list[Received]:
        got, self._received = self._received, []
        return got

    def take_sent(self) -> list[Sent]:
        got, self._sent = self._sent, []
        return got

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        for _ in range(int(cycles)):
            await self._step()

    async def advance_to_frame(self, cycles: int) -> int:
        """Run up to ``cycles`` cycles, stopping after the first cycle in which a frame finished leaving
        the switch; return the cycles run."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        before = len(self._received)
        for ran in range(1, int(cycles) + 1):
            await self._step()
            if len(self._received) != before:
                return ran
        return int(cycles)

    async def _read_register(self, addr: int) -> int:
        self._bus_state = "read"
        self._set_bus(araddr=addr, arvalid=1, rready=1)
        while self._bus_state != "done":
            await self._step()
        self._bus_state = None
        return self._bus_result[0]

    async def _write_register(self, addr: int, value: int) -> int:
        self._bus_state = "write"
        self._aw_done = self._w_done = False
        self._set_bus(awaddr=addr, wdata=value, wstrb=0xF, awvalid=1, wvalid=1, bready=1)
        while self._bus_state != "done":
            await self._step()
        self._bus_state = None
        return self._bus_result[1]

    def set_patterns(self, idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0) -> None:
        """Per-port (or common) probabilities of an idle cycle on a source and of tready low on a sink."""
        P = self.params.ports
        for p, (i, b) in enumerate(zip(per_port(idle, P, "idle"), per_port(backpressure, P, "backpressure"))):
            port = self._ports[p]
            port.idle_key, port.idle_limit = pause_key(self.seed, Stream.IDLE, p), threshold(i)
            port.bp_key, port.bp_limit = pause_key(self.seed, Stream.BACKPRESSURE, p), threshold(b)

    def set_hold(self, port: int, hold: bool = True, *, until: int | None = None) -> None:
        """Keep port's sink tready low: until released (``hold=True``; ``False`` releases it now), or
        while ``cycle < until``."""
        end = (float("inf") if hold else 0) if until is None else int(until)
        self._ports[self.check_port(port)].hold_until = end

    # ------------------------------------------------------------------ one cycle
    async def _reset(self, settle: int) -> None:
        """Hold reset for RESET_CYCLES, release it and run ``settle`` cycles; then cycle 0 begins.

        What the sinks took up to then is forgotten: the egress registers still show their beat in the
        first cycle of reset, and a ready sink takes it, the head of a frame reset cut short (kept, it
        would lead the port's next frame)."""
        self._set_reset(1)
        for _ in range(RESET_CYCLES):
            await self._step()
        for port in self._ports:
            port.rx = bytearray()
        self._received = []
        self._set_reset(0)
        for _ in range(settle):
            await self._step()
        self._cycle = 0

    async def _step(self) -> None:
        c = self._cycle
        B = self.params.beat_bytes
        for p, port in enumerate(self._ports):
            if not port.showing:
                if not port.frame and port.queue and port.queue[0][3] <= c:
                    port.frame, port.bad_keep, port.bad_fcs, _ = port.queue.popleft()
                    port.offset = 0
                if port.frame and not (port.idle_limit and paused(port.idle_key, port.idle_limit, c)):
                    chunk = port.frame[port.offset:port.offset + B]
                    last = port.offset + B >= len(port.frame)
                    shift = int(last and port.bad_keep)      # as cais.sim.traffic.beats_of
                    self._set_beat(p, int.from_bytes(chunk, "little") << (8 * shift),
                                   ((1 << len(chunk)) - 1) << shift, last, last and port.bad_fcs)
                    port.showing = True
                if port.showing != port.valid:
                    self._set_valid(p, port.showing)
                    port.valid = port.showing
            ready = c >= port.hold_until and not (port.bp_limit and paused(port.bp_key, port.bp_limit, c))
            if ready != port.ready:
                self._set_ready(p, ready)
                port.ready = ready
        state = self._bus_state
        await self._edge()
        for p, port in enumerate(self._ports):
            if port.showing and self._s_ready(p):
                port.showing = False
                if port.offset == 0:
                    port.tx_first = c
                port.offset += B
                if port.offset >= len(port.frame):
                    self._sent.append(Sent(p, port.tx_first, c))
                    port.frame, port.offset = b"", 0
            if port.ready and self._m_valid(p):
                data, keep, last = self._beat(p)
                n = keep_bytes(keep, B, last, p)
                if not port.rx:
                    port.rx_first = c
                port.rx += data.to_bytes(B, "little")[:n]
                if last:
                    self._received.append(Received(p, bytes(port.rx), port.rx_first, c))
                    port.rx = bytearray()
        if state is not None:
            self._update_bus(state, self._bus_sample())
        self._cycle = c + 1

    def _update_bus(self, state: str, bus: dict) -> None:
        """The master after an edge: a valid drops after its handshake, the ready after the response."""
        if state == "write":
            if bus["awready"] and not self._aw_done:
                self._aw_done = True
                self._set_bus(awvalid=0)
            if bus["wready"] and not self._w_done:
                self._w_done = True
                self._set_bus(wvalid=0)
            if self._aw_done and self._w_done:
                self._bus_state = "resp"
        elif state == "resp" and bus["bvalid"]:
            self._bus_result, self._bus_state = (0, int(bus["bresp"])), "done"
            self._set_bus(bready=0)
        elif state == "read" and bus["arready"]:
            self._bus_state, self.read_accepted = "data", self._cycle
            self._set_bus(arvalid=0)
        elif state == "data" and bus["rvalid"]:
            self._bus_result, self._bus_state = (int(bus["rdata"]), int(bus["rresp"])), "done"
            self._set_bus(rready=0)

    # ------------------------------------------------------------------ simulator hooks
    def _set_beat(self, port: int, data: int, keep: int, last: bool, user: bool) -> None:
        raise NotImplementedError

    def _set_valid(self, port: int, valid: bool) -> None:
        raise NotImplementedError

    def _set_ready(self, port: int, ready: bool) -> None:
        raise NotImplementedError

    def _set_bus(self, **values: int) -> None:
        raise NotImplementedError

    def _set_reset(self, value: int) -> None:
        raise NotImplementedError

    async def _edge(self) -> None:
        raise NotImplementedError

    def _s_ready(self, port: int) -> bool:
        raise NotImplementedError

    def _m_valid(self, port: int) -> bool:
        raise NotImplementedError

    def _bus_sample(self) -> dict:
        raise NotImplementedError

    def _beat(self, port: int) -> tuple[int, int, bool]:
        raise NotImplementedError
