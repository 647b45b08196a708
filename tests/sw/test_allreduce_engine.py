"""The switch-path protocol engine against the reference model of the switch, with seeded losses.

A minimal loop stands in for the backends: every rank's engine is polled, its frames go through the
model (optionally dropped or duplicated on the way in and out), results come back at once. The answer
must be exact, and the switch must never see a chunk break the slot discipline.
"""

import heapq
import random

import numpy as np
import pytest

from cais import protocol as proto
from cais.allreduce import SwitchAllReduce, chunk_count
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.refmodel import SwitchModel
from cais.tables import Rule, rule_writes

DT = 1e-6          # seconds per loop iteration
TIMEOUT = 20e-6


def reference(arrays, op):
    acc = np.stack([a.astype(np.int64) for a in arrays])
    out = {proto.ReduceOp.SUM: acc.sum(0), proto.ReduceOp.MAX: acc.max(0), proto.ReduceOp.MIN: acc.min(0)}[op]
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)


def run(ranks, elements, op, *, drop=0.0, dup=0.0, count_log2=2, window=4, seed=0, retry_limit=30,
        seq_base=0, model=None, arrays=None, kind=None, capacity=None):
    params = SwitchParams(ports=max(ranks, 2))
    model = model or SwitchModel(params)
    regs = register_map(params)
    kind = kind or {}
    for a, v in rule_writes(regs, 0, Rule.for_group(1, contributors=(1 << ranks) - 1, results=(1 << ranks) - 1,
                                                    base=0, count_log2=count_log2, red_op=op, **kind)):
        model.write(a, v)
    rng = np.random.default_rng(seed)
    if arrays is None:
        arrays = [rng.integers(-2**31, 2**31, elements, dtype=np.int64).astype(np.int32) for _ in range(ranks)]
    engines = [SwitchAllReduce(data=arrays[r], op=op, group_id=1, seq_base=seq_base, slot_count=1 << count_log2,
                               window=window, chunk_size=256, timeout_s=TIMEOUT, retry_limit=retry_limit,
                               mac=0x020000000100 + r, dtype=kind.get("dtype"), capacity=capacity)
               for r in range(ranks)]
    faults = random.Random(seed)
    now, peak = 0.0, 0
    for _ in range(200_000):
        if all(e.done for e in engines):
            break
        for r, e in enumerate(engines):
            for frame in e.poll(now):
                copies = 0 if faults.random() < drop else (2 if faults.random() < dup else 1)
                for _ in range(copies):
                    for port, out in model.receive(r, frame):
                        if faults.random() >= drop:
                            engines[port].receive(out, now)
            peak = max(peak, len(e._in_flight))
        now += DT
    return engines, arrays, model, peak


@pytest.mark.parametrize("op", list(proto.ReduceOp))
@pytest.mark.parametrize("ranks,elements", [(2, 1), (4, 1000), (3, 64 * 9 + 5), (8, 4096)])
def test_lossless_exact(op, ranks, elements):
    engines, arrays, model, peak = run(ranks, elements, op)
    want = reference(arrays, op)
    for e in engines:
        assert e.done and not e.failed
        assert np.array_equal(e.result, want)
        assert e.retransmissions == 0
    c = model.counters()
    assert c["DROP_TAG_MISMATCH"] == 0 and c["DUPLICATES"] == 0
    assert c["COMPLETED"] == chunk_count(elements, 4, 256)
    assert peak <= 4


@pytest.mark.parametrize("drop,dup", [(0.01, 0.0), (0.05, 0.05), (0.2, 0.1)])
@pytest.mark.parametrize("seed", [1, 2])
def test_loss_and_duplication_exact(drop, dup, seed):
    engines, arrays, model, _ = run(4, 64 * 40 + 3, proto.ReduceOp.SUM, drop=drop, dup=dup, seed=seed)
    want = reference(arrays, proto.ReduceOp.SUM)
    for e in engines:
        assert e.done and not e.failed
        assert np.array_equal(e.result, want)
    assert sum(e.retransmissions for e in engines) > 0
    c = model.counters()
    # every repeat the switch saw was absorbed: none of them reduced a value twice
    assert c["CONTRIBUTIONS"] == 4 * chunk_count(64 * 40 + 3, 4, 256)


def test_window_respects_quota_and_slot_order():
    engines, arrays, model, peak = run(4, 64 * 64, proto.ReduceOp.SUM, count_log2=3, window=32)
    assert peak <= 8                  # the quota, even with a larger max_pending
    assert all(np.array_equal(e.result, reference(arrays, proto.ReduceOp.SUM)) for e in engines)


def test_frames_carry_the_documented_header():
    e = SwitchAllReduce(data=np.arange(70, dtype=np.int32), op=proto.ReduceOp.MAX, group_id=9, seq_base=100,
                        slot_count=4, window=4, chunk_size=256, timeout_s=1.0, retry_limit=3, mac=0x020000000105,
                        layer_id=7)
    frames = e.poll(0.0)
    assert len(frames) == 2
    f0, f1 = (proto.parse_frame(f) for f in frames)
    assert f0.cais == proto.CaisHeader(op_type=0, group_id=9, layer_id=7, chunk_id=0, total_chunks=2, seq_num=100,
                                       payload_len=256, dtype=proto.DType.INT32, red_op=proto.ReduceOp.MAX, flags=0)
    assert f1.cais.seq_num == 101 and f1.cais.payload_len == 24
    assert np.array_equal(np.frombuffer(f1.payload, ">i4"), np.arange(64, 70))
    assert f0.eth.src == 0x020000000105
    # the retransmission after the timeout carries the RETRANSMIT flag; the backoff doubles
    again = e.poll(1.0)
    assert [proto.parse_frame(f).cais.flags for f in again] == [proto.Flags.RETRANSMIT] * 2
    assert e.next_deadline() == pytest.approx(3.0)


def test_gives_up_after_retry_limit():
    e = SwitchAllReduce(data=np.zeros(8, dtype=np.int32), op=proto.ReduceOp.SUM, group_id=1, seq_base=0,
                        slot_count=1, window=1, chunk_size=256, timeout_s=1.0, retry_limit=2, mac=1)
    now = 0.0
    sent = 0
    while not e.failed and now < 100:
        sent += len(e.poll(now))
        now += 0.5
    assert e.failed and sent == 3      # the first send and two retries


def test_duplicate_results_ignored_and_counted():
    engines, arrays, model, _ = run(2, 64, proto.ReduceOp.SUM)
    e = engines[0]
    hdr = proto.CaisHeader(group_id=1, seq_num=0, payload_len=256, flags=int(proto.Flags.RESULT))
    bogus = proto.build_frame(hdr, bytes(256))
    assert e.receive(bogus, 1.0)
    assert e.duplicate_results == 1
    assert np.array_equal(e.result, reference(arrays, proto.ReduceOp.SUM))


# ---------------------------------------------------------------- the switch's element types
from cais import numerics  # noqa: E402
from cais.allreduce import chunk_payload  # noqa: E402
from folds import fold, same_bits  # noqa: E402

T = proto.DType


def typed_inputs(dtype, ranks, elements, seed):
    rng = np.random.default_rng(seed)
    if dtype in (T.INT32, T.INT16, T.INT8):
        t = {T.INT32: np.int32, T.INT16: np.int16, T.INT8: np.int8}[dtype]
        info = np.iinfo(t)
        return [rng.integers(info.min, info.max, elements, dtype=np.int64, endpoint=True).astype(t)
                for _ in range(ranks)]
    out = []
    for _ in range(ranks):
        x = (rng.standard_normal(elements) * np.ldexp(1.0, rng.integers(-10, 10, elements))).astype(np.float32)
        out.append(numerics.f32_to_bf16(x) if dtype == T.BF16 else x.astype({T.FP32: np.float32, T.FP16: np.float16}[dtype]))
    return out


@pytest.mark.parametrize("dtype", list(T))
@pytest.mark.parametrize("op", list(proto.ReduceOp))
def test_every_type_under_loss(dtype, op):
    """Reproducible rules for floats (the result is the fold in port order, whatever arrived first), plain
    ones for integers (exact in any order); chunks are cut to the rule's capacity and the element size."""
    ranks, elements = 4, 1000
    is_float = dtype in proto.FLOAT_DTYPES
    kind = {"dtype": dtype, "reproducible": is_float, "acc_fp32": dtype in (T.FP16, T.BF16)}
    params = SwitchParams(ports=ranks)
    capacity = params.max_payload
    arrays = typed_inputs(dtype, ranks, elements, int(dtype) * 3 + int(op))
    engines, _, model, _ = run(ranks, elements, op, drop=0.05, dup=0.05, seed=int(dtype), arrays=arrays, kind=kind,
                               capacity=capacity)
    want = fold(arrays, op, dtype, acc_fp32=kind["acc_fp32"])
    for e in engines:
        assert e.done and not e.failed
        assert same_bits(e.result, want)
    chunk = chunk_payload(256, capacity, proto.ELEMENT_BYTES[dtype])
    c = model.counters()
    assert c["DROP_TYPE_MISMATCH"] == 0 and c["DROP_PAYLOAD_TOO_LONG"] == 0
    assert c["CONTRIBUTIONS"] == ranks * chunk_count(elements, proto.ELEMENT_BYTES[dtype], chunk)


def test_chunks_fit_the_capacity_and_carry_the_type():
    bits = numerics.f32_to_bf16(np.arange(100, dtype=np.float32))
    e = SwitchAllReduce(data=bits, op=proto.ReduceOp.SUM, group_id=2, seq_base=0, slot_count=8, window=8,
                        chunk_size=256, timeout_s=1.0, retry_limit=3, mac=1, dtype=T.BF16, capacity=40)
    frames = [proto.parse_frame(f) for f in e.poll(0.0)]
    assert e.chunk_bytes == 40 and e.nchunks == 5 and len(frames) == 5
    assert all(f.cais.dtype == T.BF16 and f.cais.payload_len == 40 for f in frames)
    assert np.array_equal(numerics.decode(T.BF16, frames[1].payload), bits[20:40])
    # int8: 1-byte elements, a capacity that is not a multiple of anything
    e = SwitchAllReduce(data=np.arange(-50, 50, dtype=np.int8), op=proto.ReduceOp.MAX, group_id=2, seq_base=0,
                        slot_count=8, window=8, chunk_size=64, timeout_s=1.0, retry_limit=3, mac=1, capacity=47)
    assert e.chunk_bytes == 47 and e.nchunks == 3 and e.dtype == T.INT8
    assert chunk_payload(256, 42, 4) == 40 and chunk_payload(256, 3, 4) == 0
    # a result of another type or length is not this chunk's
    hdr = proto.CaisHeader(group_id=2, seq_num=0, payload_len=47, dtype=T.INT16, red_op=proto.ReduceOp.MAX,
                           flags=int(proto.Flags.RESULT))
    assert not e.receive(proto.build_frame(hdr, bytes(47)), 0.0)


def test_bad_types_refused():
    with pytest.raises(TypeError, match="float64"):
        SwitchAllReduce(data=np.zeros(4), op=0, group_id=1, seq_base=0, slot_count=1, window=1, chunk_size=256,
                        timeout_s=1.0, retry_limit=1, mac=1)
    with pytest.raises(TypeError, match="uint16"):
        SwitchAllReduce(data=np.zeros(4, np.float32), op=0, group_id=1, seq_base=0, slot_count=1, window=1,
                        chunk_size=256, timeout_s=1.0, retry_limit=1, mac=1, dtype=T.BF16)
    with pytest.raises(ValueError, match="not even one"):
        SwitchAllReduce(data=np.zeros(4, np.float32), op=0, group_id=1, seq_base=0, slot_count=1, window=1,
                        chunk_size=256, timeout_s=1.0, retry_limit=1, mac=1, capacity=2)


def test_retry_horizon_is_when_an_unanswered_chunk_gives_up():
    """cais.allreduce.retry_horizon against the engine itself: a one-chunk collective that never gets a
    result, polled at each deadline, fails exactly that long after its first transmission (255 initial
    timeouts for retry_limit 8: 1 + 2 + ... + 64 + 64 + 64)."""
    from cais.allreduce import retry_horizon
    for timeout, limit in ((1e-4, 8), (1e-3, 0), (2e-4, 3)):
        eng = SwitchAllReduce(data=np.zeros(4, np.int32), op=proto.ReduceOp.SUM, group_id=1, seq_base=0,
                              slot_count=1, window=1, chunk_size=256, timeout_s=timeout, retry_limit=limit,
                              mac=2)
        now = 0.0
        assert len(eng.poll(now)) == 1
        while not eng.failed:
            now = eng.next_deadline()
            eng.poll(now)
        assert now == pytest.approx(retry_horizon(timeout, limit))
    assert retry_horizon(1e-4, 8) == pytest.approx(255e-4)


def test_a_rank_with_a_short_measured_timer_outwaits_the_initial_schedule():
    """A rank whose measured timer fell near the floor (a tenth of timeout_ms) still gives up no earlier than
    the retry horizon after its last new result: a peer it waits for may be repeating on the initial
    timer's schedule. Counted in its own short timeouts, retry_limit would run out ten times sooner."""
    timeout, limit = 1e-4, 8
    eng = SwitchAllReduce(data=np.zeros(5 * 64, np.int32), op=proto.ReduceOp.SUM, group_id=1, seq_base=0,
                          slot_count=8, window=4, chunk_size=256, timeout_s=timeout, retry_limit=limit, mac=2)
    now = 0.0
    assert len(eng.poll(now)) == 4
    for seq in range(4):                      # four quick answers: the timer measures ~1 us round trips
        now += 1e-6
        hdr = proto.CaisHeader(group_id=1, seq_num=seq, payload_len=256, flags=int(proto.Flags.RESULT))
        assert eng.receive(proto.build_frame(hdr, bytes(256)), now)
    progress = now
    assert eng.timer.rto < timeout / 4        # round trips of 1-4 us and the margin (a tenth): short
    assert len(eng.poll(now)) == 1                               # chunk 4, never answered
    sends = 1
    while not eng.failed:
        now = eng.next_deadline()
        sends += len(eng.poll(now))
    # the horizon: 1 + 2 + ... + 64 + 64 + 64 = 255 initial timeouts, 25.5 ms; its own timeouts at the
    # floor (a tenth) would have run out after 2.55 ms, so it kept repeating past retry_limit
    assert now - progress >= 255 * timeout - 1e-12
    assert sends > limit + 1


def test_timer_bounds():
    """cais.rto: the floor and the ceiling of the RTO, and the longest timeout (cap x the configured one),
    whatever the samples say."""
    from cais.rto import RetransmitTimer
    switch = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0)
    for _ in range(20):
        switch.sample(5e-3)                   # round trips that waited behind a peer's repeats
    assert switch.rto == pytest.approx(1e-4)
    fast = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0)
    for _ in range(20):
        fast.sample(1e-6)
    assert fast.rto == pytest.approx(1e-5)
    ring = RetransmitTimer(1e-4)              # grows past the configured timeout, up to cap x
    for _ in range(20):
        ring.sample(1.0)
    assert ring.rto == pytest.approx(64e-4)
    assert [ring.timeout(k) for k in (0, 3, 20)] == [pytest.approx(64e-4)] * 3
    assert RetransmitTimer(1e-4).timeout(7) == pytest.approx(64e-4)   # 2**7 x, capped at 64 x
    with pytest.raises(ValueError, match="floor"):
        RetransmitTimer(1e-4, floor=2.0, ceiling=1.0)
    steady = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0, margin=1 / 8)   # the switch engine's
    for _ in range(200):
        steady.sample(14.75e-6)               # a queue served at a fixed rate: RTTVAR falls to nothing
    assert steady.rttvar < 1e-9
    assert steady.rto == pytest.approx(14.75e-6 * 9 / 8)         # SRTT + SRTT / 8, not SRTT
    steady.back_off()                         # backed off (the ring's use): doubled, up to the ceiling,
    assert steady.rto == pytest.approx(2 * 14.75e-6 * 9 / 8)
    assert steady.timeout(0) == steady.rto    # the least timeout of a frame, not a factor of its doubling
    assert steady.timeout(2) == pytest.approx(4 * 14.75e-6 * 9 / 8)
    for _ in range(3):
        steady.back_off()
    assert steady.rto == pytest.approx(1e-4)
    steady.sample(14.75e-6)                   # until a frame sent once is answered (Karn)
    assert steady.rto == pytest.approx(14.75e-6 * 9 / 8)
    with pytest.raises(ValueError, match="margin"):
        RetransmitTimer(1e-4, margin=-0.1)
    queued = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0, margin=1 / 8)
    queued.sample(1e-5)
    queued.bound(5e-3)                        # an upper bound after round trips were measured: a sample,
    assert queued.bounds == 1 and queued.rto == pytest.approx(1e-4)   # within the ceiling
    slow = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0, margin=1 / 8)
    slow.bound(5e-3)                          # before any: the configured timeout is shorter than the
    assert slow.rto == pytest.approx(64e-4)   # path, the ceiling lifted to the cap
    for _ in range(200):
        slow.sample(2e-3)                     # from then on the round trips set the RTO past the
    assert slow.rto == pytest.approx(2e-3 * 9 / 8)              # configured timeout, within the cap
    carried = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0, margin=1 / 8)
    carried.adopt(slow)                       # the next collective starts where the last one ended
    assert (carried.srtt, carried.rttvar, carried.rto) == (slow.srtt, slow.rttvar, slow.rto)
    fresh = RetransmitTimer(1e-4, floor=0.1, ceiling=1.0, margin=1 / 8)
    fresh.adopt(RetransmitTimer(1e-4))        # nothing measured: nothing taken
    assert fresh.srtt is None and fresh.rto == pytest.approx(1e-4)


@pytest.mark.parametrize("dtype", list(proto.DType))
def test_frames_are_build_frame_byte_for_byte(dtype):
    """The engine packs its frames from bytes prepared once (the co-simulation's per-frame cost): they must
    be exactly proto.build_frame of the documented header and numerics.encode of the chunk, short chunks
    padded to 60 bytes, the RETRANSMIT flag on repeats."""
    from cais import numerics

    native = numerics.native_dtype(dtype)
    rng = np.random.default_rng(int(dtype))
    data = rng.integers(0, 1 << (8 * native.itemsize), 200, dtype=np.uint64).astype(native)
    e = SwitchAllReduce(data=data, op=proto.ReduceOp.MIN, group_id=5, seq_base=0xFFFF_FFFE, slot_count=4, window=4,
                        chunk_size=256, timeout_s=1.0, retry_limit=3, mac=0x02AB00000107, layer_id=0x1_2345,
                        dtype=dtype)
    per = 256 // native.itemsize
    for now, flags in ((0.0, 0), (1.0, int(proto.Flags.RETRANSMIT))):
        frames = e.poll(now)
        assert len(frames) == e.nchunks
        for i, frame in enumerate(frames):
            values = data[i * per:(i + 1) * per]
            hdr = proto.CaisHeader(group_id=5, layer_id=0x2345, chunk_id=i, total_chunks=e.nchunks,
                                   seq_num=(0xFFFF_FFFE + i) & 0xFFFF_FFFF, payload_len=values.nbytes, dtype=dtype,
                                   red_op=proto.ReduceOp.MIN, flags=flags)
            assert frame == proto.build_frame(hdr, numerics.encode(dtype, values), dst=proto.result_mac(5),
                                              src=0x02AB00000107, pad=True)


@pytest.mark.parametrize("elements, chunk_size", [(70, 256), (1, 256), (64, 256), (9, 8), (3, 4)])
def test_frames_of_short_and_tiny_chunks_are_build_frame_byte_for_byte(elements, chunk_size):
    """The frames built at once in __init__ (rows of the longer of a full chunk's frame and 60 bytes): a last
    chunk under 30 bytes, a single short chunk, chunks that fill their rows exactly, and chunks so small that
    every frame is padded, first transmissions and repeats alike."""
    data = np.arange(1, elements + 1, dtype=np.int32) * -7919
    e = SwitchAllReduce(data=data, op=proto.ReduceOp.SUM, group_id=2, seq_base=7, slot_count=64, window=64,
                        chunk_size=chunk_size, timeout_s=1.0, retry_limit=3, mac=0x02AB00000101)
    per = chunk_size // 4
    for now, flags in ((0.0, 0), (1.0, int(proto.Flags.RETRANSMIT))):
        frames = e.poll(now)
        assert len(frames) == -(-elements // per)
        for i, frame in enumerate(frames):
            values = data[i * per:(i + 1) * per]
            hdr = proto.CaisHeader(group_id=2, chunk_id=i, total_chunks=len(frames), seq_num=7 + i,
                                   payload_len=values.nbytes, flags=flags)
            assert frame == proto.build_frame(hdr, values.astype(">i4").tobytes(), dst=proto.result_mac(2),
                                              src=0x02AB00000101, pad=True)


def test_results_read_in_place_refuse_what_is_not_this_chunks_result():
    e = SwitchAllReduce(data=np.arange(100, dtype=np.int32), op=proto.ReduceOp.SUM, group_id=3, seq_base=10,
                        slot_count=4, window=4, chunk_size=256, timeout_s=1.0, retry_limit=3, mac=1)
    e.poll(0.0)
    good = proto.CaisHeader(group_id=3, seq_num=11, payload_len=144, flags=int(proto.Flags.RESULT))
    payload = (np.arange(36, dtype=np.int32) * 7).astype(">i4").tobytes()
    bad = [proto.build_frame(good.replace(flags=0), payload),                 # a contribution, not a result
           proto.build_frame(good.replace(group_id=4), payload),              # another group
           proto.build_frame(good.replace(seq_num=12), payload),              # past the last chunk
           proto.build_frame(good.replace(dtype=proto.DType.FP32), payload),  # another type
           proto.build_frame(good.replace(red_op=proto.ReduceOp.MAX), payload),
           proto.build_frame(good.replace(payload_len=140), payload[:140]),   # not this chunk's length
           proto.build_frame(good, payload)[:-4],                             # cut short
           proto.build_frame(good, payload)[:29],                             # shorter than the headers
           proto.EthHeader(proto.BROADCAST_MAC, 1, 0x0800).pack() + proto.build_frame(good, payload)[14:]]
    for frame in bad:
        assert not e.receive(frame, 0.5)
    assert e.chunks_done == 0
    assert e.receive(bytearray(proto.build_frame(good, payload)), 0.5) and e.chunks_done == 1
    assert np.array_equal(e.result[64:], np.arange(36) * 7) and not e.result[:64].any()


def test_result_read_between_results_follows_every_new_result():
    """The result is decoded from the payloads when read: a read before the last result must not stick."""
    e = SwitchAllReduce(data=np.zeros(100, dtype=np.int16), op=proto.ReduceOp.SUM, group_id=3, seq_base=10,
                        slot_count=4, window=4, chunk_size=128, timeout_s=1.0, retry_limit=3, mac=1)
    e.poll(0.0)
    want = np.arange(-50, 50, dtype=np.int16) * 311          # negative values: the byte order matters
    for index, (lo, hi) in enumerate([(64, 100), (0, 64)]):
        hdr = proto.CaisHeader(group_id=3, seq_num=10 + (lo // 64), payload_len=2 * (hi - lo),
                               dtype=proto.DType.INT16, flags=int(proto.Flags.RESULT))
        assert e.receive(proto.build_frame(hdr, want[lo:hi].astype(">i2").tobytes()), 0.5)
        seen = e.result
        assert seen.dtype == np.int16 and np.array_equal(seen[lo:hi], want[lo:hi])
        assert not seen[:lo].any() if index == 0 else np.array_equal(seen, want)
    assert e.done


@pytest.mark.parametrize("seed", [1, 2])
def test_kept_deadline_is_the_earliest_in_flight(seed):
    """next_deadline (kept up to date, not recomputed) equals the minimum over the chunks in flight at every
    step of a lossy run, and the run still ends exact."""
    params = SwitchParams(ports=3)
    model = SwitchModel(params)
    for a, v in rule_writes(register_map(params), 0, Rule.for_group(1, contributors=7, results=7, base=0,
                                                                    count_log2=3)):
        model.write(a, v)
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-2**31, 2**31, 3000, dtype=np.int64).astype(np.int32) for _ in range(3)]
    engines = [SwitchAllReduce(data=arrays[r], op=proto.ReduceOp.SUM, group_id=1, seq_base=0, slot_count=8,
                               window=8, chunk_size=256, timeout_s=TIMEOUT, retry_limit=30, mac=r)
               for r in range(3)]
    faults, now, checked = random.Random(seed), 0.0, 0
    while not all(e.done for e in engines):
        for r, e in enumerate(engines):
            for frame in e.poll(now):
                if faults.random() < 0.2:
                    continue
                for port, out in model.receive(r, frame):
                    if faults.random() >= 0.2:
                        engines[port].receive(out, now)
        for e in engines:
            want = min((c.deadline for c in e._in_flight.values()), default=None) if not e.done else None
            assert e.next_deadline() == want
            checked += want is not None
        now += DT
        assert now < 1.0
    assert checked > 100 and sum(e.retransmissions for e in engines) > 10
    assert all(np.array_equal(e.result, reference(arrays, proto.ReduceOp.SUM)) for e in engines)


def run_behind_one_result_generator(*, chunks: int, stall_s: float, service_s: float = 72 / 156.25e6,
                                    ranks: int = 4, window: int = 32, timeout: float = 1e-4, job_limit: int):
    """Event-driven run of ``ranks`` engines on a model switch whose results (and re-served results) leave
    through one generator, ``service_s`` per job, in order (a tree leaf serves each chunk twice:
    docs/protocol.md 13.7, 72 cycles at 156.25 MHz); once, early on, the generator stalls for ``stall_s``.
    Returns the engines, their arrays, the switch's counters and the jobs served (stops past ``job_limit``)."""
    params = SwitchParams(ports=ranks)
    model = SwitchModel(params)
    every = (1 << ranks) - 1
    for a, v in rule_writes(register_map(params), 0, Rule.for_group(1, contributors=every, results=every, base=0,
                                                                    count_log2=5)):
        model.write(a, v)
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-2**31, 2**31, chunks * 64, dtype=np.int64).astype(np.int32) for _ in range(ranks)]
    engines = [SwitchAllReduce(data=arrays[r], op=proto.ReduceOp.SUM, group_id=1, seq_base=0, slot_count=32,
                               window=window, chunk_size=256, timeout_s=timeout, retry_limit=8, mac=r)
               for r in range(ranks)]
    free_at, jobs, order, out, now = 0.0, 0, 0, [], 0.0
    stall_at = 4 * window * service_s             # once the timer has measured the steady round trip
    while not all(e.done or e.failed for e in engines) and jobs <= job_limit:
        for r, e in enumerate(engines):
            for frame in e.poll(now):
                sent = model.receive(r, frame)
                if sent:                          # a result or a re-served one: one job of the generator
                    jobs += 1
                    free_at = max(now, free_at) + service_s
                    if stall_at is not None and free_at >= stall_at:
                        free_at, stall_at = free_at + stall_s, None
                    for port, f in sent:
                        order += 1
                        heapq.heappush(out, (free_at, order, port, f))
        now = max(now, min([t for t in (e.next_deadline() for e in engines) if t is not None]
                           + ([out[0][0]] if out else [])))
        while out and out[0][0] <= now:
            _, _, port, f = heapq.heappop(out)
            engines[port].receive(f, now)
    return engines, arrays, model.counters(), jobs


def test_a_hiccup_of_a_steady_switch_is_not_taken_for_loss():
    """The collapse of a half-rate tree leaf at the default timeout (docs/protocol.md 13.7), on the model:
    32 chunks in flight per rank behind one result generator make a steady round trip (14.7 us) that the
    timer measures to within a cycle (RTTVAR falls to 0). The old timer sat at SRTT + 4 RTTVAR, the round
    trip itself: a stall of 1 us (two frames' worth) timed out the chunks waiting; each repeat of a chunk
    whose result is queued is re-served, a job more in the queue; no chunk was answered after one
    transmission, so the timer never moved (Karn): 4,212 re-served results for 256 chunks, 16 times the
    switch's work. Now the timer keeps an eighth of the round trip above it (cais.rto, RFC 9002's 9/8):
    nothing is repeated. Counted, not timed: the run is deterministic."""
    chunks = 256
    engines, arrays, counters, jobs = run_behind_one_result_generator(chunks=chunks, stall_s=0.0,
                                                                      job_limit=20 * chunks)
    assert jobs == chunks and counters["DUPLICATES"] == 0      # the steady state alone never repeats
    calm_end = max(e._progress_at for e in engines)
    engines, arrays, counters, jobs = run_behind_one_result_generator(chunks=chunks, stall_s=1e-6,
                                                                      job_limit=20 * chunks)
    want = reference(arrays, proto.ReduceOp.SUM)
    assert all(e.done and np.array_equal(e.result, want) for e in engines)
    assert counters["CONTRIBUTIONS"] == 4 * chunks and counters["COMPLETED"] == chunks
    # every repeat would be a re-served result, a job of the generator: none
    assert counters["DUPLICATES"] == sum(e.retransmissions for e in engines) == jobs - chunks == 0
    assert max(e._progress_at for e in engines) == pytest.approx(calm_end + 1e-6)   # the stall, no more


def run_on_a_slow_path(delay: float, timeout: float, chunks: int, history=None) -> SwitchAllReduce:
    """One rank (a rule of one contributor on a model switch) whose every frame is answered ``delay`` after
    it was sent, the repeats of a completed chunk too (re-served): a path slower than the configured
    timeout, as Verilated switches are (docs/protocol.md 13.7). Event-driven; returns the engine, done."""
    params = SwitchParams(ports=2)
    model = SwitchModel(params)
    for a, v in rule_writes(register_map(params), 0, Rule.for_group(1, contributors=1, results=1, base=0,
                                                                    count_log2=5)):
        model.write(a, v)
    data = np.arange(chunks * 64, dtype=np.int32)
    engine = SwitchAllReduce(data=data, op=proto.ReduceOp.SUM, group_id=1, seq_base=0, slot_count=32, window=32,
                             chunk_size=256, timeout_s=timeout, retry_limit=30, mac=0, history=history)
    out, order, now = [], 0, 0.0
    while not engine.done:
        for frame in engine.poll(now):
            for _port, result in model.receive(0, frame):
                order += 1
                heapq.heappush(out, (now + delay, order, result))
        now = min([engine.next_deadline()] + ([out[0][0]] if out else []))
        while out and out[0][0] <= now:
            assert engine.receive(heapq.heappop(out)[2], now)
    assert np.array_equal(engine.result, data)
    return engine


def test_a_path_slower_than_the_configured_timeout_is_learned():
    """The Verilated make cluster (docs/protocol.md 13.7): round trips of 0.1-1 s against the deployed 50 ms.
    Here 0.5 s: every chunk of the first window goes three times (50, 100, 200 ms) before its answer, and
    Karn's rule leaves the timer no sample: the old engine repeated every chunk of every window so (96 per
    window of 32) and stayed at 50 ms. Now, a whole window answered only after repeats with no round trip
    measured yet, the timer takes those answers as upper bounds and may grow past the configured timeout:
    the later windows go once; and the group's next collective, started from this one's timer
    (``history``), repeats nothing."""
    first = run_on_a_slow_path(0.5, 0.05, 128)
    per_window = [sum(c.retries for c in first._chunks[k:k + 32]) for k in range(0, 128, 32)]
    assert per_window == [96, 0, 0, 0]
    assert first.timer.bounds >= 1 and 0.5 < first.timer.rto < 64 * 0.05
    second = run_on_a_slow_path(0.5, 0.05, 128, history=first.timer)
    assert second.retransmissions == 0 and second.timer.samples > first.timer.samples


def test_timer_values_follow_every_change():
    """RetransmitTimer keeps measured and rto as values: after every sample, bound, backoff and adopt they
    equal RFC 6298's formulas computed here (SRTT + max(G, 4 RTTVAR), floor, ceiling, doubling)."""
    from cais.rto import RetransmitTimer
    initial, floor, cap, margin = 1e-3, 0.1, 64, 1 / 8
    t = RetransmitTimer(initial, floor=floor, warmup=2, ceiling=1.0, margin=margin)
    srtt = rttvar = None
    samples, backoffs, ceiling = 0, 0, 1.0

    def check():
        if srtt is None:
            base = initial
        else:
            base = max(initial * (floor if samples >= 2 else 1.0), srtt + max(srtt * margin, 4 * rttvar))
        measured = min(initial * ceiling, base)
        rto = min(initial * ceiling, measured * 2 ** backoffs)
        assert t.measured == pytest.approx(measured, rel=1e-12) and t.rto == pytest.approx(rto, rel=1e-12)
        assert t.timeout(0) == pytest.approx(min(initial * cap, rto), rel=1e-12)
        assert t.timeout(3) == pytest.approx(min(initial * cap, max(rto, measured * 8)), rel=1e-12)

    check()
    t.back_off(); check()                         # at the ceiling already: no doubling
    t.bound(5e-3); samples, ceiling, srtt, rttvar = 1, float(cap), 5e-3, 2.5e-3; check()
    for rtt in (2e-4, 3e-4, 2.5e-4):
        t.sample(rtt)
        samples += 1
        rttvar = 0.75 * rttvar + 0.25 * abs(srtt - rtt)
        srtt = 0.875 * srtt + 0.125 * rtt
        check()
    t.back_off(); backoffs = 1; check()
    t.back_off(); backoffs = 2; check()
    fresh = RetransmitTimer(initial, floor=floor, warmup=2, ceiling=1.0, margin=margin)
    fresh.adopt(t)
    t, backoffs = fresh, 0
    check()
