"""Frame-level reference model of the CAIS switch (docs/protocol.md).

The model is programmed and read like the hardware, through the byte addresses of
:func:`cais.registers.register_map`, so ``RegisterFile(model, register_map(params))`` works on it. Frames go
in one at a time with :meth:`SwitchModel.receive`, which returns the frames the switch emits. It has no
notion of time but a clock for set aging: one call is one frame processed to completion at the model's
current cycle (the order in which the hardware's ingress arbiter serves the ports is the order of the
calls), and :meth:`SwitchModel.advance` moves the clock on.

Aging (the AGING register, docs/registers.md): a partly filled set that took no contribution for more than
``age x AGE_UNIT`` cycles is aged, at the first :meth:`~SwitchModel.advance` (or
:meth:`~SwitchModel.advance_to`) that carries the clock past that point; the hardware ages it anywhere up to
one scan period later (:func:`cais.registers.aging_period`), which the documented bound allows. Sets aged
by one call are aged in ascending (slot, set) order. SETS_IN_USE counts each slot's non-empty sets for the
rule entry of the all-reduce frame that last reached the slot's state.

The element arithmetic is :mod:`cais.numerics`. Each rule carries the element type and operator its
all-reduce frames must have (``RULE_TYPE``: dtype, red_op) and how its slots accumulate (acc_fp32,
saturate, reproducible). A shadow set's values are an accumulator of ``max_payload`` bytes: the wire
type's values, or float32 for fp16/bf16 with acc_fp32. Every kind of rule takes payloads up to
``max_payload`` (for every kind of rule; longer ones are BAD_PAYLOAD_LEN at ingress, so
PAYLOAD_TOO_LONG is never counted).
A set's first contribution fixes its payload_len: a later frame of the same chunk with another
payload_len is LENGTH_MISMATCH, so every contribution of a chunk carries the same ``n`` elements. The
first is stored as it came (widened with acc_fp32), each further one combines into those ``n``
accumulator elements, and a result carries them (rounded once to the wire type with acc_fp32). Every
rule keeps the contributions aside, as the switch's per-port banks do, and, when the set completes, folds
them in ascending port order: the accumulator is what arrival in port order would have given, whatever
the order of arrival (docs/numerics.md section 11).

Aggregation trees (``SwitchParams.uplink``, docs/protocol.md section 13): a rule with the uplink action
(RULE_TYPE.uplink, while UPLINK.enable) sends its set's fold, once every local contributor is in, as one
contribution frame to the parent switch on UPLINK.port and keeps it (the set is *sent*, not yet done); a
local repeat then sends the partial again; the parent's result, a RESULT frame arriving on the uplink
port, becomes the set's value, is multicast to the rule's result ports and makes the set done (an ordinary
completed set from then on: repeats get it re-served, the ranks' implicit acknowledgements free it).
"""

from __future__ import annotations

import numpy as np

from cais import numerics
from cais.params import SwitchParams
from cais.protocol import (CAIS_HEADER_BYTES, ELEMENT_BYTES, ETH_HEADER_BYTES, ETHERTYPE, HEADERS_BYTES,
                           HOST_ETHERTYPE, MIN_FRAME_BYTES, SUPPORTED_OPS, CaisHeader, DropReason, DType, Flags, OpType,
                           ReduceOp, mac_to_bytes, result_mac)
from cais.registers import AGE_UNIT_LOG2, AGED_QUEUE_DEPTH, Access, Kind, Register, register_map

__all__ = ["SwitchModel", "SlotSetState"]

_MASK32 = 0xFFFF_FFFF

SlotSetState = tuple[int, int, bool]  # (bitmap, tag, done)


class _Rule:
    __slots__ = ("valid", "group", "group_mask", "layer", "layer_mask", "chunk", "chunk_mask",
                 "contributors", "results", "base", "count_log2", "dtype", "red_op", "acc_fp32", "saturate",
                 "reproducible", "uplink")

    def __init__(self):
        self.valid = False
        self.group = self.group_mask = self.layer = self.layer_mask = self.chunk = self.chunk_mask = 0
        self.contributors = self.results = self.base = self.count_log2 = 0
        self.dtype = self.red_op = 0        # raw 4-bit codes, as staged (need not be supported ones)
        self.acc_fp32 = self.saturate = self.reproducible = self.uplink = False

    @property
    def wide(self) -> bool:
        """fp16/bf16 accumulated in float32 (acc_fp32 means nothing for the other types)."""
        return numerics.widens(self.dtype, self.acc_fp32)

    @property
    def acc_type(self) -> np.dtype:
        """The numpy type of the rule's accumulator (bf16 as uint16 bits)."""
        return numerics.acc_dtype(self.dtype, self.acc_fp32)

    def matches(self, hdr: CaisHeader) -> bool:
        return (self.valid
                and (hdr.group_id & self.group_mask) == (self.group & self.group_mask)
                and (hdr.layer_id & self.layer_mask) == (self.layer & self.layer_mask)
                and (hdr.chunk_id & self.chunk_mask) == (self.chunk & self.chunk_mask))


class SwitchModel:
    """The switch, frame by frame. See the module docstring."""

    def __init__(self, params: SwitchParams = SwitchParams()):
        self.params = P = params
        self.regmap = register_map(P)
        self._port_mask = (1 << P.ports) - 1
        self._elems = P.max_payload // 4    # int32 elements of an unused set (values())
        # address -> (register, array index)
        self._decode: dict[int, tuple[Register, int]] = {}
        for reg in self.regmap:
            for i in range(reg.count):
                self._decode[reg.address(i)] = (reg, i)
        self._config = {r.name: r.reset for r in self.regmap if r.kind is Kind.CONFIG}
        self._counters = {r.name: [0] * r.count for r in self.regmap if r.kind is Kind.COUNTER}
        self._rules = [_Rule() for _ in range(P.rules)]
        # MAC table: (valid, mac, port) per entry
        self._macs = [(False, 0, 0)] * P.mac_entries
        # Slot state, indexed [slot, set]. Values are allocated on first use (slot memory can be large):
        # each is the set's accumulator, max_payload bytes of the accumulator type of the rule that used it.
        self._bitmap = np.zeros((P.slots, 2), dtype=np.uint32)
        self._tag = np.zeros((P.slots, 2), dtype=np.uint32)
        self._done = np.zeros((P.slots, 2), dtype=bool)
        self._sent = np.zeros((P.slots, 2), dtype=bool)        # uplink rules: partial sent, parent's result due
        self._length = np.zeros((P.slots, 2), dtype=np.uint32)   # payload_len of the chunk a set holds
        self._values: dict[tuple[int, int], np.ndarray] = {}
        # Reproducible rules: the contributions of an incomplete set, by port.
        self._parts: dict[tuple[int, int], dict[int, np.ndarray]] = {}
        # Aging: the clock (cycles), each set's cycle of its last accepted contribution and whether it aged
        # in this fill; the rule entry of the all-reduce frame that last reached each slot; the event queue.
        self._cycle = 0
        self._stamp = np.zeros((P.slots, 2), dtype=np.int64)
        self._aged = np.zeros((P.slots, 2), dtype=bool)
        self._writer = np.zeros(P.slots, dtype=np.int64)
        self._events: list[tuple[int, int, int, int]] = []      # (slot, set, rule entry, bitmap), oldest first

    # ------------------------------------------------------------------ register bus
    def read(self, addr: int) -> int:
        entry = self._decode.get(int(addr) & ~3)  # bits 1:0 of the address are ignored
        if entry is None:
            return 0  # unmapped addresses read as zero
        reg, i = entry
        if reg.kind is Kind.CONST:
            return reg.reset
        if reg.kind is Kind.CONFIG:
            return self._config[reg.name]
        if reg.kind is Kind.COUNTER:
            return self._counters[reg.name][i]
        if reg.kind is Kind.LEVEL:
            return self._level(reg.name, i)
        return 0  # COMMAND registers are write-only

    def write(self, addr: int, value: int) -> None:
        value = int(value)
        if not 0 <= value <= _MASK32:
            raise ValueError(f"write({addr:#x}, {value:#x}): value does not fit 32 bits")
        entry = self._decode.get(int(addr) & ~3)
        if entry is None or entry[0].access is Access.RO:
            return  # writes to unmapped or read-only addresses are ignored
        reg, _ = entry
        value &= self._field_mask(reg)  # bits outside the fields are reserved: ignored, read 0
        if reg.kind is Kind.CONFIG:
            self._config[reg.name] = value
        elif reg.kind is Kind.COMMAND:
            self._command(reg, reg.unpack(value))

    @staticmethod
    def _field_mask(reg: Register) -> int:
        if not reg.fields:
            return _MASK32
        mask = 0
        for f in reg.fields:
            mask |= f.mask
        return mask

    def _staged(self, name: str) -> dict:
        return self.regmap[name].unpack(self._config[name])

    def _command(self, reg: Register, f: dict) -> None:
        P = self.params
        if reg.name == "SLOT_CLEAR":
            if f["slot"] < P.slots:
                for s in (0, 1):
                    self._empty(f["slot"], s)
                self._writer[f["slot"]] = 0
        elif reg.name == "AGED_POP":
            if self._events:
                self._events.pop(0)
        elif reg.name == "RULE_WRITE":
            if f["index"] < P.rules:
                r = _Rule()
                g, l_, c = self._staged("RULE_GROUP"), self._staged("RULE_LAYER"), self._staged("RULE_CHUNK")
                ports, slots = self._staged("RULE_PORTS"), self._staged("RULE_SLOTS")
                kind = self._staged("RULE_TYPE")
                r.valid = bool(f["valid"])
                r.group, r.group_mask = g["value"], g["mask"]
                r.layer, r.layer_mask = l_["value"], l_["mask"]
                r.chunk, r.chunk_mask = c["value"], c["mask"]
                r.contributors = ports["contributors"] & self._port_mask
                r.results = ports["results"] & self._port_mask
                r.base, r.count_log2 = slots["base"], slots["count_log2"]
                r.dtype, r.red_op = kind["dtype"], kind["red_op"]
                r.acc_fp32, r.saturate = bool(kind["acc_fp32"]), bool(kind["saturate"])
                r.reproducible = bool(kind.get("reproducible", 0))
                r.uplink = bool(kind.get("uplink", 0))
                self._rules[f["index"]] = r
        elif reg.name == "MAC_WRITE":
            if f["index"] < P.mac_entries:
                lo_w = self.regmap["MAC_ADDR_LO"].field("mac").width
                mac = self._staged("MAC_ADDR_LO")["mac"] | (self._staged("MAC_ADDR_HI")["mac"] << lo_w)
                # An entry naming a port the switch does not have is written invalid.
                self._macs[f["index"]] = (bool(f["valid"]) and f["port"] < P.ports, mac, f["port"])
        else:  # pragma: no cover - a new command register the model does not know yet
            raise NotImplementedError(f"command register {reg.name}")

    def _empty(self, slot: int, s: int) -> None:
        """Empty one set (a SLOT_CLEAR empties both, an aging free one)."""
        self._bitmap[slot, s] = 0
        self._tag[slot, s] = 0
        self._done[slot, s] = False
        self._sent[slot, s] = False
        self._length[slot, s] = 0
        self._stamp[slot, s] = 0
        self._aged[slot, s] = False
        self._parts.pop((slot, s), None)

    def _level(self, name: str, index: int = 0) -> int:
        if name == "SLOTS_IN_USE":
            return int(np.count_nonzero(self._bitmap))
        if name == "SETS_IN_USE":
            return int(np.count_nonzero(self._bitmap[self._writer == index]))
        if name in ("AGED_EVENT", "AGED_PORTS"):
            if not self._events:
                return 0
            slot, s, rule, bitmap = self._events[0]
            reg = self.regmap[name]
            if name == "AGED_EVENT":
                return reg.pack(slot=slot, rule=rule, set=s, valid=1)
            return reg.pack(ports=bitmap, queued=len(self._events))
        if name == "BUSY":
            return 0   # the model handles each frame whole: nothing is ever in flight between calls
        raise NotImplementedError(f"level register {name}")  # pragma: no cover

    # ------------------------------------------------------------------ views for tests
    def counters(self) -> dict[str, int | list[int]]:
        """Every COUNTER and LEVEL register by name; per-port registers as lists."""
        out: dict[str, int | list[int]] = {}
        for reg in self.regmap:
            if reg.kind is Kind.COUNTER:
                vals = list(self._counters[reg.name])
                out[reg.name] = vals if reg.count > 1 else vals[0]
            elif reg.kind is Kind.LEVEL:
                vals = [self._level(reg.name, i) for i in range(reg.count)]
                out[reg.name] = vals if reg.count > 1 else vals[0]
        return out

    def sent(self, slot: int) -> tuple[bool, bool]:
        """Whether each set of ``slot`` sent its partial upstream and waits for the parent's result."""
        return tuple(bool(self._sent[slot, s] and not self._done[slot, s]) for s in (0, 1))

    def uplink_port(self) -> int | None:
        """The port of the uplink action (None: this switch has none, or UPLINK.enable is 0)."""
        if not self.params.uplink:
            return None
        up = self._staged("UPLINK")
        return up["port"] if up["enable"] and up["port"] < self.params.ports else None

    def slot_state(self, slot: int) -> tuple[SlotSetState, SlotSetState]:
        """((bitmap, tag, done), (bitmap, tag, done)) of the two shadow sets of ``slot``."""
        return tuple((int(self._bitmap[slot, s]), int(self._tag[slot, s]), bool(self._done[slot, s]))
                     for s in (0, 1))

    def values(self, slot: int, set: int) -> np.ndarray:  # noqa: A002 - the spec's name
        """A copy of the set's accumulator: as many native values as a frame of its type carries at most.

        Its type is the accumulator type of the rule that used the set: int32 for an int32 rule (as it
        always was), int16, int8, float32, float16, bf16 as uint16 bits, or float32 for fp16/bf16 with
        acc_fp32. A set never used reads as max_payload / 4 int32 zeros.
        """
        if not 0 <= slot < self.params.slots or set not in (0, 1):
            raise IndexError(f"slot {slot} set {set}: out of range")
        v = self._values.get((slot, set))
        return np.zeros(self._elems, dtype=np.int32) if v is None else v.copy()

    def aging_state(self, slot: int) -> tuple[tuple[int, bool], tuple[int, bool]]:
        """((stamp, aged), (stamp, aged)) of the two sets of ``slot``: the cycle of the set's last accepted
        contribution and whether it aged in this fill."""
        return tuple((int(self._stamp[slot, s]), bool(self._aged[slot, s])) for s in (0, 1))

    def switch_mac(self) -> int:
        return self._config["SWITCH_MAC_LO"] | (self._config["SWITCH_MAC_HI"] << 32)

    # ------------------------------------------------------------------ clock and aging
    @property
    def cycle(self) -> int:
        """The model's clock, in cycles (0 after construction); frames are received at this cycle."""
        return self._cycle

    def advance(self, cycles: int) -> list[tuple[int, int, int, int]]:
        """Move the clock on by ``cycles`` and age the sets that are then due (AGING); returns the sets aged
        as (slot, set, rule entry, bitmap)."""
        if cycles < 0:
            raise ValueError(f"advance({cycles}): cycles must not be negative")
        return self.advance_to(self._cycle + int(cycles))

    def advance_to(self, cycle: int) -> list[tuple[int, int, int, int]]:
        """Move the clock on to ``cycle`` (an earlier cycle leaves it where it is) and age the sets due."""
        self._cycle = max(self._cycle, int(cycle))
        aging = self.regmap["AGING"].unpack(self._config["AGING"])
        if not aging["age"]:
            return []
        limit = aging["age"] << AGE_UNIT_LOG2
        # a tree leaf's sent set is complete here (it waits for its parent, not for a rank): not aged
        due = ((self._bitmap != 0) & ~self._done & ~self._sent & ~self._aged & (self._cycle - self._stamp > limit))
        aged = []
        for slot, s in zip(*np.nonzero(due)):
            slot, s = int(slot), int(s)
            event = (slot, s, int(self._writer[slot]), int(self._bitmap[slot, s]))
            aged.append(event)
            rule = event[2]
            self._count("AGED_TOTAL")
            self._count("AGED", rule)
            if len(self._events) < AGED_QUEUE_DEPTH:
                self._events.append(event)
            else:
                self._count("AGED_LOST")
            if aging["free"]:
                self._empty(slot, s)
            else:
                self._aged[slot, s] = True
        return aged

    # ------------------------------------------------------------------ datapath
    def _count(self, name: str, index: int = 0, amount: int = 1) -> None:
        c = self._counters[name]
        c[index] = (c[index] + amount) & _MASK32

    def _drop(self, reason: DropReason) -> list:
        self._count(f"DROP_{reason.name}")
        return []

    def _emit(self, out: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        out.sort(key=lambda pf: pf[0])
        for port, frame in out:
            self._count("TX_FRAMES", port)
            self._count("TX_BYTES", port, len(frame))
        return out

    def _ports(self, mask: int) -> list[int]:
        return [p for p in range(self.params.ports) if mask >> p & 1]

    def receive(self, port: int, frame: bytes, framing_ok: bool = True, fcs_ok: bool = True
                ) -> list[tuple[int, bytes]]:
        """Process one frame arriving on ``port``; return the frames emitted as (egress_port, bytes).

        ``framing_ok=False`` models a frame whose tkeep broke the framing rule (BAD_FRAMING); its bytes
        are then the bytes whose tkeep was set. ``fcs_ok=False`` models a frame the MAC flagged bad
        (tuser on its last beat: BAD_FCS). The output is in ascending port order.
        """
        P = self.params
        if not 0 <= port < P.ports:
            raise ValueError(f"port={port}: out of range 0..{P.ports - 1}")
        frame = bytes(frame)
        L = len(frame)
        self._count("RX_FRAMES", port)
        self._count("RX_BYTES", port, L)

        # Ingress checks, in order (the first failing one names the reason).
        if not fcs_ok:
            return self._drop(DropReason.BAD_FCS)
        if not framing_ok or L == 0:  # an empty frame cannot have a valid last beat
            return self._drop(DropReason.BAD_FRAMING)
        if L > P.max_frame:
            return self._drop(DropReason.OVERSIZE)
        if L < ETH_HEADER_BYTES:
            return self._drop(DropReason.RUNT)
        is_cais = int.from_bytes(frame[12:14], "big") == ETHERTYPE
        if not is_cais:
            if self._spoofed(port, frame):
                return self._drop(DropReason.SPOOFED_SOURCE)
            return self._emit(self._ordinary(port, frame))
        if L < HEADERS_BYTES:
            return self._drop(DropReason.RUNT)
        hdr = CaisHeader.unpack(frame[ETH_HEADER_BYTES:ETH_HEADER_BYTES + CAIS_HEADER_BYTES])
        # a parent's result: exactly RESULT, on the uplink port, of an all-reduce (section 13)
        from_parent = (hdr.flags == Flags.RESULT and port == self.uplink_port()
                       and hdr.op_type == OpType.ALL_REDUCE)
        if (hdr.op_type not in {int(o) for o in SUPPORTED_OPS}
                or hdr.dtype not in {int(d) for d in P.dtypes}
                or hdr.red_op not in {int(r) for r in ReduceOp}
                or (hdr.flags & ~int(Flags.RETRANSMIT) and not from_parent)):
            return self._drop(DropReason.BAD_CODE)
        plen = hdr.payload_len
        if plen == 0 or plen > P.max_payload or plen % ELEMENT_BYTES[hdr.dtype]:
            return self._drop(DropReason.BAD_PAYLOAD_LEN)
        want = HEADERS_BYTES + plen
        if L != want and not (want < MIN_FRAME_BYTES and L == MIN_FRAME_BYTES):
            return self._drop(DropReason.BAD_LENGTH)
        if self._spoofed(port, frame):
            return self._drop(DropReason.SPOOFED_SOURCE)
        return self._emit(self._cais(port, frame, hdr))

    def _mac_port(self, mac: int) -> int | None:
        """The port of the lowest-index valid MAC entry holding ``mac`` (None: no entry holds it)."""
        return next((p for valid, m, p in self._macs if valid and m == mac), None)

    def _spoofed(self, port: int, frame: bytes) -> bool:
        """The frame's source MAC is bound to another port than ``port`` (an address in no entry is not)."""
        bound = self._mac_port(int.from_bytes(frame[6:12], "big"))
        return bound is not None and bound != port

    def _ordinary(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        everyone = self._port_mask
        out_port = None if frame[0] & 1 else self._mac_port(int.from_bytes(frame[0:6], "big"))  # group bit: flood
        if out_port is not None:
            dest = (1 << out_port) & everyone
        else:   # flooded, but never a host frame while MAC_POLICY.host_strict is set
            strict = (self._staged("MAC_POLICY")["host_strict"]
                      and int.from_bytes(frame[12:14], "big") == HOST_ETHERTYPE)
            dest = 0 if strict else everyone
        dest &= ~(1 << port)
        if not dest:
            return self._drop(DropReason.NO_ROUTE)
        self._count("FORWARDED")
        return [(p, frame) for p in self._ports(dest)]

    def _cais(self, port: int, frame: bytes, hdr: CaisHeader) -> list[tuple[int, bytes]]:
        P = self.params
        entry = next((e for e, r in enumerate(self._rules) if r.matches(hdr)), None)
        rule = None if entry is None else self._rules[entry]
        if rule is None:
            return self._drop(DropReason.NO_RULE)
        up = self._rule_uplink(rule)
        up_bit = 0 if up is None else 1 << up
        if hdr.flags & Flags.RESULT:        # only a parent's result gets here (ingress checks)
            return self._from_parent(entry, rule, frame, hdr) if up_bit else self._drop(DropReason.FOREIGN_PORT)
        forwarding = hdr.op_type in (OpType.ALL_GATHER, OpType.BROADCAST)
        if not (rule.contributors | (up_bit if forwarding else 0)) >> port & 1:
            return self._drop(DropReason.FOREIGN_PORT)
        if forwarding:      # a tree's leaf passes its ranks' frames up and the parent's down (section 13)
            dest = (rule.results | up_bit) & ~(1 << port)
            if not dest:
                return self._drop(DropReason.NO_ROUTE)
            self._count("FORWARDED")
            return [(p, frame) for p in self._ports(dest)]

        # ALL_REDUCE
        if hdr.dtype != rule.dtype or hdr.red_op != rule.red_op:
            return self._drop(DropReason.TYPE_MISMATCH)
        count = 1 << rule.count_log2
        t = hdr.seq_num
        slot, s = self._slot_of(rule, t)
        if slot >= P.slots:
            return self._drop(DropReason.BAD_SLOT)
        self._writer[slot] = entry          # every frame that reaches the slot state writes the slot
        w = 1 << port
        bitmap, tag, done = int(self._bitmap[slot, s]), int(self._tag[slot, s]), bool(self._done[slot, s])
        dtype = DType(hdr.dtype)
        n = hdr.payload_len // ELEMENT_BYTES[dtype]
        same_length = int(self._length[slot, s]) == hdr.payload_len
        out: list[tuple[int, bytes]] = []
        if tag == t and done:                                   # a. repeat after completion
            if not same_length:
                return self._drop(DropReason.LENGTH_MISMATCH)
            self._count("DUPLICATES")
            self._count("RESULTS_RESENT")
            out.append((port, self._result_frame(rule, hdr, slot, s)))
        elif bitmap == 0:                                       # b. first contribution
            self._values[slot, s] = np.zeros(P.max_payload // ELEMENT_BYTES[dtype], dtype=rule.acc_type)
            self._parts[slot, s] = {}
            self._add(slot, s, port, self._payload(frame, dtype, n))
            self._tag[slot, s] = t
            self._length[slot, s] = hdr.payload_len
            self._bitmap[slot, s] = w
            self._stamp[slot, s] = self._cycle
            self._aged[slot, s] = False
            self._done[slot, s] = self._sent[slot, s] = False
            self._count("CONTRIBUTIONS")
            if w == rule.contributors:
                out += self._filled(rule, hdr, frame, slot, s)
        elif tag != t:                                          # c. set busy with another chunk
            return self._drop(DropReason.TAG_MISMATCH)
        elif not same_length:                                   # the chunk, with another payload_len
            return self._drop(DropReason.LENGTH_MISMATCH)
        elif bitmap & w and up_bit and self._sent[slot, s]:     # a'. repeat while the parent's result is due
            self._count("DUPLICATES")
            self._count("PARTIALS_RESENT")
            out.append((up, self._set_frame(rule, hdr, slot, s, frame[0:6], Flags.RETRANSMIT)))
        elif bitmap & w:                                        # d. repeat before completion
            self._count("DUPLICATES")
        else:                                                   # e. a further contribution
            self._add(slot, s, port, self._payload(frame, dtype, n))
            bitmap |= w
            self._bitmap[slot, s] = bitmap
            self._stamp[slot, s] = self._cycle
            self._count("CONTRIBUTIONS")
            if bitmap == rule.contributors:
                out += self._filled(rule, hdr, frame, slot, s)
        # Implicit acknowledgement (cases a, b, d, e): the port has moved past the other set's chunk,
        # unless that set holds the slot's next chunk: then this frame is a stale copy, older than the
        # port's contribution there.
        if int(self._tag[slot, 1 - s]) != (t + count) & 0xFFFF_FFFF:
            self._bitmap[slot, 1 - s] &= ~np.uint32(w)
        return out

    def _rule_uplink(self, rule: _Rule) -> int | None:
        """The uplink port if ``rule`` has the uplink action and it is on (else None)."""
        return self.uplink_port() if rule.uplink else None

    @staticmethod
    def _slot_of(rule: _Rule, t: int) -> tuple[int, int]:
        """(slot, set) of seq_num ``t`` in ``rule``'s quota (docs/protocol.md 7.1)."""
        count = 1 << rule.count_log2
        return rule.base + (t % count), (t // count) % 2

    def _filled(self, rule: _Rule, hdr: CaisHeader, frame: bytes, slot: int, s: int) -> list[tuple[int, bytes]]:
        """Every contributor is in: the result multicast, or, for an uplink rule, the partial sent up."""
        up = self._rule_uplink(rule)
        if up is None:
            self._done[slot, s] = True
            return self._complete(rule, hdr, slot, s)
        self._fold(rule, hdr, slot, s)
        self._sent[slot, s] = True
        self._count("PARTIALS_SENT")
        return [(up, self._set_frame(rule, hdr, slot, s, frame[0:6], 0))]

    def _from_parent(self, entry: int, rule: _Rule, frame: bytes, hdr: CaisHeader) -> list[tuple[int, bytes]]:
        """A RESULT frame from the uplink port for an uplink rule (docs/protocol.md section 13)."""
        if hdr.dtype != rule.dtype or hdr.red_op != rule.red_op:
            return self._drop(DropReason.TYPE_MISMATCH)
        slot, s = self._slot_of(rule, hdr.seq_num)
        if slot >= self.params.slots:
            return self._drop(DropReason.BAD_SLOT)
        self._writer[slot] = entry
        if int(self._tag[slot, s]) != hdr.seq_num or not (self._sent[slot, s] or self._done[slot, s]):
            return self._drop(DropReason.TAG_MISMATCH)      # not a chunk this set sent up: stale or foreign
        if int(self._length[slot, s]) != hdr.payload_len:
            return self._drop(DropReason.LENGTH_MISMATCH)
        if self._done[slot, s]:                             # the parent's result again: had it already
            self._count("DUPLICATES")
            return []
        dtype = DType(hdr.dtype)
        values = self._payload(frame, dtype, hdr.payload_len // ELEMENT_BYTES[dtype])
        acc = numerics.fold(dtype, ReduceOp(hdr.red_op), [values], acc_fp32=rule.acc_fp32, saturate=rule.saturate)
        self._accumulator(rule, slot, s)[:len(acc)] = acc
        self._done[slot, s] = True
        self._count("CONTRIBUTIONS")
        return self._complete(rule, hdr, slot, s, fold=False)

    def _add(self, slot: int, s: int, port: int, values: np.ndarray) -> None:
        """One accepted contribution, kept aside until the set completes (then :meth:`_fold` combines the
        contributions in ascending port order)."""
        self._parts.setdefault((slot, s), {})[port] = values

    def _fold(self, rule: _Rule, hdr: CaisHeader, slot: int, s: int) -> None:
        """A set completes: its accumulator becomes what arrival in ascending port order would have given
        (the lowest port's contribution as it came, then each further one combined)."""
        parts = self._parts.pop((slot, s), {})
        folded = numerics.fold(DType(hdr.dtype), ReduceOp(hdr.red_op), [parts[p] for p in sorted(parts)],
                               acc_fp32=rule.acc_fp32, saturate=rule.saturate)
        self._accumulator(rule, slot, s)[:len(folded)] = folded

    @staticmethod
    def _payload(frame: bytes, dtype: DType, n: int) -> np.ndarray:
        return numerics.decode(dtype, frame[HEADERS_BYTES:HEADERS_BYTES + n * ELEMENT_BYTES[dtype]])

    def _accumulator(self, rule: _Rule, slot: int, s: int) -> np.ndarray:
        """The set's accumulator as ``rule``'s accumulator type (the array itself, for updating).

        A set only changes type when its rule was retyped while the set was in use (the driver clears the
        slots of a retyped rule first); the model then reads the same bytes as the new type.
        """
        acc = self._values.get((slot, s))
        if acc is None:   # pragma: no cover - a set with contributors always has values
            acc = self._values[slot, s] = np.zeros(self.params.max_payload // ELEMENT_BYTES[DType(rule.dtype)],
                                                   dtype=rule.acc_type)
        elif acc.dtype != rule.acc_type:
            acc = self._values[slot, s] = acc.view(rule.acc_type)
        return acc

    def _complete(self, rule: _Rule, hdr: CaisHeader, slot: int, s: int, fold: bool = True
                  ) -> list[tuple[int, bytes]]:
        self._count("COMPLETED")
        if fold:
            self._fold(rule, hdr, slot, s)
        res = self._result_frame(rule, hdr, slot, s)
        return [(p, res) for p in self._ports(rule.results)]

    def _result_frame(self, rule: _Rule, hdr: CaisHeader, slot: int, s: int) -> bytes:
        return self._set_frame(rule, hdr, slot, s, mac_to_bytes(result_mac(hdr.group_id)), Flags.RESULT)

    def _set_frame(self, rule: _Rule, hdr: CaisHeader, slot: int, s: int, dst: bytes, flags: int) -> bytes:
        """A frame carrying the set's value: a result (flags RESULT) or a partial for the parent (0, or
        RETRANSMIT when sent again); ``hdr`` with those flags, from the switch MAC to ``dst``."""
        dtype = DType(hdr.dtype)
        n = hdr.payload_len // ELEMENT_BYTES[dtype]
        acc = self._accumulator(rule, slot, s)
        payload = numerics.encode(dtype, numerics.result_values(dtype, acc[:n], acc_fp32=rule.acc_fp32))
        head = hdr.replace(flags=int(flags)).pack()
        return dst + mac_to_bytes(self.switch_mac()) + ETHERTYPE.to_bytes(2, "big") + head + payload
