"""cocotb tests of the exported switch (``cais_switch``) under Verilator.

Run through the pytest wrappers in ``tests/test_switch_cocotb.py`` (which pass the build parameters in
``CAIS_PARAMS``). Every test scores what the switch sent against an independent expectation, per port as
a multiset of frames, and compares every counter with the reference model :class:`SwitchModel`:

* ``test_directed``: the directed protocol cases of :func:`cais.sim.directed.directed_cases`, batch by batch.
* ``test_directed_idle_backpressure``: the same under idle insertion on the sources and back-pressure on
  the sinks (``itertools.cycle([1, 1, 1, 0])``, as the verilog-axis testbenches do).
* ``test_all_ports_random_payloads``: random full and partial all-reduce payloads (SUM, MAX, MIN) from
  every port at once, each chunk in its own slot set; results checked against numpy.
* ``test_random_mix``: a long :func:`cais.sim.traffic.random_mix` under random idle and back-pressure.
"""

from __future__ import annotations

import random
import time

import cocotb
import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.directed import Case, accounting_problems, counter_problems, directed_cases, score_case
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import TxFrame, compare, host_mac, random_mix, replay
from cais.tables import Rule, rule_writes, slot_clear_writes

from .switch_tb import TB, cycle_pattern, random_pattern


async def run_case(tb: TB, case: Case) -> list[str]:
    """One directed case from reset; returns the problems found (empty: the case passed)."""
    await tb.reset()
    return await score_case(tb, tb.params, case)


async def run_directed(dut, idle=None, backpressure=None) -> None:
    tb = TB(dut)
    await tb.start()
    tb.set_idle_generator(idle)
    tb.set_backpressure_generator(backpressure)
    seed = cocotb.RANDOM_SEED    # COCOTB_RANDOM_SEED combined with the test's name: reproducible
    tb.log.info("seed %d", seed)
    cases = directed_cases(tb.params, seed=seed)
    failed = []
    t0 = time.monotonic()
    for case in cases:
        try:
            problems = await run_case(tb, case)
        except AssertionError as exc:   # a drain timeout or a bad register response: report, go on
            problems = [f"aborted: {exc}"]
        if problems:
            failed.append(f"{case.name}: " + "; ".join(problems))
            tb.log.error("case %s FAILED: %s", case.name, "; ".join(problems))
        else:
            tb.log.info("case %s passed", case.name)
    tb.log.info("%d directed cases in %.1f s, %d drain cycles", len(cases), time.monotonic() - t0,
                tb.cycles_drained)
    assert not failed, f"{len(failed)} of {len(cases)} directed cases failed (seed {seed}):\n" + "\n".join(failed)


@cocotb.test()
async def test_directed(dut):
    """Every directed case, scored batch by batch against the reference model."""
    await run_directed(dut)


@cocotb.test()
async def test_directed_idle_backpressure(dut):
    """The directed cases with idle cycles on every source and back-pressure on every sink."""
    await run_directed(dut, idle=cycle_pattern([1, 1, 1, 0]), backpressure=cycle_pattern([1, 1, 1, 0]))


# ---------------------------------------------------------------------------------------------------------------


def _reduce(op: proto.ReduceOp, values: np.ndarray) -> np.ndarray:
    """values[port, element] (int64 holding int32) reduced over the ports, as int32; SUM wraps."""
    if op == proto.ReduceOp.SUM:
        return (values.sum(axis=0) & 0xFFFF_FFFF).astype(np.uint32).view(np.int32)
    if op == proto.ReduceOp.MAX:
        return values.max(axis=0).astype(np.int32)
    return values.min(axis=0).astype(np.int32)


@cocotb.test()
async def test_all_ports_random_payloads(dut):
    """All-reduce chunks from every port at once: random ops, full and partial payloads, numpy results.

    Three rules cover every port, one per operator (a chunk's layer_id names its operator's rule); they
    share a quota of `count` slots (up to 64). Round r sends the chunks
    seq r*count .. r*count+count-1, one per slot, all in set r % 2; even rounds at full speed, odd rounds
    under random idle and back-pressure; at least 128 chunks over at least two rounds. Within a round each
    port sends its contributions in its own random order, and the round drains before the next starts
    (the driver's window rule). Each port must receive exactly one result per chunk, equal to the
    reduction numpy computes, from the programmed switch MAC.
    """
    tb = TB(dut)
    await tb.start()
    params: SwitchParams = tb.params
    P, regs = params.ports, register_map(params)
    seed = cocotb.RANDOM_SEED
    tb.log.info("seed %d", seed)
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    allp = (1 << P) - 1
    group = 7
    count_log2 = min(params.slots.bit_length() - 1, 6)
    count = 1 << count_log2
    rounds = max(2, min(8, -(-128 // count)))
    switch_mac = 0x02_5A_00_00_00_00 | int(rng.integers(0, 1 << 32))

    # One rule per operator: a chunk's op is in the low two bits of its layer_id (the rules share the quota).
    writes = []
    for op in proto.ReduceOp:
        writes += rule_writes(regs, int(op), Rule(group=(group, 0xFF), layer=(int(op), 0x3), contributors=allp,
                                                  results=allp, base=0, count_log2=count_log2, red_op=op))
    writes += slot_clear_writes(regs, 0, count)
    writes += [(regs["SWITCH_MAC_LO"].address(), switch_mac & 0xFFFF_FFFF),
               (regs["SWITCH_MAC_HI"].address(), switch_mac >> 32)]
    model = SwitchModel(params)
    for addr, value in writes:
        model.write(addr, value)
    await tb.apply(writes)

    n_max = params.max_payload // 4
    problems: list[str] = []
    for rnd in range(rounds):
        paused = rnd % 2 == 1
        tb.set_idle_generator(random_pattern(0.3, seed + rnd) if paused else None)
        tb.set_backpressure_generator(random_pattern(0.3, seed + 100 + rnd) if paused else None)
        per_port: list[list[TxFrame]] = [[] for _ in range(P)]
        expected: list[list[bytes]] = [[] for _ in range(P)]
        lengths = []
        for i in range(count):
            seq = rnd * count + i
            op = proto.ReduceOp(prng.choice(list(proto.ReduceOp)))
            n = prng.choice([n_max, n_max, 1, n_max - 1, params.beat_bytes // 4, prng.randint(1, n_max)])
            n = max(1, min(n_max, n))
            lengths.append(n)
            if prng.random() < 0.25:   # extremes: the sum wraps, MAX/MIN meet the int32 limits
                values = rng.choice(np.array([-2**31, 2**31 - 1, -1, 0, 1], dtype=np.int64), (P, n))
            else:
                values = rng.integers(-2**31, 2**31, (P, n), dtype=np.int64)
            layer = int(rng.integers(0, 1 << 16)) & ~0x3 | int(op)     # selects the rule of op
            hdr = proto.CaisHeader(group_id=group, layer_id=layer, chunk_id=i,
                                   total_chunks=count, seq_num=seq, payload_len=4 * n, red_op=op)
            for p in range(P):
                payload = values[p].astype(">i4").tobytes()
                per_port[p].append(TxFrame(proto.build_frame(hdr, payload, src=host_mac(p), pad=True)))
            result = (proto.mac_to_bytes(proto.result_mac(group)) + proto.mac_to_bytes(switch_mac)
                      + proto.ETHERTYPE.to_bytes(2, "big") + hdr.replace(flags=int(proto.Flags.RESULT)).pack()
                      + _reduce(op, values).astype(">i4").tobytes())
            for p in range(P):
                expected[p].append(result)
        for p in range(P):
            prng.shuffle(per_port[p])
        before = [len(rx) for rx in tb.rx]
        # Interleave the ports' queues so every port has traffic from the start.
        for k in range(count):
            for p in range(P):
                await tb.send(p, per_port[p][k])
        for k in range(count):
            for p in range(P):
                model.receive(p, per_port[p][k].data)
        t0 = time.monotonic()
        await tb.drain()
        tb.log.info("round %d%s: %d chunks x %d ports, payloads %d..%d elements, %.1f s", rnd,
                    " (idle, back-pressure)" if paused else "", count, P, min(lengths), max(lengths),
                    time.monotonic() - t0)
        got = [rx[n:] for rx, n in zip(tb.rx, before)]
        round_problems = compare(expected, got)
        if round_problems:
            problems += [f"round {rnd}: {p}" for p in round_problems + tb.context(expected, got)]

    counters = await tb.counters()
    problems += counter_problems(counters, model.counters())
    problems += accounting_problems(counters)
    if counters["COMPLETED"] != rounds * count:
        problems.append(f"COMPLETED {counters['COMPLETED']}, expected {rounds * count}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------


def mix_frames_per_port(params: SwitchParams) -> int:
    """Sized so the test stays well under a minute (5-25 s here).

    The simulation's cost per cycle grows with the ports (two BFMs and two pause generators each), and so
    does the time a frame takes to leave (a broadcast waits for room on every port): 400 frames per port
    on 2 ports, 200 on 4, 24 on 16.
    """
    return max(24, min(400, 3200 // params.ports ** 2))


@cocotb.test()
async def test_random_mix(dut):
    """A long random mix (all-reduce, ordinary, forwarded and malformed frames) under idle and back-pressure."""
    tb = TB(dut)
    await tb.start()
    params = tb.params
    seed = cocotb.RANDOM_SEED
    tb.log.info("seed %d", seed)
    scen = random_mix(params, seed, frames_per_port=mix_frames_per_port(params))
    await tb.apply(scen.writes)
    tb.set_idle_generator(random_pattern(0.25, seed))
    # back-pressure differs per port: one sink mostly stalled, one always ready, the others at 25%
    stall = [0.8, 0.0] + [0.25] * (params.ports - 2)
    tb.set_backpressure_generator(lambda port: random_pattern(stall[port], seed + 7)(port))
    t0 = time.monotonic()
    for port, frames in enumerate(scen.frames):
        for frame in frames:
            await tb.send(port, frame)
    await tb.drain()
    tb.log.info("random mix: %d frames in, %d out, %d drain cycles, %.1f s", scen.total_frames,
                sum(len(rx) for rx in tb.rx), tb.cycles_drained, time.monotonic() - t0)

    model, expected = replay(scen)
    problems = compare(expected, tb.rx)
    if problems:
        problems += tb.context(expected, tb.rx)
    counters = await tb.counters()
    problems += counter_problems(counters, model.counters())
    problems += accounting_problems(counters)
    assert sum(len(e) for e in expected) > 0, "the mix produced no output at all: the test checks nothing"
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
