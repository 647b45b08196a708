"""The switch core: one frame at a time from the ingress ports, at one beat per cycle.

Pipeline (one beat per cycle, no bubble between frames)::

    ingress FIFOs --A: frame arbiter--> B: classify / decide --+--> forward stream ---------+--> egress mux
                                         (tables, slot state) |                             |
                                                              +--> payload rows --C: ALU ---+
                                                                                 | slot memory
                                                                                 +--> result jobs --R--+

A picks the next port round-robin at each frame boundary. B decides on a frame's first beat, from the
frame's header, the rule and MAC tables and the slot state (an asynchronous-read memory, so the decision
and the state update take that one cycle and the next frame sees the new state), and then streams the
frame: forwarded, dropped, or cut into payload rows (the 30 header bytes removed). C reads the slot row,
reduces and writes it back; a read-during-write-transparent memory port makes back-to-back frames to
the same set safe. A frame's end token reaches C the cycle after its last beat (a cycle in which no row
can arrive, because the first beat of a frame never carries a complete payload row) and queues its
result job, after all its rows are written. R sends the result frames.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import RegisterMap

from .alu import ReduceALU
from .header import FrameHeader
from .ingress import frame_meta_layout
from .results import ResultGenerator, header_split, result_job_layout
from .slots import SlotOutcome, SlotUpdate, entry_layout
from .tables import MacTable, RuleTable

__all__ = ["SwitchCore", "Action"]

JOB_DEPTH = 8


class Action:
    DROP = 0
    FORWARD = 1
    AGGREGATE = 2


class SwitchCore(wiring.Component):
    """Everything between the ingress FIFOs and the egress FIFOs.

    Members
    -------
    meta[p], meta_valid[p], meta_ready[p]; beat_data[p], beat_valid[p], beat_ready[p]
        The good frames of each ingress port (see :class:`cais.hdl.ingress.IngressPort`).
    o_data, o_keep, o_last, o_mask, o_valid : Out; o_ready : In(1)
        Frames to send, each beat to every port in ``o_mask``; ``o_ready`` when all of them have room.
    rule_*, mac_*, slot_clear_* : In
        Table programming from the register bank (words of the register map).
    switch_mac : In(48)
    ev_* : Out(1); ev_drop_reason : Out(4); slots_in_use : Out(32)
        One pulse per frame decided, for the counters; the number of non-empty sets.
    busy : Out(1)
        A frame is queued or in flight anywhere in the core.
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap):
        self.params, self.regmap = params, regmap
        P, W, B = params.ports, params.data_width, params.beat_bytes
        self.meta_layout = frame_meta_layout(params)
        self.addr_bits = ceil_log2(params.slots * 2 * params.rows_per_set)
        self.slot_bits = max(1, ceil_log2(params.slots))
        super().__init__({
            "meta": In(self.meta_layout).array(P), "meta_valid": In(1).array(P), "meta_ready": Out(1).array(P),
            "beat_data": In(W).array(P), "beat_valid": In(1).array(P), "beat_ready": Out(1).array(P),
            "o_data": Out(W), "o_keep": Out(B), "o_last": Out(1), "o_mask": Out(P),
            "o_valid": Out(1), "o_ready": In(1),
            "rule_write_stb": In(1), "rule_write": In(32), "rule_group": In(32), "rule_layer": In(32),
            "rule_chunk": In(32), "rule_ports": In(32), "rule_slots": In(32),
            "mac_write_stb": In(1), "mac_write": In(32), "mac_addr_lo": In(32), "mac_addr_hi": In(32),
            "slot_clear_stb": In(1), "slot_clear": In(32),
            "switch_mac": In(48),
            "ev_drop": Out(1), "ev_drop_reason": Out(4), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1),
        })
        # Created here so tests can inspect them.
        self.slot_mem = Memory(shape=W, depth=params.slots * 2 * params.rows_per_set, init=[])
        self.state_mem = Memory(shape=entry_layout(P), depth=params.slots, init=[])

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, W, B = prm.ports, prm.data_width, prm.beat_bytes
        h, o = header_split(B)
        lb = ceil_log2(B)
        all_ports = (1 << P) - 1

        # ---------------------------------------------------------------- A: frame arbiter
        busy = Signal()                       # in the middle of a frame
        cur = Signal(range(P))                # port being read
        last_grant = Signal(range(P))
        remaining = Signal(range(prm.max_frame_beats + 1))

        b_valid = Signal()
        b_data = Signal(W)
        b_first = Signal()
        b_last = Signal()
        b_idx = Signal(range(prm.max_frame_beats))
        b_meta = Signal(self.meta_layout)     # the frame in B
        b_port = Signal(range(P))
        b_take = Signal()

        req = Cat(*self.meta_valid)
        grant = Signal(range(P))
        above = Signal(P)
        m.d.comb += above.eq(req & ~((Const(2, P + 1) << last_grant) - 1)[:P])
        for p in reversed(range(P)):          # round-robin: lowest requester above the last grant,
            with m.If(req[p]):                # else the lowest requester
                m.d.comb += grant.eq(p)
        with m.If(above.any()):
            for p in reversed(range(P)):
                with m.If(above[p]):
                    m.d.comb += grant.eq(p)

        a_ready = ~b_valid | b_take
        meta_in = [data.View(self.meta_layout, v) for v in self.meta]
        with m.If(a_ready):
            m.d.sync += b_valid.eq(0)
            with m.If(~busy):
                with m.If(req.any()):
                    beats = Signal.like(meta_in[0].beats)
                    with m.Switch(grant):
                        for p in range(P):
                            with m.Case(p):
                                m.d.comb += [self.meta_ready[p].eq(1), self.beat_ready[p].eq(1),
                                             beats.eq(meta_in[p].beats)]
                                m.d.sync += [b_data.eq(self.beat_data[p]), b_meta.eq(meta_in[p])]
                    m.d.sync += [
                        b_valid.eq(1), b_first.eq(1), b_last.eq(beats == 1), b_idx.eq(0),
                        b_port.eq(grant), cur.eq(grant), last_grant.eq(grant),
                        busy.eq(beats != 1), remaining.eq(beats - 1),
                    ]
            with m.Else():
                valid = Signal()
                with m.Switch(cur):
                    for p in range(P):
                        with m.Case(p):
                            m.d.comb += [valid.eq(self.beat_valid[p]), self.beat_ready[p].eq(1)]
                            m.d.sync += b_data.eq(self.beat_data[p])
                with m.If(valid):
                    m.d.sync += [
                        b_valid.eq(1), b_first.eq(0), b_last.eq(remaining == 1), b_idx.eq(b_idx + 1),
                        busy.eq(remaining != 1), remaining.eq(remaining - 1),
                    ]

        # ---------------------------------------------------------------- B: classify and decide
        hdr = FrameHeader(b_meta.hdr)
        m.submodules.rules = rules = RuleTable(prm, self.regmap)
        m.submodules.macs = macs = MacTable(prm, self.regmap)
        m.d.comb += [
            rules.write_stb.eq(self.rule_write_stb), rules.write_cmd.eq(self.rule_write),
            rules.stage_group.eq(self.rule_group), rules.stage_layer.eq(self.rule_layer),
            rules.stage_chunk.eq(self.rule_chunk), rules.stage_ports.eq(self.rule_ports),
            rules.stage_slots.eq(self.rule_slots),
            rules.group_id.eq(hdr.group_id), rules.layer_id.eq(hdr.layer_id), rules.chunk_id.eq(hdr.chunk_id),
            macs.write_stb.eq(self.mac_write_stb), macs.write_cmd.eq(self.mac_write),
            macs.stage_lo.eq(self.mac_addr_lo), macs.stage_hi.eq(self.mac_addr_hi),
            macs.mac.eq(hdr.dst_mac),
        ]
        rule = rules.rule
        me = Signal(P)
        m.d.comb += me.eq(1 << b_port)

        # Slot and set from seq_num within the group's quota.
        seq = hdr.seq_num
        offset = Signal(16)
        m.d.comb += offset.eq(seq & ((Const(1, 17) << rule.count_log2) - 1))
        slot = Signal(17)
        m.d.comb += slot.eq(rule.base + offset)
        set_sel = Signal()
        m.d.comb += set_sel.eq((seq >> rule.count_log2)[0])
        bad_slot = slot >= prm.slots

        m.submodules.state_mem = self.state_mem
        st_wr = self.state_mem.write_port()
        st_rd = self.state_mem.read_port(domain="comb")
        clr_rd = self.state_mem.read_port(domain="comb")
        m.submodules.update = upd = SlotUpdate(P)
        m.d.comb += [
            st_rd.addr.eq(slot[:self.slot_bits]),
            upd.state.eq(st_rd.data), upd.set.eq(set_sel), upd.port.eq(b_port), upd.tag.eq(seq),
            upd.contributors.eq(rule.contributors),
        ]

        # The decision for the frame in B, valid on its first beat.
        d_action = Signal(2)
        d_mask = Signal(P)        # forward: egress ports; aggregate: result ports of a job
        d_reason = Signal(4)
        d_write = Signal()        # aggregate: write the payload rows
        d_store = Signal()        # ... overwriting (first contribution) rather than reducing
        d_job = Signal()          # aggregate: send a result when the frame's rows are written
        d_state_write = Signal()
        ev = {k: Signal(name=f"d_ev_{k}") for k in ("forwarded", "contribution", "duplicate", "completed", "resent")}

        def drop(reason):
            return [d_action.eq(Action.DROP), d_reason.eq(reason)]

        def forward(mask):
            return [d_action.eq(Action.FORWARD), d_mask.eq(mask), ev["forwarded"].eq(1)]

        with m.If(~hdr.is_cais):
            dest = Mux(hdr.dst_is_group | ~macs.hit, all_ports, Const(1, P) << macs.port) & ~me
            with m.If(dest == 0):
                m.d.comb += drop(proto.DropReason.NO_ROUTE)
            with m.Else():
                m.d.comb += forward(dest)
        with m.Elif(~rules.hit):
            m.d.comb += drop(proto.DropReason.NO_RULE)
        with m.Elif(~(rule.contributors & me).any()):
            m.d.comb += drop(proto.DropReason.FOREIGN_PORT)
        with m.Elif(hdr.op_type != proto.OpType.ALL_REDUCE):
            dest = rule.results & ~me
            with m.If(dest == 0):
                m.d.comb += drop(proto.DropReason.NO_ROUTE)
            with m.Else():
                m.d.comb += forward(dest)
        with m.Elif(bad_slot):
            m.d.comb += drop(proto.DropReason.BAD_SLOT)
        with m.Elif(upd.outcome == SlotOutcome.MISMATCH):
            m.d.comb += drop(proto.DropReason.TAG_MISMATCH)
        with m.Else():
            m.d.comb += [d_action.eq(Action.AGGREGATE), d_state_write.eq(1)]
            with m.Switch(upd.outcome):
                with m.Case(SlotOutcome.FIRST, SlotOutcome.ADD):
                    m.d.comb += [
                        d_write.eq(1), d_store.eq(upd.outcome == SlotOutcome.FIRST), ev["contribution"].eq(1),
                        d_job.eq(upd.complete), d_mask.eq(rule.results), ev["completed"].eq(upd.complete),
                    ]
                with m.Case(SlotOutcome.REPEAT):
                    m.d.comb += ev["duplicate"].eq(1)
                with m.Case(SlotOutcome.RESEND):
                    m.d.comb += [ev["duplicate"].eq(1), ev["resent"].eq(1), d_job.eq(1), d_mask.eq(me)]

        # Context of the frame in B, latched on its first beat.
        c_action = Signal(2)
        c_mask = Signal(P)
        c_write = Signal()
        c_store = Signal()
        c_job = Signal()
        c_row_base = Signal(self.addr_bits)
        c_rows = Signal(range(prm.rows_per_set + 1))
        c_flush = Signal()        # the last payload row ends in the frame's last beat
        c_op = Signal(4)
        c_cais = Signal(proto.CAIS_HEADER_BYTES * 8)

        plen = hdr.payload_len
        rows = (plen + B - 1) >> lb
        row_base = ((slot[:self.slot_bits] << 1) | set_sel) * prm.rows_per_set

        action = Mux(b_first, d_action, c_action)
        is_fwd = action == Action.FORWARD
        is_agg = action == Action.AGGREGATE

        # After reset the slot state is swept to empty, one slot per cycle (memories do not reset).
        sweep = Signal(range(prm.slots + 1))
        sweeping = sweep != prm.slots
        with m.If(sweeping):
            m.d.sync += sweep.eq(sweep + 1)
        # A pending SLOT_CLEAR owns the state memory's write port for one cycle.
        clear_pending = Signal()
        clear_slot = Signal(16)
        with m.If(self.slot_clear_stb):
            m.d.sync += [clear_pending.eq(1), clear_slot.eq(self.slot_clear[:16])]

        job_layout = result_job_layout(prm, self.addr_bits)
        m.submodules.jobs = jobs = SyncFIFOBuffered(width=Shape.cast(job_layout).width, depth=JOB_DEPTH)
        room_for_jobs = jobs.level < JOB_DEPTH - 2   # frames decided but not yet queued: at most 2

        fwd_ready = Signal()
        m.d.comb += b_take.eq(b_valid & Mux(
            is_fwd, fwd_ready,
            Mux(b_first, ~sweeping & ~clear_pending & (~(d_action == Action.AGGREGATE) | room_for_jobs), 1)))
        decide = b_take & b_first

        with m.If(decide):
            m.d.sync += [
                c_action.eq(d_action), c_mask.eq(d_mask), c_write.eq(d_write), c_store.eq(d_store),
                c_job.eq(d_job), c_row_base.eq(row_base), c_rows.eq(rows),
                c_flush.eq(b_meta.beats == rows + h), c_op.eq(hdr.red_op), c_cais.eq(hdr.cais_bytes()),
            ]
            m.d.comb += [
                self.ev_drop.eq(d_action == Action.DROP), self.ev_drop_reason.eq(d_reason),
                *(getattr(self, f"ev_{k}").eq(v) for k, v in ev.items()),
            ]

        in_use = Signal(32)
        m.d.comb += self.slots_in_use.eq(in_use)
        with m.If(sweeping):
            m.d.comb += [st_wr.addr.eq(sweep[:self.slot_bits]), st_wr.data.eq(0), st_wr.en.eq(1)]
        with m.Elif(clear_pending):
            m.d.comb += [clr_rd.addr.eq(clear_slot[:self.slot_bits]),
                         st_wr.addr.eq(clear_slot[:self.slot_bits]), st_wr.data.eq(0),
                         st_wr.en.eq(clear_slot < prm.slots)]
            with m.If(clear_slot < prm.slots):
                m.d.sync += in_use.eq(in_use - (clr_rd.data[0].bitmap != 0) - (clr_rd.data[1].bitmap != 0))
            m.d.sync += clear_pending.eq(self.slot_clear_stb)
        with m.Elif(decide & d_state_write):
            m.d.comb += [st_wr.addr.eq(slot[:self.slot_bits]), st_wr.data.eq(upd.new_state), st_wr.en.eq(1)]
            m.d.sync += in_use.eq(in_use + upd.in_use_delta)

        # Forwarded frames go out beat for beat.
        tail = b_meta.length[:lb]
        fwd_valid = b_valid & is_fwd
        fwd_keep = Mux(b_last & (tail != 0), (Const(1, B + 1) << tail) - 1, (1 << B) - 1)
        fwd_mask = Mux(b_first, d_mask, c_mask)

        # Payload rows: row j = frame bytes 30+jB .. 30+jB+B-1 = the top B-o bytes of beat j+h and the
        # low o bytes of beat j+h+1, so row j is complete when beat j+h+1 arrives.
        prev = Signal(W)
        with m.If(b_take & is_agg):
            m.d.sync += prev.eq(b_data)
        end_pending = Signal()                # the frame in C's queue has ended: send its end token
        with m.If(b_take & is_agg & b_last):
            m.d.sync += end_pending.eq(1)
        with m.Elif(end_pending):
            m.d.sync += end_pending.eq(0)

        row_idx = (b_idx - (h + 1))[:len(c_rows)]
        inline_row = b_take & is_agg & ~b_first & (b_idx >= h + 1) & (row_idx < c_rows)

        # ---------------------------------------------------------------- C: slot memory and ALU
        m.submodules.slot_mem = self.slot_mem
        mem_wr = self.slot_mem.write_port()
        mem_alu = self.slot_mem.read_port(transparent_for=(mem_wr,))
        mem_res = self.slot_mem.read_port()

        e_valid = Signal()
        e_addr = Signal(self.addr_bits)
        e_data = Signal(W)
        e_write = Signal()
        e_end = Signal()
        with m.If(end_pending):
            # The end token; it carries the last row when that row ended in the frame's last beat.
            m.d.comb += [
                e_valid.eq(1), e_end.eq(1), e_write.eq(c_write & c_flush),
                e_addr.eq(c_row_base + c_rows - 1), e_data.eq(prev >> (8 * o)),
            ]
        with m.Elif(inline_row):
            m.d.comb += [
                e_valid.eq(1), e_write.eq(c_write),
                e_addr.eq(c_row_base + row_idx),
                e_data.eq(((prev >> (8 * o)) | (b_data << (8 * (B - o))))[:W]),
            ]
        m.d.comb += mem_alu.addr.eq(e_addr)

        x_valid = Signal()
        x_addr = Signal(self.addr_bits)
        x_data = Signal(W)
        x_write = Signal()
        x_store = Signal()
        x_op = Signal(4)
        x_end = Signal()
        x_job = Signal()
        x_mask = Signal(P)
        x_cais = Signal.like(c_cais)
        x_row_base = Signal.like(c_row_base)
        m.d.sync += [
            x_valid.eq(e_valid), x_addr.eq(e_addr), x_data.eq(e_data), x_write.eq(e_valid & e_write),
            x_store.eq(c_store), x_op.eq(c_op), x_end.eq(e_valid & e_end), x_job.eq(c_job), x_mask.eq(c_mask),
            x_cais.eq(c_cais), x_row_base.eq(c_row_base),
        ]
        m.submodules.alu = alu = ReduceALU(W)
        m.d.comb += [
            alu.a.eq(mem_alu.data), alu.b.eq(x_data), alu.op.eq(x_op),
            mem_wr.addr.eq(x_addr), mem_wr.data.eq(Mux(x_store, x_data, alu.result)),
            mem_wr.en.eq(x_valid & x_write),
        ]
        job_in = data.View(job_layout, jobs.w_data)
        m.d.comb += [
            jobs.w_en.eq(x_valid & x_end & x_job),
            job_in.cais.eq(x_cais), job_in.mask.eq(x_mask), job_in.row_base.eq(x_row_base),
        ]

        # ---------------------------------------------------------------- R: result frames
        m.submodules.results = res = ResultGenerator(prm, self.addr_bits)
        m.d.comb += [
            res.job.eq(jobs.r_data), res.job_valid.eq(jobs.r_rdy), jobs.r_en.eq(res.job_ready),
            res.switch_mac.eq(self.switch_mac),
            mem_res.addr.eq(res.rd_addr), mem_res.en.eq(res.rd_en), res.rd_data.eq(mem_res.data),
        ]

        # ---------------------------------------------------------------- egress mux (whole frames)
        owner = Signal(2)          # 0: free, 1: forward path, 2: results
        sel_res = Mux(owner == 0, res.o_valid, owner == 2)
        with m.If(sel_res):
            m.d.comb += [
                self.o_data.eq(res.o_data), self.o_keep.eq(res.o_keep), self.o_last.eq(res.o_last),
                self.o_mask.eq(res.o_mask), self.o_valid.eq(res.o_valid), res.o_ready.eq(self.o_ready),
            ]
        with m.Else():
            m.d.comb += [
                self.o_data.eq(b_data), self.o_keep.eq(fwd_keep), self.o_last.eq(b_last),
                self.o_mask.eq(fwd_mask), self.o_valid.eq(fwd_valid), fwd_ready.eq(self.o_ready),
            ]
        with m.If(self.o_valid & self.o_ready):
            m.d.sync += owner.eq(Mux(self.o_last, 0, Mux(sel_res, 2, 1)))

        m.d.comb += self.busy.eq(req.any() | busy | b_valid | end_pending | x_valid | (jobs.level != 0)
                                 | ~res.job_ready | clear_pending | sweeping)
        return m
