"""The board's 1 Gb/s MAC (cais.hdl.board.mac) under amaranth.sim, against zlib.crc32 and hand-built
GMII byte sequences: preamble/SFD, FCS, padding, the gap on transmit; FCS errors, runts, RX_ER, a frame cut
short, no SFD and back-to-back frames on receive."""

import random
import zlib

from amaranth.hdl import Module

from cais.hdl.board.mac import MacRx, MacTx

from blocksim import run

PRE = bytes([0x55] * 7 + [0xD5])


def zfcs(frame: bytes) -> bytes:
    return zlib.crc32(frame).to_bytes(4, "little")


def rx_run(cycles):
    """Drive MacRx with (en, er, data) per cycle; return the frames it sends [(bytes, bad)] and its events."""
    dut = MacRx()
    frames, events = [], {"frame": 0, "bad_fcs": 0, "runt": 0, "error": 0}
    cur = bytearray()

    async def tb(ctx):
        for en, er, byte in list(cycles) + [(0, 0, 0)] * 4:
            ctx.set(dut.gmii.en, en)
            ctx.set(dut.gmii.er, er)
            ctx.set(dut.gmii.data, byte)
            await ctx.tick()
            if ctx.get(dut.o.valid):
                cur.append(ctx.get(dut.o.data))
                if ctx.get(dut.o.last):
                    frames.append((bytes(cur), bool(ctx.get(dut.o.bad))))
                    cur.clear()
            for name in events:
                events[name] += ctx.get(getattr(dut, f"ev_{name}"))

    run(dut, tb)
    assert not cur, "bytes sent without a last byte"
    return frames, events


def wire(frame_with_fcs: bytes, gap: int = 12, er_at: int | None = None):
    out = [(1, 0, b) for b in PRE + frame_with_fcs]
    if er_at is not None:
        out[len(PRE) + er_at] = (1, 1, out[len(PRE) + er_at][2])
    return out + [(0, 0, 0)] * gap


def test_rx_good_bad_runt_cut_back_to_back():
    rng = random.Random(1)
    good = [bytes(rng.randrange(256) for _ in range(n)) for n in (60, 61, 100, 1514)]
    bad = bytearray(good[2] + zfcs(good[2]))
    bad[17] ^= 0x04
    runt = bytes(range(59))           # 63 bytes with its FCS: one short of the minimum, FCS correct
    cut = good[2] + zfcs(good[2])
    cycles = []
    for f in good:                    # back to back at the minimum gap
        cycles += wire(f + zfcs(f))
    cycles += wire(bytes(bad))
    cycles += wire(runt + zfcs(runt))
    cycles += wire(cut[:50])          # RX_DV falls early
    cycles += wire(good[0] + zfcs(good[0]), er_at=20)
    cycles += [(1, 0, 0x55), (1, 0, 0x12)] + [(1, 0, 0xAA)] * 70 + [(0, 0, 0)] * 12   # no SFD: ignored
    cycles += wire(b"\x01\x02\x03")   # a fragment: nothing leaves
    cycles += wire(good[1] + zfcs(good[1]), gap=1)
    frames, ev = rx_run(cycles)
    expect = [(f, False) for f in good] + [(bytes(bad[:-4]), True), (runt, True), (cut[:46], True),
                                           (good[0], True), (good[1], False)]
    assert frames == expect
    # runts: the 63-byte frame, the cut one (50 bytes) and the 3-byte fragment; FCS errors: bad and cut
    assert ev == {"frame": 9, "bad_fcs": 2, "runt": 3, "error": 1}


def tx_run(frames, hold_off=()):
    """Feed MacTx the frames (one byte per cycle when asked; a byte index in hold_off is withheld once, an
    underrun); return the GMII cycles (en, er, data) it sent and its events."""
    dut = MacTx()
    out, events = [], {"frame": 0, "underrun": 0}
    todo = [(fi, k, b, k == len(f) - 1) for fi, f in enumerate(frames) for k, b in enumerate(f)]
    held = set()

    async def tb(ctx):
        idle = 0
        while todo or idle < 20:
            if todo:
                fi, k, b, last = todo[0]
                withhold = (fi, k) in hold_off and (fi, k) not in held
                ctx.set(dut.i.valid, not withhold)
                ctx.set(dut.i.data, b)
                ctx.set(dut.i.last, last)
            else:
                ctx.set(dut.i.valid, 0)
            ready = ctx.get(dut.i.ready)
            await ctx.tick()
            if todo and ready:
                if withhold:
                    held.add((fi, k))
                else:
                    todo.pop(0)
            out.append((ctx.get(dut.gmii.en), ctx.get(dut.gmii.er), ctx.get(dut.gmii.data)))
            for name in events:
                events[name] += ctx.get(getattr(dut, f"ev_{name}"))
            idle = idle + 1 if not todo else 0

    run(dut, tb)
    return out, events


def bursts(cycles):
    """The wire split into (bytes sent with en, er seen, idle cycles before the burst)."""
    result, cur, er, gap = [], bytearray(), False, 0
    for en, e, d in cycles:
        if en:
            cur.append(d)
            er |= bool(e)
        elif cur:
            result.append((bytes(cur), er, gap))
            cur, er, gap = bytearray(), False, 1
        else:
            gap += 1
    assert not cur
    return result


def test_tx_preamble_pad_fcs_gap():
    rng = random.Random(2)
    frames = [bytes(rng.randrange(256) for _ in range(n)) for n in (14, 60, 61, 200)]
    out, ev = tx_run(frames)
    sent = bursts(out)
    assert len(sent) == 4 and ev == {"frame": 4, "underrun": 0}
    for (data, er, gap), f in zip(sent, frames):
        padded = f + bytes(max(0, 60 - len(f)))
        assert data == PRE + padded + zfcs(padded)
        assert not er
    assert all(gap == 12 for _, _, gap in sent[1:]), [g for _, _, g in sent]


def test_tx_underrun_sends_error_and_drops_the_rest():
    frames = [bytes(range(100)), bytes(range(70))]
    out, ev = tx_run(frames, hold_off={(0, 30)})
    sent = bursts(out)
    assert ev == {"frame": 1, "underrun": 1}
    assert sent[0][1] and sent[0][0] == PRE + bytes(range(30)) + b"\x00"   # TX_ER on the missing byte
    assert sent[1][0] == PRE + frames[1] + zfcs(frames[1]) and not sent[1][1]


def test_tx_into_rx_loop():
    """What MacTx sends, MacRx takes back (one domain, the wires joined)."""
    from amaranth.lib import wiring

    class Loop(wiring.Component):
        def __init__(self):
            super().__init__({})
            self.tx, self.rx = MacTx(), MacRx()

        def elaborate(self, platform):
            m = Module()
            m.submodules.tx, m.submodules.rx = self.tx, self.rx
            wiring.connect(m, self.tx.gmii, self.rx.gmii)
            return m

    dut = Loop()
    frames = [bytes(range(n)) for n in (20, 64, 90)]
    got, cur = [], bytearray()

    async def tick_and_take(ctx):
        await ctx.tick()
        if ctx.get(dut.rx.o.valid):
            cur.append(ctx.get(dut.rx.o.data))
            if ctx.get(dut.rx.o.last):
                got.append((bytes(cur), ctx.get(dut.rx.o.bad)))
                cur.clear()

    async def tb(ctx):
        for f in frames:
            for k, b in enumerate(f):
                ctx.set(dut.tx.i.valid, 1)
                ctx.set(dut.tx.i.data, b)
                ctx.set(dut.tx.i.last, k == len(f) - 1)
                while True:
                    ready = ctx.get(dut.tx.i.ready)
                    await tick_and_take(ctx)
                    if ready:
                        break
        ctx.set(dut.tx.i.valid, 0)
        for _ in range(40):
            await tick_and_take(ctx)

    run(dut, tb)
    assert got == [(f + bytes(max(0, 60 - len(f))), 0) for f in frames]
