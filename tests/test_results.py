"""ResultGenerator against ``cais.protocol.build_frame``: the result frame of docs/protocol.md section 7.4.

The slot memory is modelled here as a list of random rows behind ``rd_addr/rd_en/rd_data`` with one cycle of
latency: ``rd_data`` changes only after a clock edge at which ``rd_en`` was high. The set's payload is the
bytes of rows ``row_base, row_base + 1, ...`` (byte 0 of a row in bits 7:0), its first payload_len bytes go
in the frame. The expected frame is built by the protocol module, never by the block:
``build_frame(hdr.replace(flags=RESULT), payload, dst=result_mac(group_id), src=switch_mac)``.
The output is checked as AXI4-Stream: tkeep all ones except on the last beat (contiguous from byte 0),
data held steady while stalled, o_mask equal to the job's mask on every beat.
"""

import random

import pytest

from cais import protocol as proto
from cais.hdl.results import ResultGenerator
from cais.params import SwitchParams

from blocksim import from_word, run, to_word

ADDR_BITS = 10
WIDTHS = (64, 128, 256, 512)


def random_header(rng, plen):
    return proto.CaisHeader(
        op_type=rng.getrandbits(8), group_id=rng.getrandbits(8), layer_id=rng.getrandbits(16),
        chunk_id=rng.getrandbits(16), total_chunks=rng.getrandbits(16), seq_num=rng.getrandbits(32),
        payload_len=plen, dtype=rng.getrandbits(4), red_op=rng.getrandbits(4),
        flags=rng.choice([0, int(proto.Flags.RETRANSMIT), int(proto.Flags.RESULT), rng.getrandbits(8)]))


def run_results(params, jobs, *, seed, switch_mac, backpressure=0.3, job_gap=0.3, expect_no_bubble=False):
    """Send ``jobs`` [(CaisHeader, mask, row_base)] through the block; check every frame; return stats."""
    rng = random.Random(seed)
    W, B = params.data_width, params.beat_bytes
    dut = ResultGenerator(params, ADDR_BITS)
    mem = [rng.getrandbits(W) for _ in range(1 << ADDR_BITS)]
    rows_per_set = params.rows_per_set

    def expected(hdr, mask, row_base):
        payload = b"".join(from_word(mem[row_base + r], B) for r in range(rows_per_set))[:hdr.payload_len]
        return proto.build_frame(hdr.replace(flags=int(proto.Flags.RESULT)), payload,
                                 dst=proto.result_mac(hdr.group_id), src=switch_mac)

    want = [expected(*j) for j in jobs]
    stats = {"frames": 0, "stalls": 0, "cycles": 0}

    async def tb(ctx):
        ctx.set(dut.switch_mac, switch_mac)
        ctx.set(dut.rd_data, rng.getrandbits(W))      # garbage until the first read
        next_job, offering = 0, False
        frame_no, beats, held = 0, [], None           # held: outputs of a stalled beat
        budget = 50 * len(jobs) + 4 * sum(len(f) // B + 3 for f in want) + 100
        for cycle in range(budget):
            # job source, with random gaps; a job once offered stays offered until taken
            if next_job < len(jobs) and (offering or rng.random() >= job_gap):
                hdr, mask, row_base = jobs[next_job]
                ctx.set(dut.job, {"cais": to_word(hdr.pack()), "mask": mask, "row_base": row_base})
                ctx.set(dut.job_valid, 1)
                offering = True
            else:
                ctx.set(dut.job, {"cais": rng.getrandbits(128), "mask": rng.getrandbits(params.ports),
                                  "row_base": rng.getrandbits(ADDR_BITS)})
                ctx.set(dut.job_valid, 0)
            o_ready = int(rng.random() >= backpressure)
            ctx.set(dut.o_ready, o_ready)
            (_, _, job_valid, job_ready, rd_en, rd_addr, o_valid, o_data, o_keep, o_last, o_mask
             ) = await ctx.tick().sample(dut.job_valid, dut.job_ready, dut.rd_en, dut.rd_addr, dut.o_valid,
                                         dut.o_data, dut.o_keep, dut.o_last, dut.o_mask)
            stats["cycles"] += 1
            # the slot memory: data the cycle after an enabled address, unchanged otherwise
            if rd_en:
                ctx.set(dut.rd_data, mem[rd_addr])
            if job_valid and job_ready:
                next_job += 1
                offering = False
            where = f"frame {frame_no}, beat {len(beats)}"
            if held is not None:
                assert o_valid, f"{where}: o_valid dropped while stalled"
                assert (o_data, o_keep, o_last, o_mask) == held, f"{where}: output changed while stalled"
                held = None
            if expect_no_bubble and beats:
                assert o_valid, f"{where}: bubble inside a frame"
            if not o_valid:
                continue
            assert frame_no < len(jobs), "a frame with no job"
            hdr, mask, row_base = jobs[frame_no]
            if rd_en:
                assert row_base <= rd_addr < row_base + rows_per_set, f"{where}: read row {rd_addr} off the set"
            assert o_mask == mask, f"{where}: o_mask {o_mask:#x} != {mask:#x}"
            if not o_ready:
                held = (o_data, o_keep, o_last, o_mask)
                stats["stalls"] += 1
                continue
            beats.append((o_data, o_keep, o_last))
            if o_last:
                frame = want[frame_no]
                nbeats = -(-len(frame) // B)
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
                beats = []
            else:
                assert len(beats) < -(-len(want[frame_no]) // B), f"{where}: tlast missing"
            if frame_no == len(jobs):
                break
        assert frame_no == len(jobs), f"only {frame_no} of {len(jobs)} frames came out in {budget} cycles"
        # nothing more comes out
        ctx.set(dut.job_valid, 0)
        ctx.set(dut.o_ready, 1)
        for _ in range(5):
            _, _, o_valid = await ctx.tick().sample(dut.o_valid)
            assert not o_valid, "an extra beat after the last frame"

    run(dut, tb)
    return stats


def jobs_for(params, plens, rng):
    top = (1 << ADDR_BITS) - params.rows_per_set
    jobs = []
    for i, plen in enumerate(plens):
        row_base = [0, top][i % 2] if i < 2 else rng.randrange(top + 1)
        jobs.append((random_header(rng, plen), rng.getrandbits(params.ports) or 1, row_base))
    return jobs


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
    assert stats["frames"] == len(plens) and stats["stalls"] > 20


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
    """Jobs always offered, sink always ready: every frame leaves without a bubble; the default switch MAC."""
    params = SwitchParams(data_width=width)
    rng = random.Random(200 + width)
    plens = [4, params.max_payload, 28, 32, 36, 60, 64, 100] + [4 * rng.randint(1, params.max_payload // 4)
                                                                for _ in range(8)]
    jobs = jobs_for(params, plens, rng)
    stats = run_results(params, jobs, seed=width + 3, switch_mac=proto.SWITCH_MAC_DEFAULT, backpressure=0.0,
                        job_gap=0.0, expect_no_bubble=True)
    B = params.beat_bytes
    beats = sum(-(-(proto.HEADERS_BYTES + p) // B) for p in plens)
    # one cycle to take the job, one to load, then one beat per cycle (documented throughput)
    assert stats["cycles"] <= beats + 2 * len(plens) + 1, (stats["cycles"], beats)


@pytest.mark.parametrize("width", [64, 512])
def test_random_jobs_heavy_backpressure(width):
    params = SwitchParams(data_width=width)
    rng = random.Random(300 + width)
    plens = [4 * rng.randint(1, params.max_payload // 4) for _ in range(40)]
    stats = run_results(params, jobs_for(params, plens, rng), seed=width + 4, switch_mac=rng.getrandbits(48),
                        backpressure=0.7, job_gap=0.6)
    assert stats["frames"] == 40


def test_larger_max_payload():
    """max_payload 512 (rows_per_set 8 at 512 bits, 64 at 64 bits)."""
    for width in (64, 512):
        params = SwitchParams(data_width=width, max_payload=512)
        rng = random.Random(400 + width)
        plens = [4, 256, 260, 508, 512] + [4 * rng.randint(1, 128) for _ in range(5)]
        run_results(params, jobs_for(params, plens, rng), seed=width + 5, switch_mac=rng.getrandbits(48))
