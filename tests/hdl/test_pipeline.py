# amaranth: UnusedElaboratable=no
"""cais.hdl.common.pipeline: register_copy, one clock edge of delay in simulation, and under an ECP5 synthesis
flip-flops of its own that yosys keeps apart from another copy of the same value (the control: two plain
registers of one value, which yosys merges into one); CreditSlice against a queue."""

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais.hdl.common.pipeline import CreditSlice, delay_line, register_copy

from blocksim import run
from ecp5synth import port_bits, synth_json

WIDTH = 6


class TwoCopies(wiring.Component):
    """``x`` registered twice, into ``y`` and ``z``: by register_copy, or (``plain``) by two delay lines."""

    def __init__(self, plain=False):
        self.plain = plain
        super().__init__({"x": In(WIDTH), "y": Out(WIDTH), "z": Out(WIDTH)})

    def elaborate(self, platform):
        m = Module()
        if self.plain:
            y, z = delay_line(m, self.x, 1, "y_reg"), delay_line(m, self.x, 1, "z_reg")
        else:
            y, z = register_copy(m, self.x, "y_reg", platform), register_copy(m, self.x, "z_reg", platform)
        m.d.comb += [self.y.eq(y), self.z.eq(z)]
        return m


def test_simulation_delays_by_one_edge():
    dut = TwoCopies()
    rng = random.Random(3)
    seen = []

    async def tb(ctx):
        previous = None
        for _ in range(50):
            value = rng.randrange(1 << WIDTH)
            ctx.set(dut.x, value)
            await ctx.delay(1e-9)
            if previous is not None:
                assert ctx.get(dut.y) == ctx.get(dut.z) == previous
                seen.append(previous)
            await ctx.tick()
            previous = value

    run(dut, tb)
    assert len(seen) == 49


class EnabledCopy(wiring.Component):
    """``x`` registered into ``y`` by register_copy, loaded only while ``en``."""

    def __init__(self):
        super().__init__({"x": In(WIDTH), "en": In(1), "y": Out(WIDTH)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(register_copy(m, self.x, "y_reg", platform, enable=self.en))
        return m


def test_enabled_copy_loads_only_with_its_enable():
    """The model: y takes x at an edge where en is high and keeps its value at every other edge."""
    dut = EnabledCopy()
    rng = random.Random(5)
    checked = []

    async def tb(ctx):
        expect = 0                    # a register without reset starts at 0
        for cycle in range(200):
            value, en = rng.randrange(1 << WIDTH), rng.random() < 0.4
            ctx.set(dut.x, value)
            ctx.set(dut.en, en)
            await ctx.delay(1e-9)
            assert ctx.get(dut.y) == expect, cycle
            checked.append(en)
            await ctx.tick()
            if en:
                expect = value

    run(dut, tb)
    assert 40 < sum(checked) < 160


class ResetCopy(wiring.Component):
    """``x`` registered into ``y`` by register_copy with ``reset``; for a simulation in a ``sync`` domain of
    its own (whose ``rst`` the testbench drives), else in the one the top's ports give (``clk``, ``rst``)."""

    def __init__(self, own_domain=True):
        super().__init__({"x": In(WIDTH), "y": Out(WIDTH)})
        self.sync = ClockDomain("sync") if own_domain else None

    def elaborate(self, platform):
        m = Module()
        if self.sync is not None:
            m.domains.sync = self.sync
        m.d.comb += self.y.eq(register_copy(m, self.x, "y_reg", platform, reset=True))
        return m


def test_reset_copy_is_cleared_by_a_one_cycle_reset():
    """With ``reset``, the copy is 0 in the cycle after a clock edge with reset high, whatever x was (a
    control register's copy after a one-cycle reset: docs/interface.md allows one cycle), and follows x
    otherwise."""
    dut = ResetCopy()
    ones = (1 << WIDTH) - 1

    async def tb(ctx):
        for cycle in range(12):
            ctx.set(dut.x, ones)
            ctx.set(dut.sync.rst, cycle == 6)
            await ctx.tick()
            await ctx.delay(1e-9)
            assert ctx.get(dut.y) == (0 if cycle == 6 else ones), cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.pnr
def test_ecp5_reset_copy_resets_on_the_domain_reset(tmp_path):
    """Under an ECP5 synthesis the copy is TRELLIS_FF instances whose synchronous reset (LSR) is the
    domain's reset, not a constant."""
    module = synth_json(ResetCopy(own_domain=False), tmp_path, "reset_copy")
    port_of = port_bits(module)
    flops = [c for c in module["cells"].values() if c["type"] == "TRELLIS_FF"]
    assert len(flops) == WIDTH
    assert all(port_of.get(c["connections"]["LSR"][0], (None,))[0] == "rst" for c in flops)


def _flops(component, tmp_path, name):
    """synth_ecp5 of *component*: per output port bit, the TRELLIS_FF driving it (cell name) and that
    flip-flop's input (port name, bit)."""
    module = synth_json(component, tmp_path, name)
    port_of = port_bits(module)
    driver = {c["connections"]["Q"][0]: (cell, port_of.get(c["connections"]["DI"][0]))
              for cell, c in module["cells"].items() if c["type"] == "TRELLIS_FF"}
    return {(port, i): driver.get(bit) for port, info in module["ports"].items() if port in "yz"
            for i, bit in enumerate(info["bits"])}


@pytest.mark.pnr
def test_ecp5_copies_are_not_merged(tmp_path):
    copies = _flops(TwoCopies(), tmp_path, "copies")
    for i in range(WIDTH):
        (y_ff, y_in), (z_ff, z_in) = copies[("y", i)], copies[("z", i)]
        assert y_in == z_in == ("x", i)
        assert y_ff != z_ff, f"bit {i}: one flip-flop drives both copies"
    # the control: the same two registers written plainly become one flip-flop per bit
    plain = _flops(TwoCopies(plain=True), tmp_path, "plain")
    assert all(plain[("y", i)] == plain[("z", i)] for i in range(WIDTH))


# ---- CreditSlice

#: docs/core-design.md: an item accepted in cycle t is offered from t + 1 (restated: the contract under test)
SLICE_LATENCY = 1
#: Items a slice may hold beyond the one in its output register: CreditSlice(depth=d) its queue (d).
SLICES = {"credit4": (lambda: CreditSlice(8), 4), "credit2": (lambda: CreditSlice(8, depth=2), 2)}


@pytest.mark.parametrize("kind", list(SLICES))
@pytest.mark.parametrize("seed, p_valid, p_ready", [(1, 0.5, 0.5), (2, 1.0, 1.0), (3, 0.9, 0.3), (4, 0.3, 0.9)])
def test_slice_against_a_queue(kind, seed, p_valid, p_ready):
    """Random valid and ready: every item comes out once, in order, never sooner than SLICE_LATENCY cycles
    after it went in; at full valid and ready one item per cycle; the slice holds at most its output
    register and its spare room; and neither i.ready nor o.valid/payload moves when the other side's
    inputs change within a cycle (they are registers)."""
    make, room = SLICES[kind]
    dut = make()
    assert dut.latency == SLICE_LATENCY
    rng = random.Random(seed)
    sent, received = [], []

    async def tb(ctx):
        nxt = 0
        accepted_at = {}
        for cycle in range(800):
            valid, ready = rng.random() < p_valid, rng.random() < p_ready
            # the outputs, before this cycle's inputs are set and after: the same (registers)
            ctx.set(dut.i.valid, 0)
            ctx.set(dut.o.ready, 0)
            ctx.set(dut.i.payload, 0)
            await ctx.delay(1e-10)
            before = (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload))
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, nxt & 0xFF)
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-10)
            after = (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload))
            assert before == after, f"cycle {cycle}: an output follows an input in the same cycle"
            i_ready, o_valid, o_payload = after
            if o_valid and ready:
                item = len(received)
                assert o_payload == item & 0xFF, f"cycle {cycle}: item {item} out of order"
                assert cycle - accepted_at[item] >= SLICE_LATENCY
                received.append(cycle)
            if valid and i_ready:
                accepted_at[nxt] = cycle
                sent.append(cycle)
                nxt += 1
            await ctx.tick()

    run(dut, tb)
    held = [sum(1 for t in sent if t < c) - sum(1 for t in received if t < c) for c in range(801)]
    assert len(received) > 100 and max(held) <= 1 + room
    if p_valid == p_ready == 1.0:
        assert len(received) >= 800 - 3, "not one item per cycle at full rate"
    if p_ready < 0.5 and p_valid > 0.5:
        assert max(held) == 1 + room, "the slice never filled under back-pressure"


def test_credit_slice_busy_and_depth():
    """``busy`` is high exactly while an item is held (accepted and not yet taken); a depth that is not a
    power of two >= 2 is refused by name."""
    dut = CreditSlice(8, depth=2)
    rng = random.Random(9)

    async def tb(ctx):
        held = 0
        for cycle in range(300):
            valid, ready = rng.random() < 0.6, rng.random() < 0.4
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-10)
            assert ctx.get(dut.busy) == (held > 0), f"cycle {cycle}: busy {ctx.get(dut.busy)} with {held} held"
            held += (valid and ctx.get(dut.i.ready)) - (ready and ctx.get(dut.o.valid))
            await ctx.tick()

    run(dut, tb)
    for bad in (0, 1, 3):
        with pytest.raises(ValueError, match="depth must be a power of two"):
            CreditSlice(8, depth=bad)
