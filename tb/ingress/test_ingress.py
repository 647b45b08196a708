"""The header parser: cais.hdl.parser.ingress.IngressPort (with cais.hdl.parser.header's field decoding), top ``cais_ingress``.

An AxiStreamSource sends frames on ``s_axis`` (tkeep per byte, tuser on a frame the MAC flagged); AxiStreamSinks
take the good frames' metadata (``m_hdr``: frame_meta_layout, the first 30 bytes, length and beat count) and
their beats (``m_axis``). Every frame's verdict comes from the reference model (cais.sim.refmodel.SwitchModel
.receive: its parser drop counters, docs/protocol.md section 4); the directed frames also carry a hand-derived
reason, which the model must agree with. Checked per case:

* the good frames come out whole and in order: the metadata (header bytes, length, beats) and every beat;
* each bad frame is dropped with the right reason, in order, ``drop`` pulsing DROP_DELAY (4) cycles after its
  last beat was accepted (docs of IngressPort), and every bad frame is followed by a good one that must pass;
* the receive counters: one ``rx_frame`` per frame, ``rx_bytes`` summing to the bytes whose tkeep was set;
* ``busy`` is low once everything is out.

Cases: directed (one frame per drop reason and edge), good frames at the size edges, random frames (judged by
the model), each with and without idle insertion on the source and back-pressure on both sinks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from amaranth.lib import data

from cais import protocol as proto
from cais.hdl.parser.ingress import frame_meta_layout
from cais.protocol import DropReason as R
from cais.sim.refmodel import SwitchModel
from cais.tb.common import IDLE_BACKPRESSURE, clock_and_reset, quiet_bfms, set_backpressure, set_idle, tb_params

DROP_DELAY = 4          # IngressPort: cycles from a dropped frame's last beat to its drop pulse


@dataclass
class Stim:
    """A frame as sent: its bytes (tkeep set), and how the framing is broken, if it is."""
    data: bytes
    label: str
    fault: str | None = None     # "gap_last", "partial_mid", "empty_last": tkeep breaks the framing rule
    bad_fcs: bool = False
    want: R | None = field(default=None)    # the hand-derived verdict (None: good), or "model" for random

    def axis_frame(self, B: int) -> AxiStreamFrame:
        """The cocotbext frame: bytes with a tkeep bit each (a clear bit is a lane the frame does not use)."""
        data, keep = list(self.data), [1] * len(self.data)
        if self.fault == "gap_last":            # the last beat's bytes moved up one lane: a hole at lane 0
            start = (len(data) - 1) // B * B
            data.insert(start, 0xEE)
            keep.insert(start, 0)
        elif self.fault == "partial_mid":        # lane 1 of the first beat cleared (the frame has > 1 beat)
            data.insert(1, 0xEE)
            keep.insert(1, 0)
        elif self.fault == "empty_last":         # an extra beat whose tkeep is all zero
            pad = (-len(data)) % B
            data += [0] * pad + [0xEE] * B
            keep += [0] * (pad + B)
        return AxiStreamFrame(bytes(data), tkeep=keep, tuser=int(self.bad_fcs))


def model_verdict(params, s: Stim) -> R | None:
    """The parser's drop reason the reference model gives the frame, or None if it passes the parser."""
    m = SwitchModel(params)
    m.receive(0, s.data, framing_ok=s.fault is None and len(s.data) > 0, fcs_ok=not s.bad_fcs)
    c = m.counters()
    assert c["RX_FRAMES"][0] == 1 and c["RX_BYTES"][0] == len(s.data)
    reasons = [r for r in proto.PARSER_DROPS if c[f"DROP_{r.name}"]]
    assert len(reasons) <= 1
    return reasons[0] if reasons else None


class Frames:
    """Frame builders (random bytes from one seeded generator)."""

    def __init__(self, params, rng: random.Random):
        self.P, self.rng = params, rng

    def cais(self, *, plen=None, op=0, dtype=0, red_op=0, flags=0, length=None, pad=False) -> bytes:
        rng = self.rng
        if plen is None:
            plen = 4 * rng.randint(1, self.P.max_payload // 4)
        hdr = proto.CaisHeader(op_type=op, group_id=rng.getrandbits(8), layer_id=rng.getrandbits(16),
                               chunk_id=rng.getrandbits(16), total_chunks=rng.getrandbits(16),
                               seq_num=rng.getrandbits(32), payload_len=plen, dtype=dtype, red_op=red_op, flags=flags)
        frame = proto.build_frame(hdr, rng.randbytes(min(plen, 2 * self.P.max_frame)), dst=rng.getrandbits(48),
                                  src=rng.getrandbits(48), pad=pad)
        if length is not None:
            frame = (frame + rng.randbytes(max(0, length - len(frame))))[:length]
        return frame

    def ordinary(self, length: int, ethertype: int = 0x0800) -> bytes:
        head = self.rng.randbytes(12) + ethertype.to_bytes(2, "big")
        return (head + self.rng.randbytes(max(0, length - 14)))[:length]

    def good(self) -> bytes:
        return self.cais() if self.rng.random() < 0.5 else self.ordinary(self.rng.randint(14, 200))


def directed(P, f: Frames) -> list[Stim]:
    """One frame per drop reason (hand-derived verdicts, docs/protocol.md section 4 in its order)."""
    S = Stim
    return [
        S(f.cais(plen=8), "bad FCS", bad_fcs=True, want=R.BAD_FCS),
        S(f.cais(plen=8), "bad FCS and bad framing", "gap_last", bad_fcs=True, want=R.BAD_FCS),
        S(f.ordinary(10), "runt with bad FCS", bad_fcs=True, want=R.BAD_FCS),
        S(f.cais(plen=8), "hole in the last beat", "gap_last", want=R.BAD_FRAMING),
        S(f.cais(plen=64), "partial beat before the last", "partial_mid", want=R.BAD_FRAMING),
        S(f.cais(plen=64), "empty last beat", "empty_last", want=R.BAD_FRAMING),
        S(f.ordinary(5), "bad framing before runt", "gap_last", want=R.BAD_FRAMING),
        S(f.ordinary(P.max_frame + 1), "max_frame + 1", want=R.OVERSIZE),
        S(f.ordinary(P.max_frame + P.beat_bytes), "max_frame + one beat", want=R.OVERSIZE),
        S(f.ordinary(2 * P.max_frame), "twice max_frame", want=R.OVERSIZE),
        S(f.cais(length=P.max_frame + 1), "CAIS max_frame + 1", want=R.OVERSIZE),
        S(f.ordinary(1), "1 byte", want=R.RUNT),
        S(f.ordinary(13), "13 bytes", want=R.RUNT),
        S(f.cais(length=29), "CAIS, 29 bytes", want=R.RUNT),
        S(f.cais(op=int(proto.OpType.REDUCE_SCATTER)), "REDUCE_SCATTER", want=R.BAD_CODE),
        S(f.cais(op=255), "op 255", want=R.BAD_CODE),
        S(f.cais(dtype=6), "dtype 6", want=R.BAD_CODE),
        S(f.cais(red_op=3), "red_op 3", want=R.BAD_CODE),
        S(f.cais(flags=int(proto.Flags.RESULT)), "RESULT flag from a host", want=R.BAD_CODE),
        S(f.cais(flags=0x80), "flag 0x80", want=R.BAD_CODE),
        S(f.cais(plen=0), "payload_len 0", want=R.BAD_PAYLOAD_LEN),
        S(f.cais(plen=P.max_payload + 4), "payload_len max + 4", want=R.BAD_PAYLOAD_LEN),
        S(f.cais(plen=6), "int32 payload of 6 bytes", want=R.BAD_PAYLOAD_LEN),
        S(f.cais(plen=8, length=39), "payload 8 in 39 bytes", want=R.BAD_LENGTH),
        S(f.cais(plen=8, length=59), "payload 8 in 59 bytes", want=R.BAD_LENGTH),
        S(f.cais(plen=32, length=64), "payload 32 padded to 64", want=R.BAD_LENGTH),
    ]


def edges(P, f: Frames) -> list[Stim]:
    """Good frames at the size and code edges."""
    S = Stim
    return [
        S(f.cais(plen=4), "payload 4, 34 bytes"), S(f.cais(plen=4, pad=True), "payload 4 padded to 60"),
        S(f.cais(plen=28), "payload 28, 58 bytes"), S(f.cais(plen=32), "payload 32, 62 bytes"),
        S(f.cais(plen=P.max_payload), "max payload"), S(f.cais(dtype=int(proto.DType.INT8), plen=3), "int8 x 3"),
        S(f.cais(dtype=int(proto.DType.FP16), plen=6), "fp16 x 3"),
        S(f.cais(flags=int(proto.Flags.RETRANSMIT)), "RETRANSMIT"),
        S(f.cais(op=int(proto.OpType.ALL_GATHER), red_op=2), "ALL_GATHER"),
        S(f.cais(op=int(proto.OpType.BROADCAST), red_op=1), "BROADCAST"),
        S(f.ordinary(14), "ordinary 14"), S(f.ordinary(60), "ordinary 60"),
        S(f.ordinary(P.max_frame), "ordinary max_frame"), S(f.ordinary(3 * P.beat_bytes), "3 whole beats"),
    ]


def random_frames(P, f: Frames, n: int) -> list[Stim]:
    rng = f.rng
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.4:
            data = f.cais(plen=rng.choice([4 * rng.randint(1, P.max_payload // 4), rng.randint(0, P.max_payload + 8)]),
                          length=rng.choice([None, None, rng.randint(1, 120)]), dtype=rng.choice([0, 1, 2, 3, 7]))
        else:
            data = f.ordinary(rng.choice([rng.randint(1, 200), rng.randint(P.max_frame - 8, P.max_frame + 8)]))
        fault = rng.choice([None] * 8 + ["gap_last"]) if len(data) % P.beat_bytes else None
        out.append(Stim(data, f"random {i}", fault, bad_fcs=rng.random() < 0.05, want="model"))
    return out


class TB:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.P = P = tb_params()
        self.B = P.beat_bytes
        quiet_bfms(dut)
        bus = lambda name: AxiStreamBus.from_prefix(dut, name, bus_separator="__")  # noqa: E731
        self.source = AxiStreamSource(bus("s_axis"), dut.clk, dut.rst)
        self.hdr_sink = AxiStreamSink(bus("m_hdr"), dut.clk, dut.rst, byte_lanes=1)
        self.beat_sink = AxiStreamSink(bus("m_axis"), dut.clk, dut.rst, byte_lanes=1)
        self.frames = Frames(P, random.Random(seed))
        self.cycle = 0
        self.last_beats = []       # cycle of every accepted last beat
        self.drops = []            # (cycle, reason) of every drop pulse
        self.rx_frames = self.rx_bytes = 0

    async def start(self, idle, backpressure):
        await clock_and_reset(self.dut)
        cocotb.start_soon(self._watch())
        set_idle(self.source, idle)
        set_backpressure(self.hdr_sink, backpressure)
        set_backpressure(self.beat_sink, backpressure)

    async def _watch(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)            # the values of the cycle this edge ends
            self.cycle += 1
            if d.s_axis__tvalid.value == 1 and d.s_axis__tready.value == 1 and d.s_axis__tlast.value == 1:
                self.last_beats.append(self.cycle)
            if d.drop.value == 1:
                self.drops.append((self.cycle, R(d.drop_reason.value.to_unsigned())))
            self.rx_frames += int(d.rx_frame.value)
            self.rx_bytes += d.rx_bytes.value.to_unsigned()

    def meta(self, word: int) -> tuple[bytes, int, int, int]:
        """(first 30 bytes, length, beats, all_reduce) of an m_hdr word, by the fields of frame_meta_layout
        (the one definition the RTL builds the word from)."""
        layout = data.Layout.cast(frame_meta_layout(self.P))
        assert len(self.dut.m_hdr__tdata) == layout.size
        value = {name: word >> f.offset & ((1 << f.width) - 1) for name, f in layout}
        return (value["hdr"].to_bytes(proto.HEADERS_BYTES, "little"), value["length"], value["beats"],
                value["all_reduce"])

    async def run(self, stims: list[Stim]):
        P, B = self.P, self.B
        verdicts = []
        for s in stims:
            v = model_verdict(P, s)
            if s.want != "model":
                assert v == s.want, f"{s.label}: the model says {v}, the case {s.want}"
            verdicts.append(v)
        for s in stims:
            await self.source.send(s.axis_frame(B))
        good = [s for s, v in zip(stims, verdicts) if v is None]
        bad = [(i, v) for i, v in enumerate(verdicts) if v is not None]
        beats_due = sum(-(-len(s.data) // B) for s in good)
        got_meta, got_beats = [], []
        for _ in range(40 * sum(len(s.data) // B + 8 for s in stims) + 200):
            await RisingEdge(self.dut.clk)
            while not self.hdr_sink.empty():
                got_meta.append(self.meta(self.hdr_sink.recv_nowait().tdata[0]))
            while not self.beat_sink.empty():
                got_beats.append(self.beat_sink.recv_nowait().tdata[0])
            if (self.source.empty() and not self.source.active and len(got_meta) == len(good)
                    and len(got_beats) >= beats_due and len(self.drops) == len(bad)):
                break
        await ClockCycles(self.dut.clk, 8)
        assert len(self.last_beats) == len(stims), f"{len(self.last_beats)} of {len(stims)} frames accepted"
        # drops: the bad frames, in order, each DROP_DELAY cycles after its last beat
        assert [r for _, r in self.drops] == [v for _, v in bad], \
            f"drops {[r.name for _, r in self.drops]}, want {[(stims[i].label, v.name) for i, v in bad]}"
        for (cycle, reason), (i, _) in zip(self.drops, bad):
            assert cycle - self.last_beats[i] == DROP_DELAY, \
                f"{stims[i].label}: drop {cycle - self.last_beats[i]} cycles after its last beat"
        # good frames: metadata and beats, in order
        assert len(got_meta) == len(good), f"{len(got_meta)} good frames out, want {len(good)}"
        assert len(got_beats) == beats_due, f"{len(got_beats)} beats out, want {beats_due}"
        at = 0
        for s, (hdr, length, nbeats, all_reduce) in zip(good, got_meta):
            L = len(s.data)
            assert (length, nbeats) == (L, -(-L // B)), f"{s.label}: meta length {length} beats {nbeats}"
            parsed = proto.parse_frame(s.data)
            want_ar = parsed.cais is not None and parsed.cais.op_type == proto.OpType.ALL_REDUCE
            assert all_reduce == want_ar, f"{s.label}: all_reduce {all_reduce}, the frame says {want_ar}"
            n = min(L, proto.HEADERS_BYTES)
            assert hdr[:n] == s.data[:n], f"{s.label}: header {hdr[:n].hex()} != {s.data[:n].hex()}"
            for j in range(nbeats):
                chunk = s.data[j * B:(j + 1) * B]
                assert got_beats[at + j].to_bytes(B, "little")[:len(chunk)] == chunk, f"{s.label}: beat {j}"
            at += nbeats
        # the receive counters: every frame, good or bad
        assert self.rx_frames == len(stims), f"rx_frame {self.rx_frames}, want {len(stims)}"
        want_bytes = sum(len(s.data) for s in stims)
        assert self.rx_bytes == want_bytes, f"rx_bytes {self.rx_bytes}, want {want_bytes}"
        assert self.dut.busy.value == 0, "busy with every frame delivered or dropped"


def good_after_each_bad(f: Frames, stims: list[Stim]) -> list[Stim]:
    out = []
    for s in stims:
        out.append(s)
        if s.want is not None:
            out.append(Stim(f.good(), f"good after {s.label}"))
    return out


@cocotb.test()
@cocotb.parametrize(case=["directed", "edges", "random"], **IDLE_BACKPRESSURE)
async def frames(dut, case, idle, backpressure):
    tb = TB(dut, seed=["directed", "edges", "random"].index(case) * 4 + 2 * idle + backpressure)
    await tb.start(idle, backpressure)
    f = tb.frames
    if case == "directed":
        stims = good_after_each_bad(f, directed(tb.P, f))
        assert {s.want for s in stims} == set(proto.PARSER_DROPS) | {None}, "a drop reason has no case"
    elif case == "edges":
        stims = edges(tb.P, f)
    else:
        stims = random_frames(tb.P, f, 40)
    await tb.run(stims)
