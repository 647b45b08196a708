"""The SRAM buffer's contribution banks (cais.hdl.sram.banks.ContributionBanks, top ``cais_sram``) against a Python
dict per bank.

The contract (ContributionBanks' docstring): a write in cycle t is seen by reads issued from t + 1 on, a read of
the row written in the same cycle returns the old row, ``rd_data[p]`` shows bank p's row at the address of the
last enabled read BANK_READ_LATENCY (1) edge after it and holds it while ``rd_en`` is low. The banks have no
ready or valid handshake (the fold reader issues reads, the lanes write), so there is no back-pressure to apply;
"idle" makes the enables sparse (each high one cycle in four) instead of dense.

Inputs are driven after the falling edge; outputs are sampled in the ReadOnly phase after the rising edge, so
every cycle checks ``rd_data`` of every bank against the model. A row never written has no defined value and is
not compared (the sweep case writes every row first).
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from cais.hdl.sram.banks import bank_addr_bits
from cais.tb.common import clock_and_reset, tb_params

#: documented in cais.hdl.sram.banks (BANK_READ_LATENCY); restated here as the contract under test
READ_LATENCY = 1


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
        self.pending = []          # reads in flight: (cycles left, address, rows expected or None if unwritten)
        self.shown = None          # (address, rows) that rd_data must show now (None before any read)
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
            self.pending.append([READ_LATENCY, read, [self.model[p].get(read) for p in range(self.ports)]])
        await RisingEdge(self.dut.clk)
        for p, (addr, data) in writes.items():
            self.model[p][addr] = data
        for entry in self.pending:
            entry[0] -= 1
        while self.pending and self.pending[0][0] == 0:
            _, addr, rows = self.pending.pop(0)
            self.shown = (addr, rows)
        await ReadOnly()
        if self.shown is not None:
            addr, rows = self.shown
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
