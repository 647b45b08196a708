"""The slot-state memory's colliding reads (cais.hdl.sram.state.SlotStateMemory): a read of the slot written in
the same cycle has no defined result on ECP5 (the DP16KD's two ports collide; the simulation model returns
the old entry). The decision must never use such a read's entry: its pipeline forwards the colliding write,
and the maintenance reads and writes only while no all-reduce header is in flight.

The check: the decision runs twice side by side on the same inputs, once on the memory's simulation model and
once on a memory whose every colliding read returns garbage (every bit of the old entry inverted), under
traffic that makes reads collide with the pipeline's writes, with SLOT_CLEARs and with the aging scanner's
writes (an age unit of 32 cycles, so that visits come often, under full load and between headers). Every
output of the two must be equal in every cycle; the collisions are counted by kind, so the test fails if
the traffic stops making them. The reference-model test (tests/hdl/test_decision.py) runs on the garbage
memory too, so the decisions are not merely equal but right.
"""

import random

import pytest
from amaranth.hdl import Const, Module, Mux, Signal, Value
from amaranth.lib import wiring

from cais.hdl.common.bram import OutputRegisteredRAM
from cais.hdl.decision import Decision, attach_state_memory
from cais.hdl.sram.slots import state_entry_layout
from cais.hdl.sram.state import SlotStateMemory
from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.tables import slot_clear_writes

from blocksim import header_meta, run
import test_decision


class GarbageOnCollision(OutputRegisteredRAM):
    """The simulation form, but a read of the row written in the same cycle returns the old row with every
    bit inverted (the DP16KD leaves it undefined). ``collisions`` counts such reads, ``collided`` is 1 in the
    cycle a colliding read's garbage is on ``rd_data``."""

    def __init__(self, shape, depth):
        super().__init__(shape, depth)
        self.collisions = Signal(32)
        self.collided = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = self.mem
        wr, rd = mem.write_port(), mem.read_port()
        hit, out = Signal(), Signal(self.width)
        m.d.comb += [wr.addr.eq(self.wr_addr), wr.data.eq(self.wr_data), wr.en.eq(self.wr_en),
                     rd.addr.eq(self.rd_addr), rd.en.eq(self.rd_en), self.rd_data.eq(out)]
        collide = self.rd_en & self.wr_en & (self.rd_addr == self.wr_addr)
        with m.If(self.rd_en):
            m.d.sync += hit.eq(collide)
        m.d.sync += [out.eq(Mux(hit, ~Value.cast(rd.data), Value.cast(rd.data))), self.collided.eq(hit),
                     self.collisions.eq(self.collisions + collide)]
        return m


def garbage_memory(params):
    return SlotStateMemory(params, ram=GarbageOnCollision(state_entry_layout(params), params.slots))


def test_garbage_memory_differs_from_the_model_on_a_collision():
    """The garbage memory is what it says: a read in the cycle of a write to its row shows the old row
    inverted, a read one cycle later the new row."""
    ram = GarbageOnCollision(8, 4)
    got = []

    async def tb(ctx):
        for cycle, (we, wa, wd, ra) in enumerate([(1, 2, 0x5A, 0), (1, 2, 0x33, 2), (0, 0, 0, 2), (0, 0, 0, 2),
                                                   (0, 0, 0, 0), (0, 0, 0, 0)]):
            ctx.set(ram.wr_en, we)
            ctx.set(ram.wr_addr, wa)
            ctx.set(ram.wr_data, wd)
            ctx.set(ram.rd_addr, ra)
            ctx.set(ram.rd_en, 1)
            await ctx.tick()
            got.append(ctx.get(ram.rd_data))
    run(ram, tb)
    # row 2 holds 0x5A after cycle 0; the read of cycle 1 collides (0x5A inverted) on rd_data after edge 2
    assert got[2] == 0xA5 and got[3] == 0x33


PARAMS = test_decision.PARAMS
#: an age unit of 32 cycles: visits often, with headers between them
AGE_UNIT_LOG2 = 5


class Twin(wiring.Component):
    """Two decisions with the same inputs: ``a`` on the memory's model, ``b`` on the garbage memory."""

    def __init__(self, params, regmap, age_unit_log2):
        self.a = Decision(params, regmap, age_unit_log2=age_unit_log2)
        self.b = Decision(params, regmap, age_unit_log2=age_unit_log2)
        self.mem_b = garbage_memory(params)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        for name, dec, mem in (("a", self.a, None), ("b", self.b, self.mem_b)):
            sub = Module()
            attach_state_memory(sub, dec, mem)
            m.submodules[name] = sub
        return m


def _inputs(dec):
    return [(path, value) for path, member, value in dec.signature.flatten(dec)
            if member.flow == wiring.In and path[0] not in ("sweeping", "sweep_last", "state", "maint")
            and not isinstance(value, Const)]


def _outputs(dec):
    return [(path, value) for path, member, value in dec.signature.flatten(dec)
            if member.flow == wiring.Out and path[0] not in ("state", "maint") and not isinstance(value, Const)]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_colliding_reads_are_never_used(seed):
    rng = random.Random(seed)
    regs = register_map(PARAMS)
    twin = Twin(PARAMS, regs, age_unit_log2=AGE_UNIT_LOG2)
    a, b = twin.a, twin.b
    ins_a, ins_b = _inputs(a), _inputs(b)
    outs_a, outs_b = _outputs(a), _outputs(b)
    ram = twin.mem_b.ram
    frames = test_decision.random_frames(rng, 60)
    queues = [[f for q, f in frames if q == p] for p in range(PARAMS.ports)]
    writes = test_decision.setup_writes(regs)
    aging = regs["AGING"]
    counted = {"pipeline": 0, "maintenance": 0, "differ": []}

    async def tb(ctx):
        def put(path_value_index, value):
            ctx.set(ins_a[path_value_index][1], value)
            ctx.set(ins_b[path_value_index][1], value)
        index = {path: i for i, (path, _v) in enumerate(ins_a)}

        def setp(path, value):
            put(index[path], value)

        async def program(addr, value):
            reg = next(r for r in regs if r.address() == addr)
            name = reg.name.lower()
            if reg.kind is Kind.COMMAND:
                setp(("program", f"{name}_data"), value)
                setp(("program", f"{name}_stb"), 1)
                await step()
                setp(("program", f"{name}_stb"), 0)
            else:
                setp(("program", name), value)
                await step()

        async def step():
            await ctx.delay(1e-9)
            for (path, va), (_p, vb) in zip(outs_a, outs_b):
                if ctx.get(Value.cast(va)) != ctx.get(Value.cast(vb)) and len(counted["differ"]) < 8:
                    counted["differ"].append((step.cycle, path))
            counted["maint_writes"] = counted.get("maint_writes", 0) + (ctx.get(b.maint.write_en) and not ctx.get(b.state.write_en))
            await ctx.tick()
            step.cycle += 1
        step.cycle = 0

        for addr, value in writes:
            await program(addr, value)
        # aging on: an age of 1 unit, sets freed, so visits write often
        await program(aging.address(), aging.pack(age=1, free=1))
        offer = [None] * PARAMS.ports
        cycle = 0
        while any(queues) or any(o is not None for o in offer):
            phase = (cycle // 150) % 3                      # full load, gaps, sparse
            for p in range(PARAMS.ports):
                if offer[p] is None and queues[p] and rng.random() < (1.0, 0.5, 0.15)[phase]:
                    offer[p] = queues[p].pop(0)
                    for dec in (a, b):
                        ctx.set(dec.headers[p].payload, header_meta(offer[p], PARAMS.beat_bytes))
                setp(("headers", p, "valid"), offer[p] is not None)
            setp(("hold",), rng.random() < 0.05)
            if rng.random() < 0.01:
                for addr, value in slot_clear_writes(regs, rng.randrange(PARAMS.slots), 1):
                    setp(("program", "slot_clear_data"), value)
                    setp(("program", "slot_clear_stb"), 1)
            else:
                setp(("program", "slot_clear_stb"), 0)
            await ctx.delay(1e-9)
            mw = ctx.get(b.maint.write_en) and not ctx.get(b.state.write_en)
            taken = [ctx.get(a.headers[p].ready) for p in range(PARAMS.ports)]
            if ctx.get(ram.rd_en) and ctx.get(ram.wr_en) and ctx.get(ram.rd_addr) == ctx.get(ram.wr_addr):
                counted["maintenance" if mw else "pipeline"] += 1
            await step()
            for p in range(PARAMS.ports):
                if taken[p]:
                    offer[p] = None
            cycle += 1
            assert cycle < 40 * len(frames), "the decision stopped taking headers"
        for _ in range(40):
            await step()

    run(twin, tb)
    assert not counted["differ"], counted["differ"]
    assert counted["pipeline"] > 20 and counted["maintenance"] > 0 and counted["maint_writes"] > 5, counted


@pytest.mark.slow
def test_decisions_on_the_garbage_memory_match_the_reference_model(monkeypatch):
    """tests/hdl/test_decision.py's reference-model case at full load (back-to-back headers to one slot:
    the reads that collide with the pipeline's writes) on the garbage memory."""
    def with_garbage_memory(decision):
        m = Module()
        attach_state_memory(m, decision, garbage_memory(decision.params))
        return m
    monkeypatch.setattr(test_decision, "with_state_memory", with_garbage_memory)
    test_decision.test_decisions_match_the_reference_model(3, "full")
