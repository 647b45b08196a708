"""The UART control path (top ``cais_uart`` of cais.hdl.blocks: UartAxiLiteBridge driving the switch's real
register block) under cocotbext-uart's UartSource / UartSink on its pins.

Requests are built with cais.uartproto (whose bytes tests/sw/test_serial_link.py checks against hand-worked
frames); every expected register value comes from cais.registers.register_map; every outcome is the one
docs/board.md ("Control over UART") states. The last test runs the real host code (SerialLink and the
controller of cais.controller) in a thread on a pty pumped to the pins (cais.sim.links.serial.PtyUart).
"""

from __future__ import annotations

import os
import time

import cocotb
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from cocotbext.uart import UartSink, UartSource

from cais.hdl.blocks import UART_BAUD, UART_CLK_FREQ
from cais.registers import Access, Kind, register_map
from cais.tb.common import CLOCK_NS, clock_and_reset, quiet_bfms, tb_params
from cais.uartproto import REPLY_BYTES, TIMEOUT_BYTE_TIMES, Command, Status, decode_reply, encode_request

DIVISOR = UART_CLK_FREQ // UART_BAUD
TIMEOUT_CYCLES = TIMEOUT_BYTE_TIMES * 10 * DIVISOR          # the bridge's default quiet time


def field_mask(reg) -> int:
    mask = 0
    for f in reg.fields:
        mask |= f.mask
    return mask if reg.fields else 0xFFFF_FFFF


def port(dut, base: str, reg, i: int = 0):
    return getattr(dut, f"{base}__{i}" if reg.count > 1 else base)


class TB:
    def __init__(self, dut):
        assert 1e9 / CLOCK_NS == UART_CLK_FREQ, "the uart block's clock is not the testbenches' clock"
        self.dut = dut
        self.params = tb_params()
        self.regs = register_map(self.params)
        quiet_bfms(dut)
        for reg in self.regs:
            for i in range(reg.count):
                if reg.kind is Kind.COUNTER:
                    port(dut, f"{reg.name.lower()}_inc", reg, i).value = 0
                elif reg.kind is Kind.LEVEL:
                    port(dut, f"{reg.name.lower()}_value", reg, i).value = 0
        self.strobes = {}                 # command register name -> [word of every strobe]
        self.source = self.sink = None
        self.seq = 0                      # the seq of the last request framed

    def frame(self, command: Command, addr: int = 0, data: int | None = None, *, again: bool = False) -> bytes:
        """A request with the next seq (``again``: the last one's, as a host's retry)."""
        if not again:
            self.seq = (self.seq + 1) & 0xFF
        return encode_request(command, self.seq, addr, data)

    async def start(self, models: bool = True):
        self.dut.rx.value = 1
        await clock_and_reset(self.dut)
        if models:
            self.source = UartSource(self.dut.rx, baud=UART_BAUD)
            self.sink = UartSink(self.dut.tx, baud=UART_BAUD)
        for reg in self.regs:
            if reg.kind is Kind.COMMAND:
                cocotb.start_soon(self._watch(reg))

    async def _watch(self, reg):
        stb, data = port(self.dut, f"{reg.name.lower()}_stb", reg), port(self.dut, f"{reg.name.lower()}_data", reg)
        while True:                       # woken by the strobe's edges only: no Python in every cycle
            await RisingEdge(stb)
            await ReadOnly()
            self.strobes.setdefault(reg.name, []).append(data.value.to_unsigned())

    async def reply(self, limit: int = 3 * TIMEOUT_CYCLES) -> tuple[Status, int]:
        """The next whole reply, decoded: (status, data); its seq must be the last request's (but for
        UNKNOWN_COMMAND and TIMEOUT, whose seq means nothing). Fails after ``limit`` cycles."""
        got = bytearray()
        for _ in range(0, limit, 50):
            got += self.sink.read_nowait()
            if len(got) >= REPLY_BYTES:
                assert len(got) == REPLY_BYTES, f"more than one reply: {bytes(got).hex()}"
                status, seq, data = decode_reply(bytes(got))
                if status not in (Status.UNKNOWN_COMMAND, Status.TIMEOUT):
                    assert seq == self.seq, f"reply {bytes(got).hex()} to seq {seq}, not {self.seq}"
                return status, data
            await ClockCycles(self.dut.clk, 50)
        raise AssertionError(f"no whole reply within {limit} cycles (got {bytes(got).hex()})")

    async def request(self, frame: bytes) -> tuple[Status, int]:
        await self.source.write(frame)
        return await self.reply()

    async def read(self, name: str, i: int = 0) -> int:
        status, value = await self.request(self.frame(Command.READ, self.regs[name].address(i)))
        assert status is Status.OK, f"READ {name}[{i}]: {status.name}"
        return value

    async def write(self, name: str, value: int, i: int = 0) -> None:
        status, _ = await self.request(self.frame(Command.WRITE, self.regs[name].address(i), value))
        assert status is Status.OK, f"WRITE {name}[{i}]: {status.name}"

    def config_port(self, name: str) -> int:
        return port(self.dut, name.lower(), self.regs[name]).value.to_unsigned()

    async def send_line_bits(self, bits):
        """Drive the rx pin by hand, one bit per bit time (the UartSource must be idle)."""
        for bit in bits:
            self.dut.rx.value = bit
            await ClockCycles(self.dut.clk, DIVISOR)
        self.dut.rx.value = 1


@cocotb.test()
async def reads_and_writes(dut):
    """Every CONST register reads its value from cais.registers; CLOCK answers the clock; a CONFIG register
    written reads back and drives its port; a COMMAND write strobes once with the word."""
    tb = TB(dut)
    await tb.start()
    for reg in tb.regs:
        if reg.kind is Kind.CONST:
            assert await tb.read(reg.name) == reg.reset, f"{reg.name}"
    assert await tb.request(tb.frame(Command.CLOCK)) == (Status.OK, UART_CLK_FREQ)
    for name, value in (("EPOCH", 0xA5C3_0F01), ("SWITCH_MAC_LO", 0x1234_5678)):
        await tb.write(name, value)
        want = value & field_mask(tb.regs[name])
        assert await tb.read(name) == want
        assert tb.config_port(name) == want
    await tb.write("RULE_WRITE", tb.regs["RULE_WRITE"].pack(index=3, valid=1))
    assert tb.strobes == {"RULE_WRITE": [3 | 1 << 8]}
    # the same WRITE again with its seq (a host's retry after a lost reply): OK, and no second strobe
    assert await tb.request(tb.frame(Command.WRITE, tb.regs["RULE_WRITE"].address(), 3 | 1 << 8, again=True)) \
        == (Status.OK, 0)
    await tb.write("RULE_WRITE", tb.regs["RULE_WRITE"].pack(index=4, valid=1))      # a new seq: performed
    assert tb.strobes == {"RULE_WRITE": [3 | 1 << 8, 4 | 1 << 8]}
    assert int(dut.error_replies.value) == 0 and int(dut.framing_errors.value) == 0


@cocotb.test()
async def bad_requests_change_nothing(dut):
    """A bad check byte, an unknown command, a request cut mid-way, an unmapped or misaligned address: each
    gets its status, no register or strobe changes, and a good request right after is served."""
    tb = TB(dut)
    await tb.start()
    await tb.write("EPOCH", 0x1111_1111)
    epoch = tb.regs["EPOCH"].address()
    good = tb.frame(Command.WRITE, epoch, 0x2222_2222)
    assert await tb.request(good[:-1] + bytes([good[-1] ^ 0x01])) == (Status.BAD_CHECKSUM, 0)
    assert await tb.request(bytes([0x58]) + good[1:]) == (Status.UNKNOWN_COMMAND, 0)
    await tb.source.write(good[:4])                         # cut: the line goes quiet
    assert await tb.reply() == (Status.TIMEOUT, 0)
    rule_write = tb.regs["RULE_WRITE"].address()
    unmapped = 0x400                                        # past the map, inside the 4 KiB page: DECERR
    for addr in (0x0FFC, unmapped, 0x1000, 0x8000_0000, rule_write + 2):
        assert await tb.request(tb.frame(Command.WRITE, addr, 0x3 | 1 << 8)) == (Status.BUS_ERROR, 0), hex(addr)
        assert await tb.request(tb.frame(Command.READ, addr)) == (Status.BUS_ERROR, 0), hex(addr)
    assert tb.config_port("EPOCH") == 0x1111_1111 and await tb.read("EPOCH") == 0x1111_1111
    assert tb.strobes == {}, f"command strobes from refused requests: {tb.strobes}"
    assert int(dut.error_replies.value) == 3 + 10
    await tb.write("EPOCH", 0x2222_2222)                    # in step again
    assert tb.config_port("EPOCH") == 0x2222_2222


@cocotb.test()
async def framing_error_counted_and_dropped(dut):
    """A byte whose stop bit is low is dropped and counted; the request it was part of ends in TIMEOUT (a
    byte short); the next request is served."""
    tb = TB(dut)
    await tb.start()
    frame = tb.frame(Command.WRITE, tb.regs["EPOCH"].address(), 0x0BAD_0BAD)
    await tb.source.write(frame[:3])
    await tb.source.wait()
    byte = frame[3]
    await tb.send_line_bits([0] + [(byte >> i) & 1 for i in range(8)] + [0, 0])     # stop bit low
    await ClockCycles(dut.clk, 2 * DIVISOR)
    assert int(dut.framing_errors.value) == 1
    await tb.source.write(frame[4:])
    # 10 of the WRITE's 11 bytes arrived: the request waits for its check byte until the line is quiet
    assert await tb.reply() == (Status.TIMEOUT, 0)
    assert tb.config_port("EPOCH") == 0
    await tb.write("EPOCH", 7)
    assert tb.config_port("EPOCH") == 7


@cocotb.test()
async def controller_over_a_pty(dut):
    """The real host code on a pty pumped to the pins: SerialLink reads the build parameters from the CONST
    registers, the controller (cais.controller) programs the MAC table and a group's rule, and reads the
    counters back. Every register write it makes is seen at the register block (CONFIG ports, command
    strobes); the counters read equal the increments driven here."""
    from cais.sim.links.serial import PtyUart, controller_session

    tb = TB(dut)
    await tb.start(models=False)
    pty = PtyUart(dut.clk, dut.rx, dut.tx, UART_BAUD)
    # counters and gauges the controller will read: a few increments and levels
    dut.forwarded_inc.value = 3
    dut.rx_frames_inc__1.value = 2
    dut.slots_in_use_value.value = 5
    await ClockCycles(dut.clk, 10)
    dut.forwarded_inc.value = 0
    dut.rx_frames_inc__1.value = 0
    writes = []

    try:
        params, clock_hz, group, counters, failures = await pty.run_host(
            lambda: controller_session(pty.path, on_write=lambda addr, value: writes.append((addr, value))))
    finally:
        pty.close()
    assert params == tb.params and clock_hz == UART_CLK_FREQ
    assert failures == 0
    by_addr = {reg.address(i): (reg, i) for reg in tb.regs for i in range(reg.count)}
    last_config, commands = {}, {}
    for addr, value in writes:
        reg, i = by_addr[addr]
        assert reg.access is not Access.RO
        if reg.kind is Kind.CONFIG:
            last_config[reg.name] = value & field_mask(reg)
        else:
            commands.setdefault(reg.name, []).append(value & field_mask(reg))
    assert "RULE_WRITE" in commands and "MAC_WRITE" in commands, commands
    for name, value in last_config.items():
        assert tb.config_port(name) == value, f"{name}: port {tb.config_port(name):#x}, written {value:#x}"
    seen = {name: [w & field_mask(tb.regs[name]) for w in words] for name, words in tb.strobes.items()}
    assert seen == commands
    rule = tb.regs["RULE_WRITE"].unpack(commands["RULE_WRITE"][-1])
    assert rule["valid"] == 1 and rule["index"] == group.rule_index
    expected = {}
    for reg in tb.regs:
        if reg.kind in (Kind.COUNTER, Kind.LEVEL):
            values = [0] * reg.count
            expected[reg.name] = values if reg.count > 1 else 0
    expected["FORWARDED"] = 3 * 10
    expected["RX_FRAMES"][1] = 2 * 10
    expected["SLOTS_IN_USE"] = 5
    assert counters == expected


@cocotb.test()
async def cli_through_the_controller_service(dut):
    """``cais-controller --switch serial:<pty>`` as it runs deployed (cais.service.ControllerService, its
    HTTP API, the periodic evaluation), and cais-cli against it: add-rule programs the rule through the
    UART (the staging registers' ports and RULE_WRITE's strobe show it), show-stats reports the drop and port
    counters driven here."""
    import io
    import json
    import tempfile

    from cais import cli
    from cais.config import Config
    from cais.endpoint import read_token
    from cais.service import ControllerService
    from cais.sim.links.serial import PtyUart

    tb = TB(dut)
    await tb.start(models=False)
    pty = PtyUart(dut.clk, dut.rx, dut.tx, UART_BAUD)
    dut.drop_bad_fcs_inc.value = 1
    dut.tx_bytes_inc__0.value = 60
    await ClockCycles(dut.clk, 4)
    dut.drop_bad_fcs_inc.value = 0
    dut.tx_bytes_inc__0.value = 0

    def run_cli(folder, *args):
        """cais-cli's own parsing and command, its output kept (cais.cli.main prints to the process's stdout)."""
        argv = ["--controller", f"127.0.0.1:{svc.http_port}", "--token-file", f"{folder}/token", "--timeout", "300",
                "--json", *args]
        parsed = cli.build_parser().parse_args(argv)
        out = io.StringIO()
        assert cli.run(parsed, cli.Client(parsed.controller, read_token(parsed.token_file), timeout=parsed.timeout),
                       out=out) == 0
        return out.getvalue()

    def host():
        nonlocal svc
        with tempfile.TemporaryDirectory() as folder:
            with open(f"{folder}/token", "w") as f:
                f.write("uart-test-token\n")
            os.chmod(f"{folder}/token", 0o600)
            svc = ControllerService(f"serial:{pty.path}", 2, Config(slots_per_group=2, reevaluate_interval_ms=500),
                                    token="uart-test-token")
            try:
                svc.serve(f"{folder}/ranks.sock", "127.0.0.1:0")
                run_cli(folder, "add-rule", "5", "--group", "0x42", "--contributors", "0,1", "--base", "8",
                        "--count-log2", "1")
                for _ in range(600):                  # the first evaluation after the rule (bounded)
                    stats = json.loads(run_cli(folder, "show-stats"))["stats"]
                    if stats.get("time_s") is not None and stats.get("drops"):
                        return stats
                    time.sleep(0.2)
                raise AssertionError("no evaluation in 120 s")
            finally:
                svc.close()

    svc = None
    try:
        stats = await pty.run_host(host)
    finally:
        pty.close()
    regs = tb.regs
    assert tb.config_port("RULE_GROUP") == regs["RULE_GROUP"].pack(value=0x42, mask=0xFF)
    assert tb.config_port("RULE_PORTS") == regs["RULE_PORTS"].pack(contributors=0b11, results=0b11)
    assert tb.config_port("RULE_SLOTS") == regs["RULE_SLOTS"].pack(base=8, count_log2=1)
    assert regs["RULE_WRITE"].pack(index=5, valid=1) in tb.strobes["RULE_WRITE"]
    assert stats["drops"]["BAD_FCS"] == 4 and stats["ports"][0]["tx_bytes"] == 240
    assert all(n == 0 for name, n in stats["drops"].items() if name != "BAD_FCS")
