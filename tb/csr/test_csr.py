"""The AXI4-Lite register block (cais.hdl.control.csr: AXI4LiteToCSR + RegisterBank, top ``cais_csr`` of
cais.hdl.blocks) under cocotbext-axi's AxiLiteMaster.

Every expectation comes from the register map definition (cais.registers.register_map) and the rules of
docs/registers.md / cais.hdl.control.csr: a register reads its reset value (CONST: the constant, CONFIG: ``reset``,
COUNTER: 0, COMMAND: 0 as it is write-only, LEVEL: the gauge input); bits outside a register's fields read 0
and are not written; RW registers take writes (and drive their port), RO ones ignore them with OKAY, a WO
command pulses its strobe for exactly one cycle with the written word; an address outside the map answers
DECERR (reads 0, writes nothing); a write with wstrb != 0b1111 answers SLVERR and changes nothing; counters
add their increments. Each case runs under every combination of idle insertion (AW, W, AR) and back-pressure
(B, R).
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiResp

from cais.registers import Access, Kind, register_map
from cais.tb.common import IDLE_BACKPRESSURE, clock_and_reset, quiet_bfms, set_axil_pauses, tb_params

ADDR_SPACE = 1 << 12          # cais.hdl.blocks.CSR_ADDR_WIDTH: one 4 KiB page


def field_mask(reg) -> int:
    """The bits a register holds: its fields', or all 32 without fields (docs/registers.md)."""
    mask = 0
    for f in reg.fields:
        mask |= f.mask
    return mask if reg.fields else 0xFFFF_FFFF


def port_name(base: str, reg, i: int) -> str:
    return f"{base}__{i}" if reg.count > 1 else base


class TB:
    def __init__(self, dut, seed: int = 0):
        self.dut = dut
        self.params = tb_params()
        self.regmap = register_map(self.params)
        self.rng = random.Random(seed)
        quiet_bfms(dut)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil", bus_separator="__"), dut.clk, dut.rst)
        self.elements = [(reg, i) for reg in self.regmap for i in range(reg.count)]
        self.levels = {}                  # (name, i) -> the value driven on <name>_value
        self.strobes = {}                 # (name, i) -> [data of every cycle the strobe was high]
        for reg, i in self.elements:
            base = reg.name.lower()
            if reg.kind is Kind.COUNTER:
                self.sig(f"{base}_inc", reg, i).value = 0
            elif reg.kind is Kind.LEVEL:
                value = self.rng.getrandbits(32)
                self.levels[reg.name, i] = value
                self.sig(f"{base}_value", reg, i).value = value

    def sig(self, base, reg, i):
        return getattr(self.dut, port_name(base, reg, i))

    async def start(self, idle: bool, backpressure: bool):
        await clock_and_reset(self.dut)
        set_axil_pauses(self.axil, idle, backpressure)
        cocotb.start_soon(self._watch_strobes())

    async def _watch_strobes(self):
        commands = [(reg, i) for reg, i in self.elements if reg.kind is Kind.COMMAND]
        while True:
            await RisingEdge(self.dut.clk)      # the values of the cycle that just ended
            for reg, i in commands:
                base = reg.name.lower()
                if self.sig(f"{base}_stb", reg, i).value == 1:
                    data = self.sig(f"{base}_data", reg, i).value.to_unsigned()
                    self.strobes.setdefault((reg.name, i), []).append(data)

    async def read(self, addr: int) -> tuple[int, AxiResp]:
        resp = await self.axil.read(addr, 4)
        return int.from_bytes(resp.data, "little"), resp.resp

    async def write(self, addr: int, value: int, nbytes: int = 4) -> AxiResp:
        resp = await self.axil.write(addr, value.to_bytes(4, "little")[:nbytes])
        return resp.resp

    def expected_reset(self, reg, i) -> int:
        if reg.kind in (Kind.CONST, Kind.CONFIG):
            return reg.reset & field_mask(reg)
        if reg.kind is Kind.LEVEL:
            return self.levels[reg.name, i] & field_mask(reg)
        return 0                                        # COUNTER after reset; COMMAND is write-only

    async def check_all(self, expected: dict, what: str):
        for reg, i in self.elements:
            value, resp = await self.read(reg.address(i))
            assert resp == AxiResp.OKAY, f"{what}: read {reg.name}[{i}] answered {resp}"
            assert value == expected[reg.name, i], \
                f"{what}: {reg.name}[{i}] reads {value:#010x}, want {expected[reg.name, i]:#010x}"
            if reg.kind is Kind.CONFIG:
                port = self.sig(reg.name.lower(), reg, i).value.to_unsigned()
                assert port == expected[reg.name, i], f"{what}: port of {reg.name}[{i}] is {port:#x}"


@cocotb.test()
@cocotb.parametrize(**IDLE_BACKPRESSURE)
async def reset_values(dut, idle, backpressure):
    """Every register element reads its reset value with OKAY; every CONFIG port holds it."""
    tb = TB(dut)
    await tb.start(idle, backpressure)
    await tb.check_all({(r.name, i): tb.expected_reset(r, i) for r, i in tb.elements}, "after reset")
    assert not tb.strobes, f"command strobes without a write: {tb.strobes}"


@cocotb.test()
@cocotb.parametrize(**IDLE_BACKPRESSURE)
async def access_rules(dut, idle, backpressure):
    """A random word written to every register: RW keeps its field bits, RO ignores it, WO pulses once;
    then a partial write (SLVERR) to each register changes nothing."""
    tb = TB(dut, seed=1)
    await tb.start(idle, backpressure)
    expected = {(r.name, i): tb.expected_reset(r, i) for r, i in tb.elements}
    commands = {}
    for reg, i in tb.elements:
        value = tb.rng.getrandbits(32)
        resp = await tb.write(reg.address(i), value)
        assert resp == AxiResp.OKAY, f"write {reg.name}[{i}] answered {resp}"
        if reg.access is Access.RW:
            expected[reg.name, i] = value & field_mask(reg)
        elif reg.access is Access.WO:
            commands[reg.name, i] = [value & field_mask(reg)]
    await ClockCycles(dut.clk, 4)
    assert tb.strobes == commands, f"command strobes {tb.strobes}, want {commands}"
    await tb.check_all(expected, "after one write each")
    for reg, i in tb.elements:
        nbytes = tb.rng.choice([1, 2, 3])
        resp = await tb.write(reg.address(i), tb.rng.getrandbits(32), nbytes)
        assert resp == AxiResp.SLVERR, f"{nbytes}-byte write to {reg.name}[{i}] answered {resp}"
    await ClockCycles(dut.clk, 4)
    assert tb.strobes == commands, "a partial write pulsed a command strobe"
    await tb.check_all(expected, "after partial writes")


@cocotb.test()
@cocotb.parametrize(**IDLE_BACKPRESSURE)
async def unmapped_addresses(dut, idle, backpressure):
    """Every word address of the 4 KiB page outside the map: DECERR, reads 0, writes change nothing."""
    tb = TB(dut, seed=2)
    await tb.start(idle, backpressure)
    mapped = {reg.address(i) for reg, i in tb.elements}
    holes = [a for a in range(0, ADDR_SPACE, 4) if a not in mapped]
    assert len(holes) == ADDR_SPACE // 4 - len(mapped)
    if idle or backpressure:                             # the plain case covers all; the paused ones a sample
        holes = sorted(tb.rng.sample(holes, 96))
    for addr in holes:
        value, resp = await tb.read(addr)
        assert (value, resp) == (0, AxiResp.DECERR), f"read {addr:#x}: {value:#x} {resp}"
        resp = await tb.write(addr, tb.rng.getrandbits(32))
        assert resp == AxiResp.DECERR, f"write {addr:#x}: {resp}"
    await ClockCycles(dut.clk, 4)
    assert not tb.strobes, f"a write outside the map pulsed {tb.strobes}"
    await tb.check_all({(r.name, i): tb.expected_reset(r, i) for r, i in tb.elements}, "after unmapped writes")


@cocotb.test()
@cocotb.parametrize(**IDLE_BACKPRESSURE)
async def counters(dut, idle, backpressure):
    """Random increments on every counter's input for 200 cycles (and while reads are going on): each
    counter reads the sum so far, modulo 2**32."""
    tb = TB(dut, seed=3)
    await tb.start(idle, backpressure)
    counters = [(reg, i) for reg, i in tb.elements if reg.kind is Kind.COUNTER]
    width = len(tb.sig(f"{counters[0][0].name.lower()}_inc", *counters[0]))
    totals = {(reg.name, i): 0 for reg, i in counters}
    for _ in range(200):
        for reg, i in counters:
            inc = tb.rng.choice([0, 1, (1 << width) - 1, tb.rng.getrandbits(width)])
            tb.sig(f"{reg.name.lower()}_inc", reg, i).value = inc
            totals[reg.name, i] += inc
        await RisingEdge(dut.clk)
    for reg, i in counters:
        tb.sig(f"{reg.name.lower()}_inc", reg, i).value = 0
    await ClockCycles(dut.clk, 3)                      # the increment is registered before the adder
    expected = {(r.name, i): tb.expected_reset(r, i) for r, i in tb.elements}
    expected.update({k: v & 0xFFFF_FFFF for k, v in totals.items()})
    await tb.check_all(expected, "after 200 cycles of increments")
