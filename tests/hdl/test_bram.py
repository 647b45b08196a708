# amaranth: UnusedElaboratable=no
"""cais.hdl.common.bram.OutputRegisteredRAM: the simulation model against a Python dict with the documented
read latency (2: the read, then the output register), and the ECP5 form (DP16KD instances with the output
register) against yosys' own ECP5 mapping of the same memory without it: every DP16KD pin that carries an
address, write-data or read-data bit must carry the same bit as in yosys' inferred RAM (yosys' brams_map_16kd.v
is the independent reference for which pin is which in each aspect ratio)."""

import gc
import random
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable

from cais.hdl.common.bram import ECP5_SYNTHESIS, OutputRegisteredRAM, dp16kd_mode
from cais.hdl.latency import BANK_READ
from cais.hdl.sram.banks import ContributionBanks
from cais.params import SwitchParams

from blocksim import run
from ecp5synth import port_bits, synth_json

#: docs/core-design.md's banks: a read in cycle t shows its row from t + 2 (restated: the contract under test)
READ_LATENCY = 2


def test_latency_attributes():
    assert OutputRegisteredRAM.read_latency == READ_LATENCY == BANK_READ
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)   # its RAMs, made and never elaborated here
        banks = ContributionBanks(SwitchParams())
        assert banks.read_latency == READ_LATENCY
        # the banks' write is registered (docs/core-design.md): seen by reads two cycles on
        assert banks.write_latency == 2 and all(bank.registered_write for bank in banks.banks)
        del banks
        gc.collect()


@pytest.mark.parametrize("width, depth", [(8, 4096), (64, 64), (20, 1000)])
def test_dp16kd_mode_is_the_fewest_blocks(width, depth):
    """Hand-derived: 4096 rows need the 4-bit mode (4K x 4); 64 and 1000 rows fit the 18-bit one (1K x 18)."""
    bits, rows = dp16kd_mode(width, depth)
    assert rows >= depth
    assert (bits, rows) == {4096: (4, 4096), 64: (18, 1024), 1000: (18, 1024)}[depth]
    assert OutputRegisteredRAM(width, depth).blocks == -(-width // bits)


@pytest.mark.parametrize("width, depth", [(0, 16), (8, 0)])
def test_bad_shapes_refused(width, depth):
    with pytest.raises(ValueError, match="rows"):
        OutputRegisteredRAM(width, depth)


def test_deeper_than_one_block_is_the_fabric_form():
    """More rows than one DP16KD holds (16,384): no tiling (no cascade is built), the memory and a register."""
    with pytest.raises(ValueError, match="deeper than one DP16KD"):
        dp16kd_mode(8, 16385)
    ram = OutputRegisteredRAM(8, 65536)
    assert (ram.mode, ram.blocks) == (None, None)
    from amaranth.back import rtlil
    text = rtlil.convert(ram, platform=ECP5_SYNTHESIS)
    assert "DP16KD" not in text and "out_reg" in text


@pytest.mark.parametrize("registered_write, write_latency", [(False, 1), (True, 2)])
def test_simulation_model_against_a_dict(registered_write, write_latency):
    """Random writes and reads (enables dense and sparse): every cycle's ``rd_data`` is the row of the last
    enabled read issued at least READ_LATENCY edges before, as the dict held it when that read was issued:
    the writes of ``write_latency`` or more cycles before seen, later ones not (1: the same cycle's write
    not; 2, with the write registered: the previous cycle's not either)."""
    width, depth = 12, 64
    dut = OutputRegisteredRAM(width, depth, registered_write=registered_write)
    assert dut.write_latency == write_latency
    rng = random.Random(7)
    checked = []

    async def tb(ctx):
        model, issued, shown = {}, [], None      # issued: [edges left, expected row]
        writes = []                              # (cycle, address, data), not yet in the model
        for cycle in range(600):
            while writes and writes[0][0] <= cycle - write_latency:
                _, addr, data = writes.pop(0)
                model[addr] = data
            dense = (cycle // 100) % 2 == 0
            wr_en = rng.random() < (0.7 if dense else 0.2)
            rd_en = rng.random() < (0.7 if dense else 0.25)
            wa, wd = rng.randrange(depth), rng.randrange(1 << width)
            recent = [w[1] for w in writes[-2:]]          # rows being written: the reads that tell
            ra = rng.choice([wa, *recent, rng.randrange(depth)]) if model else rng.randrange(depth)
            ctx.set(dut.wr_addr, wa)
            ctx.set(dut.wr_data, wd)
            ctx.set(dut.wr_en, wr_en)
            ctx.set(dut.rd_addr, ra)
            ctx.set(dut.rd_en, rd_en)
            if rd_en:
                issued.append([READ_LATENCY, model.get(ra)])
            if wr_en:
                writes.append((cycle, wa, wd))
            await ctx.tick()
            for entry in issued:
                entry[0] -= 1
            while issued and issued[0][0] == 0:
                shown = issued.pop(0)[1]
            if shown is not None:
                assert ctx.get(dut.rd_data) == shown, f"cycle {cycle}"
                checked.append(cycle)

    run(dut, tb)
    assert len(checked) > 400


# ---- the ECP5 form against yosys' inference


def _roles(module):
    """Per DP16KD: which side writes (WE driven by wr_en), its width, and the pins that carry a port bit:
    {("write"|"read", pin kind, pin index): (port, bit)} over all blocks, the blocks told apart by the
    write-data bits they hold."""
    names = port_bits(module)
    cells = [c for c in module["cells"].values() if c["type"] == "DP16KD"]
    found = {}
    for cell in cells:
        conn, par = cell["connections"], cell["parameters"]
        write_side = next(s for s in "AB" if names.get(conn[f"WE{s}"][0], (None,))[0] == "wr_en")
        read_side = "B" if write_side == "A" else "A"
        width = int(par[f"DATA_WIDTH_{write_side}"], 2)
        assert int(par[f"DATA_WIDTH_{read_side}"], 2) == width
        for role, side in (("write", write_side), ("read", read_side)):
            for kind in ("AD", "DI", "DO"):
                for i in range(18 if kind != "AD" else 14):
                    bits = conn.get(f"{kind}{side}{i}")
                    if bits and bits[0] in names:
                        found[(role, kind, i, names[conn[f"DI{write_side}0"][0]])] = names[bits[0]]
        found[("width", names[conn[f"DI{write_side}0"][0]])] = width
    return cells, found


@pytest.mark.pnr
@pytest.mark.parametrize("width, depth", [(8, 4096), (18, 2048), (16, 1024)])
def test_ecp5_pins_match_yosys_inference(tmp_path, width, depth):
    """The same memory inferred by yosys (a Memory with a plain synchronous read port, on a clock of its own)
    maps to DP16KD
    blocks whose address, data-in and data-out pins carry the same port bits as the instances; the
    instances have the output register (REGMODE of the read side OUTREG), the inferred ones not."""
    from amaranth.hdl import ClockDomain, ClockSignal, Module
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out
    from amaranth.utils import ceil_log2

    class Inferred(wiring.Component):
        def __init__(self):
            a = ceil_log2(depth)
            super().__init__({"wr_addr": In(a), "wr_data": In(width), "wr_en": In(1),
                              "rd_addr": In(a), "rd_en": In(1), "rd_data": Out(width), "rd_clk": In(1)})

        def elaborate(self, platform):
            m = Module()
            # the read port on a clock of its own, so that yosys has no same-clock collision to emulate
            # with soft logic: the RAM's pins then connect straight to the ports
            m.domains.rd = ClockDomain("rd", reset_less=True)
            m.d.comb += ClockSignal("rd").eq(self.rd_clk)
            m.submodules.mem = mem = Memory(shape=width, depth=depth, init=[])
            wr, rd = mem.write_port(), mem.read_port(domain="rd")
            m.d.comb += [wr.addr.eq(self.wr_addr), wr.data.eq(self.wr_data), wr.en.eq(self.wr_en),
                         rd.addr.eq(self.rd_addr), rd.en.eq(self.rd_en), self.rd_data.eq(rd.data)]
            return m

    mine = synth_json(OutputRegisteredRAM(width, depth), tmp_path, "mine")
    ref = synth_json(Inferred(), tmp_path, "ref")
    my_cells, my_pins = _roles(mine)
    ref_cells, ref_pins = _roles(ref)
    assert len(my_cells) == len(ref_cells) == -(-width // dp16kd_mode(width, depth)[0])
    assert my_pins == ref_pins
    for cell in my_cells:
        assert cell["parameters"]["REGMODE_B"] == "OUTREG" and cell["parameters"]["REGMODE_A"] == "NOREG"
    for cell in ref_cells:
        assert "OUTREG" not in (cell["parameters"]["REGMODE_A"], cell["parameters"]["REGMODE_B"])
    # nothing else holds state in the instances' netlist: the read data is the RAM's own register
    assert not [c for c in mine["cells"].values() if c["type"].startswith("TRELLIS_FF")]


def _through_flops(module):
    """The module with every DP16KD pin that a TRELLIS_FF drives connected to that flip-flop's input instead,
    and per flip-flop the DP16KD cells its output reaches."""
    flops = {c["connections"]["Q"][0]: (name, c["connections"]["DI"][0])
             for name, c in module["cells"].items() if c["type"] == "TRELLIS_FF"}
    reaches = {name: set() for name, _ in flops.values()}
    cells = {}
    for name, cell in module["cells"].items():
        if cell["type"] != "DP16KD":
            continue
        conn = {}
        for pin, bits in cell["connections"].items():
            if bits and bits[0] in flops:
                reaches[flops[bits[0]][0]].add(name)
                bits = [flops[bits[0]][1]]
            conn[pin] = bits
        cells[name] = {**cell, "connections": conn}
    return {**module, "cells": cells}, reaches


@pytest.mark.pnr
@pytest.mark.parametrize("width, depth", [(64, 4096), (18, 1024)])
def test_ecp5_registered_write_has_each_blocks_own_flip_flops(tmp_path, width, depth):
    """``registered_write`` on ECP5: every DP16KD's write address, write enable and write-data pins are driven
    by flip-flops (TRELLIS_FF) whose inputs carry exactly the port bits the unregistered RAM's pins carry,
    and each flip-flop reaches one block only (a copy per block, none merged by yosys); the read side is
    the unregistered one's."""
    bits = dp16kd_mode(width, depth)[0]
    blocks = -(-width // bits)
    plain = synth_json(OutputRegisteredRAM(width, depth), tmp_path, "plain")
    mine = synth_json(OutputRegisteredRAM(width, depth, registered_write=True), tmp_path, "mine")
    resolved, reaches = _through_flops(mine)
    my_cells, my_pins = _roles(resolved)
    plain_cells, plain_pins = _roles(plain)
    assert len(my_cells) == len(plain_cells) == blocks
    assert my_pins == plain_pins
    assert all(len(cells) == 1 for cells in reaches.values()), "a flip-flop drives more than one block"
    # per block: the address bits the mode uses, its data bits and the enable, each its own flip-flop
    addr_bits = max(depth - 1, 1).bit_length()
    assert len(reaches) == blocks * (addr_bits + 1) + width
    names = port_bits(mine)
    for name in resolved["cells"]:               # the unresolved netlist: no write pin straight from a port
        conn = mine["cells"][name]["connections"]
        assert conn["WEA"][0] not in names, "the write enable reaches a block without its flip-flop"
        assert not any(conn[f"DIA{i}"][0] in names for i in range(18) if f"DIA{i}" in conn)


@pytest.mark.pnr
def test_ecp5_frame_fifo_reads_without_a_handshake_on_the_block_pins(tmp_path):
    """A FrameFifo with a registered output on ECP5: its DP16KD blocks have their output register on, their
    read and output-register enables (CEB, OCEB) are tied high (no reader's ready reaches a block's pin,
    7f8ad48's limit), and every data-out bit goes straight into flip-flops (the skid's entries), no LUT
    behind the block."""
    from cais.hdl.common.frame_fifo import FrameFifo

    width, depth = 73, 512
    mod = synth_json(FrameFifo(width, depth, registered_output=True), tmp_path, "fifo")
    cells = mod["cells"].values()
    rams = [c for c in cells if c["type"] == "DP16KD"]
    assert len(rams) == -(-width // dp16kd_mode(width, depth)[0])
    sinks = {}                                   # net bit -> the (cell type, pin) it reaches
    for c in cells:
        for pin, bits in c["connections"].items():
            if c["port_directions"].get(pin) == "input":
                for b in bits:
                    sinks.setdefault(b, []).append((c["type"], pin))
    read_bits = 0
    for ram in rams:
        assert ram["parameters"]["REGMODE_B"] == "OUTREG"
        conn = ram["connections"]
        assert conn["CEB"] == ["1"] and conn["OCEB"] == ["1"], (conn["CEB"], conn["OCEB"])
        for pin, bits in conn.items():
            if pin.startswith("DOB") and bits[0] in sinks:
                assert {t for t, _ in sinks[bits[0]]} == {"TRELLIS_FF"}, (pin, sinks[bits[0]])
                assert {p for _, p in sinks[bits[0]]} == {"DI"}, (pin, sinks[bits[0]])
                read_bits += 1
    assert read_bits == width, "every bit of a beat is read out of the blocks"
