"""Per-port ingress: checks each frame as it arrives and hands only good frames to the switch core."""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from cais import protocol as proto
from cais.params import SwitchParams

from .axis import AxisSignature
from .enums import DropReason
from .frame_fifo import FrameFifo
from .header import HEADER_BITS, FrameHeader

__all__ = ["IngressPort", "frame_meta_layout", "popcount"]

META_DEPTH = 8


def frame_meta_layout(params: SwitchParams) -> data.StructLayout:
    """What the ingress tells the core about each good frame."""
    return data.StructLayout({
        "hdr": HEADER_BITS,                                  # first 30 frame bytes, wire order
        "length": range(params.max_frame + 1),               # bytes
        "beats": range(params.max_frame_beats + 1),
    })


def popcount(value):
    return sum(value[i] for i in range(len(value)))


class IngressPort(wiring.Component):
    """Receives frames on one AXI4-Stream port, validates them whole, and queues the good ones.

    Every frame is written to a :class:`FrameFifo` as it arrives; at its last beat the frame is either
    committed, with its header and length queued on ``meta``, or taken back and reported on ``drop``
    with the first failing check of docs/protocol.md (reasons BAD_FCS .. BAD_LENGTH; BAD_FCS: tuser
    on the last beat, a receiving MAC's FCS error). The core
    therefore only ever sees whole, well-formed frames, and a bad frame never touches switch state.

    Members
    -------
    s_axis : In(AxisSignature(user=True))
    meta : Out(frame_meta_layout); meta_valid : Out(1); meta_ready : In(1)
        One entry per good frame, valid once all its beats are in the FIFO.
    beat_data : Out(data_width); beat_valid : Out(1); beat_ready : In(1)
        The beats of the good frames, in order.
    drop : Out(1); drop_reason : Out(DropReason)
        Pulses once per dropped frame.
    rx_frame : Out(1); rx_bytes : Out(8)
        Per-cycle increments of the port's receive counters (every frame, good or bad).
    busy : Out(1)
        A frame is partly received, or a good frame is queued for the core.
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "s_axis": In(AxisSignature(params.data_width, user=True)),
            "meta": Out(self.meta_layout), "meta_valid": Out(1), "meta_ready": In(1),
            "beat_data": Out(params.data_width), "beat_valid": Out(1), "beat_ready": In(1),
            "drop": Out(1), "drop_reason": Out(DropReason),
            "rx_frame": Out(1), "rx_bytes": Out(8),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        P = self.params
        B = P.beat_bytes
        m = Module()
        m.submodules.fifo = fifo = FrameFifo(P.data_width, P.ingress_depth)
        m.submodules.meta_fifo = meta_fifo = SyncFIFOBuffered(
            width=Shape.cast(self.meta_layout).width, depth=META_DEPTH)
        s = self.s_axis

        beat = Signal(range(P.max_frame_beats + 1))       # index of the arriving beat in its frame
        length = Signal(range(P.max_frame_beats * B + 1))  # bytes before the arriving beat
        hdr_reg = Signal(HEADER_BITS)
        bad_framing = Signal()                            # sticky within the frame
        too_long = Signal()                               # more beats than max_frame allows

        # Past max_frame the frame is certainly dropped: accept its beats without storing them.
        discard = too_long | (beat == P.max_frame_beats)
        m.d.comb += s.tready.eq(meta_fifo.w_rdy & (discard | fifo.w_rdy))
        take = s.tvalid & s.tready

        all_ones = (1 << B) - 1
        keep_ok = Mux(s.tlast, (s.tkeep != 0) & ((s.tkeep & (s.tkeep + 1)) == 0), s.tkeep == all_ones)
        nbytes = Signal(range(B + 1))
        m.d.comb += nbytes.eq(popcount(s.tkeep))
        frame_len = length + nbytes

        # The header as it stands after this beat: bytes of earlier beats from hdr_reg, the rest from tdata.
        hdr_now = Signal(HEADER_BITS)
        for b in range(proto.HEADERS_BYTES):
            k, lane = divmod(b, B)
            m.d.comb += hdr_now[8 * b:8 * b + 8].eq(
                Mux(beat == k, s.tdata[8 * lane:8 * lane + 8], hdr_reg[8 * b:8 * b + 8]))

        # Checks of docs/protocol.md, in their order.
        hdr = FrameHeader(hdr_now)
        esize_ok = Const(0)
        for dtype in P.dtypes:
            esize = proto.ELEMENT_BYTES[dtype]
            esize_ok = esize_ok | ((hdr.dtype == dtype) & (hdr.payload_len % esize == 0))
        plen = hdr.payload_len
        wire_len = proto.HEADERS_BYTES + plen
        checks = [
            (proto.DropReason.BAD_FCS, s.tuser),              # decided at the last beat, where tuser counts
            (proto.DropReason.BAD_FRAMING, bad_framing | ~keep_ok),
            (proto.DropReason.OVERSIZE, discard | (frame_len > P.max_frame)),
            (proto.DropReason.RUNT, (frame_len < proto.ETH_HEADER_BYTES)
             | (hdr.is_cais & (frame_len < proto.HEADERS_BYTES))),
            (proto.DropReason.BAD_CODE, hdr.is_cais & ~(
                _one_of(hdr.op_type, proto.SUPPORTED_OPS) & _one_of(hdr.dtype, P.dtypes)
                & _one_of(hdr.red_op, list(proto.ReduceOp))
                & ((hdr.flags & (0xFF ^ int(proto.Flags.RETRANSMIT))) == 0))),
            (proto.DropReason.BAD_PAYLOAD_LEN, hdr.is_cais & ((plen == 0) | (plen > P.max_payload) | ~esize_ok)),
            (proto.DropReason.BAD_LENGTH, hdr.is_cais & ~((frame_len == wire_len) | (
                (wire_len < proto.MIN_FRAME_BYTES) & (frame_len == proto.MIN_FRAME_BYTES)))),
        ]
        assert [r for r, _ in checks] == list(proto.PARSER_DROPS)
        bad = Cat(*(c for _, c in checks)).any()
        reason = Signal(DropReason)
        for r, c in reversed(checks):       # the first failing check wins
            with m.If(c):
                m.d.comb += reason.eq(r)

        m.d.comb += [
            fifo.w_data.eq(s.tdata),
            fifo.w_en.eq(take & ~discard),
            self.rx_frame.eq(take & s.tlast),
            self.rx_bytes.eq(Mux(take, nbytes, 0)),
        ]
        with m.If(take):
            for k in range((proto.HEADERS_BYTES + B - 1) // B):
                with m.If(beat == k):
                    m.d.sync += hdr_reg.eq(hdr_now)
            with m.If(s.tlast):
                m.d.sync += [beat.eq(0), length.eq(0), bad_framing.eq(0), too_long.eq(0)]
                with m.If(bad):
                    m.d.comb += [fifo.rollback.eq(1), self.drop.eq(1), self.drop_reason.eq(reason)]
                with m.Else():
                    meta_in = data.View(self.meta_layout, meta_fifo.w_data)
                    m.d.comb += [
                        fifo.commit.eq(1),
                        meta_fifo.w_en.eq(1),
                        meta_in.hdr.eq(hdr_now),
                        meta_in.length.eq(frame_len),
                        meta_in.beats.eq(beat + 1),
                    ]
            with m.Else():
                m.d.sync += bad_framing.eq(bad_framing | ~keep_ok)
                with m.If(discard):
                    m.d.sync += too_long.eq(1)
                with m.Else():
                    m.d.sync += [beat.eq(beat + 1), length.eq(frame_len)]

        m.d.comb += self.busy.eq((beat != 0) | too_long | meta_fifo.r_rdy | fifo.r_valid)
        m.d.comb += [
            self.meta.eq(meta_fifo.r_data),
            self.meta_valid.eq(meta_fifo.r_rdy),
            meta_fifo.r_en.eq(self.meta_ready),
            self.beat_data.eq(fifo.r_data),
            self.beat_valid.eq(fifo.r_valid),
            fifo.r_ready.eq(self.beat_ready),
        ]
        return m


def _one_of(value, codes):
    return Cat(*(value == int(c) for c in codes)).any()
