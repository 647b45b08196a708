"""The host fallback ring all-reduce (cais.ring) under a simulated lossy network.

The network below is a tiny discrete-event loop: a frame reaches the engine owning its destination MAC a
fixed latency after it was sent, unless the seeded fault injector drops it, duplicates it, or delays it
by a random extra amount (which reorders it). Every rank's result is checked against a reduction computed
here with numpy, independently of the engine (int64 sum wrapped to int32).
"""

from __future__ import annotations

import heapq
import random
import zlib

import numpy as np
import pytest

from cais.protocol import (ETHERTYPE, HOST_ETHERTYPE, MIN_FRAME_BYTES, CaisHeader, EthHeader, HostHeader,
                           HostKind, ReduceOp, build_frame, build_host_frame)
from cais.ring import MAX_BACKOFF, RingAllReduce, block_bounds

from tiers import sweep

LATENCY = 2e-6
JITTER = 10e-6            # the largest extra delay of a reordered frame
TIMEOUT = 50e-6           # above the worst round trip 2 * (LATENCY + JITTER): no spurious retransmissions
HDR = 30                  # Ethernet + host header bytes
GROUP, OP_SEQ = 3, 17


def macs_for(n: int) -> list[int]:
    return [0x02_00_00_AA_00_00 + 0x100 * i + 7 for i in range(n)]


def seed_of(*args) -> int:
    return zlib.crc32(repr(args).encode())


def make_inputs(n: int, length: int, seed: int, dtype=np.int32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max, size=length, dtype=dtype, endpoint=True) for _ in range(n)]


def expected(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    stack = np.stack([a.astype(np.int64) for a in inputs]) if inputs[0].size else np.zeros((len(inputs), 0), np.int64)
    if op == ReduceOp.SUM:
        s = stack.sum(axis=0)
        return ((s + 2**31) % 2**32 - 2**31).astype(np.int32)  # two's-complement wrap of the exact sum
    red = stack.max(axis=0) if op == ReduceOp.MAX else stack.min(axis=0)
    return red.astype(np.int32)


class Net:
    """Frames delivered by destination MAC after LATENCY (+ faults), driven as a discrete-event loop."""

    def __init__(self, engines, seed, drop=0.0, dup=0.0, reorder=0.0, log=None):
        self.engines = engines
        self.by_mac = {e.my_mac: e for e in engines}
        self.rng = random.Random(seed)
        self.drop, self.dup, self.reorder = drop, dup, reorder
        self.heap: list = []
        self.seq = 0
        self.delivered = self.dropped = self.duplicated = 0
        self.log = log

    def send(self, frames, t):
        for f in frames:
            if self.log is not None:
                self.log.append((t, f))
            if self.rng.random() < self.drop:
                self.dropped += 1
                continue
            copies = 2 if self.rng.random() < self.dup else 1
            self.duplicated += copies - 1
            for _ in range(copies):
                delay = LATENCY + (self.rng.uniform(0, JITTER) if self.rng.random() < self.reorder else 0.0)
                heapq.heappush(self.heap, (t + delay, self.seq, f))
                self.seq += 1

    def run(self, t_limit=1.0):
        t = 0.0
        deadlines = {}
        for e in self.engines:
            self.send(e.poll(t), t)
            deadlines[e] = e.next_deadline()
        while not all(e.done for e in self.engines):
            times = [self.heap[0][0]] if self.heap else []
            times += [d for d in deadlines.values() if d is not None]
            assert times, "deadlock: nothing in flight and no timer pending"
            t = min(times)
            assert t < t_limit, "the ring did not finish in time"
            touched = []
            while self.heap and self.heap[0][0] <= t:
                _, _, f = heapq.heappop(self.heap)
                eng = self.by_mac[EthHeader.unpack(f).dst]
                assert eng.receive(f, t), "a frame of this collective was refused"
                self.delivered += 1
                touched.append(eng)
            touched += [e for e, d in deadlines.items() if d is not None and d <= t]
            for e in dict.fromkeys(touched):  # each once, in a deterministic order
                self.send(e.poll(t), t)
                deadlines[e] = e.next_deadline()
        return t


def run_ring(n, length, op, seed, drop=0.0, dup=0.0, reorder=0.0, max_payload=1484, inputs=None, log=None,
             **kw):
    macs = macs_for(n)
    inputs = make_inputs(n, length, seed) if inputs is None else inputs
    engines = [RingAllReduce(r, macs, GROUP, OP_SEQ, inputs[r], op, macs[r], TIMEOUT, max_payload, now=0.0, **kw)
               for r in range(n)]
    net = Net(engines, seed, drop, dup, reorder, log)
    net.run()
    return engines, inputs, net


# ---------------------------------------------------------------- correctness under faults
PROFILES = {  # name: (drop, duplicate, reorder)
    "clean": (0.0, 0.0, 0.0),
    "dup_reorder": (0.0, 0.1, 0.3),
    "drop5": (0.05, 0.05, 0.3),
    "drop20": (0.20, 0.05, 0.3),
}


def lengths_for(n):
    return sorted({0, 1, n - 1, 1000, 100_003})


CASES = [(n, length, op, prof) for n in (2, 3, 4, 8) for length in lengths_for(n) for op in ReduceOp
         for prof in PROFILES]


# make test-fast: every size and length as a clean and a lossy sum, every operator and profile on 3 ranks x 1000
@pytest.mark.parametrize("n,length,op,prof", sweep(
    CASES, fast=lambda n, length, op, prof: (op == ReduceOp.SUM and prof in ("clean", "drop20"))
    or (n, length) == (3, 1000), ids=lambda n, length, op, prof: f"{n}-{length}-{op.name}-{prof}"))
def test_allreduce_matches_numpy(n, length, op, prof):
    drop, dup, reorder = PROFILES[prof]
    engines, inputs, net = run_ring(n, length, op, seed_of(n, length, int(op), prof), drop, dup, reorder)
    want = expected(inputs, op)
    for e in engines:
        assert e.result_ready and e.done
        assert e.result.dtype == np.int32 and e.result.shape == (length,)
        np.testing.assert_array_equal(e.result, want)
    if drop == 0.0:  # the timeout exceeds every round trip: nothing is ever resent without loss
        assert sum(e.retransmissions for e in engines) == 0
    if dup and net.seq >= 200:  # the injector really did its job (small runs may get no duplicate)
        assert net.duplicated > 0


def test_many_fragments_per_step_under_heavy_loss():
    """3-element fragments: dozens of fragments per step arrive in any order, a fifth of them lost."""
    engines, inputs, net = run_ring(4, 1000, ReduceOp.SUM, 99, drop=0.2, dup=0.1, reorder=0.5, max_payload=12)
    assert net.dropped > 0
    for e in engines:
        np.testing.assert_array_equal(e.result, expected(inputs, ReduceOp.SUM))


def test_other_dtypes():
    """The engine is dtype-generic: int16 SUM wraps at 16 bits, float64 adds exactly on small integers."""
    ins = make_inputs(3, 500, 5, dtype=np.int16)
    engines, _, _ = run_ring(3, 500, ReduceOp.SUM, 5, drop=0.1, reorder=0.3, inputs=ins)
    want = ((np.sum(np.stack(ins).astype(np.int64), axis=0) + 2**15) % 2**16 - 2**15).astype(np.int16)
    for e in engines:
        assert e.result.dtype == np.int16
        np.testing.assert_array_equal(e.result, want)
    fl = [np.arange(300, dtype=np.float64) * (r + 1) - 7 for r in range(4)]
    engines, _, _ = run_ring(4, 300, ReduceOp.SUM, 6, drop=0.1, inputs=fl)
    for e in engines:
        np.testing.assert_array_equal(e.result, np.sum(np.stack(fl), axis=0))


def test_single_rank_is_trivially_done():
    data = np.arange(10, dtype=np.int32)
    e = RingAllReduce(0, [0x020000000001], GROUP, OP_SEQ, data, ReduceOp.SUM, 0x020000000001, TIMEOUT, now=0.0)
    assert e.done and e.result_ready and e.next_deadline() is None
    assert e.poll(0.0) == []
    np.testing.assert_array_equal(e.result, data)
    assert e.result is not data  # the engine never writes into the caller's array


def test_input_array_is_not_modified():
    ins = make_inputs(3, 50, 8)
    copies = [a.copy() for a in ins]
    run_ring(3, 50, ReduceOp.SUM, 8, inputs=ins)
    for a, c in zip(ins, copies):
        np.testing.assert_array_equal(a, c)


def test_deterministic():
    """Same calls, same arguments: byte-identical frames at identical times."""
    logs = []
    for _ in range(2):
        log = []
        run_ring(4, 3000, ReduceOp.MAX, 1234, drop=0.2, dup=0.1, reorder=0.3, log=log)
        logs.append(log)
    assert logs[0] == logs[1] and len(logs[0]) > 0


# ---------------------------------------------------------------- retransmission
def test_retransmission_happens_under_loss():
    n, length = 4, 1000
    clean, _, _ = run_ring(n, length, ReduceOp.SUM, 7)
    lossy, inputs, net = run_ring(n, length, ReduceOp.SUM, 7, drop=0.2)
    assert net.dropped > 0
    assert sum(e.retransmissions for e in lossy) > 0
    assert sum(e.frames_sent for e in lossy) > sum(e.frames_sent for e in clean)
    for e in lossy:
        np.testing.assert_array_equal(e.result, expected(inputs, ReduceOp.SUM))


def test_backoff_doubles_up_to_64x():
    """Nobody answers: the same frame goes out again after T, 2T, 4T, ... 64T, 64T, ..."""
    macs = macs_for(2)
    T = 0.5  # a power of two keeps the arithmetic exact
    e = RingAllReduce(0, macs, GROUP, OP_SEQ, np.arange(5, dtype=np.int32), ReduceOp.SUM, macs[0], T, now=0.0)
    first = e.poll(0.0)
    assert len(first) == 1
    t, gaps = 0.0, []
    for _ in range(10):
        d = e.next_deadline()
        assert e.poll(d - 1e-9) == []  # nothing before the deadline
        assert e.poll(d) == first      # the identical frame at it
        gaps.append(d - t)
        t = d
    assert gaps == [T * g for g in (1, 2, 4, 8, 16, 32, 64, 64, 64, 64)]
    assert MAX_BACKOFF == 64
    assert e.retransmissions == 10 and e.frames_sent == 11 and not e.done
    # An ACK stops the timer.
    hdr = HostHeader.unpack(first[0][14:30])
    ack = build_host_frame(HostHeader(HostKind.ACK, GROUP, OP_SEQ, hdr.step, hdr.frag, hdr.frags, 0), b"",
                           dst=macs[0], src=macs[1])
    assert e.receive(ack, t)
    assert e.next_deadline() is None and e.poll(t + 1000) == []


def test_done_waits_for_acks_after_result():
    """A rank with its result keeps retransmitting until its successor has acknowledged everything."""
    engines, inputs, net = run_ring(2, 10, ReduceOp.SUM, 3)
    macs = macs_for(2)
    a = RingAllReduce(0, macs, GROUP, OP_SEQ, inputs[0], ReduceOp.SUM, macs[0], TIMEOUT, now=0.0)
    b = RingAllReduce(1, macs, GROUP, OP_SEQ, inputs[1], ReduceOp.SUM, macs[1], TIMEOUT, now=0.0)
    fa, fb = a.poll(0.0), b.poll(0.0)
    for f in fb:
        a.receive(f, 0.0)
    for f in fa:
        b.receive(f, 0.0)
    fa2, fb2 = a.poll(0.0), b.poll(0.0)  # ACKs and the all-gather step
    for f in fb2:
        a.receive(f, 0.0)
    assert a.result_ready and not a.done  # a's all-gather DATA is not acknowledged yet
    assert a.poll(TIMEOUT)  # so it goes out again
    for f in fa2:
        b.receive(f, 0.0)
    for f in b.poll(TIMEOUT):
        a.receive(f, TIMEOUT)
    assert a.done and b.result_ready
    np.testing.assert_array_equal(a.result, engines[0].result)


# ---------------------------------------------------------------- receive side: dedup, order, filtering
def _split_data(frame):
    hdr = HostHeader.unpack(frame[14:30])
    return hdr, frame[30:30 + hdr.length]


def test_duplicate_data_is_acked_but_applied_once():
    macs = macs_for(2)
    a_in = np.array([1, 2, 3, 4, 5], dtype=np.int32)
    b_in = np.array([10, 20, 30, 40, 50], dtype=np.int32)
    a = RingAllReduce(0, macs, GROUP, OP_SEQ, a_in, ReduceOp.SUM, macs[0], TIMEOUT, max_payload=8, now=0.0)
    b = RingAllReduce(1, macs, GROUP, OP_SEQ, b_in, ReduceOp.SUM, macs[1], TIMEOUT, max_payload=8, now=0.0)
    fa = a.poll(0.0)  # step 0: block 0 = elements 0..2 in two fragments (2 + 1 elements)
    assert [_split_data(f)[0].frags for f in fa] == [2, 2]
    for f in fa:
        assert b.receive(f, 0.0)
        hdr, payload = _split_data(f)
        dup = build_host_frame(hdr, payload, dst=macs[1], src=macs[0])  # rebuilt by hand: a true duplicate
        assert dup == f
        assert b.receive(dup, 0.0)
    assert b.duplicates_received == 2
    out = b.poll(0.0)
    acks = [f for f in out if _split_data(f)[0].kind == HostKind.ACK]
    data = [f for f in out if _split_data(f)[0].kind == HostKind.DATA and _split_data(f)[0].step == 1]
    assert len(acks) == 4  # every copy is acknowledged
    assert all(len(f) == MIN_FRAME_BYTES and EthHeader.unpack(f).dst == macs[0] for f in acks)
    # b's step 1 sends its reduced block 0: a + b once, not a + 2b.
    got = np.concatenate([np.frombuffer(_split_data(f)[1], ">i4") for f in data])
    np.testing.assert_array_equal(got, (a_in + b_in)[:3])
    # And the whole collective still completes correctly.
    for f in out:
        assert a.receive(f, 0.0)
    b_frames_after(a, b)
    assert a.retransmissions == 0 and b.retransmissions == 0
    assert a.result_ready and b.result_ready
    np.testing.assert_array_equal(a.result, a_in + b_in)
    np.testing.assert_array_equal(b.result, a_in + b_in)


def b_frames_after(a, b):
    """Exchange frames between two engines, a quarter TIMEOUT per round, until both are done (no loss)."""
    t = 0.0
    for _ in range(200):
        if a.done and b.done:
            break
        fa, fb = a.poll(t), b.poll(t)
        for f in fa:
            b.receive(f, t)
        for f in fb:
            a.receive(f, t)
        t += TIMEOUT / 4
    assert a.done and b.done


def test_later_step_before_earlier_is_held_and_applied_in_order():
    """N=2: a's all-gather block (step 1) reaches b before a's reduce-scatter block (step 0)."""
    macs = macs_for(2)
    a_in = np.array([5, -7, 9, 100], dtype=np.int32)
    b_in = np.array([-1, 8, 3, 4], dtype=np.int32)
    a = RingAllReduce(0, macs, GROUP, OP_SEQ, a_in, ReduceOp.MAX, macs[0], TIMEOUT, now=0.0)
    b = RingAllReduce(1, macs, GROUP, OP_SEQ, b_in, ReduceOp.MAX, macs[1], TIMEOUT, now=0.0)
    fa0, fb0 = a.poll(0.0), b.poll(0.0)
    for f in fb0:
        a.receive(f, 0.0)
    fa1 = [f for f in a.poll(0.0) if _split_data(f)[0].kind == HostKind.DATA]
    assert [_split_data(f)[0].step for f in fa1] == [1]
    assert b.receive(fa1[0], 0.0)  # step 1 first: held
    assert not b.result_ready
    assert b.receive(fa0[0], 0.0)  # then step 0: both applied, step 0 first
    assert b.result_ready
    np.testing.assert_array_equal(b.result, np.maximum(a_in, b_in))
    b_frames_after(a, b)
    np.testing.assert_array_equal(a.result, np.maximum(a_in, b_in))


def test_foreign_frames_are_ignored():
    macs = macs_for(3)
    e = RingAllReduce(1, macs, GROUP, OP_SEQ, np.arange(9, dtype=np.int32), ReduceOp.SUM, macs[1], TIMEOUT,
                      now=0.0)
    pred, succ, me = macs[0], macs[2], macs[1]
    good = HostHeader(HostKind.DATA, GROUP, OP_SEQ, 0, 0, 1, 12)  # step 0 from rank 0 = block 0 (3 elements)
    payload = np.array([1, 2, 3], ">i4").tobytes()

    def data(hdr=good, pl=payload, dst=me, src=pred):
        return build_host_frame(hdr, pl, dst=dst, src=src)

    refused = [
        build_frame(CaisHeader(group_id=GROUP, payload_len=12), payload, dst=me, src=pred),  # a CAIS frame
        data(dst=succ),                                          # not for me (flooded unicast)
        data(src=succ),                                          # DATA not from my predecessor
        data(HostHeader(HostKind.DATA, GROUP + 1, OP_SEQ, 0, 0, 1, 12)),  # other group
        data(HostHeader(HostKind.DATA, GROUP, OP_SEQ + 1, 0, 0, 1, 12)),  # other collective
        data(HostHeader(HostKind.DATA, GROUP, OP_SEQ, 4, 0, 1, 12)),      # no step 4 in a 3-rank ring
        data(HostHeader(HostKind.DATA, GROUP, OP_SEQ, 0, 1, 1, 12)),      # frag beyond frags
        data(HostHeader(HostKind.DATA, GROUP, OP_SEQ, 0, 0, 2, 12)),      # wrong fragment count
        data(HostHeader(HostKind.DATA, GROUP, OP_SEQ, 0, 0, 1, 8), payload[:8]),  # wrong length
        data()[:40],                                             # truncated
        data(HostHeader(7, GROUP, OP_SEQ, 0, 0, 1, 12)),         # unknown kind
        build_host_frame(HostHeader(HostKind.ACK, GROUP, OP_SEQ, 0, 0, 1, 0), b"", dst=me, src=pred),  # ACK not from successor
        b"\x00" * 20,
    ]
    for f in refused:
        assert e.receive(f, 0.0) is False
    assert e.poll(0.0) and e.acks_sent == 0 and not e._got[0]
    # An ACK for a fragment never sent is consumed and changes nothing.
    before = e.next_deadline()
    assert e.receive(build_host_frame(HostHeader(HostKind.ACK, GROUP, OP_SEQ, 2, 0, 1, 0), b"", dst=me,
                                      src=succ), 0.0) is True
    assert e.next_deadline() == before
    # Padding after `length` is cut off: a 1-element fragment arrives in a 60-byte frame.
    assert e.receive(data(), 0.0) is True and e.acks_sent == 1


def test_bad_arguments():
    macs = macs_for(3)
    d = np.zeros(4, np.int32)
    with pytest.raises(ValueError):
        RingAllReduce(3, macs, 0, 0, d, ReduceOp.SUM, macs[0], TIMEOUT)
    with pytest.raises(ValueError):
        RingAllReduce(0, macs, 0, 0, d, ReduceOp.SUM, macs[1], TIMEOUT)
    with pytest.raises(ValueError):
        RingAllReduce(0, [1, 1, 2], 0, 0, d, ReduceOp.SUM, 1, TIMEOUT)
    with pytest.raises(ValueError):
        RingAllReduce(0, macs, 0, 0, d.reshape(2, 2), ReduceOp.SUM, macs[0], TIMEOUT)
    with pytest.raises(ValueError):
        RingAllReduce(0, macs, 0, 0, d, ReduceOp.SUM, macs[0], TIMEOUT, max_payload=3)
    with pytest.raises(ValueError):
        RingAllReduce(0, macs, 256, 0, d, ReduceOp.SUM, macs[0], TIMEOUT)
    e = RingAllReduce(0, macs, 0, 0, d, ReduceOp.SUM, macs[0], TIMEOUT)
    with pytest.raises(RuntimeError):
        e.result


# ---------------------------------------------------------------- the window on serialising links
class SerialNet(Net):
    """Net whose every sender has one link of ``rate`` bytes/s: a frame leaves when the sender's earlier
    frames have (a queue at the port, as at a switch's or a NIC's), then takes LATENCY to arrive. Records the
    most DATA fragments any rank ever had unacknowledged."""

    def __init__(self, engines, rate):
        super().__init__(engines, seed=0)
        self.rate, self.free_at, self.most_in_flight = rate, {}, 0

    def send(self, frames, t):
        for f in frames:
            src = EthHeader.unpack(f).src
            self.free_at[src] = max(t, self.free_at.get(src, 0.0)) + len(f) / self.rate
            heapq.heappush(self.heap, (self.free_at[src] + LATENCY, self.seq, f))
            self.seq += 1
        self.most_in_flight = max(self.most_in_flight, *(len(e._pending) for e in self.engines))


def run_serial(n, length, rate, timeout, **kw):
    macs, inputs = macs_for(n), make_inputs(n, length, seed_of("serial", n, length))
    engines = [RingAllReduce(r, macs, GROUP, OP_SEQ, inputs[r], ReduceOp.SUM, macs[r], timeout, **kw)
               for r in range(n)]
    net = SerialNet(engines, rate)
    net.run(t_limit=10.0)
    want = expected(inputs, ReduceOp.SUM)
    assert all(np.array_equal(e.result, want) for e in engines)
    return engines, net


TEN_GBE = 1.25e9             # bytes/s: a full 1514-byte fragment leaves in 1.2 us


def test_the_window_keeps_a_large_block_inside_the_timer():
    """4 ranks, 512 KiB each: every step's block is 89 full fragments, 109 us of one 10 Gb/s link, more than
    the 50 us timer. The window (default 16: 19 us of queue) sends them as ACKs free room: nothing is repeated
    and no rank ever has more than 16 unacknowledged. Sent all at once (a window larger than a block), the
    fragments at the end of the queue time out before they have left and are repeated though none was lost."""
    engines, net = run_serial(4, 131072, TEN_GBE, TIMEOUT)
    assert engines[0].window == 16 and net.most_in_flight == 16
    assert sum(e.retransmissions for e in engines) == 0
    engines, net = run_serial(4, 131072, TEN_GBE, TIMEOUT, window=1000)
    assert net.most_in_flight >= 89                   # a whole block (or more) at once
    assert sum(e.retransmissions for e in engines) > 0


def test_the_rto_backs_off_until_it_learns_the_queue():
    """At 1 Gb/s a 16-fragment window queues 194 us, past the 100 us timer: the fragments at the back of the
    first windows are repeated. The timer backs off (RFC 6298 5.5) and the next fragments, sent once, measure
    the queue: the RTO ends above it, and most fragments go out once. (A timer that never backed off would get
    no sample from a frame sent once, Karn, and repeat the back of every window: most of them.)"""
    engines, _ = run_serial(4, 131072, 1.25e8, 100e-6)
    assert min(e.timer.rto for e in engines) > 194e-6
    data_frames = sum(e.frames_sent - e.acks_sent - e.retransmissions for e in engines)
    assert 0 < sum(e.retransmissions for e in engines) < data_frames / 10


def test_a_bad_window_is_refused():
    macs = macs_for(2)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="window"):
            RingAllReduce(0, macs, 0, 0, np.zeros(4, np.int32), ReduceOp.SUM, macs[0], TIMEOUT, window=bad)


# ---------------------------------------------------------------- bytes on the wire
def expected_traffic(n, length, r, max_payload=1484, item=4):
    """(frames, bytes, payload bytes) rank r sends in a loss-free run, derived from the schedule alone."""
    sizes = [len(b) for b in np.array_split(np.zeros(length), n)]
    per = max_payload // item

    def frag_lengths(block):
        k = sizes[block]
        if k == 0:
            return [0]
        return [min(per, k - i) * item for i in range(0, k, per)]

    frames = nbytes = payload = 0
    for s in range(2 * (n - 1)):
        for ln in frag_lengths((r - s) % n):          # DATA: block (r - s) mod N to the successor
            frames += 1
            nbytes += max(MIN_FRAME_BYTES, HDR + ln)
            payload += ln
        acks = len(frag_lengths((r - 1 - s) % n))    # ACK per fragment of the predecessor's step s
        frames += acks
        nbytes += acks * MIN_FRAME_BYTES
    return frames, nbytes, payload


@pytest.mark.parametrize("n,length", [(2, 0), (2, 1), (3, 2), (4, 1000), (8, 100_003), (3, 100_003), (2, 100_003)])
def test_bytes_sent_without_loss(n, length):
    engines, _, _ = run_ring(n, length, ReduceOp.SUM, seed_of("bytes", n, length), dup=0.0, reorder=0.3)
    sizes = [len(b) * 4 for b in np.array_split(np.zeros(length), n)]
    for r, e in enumerate(engines):
        frames, nbytes, payload = expected_traffic(n, length, r)
        assert e.retransmissions == 0
        assert (e.frames_sent, e.bytes_sent) == (frames, nbytes)
        # The payload is every block twice, less the block the rank never sends in each phase.
        assert payload == 2 * 4 * length - sizes[(r + 1) % n] - sizes[(r + 2) % n]
        if length == 100_003:
            ideal = 2 * (n - 1) / n * 4 * length
            assert abs(payload - ideal) <= 2 * 4
            # 30 header bytes per DATA fragment plus a 60-byte ACK: ~6% with 1484-byte fragments
            assert ideal < e.bytes_sent < ideal * (1 + 90 / 1484 + 0.001)


def test_block_bounds_match_numpy():
    for length in (0, 1, 2, 7, 100, 1001):
        for n in (1, 2, 3, 8):
            want = [(int(b[0]), int(b[-1]) + 1) if len(b) else None for b in np.array_split(np.arange(length), n)]
            got = block_bounds(length, n)
            assert [g[1] - g[0] for g in got] == [len(b) for b in np.array_split(np.arange(length), n)]
            assert all(w is None or w == g for w, g in zip(want, got))


def test_frame_format():
    """DATA frames carry the host header, big-endian elements, go to the successor, padded to 60 bytes."""
    macs = macs_for(3)
    e = RingAllReduce(2, macs, GROUP, OP_SEQ, np.array([1, -2, 3], np.int32), ReduceOp.SUM, macs[2], TIMEOUT)
    (f,) = e.poll(0.0)  # step 0: block 2 = [3]
    eth = EthHeader.unpack(f)
    assert (eth.dst, eth.src, eth.ethertype) == (macs[0], macs[2], HOST_ETHERTYPE)
    assert HOST_ETHERTYPE != ETHERTYPE
    assert HostHeader.unpack(f[14:30]) == HostHeader(HostKind.DATA, GROUP, OP_SEQ, 0, 0, 1, 4)
    assert f[30:34] == (3).to_bytes(4, "big", signed=True)
    assert len(f) == MIN_FRAME_BYTES and f[34:] == bytes(26)


# ---------------------------------------------------------------- the switch's element types
from cais import numerics  # noqa: E402
from cais.protocol import DType  # noqa: E402
from folds import fold, ring_fold, same_bits  # noqa: E402


def float_inputs(n, length, seed, dtype):
    """Values of many magnitudes (sums round), some zeros of either sign; bf16 as uint16 bits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(length) * np.ldexp(1.0, rng.integers(-12, 12, length))
        x[rng.random(length) < 0.05] = -0.0
        x[rng.random(length) < 0.05] = 0.0
        out.append(numerics.f32_to_bf16(x.astype(np.float32)) if dtype == DType.BF16
                   else x.astype({DType.FP32: np.float32, DType.FP16: np.float16}[dtype]))
    return out


@pytest.mark.parametrize("dtype", [DType.FP32, DType.FP16, DType.BF16])
@pytest.mark.parametrize("op", list(ReduceOp))
def test_floats_reduce_in_ring_order_with_wire_rounding(dtype, op):
    """Block b is the fold of the ranks' block b in ring order from rank b, rounded to the wire type each
    step (numerics.combine with the travelling partial as the stored operand): numpy's own fold, exactly."""
    n, length = 4, 3001
    inputs = float_inputs(n, length, seed_of("ring-float", int(dtype), int(op)), dtype)
    engines, _, _ = run_ring(n, length, op, 1, drop=0.05, dup=0.05, reorder=0.3, inputs=inputs, dtype=dtype)
    want = ring_fold(inputs, op, dtype)
    for e in engines:
        assert same_bits(e.result, want)
    if op == ReduceOp.SUM:    # the order shows: the switch's port-order fold differs somewhere
        assert not same_bits(want, fold(inputs, op, dtype))


@pytest.mark.parametrize("dtype,acc_fp32", [(DType.FP32, False), (DType.FP16, False), (DType.FP16, True),
                                            (DType.BF16, False), (DType.BF16, True), (DType.INT16, False)])
@pytest.mark.parametrize("op", list(ReduceOp))
def test_reproducible_gathers_and_folds_in_rank_order(dtype, acc_fp32, op):
    n, length = 4, 777
    if dtype == DType.INT16:
        inputs = make_inputs(n, length, 5, np.int16)
    else:
        inputs = float_inputs(n, length, seed_of("ring-repro", int(dtype), int(op)), dtype)
    saturate = dtype == DType.INT16
    engines, _, _ = run_ring(n, length, op, 2, drop=0.1, dup=0.05, reorder=0.3, inputs=inputs, dtype=dtype,
                             reproducible=True, acc_fp32=acc_fp32, saturate=saturate)
    want = fold(inputs, op, dtype, acc_fp32=acc_fp32, saturate=saturate)
    for e in engines:
        assert e.steps == n - 1
        assert same_bits(e.result, want)
    # another fold order (a switch whose ports do not ascend with the ring's ranks)
    order = [2, 0, 3, 1]
    engines, _, _ = run_ring(n, length, op, 3, inputs=inputs, dtype=dtype, reproducible=True, acc_fp32=acc_fp32,
                             saturate=saturate, fold_order=order)
    want = fold([inputs[i] for i in order], op, dtype, acc_fp32=acc_fp32, saturate=saturate)
    assert all(same_bits(e.result, want) for e in engines)


def test_saturating_sums_clamp():
    inputs = [np.full(50, 30000, np.int16), np.full(50, 30000, np.int16), np.full(50, -30000, np.int16)]
    engines, _, _ = run_ring(3, 50, ReduceOp.SUM, 4, inputs=inputs, saturate=True)
    # ring order from block b: every block starts at a different rank, so the clamping differs per block
    assert same_bits(engines[0].result, ring_fold(inputs, ReduceOp.SUM, DType.INT16, saturate=True))
    assert set(engines[0].result.tolist()) == {2767, 30000}


@pytest.mark.parametrize("n,length", [(2, 10), (4, 1000), (3, 5000)])
def test_reproducible_bytes(n, length):
    """The all-gather sends every other rank's whole contribution: (N-1) D payload bytes per rank."""
    inputs = float_inputs(n, length, 9, DType.FP32)
    engines, _, _ = run_ring(n, length, ReduceOp.SUM, 5, inputs=inputs, dtype=DType.FP32, reproducible=True)
    per = 1484 // 4
    frags = -(-length // per)
    for e in engines:
        payload_frames = (n - 1) * frags
        assert e.frames_sent == 2 * payload_frames      # DATA and one ACK per fragment received
        data_bytes = (n - 1) * (4 * length + HDR * frags)
        assert e.bytes_sent == data_bytes + payload_frames * MIN_FRAME_BYTES


def test_wire_type_arguments():
    macs = macs_for(2)
    bits = np.zeros(4, np.uint16)
    with pytest.raises(TypeError, match="uint16"):
        RingAllReduce(0, macs, 0, 0, np.zeros(4, np.float32), ReduceOp.SUM, macs[0], TIMEOUT, dtype=DType.BF16)
    with pytest.raises(TypeError, match="reproducible"):
        RingAllReduce(0, macs, 0, 0, np.zeros(4, np.float64), ReduceOp.SUM, macs[0], TIMEOUT, reproducible=True)
    with pytest.raises(ValueError, match="fold_order"):
        RingAllReduce(0, macs, 0, 0, bits, ReduceOp.SUM, macs[0], TIMEOUT, dtype=DType.BF16, reproducible=True,
                      fold_order=[0, 0])
    # bf16 bits reduce as bf16, not as integers
    one = numerics.f32_to_bf16(np.ones(4, np.float32))
    engines, _, _ = run_ring(2, 4, ReduceOp.SUM, 6, inputs=[one, one], dtype=DType.BF16)
    assert np.array_equal(numerics.bf16_to_f32(engines[1].result), np.full(4, 2.0, np.float32))
