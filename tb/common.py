"""What the cocotb testbenches share (the simulator side): the parameter set of the run, clock and reset,
the idle / back-pressure patterns, and byte helpers.

A testbench (tb/<block>/test_<block>.py) follows Forencich's layout: a ``TB`` class that owns the clock,
the reset and the bus functional models (cocotbext-axi, ``bus_separator="__"`` for the block tops of
:mod:`cais.hdl.blocks`), and ``@cocotb.test`` functions generated with ``@cocotb.parametrize`` over the
directed cases x idle insertion on the sources x back-pressure on the sinks. The host side that builds the
Verilog and runs the tests is :mod:`cais.tb.run`; a new testbench is a folder with ``__init__.py`` and
``test_<block>.py``, one entry in :data:`cais.tb.run.TESTBENCHES` and one in pyproject.toml's packages.
"""

from __future__ import annotations

import itertools
import json
import logging
import os

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from cais.params import SwitchParams

__all__ = ["PARAMS_ENV", "CLOCK_NS", "tb_params", "pause_pattern", "random_pauses", "set_idle", "set_backpressure",
           "clock_and_reset", "le_bytes", "from_le", "IDLE_BACKPRESSURE", "set_axil_pauses", "quiet_bfms"]

#: Environment variable holding the run's SwitchParams as JSON (set by cais.tb.run).
PARAMS_ENV = "CAIS_TB_PARAMS"
#: The clock period (ns) of every testbench.
CLOCK_NS = 10
#: ``@cocotb.parametrize`` arguments: every combination of idle insertion and back-pressure.
IDLE_BACKPRESSURE = {"idle": [False, True], "backpressure": [False, True]}


def tb_params() -> SwitchParams:
    """The parameter set the design under test was built with."""
    text = os.environ.get(PARAMS_ENV)
    if not text:
        raise RuntimeError(f"${PARAMS_ENV} is not set: run the testbenches through cais.tb.run (make tb)")
    return SwitchParams(**json.loads(text))


def pause_pattern():
    """The pause generator of Forencich's testbenches: paused 3 cycles of 4."""
    return itertools.cycle([1, 1, 1, 0])


def random_pauses(rng, ratio: float = 0.5):
    """A random pause generator (paused with probability ``ratio`` each cycle) from a seeded ``random.Random``,
    for ``set_pause_generator``: a pace unlike the fixed pattern, and different on every port."""
    while True:
        yield int(rng.random() < ratio)


def set_idle(source, idle: bool) -> None:
    """Idle insertion on a cocotbext-axi source (``tvalid`` low 3 cycles of 4) or none."""
    if idle:
        source.set_pause_generator(pause_pattern())
    else:
        source.clear_pause_generator()


def set_backpressure(sink, backpressure: bool) -> None:
    """Back-pressure on a cocotbext-axi sink (``tready`` low 3 cycles of 4) or none."""
    if backpressure:
        sink.set_pause_generator(pause_pattern())
    else:
        sink.clear_pause_generator()


async def clock_and_reset(dut, cycles: int = 4, *, clk: str = "clk", rst: str = "rst") -> None:
    """Start the clock (:data:`CLOCK_NS`), hold the synchronous active-high reset for ``cycles`` rising
    edges and return just after the edge that samples it low."""
    clock, reset = getattr(dut, clk), getattr(dut, rst)
    Clock(clock, CLOCK_NS, unit="ns").start()
    reset.value = 1
    await ClockCycles(clock, cycles)
    reset.value = 0
    await RisingEdge(clock)


def le_bytes(word: int, nbytes: int) -> bytes:
    """An AXI word as bytes, byte 0 from bits 7:0."""
    return int(word).to_bytes(nbytes, "little")


def from_le(data: bytes) -> int:
    return int.from_bytes(bytes(data), "little")


def set_axil_pauses(master, idle: bool, backpressure: bool) -> None:
    """Idle insertion on a cocotbext-axi AxiLiteMaster's AW, W and AR channels and back-pressure on its
    B and R channels (each paused 3 cycles of 4), or none."""
    for source in (master.write_if.aw_channel, master.write_if.w_channel, master.read_if.ar_channel):
        set_idle(source, idle)
    for sink in (master.write_if.b_channel, master.read_if.r_channel):
        set_backpressure(sink, backpressure)


def quiet_bfms(dut) -> None:
    """cocotbext-axi logs every transfer at INFO (slow and long): keep its warnings only."""
    logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)
