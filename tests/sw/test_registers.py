# amaranth: UnusedElaboratable=no
"""The register map, its documentation, and the AXI4-Lite register bank (amaranth.sim).

The simulation tests drive the AXI4-Lite signals of AXI4LiteToCSR + RegisterBank by hand, one clock
cycle at a time, through a small engine that keeps each channel's payload stable until its handshake,
records every handshake and response with its cycle number, and checks the subordinate's side of the
protocol (responses only after their requests, valid held until ready, payload stable).
"""

import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.sim import Simulator

from cais.hdl.control.csr import (AXI4LiteSignature, AXI4LiteToCSR, AxiResp, CSRBusSignature, RegisterBank,
                          csr_addr_width)
from cais.params import SwitchParams
from cais.regdoc import render_markdown
from cais.registers import MAGIC, Access, Kind, RegisterFile, register_map

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "registers.md"
MAP = register_map()


# ---------------------------------------------------------------------------------------------------
# The map and its documentation


def test_doc_matches_register_map():
    expected = render_markdown(register_map())
    actual = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert actual == expected, (
        "docs/registers.md is out of date with cais.registers; regenerate it with\n"
        "    .venv/bin/python -m cais.regdoc > docs/registers.md")


def test_doc_names_every_register():
    for ports in (2, 16):
        rmap = register_map(SwitchParams(ports=ports))
        text = render_markdown(rmap)
        for reg in rmap:
            assert f"| {reg.name} |" in text or f"| {reg.name}[p] |" in text
            for i in range(reg.count):
                assert f"{reg.address(i):#05x}" in text


@pytest.mark.parametrize("ports", range(2, 17))
def test_map_layout(ports):
    rmap = register_map(SwitchParams(ports=ports))
    names = [r.name for r in rmap]
    assert len(names) == len(set(names)), "register names must be unique"
    used = {}
    for reg in rmap:
        assert reg.count >= 1
        assert reg.stride > 0 and reg.stride % 4 == 0, reg.name
        for i in range(reg.count):
            address = reg.address(i)
            assert address % 4 == 0, f"{reg.name}[{i}] misaligned"
            assert 0 <= address < rmap.size, f"{reg.name}[{i}] outside the map"
            assert address not in used, f"{reg.name}[{i}] overlaps {used[address]} at {address:#x}"
            used[address] = f"{reg.name}[{i}]"
        assert 0 <= reg.reset < 2**32, reg.name
        bits = 0
        for f in reg.fields:
            assert f.width >= 1 and f.lsb >= 0 and f.lsb + f.width <= 32, f"{reg.name}.{f.name} does not fit"
            assert bits & f.mask == 0, f"{reg.name}.{f.name} overlaps another field"
            bits |= f.mask
        if reg.fields:
            assert reg.reset & ~bits == 0, f"{reg.name}: reset sets bits outside its fields"
        field_names = [f.name for f in reg.fields]
        assert len(field_names) == len(set(field_names)), reg.name
        if reg.kind in (Kind.CONST, Kind.COUNTER, Kind.LEVEL):
            assert reg.access is Access.RO, reg.name
        if reg.kind is Kind.COMMAND:
            assert reg.access is not Access.RO, reg.name
    assert rmap["NUM_PORTS"].reset == ports
    # The RTL derives its members and decoder from the same map without complaint.
    bank = RegisterBank(rmap)
    assert bank.addr_width == csr_addr_width(rmap)
    assert len(bank.rx_bytes_inc) == ports
    Fragment.get(bank, None)


@pytest.mark.parametrize("params", [SwitchParams(), SwitchParams(ports=16, data_width=128, slots=8, max_payload=512,
                                                     rules=32, mac_entries=200, max_frame=9018, float_units=False)],
                         ids=["default", "other"])
def test_params_read_back_from_the_const_registers(params):
    """read_params rebuilds every field of SwitchParams from the registers of a switch built with them (the
    reference model's registers), at offsets that do not depend on the parameters."""
    from dataclasses import fields

    from cais.link import run_sync
    from cais.registers import PARAM_REGISTERS, read_params
    from cais.sim.refmodel import SwitchModel

    assert set(PARAM_REGISTERS) == {f.name for f in fields(SwitchParams)}
    regs = register_map(params)
    for where in PARAM_REGISTERS.values():
        name = where[0] if isinstance(where, tuple) else where
        assert regs[name].kind is Kind.CONST and regs[name].address() == MAP[name].address()
    model = SwitchModel(params)

    async def read(addr):
        return model.read(addr)
    assert run_sync(read_params(read)) == params


def test_read_params_refuses_another_device_or_major():
    from cais.link import run_sync
    from cais.registers import VERSION, read_params

    def reader(ident, version):
        async def read(addr):
            return {0x000: ident, 0x004: version}.get(addr, 0)
        return read
    with pytest.raises(ValueError, match="ID reads 0x00000000, not 0x43414953"):
        run_sync(read_params(reader(0, VERSION)))
    with pytest.raises(ValueError, match=f"version {(VERSION >> 16) + 1}.0: this software speaks {VERSION >> 16}.x"):
        run_sync(read_params(reader(MAGIC, VERSION + 0x10000 & 0xFFFF0000)))
    with pytest.raises(ValueError, match="ports=0"):                       # a map whose constants make no switch
        run_sync(read_params(reader(MAGIC, VERSION)))


@pytest.mark.parametrize("ports", [2, 16])
def test_bank_elaborates(ports):
    rmap = register_map(SwitchParams(ports=ports))
    dut = BankWithBridge(rmap)
    text = rtlil.convert(dut)
    assert "axil__awready" in text and "rule_write_stb" in text


def test_bank_signature():
    bank = RegisterBank(MAP)
    Fragment.get(bank, None)
    members = bank.signature.members
    assert members["csr"] == In(CSRBusSignature(csr_addr_width(MAP)))
    assert members["switch_mac_lo"] == Out(32, init=MAP["SWITCH_MAC_LO"].reset)
    assert members["rule_group"] == Out(32, init=0)
    assert members["rule_write_stb"] == Out(1)
    assert members["rule_write_data"] == Out(32)
    assert members["drop_runt_inc"] == In(8)
    assert members["rx_bytes_inc"] == In(8).array(MAP.params.ports)
    assert members["slots_in_use_value"] == In(32)
    assert "id" not in members and "num_ports" not in members
    kinds = {Kind.CONFIG: 1, Kind.COMMAND: 2, Kind.COUNTER: 1, Kind.LEVEL: 1, Kind.CONST: 0}
    assert len(members) == 1 + sum(kinds[r.kind] for r in MAP)
    bank16 = RegisterBank(MAP, counter_inc_width=16)
    Fragment.get(bank16, None)
    assert bank16.signature.members["forwarded_inc"] == In(16)
    bridge = AXI4LiteToCSR(10)
    Fragment.get(bridge, None)
    bridge = bridge.signature.members
    assert bridge["axil"] == In(AXI4LiteSignature(10)) and bridge["csr"] == Out(CSRBusSignature(10))


# ---------------------------------------------------------------------------------------------------
# Simulation harness


class BankWithBridge(wiring.Component):
    """The register bank behind its AXI4-Lite bridge; the bank's switch-side ports are reached as
    ``dut.bank.<member>``."""

    def __init__(self, rmap=MAP, counter_inc_width=8, **kw):
        self.rmap = rmap
        self.bank = RegisterBank(rmap, counter_inc_width, **kw)
        self.bridge = AXI4LiteToCSR(self.bank.addr_width)
        super().__init__({"axil": In(AXI4LiteSignature(self.bank.addr_width))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = self.bridge
        m.submodules.bank = self.bank
        connect(m, wiring.flipped(self.axil), self.bridge.axil)
        connect(m, self.bridge.csr, self.bank.csr)
        return m


def simulate(dut, testbench, *background):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for bg in background:
        sim.add_testbench(bg, background=True)
    sim.add_testbench(testbench)
    sim.run()


def pause(*pattern, then=False):
    """Per-cycle hold-off flags: the pattern, then `then` forever."""
    return itertools.chain(pattern, itertools.repeat(then))


def random_pause(seed, p=0.5):
    rng = random.Random(seed)
    return (rng.random() < p for _ in itertools.count())


@dataclass
class Run:
    bresp: list = field(default_factory=list)
    rdata: list = field(default_factory=list)
    rresp: list = field(default_factory=list)
    events: list = field(default_factory=list)   # (cycle, "aw"|"w"|"ar"|"b"|"r", index)
    trace: list = field(default_factory=list)    # per cycle: tuple of probed values
    cycles: int = 0

    def cycle_of(self, kind, index=0):
        return next(c for c, k, i in self.events if k == kind and i == index)


async def axil(ctx, bus, *, writes=(), reads=(), aw_pause=None, w_pause=None, ar_pause=None,
               b_pause=None, r_pause=None, probe=(), timeout=2000):
    """Perform `writes` ((addr, data) or (addr, data, strb)) and `reads` (addr) on the AXI4-Lite
    subordinate `bus`; each channel issues its items in order as fast as its pause pattern allows.
    Returns the responses in order, the handshake/response cycles and a trace of `probe`."""
    writes = [w if len(w) == 3 else (*w, 0xF) for w in writes]
    reads = list(reads)
    no_pause = itertools.repeat(False)
    aw_pause, w_pause, ar_pause = (p or no_pause for p in (aw_pause, w_pause, ar_pause))
    b_pause, r_pause = (p or no_pause for p in (b_pause, r_pause))
    run = Run()
    n_aw = n_w = n_ar = 0
    aw_on = w_on = ar_on = False
    last_r = last_b = None   # (payload) of a response held off by the manager last cycle
    for cycle in range(timeout):
        # Manager side: present the next item of each channel unless paused (an item once presented
        # stays until its handshake).
        if not aw_on and n_aw < len(writes) and not next(aw_pause):
            ctx.set(bus.awaddr, writes[n_aw][0])
            ctx.set(bus.awprot, 0)
            ctx.set(bus.awvalid, 1)
            aw_on = True
        if not w_on and n_w < len(writes) and not next(w_pause):
            ctx.set(bus.wdata, writes[n_w][1])
            ctx.set(bus.wstrb, writes[n_w][2])
            ctx.set(bus.wvalid, 1)
            w_on = True
        if not ar_on and n_ar < len(reads) and not next(ar_pause):
            ctx.set(bus.araddr, reads[n_ar])
            ctx.set(bus.arprot, 0)
            ctx.set(bus.arvalid, 1)
            ar_on = True
        bready = not next(b_pause)
        rready = not next(r_pause)
        ctx.set(bus.bready, bready)
        ctx.set(bus.rready, rready)

        # What happens at the coming clock edge.
        aw_hs = aw_on and ctx.get(bus.awready)
        w_hs = w_on and ctx.get(bus.wready)
        ar_hs = ar_on and ctx.get(bus.arready)
        bvalid, rvalid = ctx.get(bus.bvalid), ctx.get(bus.rvalid)
        b = (ctx.get(bus.bresp),) if bvalid else None
        r = (ctx.get(bus.rdata), ctx.get(bus.rresp)) if rvalid else None
        if last_b is not None:
            assert b == last_b, f"cycle {cycle}: bvalid/bresp changed before bready"
        if last_r is not None:
            assert r == last_r, f"cycle {cycle}: rvalid/rdata/rresp changed before rready"
        if bvalid:
            assert len(run.bresp) < min(n_aw, n_w), f"cycle {cycle}: bvalid before AW and W"
        if rvalid:
            assert len(run.rdata) < n_ar, f"cycle {cycle}: rvalid before AR"
        run.trace.append(tuple(ctx.get(s) for s in probe))

        if aw_hs:
            run.events.append((cycle, "aw", n_aw))
        if w_hs:
            run.events.append((cycle, "w", n_w))
        if ar_hs:
            run.events.append((cycle, "ar", n_ar))
        if bvalid and bready:
            run.events.append((cycle, "b", len(run.bresp)))
            run.bresp.append(b[0])
        if rvalid and rready:
            run.events.append((cycle, "r", len(run.rdata)))
            run.rdata.append(r[0])
            run.rresp.append(r[1])
        last_b = b if bvalid and not bready else None
        last_r = r if rvalid and not rready else None

        await ctx.tick()

        if aw_hs:
            n_aw += 1
            aw_on = False
            ctx.set(bus.awvalid, 0)
        if w_hs:
            n_w += 1
            w_on = False
            ctx.set(bus.wvalid, 0)
        if ar_hs:
            n_ar += 1
            ar_on = False
            ctx.set(bus.arvalid, 0)
        if len(run.bresp) == len(writes) and len(run.rdata) == len(reads):
            run.cycles = cycle + 1
            ctx.set(bus.bready, 0)
            ctx.set(bus.rready, 0)
            return run
    raise AssertionError(f"AXI4-Lite transactions not finished after {timeout} cycles: {run}")


async def write(ctx, dut, addr, data, strb=0xF):
    return (await axil(ctx, dut.axil, writes=[(addr, data, strb)])).bresp[0]


async def read(ctx, dut, addr):
    run = await axil(ctx, dut.axil, reads=[addr])
    return run.rdata[0], run.rresp[0]


class SimBus:
    """The `read`/`write` bus RegisterFile wants, over the simulated AXI4-Lite port."""

    def __init__(self, ctx, dut):
        self.ctx, self.dut = ctx, dut

    async def read(self, addr):
        data, resp = await read(self.ctx, self.dut, addr)
        assert resp == AxiResp.OKAY, f"read {addr:#x}: resp {resp}"
        return data

    async def write(self, addr, value):
        resp = await write(self.ctx, self.dut, addr, value)
        assert resp == AxiResp.OKAY, f"write {addr:#x}: resp {resp}"


def strobe_monitor(dut, log):
    """Background testbench: append (name, data) for every cycle a command strobe is high."""
    commands = [r.name.lower() for r in dut.rmap if r.kind is Kind.COMMAND]

    async def monitor(ctx):
        while True:
            await ctx.tick()
            for name in commands:
                if ctx.get(getattr(dut.bank, f"{name}_stb")):
                    log.append((name, ctx.get(getattr(dut.bank, f"{name}_data"))))
    return monitor


def hole_addresses(rmap):
    used = {r.address(i) for r in rmap for i in range(r.count)}
    return [a for a in range(0, rmap.size, 4) if a not in used]


# ---------------------------------------------------------------------------------------------------
# Register behaviour


def test_constant_registers_read():
    dut = BankWithBridge()

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        assert await regs.read("ID") == MAGIC
        for reg in MAP:
            if reg.kind is Kind.CONST:
                assert await regs.read(reg.name) == reg.reset, reg.name
    simulate(dut, tb)


def test_config_reset_write_readback():
    dut = BankWithBridge()
    configs = [r for r in MAP if r.kind is Kind.CONFIG]
    rng = random.Random(1)

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        for reg in configs:
            assert await regs.read(reg.name) == reg.reset, reg.name
            assert ctx.get(getattr(dut.bank, reg.name.lower())) == reg.reset
        values = {}
        for reg in configs:
            values[reg.name] = rng.getrandbits(32)
            await regs.write(reg.name, values[reg.name])
        for reg in configs:
            mask = sum(f.mask for f in reg.fields) if reg.fields else 0xFFFF_FFFF
            expect = values[reg.name] & mask
            assert await regs.read(reg.name) == expect, reg.name
            assert ctx.get(getattr(dut.bank, reg.name.lower())) == expect, reg.name
        # Fields through the software accessor.
        await regs.write("RULE_PORTS", contributors=0b0111, results=0b1000)
        assert MAP["RULE_PORTS"].unpack(await regs.read("RULE_PORTS")) == {"contributors": 7, "results": 8}
        # Reserved bits are dropped: SWITCH_MAC_HI holds 16 bits.
        await regs.write("SWITCH_MAC_HI", 0xFFFF_FFFF)
        assert await regs.read("SWITCH_MAC_HI") == 0xFFFF
    simulate(dut, tb)


def test_command_strobe_pulses_once():
    dut = BankWithBridge()
    log = []

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        # (RULE_WRITE's field `index` collides with RegisterFile.write's element index: pack the word.)
        await regs.write("RULE_WRITE", MAP["RULE_WRITE"].pack(index=3, valid=1))
        await ctx.tick().repeat(5)
        assert log == [("rule_write", MAP["RULE_WRITE"].pack(index=3, valid=1))]
        await regs.write("MAC_WRITE", MAP["MAC_WRITE"].pack(index=15, port=2, valid=1))
        await regs.write("SLOT_CLEAR", slot=63)
        await regs.write("RULE_WRITE", MAP["RULE_WRITE"].pack(index=7, valid=0))
        await regs.write("RULE_WRITE", 7)   # the same word again: another pulse
        await ctx.tick().repeat(5)
        assert log == [
            ("rule_write", 0x103),
            ("mac_write", MAP["MAC_WRITE"].pack(index=15, port=2, valid=1)),
            ("slot_clear", 63),
            ("rule_write", 7),
            ("rule_write", 7),
        ]
        # The data stays after the strobe; the register is write-only and reads 0.
        assert ctx.get(dut.bank.rule_write_data) == 7
        assert ctx.get(dut.bank.slot_clear_data) == 63
        assert await read(ctx, dut, MAP["RULE_WRITE"].offset) == (0, AxiResp.OKAY)
        assert await read(ctx, dut, MAP["SLOT_CLEAR"].offset) == (0, AxiResp.OKAY)
        await ctx.tick().repeat(3)
        assert len(log) == 5, "reads must not strobe commands"
    simulate(dut, tb, strobe_monitor(dut, log))


def test_counters_count_increments():
    dut = BankWithBridge()
    P = MAP.params

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        assert await regs.read("DROP_RUNT") == 0
        ctx.set(dut.bank.drop_runt_inc, 3)
        ctx.set(dut.bank.forwarded_inc, 255)
        for p in range(P.ports):
            ctx.set(dut.bank.rx_bytes_inc[p], 60 + p)
            ctx.set(dut.bank.tx_frames_inc[p], p)
        await ctx.tick().repeat(10)
        ctx.set(dut.bank.drop_runt_inc, 0)
        ctx.set(dut.bank.forwarded_inc, 1)
        for p in range(P.ports):
            ctx.set(dut.bank.rx_bytes_inc[p], 0)
            ctx.set(dut.bank.tx_frames_inc[p], 0)
        await ctx.tick().repeat(5)
        ctx.set(dut.bank.forwarded_inc, 0)
        assert await regs.read("DROP_RUNT") == 30
        assert await regs.read("FORWARDED") == 10 * 255 + 5     # wider than the increment
        assert await regs.read("DROP_OVERSIZE") == 0
        for p in range(P.ports):
            assert await regs.read("RX_BYTES", p) == 10 * (60 + p)
            assert await regs.read("TX_FRAMES", p) == 10 * p
            assert await regs.read("RX_FRAMES", p) == 0
        # Counters are read-only: a write answers OKAY and changes nothing.
        assert await write(ctx, dut, MAP["DROP_RUNT"].offset, 0) == AxiResp.OKAY
        assert await regs.read("DROP_RUNT") == 30
        # A counter that keeps counting while it is read returns its value of the read's strobe cycle (the
        # cycle after the address is accepted): an increment presented in cycle t is counted from t + 2.
        ctx.set(dut.bank.drop_runt_inc, 1)                # presented from cycle s on
        await ctx.tick().repeat(5)
        value = await regs.read("DROP_RUNT")              # accepted in s + 5, strobe in s + 6
        ctx.set(dut.bank.drop_runt_inc, 0)
        assert value == 30 + (6 - 1)                      # the increments of cycles s .. s + 4
    simulate(dut, tb)


def test_counter_wraps_at_2_pow_32():
    # A 32-bit increment port reaches the wrap in two cycles; the counter logic is the same for every
    # increment width.
    dut = BankWithBridge(counter_inc_width=32)

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        ctx.set(dut.bank.completed_inc, 0xFFFF_FFF0)
        ctx.set(dut.bank.tx_bytes_inc[1], 0x8000_0000)
        await ctx.tick()
        ctx.set(dut.bank.completed_inc, 0x25)
        await ctx.tick()
        ctx.set(dut.bank.completed_inc, 0)
        await ctx.tick()
        ctx.set(dut.bank.tx_bytes_inc[1], 0)
        assert await regs.read("COMPLETED") == 0x15
        assert await regs.read("TX_BYTES", 1) == 0x8000_0000   # 3 * 2**31 mod 2**32
        assert await regs.read("TX_BYTES", 0) == 0
    simulate(dut, tb)


def test_level_reads_live_value():
    dut = BankWithBridge()

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        assert await regs.read("SLOTS_IN_USE") == 0
        ctx.set(dut.bank.slots_in_use_value, 0xDEAD_BEEF)
        assert await regs.read("SLOTS_IN_USE") == 0xDEAD_BEEF
        ctx.set(dut.bank.slots_in_use_value, 17)
        assert await regs.read("SLOTS_IN_USE") == 17
        assert await write(ctx, dut, MAP["SLOTS_IN_USE"].offset, 5) == AxiResp.OKAY
        assert await regs.read("SLOTS_IN_USE") == 17
    simulate(dut, tb)


def test_level_any_reads_the_or_of_its_parts():
    """BUSY given as 5 parts (level_any): a read returns 1 when any part is set, whichever it is, and 0 when
    none is; the member is 5 bits wide. A register that is not a one-element LEVEL is refused."""
    dut = BankWithBridge(level_any={"BUSY": 5})
    assert dut.bank.signature.members["busy_value"] == In(5)

    async def tb(ctx):
        regs = RegisterFile(SimBus(ctx, dut), MAP)
        assert await regs.read("BUSY") == 0
        for part in range(5):
            ctx.set(dut.bank.busy_value, 1 << part)
            assert await regs.read("BUSY") == 1, part
        ctx.set(dut.bank.busy_value, 0b10110)
        assert await regs.read("BUSY") == 1
        ctx.set(dut.bank.busy_value, 0)
        assert await regs.read("BUSY") == 0
    simulate(dut, tb)
    for bad in ({"SWITCH_MAC_LO": 3}, {"BUSY": 0}, {"RX_BYTES": 2}):
        with pytest.raises(ValueError, match="level_any"):
            RegisterBank(MAP, level_any=bad)


def test_read_only_writes_ignored():
    dut = BankWithBridge()
    log = []

    async def tb(ctx):
        for reg in MAP:
            if reg.access is Access.RO:
                for i in range(reg.count):
                    assert await write(ctx, dut, reg.address(i), 0x5A5A_5A5A) == AxiResp.OKAY
        for reg in MAP:
            expect = reg.reset if reg.access is Access.RW or reg.kind is Kind.CONST else 0
            for i in range(reg.count):
                assert await read(ctx, dut, reg.address(i)) == (expect, AxiResp.OKAY), reg.name
        assert log == []
    simulate(dut, tb, strobe_monitor(dut, log))


def test_out_of_map_addresses():
    dut = BankWithBridge()
    log = []
    holes = hole_addresses(MAP)
    assert 0x05C in holes and MAP.size - 4 in holes

    async def tb(ctx):
        for addr in (0x05C, 0x0FC, 0x1FC, MAP.size - 4):
            assert await read(ctx, dut, addr) == (0, AxiResp.DECERR), hex(addr)
            assert await write(ctx, dut, addr, 0xFFFF_FFFF) == AxiResp.DECERR, hex(addr)
        for addr in holes:   # every hole, reads only
            assert await read(ctx, dut, addr) == (0, AxiResp.DECERR), hex(addr)
        # The next access to a real register is answered normally, and nothing was written.
        assert await read(ctx, dut, MAP["ID"].offset) == (MAGIC, AxiResp.OKAY)
        for reg in MAP:
            if reg.kind is Kind.CONFIG:
                assert ctx.get(getattr(dut.bank, reg.name.lower())) == reg.reset
        assert log == []
    simulate(dut, tb, strobe_monitor(dut, log))


def test_partial_writes_rejected():
    dut = BankWithBridge()
    log = []
    lo = MAP["SWITCH_MAC_LO"]

    async def tb(ctx):
        for strb in (0x0, 0x1, 0x3, 0x7, 0xE, 0x8):
            assert await write(ctx, dut, lo.offset, 0x1234_5678, strb) == AxiResp.SLVERR
            assert await write(ctx, dut, MAP["RULE_WRITE"].offset, 0x101, strb) == AxiResp.SLVERR
        assert await read(ctx, dut, lo.offset) == (lo.reset, AxiResp.OKAY)
        assert log == []
        # Address bits 1:0 are ignored: the access is to the whole aligned word.
        assert await write(ctx, dut, lo.offset + 2, 0xCAFE_F00D) == AxiResp.OKAY
        assert await read(ctx, dut, lo.offset + 1) == (0xCAFE_F00D, AxiResp.OKAY)
    simulate(dut, tb, strobe_monitor(dut, log))


# ---------------------------------------------------------------------------------------------------
# AXI4-Lite channel behaviour


@pytest.mark.parametrize("aw_delay,w_delay", [(0, 0), (0, 1), (0, 6), (1, 0), (6, 0), (3, 3)],
                         ids=["together", "w+1", "w+6", "aw+1", "aw+6", "both+3"])
def test_write_channel_order(aw_delay, w_delay):
    dut = BankWithBridge()
    log = []
    reg = MAP["MAC_ADDR_LO"]

    async def tb(ctx):
        run = await axil(ctx, dut.axil, writes=[(reg.offset, 0x0BAD_CAFE), (MAP["RULE_WRITE"].offset, 0x105)],
                         aw_pause=pause(*[True] * aw_delay), w_pause=pause(*[True] * w_delay))
        assert run.bresp == [AxiResp.OKAY, AxiResp.OKAY]
        for k in range(2):
            assert run.cycle_of("aw", k) >= aw_delay and run.cycle_of("w", k) >= w_delay
            accepted = max(run.cycle_of("aw", k), run.cycle_of("w", k))
            assert run.cycle_of("b", k) == accepted + 3
        assert ctx.get(dut.bank.mac_addr_lo) == 0x0BAD_CAFE
        assert await read(ctx, dut, reg.offset) == (0x0BAD_CAFE, AxiResp.OKAY)
        assert log == [("rule_write", 0x105)]
    simulate(dut, tb, strobe_monitor(dut, log))


def test_latency():
    dut = BankWithBridge()
    cmd = MAP["SLOT_CLEAR"]
    probe = (dut.bank.csr.r_stb, dut.bank.csr.w_stb, dut.bank.slot_clear_stb, dut.bank.switch_mac_hi)

    async def tb(ctx):
        run = await axil(ctx, dut.axil, writes=[(cmd.offset, 9)], probe=probe)
        t = max(run.cycle_of("aw"), run.cycle_of("w"))
        assert [c for c, v in enumerate(run.trace) if v[1]] == [t + 1]       # w_stb
        assert [c for c, v in enumerate(run.trace) if v[2]] == [t + 2]       # command strobe
        assert run.cycle_of("b") == t + 3
        run = await axil(ctx, dut.axil, writes=[(MAP["SWITCH_MAC_HI"].offset, 0x1234)], probe=probe)
        t = max(run.cycle_of("aw"), run.cycle_of("w"))
        assert [v[3] for v in run.trace[t + 1:t + 3]] == [MAP["SWITCH_MAC_HI"].reset, 0x1234]
        run = await axil(ctx, dut.axil, reads=[MAP["ID"].offset], probe=probe)
        t = run.cycle_of("ar")
        assert [c for c, v in enumerate(run.trace) if v[0]] == [t + 1]       # r_stb
        assert run.cycle_of("r") == t + 4 and run.rdata == [MAGIC]         # the bank's two read steps
    simulate(dut, tb)


def test_write_then_read_ordering():
    dut = BankWithBridge()
    reg = MAP["RULE_CHUNK"]

    async def tb(ctx):
        # The read is issued one cycle after the write, before the write has been answered: it must
        # see the written value.
        run = await axil(ctx, dut.axil, writes=[(reg.offset, 0xFFFF_0042)], reads=[reg.offset],
                         ar_pause=pause(True))
        assert run.bresp == [AxiResp.OKAY] and run.rdata == [0xFFFF_0042]
        assert run.cycle_of("b") < run.cycle_of("r")
        # Back to back, each waiting for the previous response.
        for value in (1, 0x8000_0001, 0):
            assert await write(ctx, dut, reg.offset, value) == AxiResp.OKAY
            assert await read(ctx, dut, reg.offset) == (value, AxiResp.OKAY)
    simulate(dut, tb)


def test_simultaneous_read_and_write():
    dut = BankWithBridge()
    reg = MAP["RULE_GROUP"]

    async def tb(ctx):
        # Both in the same cycle: both complete; after reset the read goes first (old value).
        run = await axil(ctx, dut.axil, writes=[(reg.offset, 0x11)], reads=[reg.offset])
        assert run.bresp == [AxiResp.OKAY] and run.rresp == [AxiResp.OKAY]
        assert run.rdata == [0]
        assert run.cycle_of("r") < run.cycle_of("b")
        # Both channels kept busy: reads and writes alternate, neither starves.
        values = [0x22, 0x33, 0x44]
        run = await axil(ctx, dut.axil, writes=[(reg.offset, v) for v in values], reads=[reg.offset] * 3)
        order = [k for c, k, i in sorted(run.events) if k in ("r", "b")]
        assert order == ["r", "b", "r", "b", "r", "b"]
        assert run.rdata == [0x11, 0x22, 0x33]
        assert await read(ctx, dut, reg.offset) == (0x44, AxiResp.OKAY)
        # W waiting alone with AR: the write must still complete (no deadlock on a half write).
        run = await axil(ctx, dut.axil, writes=[(reg.offset, 0x55)], reads=[reg.offset],
                         aw_pause=pause(*[True] * 8))
        assert run.bresp == [AxiResp.OKAY] and run.rresp == [AxiResp.OKAY]
        assert await read(ctx, dut, reg.offset) == (0x55, AxiResp.OKAY)
    simulate(dut, tb)


@pytest.mark.parametrize("seed", range(3))
def test_random_pauses_and_backpressure(seed):
    dut = BankWithBridge()
    rng = random.Random(seed)
    configs = [r for r in MAP if r.kind is Kind.CONFIG]
    log = []

    async def tb(ctx):
        expect = {r.name: r.reset for r in configs}
        writes = []
        for _ in range(24):
            reg = rng.choice(configs)
            value = rng.getrandbits(32) & (sum(f.mask for f in reg.fields) if reg.fields else 0xFFFF_FFFF)
            writes.append((reg.offset, value))
            expect[reg.name] = value
        writes.append((MAP["MAC_WRITE"].offset, 0x1_0203))
        run = await axil(ctx, dut.axil, writes=writes,
                         aw_pause=random_pause(seed * 5 + 1), w_pause=random_pause(seed * 5 + 2),
                         b_pause=random_pause(seed * 5 + 3))
        assert run.bresp == [AxiResp.OKAY] * len(writes)
        reads = [r.offset for r in configs] + [MAP["ID"].offset, 0x05C]
        run = await axil(ctx, dut.axil, reads=reads,
                         ar_pause=random_pause(seed * 5 + 4), r_pause=random_pause(seed * 5 + 5, 0.7))
        assert run.rdata == [expect[r.name] for r in configs] + [MAGIC, 0]
        assert run.rresp == [AxiResp.OKAY] * (len(configs) + 1) + [AxiResp.DECERR]
        assert log == [("mac_write", 0x1_0203)]
    simulate(dut, tb, strobe_monitor(dut, log))


def test_idle_bus_stays_quiet():
    dut = BankWithBridge()

    async def tb(ctx):
        for _ in range(20):
            assert not ctx.get(dut.axil.bvalid) and not ctx.get(dut.axil.rvalid)
            assert not ctx.get(dut.bank.csr.r_stb) and not ctx.get(dut.bank.csr.w_stb)
            await ctx.tick()
        # Ready is offered to a request while idle.
        ctx.set(dut.axil.arvalid, 1)
        assert ctx.get(dut.axil.arready)
        ctx.set(dut.axil.arvalid, 0)
    simulate(dut, tb)
