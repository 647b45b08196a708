"""The board's clock-domain crossings (cais.hdl.board.cdc) under amaranth.sim with two clocks: bytes packed
into 64-bit beats (tkeep, tlast, tuser) against a Python packing of the same frames; a full FIFO cuts a
frame with a terminating tuser beat and drops the next whole, and frames after it pass intact; beats
unpacked into bytes in order."""

import random

from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from cais.hdl.board.cdc import AxisToTx, RxToAxis

B = 8


def beats_of(frame: bytes, bad: bool):
    """(data, keep, last, user) beats of a frame: byte 0 in bits 7:0, the last beat's tkeep contiguous."""
    out = []
    for k in range(0, len(frame), B):
        chunk = frame[k:k + B]
        last = k + B >= len(frame)
        out.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, last, bad and last))
    return out


def _sim(dut):
    m = Module()
    m.submodules.dut = dut
    m.domains.rx = ClockDomain("rx")
    sim = Simulator(m)
    sim.add_clock(16e-9, domain="sync")
    sim.add_clock(8e-9, domain="rx")
    return sim


def run_rx(frames, *, depth=64, ready_from=0, cycles=None):
    """frames: [(bytes, bad, idle bytes after)]; the sink's tready is low until sync cycle ready_from."""
    dut = RxToAxis(64, depth, rx_domain="rx")
    sim = _sim(dut)
    got, overflow = [], [0]
    total = sum(len(f) + gap for f, _, gap in frames)

    async def source(ctx):
        for frame, bad, gap in frames:
            for k, byte in enumerate(frame):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.data, byte)
                ctx.set(dut.i.last, k == len(frame) - 1)
                ctx.set(dut.i.bad, bad and k == len(frame) - 1)
                await ctx.tick("rx")
                overflow[0] += ctx.get(dut.ev_overflow)
            ctx.set(dut.i.valid, 0)
            for _ in range(gap):
                await ctx.tick("rx")
                overflow[0] += ctx.get(dut.ev_overflow)

    async def sink(ctx):
        for cycle in range(cycles or total + 200):
            ready = cycle >= ready_from
            ctx.set(dut.o.tready, ready)
            valid = ctx.get(dut.o.tvalid)
            beat = (ctx.get(dut.o.tdata), ctx.get(dut.o.tkeep), bool(ctx.get(dut.o.tlast)), bool(ctx.get(dut.o.tuser)))
            await ctx.tick("sync")
            if valid and ready:
                got.append(beat)

    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    return got, overflow[0]


def test_rx_packing_matches_the_reference():
    rng = random.Random(3)
    frames = [(bytes(rng.randrange(256) for _ in range(n)), bad, rng.randrange(0, 20))
              for n, bad in ((60, False), (64, True), (65, False), (71, False), (1, True), (200, False))]
    got, overflow = run_rx(frames)
    want = [b for f, bad, _ in frames for b in beats_of(f, bad)]
    assert got == want and overflow == 0


def test_rx_overflow_cuts_and_drops_then_recovers():
    frames = [(bytes([1]) * 64, False, 12), (bytes([2]) * 64, False, 12), (bytes([3]) * 64, False, 12),
              (bytes([4]) * 64, False, 400), (bytes([5]) * 100, False, 12), (bytes([6]) * 60, False, 12)]
    # 4 beats of room; the sink is stalled while the first frames arrive (64 bytes: 8 beats each)
    got, overflow = run_rx(frames, depth=4, ready_from=90)
    frames_seen, cur = [], []
    for beat in got:
        cur.append(beat)
        if beat[2]:
            frames_seen.append(cur)
            cur = []
    good = [b"".join(d.to_bytes(8, "little")[:bin(k).count("1")] for d, k, _, _ in f) for f in frames_seen if not f[-1][3]]
    cut = [f for f in frames_seen if f[-1][3]]
    # the first frame is cut (its first 4 beats fit), frames 2 and 3 are lost whole, frames 4 to 6 pass
    assert len(cut) == 1 and cut[0][:4] == beats_of(frames[0][0], False)[:4]
    assert cut[0][-1] == (0, 1, True, True)
    assert good == [frames[3][0], frames[4][0], frames[5][0]]
    assert overflow == 3


def test_tx_unpacking():
    rng = random.Random(4)
    frames = [bytes(rng.randrange(256) for _ in range(n)) for n in (60, 64, 9, 123)]
    dut = AxisToTx(64, 16, tx_domain="rx")
    sim = _sim(dut)
    got, cur = [], bytearray()

    async def source(ctx):
        for f in frames:
            for data, keep, last, _ in beats_of(f, False):
                ctx.set(dut.i.tvalid, 1)
                ctx.set(dut.i.tdata, data)
                ctx.set(dut.i.tkeep, keep)
                ctx.set(dut.i.tlast, last)
                while True:
                    ready = ctx.get(dut.i.tready)
                    await ctx.tick("sync")
                    if ready:
                        break
        ctx.set(dut.i.tvalid, 0)

    async def sink(ctx):
        ctx.set(dut.o.ready, 1)
        for cycle in range(sum(len(f) for f in frames) * 2 + 100):
            if ctx.get(dut.o.valid):
                cur.append(ctx.get(dut.o.data))
                if ctx.get(dut.o.last):
                    got.append(bytes(cur))
                    cur.clear()
            await ctx.tick("rx")

    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    assert got == frames
