"""Set aging in the decision pipeline (cais.hdl.decision.Decision, amaranth.sim) against the bound
docs/registers.md states for AGING: measured from the decision of a set's last accepted contribution, the
set is aged after more than age x AGE_UNIT cycles and at most (age + 2 x slots) x AGE_UNIT + 13 cycles
(with the real AGE_UNIT of 1024 cycles). The expected events are worked out here from the frames sent."""

import struct

import pytest

from cais.hdl.decision import DECISION_LATENCY, Decision
from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, AGED_QUEUE_DEPTH, Kind, aging_period, register_map
from cais.tables import Rule, rule_writes

from blocksim import Pins, header_meta, run, with_state_memory

P = SwitchParams(ports=4, slots=1, rules=2)
RM = register_map(P)
UNIT = 1 << AGE_UNIT_LOG2
#: cycles a visit may wait for the stateful headers in flight and take to write (docs/registers.md)
VISIT = 12


def frame(port, seq, group=1):
    payload = struct.pack(">ii", port, seq)
    hdr = struct.pack(">BBHHHIHBB", 0, group, 0, 0, 1, seq, len(payload), 0, 0)
    f = b"\xff" * 6 + bytes([2, 0, 0, 0, 0, port]) + b"\x88\xb5" + hdr + payload
    return f + bytes(max(0, 60 - len(f)))


class Bench:
    """The decision with its register inputs driven by name, frames offered one at a time, and every
    output event recorded with its cycle."""

    def __init__(self, ctx, dut):
        self.ctx, self.dut, self.pins, self.cycle = ctx, dut, Pins(ctx), 0
        self.decisions, self.aged, self.jobs = [], [], []

    async def tick(self, n=1):
        for _ in range(n):
            await self.ctx.tick()
            self.cycle += 1
            c = self.ctx
            if any(c.get(lane.valid) for lane in self.dut.lanes):
                self.decisions.append(self.cycle)
            if c.get(self.dut.jobs.valid):
                self.jobs.append(self.cycle)
            if c.get(self.dut.aged):
                self.aged.append((self.cycle, c.get(self.dut.aged_slot), c.get(self.dut.aged_set),
                                  c.get(self.dut.aged_rule)))

    async def write(self, name, value):
        reg = RM[name]
        base = name.lower()
        if reg.kind is Kind.COMMAND:
            self.ctx.set(getattr(self.dut.program, f"{base}_data"), value)
            self.ctx.set(getattr(self.dut.program, f"{base}_stb"), 1)
            await self.tick()
            self.ctx.set(getattr(self.dut.program, f"{base}_stb"), 0)
        else:
            self.ctx.set(getattr(self.dut.program, base), value)
            await self.tick()

    async def setup(self, age, free=False):
        for addr, value in rule_writes(RM, 1, Rule(group=(1, 0xFF), contributors=0b1111, results=0b1111,
                                                   base=0, count_log2=0)):
            await self.write(next(r.name for r in RM if r.address() == addr), value)
        await self.write("AGING", RM["AGING"].pack(age=age, free=int(free)))
        await self.tick(P.slots + 2)

    async def send(self, port, seq):
        """Offer one frame until taken; returns the cycle of its decision."""
        f = frame(port, seq)
        offer = self.dut.headers[port]
        self.ctx.set(offer.payload, header_meta(f, P.beat_bytes))
        self.ctx.set(offer.valid, 1)
        while True:
            await self.ctx.delay(1e-9)
            taken = self.ctx.get(offer.ready)
            await self.tick()
            if taken:
                break
        self.ctx.set(offer.valid, 0)
        n = len(self.decisions)
        while len(self.decisions) == n:
            await self.tick()
        return self.decisions[-1]

    def get(self, name):
        return self.ctx.get(getattr(self.dut, name))


def simulate(body):
    dut = Decision(P, RM)
    out = {}

    async def tb(ctx):
        b = Bench(ctx, dut)
        await body(b, out)
    run(with_state_memory(dut), tb)
    return out


@pytest.mark.slow
def test_dead_port_ages_within_the_bound_once():
    age = 1
    assert aging_period(P) == 2 * UNIT

    async def body(b, out):
        await b.setup(age)
        await b.tick(300)                           # somewhere inside an age unit
        await b.send(0, 0)
        await b.send(1, 0)
        last = await b.send(2, 0)                   # port 3 never sends: the set stays partly filled
        await b.tick(700)
        await b.send(0, 0)                          # a duplicate does not feed the set
        while not b.aged and b.cycle < last + (age + 2 * P.slots) * UNIT + 4 * VISIT:
            await b.tick()
        out["last"], out["aged"] = last, list(b.aged)
        await b.tick(2)                             # the event is queued, then shown
        out["event"], out["ports"] = b.get("aged_event"), b.get("aged_ports")
        out["in_use"] = b.get("slots_in_use")
        out["per_rule"] = [b.ctx.get(b.dut.sets_in_use[e]) for e in range(P.rules)]
        await b.tick(3 * aging_period(P))           # never again in this fill
        out["aged_after"] = list(b.aged)

    out = simulate(body)
    assert len(out["aged"]) == 1, out
    cycle, slot, s, rule = out["aged"][0]
    assert (slot, s, rule) == (0, 0, 1)
    assert age * UNIT < cycle - out["last"] <= (age + 2 * P.slots) * UNIT + VISIT, (cycle, out["last"])
    assert RM["AGED_EVENT"].unpack(out["event"]) == {"slot": 0, "rule": 1, "set": 0, "valid": 1}
    assert RM["AGED_PORTS"].unpack(out["ports"]) == {"ports": 0b0111, "queued": 1}
    assert out["in_use"] == 1 and out["per_rule"] == [0, 1]      # reported, not freed
    assert out["aged_after"] == out["aged"]


@pytest.mark.slow
def test_each_contribution_renews_the_stamp():
    """Aging counts from a set's last accepted contribution, not its first. Set 0 is fed by ports 0, 1 and 2
    at AGING.age 2, a contribution every 1,900 cycles (< 2 x UNIT), so for 3,800 cycles, longer than its age,
    starting late in the age clock (the stamps are not 0); port 3 never sends. It is not aged while fed, and
    is aged within the bound after the last contribution. (A stamp never renewed, or renewed only by the
    first contribution, ages it while fed: cycles 5,126 and 7,174 against the last contribution's 7,210.)"""
    age, gap = 2, 1900

    async def body(b, out):
        await b.setup(age)
        await b.tick(3 * UNIT + 300)
        for p in range(3):
            last = await b.send(p, 0)
            if p < 2:
                await b.tick(gap - (b.cycle - last))
        out["fed"] = list(b.aged)
        while not b.aged and b.cycle < last + (age + 2 * P.slots) * UNIT + 4 * VISIT:
            await b.tick()
        out["last"], out["aged"] = last, list(b.aged)

    out = simulate(body)
    assert out["fed"] == [], out
    assert len(out["aged"]) == 1 and out["aged"][0][1:] == (0, 0, 1), out
    assert age * UNIT < out["aged"][0][0] - out["last"] <= (age + 2 * P.slots) * UNIT + VISIT, out


@pytest.mark.slow
def test_fed_and_complete_sets_never_age_and_free_releases():
    age = 1

    async def body(b, out):
        await b.setup(age, free=True)
        # set 0 fed every 1000 cycles (< age x UNIT) by a new port: never aged while fed, although the
        # scanner visits it every 2 x UNIT cycles
        for p in range(3):
            last = await b.send(p, 0)
            await b.tick(1000 - (b.cycle - last))
        out["fed"] = list(b.aged)
        while not b.aged and b.cycle < last + (age + 2 * P.slots) * UNIT + 4 * VISIT:
            await b.tick()
        out["last"], out["aged"] = last, list(b.aged)
        await b.tick(2)                 # SLOTS_IN_USE follows the state's write by two cycles (registers.md)
        out["in_use"] = b.get("slots_in_use")
        # freed: the chunk's retransmission and its other contributions start the set anew and complete it
        for p in range(4):
            await b.send(p, 0)
        out["jobs"] = len(b.jobs)
        # a complete set never ages
        await b.tick(3 * aging_period(P))
        out["aged_complete"] = list(b.aged)
        out["queued"] = RM["AGED_PORTS"].unpack(b.get("aged_ports"))["queued"]
        await b.write("AGED_POP", 0)
        await b.tick(2)
        out["after_pop"] = b.get("aged_event")

    out = simulate(body)
    assert out["fed"] == [], out
    assert len(out["aged"]) == 1 and out["aged"][0][1:] == (0, 0, 1)
    assert age * UNIT < out["aged"][0][0] - out["last"] <= (age + 2 * P.slots) * UNIT + VISIT
    assert out["in_use"] == 0
    assert out["jobs"] == 1
    assert out["aged_complete"] == out["aged"]
    assert out["queued"] == 1 and out["after_pop"] == 0
    assert AGED_QUEUE_DEPTH >= 1


def test_aging_off_changes_no_timing():
    """With AGING.age 0 a header is granted in every cycle it asks (no scanner), as before aging."""
    async def body(b, out):
        await b.setup(0)
        start = b.cycle
        for k in range(6):
            await b.send(k % 4, k // 4)
        out["cycles"] = b.cycle - start
        await b.tick(2 * aging_period(P))
        out["aged"] = list(b.aged)

    out = simulate(body)
    # each frame: offered, taken in the cycle after its grant, decided DECISION_LATENCY cycles after the take
    assert out["cycles"] == 6 * (DECISION_LATENCY + 1) and out["aged"] == []


def _aging_on(backend):
    from cais.sim.backends import run_backend
    got = run_backend(backend, SwitchParams(), "cais.sim.aging:aging_job", {"seed": 1, "age": 1}, seed=1)
    assert not got["problems"], got["problems"]
    low, high = got["bound"]
    assert low < got["aged_after"] <= high + 80
    return got


def test_link_dead_port_aged_freed_and_reused_on_the_model():
    """cais.sim.aging on the model's link: the model's clock follows the link's and ages the set."""
    _aging_on("model")


@pytest.mark.verilator
def test_link_dead_port_aged_freed_and_reused_on_verilator():
    """The exported switch: a dead port's set aged within the bound, its event read, freed, the chunk's
    retransmission completing it with every port's values, every counter equal to the model's."""
    got = _aging_on("verilator")
    # the first visit after the age is due: well inside the bound at the default 64 slots
    assert got["aged_after"] < got["bound"][1]
