"""The decision pipeline: one frame header per cycle, from the ingress ports' queued headers to a decision
for the port's lane and, for a set that completes or a resend, a result job.

Stages (one header per cycle, no stall; the arbiter holds headers back instead)::

    A:  round-robin pick of a port with a header waiting and room in its lane  (registered: a_*)
    B1: rule match (the winning entry, one-hot), MAC lookup                     (registered: m_*)
    B2: the rule's fields, slot and set, every drop that needs no state         (registered: b_*)
    C:  slot-state read, SlotUpdate, the state-dependent outcome, state write  (outputs registered)

The slot state is a small memory read asynchronously in C and written at the end of C, so the next
header in C sees the new state: the state loop is one stage, and everything before it (the ternary match,
the one-hot pick, the slot address add) is in A and B. The decision leaves registered, four clock edges
after the arbiter took the header.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import RegisterMap

from .enums import Action, DropReason, DType, ReduceOp
from .header import FrameHeader
from .ingress import frame_meta_layout
from .slots import SlotOutcome, SlotUpdate, entry_layout
from .tables import MacTable, RuleTable, TableProgramSignature

__all__ = ["Decision", "decision_layout", "job_layout", "bank_addr_bits", "DECISION_LATENCY"]

#: Clock edges from the arbiter taking a header to its decision on ``push``/``decision``.
DECISION_LATENCY = 4


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
    meta[p] : In(frame_meta_layout); request : In(ports); take : Out(ports)
        Port p's oldest undecided header, offered while ``request[p]`` (the port has a header and room
        for its decision); ``take[p]`` pops it.
    hold : In(1)
        Take no header this cycle (the result jobs have no room for what may complete).
    push : Out(ports); decision : Out(decision_layout)
        A decision for the lane of the port in ``push`` (one-hot, at most one per cycle).
    job_valid : Out(1); job : Out(job_layout)
        A result to send, in decision order.
    program : In(TableProgramSignature); ev_* : Out(1); ev_drop_reason : Out(DropReason);
    slots_in_use : Out(32)
        Table programming, one event pulse per decided frame for the counters, non-empty sets.
    busy : Out(1)
        A header is in the pipeline.
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap):
        self.params, self.regmap = params, regmap
        P = params.ports
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "meta": In(self.meta_layout).array(P), "request": In(P), "take": Out(P), "hold": In(1),
            "push": Out(P), "decision": Out(decision_layout(params)),
            "job_valid": Out(1), "job": Out(job_layout(params)),
            "program": In(TableProgramSignature(regmap)),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1),
        })
        self.state_mem = Memory(shape=entry_layout(P, params.slot_len_bits), depth=params.slots, init=[])

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, B = prm.ports, prm.beat_bytes
        lb = ceil_log2(B)
        slot_bits = max(1, ceil_log2(prm.slots))
        all_ports = (1 << P) - 1

        # After reset the slot state is swept to empty, one slot per cycle (memories do not reset). A
        # SLOT_CLEAR owns the state memory's write port in the first cycle stage C does not write it.
        sweep = Signal(range(prm.slots + 1))
        sweeping = sweep != prm.slots
        with m.If(sweeping):
            m.d.sync += sweep.eq(sweep + 1)
        clear_pending = Signal()
        clear_slot = Signal(16)
        with m.If(self.program.slot_clear_stb):
            m.d.sync += [clear_pending.eq(1), clear_slot.eq(self.program.slot_clear_data[:16])]

        # ------------------------------------------------------------ A: arbiter
        a_valid, a_port = Signal(), Signal(range(P))
        a_meta = Signal(self.meta_layout)
        last = Signal(range(P))
        # During the sweep after reset and while a SLOT_CLEAR waits, only frames that need no slot state
        # are taken.
        offered = [FrameHeader(self.meta[p].hdr) for p in range(P)]
        stateless = Cat(*(~(h.is_cais & (h.op_type == proto.OpType.ALL_REDUCE)) for h in offered))
        req = Mux(self.hold, 0, self.request & Mux(sweeping | clear_pending, stateless, (1 << P) - 1))
        above = Signal(P)
        m.d.comb += above.eq(req & ~((Const(2, P + 1) << last) - 1)[:P])
        grant = Signal(range(P))
        for p in reversed(range(P)):           # round robin: the lowest requester above the last grant,
            with m.If(req[p]):                 # else the lowest requester
                m.d.comb += grant.eq(p)
        with m.If(above.any()):
            for p in reversed(range(P)):
                with m.If(above[p]):
                    m.d.comb += grant.eq(p)
        m.d.sync += a_valid.eq(req.any())
        with m.If(req.any()):
            m.d.comb += self.take.eq(1 << grant)
            m.d.sync += [a_port.eq(grant), last.eq(grant)]
            with m.Switch(grant):
                for p in range(P):
                    with m.Case(p):
                        m.d.sync += a_meta.eq(self.meta[p])

        # ------------------------------------------------------------ B1: table lookups
        key = FrameHeader(a_meta.hdr)
        m.submodules.rules = rules = RuleTable(prm, self.regmap)
        m.submodules.macs = macs = MacTable(prm, self.regmap)
        wiring.connect(m, wiring.flipped(self.program), rules.program, macs.program)
        m.d.comb += [
            rules.group_id.eq(key.group_id), rules.layer_id.eq(key.layer_id), rules.chunk_id.eq(key.chunk_id),
            macs.mac.eq(key.dst_mac),
        ]
        m_valid, m_port, m_meta = Signal(), Signal(range(P)), Signal(self.meta_layout)
        m_pick, m_mac_hit, m_mac_port = Signal(prm.rules), Signal(), Signal(range(P))
        m.d.sync += [
            m_valid.eq(a_valid), m_port.eq(a_port), m_meta.eq(a_meta),
            m_pick.eq(rules.first),
            m_mac_hit.eq(macs.hit), m_mac_port.eq(macs.port),
        ]

        # ------------------------------------------------------------ B2: the rule and stateless checks
        hdr = FrameHeader(m_meta.hdr)
        m.d.comb += rules.pick.eq(m_pick)
        rule = rules.picked
        rule_hit = m_pick.any()
        me = Signal(P)
        m.d.comb += me.eq(1 << m_port)
        # Slot and set from seq_num within the group's quota, at full width: with count_log2 up to 31 the
        # offset can be any 32-bit value, and every slot >= slots is BAD_SLOT.
        seq = hdr.seq_num
        slot = Signal(33)
        m.d.comb += slot.eq(rule.base + (seq & ((Const(1, 33) << rule.count_log2) - 1)))
        set_sel = (seq >> rule.count_log2)[0]

        # What B2 found: a drop (reason), a forward (mask), or an all-reduce contribution for C.
        b_valid, b_port, b_me = Signal(), Signal(range(P)), Signal(P)
        b_action, b_reason, b_mask = Signal(Action), Signal(DropReason), Signal(P)
        b_slot, b_set = Signal(slot_bits), Signal()
        b_tag, b_plen = Signal(32), Signal(prm.slot_len_bits)
        b_cais = Signal(proto.CAIS_HEADER_BYTES * 8)
        b_rows = Signal(range(prm.rows_per_set + 1))
        b_beats, b_length = Signal.like(m_meta.beats), Signal.like(m_meta.length)
        b_contributors, b_results = Signal(P), Signal(P)
        b_kind = Signal(data.StructLayout({"dtype": DType, "op": ReduceOp, "acc_fp32": 1, "saturate": 1}))

        s_action, s_reason, s_mask = Signal(Action), Signal(DropReason), Signal(P)

        def drop(reason):
            return [s_action.eq(Action.DROP), s_reason.eq(reason)]

        def forward(dest):
            return [s_action.eq(Mux(dest == 0, Action.DROP, Action.FORWARD)), s_reason.eq(DropReason.NO_ROUTE),
                    s_mask.eq(dest)]

        with m.If(~hdr.is_cais):
            m.d.comb += forward(Mux(hdr.dst_is_group | ~m_mac_hit, all_ports, Const(1, P) << m_mac_port) & ~me)
        with m.Elif(~rule_hit):
            m.d.comb += drop(DropReason.NO_RULE)
        with m.Elif(~(rule.contributors & me).any()):
            m.d.comb += drop(DropReason.FOREIGN_PORT)
        with m.Elif(hdr.op_type != proto.OpType.ALL_REDUCE):
            m.d.comb += forward(rule.results & ~me)
        with m.Elif((hdr.dtype != rule.dtype) | (hdr.red_op != rule.red_op)):
            m.d.comb += drop(DropReason.TYPE_MISMATCH)
        with m.Elif(slot >= prm.slots):
            m.d.comb += drop(DropReason.BAD_SLOT)
        with m.Else():
            m.d.comb += s_action.eq(Action.AGGREGATE)

        m.d.sync += [
            b_valid.eq(m_valid), b_port.eq(m_port), b_me.eq(me),
            b_action.eq(s_action), b_reason.eq(s_reason), b_mask.eq(s_mask),
            b_slot.eq(slot[:slot_bits]), b_set.eq(set_sel), b_tag.eq(seq), b_plen.eq(hdr.payload_len),
            b_cais.eq(hdr.cais_bytes()), b_rows.eq((hdr.payload_len + B - 1) >> lb),
            b_beats.eq(m_meta.beats), b_length.eq(m_meta.length),
            b_contributors.eq(rule.contributors), b_results.eq(rule.results),
            b_kind.dtype.eq(rule.dtype), b_kind.op.eq(rule.red_op), b_kind.saturate.eq(rule.saturate),
            # fp16/bf16 accumulated in fp32 inside the fold (the flag means nothing for other types)
            b_kind.acc_fp32.eq(rule.acc_fp32 & ((rule.dtype == DType.FP16) | (rule.dtype == DType.BF16))),
        ]

        # ------------------------------------------------------------ C: slot state
        m.submodules.state_mem = self.state_mem
        st_wr = self.state_mem.write_port()
        st_rd = self.state_mem.read_port(domain="comb")
        clr_rd = self.state_mem.read_port(domain="comb")
        m.submodules.update = upd = SlotUpdate(P, prm.slot_len_bits)
        m.d.comb += [
            st_rd.addr.eq(b_slot),
            upd.state.eq(st_rd.data), upd.set.eq(b_set), upd.port.eq(b_port), upd.tag.eq(b_tag),
            upd.length.eq(b_plen), upd.contributors.eq(b_contributors),
        ]
        agg = b_valid & (b_action == Action.AGGREGATE)
        outcome = upd.outcome
        accepted = agg & ((outcome == SlotOutcome.FIRST) | (outcome == SlotOutcome.ADD))
        resend = agg & (outcome == SlotOutcome.RESEND)
        refused = agg & ((outcome == SlotOutcome.MISMATCH) | (outcome == SlotOutcome.LENGTH_MISMATCH))
        completes = accepted & upd.complete
        row_base = Signal(len(self.decision.row_base))
        m.d.comb += row_base.eq(Cat(b_set, b_slot) * prm.rows_per_set)

        drop_now = b_valid & ((b_action == Action.DROP) | refused)
        reason = Mux(refused, Mux(outcome == SlotOutcome.MISMATCH, DropReason.TAG_MISMATCH,
                                  DropReason.LENGTH_MISMATCH), b_reason)
        m.d.comb += [
            self.ev_drop.eq(drop_now), self.ev_drop_reason.eq(reason),
            self.ev_forwarded.eq(b_valid & (b_action == Action.FORWARD)),
            self.ev_contribution.eq(accepted), self.ev_completed.eq(completes),
            self.ev_duplicate.eq(agg & ((outcome == SlotOutcome.REPEAT) | (outcome == SlotOutcome.RESEND))),
            self.ev_resent.eq(resend),
        ]

        d = self.decision
        m.d.sync += [
            self.push.eq(Mux(b_valid, b_me, 0)),
            d.action.eq(Mux(drop_now, Action.DROP, b_action)), d.mask.eq(b_mask), d.write.eq(accepted),
            d.row_base.eq(row_base), d.rows.eq(b_rows), d.beats.eq(b_beats), d.length.eq(b_length),
            self.job_valid.eq(completes | resend),
            self.job.cais.eq(b_cais), self.job.mask.eq(Mux(resend, b_me, b_results)),
            self.job.contributors.eq(b_contributors), self.job.row_base.eq(row_base), self.job.rows.eq(b_rows),
            self.job.dtype.eq(b_kind.dtype), self.job.op.eq(b_kind.op), self.job.acc_fp32.eq(b_kind.acc_fp32),
            self.job.saturate.eq(b_kind.saturate),
        ]

        in_use = Signal(32)
        m.d.comb += self.slots_in_use.eq(in_use)
        with m.If(sweeping):
            m.d.comb += [st_wr.addr.eq(sweep[:slot_bits]), st_wr.data.eq(0), st_wr.en.eq(1)]
        with m.Elif(agg & ~refused):
            m.d.comb += [st_wr.addr.eq(b_slot), st_wr.data.eq(upd.new_state), st_wr.en.eq(1)]
            m.d.sync += in_use.eq(in_use + upd.in_use_delta)
        with m.Elif(clear_pending):          # (the sweep empties every slot: a clear during it has no work)
            in_range = clear_slot < prm.slots
            m.d.comb += [clr_rd.addr.eq(clear_slot[:slot_bits]),
                         st_wr.addr.eq(clear_slot[:slot_bits]), st_wr.data.eq(0), st_wr.en.eq(in_range)]
            with m.If(in_range):
                m.d.sync += in_use.eq(in_use - (clr_rd.data[0].bitmap != 0) - (clr_rd.data[1].bitmap != 0))
            m.d.sync += clear_pending.eq(self.program.slot_clear_stb)

        m.d.comb += self.busy.eq(a_valid | m_valid | b_valid)
        return m
