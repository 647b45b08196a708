"""IngressPort: the parser checks of docs/protocol.md section 4 and the good-frame queue.

Directed cases name their expected drop reason by hand (and the reference model is asked to agree); the
random frames are judged by ``cais.sim.refmodel.SwitchModel.receive`` on a fresh model per frame: the block
must drop exactly the frames the model drops for a parser reason (BAD_FRAMING .. BAD_LENGTH), with the
same reason, and pass every other frame unchanged on headers/beats. Every bad frame in the directed lists is
followed by a good frame that must come out.

The source inserts random idle cycles and fills the lanes whose tkeep bit is clear with garbage; the
sinks apply random back-pressure. Per cycle: ``drop`` only ``DROP_DELAY`` cycles after the last beat of a
frame, ``rx_frame`` and ``rx_bytes`` equal to what was accepted ``RX_DELAY`` cycles earlier (the delays
IngressPort documents).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from cais import protocol as proto
from cais.hdl.parser.ingress import HeaderQueue, IngressPort
from cais.params import SwitchParams
from cais.protocol import DropReason as R
from cais.sim.refmodel import SwitchModel

from blocksim import Pins, from_word, popcount, run
from ecp5synth import synth_json

P64 = SwitchParams()
P512 = SwitchParams(data_width=512, float_units=False)   # float codes are BAD_CODE here
PARAMS = [P64, P512]
IDS = ["w64", "w512"]
# extra corners: max_frame not a multiple of the beat, and a FIFO of only 32 beats
P128_406 = SwitchParams(data_width=128, max_frame=406)
P256_300 = SwitchParams(data_width=256, max_frame=300)


# ----------------------------------------------------------------------------- stimulus
@dataclass
class Stim:
    beats: list           # per beat: list of B entries, a byte (tkeep set) or None (tkeep clear)
    label: str = ""
    bad_fcs: bool = False  # tuser high on the last beat (the MAC saw a bad FCS)

    @property
    def data(self) -> bytes:
        """The bytes whose tkeep bit is set, in order (what the frame is, for the counters and the model)."""
        return bytes(b for beat in self.beats for b in beat if b is not None)

    @property
    def framing_ok(self) -> bool:
        keeps = [[b is not None for b in beat] for beat in self.beats]
        if not all(all(k) for k in keeps[:-1]):
            return False
        last = keeps[-1]
        n = sum(last)
        return n > 0 and all(last[:n])

    def words(self, rng, B):
        """(tdata, tkeep, tlast, tuser) per beat, clear lanes filled with garbage; tuser is random on the
        beats before the last (it only counts on the last)."""
        out = []
        for i, beat in enumerate(self.beats):
            raw = bytes(rng.getrandbits(8) if b is None else b for b in beat)
            keep = sum(1 << j for j, b in enumerate(beat) if b is not None)
            last = i == len(self.beats) - 1
            out.append((int.from_bytes(raw, "little"), keep, last, self.bad_fcs if last else rng.getrandbits(1)))
        return out


def stim(data: bytes, B: int, fault: str | None = None, rng=None, label="", bad_fcs=False) -> Stim:
    """A frame as beats; ``fault`` breaks the framing rule in one of several ways; ``bad_fcs`` raises
    tuser on the last beat."""
    rng = rng or random.Random(0)
    data = bytes(data)
    beats = [list(data[i:i + B]) for i in range(0, len(data), B)] or [[]]
    for b in beats:
        b += [None] * (B - len(b))
    if fault == "gap_last":                # last beat's enables not starting at lane 0 / with a hole
        last = beats[-1]
        n = sum(x is not None for x in last)
        if n < B:
            beats[-1] = [None] + last[:-1]                      # shifted up one lane
        else:
            hole = rng.randrange(1, B - 1)
            last[hole] = None                                  # a hole inside
    elif fault == "partial_mid":           # a beat before the last with tkeep not all ones
        assert len(beats) >= 2
        i = rng.randrange(len(beats) - 1)
        lanes = rng.sample(range(B), rng.randint(1, B))
        for j in lanes:
            beats[i][j] = None
    elif fault == "empty_last":            # an extra last beat with tkeep = 0
        beats.append([None] * B)
    elif fault is not None:
        raise ValueError(fault)
    s = Stim(beats, label or (fault or ""), bad_fcs)
    assert s.framing_ok == (fault is None and len(data) > 0), (label, fault)
    return s


def model_verdict(params, s: Stim):
    """The parser drop reason the reference model gives the frame, or None if it passes the parser."""
    m = SwitchModel(params)
    m.receive(0, s.data, framing_ok=s.framing_ok, fcs_ok=not s.bad_fcs)

    def counter(name):           # read through the model's register bus, as software would
        return m.read(m.regmap[name].address(0))
    assert counter("RX_FRAMES") == 1 and counter("RX_BYTES") == len(s.data)
    reasons = [r for r in proto.PARSER_DROPS if counter(f"DROP_{r.name}")]
    assert len(reasons) <= 1
    return reasons[0] if reasons else None


def cais_bytes(rng, params, *, plen=None, op=None, dtype=0, red_op=None, flags=None, length=None, pad=None,
               group=None):
    """A CAIS frame's bytes; ``length`` forces the total length (truncating or extending with random bytes),
    ``pad`` pads to 60 bytes with random bytes."""
    if plen is None:
        plen = 4 * rng.randint(1, params.max_payload // 4)
    hdr = proto.CaisHeader(
        op_type=rng.choice(proto.SUPPORTED_OPS) if op is None else op,
        group_id=rng.getrandbits(8) if group is None else group, layer_id=rng.getrandbits(16),
        chunk_id=rng.getrandbits(16), total_chunks=rng.getrandbits(16), seq_num=rng.getrandbits(32),
        payload_len=plen, dtype=dtype, red_op=rng.choice(list(proto.ReduceOp)) if red_op is None else red_op,
        flags=rng.choice([0, int(proto.Flags.RETRANSMIT)]) if flags is None else flags)
    frame = proto.build_frame(hdr, rng.randbytes(min(plen, 2 * params.max_frame)), dst=rng.getrandbits(48),
                              src=rng.getrandbits(48))
    if pad:
        frame += rng.randbytes(max(0, proto.MIN_FRAME_BYTES - len(frame)))
    if length is not None:
        frame = (frame + rng.randbytes(max(0, length - len(frame))))[:length]
    return frame


def ordinary_bytes(rng, length, ethertype=None):
    et = rng.choice([0x0800, 0x86DD, 0x0806, 0x88B6, 0x88B4, 0x0000, 0xFFFF]) if ethertype is None else ethertype
    head = rng.getrandbits(48).to_bytes(6, "big") + rng.getrandbits(48).to_bytes(6, "big") + et.to_bytes(2, "big")
    return (head + rng.randbytes(max(0, length - 14)))[:length]


# ----------------------------------------------------------------------------- the bench
@dataclass
class Outcome:
    drops: dict            # frame index -> drop reason
    frames: list           # good frames out: (hdr bytes (30), length, beats, [beat words])
    cycles: int
    stalled_beats: int     # cycles with tvalid & ~tready
    rx_frames: int
    rx_bytes: int
    extra_beats: int = 0   # beats out beyond those the meta entries account for


def run_ingress(params, stims, *, seed=0, idle=0.0, meta_stall=0.0, beat_stall=0.0, hold_readers=0,
                expected_good=None) -> Outcome:
    """Send ``stims`` back to back; collect drops and good frames, with per-cycle checks.

    ``hold_readers``: cycles during which headers.ready and beats.ready are held low.
    ``expected_good``: (frames, beats) to wait for before stopping (default: from the reference model).
    """
    B = params.beat_bytes
    rng = random.Random(seed)
    dut = IngressPort(params)
    if expected_good is None:
        good = [s for s in stims if model_verdict(params, s) is None]
        expected_good = (len(good), sum(len(s.beats) for s in good))
    words = [s.words(rng, B) for s in stims]
    out = Outcome({}, [], 0, 0, 0, 0)

    async def tb(ctx):
        s = dut.s_axis
        pins = Pins(ctx)
        fi, bi = 0, 0                    # frame and beat being offered
        metas, beat_words = [], []
        budget = 3 * sum(len(w) for w in words) + 100 * len(words) + 2 * hold_readers + 200
        after = 0                        # cycles since everything expected arrived
        history = []                     # per cycle: (beat taken, its tlast, its tkeep, its frame index)
        for cycle in range(budget):
            offer = fi < len(words) and rng.random() >= idle
            if offer:
                tdata, tkeep, tlast, tuser = words[fi][bi]
                pins.set(s.tdata, tdata)
                pins.set(s.tkeep, tkeep)
                pins.set(s.tlast, tlast)
                pins.set(s.tuser, tuser)
            elif rng.random() < 0.25:        # while idle, the bus sometimes carries garbage
                pins.set(s.tdata, rng.getrandbits(params.data_width))
                pins.set(s.tkeep, rng.getrandbits(B))
                pins.set(s.tlast, rng.getrandbits(1))
                pins.set(s.tuser, rng.getrandbits(1))
            pins.set(s.tvalid, offer)
            readers = cycle >= hold_readers
            meta_ready = readers and rng.random() >= meta_stall
            beat_ready = readers and rng.random() >= beat_stall
            pins.set(dut.headers.ready, meta_ready)
            pins.set(dut.beats.ready, beat_ready)
            (_, _, tready, drop, reason, rx_frame, rx_bytes, meta_valid, meta, beat_valid, beat_data, busy
             ) = await ctx.tick().sample(s.tready, dut.drop, dut.drop_reason, dut.rx_frame, dut.rx_bytes,
                                         dut.headers.valid, dut.headers.payload, dut.beats.valid, dut.beats.payload, dut.busy)
            out.cycles += 1
            take = bool(offer and tready)
            history.append((take, take and bool(tlast), tkeep if take else 0, fi))

            def back(delay):             # what was accepted `delay` cycles ago
                return history[cycle - delay] if cycle >= delay else (False, False, 0, None)
            where = f"cycle {cycle}, frame {fi} ({stims[fi].label if fi < len(stims) else '-'}), beat {bi}"
            if back(1)[0] or cycle == 0:
                assert busy == (cycle > 0), f"{where}: busy {busy} the cycle after a beat (or at reset)"
            _, rx_last, rx_keep, _ = back(IngressPort.RX_DELAY)
            assert rx_frame == rx_last, f"{where}: rx_frame"
            assert rx_bytes == popcount(rx_keep), f"{where}: rx_bytes {rx_bytes}"
            out.rx_frames += rx_frame
            out.rx_bytes += rx_bytes
            _, drop_last, _, drop_fi = back(IngressPort.DROP_DELAY)
            if drop:
                assert drop_last, f"{where}: drop not {IngressPort.DROP_DELAY} cycles after a last beat"
                assert drop_fi not in out.drops
                out.drops[drop_fi] = R(reason)
            if offer and not tready:
                out.stalled_beats += 1
            if take:
                bi += 1
                if tlast:
                    fi, bi = fi + 1, 0
            if meta_valid and meta_ready:
                metas.append((from_word(meta.hdr, proto.HEADERS_BYTES), meta.length, meta.beats, meta.all_reduce))
            if beat_valid and beat_ready:
                beat_words.append(beat_data)
            if fi == len(words) and (len(metas), len(beat_words)) >= expected_good:
                after += 1
                if after > 20:           # nothing more may come
                    assert not busy, f"{where}: busy with every frame delivered or dropped"
                    break
        assert fi == len(words), f"only {fi} of {len(words)} frames accepted in {budget} cycles"
        at = 0
        for hdr, length, nbeats, all_reduce in metas:
            out.frames.append((hdr, length, nbeats, beat_words[at:at + nbeats], all_reduce))
            at += nbeats
        out.extra_beats = len(beat_words) - at

    run(dut, tb)
    return out


def check_outcome(params, stims, out: Outcome, expected):
    """``expected``: per stim, the drop reason or None. Good frames must come out exactly, in order."""
    B = params.beat_bytes
    got = [out.drops.get(i) for i in range(len(stims))]
    bad = [(i, stims[i].label, len(stims[i].data), e, g) for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not bad, "drop verdicts differ (index, label, length, want, got):\n" + "\n".join(map(str, bad[:20]))
    good = [s for s, e in zip(stims, expected) if e is None]
    assert len(out.frames) == len(good), f"{len(out.frames)} good frames came out, want {len(good)}"
    assert out.extra_beats == 0, f"{out.extra_beats} beats came out that no meta entry accounts for"
    for k, (s, (hdr, length, nbeats, bws, all_reduce)) in enumerate(zip(good, out.frames)):
        data = s.data
        L = len(data)
        what = f"good frame {k} ({s.label}, {L} bytes)"
        assert length == L, f"{what}: meta.length {length}"
        assert nbeats == -(-L // B), f"{what}: meta.beats {nbeats}"
        n = min(L, proto.HEADERS_BYTES)       # header bytes past the frame's end are not defined
        assert hdr[:n] == data[:n], f"{what}: meta.hdr {hdr.hex()} != {data[:proto.HEADERS_BYTES].hex()}"
        cais = proto.parse_frame(data).cais
        assert all_reduce == (cais is not None and cais.op_type == proto.OpType.ALL_REDUCE), \
            f"{what}: meta.all_reduce {all_reduce}"
        for j, w in enumerate(bws):
            chunk = data[j * B:(j + 1) * B]
            assert from_word(w, B)[:len(chunk)] == chunk, f"{what}: beat {j}"
    assert out.rx_frames == len(stims)
    assert out.rx_bytes == sum(len(s.data) for s in stims)


# ----------------------------------------------------------------------------- directed
def directed_cases(params, rng, huge=True):
    """(stim, hand-derived expected reason) for every parser drop reason, and good frames at the edges."""
    B = params.beat_bytes
    P = params
    big = (P.ingress_depth + 3) * B + 5 if huge else P.max_frame + 3 * B   # huge: longer than the FIFO
    c = lambda **kw: cais_bytes(rng, P, **kw)  # noqa: E731
    cases = [
        # BAD_FCS: whatever else the frame is (tuser on earlier beats is random and ignored, see Stim.words)
        (stim(c(plen=8), B, rng=rng, label="good cais, bad FCS", bad_fcs=True), R.BAD_FCS),
        (stim(ordinary_bytes(rng, 200), B, rng=rng, label="ordinary, bad FCS", bad_fcs=True), R.BAD_FCS),
        (stim(c(plen=8), B, "gap_last", rng, label="bad framing and bad FCS", bad_fcs=True), R.BAD_FCS),
        (stim(ordinary_bytes(rng, 10), B, rng=rng, label="runt, bad FCS", bad_fcs=True), R.BAD_FCS),
        # BAD_FRAMING
        (stim(c(plen=8), B, "gap_last", rng), R.BAD_FRAMING),
        (stim(c(plen=8 * B - 30 + 2 if 8 * B - 30 + 2 <= P.max_payload else 4 * B - 30 + 2), B, "gap_last", rng),
         R.BAD_FRAMING),
        (stim(c(plen=P.max_payload), B, "partial_mid", rng), R.BAD_FRAMING),
        (stim(ordinary_bytes(rng, 200), B, "partial_mid", rng), R.BAD_FRAMING),
        (stim(c(plen=64), B, "empty_last", rng), R.BAD_FRAMING),
        (stim(b"", B, label="zero bytes"), R.BAD_FRAMING),          # one beat, tkeep = 0
        (stim(ordinary_bytes(rng, 5), B, "gap_last", rng), R.BAD_FRAMING),        # before RUNT
        (stim(ordinary_bytes(rng, big - 2), B, "gap_last", rng), R.BAD_FRAMING),  # before OVERSIZE
        (stim(ordinary_bytes(rng, big), B, "partial_mid", rng), R.BAD_FRAMING),
        (stim(c(op=3, plen=0), B, "gap_last", rng), R.BAD_FRAMING),
        # OVERSIZE
        (stim(ordinary_bytes(rng, P.max_frame + 1), B, label="max_frame+1"), R.OVERSIZE),
        (stim(c(length=P.max_frame + 1), B, label="CAIS max_frame+1"), R.OVERSIZE),
        (stim(ordinary_bytes(rng, P.max_frame + B), B, label="max_frame+B"), R.OVERSIZE),
        (stim(ordinary_bytes(rng, big), B, label="far longer than max_frame"), R.OVERSIZE),
        # RUNT
        (stim(ordinary_bytes(rng, 1), B, label="1 byte"), R.RUNT),
        (stim(ordinary_bytes(rng, 13), B, label="13 bytes"), R.RUNT),
        (stim(ordinary_bytes(rng, 13, 0x88B5), B, label="13 bytes, half a CAIS ethertype"), R.RUNT),
        (stim(c(length=14), B, label="CAIS 14"), R.RUNT),
        (stim(c(length=29), B, label="CAIS 29"), R.RUNT),
        (stim(c(op=9, length=29), B, label="CAIS 29 bad code"), R.RUNT),
        # BAD_CODE
        (stim(c(op=int(proto.OpType.REDUCE_SCATTER)), B, label="REDUCE_SCATTER"), R.BAD_CODE),
        (stim(c(op=4), B, label="op 4"), R.BAD_CODE),
        (stim(c(op=255), B, label="op 255"), R.BAD_CODE),
        (stim(c(dtype=6), B, label="dtype 6"), R.BAD_CODE),           # the first unassigned code
        (stim(c(dtype=int(proto.DType.FP32)), B, label="FP32"), None if P.float_units else R.BAD_CODE),
        (stim(c(dtype=int(proto.DType.INT8), plen=3), B, label="INT8, 3 bytes"), None),
        (stim(c(dtype=int(proto.DType.FP16), plen=6), B, label="FP16, 6 bytes"),
         None if P.float_units else R.BAD_CODE),
        (stim(c(dtype=int(proto.DType.BF16), plen=5), B, label="BF16, 5 bytes"),
         R.BAD_PAYLOAD_LEN if P.float_units else R.BAD_CODE),
        (stim(c(dtype=15), B, label="dtype 15"), R.BAD_CODE),
        (stim(c(red_op=3), B, label="red_op 3"), R.BAD_CODE),
        (stim(c(red_op=15), B, label="red_op 15"), R.BAD_CODE),
        (stim(c(flags=int(proto.Flags.RESULT)), B, label="RESULT flag"), R.BAD_CODE),
        (stim(c(flags=0x03), B, label="RESULT|RETRANSMIT"), R.BAD_CODE),
        (stim(c(flags=0x04), B, label="flag 0x04"), R.BAD_CODE),
        (stim(c(flags=0x80), B, label="flag 0x80"), R.BAD_CODE),
        (stim(c(op=3, plen=0, length=31), B, label="bad code before payload_len"), R.BAD_CODE),
        # BAD_PAYLOAD_LEN
        (stim(c(plen=0), B, label="plen 0"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=0, pad=True), B, label="plen 0 padded"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=P.max_payload + 4), B, label="plen max+4"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=6), B, label="plen 6"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=6, pad=True), B, label="plen 6 padded"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=30, length=60), B, label="plen 30 in 60 bytes"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=0xFFFC, length=100), B, label="plen 0xfffc"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=0x8004, length=0x8004 % 1000 + 30), B, label="plen 0x8004"), R.BAD_PAYLOAD_LEN),
        (stim(c(plen=5, length=99), B, label="bad payload_len before length"), R.BAD_PAYLOAD_LEN),
        # BAD_LENGTH
        (stim(c(plen=8, length=39), B, label="plen 8, 39 bytes"), R.BAD_LENGTH),
        (stim(c(plen=8, length=37), B, label="plen 8, 37 bytes"), R.BAD_LENGTH),
        (stim(c(plen=8, length=30), B, label="plen 8, 30 bytes"), R.BAD_LENGTH),
        (stim(c(plen=8, length=59), B, label="plen 8, 59 bytes"), R.BAD_LENGTH),
        (stim(c(plen=8, length=61), B, label="plen 8, 61 bytes"), R.BAD_LENGTH),
        (stim(c(plen=28, length=59), B, label="plen 28, 59 bytes"), R.BAD_LENGTH),
        (stim(c(plen=32, length=60), B, label="plen 32 (62) cut to 60"), R.BAD_LENGTH),
        (stim(c(plen=32, length=64), B, label="plen 32 (62) padded to 64"), R.BAD_LENGTH),
        (stim(c(plen=P.max_payload, length=P.max_payload + 29), B, label="max payload short"), R.BAD_LENGTH),
        (stim(c(plen=P.max_payload, length=P.max_payload + 31), B, label="max payload long"), R.BAD_LENGTH),
        (stim(c(plen=8, length=P.max_frame), B, label="plen 8, max_frame bytes"), R.BAD_LENGTH),
        # good frames at the edges
        (stim(c(plen=4), B, label="plen 4, 34 bytes"), None),
        (stim(c(plen=4, pad=True), B, label="plen 4 padded to 60"), None),
        (stim(c(plen=28, pad=True), B, label="plen 28 padded to 60"), None),
        (stim(c(plen=28), B, label="plen 28, 58 bytes"), None),
        (stim(c(plen=32), B, label="plen 32, 62 bytes"), None),
        (stim(c(plen=P.max_payload), B, label="max payload"), None),
        (stim(c(flags=int(proto.Flags.RETRANSMIT)), B, label="RETRANSMIT"), None),
        (stim(c(op=int(proto.OpType.ALL_GATHER), red_op=2), B, label="ALL_GATHER MIN"), None),
        (stim(c(op=int(proto.OpType.BROADCAST), red_op=1), B, label="BROADCAST MAX"), None),
        (stim(ordinary_bytes(rng, 14), B, label="ordinary 14"), None),
        (stim(ordinary_bytes(rng, 29, 0x0800), B, label="ordinary 29"), None),
        (stim(ordinary_bytes(rng, 60), B, label="ordinary 60"), None),
        (stim(ordinary_bytes(rng, P.max_frame), B, label="ordinary max_frame"), None),
        (stim(ordinary_bytes(rng, B * (P.max_frame // B)), B, label="ordinary, whole beats"), None),
        (stim(ordinary_bytes(rng, 3 * B), B, label="ordinary 3 beats exactly"), None),
        (stim(ordinary_bytes(rng, 14, 0x88B6), B, label="EtherType 0x88B6"), None),
    ]
    return cases


def with_good_after_each_bad(params, cases, rng):
    out = []
    for i, (s, reason) in enumerate(cases):
        out.append((s, reason))
        if reason is not None:
            follow = cais_bytes(rng, params) if i % 2 else ordinary_bytes(rng, rng.randint(14, 120))
            out.append((stim(follow, params.beat_bytes, label=f"good after {s.label}"), None))
    return out


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_every_drop_reason_then_good_frame(params):
    rng = random.Random(params.data_width)
    cases = with_good_after_each_bad(params, directed_cases(params, rng), rng)
    stims = [s for s, _ in cases]
    expected = [r for _, r in cases]
    # the hand-derived reasons agree with the reference model
    for s, r in cases:
        assert model_verdict(params, s) == r, (s.label, r)
    assert {r for r in expected if r is not None} == set(proto.PARSER_DROPS)
    out = run_ingress(params, stims, seed=1)
    check_outcome(params, stims, out, expected)


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_every_drop_reason_idle_and_backpressure(params):
    rng = random.Random(params.data_width + 7)
    cases = with_good_after_each_bad(params, directed_cases(params, rng, huge=False), rng)
    stims = [s for s, _ in cases]
    out = run_ingress(params, stims, seed=2, idle=0.3, meta_stall=0.5, beat_stall=0.4)
    check_outcome(params, stims, out, [r for _, r in cases])


@pytest.mark.parametrize("params", PARAMS + [P256_300], ids=IDS + ["w256_max300"])
def test_oversize_longer_than_fifo_does_not_block(params):
    """With nobody reading, frames much longer than the FIFO are taken at full rate and dropped, and the
    room their first beats used is given back: good frames before, between and after them come out."""
    rng = random.Random(params.data_width + 11)
    B = params.beat_bytes
    huge = (params.ingress_depth + 5) * B + 3
    stims, expected = [], []

    def add(data, reason, label):
        stims.append(stim(data, B, label=label))
        expected.append(reason)

    add(cais_bytes(rng, params, plen=params.max_payload), None, "good 1")
    for k in range(2):                 # each alone longer than the FIFO
        add(ordinary_bytes(rng, huge + k * B), R.OVERSIZE, f"huge {k}")
        add(cais_bytes(rng, params, length=huge), R.OVERSIZE, f"huge CAIS {k}")
    add(ordinary_bytes(rng, params.max_frame), None, "good 2 (max_frame)")
    add(ordinary_bytes(rng, huge), R.OVERSIZE, "huge again")
    add(cais_bytes(rng, params), None, "good 3")
    hold = sum(len(s.beats) for s in stims) + 20
    out = run_ingress(params, stims, seed=3, hold_readers=hold)
    assert out.stalled_beats == 0, "the source was stalled"
    check_outcome(params, stims, out, expected)


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_backpressure_when_queues_full(params):
    """Readers held: the source is stalled (FIFO or meta queue full), nothing is lost, order is kept."""
    rng = random.Random(params.data_width + 13)
    B = params.beat_bytes
    stims = [stim(cais_bytes(rng, params, plen=4 * rng.randint(1, 20)), B, label=f"small {i}") for i in range(12)]
    stims += [stim(ordinary_bytes(rng, params.max_frame), B, label=f"long {i}") for i in range(3)]
    stims += [stim(cais_bytes(rng, params, op=3), B, label="bad")]
    stims += [stim(ordinary_bytes(rng, 60), B, label=f"tail {i}") for i in range(4)]
    out = run_ingress(params, stims, seed=4, hold_readers=300, meta_stall=0.2, beat_stall=0.2)
    assert out.stalled_beats > 0
    check_outcome(params, stims, out, [model_verdict(params, s) for s in stims])


# ----------------------------------------------------------------------------- random against the model
def random_frame(rng, params) -> Stim:
    B = params.beat_bytes
    P = params
    k = rng.random()
    if k < 0.25:                                             # good CAIS (padded or not)
        data = cais_bytes(rng, P, pad=rng.random() < 0.5)
        label = "cais"
    elif k < 0.60:                                           # CAIS with one or more mutations
        plen = rng.choice([4 * rng.randint(1, P.max_payload // 4), rng.randint(0, P.max_payload + 8),
                           rng.getrandbits(16), 0, P.max_payload, P.max_payload + 4])
        frame = bytearray(cais_bytes(rng, P, plen=min(plen, 4 * (P.max_payload // 4)), pad=rng.random() < 0.3))
        muts = sorted(rng.randrange(6) for _ in range(rng.choice([1, 1, 1, 2, 3])))   # length changes last
        for m in muts:
            if m == 0:
                frame[14] = rng.choice([0, 1, 2, 3, rng.getrandbits(8)])                     # op_type
            elif m == 1:
                frame[28] = (rng.choice([0, 0, rng.getrandbits(4)]) << 4) | rng.choice([0, 1, 2, rng.getrandbits(4)])
            elif m == 2:
                frame[29] = rng.choice([0, 1, 2, 3, 1 << rng.randrange(8), rng.getrandbits(8)])  # flags
            elif m == 3:
                frame[26:28] = plen.to_bytes(2, "big")                                      # payload_len
            elif m == 4:
                cut = rng.choice([rng.randint(0, len(frame)), len(frame) - rng.randint(1, 8),
                                  proto.MIN_FRAME_BYTES])
                frame = frame[:max(cut, 1)]
            else:
                frame += rng.randbytes(rng.choice([1, 2, 4, rng.randint(1, 3 * B)]))
        data = bytes(frame)
        label = f"cais mut {muts}"
    elif k < 0.94:                                           # ordinary, mostly short, sometimes 0x88B5
        length = rng.choice([rng.randint(1, 80)] * 4 + [rng.randint(14, 300)] * 4 + [rng.randint(1, P.max_frame)])
        data = ordinary_bytes(rng, length, 0x88B5 if rng.random() < 0.15 else None)
        label = "ordinary"
    else:                                                    # around max_frame
        length = rng.randint(P.max_frame - 2 * B, P.max_frame + 2 * B)
        data = cais_bytes(rng, P, length=length) if rng.random() < 0.5 else ordinary_bytes(rng, length)
        label = "long"
    fault = None
    if rng.random() < 0.12:
        options = ["gap_last", "empty_last"]
        if len(data) > B:
            options.append("partial_mid")
        fault = rng.choice(options)
        if not data:
            fault = None
    if not data:
        fault = None
        data = b"\x00"
    bad_fcs = rng.random() < 0.05
    return stim(data, B, fault, rng, label=f"{label}{' ' + fault if fault else ''}{' bad FCS' if bad_fcs else ''}",
                bad_fcs=bad_fcs)


@pytest.mark.parametrize("params,count", [(P64, 170), (P512, 300), (P128_406, 100), (P256_300, 100)],
                         ids=IDS + ["w128_max406", "w256_max300"])
def test_random_frames_against_model(params, count):
    rng = random.Random(12345 + params.data_width)
    stims = [random_frame(rng, params) for _ in range(count)]
    expected = [model_verdict(params, s) for s in stims]
    seen = {r for r in expected}
    assert seen >= set(proto.PARSER_DROPS) | {None}, f"random mix misses {set(proto.PARSER_DROPS) - seen}"
    out = run_ingress(params, stims, seed=5, idle=0.15, meta_stall=0.25, beat_stall=0.15)
    check_outcome(params, stims, out, expected)


# ----------------------------------------------------------------------------- timing of the verdict
@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_drop_and_busy_timing_of_one_bad_frame(params):
    """One frame dropped for BAD_LENGTH, alone: ``drop`` pulses DROP_DELAY (4) cycles after its last beat,
    BAD_LENGTH's bit of ``drop_counted`` (and no other) a cycle later, ``busy`` is 1 from the cycle after
    its first beat through the cycle after that and 0 from the 7th cycle after its last beat on (the bank
    registers the increment, then adds it: docs/interface.md, BUSY falls when the drop is in its counter);
    tready stays high (an idle port with room)."""
    rng = random.Random(21)
    B = params.beat_bytes
    s = stim(cais_bytes(rng, params, plen=64, length=64 + 30 + 1), B, label="one byte too long")
    assert model_verdict(params, s) == R.BAD_LENGTH
    words = s.words(rng, B)
    dut = IngressPort(params)
    start = 3
    trace = []

    async def tb(ctx):
        sa = dut.s_axis
        for cycle in range(start + len(words) + 30):
            k = cycle - start
            on = 0 <= k < len(words)
            if on:
                tdata, tkeep, tlast, tuser = words[k]
                ctx.set(sa.tdata, tdata)
                ctx.set(sa.tkeep, tkeep)
                ctx.set(sa.tlast, tlast)
                ctx.set(sa.tuser, tuser)
            ctx.set(sa.tvalid, on)
            _, _, tready, busy, drop, reason, counted = await ctx.tick().sample(
                sa.tready, dut.busy, dut.drop, dut.drop_reason, dut.drop_counted)
            assert tready, f"cycle {cycle}: tready low on an idle port"
            trace.append((busy, drop, reason, counted))

    run(dut, tb)
    first, last = start, start + len(words) - 1
    busy = [b for b, _, _, _ in trace]
    drops = [c for c, (_, d, _, _) in enumerate(trace) if d]
    counted = [(c, k) for c, (_, _, _, k) in enumerate(trace) if k]
    assert IngressPort.DROP_DELAY == 4 and IngressPort.COUNT_DELAY == 5
    assert drops == [last + 4] and trace[drops[0]][2] == R.BAD_LENGTH
    assert counted == [(last + 5, 1 << list(proto.PARSER_DROPS).index(R.BAD_LENGTH))], counted
    assert busy[:first + 1] == [0] * (first + 1), busy
    assert all(busy[first + 1:last + 7]), busy
    assert not any(busy[last + 7:]), busy


# ----------------------------------------------------------------------------- the header queue alone
@pytest.mark.pnr
def test_header_queue_head_is_a_register_behind_the_lut_ram(tmp_path):
    """Under an ECP5 synthesis every r_data bit comes from a flip-flop whose input is a LUT RAM's data out
    (depth 16: one DPR16X4 per 4 bits, no read mux), so the read and the header's consumer are in
    different cycles. yosys' own read register would sit on the address side instead (r_data straight
    from the LUT RAM)."""
    width = 12
    module = synth_json(HeaderQueue(width, 16), tmp_path, "hq")
    cells = module["cells"].values()
    ff_of = {c["connections"]["Q"][0]: c for c in cells if c["type"] == "TRELLIS_FF"}
    ram_out = {bit for c in cells if c["type"] == "TRELLIS_DPR16X4" for bit in c["connections"]["DO"]}
    assert ram_out, "no LUT RAM in the netlist"
    r_data = module["ports"]["r_data"]["bits"]
    assert len(r_data) == width
    for i, bit in enumerate(r_data):
        assert bit in ff_of, f"r_data[{i}] is not a flip-flop's output"
        assert ff_of[bit]["connections"]["DI"][0] in ram_out, f"r_data[{i}]'s flip-flop is not fed by the LUT RAM"


@pytest.mark.parametrize("seed", [1, 2])
def test_header_queue_keeps_only_committed_entries(seed):
    """HeaderQueue against a model of its docstring: every write fills the tail slot, only a committed one
    is kept (the next write replaces one that is not), an entry committed in cycle t is at the head from
    t + 2 when the queue is empty, the head register takes the next entry in the cycle it is read, and
    the caller never writes with ``depth`` entries queued."""
    depth, width = 8, 12
    dut = HeaderQueue(width, depth)
    rng = random.Random(seed)
    seen = []

    async def tb(ctx):
        ram, out = [], None            # the model: kept entries not yet at the head, and the head
        for cycle in range(3000):
            queued = len(ram) + (out is not None)
            w_en = queued <= depth - 1 and rng.random() < 0.6
            commit, value, r_en = rng.random() < 0.7, rng.randrange(1 << width), rng.random() < 0.5
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.commit, commit)
            ctx.set(dut.w_data, value)
            ctx.set(dut.r_en, r_en)
            assert ctx.get(dut.r_valid) == (out is not None), cycle
            if out is not None:
                assert ctx.get(dut.r_data) == out, cycle
                if r_en:
                    seen.append(out)
            # next cycle: the head takes the oldest kept entry (not this cycle's write) when free or read
            if ram and (out is None or r_en):
                out = ram.pop(0)
            elif r_en:
                out = None
            if w_en and commit:
                ram.append(value)
            await ctx.tick()

    run(dut, tb)
    assert len(seen) > 500
