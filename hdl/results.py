"""The result generator: reads a completed slot set and sends it as a CAIS result frame."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto
from cais.params import SwitchParams

from .alu import byteswap
from .fpu import BF16, FP16, FP32, FloatNarrow
from .egress import FrameSourceSignature
from .header import cais_field

__all__ = ["ResultGenerator", "ResultRow", "result_row_latency", "result_frame_layout", "header_split"]


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
    })


class ResultRow(wiring.Component):
    """One payload row of a result, from the fold chain's accumulator word, pipelined.

    In the wire format the row is the word's low ``data_width`` bits; fp16/bf16 accumulated in fp32 fill
    the whole word with W/16 float32 accumulators, which are rounded to the wire format here, once, as the
    result leaves (docs/numerics.md). With float units the rounding takes :attr:`latency` = 2 clock edges
    (the alignment, registered; then the rounding and the choice of the row, into the output register),
    and every row takes them, whatever its kind; without float units the row is the word's low bits,
    combinational (latency 0). A new word may enter every cycle.

    Members
    -------
    word : In(2 * data_width)
        The accumulator word (:attr:`cais.hdl.fold.FoldChain.result`).
    acc_fp32 : In(1); dtype : In(4)
        How the set accumulates (presented with ``word``).
    row : Out(data_width)
        The row of the word presented :attr:`latency` cycles earlier.
    """

    def __init__(self, data_width: int, float_units: bool = True):
        self.data_width, self.float_units = data_width, float_units
        super().__init__({"word": In(2 * data_width), "acc_fp32": In(1), "dtype": In(4),
                          "row": Out(data_width)})

    @property
    def latency(self) -> int:
        """Clock edges from ``word`` to its ``row``."""
        return result_row_latency(self.float_units)

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        wire = self.word[:W]
        if not self.float_units:
            m.d.comb += self.row.eq(wire)
            return m
        # Stage 1 (inside FloatNarrow(stages=1)): the alignment; the controls and the wire row beside it.
        narrowed = {}
        for dtype, fmt in ((proto.DType.FP16, FP16), (proto.DType.BF16, BF16)):
            out = Signal(W, name=f"narrow_{dtype.name.lower()}")
            for i in range(W // 16):
                unit = m.submodules[f"narrow_{dtype.name.lower()}{i}"] = FloatNarrow(FP32, fmt, stages=1)
                m.d.comb += [unit.a.eq(byteswap(self.word[32 * i:32 * i + 32], 4)),
                             out[16 * i:16 * i + 16].eq(byteswap(unit.result, 2))]
            narrowed[dtype] = out
        wire_r, acc_r, bf16_r = Signal(W), Signal(), Signal()
        m.d.sync += [wire_r.eq(wire), acc_r.eq(self.acc_fp32), bf16_r.eq(self.dtype == proto.DType.BF16)]
        # Stage 2: the rounding and the choice, into the output register.
        m.d.sync += self.row.eq(Mux(acc_r, Mux(bf16_r, narrowed[proto.DType.BF16], narrowed[proto.DType.FP16]),
                                    wire_r))
        return m


def result_row_latency(float_units: bool) -> int:
    """:attr:`ResultRow.latency` of a ResultRow so built, without building it."""
    return 2 if float_units else 0


class ResultGenerator(wiring.Component):
    """Turns result jobs into frames: Ethernet header, CAIS header with the RESULT flag, payload.

    The payload rows come as a stream, in order, and are shifted behind the 30 header bytes. A frame asks
    the egress for its ports (``out.req``, ``out.mask``, ``out.beats``) once all of its rows are waiting
    (``rows_held``), so its beats leave back to back (a MAC's transmitter must not run dry mid-frame), and
    it may ask while the previous frame's last beat leaves, so frames follow each other without a bubble.

    Members
    -------
    job : In(result_frame_layout); job_valid : In(1); job_ready : Out(1)
    switch_mac : In(48)
        Source MAC of the result frames.
    row : In(data_width); row_valid : In(1); row_ready : Out(1); rows_held : In(16)
        The payload rows of the jobs, in order: ``ceil(payload_len / B)`` per job; how many are waiting.
    out : Out(FrameSourceSignature)
        The result frames, to the egress crossbar: a frame asks for its ports; granted, it starts in the
        next cycle, and the egress takes each beat the cycle it is offered.
    busy : Out(1)
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        self.layout = result_frame_layout(params)
        W = params.data_width
        super().__init__({
            "job": In(self.layout), "job_valid": In(1), "job_ready": Out(1),
            "switch_mac": In(48),
            "row": In(W), "row_valid": In(1), "row_ready": Out(1), "rows_held": In(16),
            "out": Out(FrameSourceSignature(params.ports, W, params.max_frame_beats)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P = self.params
        B, W = P.beat_bytes, P.data_width
        h, o = header_split(B)
        lb = (B - 1).bit_length()
        out = self.out

        active = Signal()
        job = Signal(self.layout)
        rows = Signal(range(P.rows_per_set + 1))               # payload beats
        beats = Signal(range(P.max_frame_beats + 1))           # frame beats
        tail = Signal(range(B + 1))                            # bytes in the last frame beat
        k = Signal(range(P.max_frame_beats + 1))               # frame beat being presented
        prev = Signal(W)                                       # payload row k-h-1

        group = cais_field(job.cais, "group_id")

        # The 30 header bytes of the result frame, byte i at bits 8i..8i+7.
        flags_byte = proto.CAIS_HEADER_BYTES - 1
        hdr = Cat(
            *(Const(b, 8) for b in proto.mac_to_bytes(proto.result_mac(0))[:5]), group,
            *(self.switch_mac[8 * i:8 * i + 8] for i in reversed(range(6))),
            Const(proto.ETHERTYPE >> 8, 8), Const(proto.ETHERTYPE & 0xFF, 8),
            job.cais[:8 * flags_byte], Const(int(proto.Flags.RESULT), 8),
        )
        assert len(hdr) == 8 * proto.HEADERS_BYTES

        # Beat k carries payload row k - h (from its byte o on), if that row exists.
        # (Comparisons with h are left out when h is 0: an always-true unsigned compare is a lint error.)
        needs_row = ((k >= h) & (k - h < rows)) if h else (k < rows)
        m.d.comb += out.valid.eq(active & (~needs_row | self.row_valid))
        cur = Mux(needs_row, self.row, 0)
        hdr_part = Signal(W)
        with m.Switch(k):
            for beat in range(h + 1):
                with m.Case(beat):
                    chunk = hdr[8 * B * beat:min(8 * B * (beat + 1), len(hdr))]
                    m.d.comb += hdr_part.eq(chunk)
        payload = (prev >> (8 * (B - o))) | (cur << (8 * o))
        is_last = k == beats - 1
        fire = out.valid
        m.d.comb += [
            out.data.eq(hdr_part | payload[:W]),
            out.last.eq(is_last),
            out.keep.eq(Mux(is_last, (Const(1, B + 1) << tail) - 1, (1 << B) - 1)),
            self.row_ready.eq(fire & needs_row),
        ]
        with m.If(fire):
            m.d.sync += [k.eq(k + 1), prev.eq(cur)]

        # The next job asks for the egress while this frame's last beat leaves.
        job_plen = cais_field(self.job.cais, "payload_len")
        job_len = proto.HEADERS_BYTES + job_plen
        can_start = ~active | (fire & is_last)
        job_rows = self.job.rows
        rows_waiting = self.rows_held - self.row_ready          # not counting one taken this cycle
        m.d.comb += [
            out.req.eq(can_start & self.job_valid & (rows_waiting >= job_rows)),
            out.mask.eq(self.job.mask), out.beats.eq((job_len + B - 1) >> lb),
        ]
        start = out.req & out.grant
        m.d.comb += self.job_ready.eq(start)
        with m.If(start):
            m.d.sync += [
                active.eq(1), job.eq(self.job), k.eq(0), prev.eq(0),
                rows.eq(job_rows),
                beats.eq(out.beats),
                tail.eq(((job_len - 1) & (B - 1)) + 1),
            ]
        with m.Elif(fire & is_last):
            m.d.sync += active.eq(0)
        m.d.comb += self.busy.eq(active)
        return m
