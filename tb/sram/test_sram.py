"""The SRAM buffer (cais.hdl.sram.buffer.SramBuffer, top ``cais_sram``): its contribution banks against a Python
dict per bank, its slot-state memory against a Python list of entries.

The banks' contract (ContributionBanks' docstring): a write in cycle t is seen by reads issued from t + 2 on (the
write is registered beside the RAM), a read of the row written in the same or the previous cycle returns the old
row, ``rd_data[p]`` shows bank p's row at the address of the last enabled read BANK_READ_LATENCY (2) edges after it (the read, then the RAM's output register) and holds it while ``rd_en`` is low. The banks have no
ready or valid handshake (the fold reader issues reads, the lanes write), so there is no back-pressure to apply;
"idle" makes the enables sparse (each high one cycle in four) instead of dense.

The slot-state memory's contract (SlotStateMemory's docstring): from reset the sweep writes slot s empty in cycle
s (``sweeping`` high for ``slots`` cycles, ``sweep_last`` in the last), and drops every other write meanwhile;
then one write per cycle, the pipeline's (``state``) before the maintenance's (``maint``, dropped when both
write); one read per cycle, of ``maint.read_addr`` while ``maint.read_en`` else of ``state.read_addr``, not
transparent, its entry on both ports' ``read_data`` STATE_READ_LATENCY (2) cycles later. The state cases fill
every slot with random entries, reset the buffer again (the memory keeps them: it has no reset) and check
that the sweep empties every slot, then run random reads and writes of both ports.

Inputs are driven after the falling edge; outputs are sampled in the ReadOnly phase after the rising edge, so
every cycle checks ``rd_data`` of every bank (and ``read_data`` of both state ports) against the model. A row
never written has no defined value and is not compared (the sweep case writes every row first).
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from cais.hdl.sram.banks import bank_addr_bits
from cais.hdl.sram.slots import state_entry_layout
from cais.tb.common import clock_and_reset, tb_params

#: documented in cais.hdl.sram.banks (BANK_READ_LATENCY); restated here as the contract under test
READ_LATENCY = 2
#: documented in cais.hdl.sram.banks (ContributionBanks.write_latency): a write lands a cycle after it is presented
WRITE_LATENCY = 2
#: documented in cais.hdl.sram.state (STATE_READ_LATENCY); restated here as the contract under test
STATE_READ_LATENCY = 2


class ReadsInFlight:
    """Reads issued and not yet shown: each read's expectation becomes ``shown`` ``latency`` clock edges after
    it was issued, and stays until the next one does (the read data holds between reads)."""

    def __init__(self, latency: int):
        self.latency = latency
        self.clear()

    def clear(self) -> None:
        self.pending, self.shown = [], None     # [edges left, expectation]; what the read data shows now

    def issue(self, expectation) -> None:
        self.pending.append([self.latency, expectation])

    def edge(self) -> None:
        for entry in self.pending:
            entry[0] -= 1
        while self.pending and self.pending[0][0] == 0:
            self.shown = self.pending.pop(0)[1]


class TB:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.params = P = tb_params()
        self.rng = random.Random(seed)
        self.ports, self.width = P.ports, P.data_width
        self.depth = P.slots * 2 * P.rows_per_set          # docs/core-design.md: a row per beat, per set of every slot
        assert len(dut.rd_addr) == bank_addr_bits(P)
        assert len(dut.rd_data__0) == self.width
        self.wr = [(getattr(dut, f"wr_addr__{p}"), getattr(dut, f"wr_data__{p}"), getattr(dut, f"wr_en__{p}"))
                   for p in range(self.ports)]
        self.rd_data = [getattr(dut, f"rd_data__{p}") for p in range(self.ports)]
        self.model = [dict() for _ in range(self.ports)]   # row address -> data, per bank
        self.reads = ReadsInFlight(READ_LATENCY)    # (address, rows expected, None where unwritten)
        self.landing = []                           # per cycle since: the writes not yet in the RAM
        self.checked = 0

    async def start(self):
        for addr, data, en in self.wr:
            addr.value, data.value, en.value = 0, 0, 0
        self.dut.rd_addr.value, self.dut.rd_en.value = 0, 0
        await clock_and_reset(self.dut)

    async def cycle(self, writes: dict, read: int | None):
        """One clock cycle: ``writes`` {port: (addr, data)}, ``read`` an address or None; then check rd_data."""
        await FallingEdge(self.dut.clk)
        for p, (addr, data, en) in enumerate(self.wr):
            if p in writes:
                addr.value, data.value = writes[p]
            en.value = int(p in writes)
        self.dut.rd_en.value = int(read is not None)
        if read is not None:
            self.dut.rd_addr.value = read
            # the rows as they are before this cycle's writes (the read port is not transparent)
            self.reads.issue((read, [self.model[p].get(read) for p in range(self.ports)]))
        await RisingEdge(self.dut.clk)
        self.landing.append(writes)
        while len(self.landing) >= WRITE_LATENCY:       # in the RAM for the reads from the next cycle on
            for p, (addr, data) in self.landing.pop(0).items():
                self.model[p][addr] = data
        self.reads.edge()
        await ReadOnly()
        if self.reads.shown is not None:
            addr, rows = self.reads.shown
            for p, want in enumerate(rows):
                if want is not None:
                    got = self.rd_data[p].value.to_unsigned()
                    assert got == want, f"bank {p} row {addr}: read {got:#x}, want {want:#x}"
                    self.checked += 1

    def random_row(self) -> int:
        return self.rng.getrandbits(self.width)


def traffic(tb: TB, pattern: str, idle: bool):
    """(writes, read) per cycle for a case."""
    rng, depth, ports = tb.rng, tb.depth, tb.ports
    on = (lambda: rng.random() < 0.25) if idle else (lambda: rng.random() < 0.9)
    if pattern == "sweep":                  # every row of every bank written, then every row read
        for addr in range(depth):
            yield {p: (addr, tb.random_row()) for p in range(ports)}, None
            if idle:
                yield {}, None
        for addr in range(depth):
            yield {}, addr
            if idle:
                yield {}, None
        return
    hot = rng.sample(range(depth), 4) + [0, depth - 1]   # a few rows, so writes and reads collide
    spread = rng.sample(range(depth), 96) + [0, depth - 1]   # rows all over the bank, reused
    for _ in range(1500):
        pick = (lambda: rng.choice(hot)) if pattern == "collide" else (lambda: rng.choice(spread))
        writes = {p: (pick(), tb.random_row()) for p in range(ports) if on()}
        read = pick() if on() else None
        if pattern == "collide" and writes and read is not None and rng.random() < 0.5:
            read = rng.choice([a for a, _ in writes.values()])        # read the row being written
        yield writes, read


@cocotb.test()
@cocotb.parametrize(pattern=["random", "collide", "sweep"], idle=[False, True])
async def run_traffic(dut, pattern, idle):
    tb = TB(dut, seed=["random", "collide", "sweep"].index(pattern) * 2 + idle)
    await tb.start()
    for writes, read in traffic(tb, pattern, idle):
        await tb.cycle(writes, read)
    for _ in range(READ_LATENCY + 2):      # the last reads come out, then rd_data holds
        await tb.cycle({}, None)
    assert tb.checked > (tb.depth * tb.ports if pattern == "sweep" else 500), f"only {tb.checked} rows compared"


class StateTB:
    """The slot-state memory's two ports (``state``: the decision's pipeline, ``maint``: its maintenance)."""

    def __init__(self, dut, seed: int):
        self.dut = dut
        self.params = P = tb_params()
        self.rng = random.Random(seed)
        self.slots, self.width = P.slots, state_entry_layout(P).size
        assert len(dut.state__read_data) == self.width
        self.model = [None] * self.slots       # entries; None: not known (before the first sweep)
        self.reads = ReadsInFlight(STATE_READ_LATENCY)   # (slot, entry expected, None if not known)
        self.checked = 0
        self.sweep = None          # the slot the sweep writes in this cycle (None: not sweeping)
        self.release = False       # the next cycle releases the reset

    def ports(self):
        d = self.dut
        return [d.state__read_addr, d.state__write_en, d.state__write_addr, d.state__write_data, d.maint__read_en,
                d.maint__read_addr, d.maint__write_en, d.maint__write_addr, d.maint__write_data]

    async def start(self):
        for signal in self.ports():
            signal.value = 0
        for name in ("wr_en", "wr_addr", "wr_data"):
            for p in range(self.params.ports):
                getattr(self.dut, f"{name}__{p}").value = 0
        self.dut.rd_en.value, self.dut.rd_addr.value = 0, 0
        await clock_and_reset(self.dut)
        await self.reset()

    async def reset(self):
        """A reset of one cycle (no write meanwhile); the next :meth:`cycle` releases it: sweep cycle 0."""
        await FallingEdge(self.dut.clk)
        self.dut.state__write_en.value, self.dut.maint__write_en.value = 0, 0
        self.dut.rst.value = 1
        await RisingEdge(self.dut.clk)
        self.release = True
        self.reads.clear()
        self.sweep = 0

    async def cycle(self, pipe_write=None, maint_write=None, pipe_read=0, maint_read=None):
        """One clock cycle: writes as (slot, entry) or None, the pipeline's read address and the maintenance's
        (None: ``read_en`` low); then check ``sweeping``/``sweep_last`` and both ``read_data``."""
        d = self.dut
        await FallingEdge(d.clk)
        if self.release:
            d.rst.value, self.release = 0, False
        for (en, addr, data), write in (((d.state__write_en, d.state__write_addr, d.state__write_data), pipe_write),
                                        ((d.maint__write_en, d.maint__write_addr, d.maint__write_data), maint_write)):
            en.value = int(write is not None)
            if write is not None:
                addr.value, data.value = write
        d.state__read_addr.value = pipe_read
        d.maint__read_en.value = int(maint_read is not None)
        d.maint__read_addr.value = maint_read or 0
        await ReadOnly()
        sweeping = self.sweep is not None
        assert int(d.sweeping.value) == sweeping, f"sweeping {d.sweeping.value} in sweep cycle {self.sweep}"
        assert int(d.sweep_last.value) == (self.sweep == self.slots - 1), f"sweep_last in sweep cycle {self.sweep}"
        read = pipe_read if maint_read is None else maint_read
        self.reads.issue((read, self.model[read]))      # the entry before this cycle's writes
        await RisingEdge(d.clk)
        if sweeping:
            self.model[self.sweep] = 0
            self.sweep = self.sweep + 1 if self.sweep + 1 < self.slots else None
        elif pipe_write is not None:
            self.model[pipe_write[0]] = pipe_write[1]
        elif maint_write is not None:
            self.model[maint_write[0]] = maint_write[1]
        self.reads.edge()
        await ReadOnly()
        if self.reads.shown is not None and self.reads.shown[1] is not None:
            slot, want = self.reads.shown
            for name in ("state__read_data", "maint__read_data"):
                got = getattr(d, name).value.to_unsigned()
                assert got == want, f"{name} of slot {slot}: {got:#x}, want {want:#x}"
            self.checked += 1

    def entry(self) -> int:
        return self.rng.getrandbits(self.width) | 1       # never empty, so the sweep's zero shows


@cocotb.test()
@cocotb.parametrize(pattern=["random", "collide"], idle=[False, True])
async def run_state(dut, pattern, idle):
    tb = StateTB(dut, seed=10 + 2 * ["random", "collide"].index(pattern) + idle)
    rng, slots = tb.rng, tb.slots
    await tb.start()
    while tb.sweep is not None:                       # the sweep after reset, with writes it must drop
        await tb.cycle(pipe_write=(rng.randrange(slots), tb.entry()), pipe_read=rng.randrange(slots))
    for slot in range(slots):                         # every slot filled, through either port
        write = (slot, tb.entry())
        await tb.cycle(pipe_write=write if slot % 2 else None, maint_write=None if slot % 2 else write)
    await tb.reset()                                  # the entries stay; the sweep must empty them
    for slot in range(slots + STATE_READ_LATENCY + 1):
        await tb.cycle(pipe_read=slot % slots)
    assert all(entry == 0 for entry in tb.model)
    on = (lambda: rng.random() < 0.25) if idle else (lambda: rng.random() < 0.8)
    hot = [0, slots - 1, rng.randrange(slots)]
    pick = (lambda: rng.choice(hot)) if pattern == "collide" else (lambda: rng.randrange(slots))
    for _ in range(1200):
        pipe_write = (pick(), tb.entry()) if on() else None
        maint_write = (pick(), tb.entry()) if on() else None
        maint_read = pick() if on() else None
        if pattern == "collide" and pipe_write and rng.random() < 0.5:
            maint_read = pipe_write[0]                # read the slot being written
        await tb.cycle(pipe_write, maint_write, pipe_read=pick(), maint_read=maint_read)
    for _ in range(STATE_READ_LATENCY + 1):
        await tb.cycle()
    assert tb.checked > 1000, f"only {tb.checked} reads compared"
