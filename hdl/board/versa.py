"""The top of the Lattice ECP5 Versa board (LFE5UM-45F-8BG381; pins from amaranth-boards' ``versa_ecp5``):
:class:`~cais.hdl.board.core.BoardCore` on the board's pins, with the PLL that makes its clocks.

Clocks: the board's 100 MHz oscillator feeds one EHXPLLL (VCO 500 MHz): CLKOP 62.5 MHz for the switch
(``sync``; also the PLL's feedback), CLKOS 125 MHz for transmit (``tx``), CLKOS2 125 MHz shifted by 90
degrees, one VCO period, for the RGMII TXC pins (``tx90``). Each port's receive clock comes from its PHY.

Resets: the board's reset button or the PLL out of lock resets ``sync`` (through a reset synchroniser),
and ``sync``'s reset resets the rest (:class:`BoardCore`); the PHYs stay in reset for 20 ms after it.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer

from cais.params import SwitchParams

from .core import LEDS, BoardConfig, BoardCore

__all__ = ["VersaTop", "VERSA_CONFIG", "PLL", "pll_frequencies"]

REF_HZ = 100_000_000
#: EHXPLLL settings: fPFD = REF / CLKI_DIV, fVCO = fPFD * CLKFB_DIV * CLKOP_DIV (feedback from CLKOP),
#: each output fVCO / its DIV; CPHASE = DIV - 1 is 0 degrees, each VCO period more shifts by 360 / DIV.
PLL = {"CLKI_DIV": 8, "CLKFB_DIV": 5, "CLKOP_DIV": 8, "CLKOS_DIV": 4, "CLKOS2_DIV": 4, "CLKOS2_SHIFT": 1}


def pll_frequencies(pll: dict = PLL, ref_hz: int = REF_HZ) -> dict:
    """VCO and output frequencies (Hz) and TXC's phase (degrees) of the PLL settings."""
    pfd = ref_hz / pll["CLKI_DIV"]
    vco = pfd * pll["CLKFB_DIV"] * pll["CLKOP_DIV"]
    return {"pfd": pfd, "vco": vco, "sync": vco / pll["CLKOP_DIV"], "tx": vco / pll["CLKOS_DIV"],
            "tx90": vco / pll["CLKOS2_DIV"], "tx90_phase": 360 * pll["CLKOS2_SHIFT"] / pll["CLKOS2_DIV"]}


def _versa_params() -> SwitchParams:
    # two ports at 64 bits: 8 bytes x 62.5 MHz = 500 MB/s per port against Gigabit Ethernet's 125 MB/s;
    # float units included (docs/board.md: the part's use and the timing they leave)
    return SwitchParams(ports=2, data_width=64)


_F = pll_frequencies()
#: The Versa build: the switch at the PLL's 62.5 MHz, 115200 baud, the PHYs' reset 20 ms.
VERSA_CONFIG = BoardConfig(params=_versa_params(), clk_freq=int(_F["sync"]), baud=115_200,
                           phy_reset_cycles=int(_F["sync"] * 0.020))


class VersaTop(wiring.Component):
    """The Versa board's top: no ports of its own, everything on the platform's pins.

    Members
    -------
    (none) : build with ``VersaECP5Platform().build(VersaTop())`` or ``make bitstream``.
    """

    def __init__(self, config: BoardConfig = VERSA_CONFIG):
        self.config = config
        f = pll_frequencies()
        if int(f["sync"]) != config.clk_freq:
            raise ValueError(f"VersaTop: the PLL makes {f['sync'] / 1e6:g} MHz, the config says "
                             f"{config.clk_freq / 1e6:g} MHz")
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        clk100 = platform.request("clk100", 0).i
        button = platform.request("rst", 0).i
        self._pll(m, platform, clk100, button)

        pads = [self._rgmii(platform, p) for p in range(2)]
        m.submodules.core = core = BoardCore(self.config, pads=pads)
        uart = platform.request("uart", 0)
        m.d.comb += [core.uart_rx.eq(uart.rx.i), uart.tx.o.eq(core.uart_tx)]
        for i in range(len(LEDS)):
            m.d.comb += platform.request("led", i).o.eq(core.leds[i])
        for p in range(2):
            m.submodules[f"phy_rst{p}"] = buf = io.Buffer("o", pads[p].rst)
            m.d.comb += buf.o.eq(core.phy_rst)
        return m

    def _pll(self, m, platform, clk100, button):
        f = pll_frequencies()
        clkop, clkos, clkos2 = Signal(), Signal(), Signal()
        lock = Signal(name="pll_lock")
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{REF_HZ / 1e6:g}", a_FREQUENCY_PIN_CLKOP=f"{f['sync'] / 1e6:g}",
            a_FREQUENCY_PIN_CLKOS=f"{f['tx'] / 1e6:g}", a_FREQUENCY_PIN_CLKOS2=f"{f['tx90'] / 1e6:g}",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD", p_FEEDBK_PATH="CLKOP",
            p_CLKI_DIV=PLL["CLKI_DIV"], p_CLKFB_DIV=PLL["CLKFB_DIV"],
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=PLL["CLKOP_DIV"], p_CLKOP_CPHASE=PLL["CLKOP_DIV"] - 1,
            p_CLKOP_FPHASE=0,
            p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=PLL["CLKOS_DIV"], p_CLKOS_CPHASE=PLL["CLKOS_DIV"] - 1,
            p_CLKOS_FPHASE=0,
            p_CLKOS2_ENABLE="ENABLED", p_CLKOS2_DIV=PLL["CLKOS2_DIV"],
            p_CLKOS2_CPHASE=PLL["CLKOS2_DIV"] - 1 + PLL["CLKOS2_SHIFT"], p_CLKOS2_FPHASE=0,
            i_CLKI=clk100, i_CLKFB=clkop, i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0,
            i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0, i_ENCLKOS=0,
            i_ENCLKOS2=0, i_ENCLKOS3=0,
            o_CLKOP=clkop, o_CLKOS=clkos, o_CLKOS2=clkos2, o_LOCK=lock)
        # no constraints on the outputs: nextpnr derives them from CLKI's (the 100 MHz pin) and the dividers
        m.domains += ClockDomain("sync")
        m.domains += ClockDomain("tx")
        m.domains += ClockDomain("tx90", reset_less=True)
        m.d.comb += [ClockSignal("sync").eq(clkop), ClockSignal("tx").eq(clkos), ClockSignal("tx90").eq(clkos2)]
        m.submodules.sync_reset = ResetSynchronizer(~lock | button, domain="sync")

    @staticmethod
    def _rgmii(platform, p: int):
        """Port p's raw pins; amaranth-boards spells port 1's control pins ``rx_ctrl``/``tx_ctrl``."""
        res = platform.request("eth_rgmii", p, dir="-")
        pick = lambda *names: next(getattr(res, n) for n in names if hasattr(res, n))   # noqa: E731
        return SimpleNamespace(rx_clk=res.rx_clk, rx_ctl=pick("rx_ctl", "rx_ctrl"), rx_data=res.rx_data,
                               tx_clk=res.tx_clk, tx_ctl=pick("tx_ctl", "tx_ctrl"), tx_data=res.tx_data,
                               rst=res.rst)
