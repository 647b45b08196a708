"""Per-port ingress: checks each frame as it arrives and hands only good frames to the switch core."""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from cais import protocol as proto
from cais.params import SwitchParams

from ..common.axis import AxisSignature
from ..common.enums import DropReason
from ..common.frame_fifo import FrameFifo
from ..common.pipeline import delay_line, register_copy
from ..latency import HEADER_QUEUE, INGRESS_DECIDE, INGRESS_HEADER
from .header import HEADER_BITS, FrameHeader

__all__ = ["IngressPort", "HeaderQueue", "frame_meta_layout", "popcount"]

META_DEPTH = 8


def frame_meta_layout(params: SwitchParams) -> data.StructLayout:
    """What the ingress tells the core about each good frame."""
    return data.StructLayout({
        "hdr": HEADER_BITS,                                  # first 30 frame bytes, wire order
        "length": range(params.max_frame + 1),               # bytes
        "beats": range(params.max_frame_beats + 1),
        # a CAIS all-reduce frame (it needs the slot state): the decision grants any other frame whatever
        # its maintenance does (the reset sweep, a SLOT_CLEAR, an aging visit)
        "all_reduce": 1,
    })


def popcount(value):
    """The number of ones of ``value``, as a balanced adder tree (a chain of adds would be as deep as wide)."""
    terms = [value[i] for i in range(len(value))]
    if not terms:
        return Const(0, 1)
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def thermometer_count(keep):
    """The number of ones of a mask whose set bits are bits 0..n-1 (any other mask gives some value):
    n is one more than the index of the highest set bit, a wide OR per bit of n instead of an adder tree."""
    width = len(keep)
    edge = [keep[i] & ~keep[i + 1] if i + 1 < width else keep[i] for i in range(width)]   # i = n - 1
    return Cat(*(Cat(*(edge[i] for i in range(width) if (i + 1) >> j & 1)).any()
                 for j in range(width.bit_length())))


class IngressPort(wiring.Component):
    """Receives frames on one AXI4-Stream port, validates them whole, and queues the good ones.

    Every frame is written to a :class:`FrameFifo` as it arrives; once its last beat is in, the frame is
    either committed, with its header and length queued on ``meta``, or taken back and reported on
    ``drop`` with the first failing check of docs/protocol.md (reasons BAD_FCS .. BAD_LENGTH; BAD_FCS:
    tuser on the last beat, a receiving MAC's FCS error). The core therefore only ever sees whole,
    well-formed frames, and a bad frame never touches switch state.

    Pipeline, counting the cycle in which a frame's last beat is accepted as cycle 0: in cycle 0 the
    beat's facts are registered (the frame's length from the beat index and the last beat's tkeep, its
    framing, tuser); in cycle 1 the checks that need no header are evaluated from those registers and
    registered, while the header's last beat is stored; in cycle 2 the header's checks are evaluated from
    the stored header and everything is registered; in cycle 3 (:attr:`DECIDE_DELAY`) the first failing
    check picks the reason and the frame is committed or rolled back, its header queued, in the same
    cycle as its last beat is written: the beats reach the FIFO through a 3-cycle delay line, so the next
    frame's beats, which may follow with no idle cycle, land after the commit. ``drop`` pulses in cycle 4
    (:attr:`DROP_DELAY`), its reason's bit of ``drop_counted`` in cycle 5 (:attr:`COUNT_DELAY`); the rx
    increments of a beat come 2 cycles after it (:attr:`RX_DELAY`).
    ``tready`` is a register: high while the header queue has room for every frame whose last beat is in
    (queued or still being checked) plus one, and the FIFO for every beat on its way plus one (or the
    beat is past ``max_frame`` and is not stored). Every output is a register, except ``busy`` (the OR of
    two registers).

    Members
    -------
    s_axis : In(AxisSignature(user=True))
    headers : Out(stream.Signature(frame_meta_layout))
        One entry per good frame, valid once all its beats are in the FIFO: :attr:`header_latency`
        (:data:`cais.hdl.latency.INGRESS_HEADER`, 5) cycles after its last beat was accepted, the commit
        (:attr:`DECIDE_DELAY`) and the header queue's :attr:`HeaderQueue.latency`.
    beats : Out(stream.Signature(data_width))
        The beats of the good frames, in order.
    drop : Out(1); drop_reason : Out(DropReason)
        Pulses once per dropped frame, :attr:`DROP_DELAY` cycles after its last beat was accepted.
    drop_counted : Out(len(PARSER_DROPS))
        The drop counters' increments: bit i pulses for a frame dropped for ``PARSER_DROPS[i]``, a cycle
        after ``drop`` (:attr:`COUNT_DELAY`). One-hot flip-flops of their own, so the per-reason sum beside
        the register bank starts from registers (the whole switch measured 3.8 ns of routing from
        ``drop`` across the die into the reason's compare and that sum).
    rx_frame : Out(1); rx_bytes : Out(8)
        Increments of the port's receive counters (every frame, good or bad), :attr:`RX_DELAY` cycles
        after the beat they count was accepted.
    busy : Out(1)
        A frame is partly received, being checked, queued for the core, or its drop not yet counted:
        1 from the cycle after a frame's first beat is accepted, and 0 from the second cycle after the
        last of those ends (once the core has taken a frame, its own busy covers that cycle).
    uplink : In(1)
        Only with ``params.uplink``: this port is the enabled uplink (UPLINK, docs/protocol.md section 13),
        where the parent's results (all-reduce frames with flags exactly RESULT) pass the BAD_CODE check.
    """

    DECIDE_DELAY = INGRESS_DECIDE   # cycles from a frame's last beat to its commit (or rollback) and its header queued
    header_latency = INGRESS_HEADER   # cycles from a good frame's last beat to its header on ``headers``
    DROP_DELAY = INGRESS_DECIDE + 1   # cycles from a dropped frame's last beat to its drop pulse
    COUNT_DELAY = DROP_DELAY + 1      # ... to its reason's bit of drop_counted
    RX_DELAY = 2       # cycles from a beat to its rx_frame / rx_bytes increment

    def __init__(self, params: SwitchParams):
        self.params = params
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "s_axis": In(AxisSignature(params.data_width, user=True)),
            "headers": Out(stream.Signature(self.meta_layout)),
            "beats": Out(stream.Signature(params.data_width)),
            "drop": Out(1), "drop_reason": Out(DropReason), "drop_counted": Out(len(proto.PARSER_DROPS)),
            "rx_frame": Out(1), "rx_bytes": Out(8),
            "busy": Out(1),
            **({"uplink": In(1)} if params.uplink else {}),
        })

    def elaborate(self, platform):
        P = self.params
        B = P.beat_bytes
        W = P.data_width
        m = Module()
        m.submodules.fifo = fifo = FrameFifo(W, P.ingress_depth, registered_output=True)
        # tready holds at most META_DEPTH frames, queued or being checked: a frame's slot is always free
        m.submodules.meta_fifo = meta_fifo = HeaderQueue(Shape.cast(self.meta_layout).width, META_DEPTH)
        s = self.s_axis
        len_shape = range(P.max_frame_beats * B + 1)

        # ---- cycle 0: the arriving beat
        ready = Signal(init=1)
        m.d.comb += s.tready.eq(ready)
        take = s.tvalid & ready
        beat = Signal(range(P.max_frame_beats + 1))       # index of the arriving beat in its frame
        # Only state, valid bits and counter inputs are reset; the data registers (headers, beats, the
        # last beat's facts, the checks) are read only under their valid bits.
        bad_framing = Signal()                            # sticky within the frame
        too_long = Signal()                               # more beats than max_frame allows
        # Past max_frame the frame is certainly dropped: accept its beats without storing them.
        discard = too_long | (beat == P.max_frame_beats)

        all_ones = (1 << B) - 1
        keep_ok = Mux(s.tlast, (s.tkeep != 0) & ((s.tkeep & (s.tkeep + 1)) == 0), s.tkeep == all_ones)
        # The frame's length, exact whenever the framing is good (every earlier beat full, the last one's
        # tkeep contiguous from lane 0); otherwise BAD_FRAMING (or BAD_FCS) wins and the length is unused.
        frame_len = beat * B + thermometer_count(s.tkeep)

        # the beats, DECIDE_DELAY cycles late, so that they reach the FIFO with their frame's commit or
        # rollback (d1_data also feeds the header's store)
        d1_en, d1_data = Signal(), Signal(W, reset_less=True)
        m.d.sync += [d1_en.eq(take & ~discard), d1_data.eq(s.tdata)]
        w_en = delay_line(m, d1_en, self.DECIDE_DELAY - 1, "beat_en", reset_less=False)
        w_data = delay_line(m, d1_data, self.DECIDE_DELAY - 1, "beat_data")
        m.d.comb += [fifo.w_data.eq(w_data), fifo.w_en.eq(w_en)]

        hdr_reg = self._header(m, take, beat, d1_data)

        # rx increments: the accepted tkeep registered, then counted. The frame's pulse is a copy: as a
        # plain register, synthesis merged it (and the register bank's register behind it) with the checks'
        # valid bits, which are the same value, and the whole switch measured 6.46 ns of routing from a
        # port's check register into the register bank's 32-bit counter (110.78 MHz).
        rx_keep, rx_last = Signal(B), Signal()
        m.d.sync += [rx_keep.eq(Mux(take, s.tkeep, 0)), rx_last.eq(take & s.tlast),
                     self.rx_bytes.eq(popcount(rx_keep))]
        m.d.comb += self.rx_frame.eq(register_copy(m, rx_last, "rx_frame_copy", platform, reset=True))

        # the last beat's facts, for cycle 1
        v1 = Signal()
        len1 = Signal(len_shape, reset_less=True)
        # the length less the headers, for BAD_LENGTH's compare with payload_len: subtracted here, from the
        # beat count, so that cycle 2 compares two registers' bits instead of adding to the header's field
        # first (the whole switch measured 14 logic steps from the header's last beat through that adder
        # and compare into the verdict, 3.56 ns of logic and 6.91 ns of routing)
        body1 = Signal(range(-proto.HEADERS_BYTES, P.max_frame_beats * B + 1), reset_less=True)
        beats1 = Signal(range(P.max_frame_beats + 1), reset_less=True)
        fcs1, framing1, over1 = Signal(reset_less=True), Signal(reset_less=True), Signal(reset_less=True)
        m.d.sync += v1.eq(take & s.tlast)
        with m.If(take):
            with m.If(s.tlast):
                m.d.sync += [beat.eq(0), bad_framing.eq(0), too_long.eq(0),
                             len1.eq(frame_len), body1.eq(frame_len - proto.HEADERS_BYTES),
                             beats1.eq(beat + 1), fcs1.eq(s.tuser),
                             framing1.eq(bad_framing | ~keep_ok), over1.eq(discard)]
            with m.Else():
                m.d.sync += bad_framing.eq(bad_framing | ~keep_ok)
                with m.If(discard):
                    m.d.sync += too_long.eq(1)
                with m.Else():
                    m.d.sync += beat.eq(beat + 1)

        v3, bad, failed3, checks, kept = self._checks(m, v1, (len1, body1, beats1, fcs1, framing1, over1), hdr_reg)
        hdr3, len3, beats3, all_reduce3 = kept

        # ---- cycle 3: the verdict; the frame's last beat is written in this cycle
        reason = Signal(DropReason)
        for i, (r, _) in reversed(list(enumerate(checks))):       # the first failing check wins
            with m.If(failed3[i]):
                m.d.comb += reason.eq(r)
        meta_in = data.View(self.meta_layout, meta_fifo.w_data)
        m.d.comb += [
            fifo.commit.eq(v3 & ~bad), fifo.rollback.eq(v3 & bad),
            meta_fifo.w_en.eq(v3), meta_fifo.commit.eq(~bad),
            meta_in.hdr.eq(hdr3), meta_in.length.eq(len3), meta_in.beats.eq(beats3),
            meta_in.all_reduce.eq(all_reduce3),
        ]
        m.d.sync += [self.drop.eq(v3 & bad), self.drop_reason.eq(reason)]
        m.d.sync += self.drop_counted.eq(Cat(self.drop & (self.drop_reason == r) for r in proto.PARSER_DROPS))

        # ---- room: header queue entries held for every frame whose last beat is in (checked or queued)
        meta_held = Signal(range(META_DEPTH + 1))
        popped = meta_fifo.r_valid & self.headers.ready
        m.d.sync += meta_held.eq(meta_held + (take & s.tlast) - (v3 & bad) - popped)
        meta_room = (meta_held + (take & s.tlast)) < META_DEPTH
        # A beat taken in the next cycle is written DECIDE_DELAY cycles later, behind at most DECIDE_DELAY + 1
        # beats not yet in the FIFO (the delay line's and this cycle's).
        in_flight = self.DECIDE_DELAY + 1
        assert P.ingress_depth - in_flight >= P.max_frame_beats, "a longest frame must fit in the room tready allows"
        fifo_room = fifo.level < P.ingress_depth - in_flight
        discard_next = Mux(take, ~s.tlast & (discard | (beat == P.max_frame_beats - 1)), discard)
        m.d.sync += ready.eq(meta_room & (discard_next | fifo_room))

        # busy from two flip-flops: what holds a frame, a cycle late (the core holds a frame handed over
        # by then, so only a dropped frame's end shows it a cycle later, when its drop is in its counter),
        # and a beat taken last cycle (the cycle after a frame's first beat is on time)
        holds = Signal()
        took = Signal()
        m.d.sync += [holds.eq((beat != 0) | too_long | (meta_held != 0) | self.drop | self.drop_counted.any()
                                | fifo.held), took.eq(take)]
        m.d.comb += self.busy.eq(holds | took)
        m.d.comb += [
            self.headers.payload.eq(meta_fifo.r_data),
            self.headers.valid.eq(meta_fifo.r_valid),
            meta_fifo.r_en.eq(self.headers.ready),
            self.beats.payload.eq(fifo.r_data),
            self.beats.valid.eq(fifo.r_valid),
            fifo.r_ready.eq(self.beats.ready),
        ]
        return m

    def _checks(self, m, v1, facts, hdr_reg):
        """Cycles 1 and 2 of a frame's checks (docs/protocol.md, in their order), from the last beat's
        registered facts and the stored header: the valid bit, the verdict and the checks' flags of cycle
        3, the checks (reason, flag) and what the header queue keeps (header, length, beats, all-reduce)."""
        # ---- cycle 1: the checks that need no header, from the last beat's facts (the header's last beat
        # is stored in this cycle)
        P = self.params
        len1, body1, beats1, fcs1, framing1, over1 = facts
        v2 = Signal()
        len2 = Signal.like(len1, reset_less=True)
        body2 = Signal.like(body1, reset_less=True)
        beats2 = Signal.like(beats1, reset_less=True)
        fcs2, framing2, over2 = Signal(reset_less=True), Signal(reset_less=True), Signal(reset_less=True)
        short2, eth_runt2, min_len2 = Signal(reset_less=True), Signal(reset_less=True), Signal(reset_less=True)
        m.d.sync += v2.eq(v1)
        with m.If(v1):
            m.d.sync += [len2.eq(len1), body2.eq(body1), beats2.eq(beats1), fcs2.eq(fcs1), framing2.eq(framing1),
                         over2.eq(over1 | (len1 > P.max_frame)), eth_runt2.eq(len1 < proto.ETH_HEADER_BYTES),
                         short2.eq(len1 < proto.HEADERS_BYTES), min_len2.eq(len1 == proto.MIN_FRAME_BYTES)]

        # ---- cycle 2: the checks of docs/protocol.md, in their order, from registers and the stored header
        hdr = FrameHeader(hdr_reg)
        esize_ok = Const(0)
        for dtype in P.dtypes:
            esize = proto.ELEMENT_BYTES[dtype]
            esize_ok = esize_ok | ((hdr.dtype == dtype) & (hdr.payload_len % esize == 0))
        plen = hdr.payload_len
        flags_ok = (hdr.flags & (0xFF ^ int(proto.Flags.RETRANSMIT))) == 0
        if P.uplink:    # a parent's result: an all-reduce frame with flags exactly RESULT, on the uplink port
            flags_ok = flags_ok | (self.uplink & (hdr.flags == int(proto.Flags.RESULT))
                                   & (hdr.op_type == proto.OpType.ALL_REDUCE))
        checks = [
            (proto.DropReason.BAD_FCS, fcs2),              # decided at the last beat, where tuser counts
            (proto.DropReason.BAD_FRAMING, framing2),
            (proto.DropReason.OVERSIZE, over2),
            (proto.DropReason.RUNT, eth_runt2 | (hdr.is_cais & short2)),
            (proto.DropReason.BAD_CODE, hdr.is_cais & ~(
                _one_of(hdr.op_type, proto.SUPPORTED_OPS) & _one_of(hdr.dtype, P.dtypes)
                & _one_of(hdr.red_op, list(proto.ReduceOp)) & flags_ok)),
            (proto.DropReason.BAD_PAYLOAD_LEN, hdr.is_cais & ((plen == 0) | (plen > P.max_payload) | ~esize_ok)),
            # the frame is exactly its header and payload, or the 60-byte minimum if those are shorter
            (proto.DropReason.BAD_LENGTH, hdr.is_cais & ~(
                (body2 == plen) | ((plen < proto.MIN_FRAME_BYTES - proto.HEADERS_BYTES) & min_len2))),
        ]
        assert [r for r, _ in checks] == list(proto.PARSER_DROPS)
        v3 = Signal()
        failed3 = Signal(len(checks), reset_less=True)
        # whether any check failed, registered beside them: the verdict drives the FIFOs' commit and the
        # header queue's count from a flip-flop, not through the checks' OR (the whole switch measured 8 ns
        # of routing on that path)
        bad = Signal(reset_less=True, name="bad3")
        hdr3 = Signal(HEADER_BITS, reset_less=True)
        len3 = Signal.like(len1, reset_less=True)
        beats3 = Signal.like(beats1, reset_less=True)
        all_reduce3 = Signal(reset_less=True)
        m.d.sync += v3.eq(v2)
        with m.If(v2):
            failed = Cat(*(c for _, c in checks))
            m.d.sync += [failed3.eq(failed), bad.eq(failed.any()), hdr3.eq(hdr_reg), len3.eq(len2),
                         beats3.eq(beats2), all_reduce3.eq(hdr.is_cais & (hdr.op_type == proto.OpType.ALL_REDUCE))]

        return v3, bad, failed3, checks, (hdr3, len3, beats3, all_reduce3)

    def _header(self, m, take, beat, d1_data):
        """The header register: complete from cycle 2 of its frame (read there, and until the next frame's
        first beat is stored at the end of that frame's cycle 1).

        The beats are stored a cycle late, from ``d1_data``, under an enable that is a flip-flop per header
        beat: the take (``tvalid``, from outside, and ``tready``) and the beat's position drive one register
        each, not the clock enables of the whole header register across the die (the whole switch measured
        1.83 + 3.54 + 2.70 ns of routing from ``tready`` through the take into ``hdr_reg``'s enables). The
        checks read the register alone, a cycle after the last beat is stored (switch_int measured 98.84
        MHz with the checks a cycle earlier, on the stored beats and ``d1_data`` through a bypass: the
        beat's store flag -> the bypass -> the BAD_LENGTH compare -> the verdict, 7.25-8.01 ns of routing)."""
        B = self.params.beat_bytes
        hdr_reg = Signal(HEADER_BITS, reset_less=True)
        for k in range((proto.HEADERS_BYTES + B - 1) // B):
            lanes = min(B, proto.HEADERS_BYTES - k * B)
            stored = Signal(name=f"hdr_beat{k}_d1")
            m.d.sync += stored.eq(take & (beat == k))
            with m.If(stored):
                m.d.sync += hdr_reg[8 * k * B:8 * (k * B + lanes)].eq(d1_data[:8 * lanes])
        return hdr_reg


class HeaderQueue(wiring.Component):
    """The ingress's queue of good frames' headers: every checked frame's entry is written, only a good
    one is kept.

    The slot at the write pointer is written whenever ``w_en`` (a register of the caller: the frame's
    checks are done), and the pointer moves on only with ``commit`` (the verdict, a few LUT levels later),
    so the verdict drives a few pointer bits, not the write enable of every LUT-RAM cell (the whole
    switch measured 11.4 ns of routing from the verdict into a FIFO's level that way). The caller
    guarantees room: at most ``depth - 1`` entries are queued when it writes. Read side as
    ``SyncFIFOBuffered``'s: an entry committed in cycle ``t`` is at the head (``r_valid`` and ``r_data``,
    registers) in cycle ``t + 2``.

    ``latency`` (:data:`cais.hdl.latency.HEADER_QUEUE`, 2): committed in cycle t, at the head in t + 2.

    Members
    -------
    w_data : In(width); w_en : In(1); commit : In(1)
        Write ``w_data`` at the tail; keep it (with ``commit`` in the same cycle) or let the next write
        replace it.
    r_data : Out(width); r_valid : Out(1); r_en : In(1)
        The oldest kept entry while ``r_valid``; ``r_en`` takes it.
    """

    latency = HEADER_QUEUE

    def __init__(self, width: int, depth: int):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth must be a power of two"
        self.width, self.depth = width, depth
        super().__init__({"w_data": In(width), "w_en": In(1), "commit": In(1),
                          "r_data": Out(width), "r_valid": Out(1), "r_en": In(1)})

    def elaborate(self, platform):
        m = Module()
        abits = (self.depth - 1).bit_length()
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
        wr, rd = mem.write_port(), mem.read_port(domain="comb")
        wp, rp = Signal(abits + 1), Signal(abits + 1)       # one extra bit: full and empty differ
        out_valid = Signal()
        m.d.comb += [wr.addr.eq(wp[:abits]), wr.data.eq(self.w_data), wr.en.eq(self.w_en)]
        with m.If(self.w_en & self.commit):
            m.d.sync += wp.eq(wp + 1)
        # The head takes the next entry when it is empty or being read: the LUT RAM is read at rp
        # (combinationally) into a data register of its own. A read register yosys
        # infers moves to the address side instead (merged with rp, or a copy of rp - 1), so the LUT RAM
        # read and the header's consumer shared a cycle across the die (the header's MAC compare:
        # 4.4-4.9 ns from the head address to the LUT RAM, then the compare, 98.6 MHz); the TRELLIS_FF copy
        # stays a register behind the read, beside its consumer.
        # The register loads whenever the head is free, whether or not an entry is there (it is read only
        # under r_valid): its clock enable is the reader's take and out_valid, both beside it, not the
        # pointers' compare as well.
        free = ~out_valid | self.r_en
        fetch = (rp != wp) & free
        with m.If(fetch):
            m.d.sync += [rp.eq(rp + 1), out_valid.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += out_valid.eq(0)
        m.d.comb += rd.addr.eq(rp[:abits])
        head = register_copy(m, rd.data, "head", platform, enable=free)
        m.d.comb += [self.r_data.eq(head), self.r_valid.eq(out_valid)]
        return m


def _one_of(value, codes):
    return Cat(*(value == int(c) for c in codes)).any()
