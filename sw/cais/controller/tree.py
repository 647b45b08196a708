"""Aggregation trees: a leaf-spine tree of switches programmed as one switch (docs/protocol.md section 13).

Contract: :class:`TreeTopology` is the job's description of the tree (how many leaves, how many ranks on
each, the switches' build parameters) and refuses, with :class:`TreeError` naming what is wrong, a tree
that cannot be built. :class:`TreeBus` puts the tree's switches behind the register interface of one
switch with a port per rank (``TreeTopology.logical_params``), so the controller runs unchanged: every rule
it writes becomes, per switch, the rule that switch needs (a group on several leaves: each leaf's local
ranks with the uplink action, the spine's rule over those leaves' ports; a group on one leaf: that leaf's
ordinary rule), every MAC entry the port towards that host on each switch, every slot clear and setting
the same on every switch. Reads answer as one switch would: counters summed over the switches, gauges (sets
in use) the largest switch's, a rank port's traffic counters from its leaf port, BUSY if any switch is busy.
Set aging runs on the leaves (AGING goes to them, not to the spine: a spine's set waits for a leaf whose own
set ages); their aged-set events come out of AGED_EVENT / AGED_PORTS one queue, each leaf's port bitmap
turned into the ranks' ports (the other leaves' ranks counted present), so the controller finds a dead rank
behind any leaf.

A tree needs the uplink action on every leaf (``FEATURES.uplink``); :meth:`TreeBus.check` says why a tree
cannot be used, and the caller then keeps every collective on the host ring, whose frames the MAC entries
route across the tree.

Switch numbering: leaves 0..L-1, then the spine (index L). Rank r is on leaf ``r // ranks_per_leaf``, port
``r % ranks_per_leaf``; a leaf's uplink is its port ``ranks_per_leaf``, wired to the spine's port = the
leaf's index.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..params import ParamError, SwitchParams
from ..registers import REGISTER_BITS, Kind, RegisterMap, register_map
from ..tables import MacEntry, Rule, mac_writes, rule_writes
from ..protocol import DType, ReduceOp

__all__ = ["TreeTopology", "TreeBus", "TreeLink", "TreeError", "LOGICAL_ONLY"]

_MASK = (1 << REGISTER_BITS) - 1
#: Registers of the logical switch that stay with it and reach no switch of the tree.
LOGICAL_ONLY = ("UPLINK",)
_PER_PORT = ("RX_FRAMES", "RX_BYTES", "TX_FRAMES", "TX_BYTES")      # a rank port's: its leaf port's
_STAGING = ("RULE_GROUP", "RULE_LAYER", "RULE_CHUNK", "RULE_PORTS", "RULE_SLOTS", "RULE_TYPE", "MAC_ADDR_LO",
            "MAC_ADDR_HI")


class TreeError(ValueError):
    """A tree that cannot be built or used; the message says what is wrong."""


@dataclass(frozen=True)
class TreeTopology:
    """Two levels: ``leaves`` leaf switches with ``ranks_per_leaf`` ranks each, under one spine.

    Members
    -------
    leaf_params, spine_params : SwitchParams
        The switches' builds; by default the default build with ``ranks_per_leaf + 1`` ports and the uplink
        action (leaves), and ``leaves`` ports (spine, at least 2).
    """
    leaves: int
    ranks_per_leaf: int
    leaf_params: SwitchParams | None = None
    spine_params: SwitchParams | None = None
    base: SwitchParams = field(default_factory=SwitchParams)

    def __post_init__(self):
        for name in ("leaves", "ranks_per_leaf"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TreeError(f"{name}={value!r}: must be an integer")
        if not 2 <= self.leaves <= 16:
            raise TreeError(f"leaves={self.leaves}: a tree has 2 to 16 leaves (the spine's ports)")
        if not 1 <= self.ranks_per_leaf <= 15:
            raise TreeError(f"ranks_per_leaf={self.ranks_per_leaf}: 1 to 15 (a leaf has at most 16 ports, one "
                            f"of them the uplink)")
        if self.ranks > 16:
            raise TreeError(f"{self.leaves} leaves x {self.ranks_per_leaf} ranks = {self.ranks} ranks: the "
                            f"controller programs the tree as one switch of at most 16 ports")
        try:
            if self.leaf_params is None:
                object.__setattr__(self, "leaf_params", replace(self.base, ports=self.ranks_per_leaf + 1,
                                                                uplink=True))
            if self.spine_params is None:
                object.__setattr__(self, "spine_params", replace(self.base, ports=max(2, self.leaves)))
        except ParamError as e:
            raise TreeError(f"the tree's switches cannot be built: {e}") from None
        if self.leaf_params.ports <= self.ranks_per_leaf:
            raise TreeError(f"leaf_params.ports={self.leaf_params.ports}: a leaf needs {self.ranks_per_leaf} "
                            f"rank ports and an uplink")
        if self.spine_params.ports < self.leaves:
            raise TreeError(f"spine_params.ports={self.spine_params.ports}: the spine needs a port per leaf "
                            f"({self.leaves})")
        if self.leaf_params.max_payload != self.spine_params.max_payload:
            raise TreeError("leaf and spine max_payload differ: a partial must fit the spine's sets")

    @property
    def ranks(self) -> int:
        return self.leaves * self.ranks_per_leaf

    @property
    def switches(self) -> int:
        """Leaves and the spine."""
        return self.leaves + 1

    @property
    def spine(self) -> int:
        """The spine's switch index."""
        return self.leaves

    @property
    def uplink_port(self) -> int:
        """Every leaf's port towards the spine."""
        return self.ranks_per_leaf

    def params(self, switch: int) -> SwitchParams:
        return self.spine_params if switch == self.spine else self.leaf_params

    @property
    def rtl_spine_params(self) -> SwitchParams:
        """The spine's build on the Verilated RTL: ``spine_params`` with the base build's ports (at least a
        port per leaf), so that a spine of the default base is the default switch's Verilator build, which
        is there already (a build per port count costs minutes)."""
        return replace(self.spine_params, ports=max(self.base.ports, self.leaves))

    def spine_params_on(self, backend: str) -> SwitchParams:
        """The spine's build on ``backend``: :attr:`rtl_spine_params` on the Verilated RTL ("verilator"),
        :attr:`spine_params` on any other (the model's time model has no build to reuse)."""
        return self.rtl_spine_params if backend == "verilator" else self.spine_params

    def locate(self, rank: int) -> tuple[int, int]:
        """(leaf, port) of rank ``rank``."""
        if not 0 <= rank < self.ranks:
            raise TreeError(f"rank {rank}: out of range 0..{self.ranks - 1}")
        return divmod(rank, self.ranks_per_leaf)

    def links(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """The switch-to-switch wires: ((leaf, uplink port), (spine, port)), one per leaf."""
        return [((leaf, self.uplink_port), (self.spine, leaf)) for leaf in range(self.leaves)]

    @property
    def logical_params(self) -> SwitchParams:
        """The one switch the controller sees: a port per rank, the smallest tables of the tree."""
        both = (self.leaf_params, self.spine_params)
        return replace(self.leaf_params, ports=max(2, self.ranks), uplink=False,
                       slots=min(p.slots for p in both), rules=min(p.rules for p in both),
                       mac_entries=min(p.mac_entries for p in both), max_frame=min(p.max_frame for p in both),
                       float_units=all(p.float_units for p in both))

    def rules_for(self, rule: Rule) -> list[Rule | None]:
        """What each switch's entry holds for a rule of the logical switch (None: the entry is invalid)."""
        def local(mask, leaf):
            lo = leaf * self.ranks_per_leaf
            return (mask >> lo) & ((1 << self.ranks_per_leaf) - 1)
        used = [leaf for leaf in range(self.leaves) if local(rule.contributors | rule.results, leaf)]
        out: list[Rule | None] = [None] * self.switches
        if len(used) == 1:
            leaf = used[0]
            out[leaf] = replace(rule, contributors=local(rule.contributors, leaf), results=local(rule.results, leaf))
        elif used:
            for leaf in used:
                out[leaf] = replace(rule, contributors=local(rule.contributors, leaf),
                                    results=local(rule.results, leaf), uplink=True)
            below = sum(1 << leaf for leaf in used)
            out[self.spine] = replace(rule, contributors=below, results=below)
        return out

    def port_towards(self, switch: int, rank: int) -> int:
        """The port of ``switch`` that leads to rank ``rank``."""
        leaf, port = self.locate(rank)
        if switch == self.spine:
            return leaf
        return port if switch == leaf else self.uplink_port


class TreeBus:
    """The tree's switches behind one switch's registers (module docstring).

    Members
    -------
    topology : TreeTopology
    buses : list
        One register bus per switch (``async read(addr)``, ``async write(addr, value)``), leaves then spine.
    params : SwitchParams
        The logical switch's (``topology.logical_params``).
    regs : RegisterMap
    """

    def __init__(self, topology: TreeTopology, buses):
        if len(buses) != topology.switches:
            raise TreeError(f"{len(buses)} switch buses for a tree of {topology.switches} switches")
        self.topology, self.buses = topology, list(buses)
        self.params = topology.logical_params
        self.regs: RegisterMap = register_map(self.params)
        self._maps = [register_map(topology.params(i)) for i in range(topology.switches)]
        self._decode = {reg.address(i): (reg, i) for reg in self.regs for i in range(reg.count)}
        self._stored = {r.name: r.reset for r in self.regs if r.kind is Kind.CONFIG}
        self._aged: list[tuple[int, int, int, int]] = []     # leaves' aged sets: (slot, set, rule, rank ports)

    async def check(self) -> str | None:
        """Why the tree cannot aggregate (None: it can): a leaf without the uplink action."""
        for leaf in range(self.topology.leaves):
            regmap = self._maps[leaf]
            features = regmap["FEATURES"].unpack(await self.buses[leaf].read(regmap["FEATURES"].address()))
            if not features.get("uplink"):
                return f"leaf {leaf} has no uplink action (FEATURES.uplink = 0)"
        return None

    # ------------------------------------------------------------------ writes
    async def _each(self, name: str, value: int) -> None:
        """The same write on every switch."""
        for i in range(self.topology.switches):
            await self.buses[i].write(self._maps[i][name].address(), value)

    async def _apply(self, switch: int, writes) -> None:
        for addr, value in writes:
            await self.buses[switch].write(addr, value)

    def _staged(self, name: str) -> dict:
        return self.regs[name].unpack(self._stored[name])

    async def write(self, addr: int, value: int) -> None:
        entry = self._decode.get(int(addr) & ~3)
        if entry is None:
            return
        reg = entry[0]
        value = int(value) & _MASK
        if reg.kind is Kind.CONFIG:
            self._stored[reg.name] = value & sum(f.mask for f in reg.fields) if reg.fields else value
        if reg.kind not in (Kind.CONFIG, Kind.COMMAND) or reg.name in _STAGING + LOGICAL_ONLY:
            return
        if reg.name == "RULE_WRITE":
            await self._rule_write(reg.unpack(value))
        elif reg.name == "MAC_WRITE":
            await self._mac_write(reg.unpack(value))
        elif reg.name == "EPOCH":
            await self._uplinks()
            await self._each("EPOCH", value)
        elif reg.name == "AGING":
            for leaf in range(self.topology.leaves):
                await self.buses[leaf].write(self._maps[leaf]["AGING"].address(), value)
        elif reg.name == "AGED_POP":
            await self._collect_aged()
            self._aged[:1] = []
        else:       # SLOT_CLEAR, MAC_POLICY, SWITCH_MAC_*: the same on every switch
            await self._each(reg.name, value)

    async def _uplinks(self) -> None:
        """Every leaf's UPLINK register (the controller writes EPOCH once it programmed the switch)."""
        for leaf in range(self.topology.leaves):
            up = self._maps[leaf]["UPLINK"]
            await self.buses[leaf].write(up.address(), up.pack(port=self.topology.uplink_port, enable=1))

    def _logical_rule(self) -> Rule:
        g, l_, c = self._staged("RULE_GROUP"), self._staged("RULE_LAYER"), self._staged("RULE_CHUNK")
        ports, slots, kind = self._staged("RULE_PORTS"), self._staged("RULE_SLOTS"), self._staged("RULE_TYPE")
        everyone = (1 << self.topology.ranks) - 1
        if kind["dtype"] not in set(DType) or kind["red_op"] not in set(ReduceOp):
            raise TreeError(f"RULE_TYPE dtype {kind['dtype']}, red_op {kind['red_op']}: not a DType and a ReduceOp, "
                            f"the tree cannot translate the rule")
        return Rule(group=(g["value"], g["mask"]), layer=(l_["value"], l_["mask"]), chunk=(c["value"], c["mask"]),
                    contributors=ports["contributors"] & everyone, results=ports["results"] & everyone,
                    base=slots["base"], count_log2=slots["count_log2"], dtype=kind["dtype"], red_op=kind["red_op"],
                    acc_fp32=bool(kind["acc_fp32"]), saturate=bool(kind["saturate"]),
                    reproducible=bool(kind["reproducible"]))

    async def _rule_write(self, f: dict) -> None:
        if f["index"] >= self.params.rules:
            return
        per_switch = self.topology.rules_for(self._logical_rule()) if f["valid"] else [None] * self.topology.switches
        for i, rule in enumerate(per_switch):
            await self._apply(i, rule_writes(self._maps[i], f["index"], rule, valid=rule is not None))

    async def _mac_write(self, f: dict) -> None:
        if f["index"] >= self.params.mac_entries:
            return
        lo_w = self.regs["MAC_ADDR_LO"].field("mac").width
        mac = self._staged("MAC_ADDR_LO")["mac"] | self._staged("MAC_ADDR_HI")["mac"] << lo_w
        valid = bool(f["valid"]) and f["port"] < self.topology.ranks
        for i in range(self.topology.switches):
            entry = MacEntry(mac, self.topology.port_towards(i, f["port"])) if valid else None
            await self._apply(i, mac_writes(self._maps[i], f["index"], entry, valid=valid))

    async def _collect_aged(self) -> None:
        """Move every leaf's queued aged-set events into the tree's queue, their ports as rank ports."""
        for leaf in range(self.topology.leaves):
            regmap, bus = self._maps[leaf], self.buses[leaf]
            while True:
                e = regmap["AGED_EVENT"].unpack(await bus.read(regmap["AGED_EVENT"].address()))
                if not e["valid"]:
                    break
                ports = regmap["AGED_PORTS"].unpack(await bus.read(regmap["AGED_PORTS"].address()))["ports"]
                await bus.write(regmap["AGED_POP"].address(), 0)
                # the leaf speaks for its own ranks only: the others count as present
                rpl = self.topology.ranks_per_leaf
                own = ((1 << rpl) - 1) << leaf * rpl
                ranks = ((ports & ((1 << rpl) - 1)) << leaf * rpl) | (((1 << self.topology.ranks) - 1) & ~own)
                self._aged.append((e["slot"], e["set"], e["rule"], ranks))

    # ------------------------------------------------------------------ reads
    async def _read_each(self, name: str, element: int = 0) -> list[int]:
        return [await self.buses[i].read(self._maps[i][name].address(element))
                for i in range(self.topology.switches)]

    async def read(self, addr: int) -> int:
        entry = self._decode.get(int(addr) & ~3)
        if entry is None:
            return 0
        reg, index = entry
        if reg.name == "FEATURES":
            words = await self._read_each("FEATURES")
            fields = [self._maps[i]["FEATURES"].unpack(w) for i, w in enumerate(words)]
            return reg.pack(float_units=int(all(f["float_units"] for f in fields)),
                            reproducible=int(all(f["reproducible"] for f in fields)))
        if reg.kind is Kind.CONST:
            return reg.reset
        if reg.name == "EPOCH":
            epochs = await self._read_each("EPOCH")
            return 0 if 0 in epochs else self._stored["EPOCH"]
        if reg.kind is Kind.CONFIG or reg.kind is Kind.COMMAND:
            return self._stored.get(reg.name, 0) if reg.kind is Kind.CONFIG else 0
        if reg.name in ("AGED_EVENT", "AGED_PORTS"):
            if not self._aged:
                await self._collect_aged()
            if not self._aged:
                return 0
            slot, s, rule, ranks = self._aged[0]
            if reg.name == "AGED_EVENT":
                return reg.pack(slot=slot, rule=rule, set=s, valid=1)
            return reg.pack(ports=ranks, queued=min(len(self._aged), (1 << reg.field("queued").width) - 1))
        if reg.name in _PER_PORT:
            if index >= self.topology.ranks:
                return 0
            leaf, port = self.topology.locate(index)
            return await self.buses[leaf].read(self._maps[leaf][reg.name].address(port))
        if reg.name == "BUSY":
            return int(any(await self._read_each("BUSY")))
        values = [await self.buses[i].read(self._maps[i][reg.name].address(index))
                  for i in range(self.topology.switches) if index < self._maps[i][reg.name].count]
        if reg.kind is Kind.LEVEL:      # sets in use: every switch of the tree holds the group's sets
            return max(values, default=0)
        return sum(values) & _MASK


class TreeLink:
    """A deployed tree as the controller's link: a :class:`TreeBus` over each switch's control endpoint
    (:func:`cais.controller.switch.open_switch_link`: cais-switch endpoints or boards' serial links;
    ``addresses``: the leaves', then the spine's).

    The switches report their builds; every leaf must report the same one. ``cycle`` and ``clock_hz`` are
    the first leaf's (wall time in its clock).

    Members
    -------
    topology : TreeTopology
    bus : TreeBus
    links : list[ControlLink | SerialLink]
    params : SwitchParams
        The logical switch's: a port per rank.
    problem : str | None
        Why the tree cannot aggregate (:meth:`TreeBus.check`); None when it can.
    """

    def __init__(self, addresses, leaves: int, ranks_per_leaf: int, *, retry_for: float = 0.0):
        from .switch import open_switch_link
        addresses = list(addresses)
        if len(addresses) != leaves + 1:
            raise TreeError(f"{len(addresses)} switch endpoints for a tree of {leaves} leaves and a spine "
                            f"({leaves + 1}: the leaves', then the spine's)")
        self.links = [open_switch_link(a, retry_for=retry_for) for a in addresses]
        try:
            first = self.links[0].params
            for i, link in enumerate(self.links[1:leaves], start=1):
                if link.params != first:
                    raise TreeError(f"leaf {i} is built unlike leaf 0 ({link.params.slug()} against {first.slug()})")
            self.topology = TreeTopology(leaves, ranks_per_leaf, leaf_params=first,
                                         spine_params=self.links[-1].params)
        except TreeError:
            self.close()
            raise
        self.bus = TreeBus(self.topology, self.links)
        self.params = self.bus.params
        self.clock_hz = self.links[0].clock_hz
        self.backend = f"tree of {self.links[0].backend}"
        from ..link import run_sync
        self.problem = run_sync(self.bus.check())      # None: the tree aggregates

    @property
    def cycle(self) -> int:
        return self.links[0].cycle

    @property
    def around_io(self):
        return self.links[0].around_io

    @around_io.setter
    def around_io(self, factory) -> None:
        for link in self.links:
            link.around_io = factory

    async def read(self, addr: int) -> int:
        return await self.bus.read(addr)

    async def write(self, addr: int, value: int) -> None:
        await self.bus.write(addr, value)

    def close(self) -> None:
        for link in self.links:
            link.close()
