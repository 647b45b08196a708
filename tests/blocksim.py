"""Small helpers shared by the amaranth.sim block tests (tests/hdl/test_alu.py ... tests/hdl/test_results.py).

Nothing here knows about the blocks under test (but that a decision alone needs a slot-state memory): only
how to run a testbench and how the AXI4-Stream byte order maps bytes to beats (byte 0 of a beat in bits 7:0,
docs/protocol.md section 1).
"""

from __future__ import annotations

from amaranth.sim import Simulator

__all__ = ["run", "with_state_memory", "Pins", "to_word", "from_word", "popcount", "header_meta"]


def run(dut, *testbenches, clock: bool = True, vcd: str | None = None) -> None:
    """Simulate ``dut`` until every testbench returns (with a 100 MHz ``sync`` clock unless ``clock=False``)."""
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-8)
    for tb in testbenches:
        sim.add_testbench(tb)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def with_state_memory(decision):
    """*decision* (a :class:`cais.hdl.decision.Decision`) with a slot-state memory of its own, as the switch's
    SRAM buffer gives it: what ``run`` simulates to test a decision alone."""
    from amaranth.hdl import Module
    from cais.hdl.decision import attach_state_memory

    m = Module()
    attach_state_memory(m, decision)
    return m


class Pins:
    """``ctx.set`` that skips writes of an unchanged value (each write makes the simulator settle)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._last = {}

    def set(self, signal, value):
        value = int(value)
        key = id(signal)
        if self._last.get(key) != value:
            self._last[key] = value
            self.ctx.set(signal, value)


def to_word(data: bytes) -> int:
    """A beat from its bytes: byte 0 in bits 7:0."""
    return int.from_bytes(bytes(data), "little")


def from_word(word: int, nbytes: int) -> bytes:
    """The ``nbytes`` bytes of a beat, byte 0 first."""
    return int(word).to_bytes(nbytes, "little")


def popcount(value: int) -> int:
    return bin(value).count("1")


def header_meta(frame: bytes, beat_bytes: int) -> dict:
    """What the ingress queues for a good frame (``frame_meta_layout``), from its bytes: the header bytes,
    its length and beats, and whether it is a CAIS all-reduce frame (docs/protocol.md)."""
    from cais import protocol as proto

    cais = proto.parse_frame(frame).cais
    return {"hdr": to_word(frame[:proto.HEADERS_BYTES]), "length": len(frame), "beats": -(-len(frame) // beat_bytes),
            "all_reduce": int(cais is not None and cais.op_type == proto.OpType.ALL_REDUCE)}
