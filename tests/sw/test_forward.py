"""The deployment's host engines without I/O: :class:`cais.forward.ForwardGather` (broadcast and
all-gather forwarded by the reference model's rules, or unicast host frames) and the ring's
reduce-scatter half, under seeded loss and duplication; results against the inputs and numpy."""

import random

import numpy as np
import pytest

from cais import protocol as proto
from cais.comm import host_mac
from cais.forward import ForwardGather
from cais.params import SwitchParams
from cais.registers import register_map
from cais.ring import RingAllReduce
from cais.sim.refmodel import SwitchModel
from cais.tables import MacEntry, Rule, mac_writes, rule_writes

GROUP = 3
STEP_S = 0.001           # simulated time per round
TIMEOUT_S = 0.004


def switch(n: int) -> SwitchModel:
    params = SwitchParams(ports=max(2, n))
    model = SwitchModel(params)
    regs = register_map(params)
    writes = rule_writes(regs, 0, Rule.for_group(GROUP, contributors=(1 << n) - 1, results=(1 << n) - 1,
                                                 base=0, count_log2=2))
    for r in range(n):
        writes += mac_writes(regs, r, MacEntry(host_mac(r), r))
    for addr, value in writes:
        model.write(addr, value)
    return model


def run(engines, model, *, loss=0.0, dup=0.0, seed=0, silent=(), rounds=4000):
    """Rounds of: every engine polls, its frames cross the switch (lossy wires both ways), outputs are
    delivered. `silent` ports receive nothing (a rank that is gone)."""
    rng = random.Random(seed)
    now = 0.0
    for _ in range(rounds):
        if all(e.done for i, e in enumerate(engines) if i not in silent) or any(e.failed for e in engines):
            break
        for port, e in enumerate(engines):
            if port in silent:
                continue
            for frame in e.poll(now):
                for _copy in range(2 if rng.random() < dup else 1):
                    if rng.random() < loss:
                        continue
                    for out_port, out in model.receive(port, frame):
                        if out_port in silent or rng.random() < loss:
                            continue
                        engines[out_port].receive(out, now)
        now += STEP_S
    return now


def gather_engines(sizes, senders, via_switch, op_type, seed=1):
    rng = np.random.default_rng(seed)
    n = len(sizes)
    data = [rng.integers(0, 256, sizes[i], dtype=np.uint8).tobytes() for i in range(n)]
    macs = [host_mac(r) for r in range(n)]
    engines = [ForwardGather(r, macs, GROUP, 77, sizes, senders, data[r] if r in senders else b"",
                             chunk_bytes=200, timeout_s=TIMEOUT_S, retry_limit=20, via_switch=via_switch,
                             op_type=op_type) for r in range(n)]
    return engines, data


@pytest.mark.parametrize("via_switch", [True, False])
@pytest.mark.parametrize("loss,dup", [(0.0, 0.0), (0.1, 0.05)])
def test_all_gather_unequal_blocks(via_switch, loss, dup):
    sizes = [0, 1, 300, 1000]
    engines, data = gather_engines(sizes, range(4), via_switch, proto.OpType.ALL_GATHER)
    model = switch(4)
    run(engines, model, loss=loss, dup=dup, seed=5)
    for e in engines:
        assert e.done and not e.failed
        for i in range(4):
            assert bytes(e.blocks[i]) == data[i]
    if loss:
        assert sum(e.retransmissions for e in engines) > 0
    c = model.counters()
    # forwarded by the rule (one frame per chunk reaches every receiver) or unicast by the MAC table
    assert c["FORWARDED"] > 0
    if via_switch:
        assert c["DROP_NO_RULE"] == 0


@pytest.mark.parametrize("via_switch", [True, False])
def test_broadcast_from_a_middle_rank(via_switch):
    sizes = [0, 0, 4000, 0]
    engines, data = gather_engines(sizes, [2], via_switch, proto.OpType.BROADCAST)
    run(engines, switch(4), loss=0.05, seed=9)
    for e in engines:
        assert e.done
        assert bytes(e.blocks[2]) == data[2]
    # via the switch, the root sends each chunk once per transmission (20 chunks of 200 bytes) plus ACKs
    # answered; by unicast once per receiver
    chunks = 4000 // 200
    if via_switch:
        assert engines[2].frames_sent < 3 * chunks
    else:
        assert engines[2].frames_sent >= 3 * chunks


def test_silent_receiver_fails_and_is_named():
    sizes = [500, 0, 0]
    engines, _ = gather_engines(sizes, [0], True, proto.OpType.BROADCAST)
    engines[0].retry_limit = 6
    run(engines, switch(3), silent={2})
    assert engines[0].failed and not engines[0].done
    assert engines[0].missing == [2]
    assert engines[1].result_ready


def test_a_silence_is_counted_in_rounds_not_in_spread_deadlines():
    """Chunks sent as acknowledgements came have deadlines spread across the window. When the receiver then
    falls silent, a deadline falling due alone is not a round of repeats of its own: every chunk waiting
    waits for the next round, and the rounds back off, so the sender gives up no sooner than retry_limit
    initial timeouts after the silence. (Counting each spread deadline as a round gave up within three
    timeouts here: make cluster's all_gather failed when a rank started late.)"""
    timeout_s, limit = 0.001, 8
    sizes = [100 * 64, 0]
    macs = [host_mac(0), host_mac(1)]
    root, rx = (ForwardGather(r, macs, GROUP, 80, sizes, [0], bytes(sizes[0]) if r == 0 else b"", chunk_bytes=100,
                              timeout_s=timeout_s, retry_limit=limit, via_switch=False, window=8) for r in range(2))
    now = 0.0
    pending = root.poll(now)                       # the window's first 8 chunks
    for _ in range(24):                            # one acknowledged every 0.1 ms: the window refills one by one
        rx.receive(pending.pop(0), now)
        for ack in rx.poll(now):
            root.receive(ack, now)
        now += timeout_s / 10
        pending += root.poll(now)
    assert root.retransmissions == 0 and len(pending) == 8
    silence = now
    while not root.failed:                         # from deadline to deadline, the receiver silent
        now = root.next_deadline()
        root.poll(now)
        assert now - silence < 60, "never gave up"
    assert now - silence >= limit * timeout_s, f"gave up {now - silence:.4f} s after the silence"


def test_foreign_frames_are_ignored():
    sizes = [100, 100]
    engines, _ = gather_engines(sizes, range(2), True, proto.OpType.ALL_GATHER)
    frame = engines[0].poll(0.0)[0]
    other = ForwardGather(1, [host_mac(0), host_mac(1)], GROUP, 78, sizes, range(2), bytes(100), chunk_bytes=200,
                          timeout_s=TIMEOUT_S, retry_limit=3, via_switch=True)
    assert not other.receive(frame, 0.0)        # another collective (op_seq 78)
    assert engines[1].receive(frame, 0.0)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_ring_reduce_scatter_half(n, loss):
    m = 257
    rng = np.random.default_rng(n)
    xs = [rng.integers(-1000, 1000, n * m).astype(np.int32) for _ in range(n)]
    macs = [host_mac(r) for r in range(n)]
    engines = [RingAllReduce(r, macs, GROUP, 5, xs[r], proto.ReduceOp.SUM, macs[r], TIMEOUT_S,
                             reduce_scatter=True) for r in range(n)]
    full = [RingAllReduce(r, macs, GROUP, 6, xs[r], proto.ReduceOp.SUM, macs[r], TIMEOUT_S) for r in range(n)]
    assert engines[0].steps == n - 1 and full[0].steps == 2 * (n - 1)
    by_mac = {mac: i for i, mac in enumerate(macs)}
    rng2 = random.Random(1)
    now = 0.0
    for _ in range(3000):
        if all(e.done for e in engines):
            break
        for e in engines:
            for frame in e.poll(now):
                if rng2.random() >= loss:
                    engines[by_mac[int.from_bytes(frame[:6], "big")]].receive(frame, now)
        now += STEP_S
    total = np.sum(np.stack(xs), axis=0).astype(np.int32)
    for r, e in enumerate(engines):
        assert e.done
        b = e.owned_block
        assert b == (r + 1) % n
        np.testing.assert_array_equal(e.result[b * m:(b + 1) * m], total[b * m:(b + 1) * m])


def test_window_bounds_unacknowledged_chunks():
    sizes = [200 * 50, 0]
    engines, data = gather_engines(sizes, [0], True, proto.OpType.BROADCAST)
    engines[0].window = 8
    first = engines[0].poll(0.0)
    assert len(first) == 8                      # no more until acknowledgements come back
    assert engines[0].poll(0.0) == []
    run(engines, switch(2))
    assert engines[0].done and bytes(engines[1].blocks[0]) == data[0]
