"""The decision pipeline: one frame header per cycle, from the ingress ports' queued headers to a decision
for the port's lane and, for a set that completes or a resend, a result job.

Stages (one header per cycle, never stalled; the arbiter holds headers back instead)::

    G:  round-robin grant of a port with a header waiting and room in its lane; the rule and MAC
        compares of every port's offered header, in parts                         (registered: take, g_*)
    T:  the take; the taken header and its hits (the parts ANDed) registered, the winning rule
        one-hot                                                                             (a_*)
    B1: the rule's fields by AND-OR pick, the winning MAC entry one-hot                  (m_*)
    B2: slot = base + (seq & quota), set, the stateless drops of a CAIS frame, the MAC
        entry's port                                                                      (b_*)
    S0: the slot-state read (addressed from B2's slot), its output registered; BAD_SLOT; an
        ordinary frame's ports                                                           (r_*, f_mem0)
    S1: the two oldest writes the read missed merged in; which newer write is the newest (f_*)
    S2: the state forwarded from the two newer writes; tag and length compares, and
        whether the other set holds the slot's next chunk (no implicit acknowledgement then)  (u_*)
    U:  the previous header's write forwarded, SetUpdate: the new state and the outcome, registered
        (w_*, v_*)
    V:  the decision, its events and its job from the registered outcome (the outputs); in the same
        cycle, as W: the state write, the in_use counter

Every memory output is registered before logic, and the slot-state loop is split: the state read
misses the writes of the five headers ahead of it. They come from a short history of written states
(``w_*``, ``h1_*``, ``h2_*``; the slot matches are found a stage ahead): S1 merges the two oldest, S2
the next two, and U takes the fifth, the header one cycle ahead, from its registered result. The 32-bit
tag and the length compares are made in S2 (against the header one ahead too), so U works on bitmaps and
a few bits, and it drives nothing but the next state and a few registered outcome bits: the outputs
(decision, job, events) are made a cycle later in V, off the slot-state loop.

``take`` is a register: the grant is computed from this cycle's requests and takes the header in the
next cycle (the header stays offered until taken), which registers it through a mux driven by ``take``.
A port being taken is not granted again in the same cycle, so each port is granted at most every other
cycle and the ports together one header per cycle.

A header meets the rule table twice: its match in G and its rule's fields in B1, two cycles later (a
RULE_WRITE in between, to the entry it matched, gives it the new entry's fields: the control plane
does not rewrite a group's rule under its traffic).
"""

from amaranth.hdl import Array, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, AGED_QUEUE_DEPTH, RegisterMap

from .enums import Action, DropReason, DType, ReduceOp
from .header import FrameHeader
from .ingress import frame_meta_layout
from .slots import SetUpdate, SlotOutcome, age_stamp_bits, rule_index_bits, state_entry_layout, state_set_layout
from .tables import (MATCH_PARTS, MacTable, RuleTable, TableProgramSignature, field_bits, hits_of_parts, lowest_one,
                     or_tree, rule_layout)

__all__ = ["Decision", "decision_layout", "job_layout", "bank_addr_bits", "DECISION_LATENCY", "DECISION_HEADERS",
           "STATE_WRITE_LEAD"]

#: Clock edges from the cycle a header is taken (``take``) to its decision on ``push``/``decision``
#: (and its events, and its job on ``job_valid``/``job``).
DECISION_LATENCY = 8
#: Headers that may each still queue a job when ``hold`` is sampled: the one granted in that cycle (taken
#: in the next) and those taken in the ``DECISION_LATENCY + 1`` cycles up to it.
DECISION_HEADERS = DECISION_LATENCY + 2
#: Cycles from a header's slot-state write (W) to its decision on the outputs: the outputs are registered
#: in W's cycle (stage V), so the cycle that shows a decision also shows, in the state memory, its write.
STATE_WRITE_LEAD = 1


def writer_delta(entry: int, writer, new_used, old_used, old_rule):
    """The change of rule entry ``entry``'s sets in use when a frame of entry ``writer`` writes a slot:
    the slot's sets after the write (``new_used`` non-empty) count for the writer, and each set that was
    not empty before (``old_used[k]``) leaves the entry that stored it (``old_rule[k]``)."""
    return (Mux(writer == entry, new_used, 0) - (old_used[0] & (old_rule[0] == entry))
            - (old_used[1] & (old_rule[1] == entry)))


def new_stamp(accepted, now, stamp):
    """A set's age stamp after a frame: the current age unit if the frame was accepted into it (a
    duplicate or a refused frame does not feed the set), else unchanged."""
    return Mux(accepted, now, stamp)


def age_due(s, now, age):
    """Whether the visited set ``s`` (a state set) ages now: partly filled (bitmap not empty, not complete),
    not aged in this fill, and its last accepted contribution more than ``age`` units before ``now``
    (modulo the stamp's bits: the stamp bits leave room for the largest age and one scan period)."""
    elapsed = (now - s.stamp)[:len(s.stamp)]
    return (s.bitmap != 0) & ~s.done & ~s.aged & (elapsed > age)


def bank_addr_bits(params: SwitchParams) -> int:
    """Address bits of a contribution bank: one row per beat of payload, per shadow set of every slot."""
    return ceil_log2(params.slots * 2 * params.rows_per_set)


def decision_layout(params: SwitchParams) -> data.StructLayout:
    """What a lane needs to stream one frame."""
    return data.StructLayout({
        "action": Action,
        "mask": params.ports,                       # FORWARD: the egress ports
        "write": 1,                                 # AGGREGATE: write the payload rows into the port's bank
        "row_base": bank_addr_bits(params),         # ... from this bank row on
        "rows": range(params.rows_per_set + 1),     # ... this many
        "beats": range(params.max_frame_beats + 1),
        "length": range(params.max_frame + 1),      # bytes (the last beat's keep)
    })


def job_layout(params: SwitchParams) -> data.StructLayout:
    """A result to send: fold row ``0 .. rows-1`` of the set at ``row_base`` over the contributors' banks."""
    return data.StructLayout({
        "cais": proto.CAIS_HEADER_BYTES * 8,        # header of the triggering frame, wire order
        "mask": params.ports,                       # egress ports of the result
        "contributors": params.ports,               # banks folded, in ascending port order
        "row_base": bank_addr_bits(params),
        "rows": range(params.rows_per_set + 1),     # ceil(payload_len / B)
        "dtype": DType, "op": ReduceOp, "acc_fp32": 1, "saturate": 1,
    })


class Decision(wiring.Component):
    """Decides every good frame: drop (with a reason), forward (to a port mask) or aggregate.

    Members
    -------
    headers[p] : In(stream.Signature(frame_meta_layout))
        Port p's oldest undecided header, offered while ``valid`` (the port has a header and room for its
        decision); ``ready`` takes it. ``ready`` is a register, granted in the cycle before from the
        ``valid`` bits: a header must stay offered, the same, until taken. Its ``all_reduce`` bit must be
        the header's (a CAIS all-reduce frame): only such a header waits for maintenance (the reset sweep,
        a SLOT_CLEAR, an aging visit); any other is granted in the cycle it is first offered.
    hold : In(1)
        Grant no header this cycle (the result jobs have no room for what may complete: the
        :data:`DECISION_HEADERS` headers in flight may each queue one).
    lanes[p] : Out(stream.Signature(decision_layout, always_ready=True))
        A decision for port p's lane (at most one port's ``valid`` per cycle, the same ``payload`` on
        every port), :data:`DECISION_LATENCY` cycles after the take.
    jobs : Out(stream.Signature(job_layout, always_ready=True))
        A result to send, in decision order, with the decision.
    program : In(TableProgramSignature); ev_* : Out(1); ev_drop_reason : Out(DropReason);
    slots_in_use : Out(32)
        Table programming, one event pulse per decided frame for the counters (with its decision), non-empty
        sets (updated with the decision).
    sets_in_use[e] : Out(32)
        Per rule entry: the non-empty sets of the slots whose last writer (an all-reduce frame that reached
        the slot state) matched entry ``e``, a cycle after ``slots_in_use`` counts them: they add up to
        ``slots_in_use`` of the cycle before.
    aged : Out(1); aged_rule : Out(range(rules)); aged_slot, aged_set : Out; aged_lost : Out(1)
        A set aged (AGING, docs/registers.md), in the cycle of its write (freed, or marked aged): a pulse,
        the rule entry it counts for, which set; ``aged_lost``: its event found the queue full.
    aged_event : Out(32); aged_ports : Out(32)
        The AGED_EVENT and AGED_PORTS words of the oldest queued event (``program.aged_pop_stb`` pops it).

    Aging: while ``AGING.age`` is not 0, a scanner visits one set per age unit (``age_unit_log2`` cycles,
    :data:`cais.registers.AGE_UNIT_LOG2` but in the formal harness), every set in turn, through the
    SLOT_CLEAR machinery: it holds back stateful headers until none is in flight, reads the slot, decides
    (a cycle of its own, from the registered read) and writes the set freed or marked aged, so it adds
    nothing to the slot-state loop and no new header reads the slot before the write. Each set keeps the
    age unit of its last accepted contribution (``stamp``, modulo 2**stamp bits) and an ``aged`` bit.
    busy : Out(1)
        A header is in the pipeline (not counting the outputs).

    Every output is a register.
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap, age_unit_log2: int = AGE_UNIT_LOG2):
        self.params, self.regmap = params, regmap
        P = params.ports
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "headers": In(stream.Signature(self.meta_layout)).array(P), "hold": In(1),
            "lanes": Out(stream.Signature(decision_layout(params), always_ready=True)).array(P),
            "jobs": Out(stream.Signature(job_layout(params), always_ready=True)),
            "program": In(TableProgramSignature(regmap)),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1),
            "sets_in_use": Out(32).array(params.rules),
            "aged": Out(1), "aged_rule": Out(range(params.rules)), "aged_slot": Out(range(params.slots)),
            "aged_set": Out(1), "aged_lost": Out(1), "aged_event": Out(32), "aged_ports": Out(32),
        })
        self.age_unit_log2 = age_unit_log2
        # The age clock, in cycles (its upper bits count age units): the formal harness reads it.
        self.age_clock = Signal(age_unit_log2 + age_stamp_bits(params))
        self.state_mem = Memory(shape=state_entry_layout(params), depth=params.slots, init=[])

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, B, R = prm.ports, prm.beat_bytes, prm.rules
        lb = ceil_log2(B)
        slot_bits = max(1, ceil_log2(prm.slots))
        all_ports = (1 << P) - 1
        ent = state_entry_layout(prm)
        setl = state_set_layout(prm)
        rule_bits = rule_index_bits(prm)
        kind_l = data.StructLayout({"dtype": DType, "op": ReduceOp, "acc_fp32": 1, "saturate": 1})
        # What a header carries from B2 to its decision.
        carry_l = data.StructLayout({
            "port": range(P), "me": P, "slot": slot_bits, "set": 1, "tag": 32, "plen": prm.slot_len_bits,
            "next_tag": 32,                         # the slot's next chunk: tag + the quota's count
            "row_base": bank_addr_bits(prm), "rows": range(prm.rows_per_set + 1),
            "beats": self.meta_layout["beats"].shape, "length": self.meta_layout["length"].shape,
            "cais": proto.CAIS_HEADER_BYTES * 8, "contributors": P, "results": P, "kind": kind_l,
            "rule": rule_bits,                      # the rule entry (its index), for sets_in_use
        })

        # The age clock: age units (AGE_UNIT_LOG2 cycles each) modulo 2**stamp bits, free running; an accepted
        # contribution stamps its set with it.
        U = self.age_unit_log2
        clock = self.age_clock
        m.d.sync += clock.eq(clock + 1)
        now = clock[U:]
        aging = self.regmap["AGING"]
        age = field_bits(self.program.aging, aging.field("age"))
        age_free = field_bits(self.program.aging, aging.field("free"))
        aging_on = age != 0

        # After reset the slot state is swept to empty, one slot per cycle (memories do not reset); no
        # header that needs slot state is granted meanwhile.
        sweep = Signal(range(max(2, prm.slots)))
        sweeping = Signal(init=1)
        with m.If(sweeping):
            m.d.sync += [sweep.eq(sweep + 1), sweeping.eq(sweep != prm.slots - 1)]
        # A SLOT_CLEAR waits (granting no stateful header) until no stateful header is in the pipeline,
        # then reads the slot (for in_use) and writes it empty: clr_read, clr_wait, clr_write.
        clear_pending = Signal()
        clear_slot = Signal(16)
        clr_read, clr_wait, clr_write = Signal(), Signal(), Signal()
        clr_cur = Signal(slot_bits)
        # The aging scanner's visit (one set per age unit while aging is on): due, then read, wait, decide
        # (from f_mem0, registered) and write; it starts when no clear waits (a clear goes first).
        scan_due, sc_read, sc_wait, sc_decide, sc_write = Signal(), Signal(), Signal(), Signal(), Signal()
        scan_pos = Signal(slot_bits + 1)          # the next set to visit: slot, set
        sc_set = Signal()
        clearing = clr_read | clr_wait | clr_write | sc_read | sc_wait | sc_decide | sc_write
        drained = Signal()
        start_clear = clear_pending & ~clearing & ~sweeping & drained
        start_scan = scan_due & ~clear_pending & ~clearing & ~sweeping & drained
        next_pending = self.program.slot_clear_stb | (clear_pending & ~start_clear)
        next_read = start_clear & (clear_slot < prm.slots)
        tick = clock[:U] == (1 << U) - 1 if U else 1
        next_due = aging_on & ((tick & ~sweeping) | (scan_due & ~start_scan))
        with m.If(self.program.slot_clear_stb):
            m.d.sync += clear_slot.eq(self.program.slot_clear_data[:16])
        with m.If(start_clear):
            m.d.sync += clr_cur.eq(clear_slot[:slot_bits])
        with m.If(start_scan):
            m.d.sync += [clr_cur.eq(scan_pos[1:]), sc_set.eq(scan_pos[0]),
                         scan_pos.eq(Mux(scan_pos == 2 * prm.slots - 1, 0, scan_pos + 1))]
        m.d.sync += [clear_pending.eq(next_pending), clr_read.eq(next_read), clr_wait.eq(clr_read),
                     clr_write.eq(clr_wait), scan_due.eq(next_due), sc_read.eq(start_scan), sc_wait.eq(sc_read),
                     sc_decide.eq(sc_wait), sc_write.eq(sc_decide)]
        # While the state is swept or a clear waits, only headers that need no slot state are granted. One
        # granted in the cycle after the clear starts reads the slot state (S0) after the clear's write; the
        # scanner writes a cycle later, so it blocks the cycle after its start too.
        blocked = Signal(init=1)
        m.d.sync += blocked.eq((sweeping & (sweep != prm.slots - 1)) | next_pending | next_due | start_scan)

        # ------------------------------------------------------------ G: grant (take in the next cycle)
        take = Signal(P)
        t_port, t_sf = Signal(range(P)), Signal()
        # Whether each port's header needs slot state: the ingress's bit, a register (so a header that
        # needs none is granted in the cycle it is first offered, whatever maintenance does).
        request = Cat(h.valid for h in self.headers)
        offered = [FrameHeader(h.payload.hdr) for h in self.headers]
        sf = Cat(h.payload.all_reduce for h in self.headers)
        req = Signal(P)
        m.d.comb += req.eq(request & ~take & (Mux(blocked, 0, all_ports) | ~sf))
        # Round robin, one-hot: the lowest requester above the last grant, else the lowest requester.
        above_last = Signal(P, init=all_ports & ~1)     # ports above the last grant (registered)
        above = req & above_last
        grant = Signal(P)

        def lowest(x):
            return Cat(*(x[p] & ~x[:p].any() if p else x[0] for p in range(P)))
        m.d.comb += grant.eq(Mux(above.any(), lowest(above), lowest(req)))
        m.d.comb += [h.ready.eq(take[p]) for p, h in enumerate(self.headers)]
        go = req.any() & ~self.hold
        # (a_sf, for the SLOT_CLEAR's wait: exact while blocked, when only stateless headers are granted;
        # taken as stateful otherwise)
        m.d.sync += [take.eq(Mux(go, grant, 0)), t_sf.eq(~blocked | (grant & sf).any())]
        with m.If(go):
            m.d.sync += [t_port.eq(Cat(*(Cat(*(grant[p] for p in range(P) if p >> k & 1)).any()
                                         for k in range(max(1, ceil_log2(P)))))),
                         above_last.eq(Cat(*((grant & ((1 << p) - 1)).any() for p in range(P))))]

        # The tables' compares, for every port's offered header at once (registered: the granted port's
        # header is still the one offered when it is taken).
        m.submodules.rules = rules = RuleTable(prm, self.regmap, keys=P)
        m.submodules.macs = macs = MacTable(prm, self.regmap, keys=P)
        wiring.connect(m, wiring.flipped(self.program), rules.program, macs.program)
        # Registered in parts (MATCH_PARTS per entry), ANDed in T: no stage holds a whole compare tree.
        g_hits = [Signal(R * MATCH_PARTS, name=f"g_hits{p}", reset_less=True) for p in range(P)]
        g_mac = [Signal(prm.mac_entries * MATCH_PARTS, name=f"g_mac{p}", reset_less=True) for p in range(P)]
        for p, h in enumerate(offered):
            m.d.comb += [rules.key[p].group_id.eq(h.group_id), rules.key[p].layer_id.eq(h.layer_id),
                         rules.key[p].chunk_id.eq(h.chunk_id), macs.mac[p].eq(h.dst_mac)]
            m.d.sync += [g_hits[p].eq(rules.parts[p]), g_mac[p].eq(macs.parts[p])]

        # ------------------------------------------------------------ T: the take, the header registered
        a_valid, a_port, a_me, a_sf = Signal(), Signal(range(P)), Signal(P), Signal()
        a_meta = Signal(self.meta_layout, reset_less=True)
        a_pick, a_mac = Signal(R, reset_less=True), Signal(prm.mac_entries, reset_less=True)
        # The header by the binary port (a mux per bit), so the wide header does not load ``take``, which
        # drives the hits' mux into the rule pick.
        meta = Array(h.payload.as_value() for h in self.headers)[t_port]
        m.d.sync += [
            a_valid.eq(take.any()), a_port.eq(t_port), a_me.eq(take), a_sf.eq(t_sf), a_meta.eq(meta),
            # the winning rule; the MAC entries that hold the address
            a_pick.eq(lowest_one(hits_of_parts(or_tree(Mux(take[p], g_hits[p], 0) for p in range(P)), R), R)),
            a_mac.eq(hits_of_parts(or_tree(Mux(take[p], g_mac[p], 0) for p in range(P)), prm.mac_entries)),
        ]

        # ------------------------------------------------------------ B1: the rule's and the MAC entry's fields
        m.d.comb += rules.pick.eq(a_pick)
        m_valid, m_port, m_me, m_sf = Signal(), Signal(range(P)), Signal(P), Signal()
        m_meta = Signal(self.meta_layout, reset_less=True)
        m_hit, m_rule, m_quota = Signal(), Signal(rule_layout(prm), reset_less=True), Signal(32, reset_less=True)
        m_mac = Signal(prm.mac_entries, reset_less=True)
        m_entry = Signal(rule_bits, reset_less=True)       # the winning rule's index
        m.d.sync += m_entry.eq(or_tree(Mux(a_pick[e], e, 0) for e in range(R)))
        m.d.sync += [
            m_valid.eq(a_valid), m_port.eq(a_port), m_me.eq(a_me), m_sf.eq(a_valid & a_sf), m_meta.eq(a_meta),
            m_hit.eq(a_pick.any()), m_rule.eq(rules.picked), m_quota.eq(rules.picked_quota),
            m_mac.eq(lowest_one(a_mac, prm.mac_entries)),           # the winning MAC entry
        ]

        # ------------------------------------------------------------ B2: slot, the stateless checks
        hdr = FrameHeader(m_meta.hdr)
        rule = m_rule
        m.d.comb += macs.pick.eq(m_mac)
        # Slot and set from seq_num within the group's quota, at full width: with count_log2 up to 31 the
        # offset can be any 32-bit value, and every slot >= slots is BAD_SLOT (found in S0).
        seq = hdr.seq_num
        slot = Signal(33)
        m.d.comb += slot.eq(rule.base + (seq & m_quota))

        b_valid, b_action, b_reason, b_mask = Signal(), Signal(Action), Signal(DropReason), Signal(P)
        b_slot = Signal(33, reset_less=True)
        b_l2, b_group, b_mac_hit, b_mac_mask = Signal(), Signal(), Signal(), Signal(P)   # an ordinary frame
        b_c = Signal(carry_l, reset_less=True)
        s_action, s_reason, s_mask = Signal(Action), Signal(DropReason), Signal(P)

        def drop(reason):
            return [s_action.eq(Action.DROP), s_reason.eq(reason)]

        def forward(dest):
            return [s_action.eq(Mux(dest == 0, Action.DROP, Action.FORWARD)), s_reason.eq(DropReason.NO_ROUTE),
                    s_mask.eq(dest)]

        with m.If(~hdr.is_cais):
            m.d.comb += s_action.eq(Action.FORWARD)       # (its ports are found in S0)
        with m.Elif(~m_hit):
            m.d.comb += drop(DropReason.NO_RULE)
        with m.Elif(~(rule.contributors & m_me).any()):
            m.d.comb += drop(DropReason.FOREIGN_PORT)
        with m.Elif(~m_meta.all_reduce):
            m.d.comb += forward(rule.results & ~m_me)
        with m.Elif((hdr.dtype != rule.dtype) | (hdr.red_op != rule.red_op)):
            m.d.comb += drop(DropReason.TYPE_MISMATCH)
        with m.Else():
            m.d.comb += s_action.eq(Action.AGGREGATE)      # (BAD_SLOT is checked in S0)

        m.d.sync += [
            b_valid.eq(m_valid), b_action.eq(s_action), b_reason.eq(s_reason), b_mask.eq(s_mask), b_slot.eq(slot),
            b_l2.eq(~hdr.is_cais), b_group.eq(hdr.dst_is_group), b_mac_hit.eq(macs.hit), b_mac_mask.eq(macs.port_mask),
            b_c.port.eq(m_port), b_c.me.eq(m_me), b_c.set.eq(seq.bit_select(rule.count_log2, 1)),
            b_c.tag.eq(seq), b_c.plen.eq(hdr.payload_len),
            # count = quota + 1, the bit above the quota's ones (bitwise: no second adder)
            b_c.next_tag.eq(seq + (((m_quota << 1) | 1) & ~m_quota)),
            b_c.cais.eq(hdr.cais_bytes()), b_c.rows.eq((hdr.payload_len + B - 1) >> lb),
            b_c.beats.eq(m_meta.beats), b_c.length.eq(m_meta.length),
            b_c.contributors.eq(rule.contributors), b_c.results.eq(rule.results), b_c.rule.eq(m_entry),
            b_c.kind.dtype.eq(rule.dtype), b_c.kind.op.eq(rule.red_op), b_c.kind.saturate.eq(rule.saturate),
            # fp16/bf16 accumulated in fp32 inside the fold (the flag means nothing for other types)
            b_c.kind.acc_fp32.eq(rule.acc_fp32 & ((rule.dtype == DType.FP16) | (rule.dtype == DType.BF16))),
        ]

        # The stages after S0, each a header and what it carries; w, h1, h2 hold the written states.
        f_valid, f_agg, f_action, f_reason, f_mask = Signal(), Signal(), Signal(Action), Signal(DropReason), Signal(P)
        f_c = Signal(carry_l, reset_less=True)
        f_mem, f_sel = Signal(ent, reset_less=True), Signal(3, reset_less=True)
        u_valid, u_agg, u_action, u_reason, u_mask = Signal(), Signal(), Signal(Action), Signal(DropReason), Signal(P)
        u_c, u_cur, u_other = (Signal(carry_l, reset_less=True), Signal(setl, reset_less=True),
                               Signal(setl, reset_less=True))
        u_tag_eq, u_len_eq, u_prev_same, u_same_set = (Signal(reset_less=True), Signal(reset_less=True), Signal(),
                                                       Signal(reset_less=True))
        u_eq_prev_tag, u_eq_prev_len = Signal(reset_less=True), Signal(reset_less=True)
        u_other_next, u_prev_next = Signal(reset_less=True), Signal(reset_less=True)
        w_agg, w_slot, w_new, w_first = Signal(), Signal(slot_bits, reset_less=True), Signal(ent, reset_less=True), Signal()
        w_old = Signal(2 * P, reset_less=True)
        w_rule, w_old_rule = Signal(rule_bits, reset_less=True), Signal(2 * rule_bits, reset_less=True)
        h1_agg, h1_slot, h1_new = Signal(), Signal(slot_bits, reset_less=True), Signal(ent, reset_less=True)
        h2_agg, h2_slot, h2_new = Signal(), Signal(slot_bits, reset_less=True), Signal(ent, reset_less=True)

        # ------------------------------------------------------------ S0: state read, BAD_SLOT, L2 ports
        m.submodules.state_mem = self.state_mem
        st_wr = self.state_mem.write_port()
        # Synchronous, not transparent (a write in the cycle of the read is missed); addressed from B2's
        # slot add (its low bits), so its output has a register of its own (f_mem0) in S0.
        st_rd = self.state_mem.read_port()
        m.d.comb += st_rd.addr.eq(Mux(clr_read | sc_read, clr_cur, slot[:slot_bits]))
        b_cand = b_valid & ~b_l2 & (b_action == Action.AGGREGATE)
        bad = b_slot >= prm.slots
        l2_dest = Mux(b_group | ~b_mac_hit, all_ports, b_mac_mask) & ~b_c.me
        r_valid, r_agg, r_action, r_reason, r_mask = Signal(), Signal(), Signal(Action), Signal(DropReason), Signal(P)
        r_c = Signal(carry_l, reset_less=True)
        # The read missed the writes of the five headers ahead; of them, the ones now in W and h1 are in
        # h1 and h2 when this one is in S1 (the newest wins).
        f_mem0, r_sel = Signal(ent, reset_less=True), Signal(3, reset_less=True)
        hit4 = w_agg & (w_slot == b_slot[:slot_bits])
        hit5 = h1_agg & (h1_slot == b_slot[:slot_bits])
        m.d.sync += [f_mem0.eq(st_rd.data), r_sel.eq(Cat(hit4, ~hit4 & hit5, ~hit4 & ~hit5))]
        m.d.sync += [
            r_valid.eq(b_valid), r_agg.eq(b_cand & ~bad), r_mask.eq(Mux(b_l2, l2_dest, b_mask)),
            r_action.eq(Mux(b_l2, Mux(l2_dest == 0, Action.DROP, Action.FORWARD),
                            Mux(b_cand & bad, Action.DROP, b_action))),
            r_reason.eq(Mux(b_l2, DropReason.NO_ROUTE, Mux(b_cand & bad, DropReason.BAD_SLOT, b_reason))),
            r_c.eq(b_c), r_c.slot.eq(b_slot[:slot_bits]),
            r_c.row_base.eq(Cat(b_c.set, b_slot[:slot_bits]) * prm.rows_per_set),
        ]

        # ------------------------------------------------------------ S1: older writes merged, newest write
        m.d.sync += [
            f_valid.eq(r_valid), f_agg.eq(r_agg), f_action.eq(r_action), f_reason.eq(r_reason), f_mask.eq(r_mask),
            f_c.eq(r_c),
            f_mem.eq(or_tree(Mux(r_sel[k], src, 0) for k, src in enumerate((h1_new, h2_new, f_mem0)))),
        ]
        # Of the rest, the ones now in U and W are in W and h1 when this one is in S2.
        hit_w = u_agg & (u_c.slot == r_c.slot)
        hit_h1 = w_agg & (w_slot == r_c.slot)
        m.d.sync += f_sel.eq(Cat(hit_w, ~hit_w & hit_h1, ~hit_w & ~hit_h1))

        # ------------------------------------------------------------ S2: forwarding, compares
        fwd = Signal(ent)
        m.d.comb += fwd.eq(or_tree(Mux(f_sel[k], src, 0) for k, src in enumerate((w_new, h1_new, f_mem))))
        cur, other = fwd[f_c.set], fwd[~f_c.set]
        m.d.sync += [
            u_valid.eq(f_valid), u_agg.eq(f_agg), u_action.eq(f_action), u_reason.eq(f_reason), u_mask.eq(f_mask),
            u_c.eq(f_c), u_cur.eq(cur), u_other.eq(other),
            u_tag_eq.eq(cur.tag == f_c.tag), u_len_eq.eq(cur.length == f_c.plen),
            u_other_next.eq(other.tag == f_c.next_tag),
            # the header one ahead (in U now, in W when this one is in U)
            u_prev_same.eq(u_agg & (u_c.slot == f_c.slot)), u_same_set.eq(u_c.set == f_c.set),
            u_eq_prev_tag.eq(u_c.tag == f_c.tag), u_eq_prev_len.eq(u_c.plen == f_c.plen),
            u_prev_next.eq(u_c.tag == f_c.next_tag),
        ]

        # ------------------------------------------------------------ U: the update
        prev = u_prev_same
        s_cur, s_other = Signal(setl), Signal(setl)
        m.d.comb += [s_cur.eq(Mux(prev, w_new[u_c.set], u_cur)), s_other.eq(Mux(prev, w_new[~u_c.set], u_other))]
        # The header ahead changed this set's tag and length only if it was its FIRST.
        took_set = prev & u_same_set & w_first
        took_other = prev & ~u_same_set & w_first           # ... and the other set's
        m.submodules.update = upd = SetUpdate(P)
        m.d.comb += [
            upd.cur_bitmap.eq(s_cur.bitmap), upd.cur_done.eq(s_cur.done), upd.other_bitmap.eq(s_other.bitmap),
            upd.tag_eq.eq(Mux(took_set, u_eq_prev_tag, u_tag_eq)),
            upd.len_eq.eq(Mux(took_set, u_eq_prev_len, u_len_eq)),
            upd.other_newer.eq(Mux(took_other, u_prev_next, u_other_next)),
            upd.me.eq(u_c.me), upd.contributors.eq(u_c.contributors),
        ]
        new_cur, new_other = Signal(setl), Signal(setl)
        m.d.comb += [
            new_cur.bitmap.eq(upd.new_cur_bitmap), new_cur.done.eq(upd.new_cur_done),
            new_cur.tag.eq(Mux(upd.first, u_c.tag, s_cur.tag)), new_cur.length.eq(Mux(upd.first, u_c.plen, s_cur.length)),
            # an accepted contribution stamps its set (aging); a first one starts a fill not yet aged
            new_cur.stamp.eq(new_stamp(upd.accepted, now, s_cur.stamp)), new_cur.aged.eq(~upd.first & s_cur.aged),
            new_other.eq(s_other), new_other.bitmap.eq(upd.new_other_bitmap),
            # the slot's sets now count for the writer's rule entry
            new_cur.rule.eq(u_c.rule), new_other.rule.eq(u_c.rule),
        ]
        agg = u_valid & u_agg
        # Every contribution writes its slot back (unchanged when refused), so every one is forwarded.
        m.d.sync += [
            w_agg.eq(agg), w_slot.eq(u_c.slot), w_first.eq(agg & upd.first),
            w_new.eq(Mux(u_c.set, Cat(new_other, new_cur), Cat(new_cur, new_other))),
            w_old.eq(Cat(s_cur.bitmap, s_other.bitmap)),
            w_rule.eq(u_c.rule), w_old_rule.eq(Cat(s_cur.rule, s_other.rule)),
            h1_agg.eq(w_agg), h1_slot.eq(w_slot), h1_new.eq(w_new),
            h2_agg.eq(h1_agg), h2_slot.eq(h1_slot), h2_new.eq(h1_new),
        ]
        # The outcome registered for V: U computes only the state the next header needs.
        v_valid, v_agg, v_action, v_reason, v_mask = Signal(), Signal(), Signal(Action), Signal(DropReason), Signal(P)
        v_c = Signal(carry_l, reset_less=True)
        v_outcome, v_accepted, v_complete = Signal(SlotOutcome), Signal(), Signal()
        m.d.sync += [
            v_valid.eq(u_valid), v_agg.eq(agg), v_action.eq(u_action), v_reason.eq(u_reason), v_mask.eq(u_mask),
            v_c.eq(u_c), v_outcome.eq(upd.outcome), v_accepted.eq(upd.accepted), v_complete.eq(upd.complete),
        ]

        # ------------------------------------------------------------ V: the decision, its events and job
        outcome = v_outcome
        accepted = v_agg & v_accepted
        resend = v_agg & (outcome == SlotOutcome.RESEND)
        refused = v_agg & ((outcome == SlotOutcome.MISMATCH) | (outcome == SlotOutcome.LENGTH_MISMATCH))
        completes = v_agg & v_complete
        drop_now = v_valid & ((v_action == Action.DROP) | refused)
        reason = Mux(refused, Mux(outcome == SlotOutcome.MISMATCH, DropReason.TAG_MISMATCH,
                                  DropReason.LENGTH_MISMATCH), v_reason)
        m.d.sync += [
            self.ev_drop.eq(drop_now), self.ev_drop_reason.eq(reason),
            self.ev_forwarded.eq(v_valid & (v_action == Action.FORWARD)),
            self.ev_contribution.eq(accepted), self.ev_completed.eq(completes),
            self.ev_duplicate.eq(v_agg & ((outcome == SlotOutcome.REPEAT) | (outcome == SlotOutcome.RESEND))),
            self.ev_resent.eq(resend),
        ]
        push, d = Signal(P), Signal(decision_layout(prm))
        job_valid, job = Signal(), Signal(job_layout(prm))
        m.d.comb += [*(lane.valid.eq(push[p]) for p, lane in enumerate(self.lanes)),
                     *(lane.payload.eq(d) for lane in self.lanes),
                     self.jobs.valid.eq(job_valid), self.jobs.payload.eq(job)]
        m.d.sync += [
            push.eq(Mux(v_valid, v_c.me, 0)),
            d.action.eq(Mux(drop_now, Action.DROP, v_action)), d.mask.eq(v_mask), d.write.eq(accepted),
            d.row_base.eq(v_c.row_base), d.rows.eq(v_c.rows), d.beats.eq(v_c.beats), d.length.eq(v_c.length),
            job_valid.eq(completes | resend),
            job.cais.eq(v_c.cais), job.mask.eq(Mux(resend, v_c.me, v_c.results)),
            job.contributors.eq(v_c.contributors), job.row_base.eq(v_c.row_base),
            job.rows.eq(v_c.rows),
            job.dtype.eq(v_c.kind.dtype), job.op.eq(v_c.kind.op), job.acc_fp32.eq(v_c.kind.acc_fp32),
            job.saturate.eq(v_c.kind.saturate),
        ]

        # ------------------------------------------------------------ the scanner's decision (f_mem0: the slot)
        sc_due, sc_free = Signal(), Signal()
        sc_go = sc_write & sc_due                  # the visited set aged: its write, counters, event
        sc_entry, sc_rule, sc_bitmap = (Signal(ent, reset_less=True), Signal(rule_bits, reset_less=True),
                                        Signal(P, reset_less=True))
        seen = data.View(ent, f_mem0)
        vis = seen[sc_set]
        freed, marked = Signal(setl), Signal(setl)
        m.d.comb += [freed.eq(0), marked.eq(vis), marked.aged.eq(1)]
        new_set = Mux(age_free, freed, marked)
        with m.If(sc_decide):
            m.d.sync += [
                sc_due.eq(age_due(vis, now, age) & aging_on), sc_free.eq(age_free), sc_rule.eq(vis.rule),
                sc_bitmap.eq(vis.bitmap),
                sc_entry.eq(Mux(sc_set, Cat(seen[0], new_set), Cat(new_set, seen[1]))),
            ]
        # The event queue (AGED_EVENT, AGED_PORTS), pushed with the write; AGED_POP pops it.
        ev_l = data.StructLayout({"slot": slot_bits, "set": 1, "rule": rule_bits, "ports": P})
        m.submodules.aged_queue = queue = SyncFIFO(width=ev_l.size, depth=AGED_QUEUE_DEPTH)
        head = data.View(ev_l, queue.r_data)
        m.d.comb += [
            queue.w_data.eq(Cat(clr_cur, sc_set, sc_rule, sc_bitmap)), queue.w_en.eq(sc_go),
            queue.r_en.eq(self.program.aged_pop_stb),
        ]
        ev_reg, ports_reg = self.regmap["AGED_EVENT"], self.regmap["AGED_PORTS"]

        def placed(reg, name, value):
            return Value.cast(value) << reg.field(name).lsb
        valid = queue.r_rdy
        m.d.sync += [
            self.aged.eq(sc_go), self.aged_rule.eq(sc_rule), self.aged_slot.eq(clr_cur), self.aged_set.eq(sc_set),
            self.aged_lost.eq(sc_go & ~queue.w_rdy),
            self.aged_event.eq(Mux(valid, placed(ev_reg, "slot", head.slot) | placed(ev_reg, "set", head.set)
                                   | placed(ev_reg, "rule", head.rule) | placed(ev_reg, "valid", valid), 0)),
            self.aged_ports.eq(Mux(valid, placed(ports_reg, "ports", head.ports), 0)
                               | placed(ports_reg, "queued", queue.level)),
        ]

        # ------------------------------------------------------------ W: the state write, in_use
        def used(bitmaps):
            return (bitmaps[0].bitmap != 0) + (bitmaps[1].bitmap != 0)
        w_new_v, f_mem_v = data.View(ent, w_new), data.View(ent, f_mem0)
        in_use = Signal(32)
        m.d.comb += self.slots_in_use.eq(in_use)
        # Per rule entry: a write moves the slot's sets from their stored entries to the writer's.
        per_rule = [Signal(32, name=f"sets_in_use{e}") for e in range(R)]
        m.d.comb += [self.sets_in_use[e].eq(per_rule[e]) for e in range(R)]
        old_used = [w_old[:P] != 0, w_old[P:] != 0]
        old_rule = [w_old_rule[:rule_bits], w_old_rule[rule_bits:]]
        with m.If(sweeping):
            m.d.comb += [st_wr.addr.eq(sweep), st_wr.data.eq(0), st_wr.en.eq(1)]
        with m.Elif(w_agg):
            m.d.comb += [st_wr.addr.eq(w_slot), st_wr.data.eq(w_new), st_wr.en.eq(1)]
        with m.Elif(clr_write):                    # (f_mem0 holds the slot clr_read read)
            m.d.comb += [st_wr.addr.eq(clr_cur), st_wr.data.eq(0), st_wr.en.eq(1)]
        with m.Elif(sc_go):                        # the visited set aged: freed or marked
            m.d.comb += [st_wr.addr.eq(clr_cur), st_wr.data.eq(sc_entry), st_wr.en.eq(1)]
        # The counters: one adder each, its operand the AND-OR of the (exclusive) write's change, so the
        # path into it is a few LUTs from registers (w_*, f_mem0, sc_*) whatever writes.

        def change(w_term, clr_term, sc_term):
            terms = [Signal(signed(3), name=n) for n in ("d_w", "d_clr", "d_sc")]
            m.d.comb += [terms[0].eq(Mux(w_agg, w_term, 0)), terms[1].eq(Mux(clr_write, clr_term, 0)),
                         terms[2].eq(Mux(sc_go, sc_term, 0))]
            return terms[0] | terms[1] | terms[2]
        with m.If(~sweeping):
            m.d.sync += in_use.eq(in_use + change(used(w_new_v) - (old_used[0] + old_used[1]), -used(f_mem_v),
                                                  -sc_free))
        # Per rule entry the change is registered first (the compares of the entry indices and the adder
        # are a cycle apart): SETS_IN_USE follows the state a cycle after SLOTS_IN_USE does.
        per_rule_d = [Signal(signed(3), name=f"sets_in_use_d{e}") for e in range(R)]
        m.d.sync += [per_rule_d[e].eq(Mux(sweeping, 0, change(
            writer_delta(e, w_rule, used(w_new_v), old_used, old_rule),
            -(((f_mem_v[0].bitmap != 0) & (f_mem_v[0].rule == e))
              + ((f_mem_v[1].bitmap != 0) & (f_mem_v[1].rule == e))),
            -(sc_free & (sc_rule == e))))) for e in range(R)]
        m.d.sync += [per_rule[e].eq(per_rule[e] + per_rule_d[e]) for e in range(R)]

        m.d.comb += drained.eq(~((take.any() & t_sf) | (a_valid & a_sf) | m_sf | b_cand | r_agg | f_agg | u_agg
                                 | w_agg))
        m.d.comb += self.busy.eq(take.any() | a_valid | m_valid | b_valid | r_valid | f_valid | u_valid | v_valid)
        return m
