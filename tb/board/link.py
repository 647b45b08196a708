"""The simulated board as a :class:`cais.link.SwitchLink`: the driver and the controller run unchanged on it.

Frames travel as real Ethernet on the RGMII pins (cocotbext-eth's ``RgmiiSource`` / ``RgmiiSink``: preamble,
SFD, FCS, the 12-byte gap, DDR nibbles on both clock edges); registers are read and written over the UART
pins with the bridge's framing (:mod:`cais.uartproto`, cocotbext-uart's ``UartSource`` / ``UartSink``).
``cycle`` counts the switch clock (``clk``).
"""

from __future__ import annotations

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotb.utils import get_sim_time

from cais import uartproto
from cais.fcs import fcs_ok

__all__ = ["BoardLink", "RegisterError", "SYNC_NS", "TX_NS", "UART_BAUD"]

SYNC_NS = 16          # the switch clock, 62.5 MHz (as the Versa's PLL makes it)
TX_NS = 8             # RGMII's 125 MHz
UART_BAUD = 15_625_000  # 4 switch cycles per bit (the bridge's least): the simulated line, not the board's 115200


class RegisterError(RuntimeError):
    """A register access over the UART got a reply other than OK."""


class BoardLink:
    """Start with ``await BoardLink.start(dut, config)`` inside a cocotb test."""

    def __init__(self, dut, config):
        from cocotbext.eth import RgmiiSink, RgmiiSource
        from cocotbext.uart import UartSink, UartSource

        self.dut = dut
        self.config = config
        self.params = config.params
        self.clock_hz = float(config.clk_freq)
        self.sources = [RgmiiSource(getattr(dut, f"rgmii{p}_rxd"), getattr(dut, f"rgmii{p}_rx_ctl"),
                                    getattr(dut, f"rgmii{p}_rxc")) for p in range(2)]
        self.sinks = [RgmiiSink(getattr(dut, f"rgmii{p}_txd"), getattr(dut, f"rgmii{p}_tx_ctl"),
                                getattr(dut, f"rgmii{p}_txc")) for p in range(2)]
        self.uart_in = UartSource(dut.uart_rx, baud=config.baud, bits=8)
        self.uart_out = UartSink(dut.uart_tx, baud=config.baud, bits=8)
        self._t0 = 0
        self._seq = 0              # the UART requests' sequence byte: a new one for each (a repeat is a retry)
        self.bad_received = []     # frames from the board whose FCS or RX_ER was wrong: never expected

    @classmethod
    async def start(cls, dut, config) -> "BoardLink":
        Clock(dut.clk, SYNC_NS, unit="ns").start()
        Clock(dut.clk_tx, TX_NS, unit="ns").start()
        for p in range(2):
            Clock(getattr(dut, f"rgmii{p}_rxc"), TX_NS, unit="ns").start()
        link = cls(dut, config)
        dut.rst.value = 1
        await Timer(TX_NS // 4, unit="ns")
        Clock(dut.clk_tx90, TX_NS, unit="ns").start()          # 90 degrees after clk_tx, like the PLL's CLKOS2
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        # the PHY reset, then the switch's slot-state sweep
        await ClockCycles(dut.clk, config.phy_reset_cycles + config.params.slots + 8)
        await RisingEdge(dut.clk)
        link._t0 = get_sim_time("ns")
        return link

    # --- SwitchLink -------------------------------------------------------------------------------------
    @property
    def cycle(self) -> int:
        return int((get_sim_time("ns") - self._t0) // SYNC_NS)

    def send(self, port: int, frame: bytes) -> None:
        from cocotbext.eth import GmiiFrame
        self.sources[port].send_nowait(GmiiFrame.from_payload(bytes(frame)))

    def send_raw(self, port: int, wire: bytes, error: list[int] | None = None) -> None:
        """Send *wire* as it is (preamble, SFD, frame, FCS, or anything else) on port's receive pins."""
        from cocotbext.eth import GmiiFrame
        self.sources[port].send_nowait(GmiiFrame(bytes(wire), error))

    def take_received(self) -> list[tuple[int, bytes]]:
        got = []
        for p, sink in enumerate(self.sinks):
            while not sink.empty():
                frame = sink.recv_nowait()
                data = bytes(frame.get_payload(strip_fcs=False))
                if frame.error is not None or not fcs_ok(data) or frame.get_preamble() != b"\x55" * 7 + b"\xd5":
                    self.bad_received.append((p, data))
                    continue
                got.append((frame.sim_time_start, p, data[:-4]))
        return [(p, data) for _, p, data in sorted(got, key=lambda g: g[0])]

    async def advance(self, cycles: int) -> None:
        if cycles > 0:
            await ClockCycles(self.dut.clk, cycles)

    async def advance_to_frame(self, cycles: int) -> int:
        step, done = 32, 0
        while done < cycles:
            n = min(step, cycles - done)
            await ClockCycles(self.dut.clk, n)
            done += n
            if any(not s.empty() for s in self.sinks):
                break
        return done

    async def read(self, addr: int) -> int:
        status, data = await self.request(uartproto.Command.READ, addr)
        if status != uartproto.Status.OK:
            raise RegisterError(f"read {addr:#05x}: {status.name}")
        return data

    async def write(self, addr: int, value: int) -> None:
        status, _ = await self.request(uartproto.Command.WRITE, addr, value & 0xFFFF_FFFF)
        if status != uartproto.Status.OK:
            raise RegisterError(f"write {addr:#05x}: {status.name}")

    # --- the UART -----------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        """A sequence byte no request has used last (the bridge answers a repeated WRITE as a retry)."""
        self._seq = (self._seq + 1) & 0xFF
        return self._seq

    async def request(self, command, addr: int = 0, data: int | None = None):
        """One request over the UART; its (status, data) reply."""
        return await self.exchange(uartproto.encode_request(command, self.next_seq(), addr, data))

    async def exchange(self, raw: bytes):
        """Send *raw* bytes on the UART and decode the one reply they get."""
        await self.uart_in.write(raw)
        reply = bytearray()
        while len(reply) < uartproto.REPLY_BYTES:     # one byte at a time: read(n) fails when fewer are queued
            reply += await self.uart_out.read(1)
        status, _seq, data = uartproto.decode_reply(bytes(reply))
        return status, data
