"""Stages G (the compares), T, B1 and B2: the taken header against the rule and MAC tables."""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import RegisterMap

from ..common.enums import Action, DropReason, DType, ReduceOp
from ..common.pipeline import register_copy
from ..control.tables import (MATCH_PARTS, MacTable, RuleTable, TableProgramSignature, field_bits, hits_of_parts,
                              lowest_one, or_tree, rule_layout)
from ..latency import RULE_LOOKUP
from ..parser.header import FrameHeader
from ..parser.ingress import frame_meta_layout
from ..sram.slots import rule_index_bits
from ..sram.state import slot_bits
from .layouts import bank_addr_bits

__all__ = ["RuleLookup", "carry_layout", "lookup_layout"]


def carry_layout(params: SwitchParams) -> data.StructLayout:
    """What a header carries from B2 to its decision."""
    P = params.ports
    meta = frame_meta_layout(params)
    kind = data.StructLayout({"dtype": DType, "op": ReduceOp, "acc_fp32": 1, "saturate": 1})
    return data.StructLayout({
        "port": range(P), "me": P, "slot": slot_bits(params), "set": 1, "tag": 32, "plen": params.slot_len_bits,
        "next_tag": 32,                         # the slot's next chunk: tag + the quota's count
        "row_base": bank_addr_bits(params), "rows": range(params.rows_per_set + 1),
        "beats": meta["beats"].shape, "length": meta["length"].shape,
        "cais": proto.CAIS_HEADER_BYTES * 8, "contributors": P, "results": P, "kind": kind,
        "rule": rule_index_bits(params),        # the rule entry (its index), for sets_in_use
        # the uplink action (docs/protocol.md section 13): the uplink port (one-hot; 0: the rule has no
        # uplink action in force), the frame is the parent's result, its destination MAC (wire order)
        **({"up": P, "parent": 1, "dst": 48} if params.uplink else {}),
    })


def _slot_of(base, seq, quota):
    """The slot a header maps to: its rule's base plus its sequence number within the group's quota (at
    full width; every slot >= ``slots`` is BAD_SLOT)."""
    return base + (seq & quota)


def lookup_layout(params: SwitchParams) -> data.StructLayout:
    """A header after B2: its stateless action, the slot it maps to, an ordinary frame's MAC lookup."""
    P = params.ports
    return data.StructLayout({
        "action": Action, "reason": DropReason, "mask": P,
        "slot": 33,                             # base + (seq & quota): >= slots is BAD_SLOT
        "l2": 1, "group": 1, "mac_hit": 1, "mac_mask": P,     # an ordinary frame: its destination
        "host_strict": 1,                       # ... a host frame under MAC_POLICY.host_strict: never flooded
        # the source MAC is bound to another port (SPOOFED_SOURCE): applied in S0, over the action, the
        # reason and ``l2`` (which it overrides), so that the binding's priority pick is not in front of
        # B2's drop chain
        "spoofed": 1,
        "c": carry_layout(params),
    })


class RuleLookup(wiring.Component):
    """The rule and MAC lookups of the taken header, and the drops that need no slot state.

    Stages: G: the rule and MAC compares of every port's offered header at once, registered in
    ``MATCH_PARTS`` parts per entry (the granted port's header is still the one offered when it is taken);
    T: every offered header's hits (its parts ANDed) and winning rule (one-hot) found from G's registers,
    the take selects the taken header's (and the taken header, by the binary port), registered; B1: the rule's fields by an AND-OR pick, the winning MAC entry one-hot, the taken
    header's source MAC against the MAC entries (in parts) and which entries are bound to its port;
    B2: slot = base + (seq & quota), set, the source binding (``spoofed``, a register of its own: S0 makes
    it the SPOOFED_SOURCE drop, over the rest) and the stateless drops of a CAIS frame, the MAC entry's
    port.

    The source is compared for the taken header only (one header per cycle), not for every port's
    offered one as the destination is: the MAC table's compares grow by one key, not by the port count.

    A header meets the rule table twice: its match in G and its rule's fields in B1, two cycles later (a
    RULE_WRITE in between, to the entry it matched, gives it the new entry's fields: the control plane
    does not rewrite a group's rule under its traffic).

    Members
    -------
    headers[p] : In(frame_meta_layout)
        Port p's offered header.
    take : In(ports); port : In(range(ports)); taken_stateful : In(1)
        The arbiter's take (one-hot, binary) and whether the taken header may need the slot state.
    program : In(TableProgramSignature)
        Table programming (the rule and MAC tables live here).
    o : Out(stream.Signature(lookup_layout, always_ready=True))
        The header in B2 (registers), ``latency`` cycles after its take.
    read_slot : Out(slot bits)
        The slot of the header entering B2 (a register of B1: the low bits of ``base + (seq & quota)``,
        found beside B2's own full sum, so that the slot-state memory's address pins hang on a flip-flop,
        not on the sum's carry chain: the whole switch measured 9 ns of routing on that path): the
        slot-state read is addressed from it, so the read's output is registered with B2.
    stateful_next : Out(1)
        A header that may need the slot state is in T or B1 in the next cycle: from registers only (the
        take, T's bit), for the maintenance's wait, which registers it.
    stateful_b2 : Out(1)
        A register: the header in B2 needs the slot state (an all-reduce header B2 aggregates), for the
        maintenance's wait (B2's decode of ``o`` registered with it, so the wait reads one flip-flop here).
    busy : Out(1)
        A header is in T, B1 or B2.
    uplink : In(32)
        Only with ``params.uplink``: the UPLINK register's word (docs/protocol.md section 13). A parent's
        result (flags RESULT; the ingress lets it in on the uplink port only) must match a rule with the
        uplink action in force (else FOREIGN_PORT); all-gather and broadcast frames of such a rule go to
        its results and the uplink port, and come from its contributors or the uplink port.

    ``latency`` (:data:`cais.hdl.latency.RULE_LOOKUP`, 3): a header taken in cycle t is on ``o`` in cycle t + 3.
    """

    latency = RULE_LOOKUP

    def __init__(self, params: SwitchParams, regmap: RegisterMap):
        self.params, self.regmap = params, regmap
        P = params.ports
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "headers": In(self.meta_layout).array(P),
            "take": In(P), "port": In(range(P)), "taken_stateful": In(1),
            "program": In(TableProgramSignature(regmap)),
            "o": Out(stream.Signature(lookup_layout(params), always_ready=True)),
            "read_slot": Out(slot_bits(params)), "stateful_next": Out(1), "stateful_b2": Out(1),
            "busy": Out(1),
            **({"uplink": In(32)} if params.uplink else {}),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, R = prm.ports, prm.rules
        take = self.take
        # ------------------------------------------------------------ G: the compares, in parts
        m.submodules.rules = rules = RuleTable(prm, self.regmap, keys=P)
        # keys 0 .. P-1: the offered headers' destinations (G); key P: the taken header's source (B1)
        m.submodules.macs = macs = MacTable(prm, self.regmap, keys=P + 1)
        wiring.connect(m, wiring.flipped(self.program), rules.program, macs.program)
        # Registered in parts (MATCH_PARTS per entry), ANDed in T: no stage holds a whole compare tree.
        g_hits = [Signal(R * MATCH_PARTS, name=f"g_hits{p}", reset_less=True) for p in range(P)]
        g_mac = [Signal(prm.mac_entries * MATCH_PARTS, name=f"g_mac{p}", reset_less=True) for p in range(P)]
        for p, h in enumerate(FrameHeader(meta.hdr) for meta in self.headers):
            m.d.comb += [rules.key[p].group_id.eq(h.group_id), rules.key[p].layer_id.eq(h.layer_id),
                         rules.key[p].chunk_id.eq(h.chunk_id), macs.mac[p].eq(h.dst_mac)]
            m.d.sync += [g_hits[p].eq(rules.parts[p]), g_mac[p].eq(macs.parts[p])]

        # ------------------------------------------------------------ T: the take, the header registered
        a_valid, a_port, a_me, a_sf = Signal(), Signal(range(P)), Signal(P), Signal()
        a_meta = Signal(self.meta_layout, reset_less=True)
        a_pick, a_mac = Signal(R, reset_less=True), Signal(prm.mac_entries, reset_less=True)
        # The header by the binary port (a mux per bit), so the wide header does not load ``take``, which
        # drives the picks' mux.
        meta = Array(h.as_value() for h in self.headers)[self.port]
        # Each offered header's winning rule (its parts ANDed, the lowest hit) and the MAC entries that
        # hold its address, from G's registers: the take only selects a finished pick.
        g_pick = [lowest_one(hits_of_parts(g_hits[p], R), R) for p in range(P)]
        g_mac_hits = [hits_of_parts(g_mac[p], prm.mac_entries) for p in range(P)]
        m.d.sync += [
            a_valid.eq(take.any()), a_port.eq(self.port), a_me.eq(take), a_sf.eq(self.taken_stateful),
            a_meta.eq(meta),
            a_pick.eq(or_tree(Mux(take[p], g_pick[p], 0) for p in range(P))),
            a_mac.eq(or_tree(Mux(take[p], g_mac_hits[p], 0) for p in range(P))),
        ]

        # ------------------------------------------------------------ B1: the rule's and the MAC entry's fields
        m.d.comb += rules.pick.eq(a_pick)
        m_valid, m_port, m_me = Signal(), Signal(range(P)), Signal(P)
        m_meta = Signal(self.meta_layout, reset_less=True)
        m_hit, m_rule, m_quota = Signal(), Signal(rule_layout(prm), reset_less=True), Signal(32, reset_less=True)
        m_mac = Signal(prm.mac_entries, reset_less=True)
        m_entry = Signal(rule_index_bits(prm), reset_less=True)       # the winning rule's index
        # the source against the entries, in parts; the entries bound to the ingress port
        E = prm.mac_entries
        m_src = Signal(E * MATCH_PARTS, reset_less=True)
        m_own = Signal(E, reset_less=True)
        # The source address the MAC table compares has a register of its own beside the compares (T's
        # header register feeds every stage after it and sits apart: switch_int's limit at 100.79 MHz was
        # a_meta -> the source's compare parts -> m_src, 1.71 ns logic + 8.22 ns routing, 5.07 ns on the
        # first net).
        a_src_mac = register_copy(m, FrameHeader(data.View(self.meta_layout, meta).hdr).src_mac, "a_src_mac",
                                  platform)
        m.d.comb += macs.mac[P].eq(a_src_mac)
        m.d.sync += [m_src.eq(macs.parts[P]), m_own.eq(Cat(*((macs.port_masks[i] & a_me).any() for i in range(E))))]
        m.d.sync += m_entry.eq(or_tree(Mux(a_pick[e], e, 0) for e in range(R)))
        # the slot-state read's address, found here from the picked rule (see read_slot)
        m_read_slot = Signal(slot_bits(prm), reset_less=True)
        # whether the header is a CAIS frame (its EtherType), registered here: at the head of B2's drop
        # chain the compare was the float switch's limit at 84.57 MHz (m_meta -> the EtherType compare ->
        # the chain -> b_action, 2.38 ns logic + 9.44 ns routing)
        m_cais = Signal()
        m.d.sync += m_cais.eq(FrameHeader(a_meta.hdr).is_cais)
        # Each rule's slot for the taken header, summed in parallel, and the picked one chosen after the
        # sums (the pick's AND-OR, then the sum, was the decision's limit alone: 8.32 ns, 2.0 ns of it the
        # pick's routing); the read address's bits need only the operands' low bits.
        a_seq = FrameHeader(a_meta.hdr).seq_num
        sums = [_slot_of(rules.entry[e].base, a_seq, rules.quota[e])[:len(m_read_slot)] for e in range(R)]
        m.d.sync += m_read_slot.eq(or_tree(Mux(a_pick[e], sums[e], 0) for e in range(R)))
        m.d.comb += self.read_slot.eq(m_read_slot)
        m.d.sync += [
            m_valid.eq(a_valid), m_port.eq(a_port), m_me.eq(a_me), m_meta.eq(a_meta),
            m_hit.eq(a_pick.any()), m_rule.eq(rules.picked), m_quota.eq(rules.picked_quota),
            m_mac.eq(lowest_one(a_mac, prm.mac_entries)),           # the winning MAC entry
        ]
        m.d.comb += macs.pick.eq(m_mac)
        spoofed = (lowest_one(hits_of_parts(m_src, E), E) & ~m_own).any()
        self._b2(m, m_valid, m_port, m_me, m_meta, m_cais, m_hit, m_rule, m_quota, m_entry, macs, spoofed)
        b = self.o
        m.d.comb += [
            self.stateful_next.eq((take.any() & self.taken_stateful) | (a_valid & a_sf)),
            self.busy.eq(a_valid | m_valid | b.valid),
        ]
        return m

    def _b2(self, m, m_valid, m_port, m_me, m_meta, m_cais, m_hit, rule, m_quota, m_entry, macs, spoofed):
        """B2: slot and set, the source binding and the stateless checks, registered and shown on ``o``."""
        prm = self.params
        P, B = prm.ports, prm.beat_bytes
        hdr = FrameHeader(m_meta.hdr)
        # Slot and set from seq_num within the group's quota, at full width: with count_log2 up to 31 the
        # offset can be any 32-bit value, and every slot >= slots is BAD_SLOT (found in S0).
        seq = hdr.seq_num
        slot = Signal(33)
        m.d.comb += slot.eq(_slot_of(rule.base, seq, m_quota))

        b_valid, b_action, b_reason, b_mask = Signal(), Signal(Action), Signal(DropReason), Signal(P)
        b_slot = Signal(33, reset_less=True)
        b_l2, b_group, b_mac_hit, b_mac_mask = Signal(), Signal(), Signal(), Signal(P)   # an ordinary frame
        b_strict, b_spoofed = Signal(), Signal()
        b_c = Signal(carry_layout(prm), reset_less=True)
        s_action, s_reason, s_mask = Signal(Action), Signal(DropReason), Signal(P)

        def drop(reason):
            return [s_action.eq(Action.DROP), s_reason.eq(reason)]

        def forward():
            # to the mask's ports (s_mask), a drop when it names none
            return [s_action.eq(Mux(s_mask == 0, Action.DROP, Action.FORWARD)), s_reason.eq(DropReason.NO_ROUTE)]

        if prm.uplink:
            # the rule's uplink port, one-hot, while its uplink action is in force (UPLINK.enable, a port
            # the switch has); a parent's result (only the uplink port lets one in: ingress checks)
            up_reg = self.regmap["UPLINK"]
            up_port, up_en = field_bits(self.uplink, up_reg.field("port")), field_bits(self.uplink, up_reg.field("enable"))
            up = Signal(P)
            m.d.comb += up.eq(Mux(rule.uplink & up_en, (Const(1, 1) << up_port)[:P], 0))
            parent = (hdr.flags & int(proto.Flags.RESULT)) != 0
            sources = rule.contributors | Mux(m_meta.all_reduce, 0, up)
            dests = rule.results | up
        else:
            sources, dests = rule.contributors, rule.results
        # The mask means something only for FORWARD (the lanes read it with the action): it is the
        # rule's destinations whatever the checks say, so none of them drives its register (the lookup's
        # limit was that chain into the mask's reset).
        m.d.comb += s_mask.eq(dests & ~m_me)
        # (a spoofed source is dropped in S0 whatever is decided here: b_spoofed)
        with m.If(~m_cais):
            m.d.comb += s_action.eq(Action.FORWARD)       # (its ports are found in S0)
        with m.Elif(~m_hit):
            m.d.comb += drop(DropReason.NO_RULE)
        with m.Elif(Mux(parent, ~up.any(), ~(sources & m_me).any()) if prm.uplink else ~(sources & m_me).any()):
            m.d.comb += drop(DropReason.FOREIGN_PORT)
        with m.Elif(~m_meta.all_reduce):
            m.d.comb += forward()
        with m.Elif((hdr.dtype != rule.dtype) | (hdr.red_op != rule.red_op)):
            m.d.comb += drop(DropReason.TYPE_MISMATCH)
        with m.Else():
            m.d.comb += s_action.eq(Action.AGGREGATE)      # (BAD_SLOT is checked in S0)

        m.d.sync += [
            self.stateful_b2.eq(m_valid & (s_action == Action.AGGREGATE)),
            b_valid.eq(m_valid), b_action.eq(s_action), b_reason.eq(s_reason), b_mask.eq(s_mask), b_slot.eq(slot),
            b_l2.eq(~m_cais), b_spoofed.eq(spoofed), b_group.eq(hdr.dst_is_group),
            b_strict.eq((hdr.ethertype == proto.HOST_ETHERTYPE)
                        & field_bits(self.program.mac_policy, self.regmap["MAC_POLICY"].field("host_strict"))), b_mac_hit.eq(macs.hit), b_mac_mask.eq(macs.port_mask),
            b_c.port.eq(m_port), b_c.me.eq(m_me), b_c.set.eq(seq.bit_select(rule.count_log2, 1)),
            b_c.tag.eq(seq), b_c.plen.eq(hdr.payload_len),
            # count = quota + 1, the bit above the quota's ones (bitwise: no second adder)
            b_c.next_tag.eq(seq + (((m_quota << 1) | 1) & ~m_quota)),
            b_c.cais.eq(hdr.cais_bytes()), b_c.rows.eq((hdr.payload_len + B - 1) >> ceil_log2(B)),
            b_c.beats.eq(m_meta.beats), b_c.length.eq(m_meta.length),
            b_c.contributors.eq(rule.contributors), b_c.results.eq(rule.results), b_c.rule.eq(m_entry),
            b_c.kind.dtype.eq(rule.dtype), b_c.kind.op.eq(rule.red_op), b_c.kind.saturate.eq(rule.saturate),
            # fp16/bf16 accumulated in fp32 inside the fold (the flag means nothing for other types)
            b_c.kind.acc_fp32.eq(rule.acc_fp32 & ((rule.dtype == DType.FP16) | (rule.dtype == DType.BF16))),
        ]
        if prm.uplink:
            m.d.sync += [b_c.up.eq(up), b_c.parent.eq(parent), b_c.dst.eq(hdr.bits[:48])]
        o = self.o.payload
        m.d.comb += [
            self.o.valid.eq(b_valid), o.action.eq(b_action), o.reason.eq(b_reason), o.mask.eq(b_mask),
            o.slot.eq(b_slot), o.l2.eq(b_l2), o.group.eq(b_group), o.mac_hit.eq(b_mac_hit),
            o.mac_mask.eq(b_mac_mask), o.host_strict.eq(b_strict), o.spoofed.eq(b_spoofed), o.c.eq(b_c),
        ]
