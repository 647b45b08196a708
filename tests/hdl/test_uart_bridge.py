"""The UART (cais.hdl.board.uart) and the UART to AXI4-Lite bridge (cais.hdl.board.uart_bridge) in amaranth.sim,
the bridge in front of the switch's real register block (cais.hdl.blocks.CsrBlock).

The line is driven and read by a model written here from the 8N1 definition (start bit low, 8 data bits
least significant first, stop bit high), and the expected frames are written out by hand from the framing of
docs/board.md, never produced by the code under test; register values come from cais.registers.
"""

from __future__ import annotations

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from cais.hdl.blocks import CSR_ADDR_WIDTH, CsrBlock
from cais.hdl.board.uart import UartRx, UartTx, uart_divisor
from cais.hdl.board.uart_bridge import UartAxiLiteBridge
from cais.params import SwitchParams
from cais.registers import MAGIC, register_map

from blocksim import run

DIV = 4                                  # cycles per bit: the smallest the UART takes, for a short run
CLK = 4_000_000
BAUD = CLK // DIV
TIMEOUT = 20 * DIV                       # the shortest quiet the bridge takes: two byte times


def line_bits(byte: int, stop: int = 1) -> list[int]:
    return [0] + [(byte >> i) & 1 for i in range(8)] + [stop]


async def send(ctx, pin, data, stop: int = 1):
    for byte in data:
        for bit in line_bits(byte, stop):
            ctx.set(pin, bit)
            await ctx.tick().repeat(DIV)


async def receive(ctx, pin, count: int, limit: int = 2000) -> bytes:
    """``count`` bytes from the line, each sampled in the middle of its bits; fails after ``limit`` idle cycles."""
    out = bytearray()
    for _ in range(count):
        idle = 0
        while ctx.get(pin) == 1:
            await ctx.tick()
            idle += 1
            assert idle < limit, f"no start bit within {limit} cycles after {bytes(out).hex()}"
        await ctx.tick().repeat(DIV // 2)
        assert ctx.get(pin) == 0, "start bit too short"
        byte = 0
        for i in range(8):
            await ctx.tick().repeat(DIV)
            byte |= ctx.get(pin) << i
        await ctx.tick().repeat(DIV)
        assert ctx.get(pin) == 1, f"byte {byte:#04x}: stop bit low"
        out.append(byte)
    return bytes(out)


def test_divisor_limits():
    assert uart_divisor(100_000_000, 115_200) == 868
    assert uart_divisor(12, 3) == 4
    with pytest.raises(ValueError, match=r"3\.00 cycles per bit; at least 4"):
        uart_divisor(9, 3)
    # 10 / 4 = 2.5 -> divisor 2 < 4; 45 / 10 = 4.5 -> divisor 4 (round half to even): 11.25 baud, 12.5% off
    with pytest.raises(ValueError, match=r"divisor 4 gives 11 baud, 12\.50% off"):
        uart_divisor(45, 10)
    with pytest.raises(ValueError, match="baud must be a positive integer"):
        uart_divisor(100, 0)


def test_uart_loopback_and_framing_error():
    """The transmitter's line into the receiver: every byte comes out; a byte with a low stop bit driven by
    the model is dropped and flagged, and the next byte is received."""
    m = Module()
    m.submodules.rx = rx = UartRx(CLK, BAUD)
    m.submodules.tx = tx = UartTx(CLK, BAUD)
    got, errors = [], []
    data = [0x00, 0xFF, 0x55, 0xA3, 0x01, 0x80]

    async def transmit(ctx):
        for b in data:
            ctx.set(tx.data, b)
            ctx.set(tx.valid, 1)
            await ctx.tick().until(tx.ready)
        ctx.set(tx.valid, 0)

    async def loop(ctx):
        for _ in range(len(data) * 10 * DIV + 40):
            ctx.set(rx.rx, ctx.get(tx.tx))
            await ctx.tick()
        ctx.set(rx.rx, 1)
        await ctx.tick().repeat(4)
        await send(ctx, rx.rx, [0x5A], stop=0)             # a framing error, then a good byte
        ctx.set(rx.rx, 1)
        await ctx.tick().repeat(DIV)
        await send(ctx, rx.rx, [0x3C])
        await ctx.tick().repeat(8)

    async def watch(ctx):
        async for _, _, valid, err, byte in ctx.tick().sample(rx.valid, rx.framing_error, rx.data):
            if err:
                errors.append(len(got))
            if valid:
                got.append(byte)

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(transmit)
    sim.add_testbench(loop)
    sim.add_process(watch)
    sim.run()
    assert got == data + [0x3C]
    assert errors == [len(data)]


def bridge_top(params):
    m = Module()
    m.submodules.bridge = bridge = UartAxiLiteBridge(CLK, BAUD, CSR_ADDR_WIDTH, timeout_cycles=TIMEOUT)
    m.submodules.csr = csr = CsrBlock(params)
    wiring.connect(m, bridge.bus, csr.s_axil)
    return m, bridge, csr


def test_bridge_directed():
    """Hand-written frames through the bridge to the real register block: each reply byte for byte, and
    the registers changed only by good writes. The check bytes were worked out once by long division by
    x^8 + x^2 + x + 1 (a method apart from cais.uartproto.crc8, checked on the catalogue's "123456789" ->
    0xf4) and written here as literals."""
    small = SwitchParams(ports=2, rules=1)             # a small register block: a shorter simulation
    regs = register_map(small)
    m, bridge, csr = bridge_top(small)
    mac_lo = regs["SWITCH_MAC_LO"]
    assert (regs["ID"].address(), mac_lo.address(), regs["EPOCH"].address()) == (0x000, 0x020, 0x03C)
    cases = [
        # READ ID: 52 00000000 -> OK 43414953 ("CAIS")
        (bytes.fromhex("52 00000000 3e"), bytes([0x00]) + MAGIC.to_bytes(4, "big") + bytes([0x14]), None),
        # WRITE EPOCH = 0x12345678
        (bytes.fromhex("57 0000003c 12345678 2b"), bytes.fromhex("00 00000000 00"), ("epoch", 0x12345678)),
        # READ EPOCH
        (bytes.fromhex("52 0000003c 8a"), bytes.fromhex("00 12345678 1c"), None),
        # WRITE EPOCH = 0xdeadbeef with the check byte off by one: BAD_CHECKSUM, EPOCH unchanged
        (bytes.fromhex("57 0000003c deadbeef fe"), bytes.fromhex("01 00000000 62"), ("epoch", 0x12345678)),
        # READ 0x0FFC: no register there (DECERR): BUS_ERROR
        (bytes.fromhex("52 00000ffc 07"), bytes.fromhex("03 00000000 a6"), None),
        # READ 0x1000: past the 12-bit bus: BUS_ERROR without an access
        (bytes.fromhex("52 00001000 69"), bytes.fromhex("03 00000000 a6"), None),
        # READ 0x0002: not a word address: BUS_ERROR
        (bytes.fromhex("52 00000002 30"), bytes.fromhex("03 00000000 a6"), None),
        # CLOCK: the clock in Hz (4 MHz = 0x003d0900)
        (bytes.fromhex("43 00000000 6e"), bytes.fromhex("00 003d0900 cd"), None),
        # an unknown command byte, then more bytes: one UNKNOWN_COMMAND once the line is quiet
        (bytes.fromhex("58 01 02 03"), bytes.fromhex("02 00000000 c4"), ("epoch", 0x12345678)),
        # half a WRITE, then quiet: TIMEOUT, EPOCH unchanged
        (bytes.fromhex("57 0000003c 00"), bytes.fromhex("04 00000000 8f"), ("epoch", 0x12345678)),
    ]
    replies = []

    async def bench(ctx):
        ctx.set(bridge.rx, 1)
        await ctx.tick().repeat(8)
        for request, _, _ in cases:
            await send(ctx, bridge.rx, request)
            reply = await receive(ctx, bridge.tx, 6)
            replies.append(reply)
        ctx.set(bridge.rx, 1)
        replies.append((ctx.get(csr.epoch), ctx.get(bridge.error_replies)))

    run(m, bench)
    for (request, want, _), reply in zip(cases, replies):
        assert reply == want, f"request {request.hex()}: reply {reply.hex()}, want {want.hex()}"
    assert replies[-1] == (0x12345678, 6)
