"""A UART to AXI4-Lite bridge: the host's register accesses over a serial line (docs/board.md, "Control over
UART"). The framing (commands, status codes, lengths, the CRC-8) is :mod:`cais.uartproto`'s; this module
takes every code and length from there.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais.uartproto import (REPLY_BYTES, REQUEST_BYTES, TIMEOUT_BYTE_TIMES, Command, Status, crc8)

from ..control.csr import AXI4LiteSignature, AxiResp
from .uart import UartRx, UartTx, uart_divisor

__all__ = ["UartAxiLiteBridge", "crc8_step"]

_ADDRESS_BYTES = 4


def _crc8_columns() -> list[int]:
    """Column j of the CRC-8 step as a matrix over GF(2): the CRC (from 0) of a byte holding bit j alone. The
    step (shift left, XOR the polynomial when bit 7 falls out) is linear, so each output bit of a step is the
    XOR of the input bits whose columns hold it."""
    return [crc8(bytes([1 << j])) for j in range(8)]


_CRC8_COLUMNS = _crc8_columns()


def crc8_step(crc, byte):
    """The CRC-8 of :mod:`cais.uartproto` after one more byte, as logic (8 bits in, 8 out): each bit the XOR
    of the bits of ``crc ^ byte`` its column names. (Eight chained muxes, each reading the last one's output
    three times, made a tree of 3^8 copies: 6 MB of Verilog for this one byte.)"""
    x = crc ^ byte
    bits = []
    for i in range(8):
        taps = [x[j] for j in range(8) if _CRC8_COLUMNS[j] >> i & 1]
        bits.append(Cat(*taps).xor() if taps else Const(0, 1))
    return Cat(*bits)


class UartAxiLiteBridge(wiring.Component):
    """Serves register reads and writes asked over a UART as AXI4-Lite transactions, one at a time.

    Each request (:mod:`cais.uartproto`) gets exactly one reply of :data:`~cais.uartproto.REPLY_BYTES`
    bytes, echoing its ``seq``, sent as soon as the request is decided; a request that is not OK changes
    nothing:

    - a first byte that is no command: the bridge drops every byte until the line has been quiet for
      ``timeout_cycles``, then replies UNKNOWN_COMMAND (the request's length is unknown, so quiet is the
      only end it has);
    - a wrong check byte: BAD_CHECKSUM, no bus access;
    - an address that is not a multiple of 4 or needs more than ``addr_width`` bits: BUS_ERROR, no access;
    - READ / WRITE: one AXI4-Lite transaction (``wstrb`` 0b1111, ``*prot`` 0); a response other than
      OKAY (SLVERR, DECERR) is BUS_ERROR; a READ's reply carries ``rdata`` (0 unless OK);
    - a WRITE with the ``seq`` of the previous good request (right check byte), which was a WRITE too: a
      retry; answered with that write's status, no second access;
    - CLOCK: OK with ``clk_freq`` as data, no bus access (a ping that also tells the host the clock);
    - the line quiet for ``timeout_cycles`` within a request: it is dropped and TIMEOUT replied.

    The ``seq`` of an UNKNOWN_COMMAND or TIMEOUT reply is the last one received (the host ignores it).

    Bytes that arrive while a request is served or its reply sent are dropped (the host waits for the
    reply). A byte with a framing error is dropped by the receiver (a request missing it ends in TIMEOUT or
    BAD_CHECKSUM) and counted in ``framing_errors``.

    Parameters
    ----------
    clk_freq : int
        The clock of the bridge and of the register block it drives, Hz.
    baud : int
        The line's bit rate (:func:`cais.hdl.board.uart.uart_divisor` states the limits).
    addr_width : int
        Width of the AXI4-Lite addresses.
    timeout_cycles : int or None
        Cycles of a quiet line that end a request; default
        :data:`~cais.uartproto.TIMEOUT_BYTE_TIMES` byte times (10 bits each).

    Members
    -------
    rx : In(1)
        The UART line from the host (idle high; synchronized inside).
    tx : Out(1)
        The UART line to the host (idle high, a register).
    bus : Out(AXI4LiteSignature(addr_width))
        The AXI4-Lite manager port, to the register block's subordinate port.
    framing_errors : Out(16)
        Bytes dropped for a low stop bit, wrapping.
    error_replies : Out(16)
        Replies other than OK sent, wrapping.
    """

    def __init__(self, clk_freq: int, baud: int, addr_width: int, *, timeout_cycles: int | None = None):
        self.divisor = uart_divisor(clk_freq, baud)
        if not 0 < clk_freq < 1 << 32:
            raise ValueError(f"UartAxiLiteBridge: clk_freq {clk_freq} Hz does not fit the 32-bit CLOCK reply")
        if not isinstance(addr_width, int) or not 2 <= addr_width <= 32:
            raise ValueError(f"UartAxiLiteBridge: addr_width must be an integer from 2 to 32, not {addr_width!r}")
        if timeout_cycles is None:
            timeout_cycles = TIMEOUT_BYTE_TIMES * 10 * self.divisor
        if not isinstance(timeout_cycles, int) or timeout_cycles < 20 * self.divisor:
            raise ValueError(f"UartAxiLiteBridge: timeout_cycles {timeout_cycles!r} must be an integer of at "
                             f"least two byte times ({20 * self.divisor} cycles)")
        self.clk_freq, self.baud, self.addr_width, self.timeout_cycles = clk_freq, baud, addr_width, timeout_cycles
        super().__init__({
            "rx": In(1, init=1), "tx": Out(1, init=1),
            "bus": Out(AXI4LiteSignature(addr_width)),
            "framing_errors": Out(16), "error_replies": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = rx = UartRx(self.clk_freq, self.baud)
        m.submodules.uart_tx = tx = UartTx(self.clk_freq, self.baud)
        m.d.comb += [rx.rx.eq(self.rx), self.tx.eq(tx.tx)]
        with m.If(rx.framing_error):
            m.d.sync += self.framing_errors.eq(self.framing_errors + 1)

        r = _Regs(self.addr_width, self.timeout_cycles)
        address = Mux(r.cmd == int(Command.WRITE), r.word[32:], r.word[:32])
        m.d.comb += [self.bus.araddr.eq(address), self.bus.awaddr.eq(address), self.bus.wdata.eq(r.word[:32]),
                     self.bus.wstrb.eq(0b1111)]
        with m.FSM(name="bridge_fsm"):
            with m.State("RECV"):
                self._receive(m, rx, r)
            with m.State("DISCARD"):
                with m.If(rx.valid):
                    m.d.sync += r.timer.eq(self.timeout_cycles)
                with m.Elif(r.timer == 0):
                    self._reply(m, r, Status.UNKNOWN_COMMAND)
                with m.Else():
                    m.d.sync += r.timer.eq(r.timer - 1)
            with m.State("CHECK"):
                out_of_range = address[self.addr_width:] != 0 if self.addr_width < 32 else Const(0)
                is_write = r.cmd == int(Command.WRITE)
                with m.If(r.crc != 0):
                    self._reply(m, r, Status.BAD_CHECKSUM)
                with m.Else():
                    # a good request: only a WRITE's own retry may follow it without a new access
                    m.d.sync += r.last_write.eq(0)
                    with m.If(is_write & r.last_write & (r.seq == r.last_seq)):
                        m.d.sync += r.last_write.eq(1)
                        self._reply(m, r, r.last_status)
                    with m.Elif(r.cmd == int(Command.CLOCK)):
                        self._reply(m, r, Status.OK, self.clk_freq)
                    with m.Elif((address[:2] != 0) | out_of_range):
                        self._reply(m, r, Status.BUS_ERROR)
                    with m.Elif(is_write):
                        m.next = "WRITE"
                    with m.Else():
                        m.next = "READ"
            self._access(m, r)
            with m.State("REPLY"):
                self._send(m, tx, r)
        return m

    def _receive(self, m, rx, r):
        """RECV: collect a request's bytes (the command, seq, then address and data shifted in most
        significant byte first, then the check byte), the CRC over all of them; CHECK once the last has
        arrived."""
        crc_next = crc8_step(r.crc, rx.data)
        is_command = Const(0)
        for c in Command:
            is_command = is_command | (rx.data == int(c))
        last = Const(0)                     # the byte now arriving is the check byte
        for c, length in REQUEST_BYTES.items():
            last = last | ((r.cmd == int(c)) & (r.count == length - 1))
        with m.If(rx.valid):
            m.d.sync += r.timer.eq(self.timeout_cycles)
            with m.If(r.count == 0):
                with m.If(is_command):
                    m.d.sync += [r.cmd.eq(rx.data), r.count.eq(1), r.crc.eq(crc_next)]
                with m.Else():
                    m.next = "DISCARD"
            with m.Else():
                m.d.sync += [r.count.eq(r.count + 1), r.crc.eq(crc_next)]
                with m.If(last):
                    m.next = "CHECK"
                with m.Elif(r.count == 1):
                    m.d.sync += r.seq.eq(rx.data)
                with m.Else():
                    m.d.sync += r.word.eq(Cat(rx.data, r.word[:-8]))
        with m.Elif(r.count != 0):
            with m.If(r.timer == 0):
                self._reply(m, r, Status.TIMEOUT)
            with m.Else():
                m.d.sync += r.timer.eq(r.timer - 1)

    def _access(self, m, r):
        """READ, WRITE and their responses: one AXI4-Lite transaction, then the reply."""
        bus = self.bus
        with m.State("READ"):
            m.d.comb += bus.arvalid.eq(1)
            with m.If(bus.arready):
                m.next = "READ_RESP"
        with m.State("READ_RESP"):
            m.d.comb += bus.rready.eq(1)
            with m.If(bus.rvalid):
                with m.If(bus.rresp == AxiResp.OKAY):
                    self._reply(m, r, Status.OK, bus.rdata)
                with m.Else():
                    self._reply(m, r, Status.BUS_ERROR)
        with m.State("WRITE"):
            m.d.comb += [bus.awvalid.eq(~r.aw_done), bus.wvalid.eq(~r.w_done)]
            aw_done = r.aw_done | bus.awready
            w_done = r.w_done | bus.wready
            m.d.sync += [r.aw_done.eq(aw_done), r.w_done.eq(w_done)]
            with m.If(aw_done & w_done):
                m.d.sync += [r.aw_done.eq(0), r.w_done.eq(0)]
                m.next = "WRITE_RESP"
        with m.State("WRITE_RESP"):
            m.d.comb += bus.bready.eq(1)
            with m.If(bus.bvalid):
                status = Mux(bus.bresp == AxiResp.OKAY, int(Status.OK), int(Status.BUS_ERROR))
                m.d.sync += [r.last_seq.eq(r.seq), r.last_status.eq(status), r.last_write.eq(1)]
                self._reply(m, r, status)

    def _reply(self, m, r, status, data=0):
        """Leave for REPLY with ``status`` and ``data``; the request's state is cleared."""
        m.d.sync += [r.status.eq(int(status) if isinstance(status, int) else status), r.data.eq(data),
                     r.count.eq(0), r.crc.eq(0), r.index.eq(0)]
        m.next = "REPLY"

    def _send(self, m, tx, r):
        """REPLY: status, seq, data (most significant byte first), the CRC of those six bytes."""
        byte = Signal(8)
        with m.Switch(r.index):
            with m.Case(0):
                m.d.comb += byte.eq(r.status)
            with m.Case(1):
                m.d.comb += byte.eq(r.seq)
            for i in range(4):
                with m.Case(2 + i):
                    m.d.comb += byte.eq(r.data.word_select(3 - i, 8))
            with m.Default():
                m.d.comb += byte.eq(r.crc)
        m.d.comb += [tx.data.eq(byte), tx.valid.eq(1)]
        with m.If(tx.ready):
            m.d.sync += [r.index.eq(r.index + 1), r.crc.eq(crc8_step(r.crc, byte))]
            with m.If((r.index == 0) & (r.status != int(Status.OK))):
                m.d.sync += self.error_replies.eq(self.error_replies + 1)
            with m.If(r.index == REPLY_BYTES - 1):
                m.d.sync += [r.crc.eq(0), r.index.eq(0)]
                m.next = "RECV"


class _Regs:
    """The bridge's state registers (one request at a time)."""

    def __init__(self, addr_width: int, timeout_cycles: int):
        longest = max(REQUEST_BYTES.values())
        self.cmd = Signal(8)
        self.count = Signal(range(longest + 1))      # bytes of the request received
        self.crc = Signal(8)                          # CRC so far (of the request, then of the reply)
        self.word = Signal(8 * (longest - 3))         # address, then data, shifted in from the right
        self.seq = Signal(8)                          # the request's seq, echoed in the reply
        self.last_seq = Signal(8)                     # seq and status of the last WRITE performed,
        self.last_status = Signal(8)
        self.last_write = Signal()                    # ... while the last good request was that WRITE
        self.timer = Signal(range(timeout_cycles + 1))
        self.status = Signal(8)
        self.data = Signal(32)
        self.index = Signal(range(REPLY_BYTES))
        self.aw_done = Signal()
        self.w_done = Signal()
