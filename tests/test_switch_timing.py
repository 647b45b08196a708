"""Cycle-level promises of docs/interface.md, checked on the whole switch under amaranth.sim.

Written from the document: result latency (``beats + 9 + L`` cycles from the completing contribution's last
beat to the result's first beat, plus ``rows + (n - 1) * max(rows, L)`` for a reproducible fold), whole
frames on every egress port while another port's sink holds ``tready`` low, the BUSY register's value in
every cycle, and the slot-state sweep after reset. Cycle stamps: a beat is stamped with the cycle in which
its tvalid and tready were both high (the AXI4-Lite convention of registers.md: a read accepted in cycle 0
has ``rvalid`` in cycle 3).
"""

import numpy as np
import pytest

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.amaranth_harness import SwitchSim
from cais.sim.directed import accounting_problems, counter_problems
from cais.sim.timing import (alu_latency, broadcast, contribution, documented_latency, frame_beats, group_writes,
                             held_port_scenario)
from cais.sim.traffic import TxFrame, compare, host_mac
from cais.tables import Rule, rule_writes

INT_4x64 = SwitchParams(float_units=False)


# ----------------------------------------------------------------------------- latency
LATENCY_SETS = {
    "p4_w64": SwitchParams(),
    "p4_w64_int": INT_4x64,
    "p2_w512_int": SwitchParams(ports=2, data_width=512, slots=16, float_units=False),
    "p3_w128_int": SwitchParams(ports=3, data_width=128, slots=5, max_frame=600, float_units=False),
}


def measure_latency(params, payload_len, **kind):
    """All ports but the last contribute; then the last completes the set. Returns (latency, spread) of
    the result's first beat on the ports, from the completing frame's last beat."""
    P = params.ports
    allp = (1 << P) - 1
    rng = np.random.default_rng(payload_len)
    out = {}

    async def scenario(s):
        await s.apply(group_writes(params, allp, allp, **kind))
        for p in range(P - 1):
            s.send(p, contribution(p, 0, rng.integers(0, 256, payload_len, dtype=np.uint8).tobytes(),
                                   dtype=kind.get("dtype", proto.DType.INT32)))
        await s.drain()
        s.send(P - 1, contribution(P - 1, 0, bytes(payload_len), dtype=kind.get("dtype", proto.DType.INT32)))
        await s.drain()
        last_in = s.tx_times[P - 1][-1][1]
        firsts = [s.rx_times[p][-1][0] for p in range(P)]
        out["latency"], out["spread"] = min(firsts) - last_in, max(firsts) - min(firsts)

    SwitchSim(params).run(scenario)
    return out["latency"], out["spread"]


@pytest.mark.parametrize("pname", LATENCY_SETS)
@pytest.mark.parametrize("payload_len", [4, 64, 256])
def test_result_latency(pname, payload_len):
    params = LATENCY_SETS[pname]
    latency, spread = measure_latency(params, payload_len)
    assert spread == 0, "the result leaves on every port in the same cycle"
    assert latency == documented_latency(params, payload_len)


def test_documented_example_latencies():
    """docs/interface.md's worked figures: 49 / 45 cycles for a 256-byte payload at 64 bits."""
    assert measure_latency(SwitchParams(), 256)[0] == 49
    assert measure_latency(INT_4x64, 256)[0] == 45


@pytest.mark.parametrize("pname, payload_len, dtype, acc_fp32", [
    ("p4_w64", 8, proto.DType.INT32, False), ("p4_w64", 48, proto.DType.INT32, False),
    ("p4_w64_int", 16, proto.DType.INT32, False), ("p4_w64", 16, proto.DType.FP16, True),
    ("p2_w512_int", 64, proto.DType.INT32, False),
])
def test_reproducible_fold_latency(pname, payload_len, dtype, acc_fp32):
    """A reproducible rule adds its fold: rows + (n - 1) * max(rows, L) cycles (n contributors, rows of the
    payload in the set: one per B bytes of payload)."""
    params = LATENCY_SETS[pname]
    latency, _ = measure_latency(params, payload_len, reproducible=True, dtype=dtype, acc_fp32=acc_fp32)
    assert latency == documented_latency(params, payload_len, reproducible=True)


# ----------------------------------------------------------------------------- a slow port
@pytest.mark.parametrize("params", [INT_4x64, SwitchParams(ports=3, data_width=128, slots=5, max_frame=600,
                                                           float_units=False)], ids=["p4_w64", "p3_w128"])
def test_slow_port_never_leaves_others_mid_frame(params):
    """Port 0's sink holds tready low: the other ports still receive every frame they get whole, beat after
    beat (no cycle inside a frame without tvalid while they are ready); nothing is lost once port 0 takes
    its frames again."""
    P = params.ports
    scen, model, expected = held_port_scenario(params, 3)
    sim = SwitchSim(params)
    result = {}

    async def scenario(s):
        await s.apply(scen.writes)
        s.hold.add(0)
        for port, frames in enumerate(scen.frames):
            for frame in frames:
                s.send(port, frame)
        for _ in range(3000):
            await s.ctx.tick()
        result["held"] = [len(rx) for rx in s.rx]
        s.hold.discard(0)
        await s.drain()
        result["counters"] = await s.counters()

    sim.run(scenario)
    assert result["held"][0] == 0
    assert result["held"][2] > 0, "the other ports received frames while port 0 was held"
    assert sim.gaps[1:] == [0] * (P - 1), f"cycles without tvalid inside a frame: {sim.gaps}"
    assert not compare(expected, sim.rx)
    assert not counter_problems(result["counters"], model.counters())
    assert not accounting_problems(result["counters"])


# ----------------------------------------------------------------------------- BUSY, cycle by cycle
def test_busy_every_cycle():
    """BUSY is 1 from the cycle after a frame's first beat is accepted until the cycle in which the last beat
    of the last frame it causes leaves; 0 otherwise (also right after reset). A frame that causes nothing
    is inside until its last beat (a drop at ingress) or until its values are in the slot memory (at most
    beats + 9 + L cycles after its last beat, for a contribution that does not complete its set)."""
    params = INT_4x64
    P = params.ports
    sim = SwitchSim(params, trace_busy=True)
    spans = {}

    async def settle(s, n=100):
        for _ in range(n):
            await s.ctx.tick()

    async def one(s, name, port, frame, hold=None, hold_cycles=0):
        if hold is not None:
            s.hold.add(hold)
        before = [len(t) for t in s.rx_times]
        s.send(port, frame)
        await settle(s, hold_cycles or 60)
        s.hold.discard(hold if hold is not None else -1)
        await settle(s)
        first_in, last_in = s.tx_times[port][-1]
        outs = [t for p in range(P) for t in s.rx_times[p][before[p]:]]
        spans[name] = (first_in, last_in, max((t[1] for t in outs), default=None))

    async def scenario(s):
        await settle(s, 200)                                       # nothing inside after reset
        await s.apply(group_writes(params, 0b0001, 0b1111)         # group 1: port 0 alone, result to all
                      + rule_writes(register_map(params), 1, Rule.for_group(2, 0b1111, 0b1111, base=1)))
        eth = proto.EthHeader(proto.BROADCAST_MAC, host_mac(0), 0x0800).pack()
        await one(s, "forwarded", 0, broadcast(0, bytes(200)))
        await one(s, "forwarded, port 2 held", 0, broadcast(0, bytes(100)), hold=2, hold_cycles=80)
        await one(s, "result", 0, contribution(0, 0, bytes(256)))
        await one(s, "result, port 3 held", 0, contribution(0, 1, bytes(8)), hold=3, hold_cycles=50)
        await one(s, "ingress drop", 1, TxFrame(eth[:12] + b"\x88\xb5" + bytes(40)))     # BAD_LENGTH
        await one(s, "partial contribution", 1, contribution(1, 0, bytes(256), group=2))
        result["counters"] = await s.counters()

    result = {}
    sim.run(scenario)
    trace = sim.busy_trace
    assert not any(trace[:200]), "BUSY with nothing inside after reset"
    bound = frame_beats(params, 256) + 9 + alu_latency(params)
    for name, (first_in, last_in, last_out) in spans.items():
        window = trace[first_in - 5:first_in + 1]
        assert not any(window), f"{name}: BUSY before the first beat: {window}"
        if last_out is not None:
            assert all(trace[first_in + 1:last_out + 1]), f"{name}: BUSY fell while inside"
            assert not any(trace[last_out + 1:last_out + 40]), f"{name}: BUSY after the last beat left"
        else:
            assert all(trace[first_in + 1:last_in + 1]), f"{name}: BUSY fell while the frame arrived"
            after = trace[last_in + 1:last_in + 60]
            assert 0 in after and after.index(0) <= bound, f"{name}: BUSY stays: {after}"
            assert not any(after[after.index(0):]), f"{name}: BUSY rose again"
    assert not accounting_problems(result["counters"])


def test_reset_sweep_holds_cais_frames_only():
    """For the first `slots` cycles after reset the slot state is being cleared: an ordinary frame is
    forwarded at once, an all-reduce frame waits at the core until cycle `slots`, and BUSY shows only the
    frames."""
    params = SwitchParams(slots=1024, float_units=False)
    sim = SwitchSim(params, trace_busy=True)
    out = {}

    async def scenario(s):
        await s.apply(group_writes(params, 0b0001, 0b0010))
        s.send(2, broadcast(2, bytes(100)))
        for _ in range(50):
            await s.ctx.tick()
        s.send(0, contribution(0, 0, bytes(64)))
        await s.drain()
        out["start"] = s.tx_times[0][0][0]

    sim.run(scenario)
    assert out["start"] < 300, "the test must send during the sweep"
    fwd_first_in = sim.tx_times[2][0][0]
    assert sim.rx_times[0][0][0] < params.slots, "the ordinary frame is forwarded during the sweep"
    first_in, last_in = sim.tx_times[0][0]
    result_first = sim.rx_times[1][-1][0]
    assert params.slots <= result_first <= params.slots + frame_beats(params, 64) + 9
    assert not any(sim.busy_trace[:min(fwd_first_in, first_in) + 1]), "BUSY before any frame arrived"
    assert all(sim.busy_trace[first_in + 1:result_first + 1]), "the waiting frame is inside: BUSY"
