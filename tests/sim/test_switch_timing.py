"""Cycle-level promises of docs/interface.md, checked on the whole switch under amaranth.sim.

Written from the document, run on the amaranth.sim link (cais.sim.links.amaranth; the default and the 2 x 512
integer switches on the Verilator link, whose builds the suite shares: ``VERILATED``): result latency
(``beats + rows + F + RESULT_OVERHEAD`` cycles from the completing contribution's last beat to the result's
first beat, F the fold chain's latency, for every kind of rule; the figures composed from the blocks' latencies
in cais.hdl.latency, which tests/hdl/test_latency.py holds the docs to), forwarding latency, whole
frames on every egress port while another port's sink holds ``tready`` low, the BUSY register's value in
every cycle, and the slot-state sweep after reset. Cycle stamps: a beat is stamped with the cycle in which
its tvalid and tready were both high (the AXI4-Lite convention of registers.md: a read accepted in cycle 0
has ``rvalid`` in cycle 4).
"""

import pytest

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.directed import accounting_problems
from cais.sim.links.amaranth import run_amaranth
from cais.sim.links.verilator import run_verilator
from cais.sim.suite import LinkHarness
from cais.sim.timing import (FORWARD_LATENCY, broadcast, contribution, documented_latency,
                             group_writes, held_port, measure_latency)
from cais.sim.traffic import TxFrame, host_mac
from cais.tables import Rule, rule_writes

from buildsets import DEFAULT, WIDE_JUMBO

# the whole switch under amaranth.sim, a few thousand cycles per second: the slow tier
pytestmark = pytest.mark.slow

INT_4x64 = SwitchParams(float_units=False)

#: Builds the suite makes anyway run on the Verilator link: a second a case, against a minute under amaranth.sim
#: for the default switch (float units: a few hundred cycles a second). The others run under amaranth.sim.
VERILATED = (DEFAULT, WIDE_JUMBO)


def runner(params):
    """run_verilator for a build of VERILATED, else run_amaranth (the same link API)."""
    return run_verilator if params in VERILATED else run_amaranth


# ----------------------------------------------------------------------------- latency
LATENCY_SETS = {
    "p4_w64": DEFAULT,
    "p4_w64_int": INT_4x64,
    "p2_w512_jumbo": WIDE_JUMBO,
    "p3_w128_int": SwitchParams(ports=3, data_width=128, slots=5, max_frame=600, float_units=False),
}


def on(pname, *rest):
    """A parametrize case of LATENCY_SETS[pname], marked verilator when it runs on that link."""
    return pytest.param(pname, *rest, marks=[pytest.mark.verilator] if LATENCY_SETS[pname] in VERILATED else [])


def latency(params, payload_len, **kind):
    """All ports but the last contribute; then the last completes the set. Returns (latency, spread) of
    the result's first beat on the ports, from the completing frame's last beat (cais.sim.timing)."""
    got = runner(params)(params, lambda link: measure_latency(link, payload_len, **kind))
    assert not got["problems"], got["problems"]
    return got["latency"], got["spread"]


# The Verilator link checks every payload size on its three builds (tests/sim/test_switch_verilator.py,
# cais.sim.timing.result_latency); here each integer build once or twice, the 158 and 119 of the
# docs in test_documented_example_latencies.
@pytest.mark.parametrize("pname, payload_len", [on("p4_w64_int", 64), on("p2_w512_jumbo", 4),
                                                on("p2_w512_jumbo", 1024), on("p3_w128_int", 64)])
def test_result_latency(pname, payload_len):
    params = LATENCY_SETS[pname]
    cycles, spread = latency(params, payload_len)
    assert spread == 0, "the result leaves on every port in the same cycle"
    assert cycles == documented_latency(params, payload_len)


@pytest.mark.verilator
def test_documented_example_latencies():
    """docs/interface.md's worked figures for a 256-byte payload at 4 x 64 bits (36 beats, 32 rows):
    36 + 32 + 56 + 34 = 158 cycles with float units (F = 4 * 13 + 4), 36 + 32 + 17 + 34 = 119 without
    (F = 4 * 4 + 1)."""
    assert latency(SwitchParams(), 256)[0] == 158
    assert latency(INT_4x64, 256)[0] == 119


@pytest.mark.parametrize("pname, payload_len, dtype, acc_fp32", [
    on("p4_w64", 48, proto.DType.INT32, False), on("p4_w64", 16, proto.DType.FP16, True),
    on("p2_w512_jumbo", 64, proto.DType.INT32, False),
])
def test_reproducible_rules_take_no_longer(pname, payload_len, dtype, acc_fp32):
    """Every rule is folded in port order: asking for reproducible results adds nothing to the latency."""
    params = LATENCY_SETS[pname]
    cycles, _ = latency(params, payload_len, reproducible=True, dtype=dtype, acc_fp32=acc_fp32)
    assert cycles == documented_latency(params, payload_len)


@pytest.mark.parametrize("pname", [on("p4_w64_int"), on("p2_w512_jumbo"), on("p3_w128_int")])
def test_forwarding_latency(pname):
    """A broadcast frame (one beat at 512 bits, several at 64) reaches every other port FORWARD_LATENCY
    cycles after its last beat, in the same cycle on each."""
    params = LATENCY_SETS[pname]
    got = {}

    async def scenario(link):
        h = LinkHarness(link)
        await link.advance(100)
        link.take_sent(), link.take_stamped()
        for size in (46, 200):
            h.send(0, broadcast(0, bytes(size)))
            await link.advance(300)
            sent, out = link.take_sent(), link.take_stamped()
            got[size] = sorted((r.port, r.first - sent[0].last) for r in out)

    runner(params)(params, scenario)
    for size, stamps in got.items():
        assert stamps == [(p, FORWARD_LATENCY) for p in range(1, params.ports)], (size, stamps)


# The forwarding latency whatever maintenance does (the reset sweep, every phase around a SLOT_CLEAR's write
# and around an aging visit: cais.sim.timing.forward_states) is checked on the Verilator link, on its three
# builds (tests/sim/test_switch_verilator.py::test_timing): a minute of amaranth.sim per build here.


# ----------------------------------------------------------------------------- a slow port
def test_slow_port_never_leaves_others_mid_frame():
    """Port 0's sink holds tready low: the other ports still receive every frame they get whole, beat after
    beat (a frame of b beats spans b cycles on an always-ready port); nothing is lost once port 0 takes
    its frames again, and the counters match the model's (cais.sim.timing.held_port). On an odd port count
    here; the Verilator regression's timing job runs the same check on its three builds (4, 2 and 16 ports)."""
    params = SwitchParams(ports=3, data_width=128, slots=5, max_frame=600, float_units=False)
    problems = run_amaranth(params, lambda link: held_port(link, 3))
    assert not problems, problems


# ----------------------------------------------------------------------------- BUSY, cycle by cycle
def test_busy_every_cycle():
    """BUSY is 1 from the cycle after a frame's first beat is accepted until the cycle in which the last beat
    of the last frame it causes leaves; 0 otherwise (also right after reset). A frame that causes nothing
    is inside until its last beat (a drop at ingress) or until its values are in its port's bank (well
    within the result latency of docs/interface.md, for a contribution that does not complete its set)."""
    params = INT_4x64
    spans = {}
    result = {}

    async def scenario(link):
        h = LinkHarness(link)

        async def one(name, port, frame, hold=None, hold_cycles=0):
            if hold is not None:
                link.set_hold(hold)
            h.send(port, frame)
            await link.advance(hold_cycles or 60)
            if hold is not None:
                link.set_hold(hold, False)
            await link.advance(200)
            sent, out = link.take_sent(), link.take_stamped()
            assert len(sent) == 1, name
            spans[name] = (sent[0].first, sent[0].last, max((r.last for r in out), default=None))

        await link.advance(200)                                      # nothing inside after reset
        await h.apply(group_writes(params, 0b0001, 0b1111)           # group 1: port 0 alone, result to all
                      + rule_writes(register_map(params), 1, Rule.for_group(2, 0b1111, 0b1111, base=1)))
        link.take_sent(), link.take_stamped()
        eth = proto.EthHeader(proto.BROADCAST_MAC, host_mac(0), 0x0800).pack()
        await one("forwarded", 0, broadcast(0, bytes(200)))
        await one("forwarded, port 2 held", 0, broadcast(0, bytes(100)), hold=2, hold_cycles=80)
        await one("result", 0, contribution(0, 0, bytes(256)))
        await one("result, port 3 held", 0, contribution(0, 1, bytes(8)), hold=3, hold_cycles=50)
        await one("ingress drop", 1, TxFrame(eth[:12] + b"\x88\xb5" + bytes(40)))     # BAD_LENGTH
        await one("partial contribution", 1, contribution(1, 0, bytes(256), group=2))
        result["counters"] = await h.counters()
        result["trace"] = link.busy_trace[link.start_cycle:]

    run_amaranth(params, scenario, trace_busy=True)
    trace = result["trace"]
    assert not any(trace[:200]), "BUSY with nothing inside after reset"
    bound = documented_latency(params, 256)
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
    assert len(spans) == 6
    assert not accounting_problems(result["counters"])


def test_reset_sweep_holds_cais_frames_only():
    """For the first `slots` cycles after reset the slot state is being cleared: an ordinary frame is
    forwarded at once, an all-reduce frame waits at the core until cycle `slots`, and BUSY shows only the
    frames. Cycles here count from cycle 0, the first with ``rst`` low (docs/interface.md): the link's
    cycles, as it starts there (``settle=0``)."""
    params = SwitchParams(slots=1024, float_units=False)
    out = {}

    async def scenario(link):
        h = LinkHarness(link)
        await h.apply(group_writes(params, 0b0001, 0b0010))
        h.send(2, broadcast(2, bytes(100)))
        await link.advance(50)
        h.send(0, contribution(0, 0, bytes(64)))
        await h.drain()
        sent = {s.port: (s.first, s.last) for s in h.sent}
        got = {r.port: r.first for r in h.log}
        out.update(sent=sent, got=got, trace=link.busy_trace[link.start_cycle:])

    run_amaranth(params, scenario, trace_busy=True, settle=0)
    first_in = out["sent"][0][0]
    assert first_in < 300, "the test must send during the sweep"
    fwd_first_in = out["sent"][2][0]
    assert out["got"][0] < params.slots, "the ordinary frame is forwarded during the sweep"
    result_first = out["got"][1]
    assert params.slots <= result_first <= params.slots + documented_latency(params, 64)
    assert not any(out["trace"][:min(fwd_first_in, first_in) + 1]), "BUSY before any frame arrived"
    assert all(out["trace"][first_in + 1:result_first + 1]), "the waiting frame is inside: BUSY"
