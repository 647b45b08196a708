"""ResultGenerator against ``cais.protocol.build_frame``: the result frame of docs/protocol.md section 7.4.

The fold reader is modelled here as a queue of random payload rows, ``ceil(payload_len / B)`` per job, in
job order, released one at a time with random gaps (``rows_held`` counts the released rows); the egress as a
grant given to a request with random refusals. A frame's payload is its job's rows, byte 0 of a row in bits
7:0, its first payload_len bytes. The expected frame is built by the protocol module, never by the block:
``build_frame(hdr.replace(flags=RESULT), payload, dst=result_mac(group_id), src=switch_mac)``.
The output is checked as AXI4-Stream: tkeep all ones except on the last beat (contiguous from byte 0),
no gap inside a frame (a frame asks for the egress only once all its rows are in), the request's mask
and beat count those of its job.
"""

import random

import pytest

from cais import protocol as proto
from cais.hdl.egress.results import ResultGenerator
from cais.params import SwitchParams

from blocksim import from_word, run, to_word

WIDTHS = (64, 128, 256, 512)


def random_header(rng, plen):
    return proto.CaisHeader(
        op_type=rng.getrandbits(8), group_id=rng.getrandbits(8), layer_id=rng.getrandbits(16),
        chunk_id=rng.getrandbits(16), total_chunks=rng.getrandbits(16), seq_num=rng.getrandbits(32),
        payload_len=plen, dtype=rng.getrandbits(4), red_op=rng.getrandbits(4),
        flags=rng.choice([0, int(proto.Flags.RETRANSMIT), int(proto.Flags.RESULT), rng.getrandbits(8)]))


def run_results(params, jobs, *, seed, switch_mac, refuse=0.3, job_gap=0.3, row_gap=0.3):
    """Send ``jobs`` [(CaisHeader, mask)] through the block; check every frame; return stats."""
    rng = random.Random(seed)
    W, B = params.data_width, params.beat_bytes
    rows = [[rng.getrandbits(W) for _ in range(-(-hdr.payload_len // B))] for hdr, _ in jobs]

    def expected(k):
        hdr, _ = jobs[k]
        payload = b"".join(from_word(r, B) for r in rows[k])[:hdr.payload_len]
        return proto.build_frame(hdr.replace(flags=int(proto.Flags.RESULT)), payload,
                                 dst=proto.result_mac(hdr.group_id), src=switch_mac)

    want = [expected(k) for k in range(len(jobs))]
    pending = [r for job_rows in rows for r in job_rows]      # rows not yet released, in order
    stats = {"frames": 0, "refusals": 0, "cycles": 0}

    async def tb(ctx):
        ctx.set(dut.switch_mac, switch_mac)
        released = []
        next_job, offering = 0, False
        taken = granted = rows_taken = 0                       # jobs taken by the block; granted; rows
        frame_no, beats, streaming = 0, [], False
        grant, start_at = 0, None                              # the egress's grant register, modelled here
        budget = 60 * len(jobs) + 4 * sum(len(f) // B + 3 for f in want) + 200
        for cycle in range(budget):
            if next_job < len(jobs) and (offering or rng.random() >= job_gap):
                hdr, mask = jobs[next_job]
                length = proto.HEADERS_BYTES + hdr.payload_len
                ctx.set(dut.jobs.payload, {"cais": to_word(hdr.pack()), "mask": mask, "rows": len(rows[next_job]),
                                           "beats": -(-length // B), "keep": (1 << (length % B or B)) - 1})
                ctx.set(dut.jobs.valid, 1)
                offering = True
            else:
                ctx.set(dut.jobs.payload, {"cais": rng.getrandbits(128), "mask": rng.getrandbits(params.ports),
                                  "rows": rng.randrange(params.rows_per_set + 1),
                                  "beats": rng.randrange(params.max_frame_beats + 1), "keep": rng.getrandbits(B)})
                ctx.set(dut.jobs.valid, 0)
            if row_gap == 0:                                   # every row is there from the start
                released += pending
                pending.clear()
            elif pending and rng.random() >= row_gap:
                released.append(pending.pop(0))
            ctx.set(dut.rows_held, len(released))
            ctx.set(dut.rows.payload, released[0] if released else rng.getrandbits(W))
            ctx.set(dut.out.grant, grant)
            out = dut.out
            (_, _, job_valid, job_ready, row_ready, req, o_mask, o_beats, o_valid, o_data, o_keep, o_last
             ) = await ctx.tick().sample(dut.jobs.valid, dut.jobs.ready, dut.rows.ready, out.req, out.mask,
                                         out.beats, out.valid, out.data, out.keep, out.last)
            stats["cycles"] += 1
            if row_ready:
                assert released, "a row taken that was not offered"
                released.pop(0)
                rows_taken += 1
            if grant:
                assert req, "the request fell before its grant was shown"
                start_at = cycle + 1
                granted += 1
            elif req:
                # the request is the oldest job taken and not yet granted
                assert granted < taken, "a request with no job"
                k = granted
                assert o_mask == jobs[k][1] and o_beats == -(-len(want[k]) // B), "request of another frame"
                owed = sum(len(r) for r in rows[:k + 1]) - rows_taken
                assert len(released) >= owed, f"frame {k} asks with {len(released)} of its {owed} rows waiting"
                stats["refusals"] += 1
            if job_valid and job_ready:
                taken += 1
                next_job += 1
                offering = False
            # the grant register: a request shown now is granted in the next cycle (unless refused)
            grant = int(bool(req) and not grant and rng.random() >= refuse)
            stats["refusals"] -= grant
            if streaming and not o_valid:
                raise AssertionError(f"frame {frame_no}: a gap after beat {len(beats)}")
            if not o_valid:
                continue
            if not streaming:
                assert cycle == start_at, f"cycle {cycle}: frame {frame_no} not started by its grant"
            streaming = True
            assert frame_no < len(jobs), "a frame with no job"
            beats.append((o_data, o_keep, o_last))
            if o_last:
                frame = want[frame_no]
                nbeats = -(-len(frame) // B)
                hdr = jobs[frame_no][0]
                assert len(beats) == nbeats, f"frame {frame_no} (payload_len {hdr.payload_len}): " \
                                             f"{len(beats)} beats, want {nbeats}"
                tail = len(frame) - (nbeats - 1) * B
                got = b""
                for i, (data, keep, _) in enumerate(beats):
                    want_keep = (1 << B) - 1 if i < nbeats - 1 else (1 << tail) - 1
                    assert keep == want_keep, f"frame {frame_no} beat {i}: tkeep {keep:#x} != {want_keep:#x}"
                    got += from_word(data, B)[:bin(keep).count("1")]
                assert got == frame, (f"frame {frame_no} (payload_len {hdr.payload_len}, width {W}):\n"
                                      f" got  {got.hex()}\n want {frame.hex()}")
                frame_no += 1
                stats["frames"] += 1
                beats, streaming = [], False
            else:
                assert len(beats) < -(-len(want[frame_no]) // B), f"frame {frame_no}: tlast missing"
            if frame_no == len(jobs):
                break
        assert frame_no == len(jobs), f"only {frame_no} of {len(jobs)} frames came out in {budget} cycles"
        assert not released and not pending, "rows left over"
        # nothing more comes out
        ctx.set(dut.jobs.valid, 0)
        ctx.set(dut.rows_held, 0)
        for _ in range(5):
            _, _, o_valid, req = await ctx.tick().sample(dut.out.valid, dut.out.req)
            assert not o_valid and not req, "an extra beat or request after the last frame"

    dut = ResultGenerator(params)
    run(dut, tb)
    return stats


def jobs_for(params, plens, rng):
    return [(random_header(rng, plen), rng.getrandbits(params.ports) or 1) for plen in plens]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_payload_len(width):
    """payload_len 4..max_payload in steps of 4 (the lengths a worker may send), random back-pressure."""
    params = SwitchParams(data_width=width)
    rng = random.Random(width)
    plens = list(range(4, params.max_payload + 1, 4))
    rng.shuffle(plens)
    # both kinds of lengths occur: payloads that are and are not whole beats
    assert any(p % params.beat_bytes == 0 for p in plens) and any(p % params.beat_bytes for p in plens)
    stats = run_results(params, jobs_for(params, plens, rng), seed=width + 1,
                        switch_mac=rng.getrandbits(48))
    assert stats["frames"] == len(plens) and stats["refusals"] > 10


@pytest.mark.parametrize("width", WIDTHS)
def test_frame_ends_on_beat_boundary(width):
    """30 + payload_len a multiple of the beat (full last beat). These lengths are not multiples of 4, so
    the ingress never lets them through; the block is still asked to frame them right. Also 1..3 bytes."""
    params = SwitchParams(data_width=width)
    B = params.beat_bytes
    rng = random.Random(100 + width)
    plens = [k * B - proto.HEADERS_BYTES for k in range(1, 64) if 0 < k * B - proto.HEADERS_BYTES <= params.max_payload]
    plens += [1, 2, 3, params.max_payload - 1, params.max_payload - 2]
    for p in plens[:len(plens) - 5]:
        assert (proto.HEADERS_BYTES + p) % B == 0
    stats = run_results(params, jobs_for(params, plens, rng), seed=width + 2, switch_mac=rng.getrandbits(48))
    assert stats["frames"] == len(plens)


@pytest.mark.parametrize("width", WIDTHS)
def test_back_to_back_no_backpressure(width):
    """Jobs and rows always there, the egress granting every request in the next cycle: the first job is
    taken in cycle 0, asks in cycle 1, is granted in cycle 2 and its first beat leaves in cycle 3; then one
    beat per cycle, the next frame granted during the previous one, except one cycle behind a one-beat
    frame; the default switch MAC."""
    params = SwitchParams(data_width=width)
    rng = random.Random(200 + width)
    plens = [4, params.max_payload, 28, 32, 36, 60, 64, 100] + [4 * rng.randint(1, params.max_payload // 4)
                                                                for _ in range(8)]
    jobs = jobs_for(params, plens, rng)
    stats = run_results(params, jobs, seed=width + 3, switch_mac=proto.SWITCH_MAC_DEFAULT, refuse=0.0,
                        job_gap=0.0, row_gap=0.0)
    B = params.beat_bytes
    beats = [-(-(proto.HEADERS_BYTES + p) // B) for p in plens]
    bubbles = sum(b == 1 for b in beats[:-1])
    assert stats["cycles"] == 3 + sum(beats) + bubbles, (stats["cycles"], beats)
    if width == 512:
        assert bubbles, "the stimulus has one-beat frames"


@pytest.mark.parametrize("width", [64, 512])
def test_random_jobs_heavy_backpressure(width):
    params = SwitchParams(data_width=width)
    rng = random.Random(300 + width)
    plens = [4 * rng.randint(1, params.max_payload // 4) for _ in range(40)]
    stats = run_results(params, jobs_for(params, plens, rng), seed=width + 4, switch_mac=rng.getrandbits(48),
                        refuse=0.7, job_gap=0.6, row_gap=0.6)
    assert stats["frames"] == 40


def test_larger_max_payload():
    """max_payload 512 (rows_per_set 8 at 512 bits, 64 at 64 bits)."""
    for width in (64, 512):
        params = SwitchParams(data_width=width, max_payload=512)
        rng = random.Random(400 + width)
        plens = [4, 256, 260, 508, 512] + [4 * rng.randint(1, 128) for _ in range(5)]
        run_results(params, jobs_for(params, plens, rng), seed=width + 5, switch_mac=rng.getrandbits(48))
