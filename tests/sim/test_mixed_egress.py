"""Results and forwarded frames sharing every egress port, written from the documents (issue 22).

docs/interface.md: every port runs at line rate whatever the other ports do, results included; frames
leave whole (no gap inside a frame). docs/protocol.md 7.6: frames from one ingress port to one egress port
leave in arrival order; results leave in the order their sets completed; between results and forwarded
frames nothing is ordered. The load: every port contributes to every chunk (results to every port) and,
after each contribution, sends an ordinary frame to the next port (the MAC table programmed); the ports
start out of step (a first ordinary frame of a different length on each port). Every result is checked
bit for bit against numpy on every port, every forwarded frame byte for byte, each in its order; with
always-ready sinks, every frame spans exactly its beats (no gap); nothing else leaves.
"""

from __future__ import annotations

import numpy as np
import pytest

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.backends import wait_idle
from cais.sim.traffic import host_mac
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

from buildsets import DEFAULT, MANY_PORTS


def unicast(port: int, ports: int, length: int, tag: int) -> bytes:
    """An ordinary frame of ``length`` bytes from the host on ``port`` to the host on the next port."""
    eth = proto.EthHeader(host_mac((port + 1) % ports), host_mac(port), 0x0800).pack()
    return eth + bytes((tag * 7 + port + i) & 0xFF for i in range(length - len(eth)))


async def mixed_load(link, job: dict) -> list[str]:
    """Returns the problems found (none: the load did what the documents promise)."""
    params = link.params
    P, B = params.ports, params.beat_bytes
    chunks, fwd_len, payload = int(job["chunks"]), int(job["fwd_len"]), int(job.get("payload", 64))
    regs = register_map(params)
    everyone = (1 << P) - 1
    writes = rule_writes(regs, 0, Rule.for_group(1, contributors=everyone, results=everyone, base=0,
                                                 count_log2=2))
    writes += slot_clear_writes(regs, 0, 4)
    for p in range(P):
        writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    for addr, value in writes:
        await link.write(addr, value)
    rng = np.random.default_rng(int(job.get("seed", 1)))
    values = rng.integers(-2**31, 2**31, (chunks, P, payload // 4), dtype=np.int64).astype(np.int32)
    want_fwd: dict[int, list[bytes]] = {p: [] for p in range(P)}
    for p in range(P):
        if p:                                   # out of step: port p starts with p x 3 beats more
            frame = unicast(p, P, max(proto.MIN_FRAME_BYTES, 3 * p * B), 1000 + p)
            want_fwd[(p + 1) % P].append(frame)
            link.send(p, frame)
    for c in range(chunks):
        for p in range(P):
            hdr = proto.CaisHeader(group_id=1, chunk_id=c, seq_num=c, payload_len=payload)
            link.send(p, proto.build_frame(hdr, values[c, p].astype(">i4").tobytes(), src=host_mac(p), pad=True))
            frame = unicast(p, P, fwd_len, c)
            want_fwd[(p + 1) % P].append(frame)
            link.send(p, frame)
    if not await wait_idle(link, limit=link.cycle + 200 * chunks * P * params.max_frame_beats):
        return ["the switch did not drain"]
    sums = values.astype(np.int64).sum(axis=1)
    sums = ((sums + 2**31) % 2**32 - 2**31).astype(">i4")
    problems = []
    results = {p: [] for p in range(P)}
    fwd = {p: [] for p in range(P)}
    for r in link.take_stamped():
        beats = -(-len(r.data) // B)
        if not job.get("backpressure") and r.last - r.first + 1 != beats:
            problems.append(f"port {r.port}: a frame of {beats} beats over cycles {r.first}..{r.last}")
        frame = proto.parse_frame(r.data)
        if frame.cais is None:
            fwd[r.port].append(r.data)
            continue
        if not frame.cais.flags & proto.Flags.RESULT:
            problems.append(f"port {r.port}: a CAIS frame that is not a result")
            continue
        c = frame.cais.seq_num
        if c >= chunks or frame.payload != sums[c].tobytes():
            problems.append(f"port {r.port}: wrong result for chunk {c}")
        results[r.port].append(c)
    for p in range(P):
        if results[p] != list(range(chunks)):
            problems.append(f"port {p}: results of chunks {results[p]}, expected 0..{chunks - 1} in order")
        if fwd[p] != want_fwd[p]:
            problems.append(f"port {p}: {len(fwd[p])} forwarded frames, expected {len(want_fwd[p])}, "
                            f"in order and byte-exact: {'yes' if fwd[p] == want_fwd[p] else 'no'}")
    return problems


def amaranth_case(params, job, **kw):
    from cais.sim.links.amaranth import run_amaranth
    return run_amaranth(params, lambda link: mixed_load(link, job), **kw)


@pytest.mark.slow
def test_mixed_load_amaranth_backpressure():
    """amaranth.sim, 2 ports x 512 bits (few beats per frame: a short run; no float units, which the int32 load
    never uses and which are most of a 512-bit switch to simulate), results and forwarded frames, every
    sink stalling a third of the cycles: nothing lost, corrupted or reordered (the Verilator link runs the
    shortest and longest forwarded frames, on 4 and 16 ports)."""
    params = SwitchParams(ports=2, data_width=512, slots=8, max_frame=512, float_units=False)
    problems = amaranth_case(params, {"chunks": 6, "fwd_len": 300, "payload": 64, "backpressure": True},
                             backpressure=0.33, seed=3)
    assert not problems, problems


VERILATOR_SETS = {"p4_w64": DEFAULT, "p16_int": MANY_PORTS}


@pytest.mark.verilator
@pytest.mark.parametrize("pname", VERILATOR_SETS)
@pytest.mark.parametrize("fwd", ["max_frame", "min"])
def test_mixed_load_verilator(pname, fwd):
    from cais.sim.links.verilator import run_verilator
    params = VERILATOR_SETS[pname]
    fwd_len = params.max_frame if fwd == "max_frame" else proto.MIN_FRAME_BYTES
    job = {"chunks": 24, "fwd_len": fwd_len, "payload": params.max_payload}
    problems = run_verilator(params, lambda link: mixed_load(link, job))
    assert not problems, problems


@pytest.mark.verilator
def test_mixed_load_verilator_backpressure():
    from cais.sim.links.verilator import run_verilator
    params = DEFAULT
    job = {"chunks": 24, "fwd_len": 700, "payload": params.max_payload, "backpressure": True}
    problems = run_verilator(params, lambda link: mixed_load(link, job), backpressure=0.3, seed=5)
    assert not problems, problems
