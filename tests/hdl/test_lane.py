"""IngressLane under amaranth.sim: each decided frame streamed once, in order, at one beat per cycle.

The stimulus is random frames with random decisions (forward, aggregate with or without writing the
payload, drop); the expectations are derived here from the frame bytes, not from the block: a forwarded
frame leaves whole with the tkeep of its length; an aggregated frame's payload (frame bytes 30 ..
30 + payload_len - 1, cut into rows of B bytes, the last one padded with what follows in the frame) is
written to rows row_base .. row_base + rows - 1 of the bank; every frame is counted once by ``finished``;
and a lane with decisions and whole frames waiting takes one beat in every cycle.
"""

import random

import pytest

from cais import protocol as proto
from cais.hdl.common.enums import Action
from cais.hdl.alu.lane import IngressLane
from cais.params import SwitchParams

from blocksim import from_word, run, to_word


def make_frames(rng, params, count):
    B = params.beat_bytes
    out = []
    for k in range(count):
        action = rng.choice([Action.FORWARD, Action.AGGREGATE, Action.AGGREGATE, Action.DROP])
        plen = rng.choice([4, params.max_payload, 4 * rng.randint(1, params.max_payload // 4)])
        length = (max(proto.HEADERS_BYTES + plen, 60) if action == Action.AGGREGATE
                  else rng.choice([60, rng.randint(60, 300)]))
        frame = bytes(rng.getrandbits(8) for _ in range(length))
        rows = -(-plen // B)
        decision = {"action": action, "mask": rng.randrange(1, 1 << params.ports), "write": rng.random() < 0.8,
                    "row_base": k * params.rows_per_set,                 # a set of its own
                    "rows": rows, "beats": -(-length // B), "length": length}
        out.append((frame, decision, plen))
    return out


def stream(params, frames, *, refuse=0.0, seed=0):
    """Run the lane on ``frames``; check what it sends and writes; return the gaps (cycles without a beat
    while all decisions were in), each as the index of the frame that came next."""
    B = params.beat_bytes
    rng = random.Random(seed)
    dut = IngressLane(params)
    got_fwd, got_rows, finished, gaps = [], {}, [0], []
    fwd_decisions = [d for _, d, _ in frames if d["action"] == Action.FORWARD]

    beats = [(to_word(f[i:i + B]), k) for k, (f, _, _) in enumerate(frames) for i in range(0, len(f), B)]

    async def tb(ctx):
        pending = list(range(len(frames)))        # decisions not yet pushed
        beat_i, current = 0, []
        grant = 0                                 # the crossbar's grant register, modelled here
        granted, start_at = 0, None               # forwarded frames granted; the cycle the next one starts
        for cycle in range(len(beats) + 8 * len(frames) + 50):
            # one decision per cycle while the lane has credit (as the decision pipeline gives them)
            push = bool(pending) and ctx.get(dut.credit)
            ctx.set(dut.taken, push)
            ctx.set(dut.decisions.valid, push)
            if push:
                ctx.set(dut.decisions.payload, frames[pending.pop(0)][1])
            ctx.set(dut.beats.valid, beat_i < len(beats))
            ctx.set(dut.beats.payload, beats[beat_i][0] if beat_i < len(beats) else 0)
            ctx.set(dut.fwd.grant, grant)
            await ctx.delay(1e-9)
            req = ctx.get(dut.fwd.req)
            if req and not grant:
                d = fwd_decisions[granted]
                assert (ctx.get(dut.fwd.mask), ctx.get(dut.fwd.beats)) == (d["mask"], d["beats"]), \
                    f"request of another frame than forwarded frame {granted}"
            if grant:
                assert req, "the request fell before its grant was shown"
                granted += 1
                start_at = cycle + 1
            if ctx.get(dut.beats.ready) and beat_i < len(beats):
                beat_i += 1
            elif beat_i < len(beats) and not pending and cycle > 10:
                gaps.append(beats[beat_i][1])     # a cycle without a beat while all decisions were in
            if ctx.get(dut.fwd.valid):
                if not current:
                    assert cycle == start_at, f"cycle {cycle}: a forwarded frame not started by its grant"
                current.append((ctx.get(dut.fwd.data), ctx.get(dut.fwd.keep)))
                if ctx.get(dut.fwd.last):
                    got_fwd.append(b"".join(from_word(d, B)[:bin(k).count("1")] for d, k in current))
                    current = []
            if ctx.get(dut.bank_en):
                addr = ctx.get(dut.bank_addr)
                assert addr not in got_rows, f"row {addr} written twice"
                got_rows[addr] = from_word(ctx.get(dut.bank_data), B)
            finished[0] += ctx.get(dut.finished)
            # the grant register: a request shown now is granted in the next cycle (unless refused)
            grant = int(bool(req) and not grant and rng.random() >= refuse)
            await ctx.tick()

    run(dut, tb)
    want_fwd = [f for f, d, _ in frames if d["action"] == Action.FORWARD]
    assert got_fwd == want_fwd
    want_rows = {}
    for f, d, plen in frames:
        if d["action"] == Action.AGGREGATE and d["write"]:
            padded = f[proto.HEADERS_BYTES:] + bytes(d["rows"] * B)
            for j in range(d["rows"]):
                row = padded[j * B:(j + 1) * B]
                # bytes past the frame's end are don't-care: compare what the frame holds
                want_rows[d["row_base"] + j] = row[:max(0, len(f) - proto.HEADERS_BYTES - j * B)]
    for addr, want in want_rows.items():
        assert got_rows[addr][:len(want)] == want, f"row {addr}"
    assert finished[0] == len(frames)
    return gaps


@pytest.mark.parametrize("width", [64, 128, 512])
def test_frames_streamed_once_in_order(width):
    """The egress grants every request at once: frames follow each other without a cycle between them,
    except one before a forwarded frame behind a one-beat frame (its request cannot come two cycles
    ahead of the one-beat frame's end)."""
    params = SwitchParams(data_width=width, slots=64)
    frames = make_frames(random.Random(width), params, 60)
    gaps = stream(params, frames)
    allowed = [k for k in range(1, len(frames))
               if frames[k][1]["action"] == Action.FORWARD and frames[k - 1][1]["beats"] == 1]
    assert all(k in allowed for k in gaps) and len(set(gaps)) == len(gaps), \
        f"cycles without a beat before frames {gaps} (allowed: one before each of {allowed})"
    if width == 512:
        assert allowed, "the stimulus has a one-beat frame before a forwarded one"


@pytest.mark.parametrize("width", [64, 512])
def test_grants_refused_at_random(width):
    """The egress refuses grants at random: every frame still goes out whole, once, in order."""
    params = SwitchParams(data_width=width, slots=64)
    stream(params, make_frames(random.Random(10 + width), params, 40), refuse=0.6, seed=width)
