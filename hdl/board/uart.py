"""An 8N1 UART: a receiver that samples each bit in its middle and a transmitter, both timed by a clock
divisor (clock cycles per bit) derived from the clock and the baud rate (:func:`uart_divisor`).

Line format: idle high; a start bit (low), 8 data bits least significant first, one stop bit (high).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["uart_divisor", "UartRx", "UartTx", "MIN_DIVISOR", "MAX_BAUD_ERROR"]

#: Fewest clock cycles per bit: the receiver needs a middle to sample and a cycle either side of it.
MIN_DIVISOR = 4
#: Largest relative difference between the baud rate asked for and the one the divisor gives. Both ends of
#: the line may be off; 2 % each keeps the last sample of a frame (9.5 bit times in) inside its bit.
MAX_BAUD_ERROR = 0.02


def uart_divisor(clk_freq: int, baud: int) -> int:
    """Clock cycles per bit for ``baud`` at ``clk_freq`` Hz; ValueError naming the numbers when the divisor
    is below :data:`MIN_DIVISOR` or the baud rate it gives is more than :data:`MAX_BAUD_ERROR` off."""
    for name, value in (("clk_freq", clk_freq), ("baud", baud)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"UART: {name} must be a positive integer (Hz, bit/s), not {value!r}")
    divisor = max(1, round(clk_freq / baud))
    if divisor < MIN_DIVISOR:
        raise ValueError(f"UART: {baud} baud at a {clk_freq} Hz clock is {clk_freq / baud:.2f} cycles per bit; "
                         f"at least {MIN_DIVISOR} are needed")
    actual = clk_freq / divisor
    error = abs(actual - baud) / baud
    if error > MAX_BAUD_ERROR:
        raise ValueError(f"UART: {baud} baud at a {clk_freq} Hz clock: divisor {divisor} gives {actual:.0f} baud, "
                         f"{100 * error:.2f}% off (at most {100 * MAX_BAUD_ERROR:.0f}%)")
    return divisor


class UartRx(wiring.Component):
    """UART receiver, 8N1.

    The line passes a two-flip-flop synchronizer. A falling edge starts a byte; the start bit is sampled
    again half a bit later (still low, else the edge was a glitch and is ignored) and every bit from there
    one bit time apart. A byte whose stop bit samples low is dropped and reported on ``framing_error``;
    the receiver then waits for the line to go high before it looks for a start bit again (a break, the
    line held low, is one framing error).

    Parameters
    ----------
    clk_freq : int
        Clock frequency, Hz.
    baud : int
        Bits per second (see :func:`uart_divisor` for the limits).

    Members
    -------
    rx : In(1)
        The line (asynchronous to the clock).
    data : Out(8)
        The byte received, valid with ``valid``.
    valid : Out(1)
        One cycle per good byte, in the middle of its stop bit. A UART cannot wait: no ready.
    framing_error : Out(1)
        One cycle per byte dropped because its stop bit was low.
    """

    def __init__(self, clk_freq: int, baud: int):
        self.divisor = uart_divisor(clk_freq, baud)
        super().__init__({"rx": In(1, init=1), "data": Out(8), "valid": Out(1), "framing_error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        line = Signal(init=1)
        m.submodules.sync_rx = FFSynchronizer(self.rx, line, init=1)

        timer = Signal(range(d))
        bits = Signal(range(8))
        shift = Signal(8)
        tick = timer == 0
        with m.If(~tick):
            m.d.sync += timer.eq(timer - 1)
        m.d.comb += self.data.eq(shift)

        with m.FSM(name="rx_fsm"):
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(d // 2 - 1)      # to the middle of the start bit
                    m.next = "START"
            with m.State("START"):
                with m.If(tick):
                    with m.If(line):
                        m.next = "IDLE"                    # a glitch, not a start bit
                    with m.Else():
                        m.d.sync += [timer.eq(d - 1), bits.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(tick):
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), timer.eq(d - 1), bits.eq(bits + 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(tick):
                    with m.If(line):
                        m.d.comb += self.valid.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += self.framing_error.eq(1)
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """UART transmitter, 8N1: sends each byte it takes, back to back when the next is offered in time.

    Parameters
    ----------
    clk_freq : int
        Clock frequency, Hz.
    baud : int
        Bits per second (see :func:`uart_divisor`).

    Members
    -------
    tx : Out(1)
        The line, high when idle (a register: no glitches).
    data : In(8)
        The byte to send, taken when ``valid`` and ``ready`` are both high.
    valid : In(1)
    ready : Out(1)
        High while no byte is being sent.
    """

    def __init__(self, clk_freq: int, baud: int):
        self.divisor = uart_divisor(clk_freq, baud)
        super().__init__({"tx": Out(1, init=1), "data": In(8), "valid": In(1), "ready": Out(1)})

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        frame = Signal(10, init=0x3FF)       # the bits still to send, least significant next; idle: ones
        left = Signal(range(11))             # bits still to send
        timer = Signal(range(d))
        m.d.comb += self.ready.eq(left == 0)
        m.d.sync += self.tx.eq(frame[0])
        with m.If(left == 0):
            with m.If(self.valid):
                m.d.sync += [frame.eq(Cat(Const(0, 1), self.data, Const(1, 1))), left.eq(10), timer.eq(d - 1)]
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        with m.Else():
            m.d.sync += [frame.eq(Cat(frame[1:], Const(1, 1))), left.eq(left - 1), timer.eq(d - 1)]
        return m
