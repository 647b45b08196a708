"""A port's lane: streams each decided frame out of the ingress FIFO at one beat per cycle, into the egress
(forwarded frames), into the port's contribution bank (all-reduce payload rows) or nowhere (drops)."""

from amaranth.hdl import Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais.params import SwitchParams

from ..common.enums import Action
from ..common.pipeline import register_copy
from ..decision import DECISION_LATENCY, bank_addr_bits, decision_layout
from ..egress.ports import FrameSourceSignature
from ..egress.results import header_split
from ..latency import LANE_FINISH, LANE_REQUEST, LANE_START

__all__ = ["IngressLane", "LANE_DECISIONS", "OPEN_BITS"]

#: Decisions a lane holds (queued or in the decision pipeline): enough to hide the pipeline's latency for
#: a port sending the shortest frames it can at line rate (two beats: a port's header is taken at most
#: every other cycle). A credit is out for the decision latency and two cycles (the take's, after the
#: grant, and the release's, after the decision), so a header every other cycle needs half of that, and
#: one more for the decision queued while the frame ahead streams.
LANE_DECISIONS = (DECISION_LATENCY + 2) // 2 + 1
#: Bits of the count of a lane's decided, unfinished frames: the queued ones, the next one, the one
#: streaming, one whose last row is being written and up to two done whose ``finished`` is not out yet.
OPEN_BITS = ceil_log2(LANE_DECISIONS + 6)


class IngressLane(wiring.Component):
    """Port p's frames, decided in order, streamed back to back.

    The head decision of the lane's queue (or the decision itself, when the queue is empty) moves into a
    register of its own (the next frame) while the current frame streams. A forwarded next frame asks the egress crossbar for its ports (``fwd.req``, a
    register) two cycles before the current frame's last beat, ahead of the beat stream; the grant (a
    register of the crossbar) starts it in the cycle it is shown, so its first beat follows the current
    frame's last without a bubble (one cycle behind a one-beat frame). A frame that is not forwarded
    starts when the current one ends. Payload row ``j`` (frame bytes ``30 + jB .. 30 + jB + B - 1``) is
    complete with beat ``j + h + 1`` and written to the bank then, at an address counted from the
    decision's ``row_base``; a row that starts in the frame's last beat (no beat ``j + h + 1``) is
    written in the next cycle, when the next frame's first beat (which never completes a row) is read.

    Every output is a register or a register through one or two LUT levels, except ``fwd.data`` (the
    ingress beat, passed through) and ``bank_data`` (the ingress beat shifted behind the previous one, one
    level). ``beats.valid`` is not looked at: a frame is decided only after the ingress committed all of
    its beats, so they are at the head of the ingress FIFO one per cycle while the lane streams it (the
    ingress's :class:`~cais.hdl.common.frame_fifo.FrameFifo` with a registered output sustains one per cycle),
    and no path runs from the FIFO's output into the lane's control.

    Members
    -------
    credit : Out(1); taken : In(1)
        The lane has room for one more decision; the decision pipeline took a header of this port.
    decisions : In(stream.Signature(decision_layout, always_ready=True))
        A decision for this port's oldest undecided frame (the credit guarantees room for it).
    beats : In(stream.Signature(W))
        The port's frames (ingress FIFO, whole frames only: a frame's beats come one per cycle).
    fwd : Out(FrameSourceSignature)
        Forwarded frames, to the egress crossbar.
    bank_addr, bank_data, bank_en : Out
        Payload rows for the port's bank.
    finished : Out(range(3))
        Frames done in the cycle before (their rows, if any, written by its end), a register: a frame
        whose last row was written and a one-beat frame that ended make two. (Registered so that no path
        runs from the lane's beat logic into the job queue's counts in one cycle: the whole switch
        measured 9 ns of routing on it.)
    open_after : Out(OPEN_BITS)
        Frames decided and not counted in ``finished`` yet, counting this cycle's decision and
        ``finished`` (what a result job queued in this cycle waits for,
        :class:`cais.hdl.alu.completion.JobQueue`).
    busy : Out(1)

    Latencies (:mod:`cais.hdl.latency`), on an idle lane: ``request_latency`` (1) from a forwarded frame's
    decision to its ``fwd.req``; ``start_latency`` (2) from the decision of a frame that is not forwarded
    to its first beat taken; ``finish_latency`` (1) from a frame's last beat to its ``finished``, one more
    when its last payload row starts in its last beat.
    """

    request_latency = LANE_REQUEST
    start_latency = LANE_START
    finish_latency = LANE_FINISH

    def __init__(self, params: SwitchParams):
        self.params = params
        W, P = params.data_width, params.ports
        self.layout = decision_layout(params)
        super().__init__({
            "credit": Out(1), "taken": In(1),
            "decisions": In(stream.Signature(self.layout, always_ready=True)),
            "beats": In(stream.Signature(W)),
            "fwd": Out(FrameSourceSignature(P, W, params.max_frame_beats)),
            "bank_addr": Out(bank_addr_bits(params)), "bank_data": Out(W), "bank_en": Out(1),
            "finished": Out(range(3)), "open_after": Out(OPEN_BITS),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        W, B = prm.data_width, prm.beat_bytes
        h, o = header_split(B)
        lb = ceil_log2(B)

        m.submodules.queue = queue = SyncFIFO(width=Shape.cast(self.layout).width, depth=LANE_DECISIONS)
        push, decision = self.decisions.valid, self.decisions.payload
        beat_data = self.beats.payload
        m.d.comb += queue.w_data.eq(decision)

        # The current frame: its decision and, set when it starts, what its beats need. Only the valid
        # bits and counts are reset (active, nxt_valid, held, flush, open_): the rest is written before use.
        active = Signal()
        cur = Signal(self.layout, reset_less=True)
        cur_fwd = Signal(reset_less=True)
        stores = Signal(reset_less=True)           # AGGREGATE with write: rows into the bank
        late = Signal(reset_less=True)             # ... and the last row starts in the last beat
        idx = Signal(range(prm.max_frame_beats), reset_less=True)
        left = Signal(range(prm.max_frame_beats + 1), reset_less=True)   # beats not yet taken, this one included
        is_last = Signal(reset_less=True)          # idx == beats - 1
        last_keep = Signal(B, reset_less=True)
        prev = Signal(W, reset_less=True)
        take = active                              # the frame's beats are there (see the docstring)
        ending = take & is_last
        m.d.comb += self.beats.ready.eq(active)

        # The next frame, out of the queue ahead of time.
        nxt = Signal(self.layout, reset_less=True)
        nxt_valid = Signal()
        nxt_fwd = nxt.action == Action.FORWARD
        fwd = self.fwd
        can_start = ~active | ending
        # A forwarded frame's grant comes only when it can start (the request's promise, below).
        start = nxt_valid & can_start & (~nxt_fwd | fwd.grant)
        # The next frame's decision comes from the queue, or straight from the decision pipeline when the
        # queue is empty (so an idle lane adds no cycle).
        free = ~nxt_valid | start
        load = queue.r_rdy & free
        bypass = ~queue.r_rdy & free & push
        m.d.comb += [queue.r_en.eq(load), queue.w_en.eq(push & ~bypass)]
        new_head = data.View(self.layout, Mux(queue.r_rdy, queue.r_data, decision))
        loads = load | bypass
        with m.If(loads):
            m.d.sync += [nxt.eq(new_head), nxt_valid.eq(1)]
        with m.Elif(start):
            m.d.sync += nxt_valid.eq(0)

        # Decisions held: queued, plus headers taken and not yet decided (the pipeline never stalls).
        held = Signal(range(LANE_DECISIONS + 1))
        m.d.sync += held.eq(held + self.taken - load - bypass)
        m.d.comb += self.credit.eq(held < LANE_DECISIONS)

        # The request, registered: the next frame is forwarded and the current one's last beat comes in
        # the request's next cycle or earlier, so a grant decided in its cycle finds the lane free.
        ends_soon = Signal()                       # in the next cycle: the current frame ends by the one after
        with m.If(start):
            m.d.comb += ends_soon.eq(nxt.beats <= 2)
        with m.Elif(~active | ending):
            m.d.comb += ends_soon.eq(1)
        with m.Else():
            m.d.comb += ends_soon.eq(left <= Mux(take, 3, 2))
        next_fwd = Mux(loads, new_head.action == Action.FORWARD, nxt_valid & ~start & nxt_fwd)
        req = Signal()
        m.d.sync += req.eq(next_fwd & ends_soon)
        # The frame's ports and length for the crossbar, loaded with ``nxt`` into flip-flops of their own
        # beside the crossbar's credit compares and grant (from ``nxt``, which the lane's own logic holds
        # here, the whole integer switch measured 1.5-2.1 ns of routing into the compare's carry chain and
        # then the grant: 113.48-114.36 MHz).
        m.d.comb += [fwd.req.eq(req),
                     fwd.mask.eq(register_copy(m, new_head.mask, "fwd_mask", platform, enable=loads)),
                     fwd.beats.eq(register_copy(m, new_head.beats, "fwd_beats", platform, enable=loads))]

        # Payload rows: the bank address counts up from row_base; row writing opens after the header.
        addr = Signal.like(self.bank_addr, reset_less=True)
        late_addr = Signal.like(self.bank_addr, reset_less=True)    # the last row's address
        rows_todo = Signal.like(cur.rows, reset_less=True)
        after_hdr = Signal(reset_less=True)        # idx > h
        # stores & after_hdr & (rows_todo != 0), a register of its own made from the next values (compares
        # of registers with constants), so the bank's write enable is one LUT level from flip-flops: the
        # write registers sit beside the bank's block RAMs across the die (the integer switch measured
        # rows_todo -> this AND -> 4.31 ns of routing into them, 119.95 MHz)
        row_ok = Signal(reset_less=True)
        row_now = take & row_ok

        with m.If(take & ~is_last):
            m.d.sync += [idx.eq(idx + 1), left.eq(left - 1), is_last.eq(left == 2)]
        with m.If(take & (idx == h)):
            m.d.sync += after_hdr.eq(1)
        with m.If(row_now):
            m.d.sync += [addr.eq(addr + 1), rows_todo.eq(rows_todo - 1)]
        with m.If(ending):
            m.d.sync += active.eq(0)
        # (a start clears after_hdr, so no row is due in its next cycle)
        after_hdr_next = after_hdr | (take & (idx == h))
        rows_left_next = Mux(row_now, rows_todo != 1, rows_todo != 0)
        m.d.sync += row_ok.eq(Mux(start, 0, stores & after_hdr_next & rows_left_next))
        tail = nxt.length[:lb]
        nxt_stores = (nxt.action == Action.AGGREGATE) & nxt.write
        with m.If(start):
            m.d.sync += [
                cur.eq(nxt), active.eq(1), idx.eq(0), left.eq(nxt.beats), is_last.eq(nxt.beats == 1),
                cur_fwd.eq(nxt_fwd), stores.eq(nxt_stores),
                late.eq(nxt_stores & (nxt.beats == nxt.rows + h)),
                last_keep.eq(Mux(tail != 0, (Const(1, B + 1) << tail) - 1, (1 << B) - 1)),
                addr.eq(nxt.row_base), late_addr.eq(nxt.row_base + nxt.rows - 1),
                rows_todo.eq(nxt.rows), after_hdr.eq(0),
            ]

        # Forwarded beats.
        m.d.comb += [
            fwd.data.eq(beat_data), fwd.last.eq(is_last),
            fwd.keep.eq(Mux(is_last, last_keep, (1 << B) - 1)),
            fwd.valid.eq(take & cur_fwd),
        ]

        # Payload rows into the bank.
        with m.If(take & stores):
            m.d.sync += prev.eq(beat_data)
        flush = Signal()                          # the last row ended in the last beat: written now
        flush_addr = Signal.like(self.bank_addr, reset_less=True)
        m.d.sync += flush.eq(ending & late)
        with m.If(ending & late):
            m.d.sync += flush_addr.eq(late_addr)
        with m.If(flush):
            m.d.comb += [self.bank_en.eq(1), self.bank_addr.eq(flush_addr), self.bank_data.eq(prev >> (8 * o))]
        with m.Else():
            m.d.comb += [
                self.bank_en.eq(row_now), self.bank_addr.eq(addr),
                self.bank_data.eq(((prev >> (8 * o)) | (beat_data << (8 * (B - o))))[:W]),
            ]
        finished = Signal(range(3))
        m.d.sync += finished.eq(flush + (ending & ~late))
        m.d.comb += self.finished.eq(finished)

        open_ = Signal(OPEN_BITS)
        m.d.comb += self.open_after.eq(open_ + push - finished)
        m.d.sync += open_.eq(self.open_after)

        m.d.comb += self.busy.eq(active | flush | nxt_valid | queue.r_rdy | (held != 0))
        return m
