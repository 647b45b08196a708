"""Seeded, backend-independent fault injection on the wires between the ranks and the switch.

:class:`FaultyLink` wraps any :class:`cais.link.SwitchLink` and, per port, drops, duplicates or reorders
frames on the way in (``send``) and on the way out (``take_received``), as :class:`FaultSpec` says.

Determinism. The fate of a frame is a pure function (:meth:`FaultSpec.decide`) of the seed, the
direction, the port, the frame's bytes and how many times this exact frame has already been seen on that
port and direction (0 the first time, 1 for its first repetition, ...). It uses no shared random stream
and no time, so the same scenario gets the same faults on every backend although their timing differs,
and a retransmitted frame (same bytes again) gets a fresh, but equally reproducible, decision.

Each frame suffers at most one fault. With ``u`` uniform in [0, 1) from a hash of the inputs above:
``u < drop`` drops it, the next ``duplicate`` of the unit interval duplicates it, the next ``reorder``
reorders it, the rest passes unchanged (so ``drop + duplicate + reorder`` must not exceed 1).

* drop: the frame disappears.
* duplicate: the frame is delivered twice, back to back.
* reorder: the frame is held and delivered right after the next frame of the same port and direction
  that is delivered (after both copies of a duplicated one; a dropped frame does not count, nor does a
  frame that is itself held). If no such frame comes within ``max_hold_cycles`` cycles it is released
  then: ingress frames by :meth:`FaultyLink.advance` at that cycle (or by the next ``send`` or
  ``take_received`` if register accesses moved time past it), egress frames by the first
  ``take_received`` at or after that cycle. Several held frames of one port are released in the order
  they were held. Which frames are reordered is backend independent; which frame overtakes them is the
  backend's order of frames on that port.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

__all__ = ["FaultSpec", "FaultyLink", "PortBlackout", "ACTIONS", "DIRECTIONS"]

ACTIONS = ("pass", "drop", "duplicate", "reorder")
DIRECTIONS = ("ingress", "egress")
_PAST = {"drop": "dropped", "duplicate": "duplicated", "reorder": "reordered"}


@dataclass(frozen=True)
class FaultSpec:
    drop: float = 0.0             # probability a frame is dropped
    duplicate: float = 0.0        # probability a frame is delivered twice
    reorder: float = 0.0          # probability a frame is held past the next frame of its port
    seed: int = 0
    ports: tuple[int, ...] | None = None   # ports whose wires are faulty; None: all
    ingress: bool = True          # faults on the way into the switch (send)
    egress: bool = True           # faults on the way out of the switch (take_received)
    max_hold_cycles: int = 500    # a reordered frame is released after this many cycles at the latest

    def __post_init__(self):
        for name in ("drop", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultSpec.{name}={value!r}: must be a probability in [0, 1]")
        if self.drop + self.duplicate + self.reorder > 1.0 + 1e-12:
            raise ValueError("FaultSpec: drop + duplicate + reorder must not exceed 1")
        if self.max_hold_cycles < 0:
            raise ValueError(f"FaultSpec.max_hold_cycles={self.max_hold_cycles}: must not be negative")
        if self.ports is not None:
            object.__setattr__(self, "ports", tuple(sorted({int(p) for p in self.ports})))

    @property
    def active(self) -> bool:
        """Whether any frame can suffer a fault."""
        return bool(self.drop or self.duplicate or self.reorder)

    def applies(self, direction: str, port: int) -> bool:
        """Whether frames of ``port`` in ``direction`` are subject to faults at all."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction={direction!r}: expected one of {DIRECTIONS}")
        on = self.ingress if direction == "ingress" else self.egress
        return on and (self.ports is None or port in self.ports)

    def draw(self, direction: str, port: int, frame: bytes, occurrence: int) -> float:
        """The frame's uniform number in [0, 1): a hash of (seed, direction, port, occurrence, bytes)."""
        h = hashlib.blake2b(digest_size=8, person=b"cais-faults")
        h.update(f"{self.seed}|{direction}|{port}|{occurrence}|".encode())
        h.update(bytes(frame))
        return int.from_bytes(h.digest(), "big") / 2.0**64

    def decide(self, direction: str, port: int, frame: bytes, occurrence: int = 0) -> str:
        """What happens to this frame: one of :data:`ACTIONS` (see the module docstring)."""
        if not self.applies(direction, port):
            return "pass"
        u = self.draw(direction, port, frame, occurrence)
        edge = 0.0
        for action, p in (("drop", self.drop), ("duplicate", self.duplicate), ("reorder", self.reorder)):
            edge += p
            if u < edge:
                return action
        return "pass"


class FaultyLink:
    """A :class:`cais.link.SwitchLink` that injects the faults of ``spec`` around ``inner``.

    Members
    -------
    stats : dict
        Counts per direction: ``<dir>_frames`` (frames subject to faults), ``<dir>_dropped``,
        ``<dir>_duplicated``, ``<dir>_reordered``, ``<dir>_released_by_timeout``.
    events : list
        One ``(direction, port, occurrence, action, frame digest hex)`` per frame subject to faults, in
        the order decided.
    """

    def __init__(self, inner, spec: FaultSpec = FaultSpec()):
        self.inner = inner
        self.spec = spec
        # a spec without faults subjects no frame to them (and costs nothing per frame)
        self._active = spec.active
        self.params = inner.params
        self.clock_hz = inner.clock_hz
        self.stats = {f"{d}_{k}": 0 for d in DIRECTIONS
                      for k in ("frames", "dropped", "duplicated", "reordered", "released_by_timeout")}
        self.events: list[tuple[str, int, int, str, str]] = []
        self._seen: dict[tuple[str, int, bytes], int] = defaultdict(int)
        # held frames per (direction, port): [(deadline cycle, frame)], in the order held
        self._held: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)

    # ------------------------------------------------------------------ pass-through
    @property
    def cycle(self) -> int:
        return self.inner.cycle

    @property
    def holding(self) -> int:
        """Frames currently held for reordering (both directions)."""
        return sum(len(h) for h in self._held.values())

    async def read(self, addr: int) -> int:
        return await self.inner.read(addr)

    async def write(self, addr: int, value: int) -> None:
        await self.inner.write(addr, value)

    # ------------------------------------------------------------------ the faults
    def _decide(self, direction: str, port: int, frame: bytes) -> str:
        digest = hashlib.blake2b(frame, digest_size=16).digest()
        key = (direction, port, digest)
        occurrence = self._seen[key]
        self._seen[key] = occurrence + 1
        action = self.spec.decide(direction, port, frame, occurrence)
        self.stats[f"{direction}_frames"] += 1
        if action != "pass":
            self.stats[f"{direction}_{_PAST[action]}"] += 1
        self.events.append((direction, port, occurrence, action, digest.hex()))
        return action

    def _apply(self, direction: str, port: int, frame: bytes, deliver) -> None:
        if not self._active or not self.spec.applies(direction, port):
            deliver(frame)
            return
        action = self._decide(direction, port, frame)
        if action == "drop":
            return
        if action == "reorder":
            self._held[direction, port].append((self.cycle + self.spec.max_hold_cycles, frame))
            return
        deliver(frame)
        if action == "duplicate":
            deliver(frame)
        for _, held in self._held.pop((direction, port), []):
            deliver(held)

    def _expired(self, direction: str, now: int) -> list[tuple[int, int, int, bytes]]:
        """Remove and return the held frames of ``direction`` whose deadline is <= now, in release order."""
        out = []
        for (d, port), held in list(self._held.items()):
            if d != direction:
                continue
            keep = []
            for i, (deadline, frame) in enumerate(held):
                if deadline <= now:
                    out.append((deadline, port, i, frame))
                else:
                    keep.append((deadline, frame))
            if keep:
                self._held[d, port] = keep
            else:
                del self._held[d, port]
        out.sort(key=lambda t: t[:3])
        self.stats[f"{direction}_released_by_timeout"] += len(out)
        return out

    def _release_ingress(self) -> None:
        for _, port, _, frame in self._expired("ingress", self.cycle):
            self.inner.send(port, frame)

    def send(self, port: int, frame: bytes) -> None:
        self._release_ingress()
        self._apply("ingress", port, bytes(frame), lambda f: self.inner.send(port, f))

    def take_received(self) -> list[tuple[int, bytes]]:
        self._release_ingress()
        out: list[tuple[int, bytes]] = []
        for port, frame in self.inner.take_received():
            self._apply("egress", port, frame, lambda f, port=port: out.append((port, f)))
        out += [(port, frame) for _, port, _, frame in self._expired("egress", self.cycle)]
        return out

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        target = self.cycle + int(cycles)
        while True:
            self._release_ingress()
            deadlines = [deadline for (d, _), held in self._held.items() if d == "ingress"
                         for deadline, _ in held]
            if not deadlines or min(deadlines) > target:
                break
            await self.inner.advance(min(deadlines) - self.cycle)
        if target > self.cycle:
            await self.inner.advance(target - self.cycle)

    async def advance_to_frame(self, cycles: int) -> int:
        """As the inner link's; a held egress frame falling due is a frame event too (take_received then
        hands it out), and a held ingress frame falling due is sent on the way."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        start = self.cycle
        target = start + int(cycles)
        while self.cycle < target:
            self._release_ingress()
            due = [d for held in self._held.values() for d, _ in held if d > self.cycle]
            want = min([target] + due) - self.cycle
            if not hasattr(self.inner, "advance_to_frame"):     # a link that only advances: no early stop
                await self.inner.advance(want)
            elif await self.inner.advance_to_frame(want) < want:
                break                                          # a frame came out of the switch
            if any(d <= self.cycle for (direction, _), held in self._held.items() if direction == "egress"
                   for d, _ in held):
                break                                          # a held egress frame is due
        return self.cycle - start


class PortBlackout:
    """A link whose one rank-side port is down from the start for ``until_s`` seconds of switch time: every
    frame sent into ``port`` before then is lost (a cable pulled, then put back). Everything else is the
    wrapped link's."""

    def __init__(self, inner, port: int, until_s: float):
        self._inner, self._port, self._until = inner, port, until_s

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def send(self, port, frame, **kw):
        if not (port == self._port and self._inner.cycle < self._until * self._inner.clock_hz):
            self._inner.send(port, frame, **kw)
