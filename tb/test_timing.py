"""cocotb tests of the switch's cycle-level promises on the exported Verilog (``cais_switch``) under Verilator.

The same facts as the amaranth.sim tests in ``tests/test_switch_timing.py``, written from docs/interface.md
and docs/registers.md. Cycle stamps come from :class:`cais.tb.switch_tb.Stamps`: a beat is stamped with the
cycle in which its tvalid and tready were both high, a register read with the cycle its address was
accepted (arvalid and arready).

* ``test_result_latency``: with every sink ready, the first beat of a result leaves ``beats + 9 + L``
  cycles after the last beat of the completing contribution (beats of that frame; L = 4 with float units,
  0 without), on every result port in the same cycle; a reproducible rule adds
  ``rows + (n - 1) * max(rows, L)`` (docs/numerics.md section 11).
* ``test_held_port_never_stalls_others``: port 0's sink holds tready low while long broadcast frames and
  all-reduce results go to every port: the other ports receive whole frames (tvalid never low inside a
  frame while they are ready), port 0 nothing; after the release everything arrives as the reference
  model says, and the counters match it.
* ``test_busy_register``: BUSY read back to back over AXI4-Lite while single frames pass; every read must
  return 1 exactly when ``first_in < accept + 1 <= last_out`` (the value of the cycle after the address
  was accepted; BUSY is 1 from the cycle after a frame's first beat until the cycle its last caused beat
  leaves). Each frame is sent at every phase against the read stream (0..7 cycles after a read's address
  was accepted), so that reads land on both edges of every interval (the test checks that they did).
"""

from __future__ import annotations

import cocotb
import numpy as np

from cais.sim.directed import accounting_problems, counter_problems
from cais.sim.timing import broadcast, contribution, documented_latency, group_writes, held_port_scenario
from cais.sim.traffic import Scenario, compare, replay

from .switch_tb import TB, Stamps


# ----------------------------------------------------------------------------- result latency
async def measure_latency(tb: TB, st: Stamps, payload_len: int, reproducible: bool = False) -> dict:
    """From reset: every port but the last contributes to chunk 0 of a group of all ports, the switch
    drains, then the last port completes the set. Returns the stamps and the problems found."""
    params = tb.params
    P = params.ports
    allp = (1 << P) - 1
    rng = np.random.default_rng(payload_len + 1000 * reproducible)
    await tb.reset()
    frames = [contribution(p, 0, rng.integers(0, 256, payload_len, dtype=np.uint8).tobytes()) for p in range(P)]
    scen = Scenario(params, group_writes(params, allp, allp, reproducible=reproducible), [[f] for f in frames])
    _, expected = replay(scen)
    await tb.apply(scen.writes)
    for p in range(P - 1):
        await tb.send(p, frames[p])
    await tb.drain()
    before = [len(e) for e in st.egress]
    await tb.send(P - 1, frames[P - 1])
    await tb.drain()

    problems = compare(expected, tb.rx)
    new = [st.egress[p][before[p]:] for p in range(P)]
    if [len(n) for n in new] != [1] * P:
        problems.append(f"egress frames after the completing contribution: {[len(n) for n in new]}, "
                        f"expected one result per port")
    if not all(len(e) == 1 for e in expected):
        problems.append(f"the model expects {[len(e) for e in expected]} results: the scenario is wrong")
    if problems:
        return {"problems": problems}
    last_in = st.ingress[P - 1][-1][1]
    firsts = [n[0][0] for n in new]
    return {"problems": [], "last_in": last_in, "firsts": firsts,
            "latency": min(firsts) - last_in, "spread": max(firsts) - min(firsts)}


@cocotb.test()
async def test_result_latency(dut):
    """beats + 9 + L cycles from the completing contribution's last beat to the result's first beat, on
    every port in the same cycle; a reproducible rule adds rows + (n - 1) * max(rows, L)."""
    tb = TB(dut)
    await tb.start()
    st = tb.stamps()
    params = tb.params
    B = params.beat_bytes
    cases = [(n, False) for n in sorted({4, 64, params.max_payload})]
    capacity = params.set_capacity(reproducible=True) if params.reproducible else 0
    # The longest reproducible chunk, and a one-row chunk (rows < L: each pass waits for the ALU).
    cases += [(n, True) for n in sorted({capacity, min(B, capacity)}) if n > 0]
    if capacity == 0:
        tb.log.info("this build holds no reproducible chunk (set capacity 0): reproducible latency not measured")
    failed, lines = [], []
    for payload_len, reproducible in cases:
        got = await measure_latency(tb, st, payload_len, reproducible)
        name = f"payload {payload_len}{' reproducible' if reproducible else ''}"
        if got["problems"]:
            failed.append(f"{name}: " + "; ".join(got["problems"]))
            continue
        want = documented_latency(params, payload_len, reproducible)
        lines.append(f"{name}: last beat in at {got['last_in']}, result first beats at {got['firsts']}, "
                     f"latency {got['latency']} (documented {want})")
        tb.log.info(lines[-1])
        if got["spread"] != 0:
            failed.append(f"{name}: the result's first beat leaves in different cycles: {got['firsts']}")
        if got["latency"] != want:
            failed.append(f"{name}: latency {got['latency']} cycles, documented {want}")
    assert not failed, "\n".join(failed + lines)


# ----------------------------------------------------------------------------- a held port
@cocotb.test()
async def test_held_port_never_stalls_others(dut):
    """Port 0's sink holds tready low: frames multicast to port 0 and others leave the others whole."""
    tb = TB(dut)
    await tb.start()
    st = tb.stamps()
    params = tb.params
    P = params.ports
    scen, model, expected = held_port_scenario(params, cocotb.RANDOM_SEED)
    await tb.apply(scen.writes)

    tb.sink[0].pause = True
    before = [len(e) for e in st.egress]
    for port, frames in enumerate(scen.frames):
        for frame in frames:
            await tb.send(port, frame)
    hold = 2000 + 8 * params.max_frame_beats
    await tb.cycles(hold)
    held = [len(st.egress[p]) - before[p] for p in range(P)]
    tb.sink[0].pause = False
    await tb.drain()
    counters = await tb.counters()

    problems = []
    if held[0]:
        problems.append(f"port 0 received {held[0]} frames while its sink held tready low")
    if sum(held[1:]) == 0:
        problems.append("the other ports received nothing while port 0 was held: the test shows nothing")
    for p in range(1, P):
        if st.gaps[p]:
            problems.append(f"port {p}: {len(st.gaps[p])} cycles without tvalid inside a frame while ready, "
                            f"first at cycle {st.gaps[p][0]}")
        stamped = st.egress[p][before[p]:]
        if len(stamped) != len(tb.rx[p]):
            problems.append(f"port {p}: {len(stamped)} frames stamped, {len(tb.rx[p])} received")
            continue
        # Every sink but port 0's is always ready: a whole frame of b beats spans exactly b cycles.
        for k, ((first, last), data) in enumerate(zip(stamped, tb.rx[p])):
            if last - first + 1 != -(-len(data) // params.beat_bytes):
                problems.append(f"port {p} frame {k}: {-(-len(data) // params.beat_bytes)} beats over cycles "
                                f"{first}..{last}")
    problems += compare(expected, tb.rx)
    problems += counter_problems(counters, model.counters())
    problems += accounting_problems(counters)
    tb.log.info("frames out while port 0 was held (%d cycles): %s", hold, held)
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- BUSY
class BusyPoller:
    """Reads BUSY back to back from a background coroutine; ``reads`` holds (accept cycle, value)."""

    def __init__(self, tb: TB, st: Stamps):
        self.tb, self.st = tb, st
        self.addr = tb.regmap["BUSY"].address()
        self.reads: list[tuple[int, int]] = []
        self.problems: list[str] = []
        self._running = True
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        while self._running:
            n = len(self.st.ar)
            value = await self.tb.read(self.addr)
            if len(self.st.ar) != n + 1:    # no other reader may run meanwhile
                self.problems.append(f"{len(self.st.ar) - n} read addresses accepted during one read")
            self.reads.append((self.st.ar[-1], value))

    async def stop(self):
        self._running = False
        await self._task


@cocotb.test()
async def test_busy_register(dut):
    """BUSY reads 1 from the cycle after a frame's first beat is accepted until the cycle in which the last
    beat of the last frame it causes is accepted; 0 otherwise, also right after reset."""
    tb = TB(dut)
    await tb.start()
    st = tb.stamps()
    params = tb.params
    P = params.ports
    allp = (1 << P) - 1

    # Right after reset: nothing inside, through the slot-state sweep and beyond.
    await tb.reset()
    poller = BusyPoller(tb, st)
    await tb.cycles(params.slots + 200)
    await poller.stop()
    after_reset = list(poller.reads)
    problems = list(poller.problems)
    problems += [f"read accepted in cycle {a} after reset (before any traffic): BUSY {v}"
                 for a, v in after_reset if v != 0]

    await tb.apply(group_writes(params, 0b0001, allp))                 # group 1: port 0 alone, results to all
    held_port = min(2, P - 1)
    scenarios = [       # name, port, frame factory (seq), held sink, hold cycles, egress frames expected
        ("forwarded", 0, lambda seq: broadcast(0, bytes(200)), None, 0, P - 1),
        ("forwarded, port held", 0, lambda seq: broadcast(0, bytes(100)), held_port, 80, P - 1),
        ("result", 0, lambda seq: contribution(0, seq, bytes(params.max_payload)), None, 0, P),
        ("result, port held", 0, lambda seq: contribution(0, seq, bytes(8)), P - 1, 50, P),
    ]
    phases = 8       # each frame sent 0..7 cycles after a read address was accepted (a read takes fewer)
    intervals = []   # (first_in, last_out, name)
    seq = 0
    poller = BusyPoller(tb, st)
    for name, port, make, hold, hold_cycles, outs in scenarios:
        for phase in range(phases):
            await tb.cycles(20)
            accepted = len(st.ar)
            while len(st.ar) == accepted:
                await tb.cycles(1)
            await tb.cycles(phase)
            ins, egs = len(st.ingress[port]), [len(e) for e in st.egress]
            if hold is not None:
                tb.sink[hold].pause = True
            await tb.send(port, make(seq))
            seq += 1
            await tb.cycles(max(hold_cycles, 1))
            if hold is not None:
                tb.sink[hold].pause = False
            await tb.cycles(params.max_frame_beats + 150)
            new = [t for p in range(P) for t in st.egress[p][egs[p]:]]
            if len(st.ingress[port]) != ins + 1 or len(new) != outs:
                problems.append(f"{name}, phase {phase}: {len(st.ingress[port]) - ins} frames in, "
                                f"{len(new)} out (expected 1 in, {outs} out)")
                continue
            first_in = st.ingress[port][-1][0]
            last_out = max(t[1] for t in new)
            intervals.append((first_in, last_out, name))
    await poller.stop()
    problems += poller.problems

    def expected(cycle: int) -> int:
        return int(any(first < cycle <= last for first, last, _ in intervals))

    for accept, value in poller.reads:
        if value != expected(accept + 1):
            inside = [(f, l, n) for f, l, n in intervals if f - 10 <= accept <= l + 10]
            problems.append(f"read accepted in cycle {accept}: BUSY {value}, expected {expected(accept + 1)} "
                            f"(frames near: {inside})")

    # Every interval edge must have been sampled, or an off-by-one would pass unseen.
    for name in dict.fromkeys(n for _, _, n in intervals):
        mine = [(f, l) for f, l, n in intervals if n == name]
        at_first = {a + 1 - f for a, _ in poller.reads for f, _ in mine}
        at_last = {a + 1 - l for a, _ in poller.reads for _, l in mine}
        if {0, 1} - at_first or {0, 1} - at_last:
            problems.append(f"{name}: no read sampled the cycles first_in+{sorted({0, 1} - at_first)} / "
                            f"last_out+{sorted({0, 1} - at_last)}: the test cannot see an off-by-one there")
    period = np.diff([a for a, _ in poller.reads])
    tb.log.info("%d BUSY reads after reset, %d during %d frames; reads every %s cycles", len(after_reset),
                len(poller.reads), len(intervals), sorted(set(period.tolist())))
    counters = await tb.counters()
    problems += accounting_problems(counters)
    assert not problems, "\n".join(problems[:30]) + (f"\n... {len(problems)} problems" if len(problems) > 30 else "")
