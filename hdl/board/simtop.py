"""The board as ``make board-sim`` simulates it: :class:`~cais.hdl.board.core.BoardCore` with its RGMII pins
as plain ports and the PLL replaced by clock inputs.

What differs from the FPGA build (:mod:`cais.hdl.board.versa`): the PLL (its three outputs are the ports
``clk``, ``clk_tx``, ``clk_tx90``, driven by the testbench), the RGMII pins' IB/DELAYG/IDDRX1F/ODDRX1F cells
(modelled by :class:`~cais.hdl.board.rgmii.RgmiiPhy` without pads), the reset button's synchroniser (``rst``
is the switch domain's synchronous reset) and the PHY reset's length (``phy_reset_cycles``); everything else
is the same Amaranth code.

Ports: ``clk`` ``rst`` ``clk_tx`` ``clk_tx90`` ``uart_rx`` ``uart_tx`` ``leds`` ``phy_rst``
``rgmii<p>_{rxc,rxd,rx_ctl,txc,txd,tx_ctl}``.
"""

from __future__ import annotations

from amaranth.hdl import ClockDomain, ClockSignal, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from .core import BoardConfig, BoardCore

__all__ = ["BoardSimTop", "SIM_TOP"]

SIM_TOP = "cais_board"


class BoardSimTop(wiring.Component):
    """:class:`BoardCore` with clock inputs for the ``tx`` and ``tx90`` domains (``sync`` is the usual
    ``clk``/``rst``).

    Members
    -------
    clk_tx, clk_tx90 : In(1)
        125 MHz, the second 2 ns after the first.
    (the rest) : BoardCore's members, flattened by the Verilog export.
    """

    def __init__(self, config: BoardConfig):
        self.config = config
        self.core = BoardCore(config)
        members = {"clk_tx": In(1), "clk_tx90": In(1)}
        members.update(self.core.signature.members)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.domains += ClockDomain("tx")
        m.domains += ClockDomain("tx90", reset_less=True)
        m.d.comb += [ClockSignal("tx").eq(self.clk_tx), ClockSignal("tx90").eq(self.clk_tx90)]
        for name, member in core.signature.members.items():
            inner, outer = getattr(core, name), getattr(self, name)
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        return m
