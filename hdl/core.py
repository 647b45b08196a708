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
reduces it in the pipelined ALU (integers, and fp32 / fp16 / bf16 in the wire format or accumulated in
fp32) and writes it back L cycles later; a row whose word is being written in the cycle it needs it is
forwarded, so back-to-back frames to one set run at one beat per cycle whenever a frame has at least L
beats (shorter frames to one set wait for the earlier result). A frame's end token reaches C the cycle
after its last beat (a cycle in which no row can arrive, because the first beat of a frame never carries
a complete payload row) and queues its result job once all its rows are written. R sends the result
frames, rounding fp32 accumulators to the wire format on the way out.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import RegisterMap

from .enums import Action, DropReason
from .header import FrameHeader
from .ingress import frame_meta_layout
from .results import ResultGenerator, ResultRow, header_split, result_job_layout
from .slot_alu import SlotALU
from .slots import SlotOutcome, SlotUpdate, entry_layout
from .tables import MacTable, RuleTable, TableProgramSignature

__all__ = ["SwitchCore", "Action"]

JOB_DEPTH = 16


class SwitchCore(wiring.Component):
    """Everything between the ingress FIFOs and the egress FIFOs.

    Members
    -------
    meta[p], meta_valid[p], meta_ready[p]; beat_data[p], beat_valid[p], beat_ready[p]
        The good frames of each ingress port (see :class:`cais.hdl.ingress.IngressPort`).
    o_data, o_keep, o_last, o_mask, o_valid, o_first, o_beats : Out; o_ready : In(1)
        Frames to send, each beat to every port in ``o_mask``. ``o_first`` marks a frame's first beat and
        ``o_beats`` is its length in beats; once ``o_ready`` took a first beat it must take every further
        beat of that frame the cycle it is offered (the egress admits whole frames), and the core offers
        them back to back.
    program : In(TableProgramSignature)
        Table programming from the register bank (words of the register map).
    switch_mac : In(48)
    ev_* : Out(1); ev_drop_reason : Out(DropReason); slots_in_use : Out(32)
        One pulse per frame decided, for the counters; the number of non-empty sets.
    busy : Out(1)
        A frame is queued or in flight anywhere in the core (not the slot-state sweep after reset).
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
            "o_valid": Out(1), "o_ready": In(1), "o_first": Out(1), "o_beats": Out(range(params.max_frame_beats + 1)),
            "program": In(TableProgramSignature(regmap)),
            "switch_mac": In(48),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1),
        })
        # Created here so tests can inspect them.
        # Words of two rows (granules): an fp16/bf16 set accumulating in fp32 needs both per row.
        self.slot_mem = Memory(shape=2 * W, depth=params.slots * params.rows_per_set, init=[])
        self.state_mem = Memory(shape=entry_layout(P, params.slot_len_bits), depth=params.slots, init=[])

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
        hazard = Signal()                     # C cannot take B's row yet (see C)

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
        wiring.connect(m, wiring.flipped(self.program), rules.program, macs.program)
        m.d.comb += [
            rules.group_id.eq(hdr.group_id), rules.layer_id.eq(hdr.layer_id), rules.chunk_id.eq(hdr.chunk_id),
            macs.mac.eq(hdr.dst_mac),
        ]
        rule = rules.rule
        # fp16/bf16 accumulated in fp32: a row of payload takes a whole slot-memory word.
        acc_fp32 = Signal()
        m.d.comb += acc_fp32.eq(rule.acc_fp32 & ((rule.dtype == proto.DType.FP16) | (rule.dtype == proto.DType.BF16)))
        capacity = Signal(16)       # the longest payload the rule's set layout holds
        with m.Switch(Cat(acc_fp32, rule.reproducible)):
            for acc in (0, 1):
                for repro in (0, 1):
                    with m.Case(acc | repro << 1):
                        m.d.comb += capacity.eq(prm.set_capacity(bool(acc), bool(repro)))
        me = Signal(P)
        m.d.comb += me.eq(1 << b_port)

        # Slot and set from seq_num within the group's quota, at full width: with count_log2 up to 31 the
        # offset can be any 32-bit value, and every slot >= slots is BAD_SLOT.
        seq = hdr.seq_num
        offset = Signal(32)
        m.d.comb += offset.eq(seq & ((Const(1, 33) << rule.count_log2) - 1))
        slot = Signal(33)
        m.d.comb += slot.eq(rule.base + offset)
        set_sel = Signal()
        m.d.comb += set_sel.eq((seq >> rule.count_log2)[0])
        bad_slot = slot >= prm.slots

        m.submodules.state_mem = self.state_mem
        st_wr = self.state_mem.write_port()
        st_rd = self.state_mem.read_port(domain="comb")
        clr_rd = self.state_mem.read_port(domain="comb")
        m.submodules.update = upd = SlotUpdate(P, prm.slot_len_bits)
        m.d.comb += [
            st_rd.addr.eq(slot[:self.slot_bits]),
            upd.state.eq(st_rd.data), upd.set.eq(set_sel), upd.port.eq(b_port), upd.tag.eq(seq),
            upd.length.eq(hdr.payload_len),
            upd.contributors.eq(rule.contributors),
        ]

        # The decision for the frame in B, valid on its first beat.
        d_action = Signal(Action)
        d_mask = Signal(P)        # forward: egress ports; aggregate: result ports of a job
        d_reason = Signal(DropReason)
        d_write = Signal()        # aggregate: write the payload rows
        d_store = Signal()        # ... overwriting (first contribution) rather than reducing
        d_job = Signal()          # aggregate: send a result when the frame's rows are written
        d_fold = Signal()         # ... after folding the contributions of a reproducible set
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
        with m.Elif((hdr.dtype != rule.dtype) | (hdr.red_op != rule.red_op)):
            m.d.comb += drop(proto.DropReason.TYPE_MISMATCH)
        with m.Elif(hdr.payload_len > capacity):
            m.d.comb += drop(proto.DropReason.PAYLOAD_TOO_LONG)
        with m.Elif(bad_slot):
            m.d.comb += drop(proto.DropReason.BAD_SLOT)
        with m.Elif(upd.outcome == SlotOutcome.MISMATCH):
            m.d.comb += drop(proto.DropReason.TAG_MISMATCH)
        with m.Elif(upd.outcome == SlotOutcome.LENGTH_MISMATCH):
            m.d.comb += drop(proto.DropReason.LENGTH_MISMATCH)
        with m.Else():
            m.d.comb += [d_action.eq(Action.AGGREGATE), d_state_write.eq(1)]
            with m.Switch(upd.outcome):
                with m.Case(SlotOutcome.FIRST, SlotOutcome.ADD):
                    m.d.comb += [
                        # A reproducible set keeps each contribution as it came, in its port's area.
                        d_write.eq(1), d_store.eq((upd.outcome == SlotOutcome.FIRST) | rule.reproducible),
                        ev["contribution"].eq(1), d_fold.eq(upd.complete & rule.reproducible),
                        d_job.eq(upd.complete), d_mask.eq(rule.results), ev["completed"].eq(upd.complete),
                    ]
                with m.Case(SlotOutcome.REPEAT):
                    m.d.comb += ev["duplicate"].eq(1)
                with m.Case(SlotOutcome.RESEND):
                    m.d.comb += [ev["duplicate"].eq(1), ev["resent"].eq(1), d_job.eq(1), d_mask.eq(me)]

        # Context of the frame in B, latched on its first beat.
        c_action = Signal(Action)
        c_mask = Signal(P)
        c_write = Signal()
        c_store = Signal()
        c_job = Signal()
        c_row_base = Signal(self.addr_bits)
        c_rows = Signal(range(prm.rows_per_set + 1))
        c_flush = Signal()        # the last payload row ends in the frame's last beat
        c_op = Signal(4)
        c_dtype = Signal(4)
        c_acc_fp32 = Signal()
        c_saturate = Signal()
        c_repro = Signal()
        c_fold = Signal()
        c_port = Signal(range(P))
        c_contributors = Signal(P)
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
        with m.If(self.program.slot_clear_stb):
            m.d.sync += [clear_pending.eq(1), clear_slot.eq(self.program.slot_clear_data[:16])]

        job_layout = result_job_layout(prm, self.addr_bits)
        m.submodules.jobs = jobs = SyncFIFOBuffered(width=Shape.cast(job_layout).width, depth=JOB_DEPTH)
        # Frames decided but not yet queued: two in B and C, and one per ALU pipeline stage.
        alu = SlotALU(W, float_units=prm.float_units)
        room_for_jobs = jobs.level < JOB_DEPTH - 3 - alu.latency

        # A forwarded frame waits for the aggregation pipeline (hazard: a pending end token or a fold)
        # only at its first beat, where it is decided; after that its beats go out back to back, as the
        # egress admitted the whole frame.
        fwd_ready = Signal()
        fwd_go = b_valid & is_fwd & (~b_first | ~hazard)
        m.d.comb += b_take.eq(Mux(
            is_fwd, fwd_go & fwd_ready,
            b_valid & ~hazard & Mux(b_first, ~sweeping & ~clear_pending
                                    & (~(d_action == Action.AGGREGATE) | room_for_jobs), 1)))
        decide = b_take & b_first

        with m.If(decide):
            m.d.sync += [
                c_action.eq(d_action), c_mask.eq(d_mask), c_write.eq(d_write), c_store.eq(d_store),
                c_job.eq(d_job), c_row_base.eq(row_base), c_rows.eq(rows),
                c_flush.eq(b_meta.beats == rows + h), c_op.eq(hdr.red_op), c_cais.eq(hdr.cais_bytes()),
                c_dtype.eq(rule.dtype), c_acc_fp32.eq(acc_fp32), c_saturate.eq(rule.saturate),
                c_repro.eq(rule.reproducible), c_fold.eq(d_fold), c_port.eq(b_port),
                c_contributors.eq(rule.contributors),
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
            m.d.sync += clear_pending.eq(self.program.slot_clear_stb)
        with m.Elif(decide & d_state_write):
            m.d.comb += [st_wr.addr.eq(slot[:self.slot_bits]), st_wr.data.eq(upd.new_state), st_wr.en.eq(1)]
            m.d.sync += in_use.eq(in_use + upd.in_use_delta)

        # Forwarded frames go out beat for beat.
        tail = b_meta.length[:lb]
        fwd_valid = fwd_go
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
        with m.Elif(end_pending & ~hazard):       # (hazard includes a fold in progress)
            m.d.sync += end_pending.eq(0)

        row_idx = (b_idx - (h + 1))[:len(c_rows)]
        row_cand = b_valid & is_agg & ~b_first & (b_idx >= h + 1) & (row_idx < c_rows)  # B's beat ends a row

        # ---------------------------------------------------------------- C: slot memory and ALU
        # The slot memory holds words of two granules (one row each): a wire-format set keeps row j in
        # granule base + j, an fp32-accumulating fp16/bf16 set keeps row j as the whole word (base + 2j).
        # Each row is a read-modify-write through the ALU, whose result is written `L` cycles after the
        # read data arrives. A row whose word is still in flight is forwarded when its result is being
        # written in the cycle the row needs it (gap exactly L) and otherwise waits (gap < L, only
        # possible with frames shorter than L beats).
        m.submodules.slot_mem = self.slot_mem
        mem_wr = self.slot_mem.write_port(granularity=W)
        mem_alu = self.slot_mem.read_port(transparent_for=(mem_wr,))
        mem_res = self.slot_mem.read_port()
        # The fold of reproducible sets, when built, reads the contributions through a port of its own.
        has_fold = prm.area_rows(False, True) > 0
        mem_fold = self.slot_mem.read_port(transparent_for=(mem_wr,)) if has_fold else None
        m.submodules.alu = alu
        L = alu.latency
        word_bits = self.addr_bits - 1

        # Reproducible sets: an accumulator area (rows 0 .., two granules per row with fp32
        # accumulation) followed by one area of `area` rows per port (SwitchParams.area_rows).
        def area_offset(acc, port):
            # A table of constants, not port * rows: a multiplier would cost DSP blocks.
            a = prm.area_rows(acc, True)
            return Array(Const((2 * a if acc else a) + p * a, self.addr_bits) for p in range(P))[port]

        # n: the row B offers this cycle (its frame's end token, or a row completed by B's beat).
        n_row = Mux(end_pending, c_rows - 1, row_idx)
        n_ga = Signal(self.addr_bits)
        with m.If(c_repro):
            m.d.comb += n_ga.eq(c_row_base + Mux(c_acc_fp32, area_offset(1, c_port), area_offset(0, c_port))
                                + n_row)
        with m.Else():
            m.d.comb += n_ga.eq(c_row_base + Mux(c_acc_fp32, n_row << 1, n_row))
        n_wide = c_acc_fp32 & ~c_repro
        n_we = Mux(n_wide, 0b11, Mux(n_ga[0], 0b10, 0b01))
        n_write = Mux(end_pending, c_write & c_flush, c_write)
        n_data = Mux(end_pending, prev >> (8 * o), ((prev >> (8 * o)) | (b_data << (8 * (B - o))))[:W])

        stage_layout = data.StructLayout({
            "valid": 1, "write": 1, "word": word_bits, "granule": 1, "we": 2, "end": 1,
            "store": 1, "job": 1, "mask": P, "cais": len(c_cais), "row_base": self.addr_bits,
            "dtype": 4, "op": 4, "acc_fp32": 1, "saturate": 1, "res_fp32": 1,
            "from_area": 1, "src_granule": 1,
        })
        x = [Signal(stage_layout, name=f"x{k}") for k in range(L + 1)]
        x_data = Signal(W)
        for k in range(1, L + 1):
            m.d.sync += x[k].eq(x[k - 1])

        def in_flight(word, we, stages):
            """A write to ``word``'s granules ``we`` is in one of the first ``stages`` ALU stages."""
            return Cat(*(x[k].valid & x[k].write & (x[k].word == word) & (x[k].we & we).any()
                         for k in range(stages))).any()

        # f: the fold of a completed reproducible set, one row per cycle, B waiting meanwhile: the first
        # contributor's area is stored into the accumulator, then each further contributor's area, in
        # ascending port order, is reduced into it; the last row of the last pass queues the result.
        f_active = Signal()
        f_base = Signal(self.addr_bits)
        f_rows = Signal.like(c_rows)
        f_j = Signal.like(c_rows)
        f_pending = Signal(P)          # contributors whose area is still to be folded in
        f_first = Signal()
        f_acc = Signal()
        f_ctx = Signal(stage_layout)   # the completed frame's fields the fold's ops carry
        f_port = Signal(range(P))
        for p in reversed(range(P)):
            with m.If(f_pending[p]):
                m.d.comb += f_port.eq(p)
        f_src = Signal(self.addr_bits)
        f_ga = Signal(self.addr_bits)
        m.d.comb += [
            f_src.eq(f_base + Mux(f_acc, area_offset(1, f_port), area_offset(0, f_port)) + f_j),
            f_ga.eq(f_base + Mux(f_acc, f_j << 1, f_j)),
        ]
        f_we = Mux(f_acc, 0b11, Mux(f_ga[0], 0b10, 0b01))
        f_last_row = f_j == f_rows - 1
        f_last_pass = (f_pending & ~(Const(1, P) << f_port)) == 0
        # The area row must be written before it is read (a write in xL is seen: transparent port).
        f_hazard = in_flight(f_ga[1:], f_we, L - 1) | in_flight(f_src[1:], 0b11, L)

        # A row may enter only if no write to its granules is still in stages x0 .. x(L-2).
        m.d.comb += hazard.eq(f_active | ((end_pending | row_cand) & n_write & in_flight(n_ga[1:], n_we, L - 1)))
        n_valid = Mux(end_pending, ~hazard, row_cand & b_take)
        f_valid = f_active & ~f_hazard
        fold_start = Signal()
        m.d.comb += fold_start.eq(n_valid & end_pending & c_fold)

        if not has_fold:           # no reproducible set is ever accepted (PAYLOAD_TOO_LONG)
            m.d.comb += fold_start.eq(0)
        with m.If(fold_start):
            m.d.sync += [
                f_active.eq(1), f_base.eq(c_row_base), f_rows.eq(c_rows), f_j.eq(0),
                f_pending.eq(c_contributors), f_first.eq(1), f_acc.eq(c_acc_fp32),
                f_ctx.mask.eq(c_mask), f_ctx.cais.eq(c_cais), f_ctx.dtype.eq(c_dtype), f_ctx.op.eq(c_op),
                f_ctx.saturate.eq(c_saturate),
            ]
        with m.If(f_valid):
            m.d.sync += f_j.eq(f_j + 1)
            with m.If(f_last_row):
                m.d.sync += [f_j.eq(0), f_first.eq(0), f_pending.eq(f_pending & ~(Const(1, P) << f_port))]
                with m.If(f_last_pass):
                    m.d.sync += f_active.eq(0)

        with m.If(f_active):
            m.d.sync += [
                x[0].valid.eq(f_valid), x[0].write.eq(f_valid), x[0].word.eq(f_ga[1:]),
                x[0].granule.eq(f_ga[0]), x[0].we.eq(f_we), x[0].end.eq(f_valid & f_last_row & f_last_pass),
                x[0].store.eq(f_first), x[0].job.eq(1), x[0].mask.eq(f_ctx.mask), x[0].cais.eq(f_ctx.cais),
                x[0].row_base.eq(f_base), x[0].dtype.eq(f_ctx.dtype), x[0].op.eq(f_ctx.op),
                x[0].acc_fp32.eq(f_acc), x[0].saturate.eq(f_ctx.saturate), x[0].res_fp32.eq(f_acc),
                x[0].from_area.eq(1), x[0].src_granule.eq(f_src[0]),
            ]
        with m.Else():
            m.d.sync += [
                x[0].valid.eq(n_valid), x[0].write.eq(n_valid & n_write), x[0].word.eq(n_ga[1:]),
                x[0].granule.eq(n_ga[0]), x[0].we.eq(n_we), x[0].end.eq(n_valid & end_pending),
                x[0].store.eq(c_store), x[0].job.eq(c_job & ~c_fold), x[0].mask.eq(c_mask),
                x[0].cais.eq(c_cais), x[0].row_base.eq(c_row_base), x[0].dtype.eq(c_dtype), x[0].op.eq(c_op),
                x[0].acc_fp32.eq(n_wide), x[0].saturate.eq(c_saturate), x[0].res_fp32.eq(c_acc_fp32),
                x[0].from_area.eq(0), x_data.eq(n_data),
            ]
        m.d.comb += mem_alu.addr.eq(Mux(f_active, f_ga[1:], n_ga[1:]))
        if has_fold:
            m.d.comb += mem_fold.addr.eq(f_src[1:])

        # Forwarding: the word being written this cycle (by the row in xL) replaces stale read data.
        acc = Signal(2 * W)
        last = x[L]
        wr_en = Signal(2)
        m.d.comb += wr_en.eq(Mux(last.valid & last.write, alu.we, 0))
        if L:
            fwd = wr_en & Mux(last.word == x[0].word, 0b11, 0b00)
            m.d.comb += acc.eq(Cat(Mux(fwd[0], alu.result[:W], mem_alu.data[:W]),
                                   Mux(fwd[1], alu.result[W:], mem_alu.data[W:])))
        else:
            m.d.comb += acc.eq(mem_alu.data)
        m.d.comb += [
            alu.i_valid.eq(x[0].valid & x[0].write), alu.acc.eq(acc),
            alu.row.eq(Mux(x[0].from_area, Mux(x[0].src_granule, mem_fold.data[W:], mem_fold.data[:W]), x_data)
                       if has_fold else x_data),
            alu.granule.eq(x[0].granule), alu.dtype.eq(x[0].dtype), alu.op.eq(x[0].op),
            alu.acc_fp32.eq(x[0].acc_fp32), alu.saturate.eq(x[0].saturate), alu.store.eq(x[0].store),
            mem_wr.addr.eq(last.word), mem_wr.data.eq(alu.result), mem_wr.en.eq(wr_en),
        ]
        # A frame's result job is queued once its last row is written (the end token leaves xL).
        job_in = data.View(job_layout, jobs.w_data)
        m.d.comb += [
            jobs.w_en.eq(last.valid & last.end & last.job),
            job_in.cais.eq(last.cais), job_in.mask.eq(last.mask), job_in.row_base.eq(last.row_base),
            job_in.acc_fp32.eq(last.res_fp32), job_in.dtype.eq(last.dtype),
        ]

        # ---------------------------------------------------------------- R: result frames
        m.submodules.results = res = ResultGenerator(prm, self.addr_bits)
        m.submodules.result_row = rrow = ResultRow(W, prm.float_units)
        cur_job = Signal(job_layout)          # the job the generator took last (it runs one at a time)
        with m.If(jobs.r_en & jobs.r_rdy):
            m.d.sync += cur_job.eq(jobs.r_data)
        rd_gran = Signal()
        with m.If(res.rd_en):
            m.d.sync += rd_gran.eq(res.rd_addr[0])
        m.d.comb += [
            res.job.eq(jobs.r_data), res.job_valid.eq(jobs.r_rdy), jobs.r_en.eq(res.job_ready),
            res.switch_mac.eq(self.switch_mac),
            mem_res.addr.eq(Mux(cur_job.acc_fp32, res.rd_addr - (cur_job.row_base >> 1), res.rd_addr >> 1)),
            mem_res.en.eq(res.rd_en),
            rrow.word.eq(mem_res.data), rrow.granule.eq(rd_gran), rrow.acc_fp32.eq(cur_job.acc_fp32),
            rrow.dtype.eq(cur_job.dtype), res.rd_data.eq(rrow.row),
        ]

        # ---------------------------------------------------------------- egress mux (whole frames)
        owner = Signal(2)          # 0: free, 1: forward path, 2: results
        sel_res = Mux(owner == 0, res.o_valid, owner == 2)
        with m.If(sel_res):
            m.d.comb += [
                self.o_data.eq(res.o_data), self.o_keep.eq(res.o_keep), self.o_last.eq(res.o_last),
                self.o_mask.eq(res.o_mask), self.o_valid.eq(res.o_valid), res.o_ready.eq(self.o_ready),
                self.o_first.eq(res.o_first), self.o_beats.eq(res.o_beats),
            ]
        with m.Else():
            m.d.comb += [
                self.o_data.eq(b_data), self.o_keep.eq(fwd_keep), self.o_last.eq(b_last),
                self.o_mask.eq(fwd_mask), self.o_valid.eq(fwd_valid), fwd_ready.eq(self.o_ready),
                self.o_first.eq(b_first), self.o_beats.eq(b_meta.beats),
            ]
        with m.If(self.o_valid & self.o_ready):
            m.d.sync += owner.eq(Mux(self.o_last, 0, Mux(sel_res, 2, 1)))

        m.d.comb += self.busy.eq(req.any() | busy | b_valid | end_pending | Cat(*(s.valid for s in x)).any() | f_active
                                 | (jobs.level != 0) | ~res.job_ready)
        return m
