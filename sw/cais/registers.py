"""The control/status register map: the one description from which the RTL register bank
(``cais.hdl.control.csr``), the software accessors (:class:`RegisterFile`) and docs/registers.md are derived.

All registers are 32 bits wide on a byte-addressed AXI4-Lite bus; offsets are multiples of 4. Counters
are free-running, count up, wrap modulo 2**32 and are never cleared while the switch runs (software
takes differences). Register arrays (one per port) repeat at a fixed stride.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .params import MAX_RULES, SwitchParams
from .protocol import SWITCH_MAC_DEFAULT, DropReason

__all__ = ["Access", "Kind", "Field", "Register", "RegisterMap", "register_map", "RegisterFile", "read_counters",
           "MAGIC", "PARAM_REGISTERS", "read_params",
           "VERSION", "COUNTER_EVENTS", "AGE_UNIT_LOG2", "AGED_QUEUE_DEPTH", "aging_period", "REGISTER_BITS"]

MAGIC = 0x43414953  # "CAIS"
VERSION = 0x0004_0006  # minor 6: the uplink action of aggregation trees (UPLINK, RULE_TYPE.uplink, FEATURES.uplink, PARTIALS_*); minor 5: MAX_FRAME (every build parameter readable, for a host without cais-switch's info); minor 4: SPOOFED_SOURCE (source MACs bound to their entry's port), MAC_POLICY; minor 3: a stale copy acknowledges nothing (docs/protocol.md 7.3); minor 2: SETS_IN_USE and set aging (AGING ...); minor 1: every rule folds in port order


#: log2 of the cycles in one unit of ``AGING.age``; the aging scanner visits one set per unit.
AGE_UNIT_LOG2 = 10
#: The most cycles from an age unit's start to its visit's write (the headers in flight drained, then the
#: visit's read, pick, decision and write: cais.hdl.decision.Maintenance.visit_latency); the "+ 13" of
#: AGING's bound. 12 before the visit's decision took two cycles (its write is a cycle later in every case).
AGING_VISIT_CYCLES = 13
#: Events the aged-set queue (``AGED_EVENT``, ``AGED_POP``) holds; one more is counted in AGED_LOST.
AGED_QUEUE_DEPTH = 8


REGISTER_BITS = 32   # every register's width (the AXI4-Lite data bus); counters wrap modulo 2**REGISTER_BITS


def aging_period(params: SwitchParams) -> int:
    """Cycles between two visits of the aging scanner to the same set: one set per age unit, every set
    of every slot in turn (docs/registers.md, AGING)."""
    return 2 * params.slots << AGE_UNIT_LOG2


class Access(enum.Enum):
    RO = "ro"   # read only
    RW = "rw"   # read and write
    WO = "wo"   # write only: writing performs an action; reads return 0


class Kind(enum.Enum):
    CONST = "const"       # a build parameter
    CONFIG = "config"     # state software writes
    COMMAND = "command"   # a write triggers an action in the switch
    COUNTER = "counter"   # event counter, wraps modulo 2**32
    LEVEL = "level"       # a live gauge of switch state


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    doc: str = ""

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lsb


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    access: Access
    kind: Kind
    doc: str
    fields: tuple[Field, ...] = ()
    count: int = 1         # > 1: an array, element i at offset + i * stride
    stride: int = 4
    reset: int = 0         # value after reset (CONFIG) or the constant (CONST)

    def address(self, index: int = 0) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"{self.name}[{index}]: index out of range 0..{self.count - 1}")
        return self.offset + index * self.stride

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name!r}")

    def pack(self, **values) -> int:
        word = 0
        for name, value in values.items():
            f = self.field(name)
            if not 0 <= int(value) < (1 << f.width):
                raise ValueError(f"{self.name}.{name}={value}: does not fit {f.width} bits")
            word |= int(value) << f.lsb
        return word

    def unpack(self, word: int) -> dict:
        return {f.name: (word >> f.lsb) & ((1 << f.width) - 1) for f in self.fields}


def _drop_doc(r: DropReason) -> str:
    return f"frames dropped because: {r.name.lower().replace('_', ' ')}"


#: Drop reasons added after the first map: their counters sit at :data:`LATER_DROPS_OFFSET` on, in code
#: order, so the counters and gauges of the first map keep their offsets.
LATER_DROPS = tuple(r for r in DropReason if r > DropReason.NO_ROUTE)
LATER_DROPS_OFFSET = 0x168

# The event counters of the switch core, in register order: (name, what increments it).
COUNTER_EVENTS = tuple(
    [(f"DROP_{r.name}", _drop_doc(r)) for r in DropReason if r not in LATER_DROPS]
    + [
        ("FORWARDED", "frames forwarded unchanged (ordinary frames, all-gather and broadcast), once per input frame"),
        ("CONTRIBUTIONS", "all-reduce contributions accepted into a slot set (first or later, not repeats)"),
        ("DUPLICATES", "repeated all-reduce contributions from a port already counted in the set"),
        ("COMPLETED", "chunks completed: result frames multicast to the rule's result ports"),
        ("RESULTS_RESENT", "stored results sent again to a single port that repeated its contribution"),
    ]
    + [(f"DROP_{r.name}", _drop_doc(r)) for r in LATER_DROPS]
)


@dataclass(frozen=True)
class RegisterMap:
    params: SwitchParams
    registers: tuple[Register, ...] = field(default=())

    def __getitem__(self, name: str) -> Register:
        for r in self.registers:
            if r.name == name:
                return r
        raise KeyError(f"no register named {name!r}")

    def __iter__(self):
        return iter(self.registers)

    @property
    def size(self) -> int:
        """Bytes of address space the map spans (a power of two)."""
        end = max(r.address(r.count - 1) + 4 for r in self.registers)     # past each array's last word
        size = 4
        while size < end:
            size *= 2
        return size


def register_map(params: SwitchParams = SwitchParams()) -> RegisterMap:
    P = params
    regs: list[Register] = []

    def add(name, offset, access, kind, doc, fields=(), **kw):
        regs.append(Register(name, offset, access, kind, doc, tuple(fields), **kw))

    # 0x000: identification and build parameters
    add("ID", 0x000, Access.RO, Kind.CONST, 'Magic number 0x43414953 ("CAIS").', reset=MAGIC)
    add("VERSION", 0x004, Access.RO, Kind.CONST, "Register map version: major in bits 31:16, minor in 15:0.",
        reset=VERSION)
    add("NUM_PORTS", 0x008, Access.RO, Kind.CONST, "Number of Ethernet ports.", reset=P.ports)
    add("DATA_WIDTH", 0x00C, Access.RO, Kind.CONST, "AXI4-Stream data width in bits.", reset=P.data_width)
    add("NUM_SLOTS", 0x010, Access.RO, Kind.CONST, "Aggregation slots (each has two shadow sets).", reset=P.slots)
    add("MAX_PAYLOAD", 0x014, Access.RO, Kind.CONST, "Largest CAIS payload per frame, bytes.", reset=P.max_payload)
    add("NUM_RULES", 0x018, Access.RO, Kind.CONST, "Rule-table entries.", reset=P.rules)
    add("NUM_MACS", 0x01C, Access.RO, Kind.CONST, "MAC-table entries.", reset=P.mac_entries)

    # 0x020: switch configuration and commands
    add("SWITCH_MAC_LO", 0x020, Access.RW, Kind.CONFIG,
        "Source MAC of frames the switch originates, bits 31:0 (wire bytes 2..5: the first byte on the "
        "wire is bit 47:40 of the address, so 02:ca:15:00:00:00 is HI=0x02CA, LO=0x15000000).", [Field("mac", 0, 32)], reset=SWITCH_MAC_DEFAULT & 0xFFFF_FFFF)
    add("SWITCH_MAC_HI", 0x024, Access.RW, Kind.CONFIG,
        "Source MAC of frames the switch originates, bits 47:32.", [Field("mac", 0, 16)], reset=SWITCH_MAC_DEFAULT >> 32)
    add("SLOT_CLEAR", 0x028, Access.WO, Kind.COMMAND,
        "Writing a slot index empties both shadow sets of that slot (bitmaps, tags and completion state); "
        "the controller does this for a group's quota when it creates or removes the group. A clear waits "
        "until no all-reduce header is in the pipeline (and for the reset sweep or an aging visit under way); "
        "SLOT_CLEARs written meanwhile queue (4) and are carried out in the order written, one every 5 "
        "cycles, so they may be written back to back. While the queue is full the switch holds the next "
        "AXI4-Lite write (any register) back (AWREADY and WREADY low) until a clear starts: none is lost. "
        "A slot index >= NUM_SLOTS is ignored.",
        [Field("slot", 0, 16, "slot index")])

    add("FEATURES", 0x02C, Access.RO, Kind.CONST, "What this build of the switch can reduce.",
        [Field("float_units", 0, 1, "fp32/fp16/bf16 reduction (without: integers only)"),
         Field("reproducible", 1, 1, "every all-reduce result is the fold of the contributions in ascending "
               "port order, whatever their arrival order (always 1 since the per-port banks)"),
         Field("uplink", 2, 1, "the uplink action of aggregation trees (UPLINK, RULE_TYPE.uplink; "
               "docs/protocol.md section 13)")],
        reset=int(P.float_units) | 1 << 1 | int(P.uplink) << 2)

    # 0x040: rule table, written through staging registers and committed by RULE_WRITE
    add("RULE_GROUP", 0x040, Access.RW, Kind.CONFIG, "Staging: group_id match value and mask (1 = compare bit).",
        [Field("value", 0, 8), Field("mask", 8, 8)])
    add("RULE_LAYER", 0x044, Access.RW, Kind.CONFIG, "Staging: layer_id match value and mask.",
        [Field("value", 0, 16), Field("mask", 16, 16)])
    add("RULE_CHUNK", 0x048, Access.RW, Kind.CONFIG, "Staging: chunk_id match value and mask.",
        [Field("value", 0, 16), Field("mask", 16, 16)])
    add("RULE_PORTS", 0x04C, Access.RW, Kind.CONFIG,
        "Staging: ports that contribute (bit p = port p) and ports that receive the result.",
        [Field("contributors", 0, 16), Field("results", 16, 16)])
    add("RULE_SLOTS", 0x050, Access.RW, Kind.CONFIG,
        "Staging: the group's slot quota: first slot and log2 of the number of slots.",
        [Field("base", 0, 16), Field("count_log2", 16, 5, "0..31: the quota is 2**count_log2 slots from base; "
                                                         "a chunk mapping to a slot >= NUM_SLOTS is BAD_SLOT")])
    add("RULE_TYPE", 0x058, Access.RW, Kind.CONFIG,
        "Staging: the element type and operator the rule's all-reduce frames must carry (a frame whose "
        "header differs is dropped as TYPE_MISMATCH), and how its slots accumulate (docs/numerics.md).",
        [Field("dtype", 0, 4, "DType code"), Field("red_op", 4, 4, "ReduceOp code"),
         Field("acc_fp32", 8, 1, "fp16/bf16 (SUM, MAX, MIN): accumulate in fp32, round to the wire format "
               "once at the end of the fold; 0: round after every addition. Ignored for int32/int16/int8/fp32"),
         Field("saturate", 9, 1, "integer SUM (int32, int16, int8): clamp to the type's range instead of "
               "wrapping. Ignored for MAX, MIN and the float types"),
         Field("reproducible", 10, 1, "the driver asked for results that do not depend on the arrival "
               "order; stored and read back. Every rule is folded in ascending port order (FEATURES."
               "reproducible), so it changes nothing in the switch"),
         Field("uplink", 11, 1, "the uplink action (aggregation trees, docs/protocol.md section 13): a completed "
               "set's fold is sent as one contribution to the parent switch on UPLINK.port, and the parent's "
               "result, arriving there, is what the rule's result ports get. Acts only while UPLINK.enable is 1 "
               "on a switch with FEATURES.uplink; otherwise stored, read back and ignored")])
    add("RULE_WRITE", 0x054, Access.WO, Kind.COMMAND,
        "Copies the staging registers into rule `index` and sets its valid bit to `valid`. "
        "Entry 0 has the highest priority.",
        [Field("index", 0, 8), Field("valid", 8, 1)])

    # 0x060: MAC table for ordinary frames
    add("MAC_ADDR_LO", 0x060, Access.RW, Kind.CONFIG,
        "Staging: MAC address bits 31:0 (bits 47:40 are the first byte on the wire, as for SWITCH_MAC).",
        [Field("mac", 0, 32)])
    add("MAC_ADDR_HI", 0x064, Access.RW, Kind.CONFIG, "Staging: MAC address bits 47:32.", [Field("mac", 0, 16)])
    add("MAC_WRITE", 0x068, Access.WO, Kind.COMMAND,
        "Writes entry `index`: the staged address goes out of `port`; `valid` enables the entry.",
        [Field("index", 0, 8), Field("port", 8, 4), Field("valid", 16, 1)])
    add("MAC_POLICY", 0x06C, Access.RW, Kind.CONFIG,
        "How the MAC table is enforced besides routing (docs/protocol.md section 5). Whatever this register "
        "holds, a frame whose source MAC is in a valid entry (the lowest-index one holding it) bound to "
        "another port than the ingress port is dropped as SPOOFED_SOURCE; an address in no entry is not bound.",
        [Field("host_strict", 0, 1, "1: host frames (EtherType 0x88B6) go only to the port of a valid entry: "
               "to a group address or an address in no entry they are dropped as NO_ROUTE, never flooded. 0 "
               "(the reset value): they are flooded like any ordinary frame. The controller sets it with the "
               "MAC entries, so a switch reset (which empties the table) floods them again until it is "
               "reprogrammed")])

    # 0x100: switch-core counters and gauges
    offset = 0x100
    for name, doc in COUNTER_EVENTS[:len(COUNTER_EVENTS) - len(LATER_DROPS)]:   # the later drops: below
        add(name, offset, Access.RO, Kind.COUNTER, f"Counts {doc}.")
        offset += 4
    add("SLOTS_IN_USE", offset, Access.RO, Kind.LEVEL,
        "Shadow sets currently holding a chunk that not every contributor has moved past (bitmap not empty).")
    add("BUSY", offset + 4, Access.RO, Kind.LEVEL,
        "1 while a frame is anywhere inside the switch (being received, queued, processed or sent), 0 when "
        "idle: the counters are then consistent (docs/protocol.md, accounting invariant). Exact in every "
        "cycle (docs/interface.md); a read returns the value of the cycle after its address was accepted. "
        "The slot-state sweep after reset is not a frame: it does not set BUSY.",
        [Field("busy", 0, 1)])

    # 0x200: per-port traffic counters, 16 bytes per port
    for i, (name, doc) in enumerate((("RX_FRAMES", "frames received (every frame, good or bad)"),
                                     ("RX_BYTES", "bytes received"),
                                     ("TX_FRAMES", "frames sent"),
                                     ("TX_BYTES", "bytes sent"))):
        add(name, 0x200 + 4 * i, Access.RO, Kind.COUNTER, f"Per port: {doc}.", count=P.ports, stride=0x10)

    # Added after the first map (offsets that were free; reliability, docs/reliability.md)
    add("EPOCH", 0x03C, Access.RW, Kind.CONFIG,
        "Free for the controller: it writes a nonzero value when it has programmed the switch, so a read of 0 "
        "tells it the switch was reset (every table and slot is empty again) and must be programmed anew.",
        [Field("epoch", 0, 32)])

    # Added for per-rule sets in use and set aging (issues 12, 13; docs/reliability.md, "Aged sets")
    unit, period = 1 << AGE_UNIT_LOG2, aging_period(P)
    add("AGING", 0x030, Access.RW, Kind.CONFIG,
        f"Set aging. A set that is partly filled (bitmap not empty, not complete) and has taken no contribution "
        f"for more than age x AGE_UNIT cycles is aged: counted in AGED_TOTAL and AGED[e] (e: the rule entry of "
        f"the frame that last wrote its slot), queued as an event (AGED_EVENT) and, with `free`, emptied (as a "
        f"SLOT_CLEAR empties a set; SLOTS_IN_USE and SETS_IN_USE drop). Duplicates and refused frames do not "
        f"feed a set. Bound: counted from the cycle of the decision of the set's last accepted contribution "
        f"to the cycle its state is written, a set is aged after more than age x AGE_UNIT cycles and at most "
        f"(age + 2 x NUM_SLOTS) x AGE_UNIT + {AGING_VISIT_CYCLES} cycles (here age x {unit} + {period} + "
        f"{AGING_VISIT_CYCLES}), plus the time the "
        f"scanner waits for SLOT_CLEARs written meanwhile. The scanner visits one set per AGE_UNIT cycles, "
        f"every set in turn, while age is not 0; a visit holds back new all-reduce headers (as a SLOT_CLEAR "
        f"does) until those in flight are decided, then reads, decides and writes: at most {AGING_VISIT_CYCLES} "
        f"cycles after "
        f"its unit starts. A set is aged at most once per fill (from its first contribution until it is "
        f"empty) and never when complete. With age 0 (the reset value) nothing is scanned or aged and the "
        f"switch's timing is that of a switch without aging. The bound holds for sets whose last contribution "
        f"came while age was not 0 or less than 2**16 units before it was set (the age stamps wrap).",
        [Field("age", 0, 16, f"0: off; else the age in units of AGE_UNIT ({unit}) cycles"),
         Field("free", 16, 1, "1: an aged set is also emptied (the surviving ranks' retransmissions start it "
               "anew); 0: it is only reported")])
    add("AGED_POP", 0x034, Access.WO, Kind.COMMAND,
        "Writing (any value) removes the oldest event from the aged-set queue (AGED_EVENT shows the next); "
        "nothing when the queue is empty.")
    add("AGE_UNIT", 0x038, Access.RO, Kind.CONST,
        "Cycles in one unit of AGING.age (a power of two); the aging scanner visits one set per unit.",
        reset=unit)
    add("AGED_TOTAL", 0x158, Access.RO, Kind.COUNTER, "Counts sets aged (AGING): the sum of AGED[e].")
    add("AGED_LOST", 0x15C, Access.RO, Kind.COUNTER,
        f"Counts aged sets whose event was not queued: the queue held {AGED_QUEUE_DEPTH} events (they are still "
        f"counted in AGED_TOTAL and AGED[e], and freed with AGING.free).")
    add("AGED_EVENT", 0x160, Access.RO, Kind.LEVEL,
        f"The oldest event of the aged-set queue ({AGED_QUEUE_DEPTH} events, in the order the sets aged): which "
        f"set aged; AGED_PORTS holds its contributors. AGED_POP removes it.",
        [Field("slot", 0, 16), Field("rule", 16, 8, "rule entry of the frame that last wrote the slot"),
         Field("set", 24, 1, "shadow set"), Field("valid", 31, 1, "1: the queue is not empty (0: every other "
                                                                      "field of AGED_EVENT and AGED_PORTS is 0)")])
    add("AGED_PORTS", 0x164, Access.RO, Kind.LEVEL,
        "The oldest aged-set event's contributor bitmap when it aged (bit p: port p had contributed; the "
        "rule's contributors not in it are the missing ranks), and the number of events queued.",
        [Field("ports", 0, 16), Field("queued", 16, 8, f"events in the queue, 0..{AGED_QUEUE_DEPTH}")])
    # Added for source binding (issue 29; docs/protocol.md sections 4 and 5)
    for k, r in enumerate(LATER_DROPS):
        add(f"DROP_{r.name}", LATER_DROPS_OFFSET + 4 * k, Access.RO, Kind.COUNTER, f"Counts {_drop_doc(r)}.")
    add("SETS_IN_USE", 0x300, Access.RO, Kind.LEVEL,
        "Per rule entry: the non-empty sets (as SLOTS_IN_USE counts them) of the slots whose state was last "
        "reached by an all-reduce frame of this entry. The entry is kept per slot, not per set: a frame that "
        "reaches a slot's state moves both of its sets to its entry, whatever the frame's outcome (a "
        "contribution, a duplicate, or a drop decided there: TAG_MISMATCH, LENGTH_MISMATCH); a frame dropped "
        "before the slot state (NO_RULE, FOREIGN_PORT, TYPE_MISMATCH, BAD_SLOT, any ingress check) moves "
        "nothing. The elements follow the slot state in the same cycle as SLOTS_IN_USE does and add up to it "
        "in every cycle.", count=P.rules, stride=8)
    add("AGED", 0x304, Access.RO, Kind.COUNTER, "Per rule entry: counts sets aged (AGING) whose slot this entry "
        "wrote last.", count=P.rules, stride=8)

    # Added so that a host reading only registers (cais.serial_link over the board's UART) rebuilds SwitchParams
    add("MAX_FRAME", 0x070, Access.RO, Kind.CONST, "Longest frame accepted on any port, bytes (longer ones are "
        "dropped as OVERSIZE).", reset=P.max_frame)

    # Added for aggregation trees (issue 27; docs/protocol.md section 13)
    add("UPLINK", 0x074, Access.RW, Kind.CONFIG,
        "The port towards the parent switch of an aggregation tree: rules with RULE_TYPE.uplink send their "
        "completed partials there, and result frames (flags RESULT) are accepted from it. Ignored on a switch "
        "without FEATURES.uplink.",
        [Field("port", 0, 4, "the uplink port"), Field("enable", 4, 1, "1: the uplink action is on")])
    add("PARTIALS_SENT", 0x180, Access.RO, Kind.COUNTER,
        "Counts partials sent to the parent switch: sets of uplink rules that every local contributor "
        "filled (once per chunk).")
    add("PARTIALS_RESENT", 0x184, Access.RO, Kind.COUNTER,
        "Counts partials sent to the parent again because a local contributor repeated its contribution "
        "while the set waited for the parent's result.")

    # the per-rule-entry arrays of the largest build (params.MAX_RULES) end where the 1 KiB map does
    assert all(r.offset + (MAX_RULES - 1) * r.stride + 4 <= 0x400 for r in regs if r.name in ("SETS_IN_USE", "AGED"))
    return RegisterMap(P, tuple(regs))


#: Where each field of SwitchParams is read: a CONST register, or (register, field) for a bit field of one.
PARAM_REGISTERS = {"ports": "NUM_PORTS", "data_width": "DATA_WIDTH", "slots": "NUM_SLOTS",
                   "max_payload": "MAX_PAYLOAD", "rules": "NUM_RULES", "mac_entries": "NUM_MACS",
                   "max_frame": "MAX_FRAME", "float_units": ("FEATURES", "float_units"),
                   "uplink": ("FEATURES", "uplink")}


async def read_params(read) -> SwitchParams:
    """The switch's build parameters through an asynchronous ``read(addr)`` of its CONST registers (whose
    offsets do not depend on the parameters). ValueError when ID is not :data:`MAGIC`, the map's major
    version is not this one's, or the values make no SwitchParams (the message names what)."""
    regs = register_map()
    ident = await read(regs["ID"].address())
    if ident != MAGIC:
        raise ValueError(f"register ID reads {ident:#010x}, not {MAGIC:#010x} (\"CAIS\"): not a CAIS switch")
    version = await read(regs["VERSION"].address())
    if version >> 16 != VERSION >> 16:
        raise ValueError(f"register map version {version >> 16}.{version & 0xFFFF}: this software speaks "
                         f"{VERSION >> 16}.x")
    values = {}
    for name, where in PARAM_REGISTERS.items():
        reg_name, field_name = where if isinstance(where, tuple) else (where, None)
        word = await read(regs[reg_name].address())
        values[name] = regs[reg_name].unpack(word)[field_name] if field_name else word
    values["float_units"], values["uplink"] = bool(values["float_units"]), bool(values["uplink"])
    return SwitchParams(**values)


async def read_counters(read, regmap: RegisterMap, kinds=(Kind.COUNTER, Kind.LEVEL)) -> dict:
    """Every counter and gauge through an asynchronous ``read(addr)``: name -> value, register arrays
    (per port) as lists; the shape of ``cais.sim.refmodel.SwitchModel.counters()``."""
    out: dict[str, int | list[int]] = {}
    for reg in regmap:
        if reg.kind in kinds:
            values = [await read(reg.address(i)) for i in range(reg.count)]
            out[reg.name] = values if reg.count > 1 else values[0]
    return out


class RegisterFile:
    """Named access to the switch's registers over any bus with ``read(addr)`` and ``write(addr, value)``.

    The bus methods may be plain functions or coroutines (cocotb, amaranth.sim): this class forwards
    whatever they return, so the caller awaits it when the bus is asynchronous.
    """

    def __init__(self, bus, regmap: RegisterMap):
        self.bus = bus
        self.map = regmap

    def read(self, name: str, element: int = 0):
        return self.bus.read(self.map[name].address(element))

    def write(self, name: str, value: int = 0, *, element: int = 0, **fields):
        """Write `value` with `fields` packed into it (field names may be anything, even ``index``)."""
        reg = self.map[name]
        if reg.access is Access.RO:
            raise PermissionError(f"register {name} is read-only")
        return self.bus.write(reg.address(element), value | reg.pack(**fields))
