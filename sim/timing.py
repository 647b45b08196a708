"""The switch's documented cycle figures and the scenarios that check them: the amaranth.sim white-box tests
(tests/sim/test_switch_timing.py) use the figures and scenarios; :func:`timing_job` checks them on any link.

The figures are docs/interface.md's, composed from the blocks' latencies in :mod:`cais.hdl.latency` (and
re-exported here): result latency ``beats + rows + F + RESULT_OVERHEAD`` cycles (one more when the last
payload row starts in the frame's last beat) from the completing contribution's last beat to the result's
first beat, where ``F`` is the fold chain's latency (:attr:`SwitchParams.fold_latency`), the same for every
kind of rule; ``FORWARD_LATENCY`` from a forwarded frame's last beat to its first beat out.
"""

from __future__ import annotations

import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, register_map
from cais.tables import Rule, rule_writes, slot_clear_writes

from ..hdl import latency as switch_latency
from ..hdl.latency import FORWARD_LATENCY, RESULT_OVERHEAD, frame_beats
from .traffic import Scenario, TxFrame, compare, host_mac, replay

__all__ = ["frame_beats", "documented_latency", "RESULT_OVERHEAD", "FORWARD_LATENCY", "contribution", "broadcast", "group_writes",
           "held_port_scenario", "forward_states", "timing_job"]

def documented_latency(params: SwitchParams, payload_len: int) -> int:
    """Cycles from the completing contribution's last beat to the result's first beat (docs/interface.md,
    :func:`cais.hdl.latency.result_latency`): the lane streams the frame into its bank, the fold reads
    every row, then the frame leaves."""
    return switch_latency.result_latency(params, payload_len)


def contribution(port: int, seq: int, payload: bytes, group: int = 1,
                 dtype: proto.DType = proto.DType.INT32) -> TxFrame:
    """An all-reduce frame (SUM) from the host on ``port``, padded to 60 bytes if shorter."""
    hdr = proto.CaisHeader(op_type=proto.OpType.ALL_REDUCE, group_id=group, seq_num=seq,
                           payload_len=len(payload), dtype=dtype)
    return TxFrame(proto.build_frame(hdr, payload, src=host_mac(port), pad=True))


def broadcast(port: int, body: bytes) -> TxFrame:
    """An ordinary (non-CAIS) frame to the broadcast MAC from the host on ``port``."""
    return TxFrame(proto.EthHeader(proto.BROADCAST_MAC, host_mac(port), 0x0800).pack() + body)


def group_writes(params: SwitchParams, contributors: int, results: int, *, group: int = 1, entry: int = 0,
                 base: int = 0, count_log2: int = 0, **kind) -> list[tuple[int, int]]:
    """Rule ``entry`` for ``group`` (``kind``: RULE_TYPE fields) and SLOT_CLEAR of its quota."""
    regs = register_map(params)
    rule = Rule.for_group(group, contributors=contributors, results=results, base=base, count_log2=count_log2,
                          **kind)
    return rule_writes(regs, entry, rule) + slot_clear_writes(regs, base, 1 << count_log2)


def held_port_scenario(params: SwitchParams, seed: int):
    """Frames that go to port 0 and to others while port 0's sink is held: four longest broadcast frames
    from port 1, and the results of four chunks (each in its own slot) of a group whose contributors are
    every port but 0 and whose results go to every port. Returns the :class:`Scenario`, and the reference
    model after it with the frames it sends per port (:func:`cais.sim.traffic.replay`; the outcome does not
    depend on how the ports interleave)."""
    P = params.ports
    allp = (1 << P) - 1
    rng = np.random.default_rng(seed)
    scen = Scenario(params, group_writes(params, allp & ~1, allp, count_log2=2), [[] for _ in range(P)])
    for k in range(4):
        scen.frames[1].append(broadcast(1, rng.integers(0, 256, params.max_frame - 14, dtype=np.uint8).tobytes()))
        for p in range(1, P):
            scen.frames[p].append(contribution(p, k, rng.integers(0, 256, 64, dtype=np.uint8).tobytes()))
    model, expected = replay(scen)
    return scen, model, expected


# ----------------------------------------------------------------------------- checks on any link
# Entry point timing_job(link, job): the cycle-level promises on a link (the C++-driven one in
# tests/sim/test_switch_verilator.py). Cycle stamps come from the link: a beat is stamped with the cycle in
# which its tvalid and tready were both high, a register read with the cycle its address was accepted.


async def measure_latency(link, payload_len: int, reproducible: bool = False,
                          dtype: proto.DType = proto.DType.INT32, **kind) -> dict:
    """From reset: every port but the last contributes to chunk 0 of a group of all ports, the switch
    drains, then the last port completes the set. Returns the stamps and the problems found. ``dtype`` and
    ``kind`` (acc_fp32, ...) type the rule."""
    from .suite import LinkHarness

    params = link.params
    P = params.ports
    allp = (1 << P) - 1
    rng = np.random.default_rng(payload_len + 1000 * reproducible)
    await link.reset()
    h = LinkHarness(link)
    frames = [contribution(p, 0, rng.integers(0, 256, payload_len, dtype=np.uint8).tobytes(), dtype=dtype)
              for p in range(P)]
    writes = group_writes(params, allp, allp, reproducible=reproducible, dtype=dtype, **kind)
    scen = Scenario(params, writes, [[f] for f in frames])
    _, expected = replay(scen)
    await h.apply(scen.writes)
    for p in range(P - 1):
        h.send(p, frames[p])
    await h.drain()
    before = len(h.log)
    h.send(P - 1, frames[P - 1])
    await h.drain()
    problems = compare(expected, h.rx)
    new = h.log[before:]
    if sorted(r.port for r in new) != list(range(P)):
        problems.append(f"egress frames after the completing contribution on ports {[r.port for r in new]}, "
                        f"expected one result per port")
    if not all(len(e) == 1 for e in expected):
        problems.append(f"the model expects {[len(e) for e in expected]} results: the scenario is wrong")
    if problems:
        return {"problems": problems}
    last_in = h.sent[-1].last
    firsts = [r.first for r in new]
    return {"problems": [], "last_in": last_in, "firsts": firsts,
            "latency": min(firsts) - last_in, "spread": max(firsts) - min(firsts)}


async def result_latency(link, seed: int) -> list[str]:
    """beats + rows + F + RESULT_OVERHEAD cycles from the completing contribution's last beat to the result's first
    beat, on every port in the same cycle, for reproducible rules as for the others."""
    params = link.params
    B = params.beat_bytes
    cases = [(n, False) for n in sorted({4, 64, params.max_payload})]
    capacity = params.max_payload
    cases += [(n, True) for n in sorted({capacity, B})]
    failed = []
    for payload_len, reproducible in cases:
        got = await measure_latency(link, payload_len, reproducible)
        name = f"payload {payload_len}{' reproducible' if reproducible else ''}"
        if got["problems"]:
            failed.append(f"{name}: " + "; ".join(got["problems"]))
            continue
        want = documented_latency(params, payload_len)
        if got["spread"] != 0:
            failed.append(f"{name}: the result's first beat leaves in different cycles: {got['firsts']}")
        if got["latency"] != want:
            failed.append(f"{name}: latency {got['latency']} cycles, documented {want}")
    return failed


async def held_port(link, seed: int) -> list[str]:
    """Port 0's sink holds tready low: frames multicast to port 0 and others leave the others whole."""
    from .suite import LinkHarness

    params = link.params
    P = params.ports
    scen, model, expected = held_port_scenario(params, seed)
    await link.reset()
    h = LinkHarness(link)
    await h.apply(scen.writes)
    link.set_hold(0, True)
    for port, frames in enumerate(scen.frames):
        for frame in frames:
            h.send(port, frame)
    hold = 2000 + 8 * params.max_frame_beats
    await link.advance(hold)
    held_frames = h.collect()
    link.set_hold(0, False)
    await h.drain()
    problems = []
    held = [sum(1 for r in held_frames if r.port == p) for p in range(P)]
    if held[0]:
        problems.append(f"port 0 received {held[0]} frames while its sink held tready low")
    if sum(held[1:]) == 0:
        problems.append("the other ports received nothing while port 0 was held: the test shows nothing")
    # Every sink but port 0's is always ready: a whole frame of b beats spans exactly b cycles.
    for r in h.log:
        beats = -(-len(r.data) // params.beat_bytes)
        if r.port and r.last - r.first + 1 != beats:
            problems.append(f"port {r.port}: a frame of {beats} beats over cycles {r.first}..{r.last}")
    problems += compare(expected, h.rx)
    problems += (await h.check_counters(model))[1]
    return problems


async def busy_register(link, seed: int) -> list[str]:
    """BUSY reads 1 from the cycle after a frame's first beat is accepted until the cycle in which the last
    beat of the last frame it causes is accepted; 0 otherwise, also right after reset.

    BUSY is read back to back while single frames pass; a read returns the value of the cycle after its
    address was accepted. Each frame starts at every phase against the read stream (0..7 cycles into it),
    so that reads land on both edges of every interval (checked)."""
    from .directed import accounting_problems
    from .suite import LinkHarness

    params = link.params
    P = params.ports
    allp = (1 << P) - 1
    busy = register_map(params)["BUSY"].address()
    reads: list[tuple[int, int]] = []

    async def poll(until: int) -> None:
        while link.cycle < until:
            value = await link.read_switch(busy)
            reads.append((link.read_accepted, value))

    await link.reset()
    await poll(params.slots + 200)
    problems = [f"read accepted in cycle {a} after reset (before any traffic): BUSY {v}" for a, v in reads if v]
    h = LinkHarness(link)
    await h.apply(group_writes(params, 0b0001, allp))                   # group 1: port 0 alone, results to all
    held = min(2, P - 1)
    scenarios = [       # name, port, frame factory (seq), held sink, hold cycles, egress frames expected
        ("forwarded", 0, lambda seq: broadcast(0, bytes(200)), None, 0, P - 1),
        ("forwarded, port held", 0, lambda seq: broadcast(0, bytes(100)), held, 80, P - 1),
        ("result", 0, lambda seq: contribution(0, seq, bytes(params.max_payload)), None, 0, P),
        ("result, port held", 0, lambda seq: contribution(0, seq, bytes(8)), P - 1, 50, P),
    ]
    reads.clear()
    intervals = []   # (first_in, last_out, name)
    seq = 0
    for name, port, make, hold, hold_cycles, outs in scenarios:
        for phase in range(8):
            await poll(link.cycle + 20)
            link.take_sent(), link.take_stamped()
            # the frame starts, and a held sink is released, `phase` cycles into the read stream that
            # goes on meanwhile
            start = link.cycle + 1 + phase
            if hold is not None:
                link.set_hold(hold, until=start + hold_cycles)
            link.send(port, make(seq).data, not_before=start)
            seq += 1
            # long enough for the longest frame in, a full-size result's latency (docs/interface.md) and
            # the result's beats out (132 of them at a 1,024-byte max_payload)
            await poll(link.cycle + params.max_frame_beats + documented_latency(params, params.max_payload)
                       + params.result_frame_beats + 60)
            sent, out = link.take_sent(), link.take_stamped()
            if len(sent) != 1 or len(out) != outs:
                problems.append(f"{name}, phase {phase}: {len(sent)} frames in, {len(out)} out "
                                f"(expected 1 in, {outs} out)")
                continue
            intervals.append((sent[0].first, max(r.last for r in out), name))

    def expected(cycle: int) -> int:
        return int(any(first < cycle <= last for first, last, _ in intervals))

    for accept, value in reads:
        if value != expected(accept + 1):
            near = [(f, last, n) for f, last, n in intervals if f - 10 <= accept <= last + 10]
            problems.append(f"read accepted in cycle {accept}: BUSY {value}, expected {expected(accept + 1)} "
                            f"(frames near: {near})")
    # Every interval edge must have been sampled, or an off-by-one would pass unseen.
    for name in dict.fromkeys(n for _, _, n in intervals):
        mine = [(f, last) for f, last, n in intervals if n == name]
        at_first = {a + 1 - f for a, _ in reads for f, _ in mine}
        at_last = {a + 1 - last for a, _ in reads for _, last in mine}
        if {0, 1} - at_first or {0, 1} - at_last:
            problems.append(f"{name}: no read sampled the cycles first_in+{sorted({0, 1} - at_first)} / "
                            f"last_out+{sorted({0, 1} - at_last)}: the test cannot see an off-by-one there")
    problems += accounting_problems(await h.counters())
    return problems


#: The age units of AGING count from cycle 0 after reset (docs/interface.md): unit n starts in cycle n x 1024.
#: The phases (last beat in, relative to a unit's start) of forward_states' frames around an aging visit.
AGING_PHASES = range(-12, 6)
#: The phases (first beat in, relative to the cycle a SLOT_CLEAR write starts) of its frames.
CLEAR_PHASES = range(-16, 8)
#: Frames sent from reset: the first beats of its frames come in cycles 0 .. SWEEP_FRAMES - 1 after reset.
SWEEP_FRAMES = 6


async def forward_states(link, seed: int) -> list[str]:
    """A lone 60-byte broadcast leaves on every other port exactly FORWARD_LATENCY cycles after its last beat
    in, whatever the decision's maintenance does (docs/interface.md: ordinary frames are forwarded during
    the reset sweep, a SLOT_CLEAR and aging visits): sent right after reset (its header decided during the
    sweep), at every phase around a SLOT_CLEAR's write, and at every phase around the start of an age unit
    with AGING.age 1 (a visit in every unit). Each frame goes alone (its lane and ports are free)."""
    params = link.params
    P = params.ports
    regs = register_map(params)
    beats = frame_beats(params, 0)
    problems: list[str] = []
    for p in range(P):                  # every sink ready (an earlier test may have held one)
        link.set_hold(p, False)

    def send(port: int, not_before: int) -> None:
        link.send(port, broadcast(port, bytes(proto.MIN_FRAME_BYTES - proto.ETH_HEADER_BYTES)).data,
                  not_before=not_before)

    def check(what: str, port: int) -> int | None:
        """The one frame sent since the last check left every other port FORWARD_LATENCY after its last beat
        in; returns that last beat's cycle."""
        sent, out = link.take_sent(), link.take_stamped()
        if len(sent) != 1:
            problems.append(f"{what}: {len(sent)} frames went in, expected 1")
            return None
        got = sorted((r.port, r.first - sent[0].last) for r in out)
        want = [(p, FORWARD_LATENCY) for p in range(P) if p != port]
        if got != want:
            problems.append(f"{what}: (port, first beat out - last beat in) {got}, expected {want}")
        return sent[0].last

    async def one(what: str, port: int, not_before: int) -> int | None:
        send(port, not_before)
        await link.advance(max(0, not_before - link.cycle) + 2 * beats + FORWARD_LATENCY + 8)
        return check(what, port)

    # The reset sweep: slot s is cleared in cycle s; the header comes to the decision a few cycles after
    # the frame's last beat.
    for k in range(SWEEP_FRAMES):
        await link.reset(settle=0)
        last = await one(f"sent {k} cycles after reset", k % P, k)
        if last is not None and last + 4 >= params.slots:
            problems.append(f"sent {k} cycles after reset: the last beat in cycle {last} is too late for the "
                            f"{params.slots}-cycle sweep: the test shows nothing")
    # A SLOT_CLEAR written around the frame.
    await link.reset()
    addr, value = slot_clear_writes(regs, 0, 1)[0]
    for k in CLEAR_PHASES:
        start = link.cycle + 2 * len(CLEAR_PHASES)
        send(k % P, start + k)
        await link.advance(start - link.cycle)
        await link.write(addr, value)
        await link.advance(2 * beats + FORWARD_LATENCY + 8)
        check(f"first beat in {k} cycles from a SLOT_CLEAR write", k % P)
    # Aging visits: one per age unit, from cycle 0 after reset; a frame in each unit, its last beat
    # ``phase`` cycles from the unit's start.
    await link.reset(settle=0)
    await link.write(regs["AGING"].address(), regs["AGING"].pack(age=1))
    unit = 1 << AGE_UNIT_LOG2
    for n, phase in enumerate(AGING_PHASES):
        start = (n + 1) * unit
        await one(f"last beat {phase} cycles from the start of age unit {n + 1} (AGING.age 1)", n % P,
                  start + phase - (beats - 1))
        if link.cycle >= start + unit + min(AGING_PHASES) - beats:
            problems.append(f"age unit {n + 1}: the frame ended too late for the next unit's phase")
    return problems


async def timing_job(link, job: dict) -> dict:
    """Entry point: ``job["tests"]`` (default all) of result_latency, held_port, busy_register and
    forward_states, seeded by ``job["seed"]``; returns the problems found per test."""
    tests = {"result_latency": result_latency, "held_port": held_port, "busy_register": busy_register,
             "forward_states": forward_states}
    names = job.get("tests", list(tests))
    return {name: await tests[name](link, int(job.get("seed", 0))) for name in names}
