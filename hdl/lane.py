"""A port's lane: streams each decided frame out of the ingress FIFO at one beat per cycle, into the egress
(forwarded frames), into the port's contribution bank (all-reduce payload rows) or nowhere (drops)."""

from amaranth.hdl import Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais.params import SwitchParams

from .decision import bank_addr_bits, decision_layout
from .egress import FrameSourceSignature
from .enums import Action
from .results import header_split

__all__ = ["IngressLane", "LANE_DECISIONS", "OPEN_BITS"]

#: Decisions a lane holds (queued or in the decision pipeline): enough to hide the pipeline's latency.
LANE_DECISIONS = 4
#: Bits of the count of a lane's decided, unfinished frames: the queued ones, the one streaming and one
#: whose last row is being written.
OPEN_BITS = ceil_log2(LANE_DECISIONS + 3)


class IngressLane(wiring.Component):
    """Port p's frames, decided in order, streamed back to back.

    A frame starts when its decision is at the head of the lane's queue and the lane is idle or sending
    its previous frame's last beat; a forwarded frame also needs the egress grant (``fwd.grant``), asked
    for in that same cycle (``fwd.req``), so frames follow each other without a bubble. Payload row ``j``
    (frame bytes ``30 + jB .. 30 + jB + B - 1``) is complete with beat ``j + h + 1`` and written to the
    bank then; a row that ends in the frame's last beat is written in the next cycle, when the next
    frame's first beat (which never completes a row) is read.

    Members
    -------
    credit : Out(1); taken : In(1)
        The lane has room for one more decision; the decision pipeline took a header of this port.
    push : In(1); decision : In(decision_layout)
        A decision for this port's oldest undecided frame.
    beat_data : In(W); beat_valid : In(1); beat_ready : Out(1)
        The port's frames (ingress FIFO, whole frames only).
    fwd : Out(FrameSourceSignature)
        Forwarded frames, to the egress crossbar.
    bank_addr, bank_data, bank_en : Out
        Payload rows for the port's bank.
    finished : Out(range(3))
        Frames done in this cycle (their rows, if any, written by its end): a frame whose last row is
        written now and a one-beat frame that ends now make two.
    open_after : Out(OPEN_BITS)
        Frames decided and not finished, counting this cycle's decision and finished frames (what a
        result job queued in this cycle waits for, :class:`cais.hdl.completion.JobQueue`).
    busy : Out(1)
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        W, P = params.data_width, params.ports
        self.layout = decision_layout(params)
        super().__init__({
            "credit": Out(1), "taken": In(1),
            "push": In(1), "decision": In(self.layout),
            "beat_data": In(W), "beat_valid": In(1), "beat_ready": Out(1),
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
        m.d.comb += [queue.w_en.eq(self.push), queue.w_data.eq(self.decision)]
        head = data.View(self.layout, queue.r_data)

        # Decisions held: queued, plus headers taken and not yet decided (the pipeline never stalls).
        held = Signal(range(LANE_DECISIONS + 1))
        m.d.sync += held.eq(held + self.taken - (queue.r_en & queue.r_rdy))
        m.d.comb += self.credit.eq(held < LANE_DECISIONS)

        active = Signal()
        cur = Signal(self.layout)
        idx = Signal(range(prm.max_frame_beats))
        prev = Signal(W)
        is_last = idx == cur.beats - 1
        take = active & self.beat_valid
        ending = take & is_last
        m.d.comb += self.beat_ready.eq(active)

        # The next frame: starts when the current one ends (or none is active).
        can_start = ~active | ending
        forward_next = head.action == Action.FORWARD
        fwd = self.fwd
        m.d.comb += [
            fwd.req.eq(can_start & queue.r_rdy & forward_next),
            fwd.mask.eq(head.mask), fwd.beats.eq(head.beats),
        ]
        start = can_start & queue.r_rdy & (~forward_next | fwd.grant)
        m.d.comb += queue.r_en.eq(start)
        with m.If(start):
            m.d.sync += [cur.eq(head), idx.eq(0), active.eq(1)]
        with m.Elif(ending):
            m.d.sync += active.eq(0)
        with m.If(take & ~is_last):
            m.d.sync += idx.eq(idx + 1)

        # Forwarded beats.
        tail = cur.length[:lb]
        m.d.comb += [
            fwd.data.eq(self.beat_data), fwd.last.eq(is_last),
            fwd.keep.eq(Mux(is_last & (tail != 0), (Const(1, B + 1) << tail) - 1, (1 << B) - 1)),
            fwd.valid.eq(take & (cur.action == Action.FORWARD)),
        ]

        # Payload rows into the bank.
        stores = (cur.action == Action.AGGREGATE) & cur.write
        last_row_late = stores & (cur.beats == cur.rows + h)    # the last row ends in the last beat
        with m.If(take & stores):
            m.d.sync += prev.eq(self.beat_data)
        row = (idx - (h + 1))[:len(cur.rows)]
        row_now = take & stores & (idx >= h + 1) & (row < cur.rows)
        flush = Signal()                          # ... so it is written in the next cycle
        flush_addr = Signal.like(self.bank_addr)
        m.d.sync += flush.eq(ending & last_row_late)
        with m.If(ending & last_row_late):
            m.d.sync += flush_addr.eq(cur.row_base + cur.rows - 1)
        with m.If(flush):
            m.d.comb += [self.bank_en.eq(1), self.bank_addr.eq(flush_addr), self.bank_data.eq(prev >> (8 * o))]
        with m.Else():
            m.d.comb += [
                self.bank_en.eq(row_now), self.bank_addr.eq(cur.row_base + row),
                self.bank_data.eq(((prev >> (8 * o)) | (self.beat_data << (8 * (B - o))))[:W]),
            ]
        m.d.comb += self.finished.eq(flush + (ending & ~last_row_late))

        open_ = Signal(OPEN_BITS)
        m.d.comb += self.open_after.eq(open_ + self.push - self.finished)
        m.d.sync += open_.eq(self.open_after)

        m.d.comb += self.busy.eq(active | flush | queue.r_rdy | (held != 0))
        return m
