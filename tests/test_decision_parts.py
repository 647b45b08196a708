"""The decision's parts on their own (cais.hdl.decision: Arbiter, Maintenance, RuleLookup + SlotState),
under amaranth.sim, against hand-derived cycles: each part's ``latency`` attribute is what it does, and the
composition's DECISION_LATENCY is the sum the whole decision shows (tests/test_decision.py checks that
against the reference model)."""

from cais.hdl.decision import DECISION_LATENCY, Arbiter, Maintenance, RuleLookup, SlotState
from cais.params import SwitchParams
from cais.registers import register_map

from blocksim import run


def test_arbiter_round_robin_and_latency():
    """Four ports asking in every cycle: after reset the last grant counts as port 0's, so the takes go
    1, 2, 3, 0, 1, ... one per cycle, each ``latency`` (1) cycle after its grant; a port being taken is
    not granted again in that cycle."""
    dut = Arbiter(4)
    takes = []

    async def tb(ctx):
        ctx.set(dut.request, 0b1111)
        for _ in range(9):
            await ctx.tick()
            takes.append(ctx.get(dut.take))
    run(dut, tb)
    assert Arbiter.latency == 1
    assert takes == [1 << p for p in (1, 2, 3, 0, 1, 2, 3, 0, 1)]


def test_arbiter_blocked_holds_back_all_reduce_only():
    """While blocked, a header that needs no slot state is taken in the cycle after it is first offered
    (as when not blocked); an all-reduce header waits until the block ends."""
    dut = Arbiter(4)
    got = []

    async def tb(ctx):
        ctx.set(dut.blocked, 1)
        ctx.set(dut.all_reduce, 0b0001)
        ctx.set(dut.request, 0b0101)                 # port 0 all-reduce, port 2 ordinary: both new
        for cycle in range(5):                        # the inputs of this cycle, then its edge
            if cycle == 3:
                ctx.set(dut.blocked, 0)
            await ctx.tick()
            take = ctx.get(dut.take)                  # taken in cycle + 1
            got.append(take)
            ctx.set(dut.request, ctx.get(dut.request) & ~take)
    run(dut, tb)
    # cycle 0: port 2 granted (port 0 blocked), taken in cycle 1; the block ends in cycle 3: port 0 granted,
    # taken in cycle 4
    assert got == [0b0100, 0, 0, 0b0001, 0]


def test_maintenance_sweep_and_clear_latency():
    """After reset the sweep writes slot s in cycle s (before the pipeline's writes); a SLOT_CLEAR strobed
    in cycle t with nothing in flight writes its slot empty in cycle t + ``latency`` (4)."""
    params = SwitchParams(ports=2, slots=4, rules=2)
    regs = register_map(params)
    dut = Maintenance(params, regs)
    writes = []

    async def tb(ctx):
        ctx.set(dut.drained, 1)
        for cycle in range(20):
            if cycle == 10:
                ctx.set(dut.program.slot_clear_data, regs["SLOT_CLEAR"].pack(slot=3))
                ctx.set(dut.program.slot_clear_stb, 1)
            st = dut.state
            if ctx.get(st.write_en):
                writes.append((cycle, ctx.get(st.write_addr), ctx.get(st.write_first),
                               ctx.get(st.write_data.as_value())))
            await ctx.tick()
            ctx.set(dut.program.slot_clear_stb, 0)
    run(dut, tb)
    assert Maintenance.latency == 4
    assert writes == [(s, s, 1, 0) for s in range(params.slots)] + [(10 + 4, 3, 0, 0)]


def test_decision_latency_is_the_parts():
    """The decision's latency from the take is the lookup's and the slot state's (one stage each: T, B1,
    B2; S0, S1, S2, U, V)."""
    assert (RuleLookup.latency, SlotState.latency) == (3, 5)
    assert DECISION_LATENCY == 8
