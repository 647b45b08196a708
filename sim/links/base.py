"""What every link of :mod:`cais.sim.links` shares: argument checks, the BUSY rule, counter reads, drain.

The contract all links keep (a driver cannot tell them apart):

* ``cycle`` is 0 when the link is handed to the driver, after the switch left reset and finished its
  slot-state sweep (``slots + 2`` cycles), and counts clock cycles from there; ``reset(settle=n)`` starts
  cycle 0 ``n`` cycles after reset instead (0: the first cycle with ``rst`` low, inside the sweep). Register accesses take
  cycles too (a few per access on every link).
* ``reset()`` forgets every frame queued, partly sent or received, and what the sinks take while reset is
  high: the egress registers still show a beat in its first cycle, the head of a frame the reset cuts short.
* ``send(port, frame)`` never blocks: the frame is queued behind the port's earlier frames and sent at
  up to one beat per cycle as soon as the port's ingress takes it.
* ``take_received()`` returns the frames that finished leaving the switch since the last call, ordered
  by (cycle of the last beat, port); ``take_stamped()`` the same as :class:`Received` with both stamps;
  ``take_sent()`` the frames the ingress ports took since the last call, as :class:`Sent` stamps.
* ``read(addr)``/``write(addr, value)`` are 32-bit register accesses; ``read_accepted`` is the cycle in
  which the last read's address was accepted (registers.md: its value is the register's in the next cycle). Reading ``BUSY`` returns 1 also while
  the link still holds frames queued for an ingress port that the switch has not taken yet, so
  ``while await link.read(BUSY): await link.advance(n)`` waits for everything sent.
* Timing differs only on the model (approximate, see :class:`cais.sim.links.model.ModelLink`); the
  simulator links give identical frames in identical cycles for the same stimulus.
"""

from __future__ import annotations

from typing import NamedTuple

from cais.link import DEFAULT_CLOCK_HZ
from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.registers import read_counters as _read_registers

__all__ = ["LinkBase", "Received", "Sent", "check_frame", "keep_bytes", "read_counters", "wait_idle", "LinkError"]


class LinkError(AssertionError):
    """The switch broke the AXI4-Stream framing of docs/interface.md on an egress port."""


class Received(NamedTuple):
    """A frame that left egress ``port``: its bytes and the cycles of its first and last beat."""
    port: int
    data: bytes
    first: int
    last: int


class Sent(NamedTuple):
    """A frame ingress ``port`` took: the cycles of its first and last beat."""
    port: int
    first: int
    last: int


def check_frame(frame, beat_bytes: int = 0, bad_keep: bool = False) -> bytes:
    """The frame's bytes, checked for sending; ``bad_keep`` (a test's framing error: the last beat's tkeep
    moved up a lane, as :func:`cais.sim.traffic.beats_of` does) needs a partial last beat."""
    frame = bytes(frame)
    if not frame:
        raise ValueError("send: an empty frame has no beat to carry it (AXI4-Stream frames have >= 1 byte)")
    if bad_keep and len(frame) % beat_bytes == 0:
        raise ValueError("send(bad_keep=True): the frame needs a partial last beat")
    return frame


def keep_bytes(keep: int, beat_bytes: int, last: bool, port: int) -> int:
    """Bytes a beat carries; raise :class:`LinkError` if its tkeep breaks the framing of docs/interface.md."""
    n = bin(keep).count("1")
    if keep != (1 << n) - 1 or n == 0 or (not last and n != beat_bytes):
        raise LinkError(f"egress port {port}: bad tkeep {keep:#x} on a {'last' if last else 'middle'} beat")
    return n


class LinkBase:
    """The parts of :class:`cais.link.SwitchLink` that do not depend on the simulator.

    Subclasses provide ``cycle``, ``send``, ``take_stamped``, ``advance``, ``pending`` (frames not yet
    taken by an ingress) and the register accesses ``_read_register``/``_write_register``.
    """

    def __init__(self, params: SwitchParams, clock_hz: float = DEFAULT_CLOCK_HZ):
        self.params = params
        self.clock_hz = clock_hz
        self._busy_addr = register_map(params)["BUSY"].address()

    def check_port(self, port: int) -> int:
        if not isinstance(port, int) or not 0 <= port < self.params.ports:
            raise ValueError(f"port={port!r}: out of range 0..{self.params.ports - 1}")
        return port

    def take_received(self) -> list[tuple[int, bytes]]:
        return [(r.port, r.data) for r in self.take_stamped()]

    async def read(self, addr: int) -> int:
        pending = self.pending
        value = await self._read_register(int(addr))
        if int(addr) & ~3 == self._busy_addr and (pending or self.pending):
            value |= 1
        return value

    async def write(self, addr: int, value: int) -> None:
        await self._write_register(int(addr), int(value))

    async def read_switch(self, addr: int) -> int:
        """The register as the switch returns it (BUSY without the link's queued frames)."""
        return await self._read_register(int(addr))


async def read_counters(link) -> dict[str, int | list[int]]:
    """Every COUNTER register, read over the link; per-port registers as lists."""
    return await _read_registers(link.read, register_map(link.params), kinds=(Kind.COUNTER,))


async def wait_idle(link, *, step: int = 16, limit: int = 100_000) -> bool:
    """Advance ``step`` cycles at a time until ``BUSY`` reads 0, or until ``cycle`` reaches ``limit`` with the
    switch busy; return whether the switch went idle. ``limit=0`` is a quick check: one read decides.
    (BUSY is exact in every cycle, docs/interface.md: one read that returns 0 means nothing is inside.)
    """
    busy = register_map(link.params)["BUSY"].address()
    while True:
        if not await link.read(busy):
            return True
        if link.cycle >= limit:
            return False
        await link.advance(step)
