"""RGMII (Reduced Gigabit Media Independent Interface, 1 Gb/s) between a PHY chip and :mod:`.mac`.

RGMII carries a GMII byte per 125 MHz clock on 4 wires, double data rate: bits 3:0 around the rising edge
and 7:4 around the falling edge; the control wire carries EN (or DV) at the rising edge and EN xor ER at
the falling edge. The specification has the data change with the clock edges and asks for a 1.5-2 ns
delay of the clock relative to the data at each receiver, added by the PCB, the PHY or the FPGA.

Delays on the Versa (LFE5UM-45F, Marvell 88E1512 PHYs; amaranth-boards' ``versa_ecp5`` names the pins;
the PCB has no delay lines): this design adds both in the FPGA, so the PHY's internal RGMII delays must be
off (docs/board.md, bring-up checklist):

* Receive: each RXD and RX_CTL input goes through a ``DELAYG`` cell set to :data:`RX_DELAY_TAPS` steps of
  about 25 ps (2 ns) before its ``IDDRX1F``, so the PHY's edge-aligned data is sampled in its middle.
  Amaranth's ``io.DDRBuffer`` has no place for a delay cell, so the receive side instantiates IB via
  ``io.Buffer`` and DELAYG / IDDRX1F as instances; the transmit side is ``io.DDRBuffer`` (ODDRX1F).
* Transmit: TXD and TX_CTL leave on the ``tx`` clock; TX_CLK is an ``io.DDRBuffer`` driving (1, 0) on
  the ``tx90`` clock, the same 125 MHz shifted by 90 degrees (2 ns) in the board's PLL, so the PHY sees
  its clock edges in the middle of the data.

Without a platform (simulation, ``make board-sim``) the pins are plain ports and the DDR cells are
modelled: inputs sampled on both edges of ``rxc``, outputs multiplexed by the ``tx`` clock, ``txc``
taken from the ``tx90`` clock. That is what cocotbext-eth's RGMII models expect (they drive the data
half a bit-time away from the edge that samples it, as a delayed clock would).
"""

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Instance, Module, Mux, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from .mac import GmiiSignature

__all__ = ["RgmiiPhy", "RX_DELAY_TAPS", "RXC_HZ", "RGMII_PINS"]

#: DELAYG steps on each received signal: 80 x ~25 ps = 2 ns (Lattice TN1265, input delay cell).
RX_DELAY_TAPS = 80
#: RGMII's clock at 1 Gb/s.
RXC_HZ = 125_000_000

#: The pins of one port as plain ports (simulation): name -> (direction, width).
RGMII_PINS = {"rxc": ("i", 1), "rxd": ("i", 4), "rx_ctl": ("i", 1),
              "txc": ("o", 1), "txd": ("o", 4), "tx_ctl": ("o", 1)}


class RgmiiPhy(wiring.Component):
    """One RGMII port.

    The receive side drives the clock of ``rx_domain`` (which the parent defines, and resets through a
    reset synchroniser) from RXC; the transmit side works in ``tx_domain`` with TXC from
    ``tx90_domain``.

    Parameters
    ----------
    pads : the platform resource of the port (``platform.request("eth_rgmii", n, dir="-")``-style raw
        ports under names ``rx_clk rx_ctl rx_data tx_clk tx_ctl tx_data``), or None for plain ports.

    Members
    -------
    rx : Out(GmiiSignature())
        Received bytes, in ``rx_domain``: data, en (RX_DV), er (RX_ER).
    tx : In(GmiiSignature())
        Bytes to send, in ``tx_domain``.
    rxc, rxd, rx_ctl, txc, txd, tx_ctl : the pins, only without ``pads``.
    """

    def __init__(self, *, pads=None, rx_domain="rx", tx_domain="tx", tx90_domain="tx90"):
        self.pads = pads
        self.rx_domain, self.tx_domain, self.tx90_domain = rx_domain, tx_domain, tx90_domain
        members = {"rx": Out(GmiiSignature()), "tx": In(GmiiSignature())}
        if pads is None:
            members.update({name: (In if d == "i" else Out)(w) for name, (d, w) in RGMII_PINS.items()})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # rx_domain is the parent's (its MAC and FIFO use it too); this drives its clock
        rx_clk = ClockSignal(self.rx_domain)
        # d0: sampled at the rising edge (bits 3:0, EN), d1: at the falling edge (7:4, EN ^ ER), both
        # presented in rx_domain; t0/t1: what the tx_domain's rising / falling half of a cycle carries.
        rx_d0, rx_d1 = Signal(5), Signal(5)
        tx_t0, tx_t1 = Signal(5, reset_less=True), Signal(5, reset_less=True)   # copies of the MAC's registers
        if self.pads is None:
            self._sim_pins(m, rx_clk, rx_d0, rx_d1, tx_t0, tx_t1)
        else:
            self._ecp5_pins(m, platform, rx_clk, rx_d0, rx_d1, tx_t0, tx_t1)
        m.d[self.rx_domain] += [
            self.rx.data.eq(Cat(rx_d0[:4], rx_d1[:4])),
            self.rx.en.eq(rx_d0[4]),
            self.rx.er.eq(rx_d0[4] ^ rx_d1[4]),
        ]
        # registered so that the DDR output sees stable values for a whole tx cycle
        m.d[self.tx_domain] += [
            tx_t0.eq(Cat(self.tx.data[:4], self.tx.en)),
            tx_t1.eq(Cat(self.tx.data[4:], self.tx.en ^ self.tx.er)),
        ]
        return m

    def _sim_pins(self, m, rx_clk, rx_d0, rx_d1, tx_t0, tx_t1):
        m.d.comb += rx_clk.eq(self.rxc)
        m.domains += ClockDomain(self.rx_domain + "_neg", clk_edge="neg", local=True)
        m.d.comb += ClockSignal(self.rx_domain + "_neg").eq(self.rxc)
        pin = Cat(self.rxd, self.rx_ctl)
        rise, fall = Signal(5), Signal(5)
        m.d[self.rx_domain] += rise.eq(pin)
        m.d[self.rx_domain + "_neg"] += fall.eq(pin)
        # like IDDRX1F: the pair from one rising and the following falling edge, at the next rising edge
        m.d[self.rx_domain] += [rx_d0.eq(rise), rx_d1.eq(fall)]
        out = Mux(ClockSignal(self.tx_domain), tx_t0, tx_t1)
        m.d.comb += [self.txd.eq(out[:4]), self.tx_ctl.eq(out[4]), self.txc.eq(ClockSignal(self.tx90_domain))]

    def _ecp5_pins(self, m, platform, rx_clk, rx_d0, rx_d1, tx_t0, tx_t1):
        pads = self.pads
        m.submodules.rxc_buf = rxc_buf = io.Buffer("i", pads.rx_clk)
        m.d.comb += rx_clk.eq(rxc_buf.i)
        # on the pin (FREQUENCY PORT): nextpnr carries it to the clock net, whose name yosys picks
        platform.add_clock_constraint(pads.rx_clk.io, RXC_HZ)
        rx_pins = [(pads.rx_data, b) for b in range(4)] + [(pads.rx_ctl, 0)]
        for n, (port, bit) in enumerate(rx_pins):
            m.submodules[f"rx_buf{n}"] = buf = io.Buffer("i", port[bit])
            delayed = Signal(name=f"rx_delayed{n}")
            m.submodules[f"rx_delay{n}"] = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=RX_DELAY_TAPS, i_A=buf.i, o_Z=delayed)
            m.submodules[f"rx_ddr{n}"] = Instance(
                "IDDRX1F", i_D=delayed, i_SCLK=ClockSignal(self.rx_domain), i_RST=0,
                o_Q0=rx_d0[n], o_Q1=rx_d1[n])
        m.submodules.tx_ddr = tx_ddr = io.DDRBuffer("o", pads.tx_data, o_domain=self.tx_domain)
        m.submodules.tx_ctl_ddr = ctl_ddr = io.DDRBuffer("o", pads.tx_ctl, o_domain=self.tx_domain)
        m.submodules.txc_ddr = txc_ddr = io.DDRBuffer("o", pads.tx_clk, o_domain=self.tx90_domain)
        m.d.comb += [
            tx_ddr.o[0].eq(tx_t0[:4]), tx_ddr.o[1].eq(tx_t1[:4]),
            ctl_ddr.o[0].eq(tx_t0[4]), ctl_ddr.o[1].eq(tx_t1[4]),
            txc_ddr.o[0].eq(1), txc_ddr.o[1].eq(0),
        ]
