"""Several switches wired port to port: a leaf-spine tree behind one link.

:class:`FabricLink` is a :class:`cais.link.SwitchLink` whose ports are the ranks' (rank r on its leaf's
port, :class:`cais.controller.tree.TreeTopology`) and whose registers are the tree's, programmed as one
switch through :class:`cais.controller.tree.TreeBus`; the driver, the controller and the fault injection
on the ranks' wires (:class:`cais.sim.faults.FaultyLink`) run on it unchanged. Each switch is a
:class:`cais.sim.links.model.ModelLink` (its time model), or any other link given in ``switch_links``
(e.g. the spine on the Verilated RTL, :class:`cais.sim.links.verilator.VerilatorLink`: a spine needs no
uplink action); the fabric moves every frame that leaves a switch-to-switch port into the peer's
ingress, ``wire_cycles`` after its last beat, with the faults of ``hop_faults`` on every hop (each
direction of each wire).

Time: every switch runs on the fabric's clock; the fabric steps from event to event (a frame decided
or out of a model switch, a held frame due; another link runs up to that event and stops early when a
frame leaves it), so a hop costs exactly the switches' latencies plus the wire's. A register access of
the controller costs ``reg_cycles`` per access of a model switch it becomes, and what it takes on
another link (an AXI4-Lite transaction); the switches behind catch up with the one ahead.

Hop faults follow :class:`cais.sim.faults.FaultSpec` (the same hash of seed, hop, frame and occurrence;
each hop direction draws from a seed of its own): a frame is dropped, duplicated, or held and delivered
after the hop's next frame (or after ``max_hold_cycles``).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from cais.controller.tree import TreeBus, TreeTopology
from cais.link import DEFAULT_CLOCK_HZ, run_sync
from cais.registers import register_map

from ..faults import FaultSpec
from .base import Received, read_counters
from .model import ModelLink

__all__ = ["FabricLink", "run_fabric"]


class _NowBus:
    """One switch's registers at the fabric's current cycle; counts the accesses for the fabric's clock."""

    def __init__(self, link: ModelLink, fabric: "FabricLink"):
        self.link, self.fabric = link, fabric

    async def read(self, addr: int) -> int:
        self.fabric._accesses += 1
        return self.link.read_now(addr)

    async def write(self, addr: int, value: int) -> None:
        self.fabric._accesses += 1
        self.link.write_now(addr, value)


class _LinkBus:
    """The registers of a switch on a simulator link: each access takes that link's cycles."""

    def __init__(self, link):
        self.link = link

    async def read(self, addr: int) -> int:
        return await self.link.read(addr)

    async def write(self, addr: int, value: int) -> None:
        await self.link.write(addr, value)


class FabricLink:
    """The tree of ``topology`` as one link (module docstring).

    Members
    -------
    topology : TreeTopology
    links : list
        The switches, leaves then spine: a :class:`ModelLink` each unless given (``switch_links``: a link per
        switch, None for a model).
    bus : TreeBus
    params : SwitchParams
        The logical switch's: a port per rank.
    hop_stats : dict
        Frames carried between switches: ``frames``, ``dropped``, ``duplicated``, ``reordered``,
        ``released_by_timeout``.
    unwired : int
        Frames that left a switch on a port with neither a rank nor a wire (none in a correct tree).
    """

    def __init__(self, topology: TreeTopology, *, clock_hz: float = DEFAULT_CLOCK_HZ, reg_cycles: int = 4,
                 wire_cycles: int = 0, hop_faults: FaultSpec = FaultSpec(), switch_links=None):
        self.topology, self.clock_hz, self.reg_cycles = topology, clock_hz, reg_cycles
        self.wire_cycles, self.hop_faults = int(wire_cycles), hop_faults
        given = list(switch_links) if switch_links is not None else [None] * topology.switches
        if len(given) != topology.switches:
            raise ValueError(f"switch_links: {len(given)} links for {topology.switches} switches")
        for i, link in enumerate(given):
            if link is not None and link.params != topology.params(i):
                raise ValueError(f"switch_links[{i}]: built {link.params.slug()}, the tree wants "
                                 f"{topology.params(i).slug()}")
        self.links = [link if link is not None else ModelLink(topology.params(i), clock_hz, reg_cycles=0)
                      for i, link in enumerate(given)]
        self._models = [link for link in self.links if isinstance(link, ModelLink)]
        self._others = [link for link in self.links if not isinstance(link, ModelLink)]
        self.bus = TreeBus(topology, [_NowBus(link, self) if isinstance(link, ModelLink) else _LinkBus(link)
                                      for link in self.links])
        self.params = self.bus.params
        self._busy_addr = register_map(self.params)["BUSY"].address()
        self._peer: dict[tuple[int, int], tuple[int, int]] = {}
        for a, b in topology.links():
            self._peer[a], self._peer[b] = b, a
        self._hops = {end: n for n, end in enumerate(sorted(self._peer))}   # a hop per sending end
        self._cycle = 0
        self._accesses = 0
        self._out: list[Received] = []              # frames out of rank ports, not yet taken
        self._held: dict[tuple[int, int], list[tuple[int, bytes]]] = defaultdict(list)   # end -> [(due, frame)]
        self._seen: dict[tuple[tuple[int, int], bytes], int] = defaultdict(int)
        self.hop_stats = dict.fromkeys(("frames", "dropped", "duplicated", "reordered", "released_by_timeout"), 0)
        self.unwired = 0

    @property
    def cycle(self) -> int:
        return self._cycle

    # ------------------------------------------------------------------ ranks' side
    def send(self, port: int, frame: bytes) -> None:
        if not isinstance(port, int) or not 0 <= port < self.topology.ranks:
            raise ValueError(f"port={port!r}: out of range 0..{self.topology.ranks - 1} (a port per rank)")
        leaf, local = self.topology.locate(port)
        self.links[leaf].send(local, frame)

    def take_stamped(self) -> list[Received]:
        out, self._out = self._out, []
        return sorted(out, key=lambda r: (r.last, r.port))

    def take_received(self) -> list[tuple[int, bytes]]:
        return [(r.port, r.data) for r in self.take_stamped()]

    # ------------------------------------------------------------------ the wires between switches
    def _deliver(self, end: tuple[int, int], frame: bytes, not_before: int) -> None:
        switch, port = self._peer[end]
        self.links[switch].send(port, frame, not_before=not_before)

    def _hop(self, end: tuple[int, int], frame: bytes, last: int) -> None:
        """A frame that left switch ``end[0]`` on port ``end[1]`` towards its peer, with the hop's fault."""
        not_before = last + 1 + self.wire_cycles
        spec = self.hop_faults
        if not spec.active:
            self._deliver(end, frame, not_before)
            return
        key = (end, hashlib.blake2b(frame, digest_size=16).digest())
        occurrence = self._seen[key]
        self._seen[key] += 1
        self.hop_stats["frames"] += 1
        # each hop's own draw: the hop's index in the seed's place of the port
        action = spec.decide("egress", 1000 + self._hops[end], frame, occurrence)
        if action == "drop":
            self.hop_stats["dropped"] += 1
            return
        if action == "reorder":
            self.hop_stats["reordered"] += 1
            self._held[end].append((self._cycle + spec.max_hold_cycles, frame))
            return
        self._deliver(end, frame, not_before)
        if action == "duplicate":
            self.hop_stats["duplicated"] += 1
            self._deliver(end, frame, not_before)
        for _, held in self._held.pop(end, []):
            self._deliver(end, held, not_before)

    def _release_due(self) -> None:
        for end in list(self._held):
            due = [(d, f) for d, f in self._held[end] if d <= self._cycle]
            keep = [(d, f) for d, f in self._held[end] if d > self._cycle]
            for _, frame in due:
                self.hop_stats["released_by_timeout"] += 1
                self._deliver(end, frame, self._cycle)
            if keep:
                self._held[end] = keep
            else:
                del self._held[end]

    def _shuttle(self) -> None:
        rpl = self.topology.ranks_per_leaf
        for switch, link in enumerate(self.links):
            for r in link.take_stamped():
                end = (switch, r.port)
                if end in self._peer:
                    self._hop(end, r.data, r.last)
                elif switch < self.topology.leaves and r.port < rpl:
                    self._out.append(Received(switch * rpl + r.port, r.data, r.first, r.last))
                else:
                    self.unwired += 1
        self._release_due()

    # ------------------------------------------------------------------ time
    def _next_event(self, target: int) -> int:
        events = [target] + [e for link in self._models if (e := link.next_event()) is not None]
        events += [d for held in self._held.values() for d, _ in held]
        return max(min(events), self._cycle + 1)

    async def _step(self, target: int) -> None:
        """Run every switch to the next event (at most ``target``) and carry the frames then due. A link
        without events of its own runs until then, or stops at its first frame out (then everyone does);
        a link ahead (after its register accesses) waits for the others."""
        nxt = self._next_event(target)
        for link in self._others:
            if link.cycle < nxt:
                await link.advance_to_frame(nxt - link.cycle)
                nxt = max(min(nxt, link.cycle), self._cycle + 1)
        for link in self.links:
            if link.cycle < nxt:
                await link.advance(nxt - link.cycle)
        self._cycle = nxt
        self._shuttle()

    async def advance(self, cycles: int) -> None:
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        target = self._cycle + int(cycles)
        while self._cycle < target:
            await self._step(target)

    async def advance_to_frame(self, cycles: int) -> int:
        """Advance up to ``cycles``, stopping after the first cycle in which a frame left a rank port."""
        if cycles < 0:
            raise ValueError(f"advance_to_frame({cycles}): cycles must not be negative")
        start, target = self._cycle, self._cycle + int(cycles)
        had = len(self._out)
        while self._cycle < target and len(self._out) == had:
            await self._step(target)
        return self._cycle - start

    @property
    def busy(self) -> bool:
        """A frame inside a model switch or held on a hop (simulator links answer through BUSY)."""
        return any(link.busy for link in self._models) or bool(self._held)

    # ------------------------------------------------------------------ registers
    async def _charge(self) -> None:
        """The time of the register accesses just made: ``reg_cycles`` per model access, and the others
        up to the simulator link furthest ahead."""
        accesses, self._accesses = self._accesses, 0
        target = max([self._cycle + accesses * self.reg_cycles] + [link.cycle for link in self._others])
        await self.advance(target - self._cycle)

    async def read(self, addr: int) -> int:
        value = await self.bus.read(addr)
        if int(addr) & ~3 == self._busy_addr and self._held:
            value |= 1
        await self._charge()
        return value

    async def write(self, addr: int, value: int) -> None:
        await self.bus.write(addr, value)
        await self._charge()

    async def switch_counters(self) -> list[dict]:
        """Every switch's counters (leaves, then the spine): a model's from the model, another's read from
        its registers."""
        out = []
        for link in self.links:
            out.append(link.model.counters() if isinstance(link, ModelLink) else await read_counters(link))
        await self._charge()
        return out


def run_fabric(topology: TreeTopology, main, **kw):
    """Run ``await main(link)`` on a fresh :class:`FabricLink` (``kw``: its options); return main's result."""
    return run_sync(main(FabricLink(topology, **kw)))
