"""SLOT_CLEARs written back to back through the whole switch's AXI4-Lite (amaranth.sim), under all-reduce
traffic that keeps the maintenance waiting (``drained`` low): every one of them is carried out (docs/interface.md,
the SLOT_CLEAR queue); and writes made while the queue is full (during the reset sweep) are held back by the
bridge, not lost.

The expectations come from the protocol (docs/protocol.md 7.1: seq ``t`` of a rule with base 0 and
``count_log2`` 3 lives in slot ``t % 8``, set ``(t // 8) % 2``): a set half filled by one contributor and then
cleared takes a chunk with another tag as a first contribution; one not cleared drops it as TAG_MISMATCH.
"""

import pytest

from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.links.amaranth import run_amaranth
from cais.sim.timing import contribution
from cais.tables import Rule, rule_writes, slot_clear_writes

# the whole switch under amaranth.sim: the slow tier
pytestmark = pytest.mark.slow

#: 4 ports, integer lanes only (the cheapest amaranth.sim build), 64 slots: a reset sweep of 64 cycles, long
#: enough for the AXI4-Lite writes made during it to fill the SLOT_CLEAR queue.
PARAMS = SwitchParams(ports=4, slots=64, float_units=False)
REGS = register_map(PARAMS)


def _payload(t: int) -> bytes:
    return t.to_bytes(4, "little") * 2


async def _read(link, name):
    return await link.read(REGS[name].address())


async def _wait_idle(link):
    while await _read(link, "BUSY"):
        await link.advance(16)


def test_back_to_back_slot_clears_under_traffic_are_all_carried_out():
    """Group 1 (ports 0 and 1, slots 0-7): port 0 contributes seq 0-7, so every slot's set 0 holds a
    partial with tag t. Then every port streams all-reduce chunks, ports 2 and 3 of group 2 (slots 8-15),
    ports 0 and 1 of group 3 (slots 16-23), each pair in step, every chunk completing, and, with that traffic
    in the pipeline (and the headers the clears held back taken one per cycle after each), the controller writes SLOT_CLEAR of slots 0-7, one write after the
    other. Afterwards ports 1 and 0 send seq 16-23 (the same sets, other tags): every one is accepted (no
    TAG_MISMATCH) and completes, 8 results to each of ports 0 and 1."""
    group1 = Rule.for_group(1, contributors=0b0011, results=0b0011, base=0, count_log2=3)
    group2 = Rule.for_group(2, contributors=0b1100, results=0b1100, base=8, count_log2=3)
    group3 = Rule.for_group(3, contributors=0b0011, results=0b0011, base=16, count_log2=3)

    async def main(link):
        for addr, value in (rule_writes(REGS, 0, group1) + rule_writes(REGS, 1, group2)
                            + rule_writes(REGS, 2, group3) + slot_clear_writes(REGS, 0, 24)):
            await link.write(addr, value)
        await _wait_idle(link)
        for t in range(8):
            link.send(0, contribution(0, t, _payload(t)).data)
        await _wait_idle(link)
        filled = await _read(link, "SLOTS_IN_USE")
        # the traffic that keeps the maintenance waiting: every port, each group's two in step
        for t in range(48):
            for p in range(4):
                link.send(p, contribution(p, t, _payload(t), group=2 if p >= 2 else 3).data)
        await link.advance(40)
        clears = []
        for addr, value in slot_clear_writes(REGS, 0, 8):
            start = link.cycle
            await link.write(addr, value)
            clears.append((start, link.cycle))
        traffic_left = link.pending
        await _wait_idle(link)
        link.take_received()
        before = {n: await _read(link, n) for n in ("DROP_TAG_MISMATCH", "COMPLETED", "CONTRIBUTIONS")}
        for t in range(16, 24):
            link.send(1, contribution(1, t, _payload(t)).data)
        await _wait_idle(link)
        for t in range(16, 24):
            link.send(0, contribution(0, t, _payload(t)).data)
        await _wait_idle(link)
        after = {n: await _read(link, n) for n in before}
        results = [port for port, _ in link.take_received()]
        return filled, clears, traffic_left, before, after, results

    filled, clears, traffic_left, before, after, results = run_amaranth(PARAMS, main)
    assert filled == 8                                   # the partials of seq 0-7
    assert traffic_left                                  # group 2 still streaming when the last clear was written
    assert all(b - a <= 8 for a, b in clears)            # no write was held (the queue never filled)
    delta = {n: after[n] - before[n] for n in before}
    assert delta == {"DROP_TAG_MISMATCH": 0, "COMPLETED": 8, "CONTRIBUTIONS": 16}
    assert sorted(results) == [0] * 8 + [1] * 8


def test_slot_clears_written_during_the_sweep_wait_for_room():
    """From the first cycle after reset (inside the 64-cycle slot-state sweep, when no clear can start), 10
    SLOT_CLEARs written one after the other: the first 4 fill the queue and the bridge holds the fifth write
    back (AWREADY/WREADY low) until the sweep ends and clears start; every one of the 10 is carried out, in
    the order written (seen on the maintenance's memory writes)."""
    slots = [9, 3, 60, 0, 17, 42, 5, 63, 1, 30]

    async def main(link):
        ctx = link.ctx
        mt = link.dut.core.decision.maintenance
        cleared = []
        edge = link._edge

        async def watched_edge():
            await edge()
            if ctx.get(mt.cleared):
                cleared.append(ctx.get(mt.state.write_addr))
        link._edge = watched_edge
        spans = []
        for s in slots:
            start = link.cycle
            for addr, value in slot_clear_writes(REGS, s, 1):
                await link.write(addr, value)
            spans.append(link.cycle - start)
        await link.advance(8 * 4 + 16)
        return spans, cleared

    spans, cleared = run_amaranth(PARAMS, main, settle=0)
    unheld = spans[0]
    assert all(n == unheld for n in spans[:4])          # four writes go straight into the queue
    assert spans[4] > unheld + 20                       # the fifth waits for the sweep's end (64 cycles)
    assert cleared == slots
