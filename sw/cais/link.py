"""What the driver and the controller need from a switch: the contract every backend implements.

A backend is the switch plus the wires to every rank: the numpy reference model, the Amaranth design
under amaranth.sim, or the exported Verilog under cocotb + Verilator. The driver never knows which; it
only calls these methods. Time is the switch's clock: ``cycle`` counts cycles, ``clock_hz`` converts them
to seconds for the driver's timers.

The asynchronous methods only ever await what the backend hands back (cocotb triggers, amaranth.sim
ticks, or nothing at all for the model), because neither simulator runs asyncio: code that must work on
every backend awaits only the link's coroutines (see :func:`run_sync` for the model).
"""

from __future__ import annotations

from typing import Protocol

from .params import SwitchParams

__all__ = ["SwitchLink", "run_sync", "DEFAULT_CLOCK_HZ"]

# 64-bit beats at 156.25 MHz carry 10 Gb/s, the usual FPGA Ethernet MAC user clock.
DEFAULT_CLOCK_HZ = 156.25e6


class SwitchLink(Protocol):
    params: SwitchParams
    clock_hz: float

    @property
    def cycle(self) -> int:
        """Cycles simulated since the switch came out of reset."""

    def send(self, port: int, frame: bytes) -> None:
        """Queue a frame for the ingress of `port` (the rank's NIC transmits it as soon as it can)."""

    def take_received(self) -> list[tuple[int, bytes]]:
        """Frames that left the switch's egress ports since the last call, in order: (port, frame)."""

    async def advance(self, cycles: int) -> None:
        """Run the switch for `cycles` clock cycles."""

    async def advance_to_frame(self, cycles: int) -> int:
        """Run the switch for up to `cycles` cycles, stopping after the first cycle in which a frame
        finished leaving it (frames already out before the call do not count); return the cycles run.
        Lets a driver step at frame events instead of every few cycles."""

    async def read(self, addr: int) -> int:
        """Read a 32-bit register (byte address of docs/registers.md)."""

    async def write(self, addr: int, value: int) -> None:
        """Write a 32-bit register."""


def run_sync(coro):
    """Run a coroutine that never really suspends (the reference model's link) to completion."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("run_sync: the coroutine suspended; it awaited something other than a model link")
