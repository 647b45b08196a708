"""The decision's parts on their own (cais.hdl.decision: Arbiter, Maintenance, RuleLookup + SlotState, and the
slot-state memory they share, cais.hdl.sram.state),
under amaranth.sim, against hand-derived cycles: each part's ``latency`` attribute is what it does, and the
composition's DECISION_LATENCY is the sum the whole decision shows (tests/hdl/test_decision.py checks that
against the reference model)."""

from amaranth.hdl import Module, Signal

from cais.hdl.decision import DECISION_LATENCY, Arbiter, Maintenance, RuleLookup, SlotState
from cais.hdl.decision.maintenance import past_age
from cais.hdl.sram.state import SlotStateMemory
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


def arbiter_reference(ports, request, all_reduce, blocked, hold, taken, last):
    """The documented round robin, one cycle: the grant (a port or None) from this cycle's inputs, the port
    being taken (``taken``, or None) and the port taken last before it (``last``). A port being taken
    is not granted; while ``blocked`` neither is an all-reduce header; the order starts above the last
    port taken (that is ``taken`` itself in a cycle with a take)."""
    last = last if taken is None else taken
    asking = [p for p in range(ports) if request >> p & 1 and p != taken and not (blocked and all_reduce >> p & 1)]
    order = [(last + 1 + k) % ports for k in range(ports)]
    grant = next((p for p in order if p in asking), None)
    return (None if hold else grant), last, (not blocked) or (grant is not None and bool(all_reduce >> grant & 1))


def test_arbiter_random_headers_against_the_round_robin():
    """Headers that come and stay offered until taken, random all-reduce bits, blocks and holds, at 2, 3,
    4 and 5 ports: every cycle's ``take``, ``port`` (with a take) and ``stateful`` are the reference's;
    every port with a header is served within ``ports`` takes (fairness), one header per cycle while
    two or more ports ask."""
    import random
    for P in (2, 3, 4, 5):
        dut = Arbiter(P)
        rnd = random.Random(P)
        log = []

        async def tb(ctx):
            offered, ar = 0, 0
            taken, last, blocked = None, 0, False
            for cycle in range(1500):
                for p in range(P):                       # a new header on a port with none, now and then
                    if not offered >> p & 1 and rnd.random() < 0.5:
                        offered |= 1 << p
                        ar = (ar & ~(1 << p)) | (rnd.random() < 0.5) << p
                if rnd.random() < 0.05:
                    blocked = not blocked
                hold = rnd.random() < 0.05
                ctx.set(dut.request, offered)
                ctx.set(dut.all_reduce, ar)
                ctx.set(dut.blocked, blocked)
                ctx.set(dut.hold, hold)
                want, last, stateful = arbiter_reference(P, offered, ar, blocked, hold, taken, last)
                if taken is not None:
                    offered &= ~(1 << taken)             # taken in this cycle: gone after the edge
                await ctx.tick()
                take = ctx.get(dut.take)
                log.append((cycle, take, want, ctx.get(dut.port), ctx.get(dut.stateful), stateful,
                            offered, ar, blocked, hold))
                taken = want
        run(dut, tb)
        waits = []
        for cycle, take, want, port, got_sf, want_sf, offered, ar, blocked, hold in log:
            assert take == (0 if want is None else 1 << want), (P, cycle, take, want)
            if want is not None:
                assert port == want, (P, cycle, port, want)
            assert got_sf == want_sf, (P, cycle, got_sf, want_sf)
        # fairness: between a port's header becoming grantable and its take, at most P - 1 others are taken
        for p in range(P):
            since = None
            for cycle, (_, _, want, _, _, _, offered, ar, blocked, hold) in enumerate(log):
                if want == p:
                    since = None
                elif offered >> p & 1 and not (blocked and ar >> p & 1):
                    since = 0 if since is None else since + (want is not None)
                    waits.append(since)
                else:
                    since = None
        assert max(waits) <= P - 1, (P, max(waits))
        # one header per cycle: with two ports or more asking (one may be being taken) and no hold, a take
        full = [take for _, take, _, _, _, _, offered, ar, blocked, hold in log
                if not hold and bin(offered & ~(ar if blocked else 0)).count("1") >= 2]
        assert full and all(full), P


def test_state_memory_sweep_and_write_order():
    """The slot-state memory's reset sweep (cais.hdl.sram.state) writes slot s empty in cycle s after reset,
    before any other write; then a maintenance write in the cycle of a pipeline write waits its turn (the
    pipeline's goes first, the maintenance's is dropped), and a read shows its entry ``read_latency`` (2)
    cycles after its address."""
    params = SwitchParams(ports=2, slots=4, rules=2)
    dut = SlotStateMemory(params)
    full = (1 << dut.mem.shape.size) - 1
    emptied, sweeping, reads = {}, [], []

    async def tb(ctx):
        for s in range(params.slots):
            ctx.set(dut.mem.data[s].as_value(), full)
        for cycle in range(10):
            sweeping.append((ctx.get(dut.sweeping), ctx.get(dut.sweep_last)))
            ctx.set(dut.pipe.write_en, cycle in (0, 6))           # (0: during the sweep, lost)
            ctx.set(dut.pipe.write_addr, 1)
            ctx.set(dut.pipe.write_data.as_value(), 5)
            ctx.set(dut.maint.write_en, cycle in (1, 6))
            ctx.set(dut.maint.write_addr, 2)
            ctx.set(dut.maint.write_data.as_value(), 7)
            ctx.set(dut.pipe.read_addr, 1)
            reads.append(ctx.get(dut.pipe.read_data.as_value()))
            await ctx.tick()
            for s in range(params.slots):
                if s not in emptied and ctx.get(dut.mem.data[s].as_value()) == 0:
                    emptied[s] = cycle
        assert [ctx.get(dut.mem.data[s].as_value()) for s in range(params.slots)] == [0, 5, 0, 0]
    run(dut, tb)
    assert SlotStateMemory.read_latency == 2
    assert emptied == {s: s for s in range(params.slots)}
    assert sweeping == [(1, 0), (1, 0), (1, 0), (1, 1)] + [(0, 0)] * 6
    # slot 1: written with 5 in cycle 6 (seen by a read addressed in cycle 7, shown in cycle 9)
    assert reads[:9] == [0, 0, full, full, 0, 0, 0, 0, 0] and reads[9] == 5


def test_maintenance_clear_latency():
    """While the memory sweeps the maintenance writes nothing and holds all-reduce headers back; a
    SLOT_CLEAR strobed in cycle t with nothing in flight writes its slot empty in cycle t + ``latency`` (5:
    the start, the read, the wait for the memory's output register, the slot registered, the write)."""
    params = SwitchParams(ports=2, slots=4, rules=2)
    regs = register_map(params)
    dut = Maintenance(params, regs)
    writes, blocked = [], []

    async def tb(ctx):
        ctx.set(dut.drained, 1)
        for cycle in range(20):
            ctx.set(dut.sweeping, cycle < params.slots)                 # as the memory's sweep
            ctx.set(dut.sweep_last, cycle == params.slots - 1)
            if cycle == 10:
                ctx.set(dut.program.slot_clear_data, regs["SLOT_CLEAR"].pack(slot=3))
                ctx.set(dut.program.slot_clear_stb, 1)
            st = dut.state
            blocked.append(ctx.get(dut.blocked))
            if ctx.get(st.write_en):
                writes.append((cycle, ctx.get(st.write_addr), ctx.get(st.write_data.as_value())))
            await ctx.tick()
            ctx.set(dut.program.slot_clear_stb, 0)
    run(dut, tb)
    assert Maintenance.latency == 5
    assert writes == [(10 + 5, 3, 0)]
    assert blocked[:6] == [1, 1, 1, 1, 0, 0]


def _run_clears(strobes, drained_from, cycles, *, honour_full=True, slots=8):
    """A Maintenance (``slots`` slots, aging off) after its reset sweep, with ``drained`` low from cycle 10
    (all-reduce headers in flight) until ``drained_from``, and SLOT_CLEAR strobes: ``strobes`` is a list of
    (earliest cycle, slot), each strobed in its cycle or, with ``honour_full``, the first cycle after it
    in which ``clear_full`` is low (as the register bridge holds the write back). Returns the memory writes
    (cycle, slot, data), ``blocked`` and ``clear_full`` of every cycle, and the cycle of each strobe."""
    params = SwitchParams(ports=2, slots=slots, rules=2)
    regs = register_map(params)
    dut = Maintenance(params, regs)
    writes, blocked, full, strobed = [], [], [], []

    async def tb(ctx):
        waiting = list(strobes)
        for cycle in range(cycles):
            ctx.set(dut.sweeping, cycle < params.slots)
            ctx.set(dut.sweep_last, cycle == params.slots - 1)
            ctx.set(dut.drained, not 10 <= cycle < drained_from)
            is_full = ctx.get(dut.clear_full) if honour_full else 0
            full.append(is_full)
            stb = bool(waiting) and waiting[0][0] <= cycle and not is_full
            if stb:
                ctx.set(dut.program.slot_clear_data, regs["SLOT_CLEAR"].pack(slot=waiting.pop(0)[1]))
                strobed.append(cycle)
            ctx.set(dut.program.slot_clear_stb, stb)
            blocked.append(ctx.get(dut.blocked))
            st = dut.state
            if ctx.get(st.write_en):
                writes.append((cycle, ctx.get(st.write_addr), ctx.get(st.write_data.as_value())))
            await ctx.tick()
    run(dut, tb)
    return writes, blocked, full, strobed


def test_maintenance_clears_written_back_to_back_all_happen_in_order():
    """Four SLOT_CLEARs strobed in four consecutive cycles while headers are in flight (``drained`` low
    from cycle 10 to 29) are all carried out, in the order written: the first starts in cycle 30, the first
    drained one, and writes its slot empty 4 cycles later (a clear strobed while drained writes ``latency``
    = 5 cycles after its strobe, 1 after it for the start); each next starts 5 cycles after the one
    before (read, wait, hold, write, start). All-reduce headers are held back (``blocked``, a register) from
    the cycle after the first strobe until two cycles after the last start. (With one pending register,
    the later strobes replaced the earlier: only slot 1 was written.)"""
    slots = [5, 2, 7, 1]
    strobes = [(12 + k, s) for k, s in enumerate(slots)]
    writes, blocked, _, strobed = _run_clears(strobes, 30, 60, honour_full=False)
    assert strobed == [12, 13, 14, 15]
    assert writes == [(30 + 4 + 5 * k, s, 0) for k, s in enumerate(slots)]
    last_start = 30 + 5 * (len(slots) - 1)
    assert all(blocked[13:last_start + 2]) and not any(blocked[last_start + 2:])
    assert not any(blocked[8:13])           # after the sweep (8 slots), before the first strobe


def test_maintenance_full_clear_queue_holds_the_next_write():
    """Six SLOT_CLEARs written as fast as the queue takes them while headers are in flight: the queue holds
    CLEAR_QUEUE_DEPTH (4), ``clear_full`` rises in the cycle after the fourth strobe and falls in the cycle
    after a clear starts (the start in cycle 30, the first drained one); the fifth is strobed then (31) and
    fills the queue again; the sixth waits for the next start (35) and is strobed in 36. All six are
    written, in order, 5 cycles apart."""
    from cais.hdl.decision.maintenance import CLEAR_QUEUE_DEPTH
    assert CLEAR_QUEUE_DEPTH == 4
    slots = [3, 0, 6, 4, 7, 2]
    writes, _, full, strobed = _run_clears([(12, s) for s in slots], 30, 70)
    assert strobed == [12, 13, 14, 15, 31, 36]
    assert full[12:16] == [0] * 4 and full[16:31] == [1] * 15 and full[31] == 0
    assert full[32:36] == [1] * 4 and full[36] == 0
    assert writes == [(34 + 5 * k, s, 0) for k, s in enumerate(slots)]


def test_maintenance_strobe_into_a_full_clear_queue_is_ignored():
    """A strobe that disregards ``clear_full`` (the register bridge never makes one) finds the queue full
    with no clear starting: it is ignored; the four queued clears are carried out. One strobed in the cycle
    a clear starts (room made in that cycle) is queued."""
    slots = [3, 0, 6, 4]
    strobes = [(12 + k, s) for k, s in enumerate(slots)] + [(16, 5), (30, 1)]
    writes, _, _, strobed = _run_clears(strobes, 30, 60, honour_full=False)
    assert strobed == [12, 13, 14, 15, 16, 30]
    assert writes == [(34 + 5 * k, s, 0) for k, s in enumerate(slots + [1])]


def test_maintenance_visit_latency():
    """An aging visit (AGING.age 1, one set per age unit of 4 cycles here) of a set that is due (partly
    filled, stamped at unit 0, never aged): the slot is read in cycle r (``read_en``), picked in r + 2,
    decided in r + 3 and written marked aged in r + 4 (``visit_latency`` 5 from the due cycle r - 1), and
    all-reduce headers are held back from the due cycle through r + 1 (the write lands before any header
    granted from r + 2 reads the slot: grant, take, T, B1, B2, then S0 in r + 6 at the earliest)."""
    params = SwitchParams(ports=2, slots=4, rules=2)
    regs = register_map(params)
    dut = Maintenance(params, regs, age_unit_log2=2)
    reads, writes, blocked = [], [], []

    async def tb(ctx):
        ctx.set(dut.drained, 1)
        ctx.set(dut.program.aging, regs["AGING"].pack(age=1))
        # every slot: set 0 holds port 0's contribution stamped at unit 0, set 1 empty
        ctx.set(dut.state.read_data, [{"bitmap": 1, "stamp": 0}, {}])
        for cycle in range(24):
            ctx.set(dut.sweeping, cycle < params.slots)
            ctx.set(dut.sweep_last, cycle == params.slots - 1)
            st = dut.state
            blocked.append(ctx.get(dut.blocked))
            if ctx.get(st.read_en):
                reads.append((cycle, ctx.get(st.read_addr)))
            if ctx.get(st.write_en):
                w = ctx.get(st.write_data)
                writes.append((cycle, ctx.get(st.write_addr), w[0].aged, w[0].bitmap))
            await ctx.tick()
    run(dut, tb)
    assert Maintenance.visit_latency == 5
    # the first visit is of slot 0, set 0: due at the first unit's end after the sweep, read, marked
    r, slot = reads[0]
    assert slot == 0
    assert writes[0] == (r + 4, 0, 1, 1)
    assert all(blocked[r - 1:r + 2]) and not blocked[r + 2]


def test_past_age_is_the_compare_of_the_sum():
    """``past_age`` (the scanner's decision from the units found a cycle early) against the integers, for
    every 4-bit elapsed count, age and unit end: (elapsed + rolls) mod 16 > age, the wrap included."""
    m = Module()
    elapsed, rolls, age = Signal(4), Signal(), Signal(4)
    over = Signal()
    m.d.comb += over.eq(past_age(elapsed, rolls, age))
    wrong = []

    async def tb(ctx):
        for e in range(16):
            for r in (0, 1):
                for a in range(16):
                    ctx.set(elapsed, e)
                    ctx.set(rolls, r)
                    ctx.set(age, a)
                    if ctx.get(over) != ((e + r) % 16 > a):
                        wrong.append((e, r, a, ctx.get(over)))
    run(m, tb, clock=False)
    assert wrong == []


def test_decision_latency_is_the_parts():
    """The decision's latency from the take is the lookup's and the slot state's (one stage each: T, B1,
    B2; S0, S1, S2, U, V)."""
    assert (RuleLookup.latency, SlotState.latency) == (3, 5)
    assert DECISION_LATENCY == 8
