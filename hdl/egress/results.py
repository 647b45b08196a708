"""The result generator: reads a completed slot set and sends it as a CAIS result frame."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto
from cais.params import SwitchParams

from ..common.pipeline import register_copy
from ..latency import RESULT_REQUEST
from ..common.uplink import uplink_frame_layout
from ..parser.header import cais_field
from .ports import FrameSourceSignature

__all__ = ["ResultGenerator", "result_frame_layout", "result_frame_shape", "header_split"]


def header_split(beat_bytes: int):
    """(h, o): the 30 header bytes fill ``h`` whole beats and ``o`` bytes of the next one."""
    return divmod(proto.HEADERS_BYTES, beat_bytes)


def result_frame_layout(params: SwitchParams) -> data.StructLayout:
    """A result frame to send: the header of the frame that triggered it, its egress ports and its
    payload rows."""
    return data.StructLayout({
        "cais": proto.CAIS_HEADER_BYTES * 8,   # header of the triggering frame, wire order
        "mask": params.ports,                  # egress ports
        "rows": range(params.rows_per_set + 1),  # ceil(payload_len / B)
        "beats": range(params.max_frame_beats + 1),   # the frame's beats and its last beat's keep
        "keep": params.beat_bytes,                    # (result_frame_shape)
        **({"up": uplink_frame_layout()} if params.uplink else {}),   # a partial for the parent switch
    })


def result_frame_shape(payload_len, beat_bytes: int):
    """(beats, keep): the beats of a result frame with ``payload_len`` payload bytes (an expression) behind
    the 30 header bytes and its last beat's keep. The fold reader stores them with the frame, so the
    generator takes them from registers (the integer switch measured the frame's register -> this sum ->
    3.15 ns of routing -> the last keep's decode, 113.06 MHz)."""
    lb = (beat_bytes - 1).bit_length()
    length = proto.HEADERS_BYTES + payload_len
    tail = length[:lb]
    return (length + beat_bytes - 1) >> lb, Mux(tail != 0, (Const(1, beat_bytes + 1) << tail) - 1,
                                                 (1 << beat_bytes) - 1)


class ResultGenerator(wiring.Component):
    """Turns result jobs into frames: Ethernet header, CAIS header with the RESULT flag, payload.

    The payload rows come as a stream, in order, and are shifted behind the 30 header bytes. A job moves
    into a register of its own (the next frame) while the current frame streams; the next frame asks the
    egress for its ports (``out.req``, ``out.mask``, ``out.beats``, registers) once all of its rows and
    the current frame's remaining ones are waiting (``rows_held``), so its beats leave back to back (a MAC's
    transmitter must not run dry mid-frame), and two cycles before the current frame's last beat, so the
    grant (a register of the result fanout) starts it right behind that beat, without a bubble (one cycle
    behind a one-beat frame). A frame's first beat leaves three cycles after its job and rows are in,
    when the generator is idle.

    Every output is a register or a register through one or two LUT levels, except ``out.data``: the
    payload row (``rows.payload``) masked and ORed with registers, two levels.

    Members
    -------
    jobs : In(stream.Signature(result_frame_layout))
        The frames to send, from the fold reader.
    switch_mac : In(48)
        Source MAC of the result frames.
    rows : In(stream.Signature(data_width)); rows_held : In(16)
        The payload rows of the jobs, in order: ``ceil(payload_len / B)`` per job; how many are waiting
        (``rows.payload`` is the oldest of them when ``rows_held`` is not 0: ``rows.valid`` is not used,
        ``rows.ready`` takes only a row ``rows_held`` counts).
    out : Out(FrameSourceSignature)
        The result frames, to the result fanout (:class:`~cais.hdl.egress.ports.ResultFanout`, which writes them
        into the ports' result queues): a frame asks for its ports; granted, it starts in the
        next cycle, and the egress takes each beat the cycle it is offered.
    busy : Out(1)

    ``request_latency`` (:data:`cais.hdl.latency.RESULT_REQUEST`, 1): an idle generator whose job and rows
    are all held in cycle t asks (``out.req``) in t + 1.
    """

    request_latency = RESULT_REQUEST

    def __init__(self, params: SwitchParams):
        self.params = params
        self.layout = result_frame_layout(params)
        W = params.data_width
        super().__init__({
            "jobs": In(stream.Signature(self.layout)),
            "switch_mac": In(48),
            "rows": In(stream.Signature(W)), "rows_held": In(16),
            "out": Out(FrameSourceSignature(params.ports, W, params.max_frame_beats)),
            "busy": Out(1),
        })

    def header(self, cais, up=None):
        """The 30 header bytes of the result frame for the CAIS header ``cais``, byte i at bits 8i..8i+7
        (``up``, with the uplink action: a partial's destination and flags instead, when ``up.partial``)."""
        flags_byte = proto.CAIS_HEADER_BYTES - 1
        dst = Cat(*(Const(b, 8) for b in proto.mac_to_bytes(proto.result_mac(0))[:5]), cais_field(cais, "group_id"))
        flags = Const(int(proto.Flags.RESULT), 8)
        if up is not None:
            dst = Mux(up.partial, up.dst, dst)
            flags = Mux(up.partial, Mux(up.retransmit, int(proto.Flags.RETRANSMIT), 0), flags)
        hdr = Cat(
            dst,
            *(self.switch_mac[8 * i:8 * i + 8] for i in reversed(range(6))),
            Const(proto.ETHERTYPE >> 8, 8), Const(proto.ETHERTYPE & 0xFF, 8),
            cais[:8 * flags_byte], flags,
        )
        assert len(hdr) == 8 * proto.HEADERS_BYTES
        return hdr

    def elaborate(self, platform):
        m = Module()
        P = self.params
        B, W = P.beat_bytes, P.data_width
        h, o = header_split(B)
        out = self.out
        rows_bits = range(P.rows_per_set + 1)
        beats_bits = range(P.max_frame_beats + 1)

        def chunk(cais, beat, up=None):            # header bytes of frame beat ``beat`` (<= h)
            hdr = self.header(cais, up)
            return hdr[8 * B * beat:min(8 * B * (beat + 1), len(hdr))]

        # The next frame, taken from the fold reader ahead of time (with its beats and last keep). Only the
        # valid bits and counts are reset (nxt_valid, active, owed, req): the rest is written before use.
        nxt = Signal(self.layout, reset_less=True)
        nxt_valid = Signal()

        # The current frame.
        active = Signal()
        cais = Signal.like(nxt.cais, reset_less=True)
        up = Signal.like(nxt.up, reset_less=True) if P.uplink else None    # a partial's destination and flags
        nxt_up = nxt.up if P.uplink else None
        left = Signal(beats_bits, reset_less=True)     # beats not yet sent, this one included
        is_last = Signal(reset_less=True)
        last_keep = Signal(B, reset_less=True)
        rows_left = Signal(rows_bits, reset_less=True)  # its rows not yet taken
        hsel = Signal(h + 1, reset_less=True)      # one-hot: the beat being presented, while a header beat
        past_hdr = Signal(reset_less=True)         # beat >= h: a payload row may be in it
        hdr_cur = Signal(W, reset_less=True)       # this beat's header bytes
        prev = Signal(W, reset_less=True)          # the last payload row taken (0 before the first)

        # Beat k carries payload row k - h (from its byte o on), if that row exists. A frame starts only
        # once all its rows are waiting, so a beat leaves in every cycle of the frame.
        needs_row = past_hdr & (rows_left != 0)
        fire = active
        ending = fire & is_last
        cur_row = Mux(needs_row, self.rows.payload, 0)
        payload = (prev >> (8 * (B - o))) | (cur_row << (8 * o))
        m.d.comb += [
            out.valid.eq(fire), out.data.eq(hdr_cur | payload[:W]), out.last.eq(is_last),
            out.keep.eq(Mux(is_last, last_keep, (1 << B) - 1)),
        ]
        with m.If(fire):
            m.d.sync += [prev.eq(cur_row), hsel.eq(hsel << 1)]
            nxt_hdr = 0
            for beat in range(1, h + 1):
                nxt_hdr = nxt_hdr | Mux(hsel[beat - 1], chunk(cais, beat, up), 0)
            m.d.sync += hdr_cur.eq(nxt_hdr)
            with m.If(~is_last):
                m.d.sync += [left.eq(left - 1), is_last.eq(left == 2)]

        # A grant comes only when the current frame ends by then (the request's promise, below).
        can_start = ~active | ending
        start = nxt_valid & can_start & out.grant
        job = self.jobs.payload
        m.d.comb += self.jobs.ready.eq(~nxt_valid | start)
        load = self.jobs.valid & self.jobs.ready
        with m.If(load):
            m.d.sync += [nxt.eq(job), nxt_valid.eq(1)]
        with m.Elif(start):
            m.d.sync += nxt_valid.eq(0)
        with m.If(start):
            m.d.sync += [
                cais.eq(nxt.cais), left.eq(nxt.beats), is_last.eq(nxt.beats == 1),
                last_keep.eq(nxt.keep), hsel.eq(1),
                hdr_cur.eq(chunk(nxt.cais, 0, nxt_up)), prev.eq(0),
            ]
            if P.uplink:
                m.d.sync += up.eq(nxt.up)

        # The frame's state after this edge (a start, a beat sent, a row taken, the last beat), and from it
        # rows.ready (``fire & needs_row``) in flip-flops of their own beside the fold reader's row queue it
        # pops (the integer switch measured rows_left -> needs_row -> the queue's pop and credits across
        # the die, 2.1 + 1.0 + 1.9 ns of routing, 104.13 MHz)
        active_next = Mux(start, 1, active & ~ending)
        rows_next = Mux(start, nxt.rows, Mux(fire & needs_row, rows_left - 1, rows_left))
        past_next = Mux(start, h == 0, (past_hdr | (fire & hsel[h - 1])) if h else past_hdr)
        m.d.sync += [active.eq(active_next), rows_left.eq(rows_next), past_hdr.eq(past_next)]
        # (whether rows are left after the edge from compares of registers with constants, not of the
        # decrement's sum: the integer switch measured rows_left -> the decrement's carry chain -> the
        # compare -> rows_ready, 2 carry steps, 6 LUT levels and 6.7 ns of routing, 101.20 MHz)
        rows_left_next = Mux(start, nxt.rows != 0, Mux(fire & needs_row, rows_left != 1, rows_left != 0))
        ready_next = active_next & past_next & rows_left_next
        m.d.comb += self.rows.ready.eq(register_copy(m, ready_next, "rows_ready", platform, reset=True))

        # Rows owed: the current frame's not yet taken and the next frame's.
        owed = Signal(range(2 * P.rows_per_set + 1))
        m.d.sync += owed.eq(Mux(load, owed + job.rows, owed) - self.rows.ready)

        # The request, registered: the next frame is there, all the rows owed are waiting (rows_held only
        # falls by the rows taken here), and the current frame's last beat comes in the request's next
        # cycle or earlier, so a grant decided in its cycle finds the generator free.
        ends_soon = Signal()
        with m.If(start):
            m.d.comb += ends_soon.eq(nxt.beats <= 2)
        with m.Elif(~active | ending):
            m.d.comb += ends_soon.eq(1)
        with m.Else():
            m.d.comb += ends_soon.eq(left <= Mux(fire, 3, 2))
        req = Signal()
        rows_in = Mux(load, self.rows_held >= owed + job.rows, self.rows_held >= owed)
        m.d.sync += req.eq((load | (nxt_valid & ~start)) & ends_soon & rows_in)
        m.d.comb += [out.req.eq(req), out.mask.eq(nxt.mask), out.beats.eq(nxt.beats)]
        m.d.comb += self.busy.eq(active | nxt_valid)
        return m
