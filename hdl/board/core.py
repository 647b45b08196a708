"""The board's logic around the switch, the same in simulation and on the FPGA: two Ethernet ports (RGMII,
MAC, clock-domain crossing), the UART to AXI4-Lite bridge, PHY reset and LEDs.

Clock domains (the board top creates ``sync``, ``tx`` and ``tx90``; this creates each port's ``rx<p>``,
clocked by its PHY's receive clock, and ``tx<p>``, clocked by ``tx``):

=========  ==========================  ==========================================================
domain     clock                       logic
=========  ==========================  ==========================================================
sync       the switch clock            the switch, the UART bridge, the egress/ingress FIFO sides
rx<p>      port p's RXC, 125 MHz       RGMII capture, MacRx, packing into beats
tx<p>      125 MHz (the tx clock)      port p's MacTx, unpacking beats into bytes (a reset of its own)
tx90       125 MHz, 90 degrees later   TXC of both ports (RGMII's transmit clock, centred on TXD)
=========  ==========================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import ClockDomain, ClockSignal, DomainRenamer, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out, connect

from cais.params import SwitchParams

from ..switch import AXIL_ADDR_WIDTH, Switch
from .cdc import AxisToTx, RxToAxis
from .mac import MacRx, MacTx
from .rgmii import RGMII_PINS, RgmiiPhy
from .uart_bridge import UartAxiLiteBridge

__all__ = ["BoardConfig", "BoardCore", "LEDS"]

#: What each of the board's LEDs shows (index -> meaning), for docs/board.md and the top's pin mapping.
LEDS = ("port 0 link (RGMII in-band status)", "port 1 link (RGMII in-band status)",
        "port 0 activity (a frame received or sent, stretched)", "port 1 activity",
        "heartbeat (the switch clock runs: about 1 Hz)", "PHYs out of reset")


@dataclass(frozen=True)
class BoardConfig:
    """The build-time choices of a board: the switch's parameters, its clock and the control link.

    ``phy_reset_cycles``: switch-clock cycles the PHYs are held in reset after the board's reset (the
    88E1512 asks for 10 ms); ``activity_bits``: an activity LED stays on for 2**activity_bits cycles of its
    clock after a frame; ``rx_fifo_depth`` / ``tx_fifo_depth``: beats of each port's crossing FIFOs."""

    params: SwitchParams
    clk_freq: int
    baud: int = 115_200
    phy_reset_cycles: int = 1
    activity_bits: int = 22
    heartbeat_bits: int = 26
    rx_fifo_depth: int = 64
    tx_fifo_depth: int = 16

    def __post_init__(self):
        if self.params.ports != 2:
            raise ValueError(f"BoardConfig: the board has 2 Ethernet ports, the switch {self.params.ports}")


class BoardCore(wiring.Component):
    """Everything on the board but the clock generation and the I/O pins' platform cells.

    Parameters
    ----------
    config : BoardConfig
    pads : a list of each port's platform resource (FPGA build), or None: then every pin is a port of
        this component (simulation), named ``rgmii<p>_<pin>`` (:data:`cais.hdl.board.rgmii.RGMII_PINS`).

    Members
    -------
    uart_rx : In(1)
        The serial line from the host.
    uart_tx : Out(1)
        The serial line to the host.
    leds : Out(len(LEDS))
        Active high (:data:`LEDS`).
    phy_rst : Out(1)
        Both PHYs' reset, active high.
    rgmii<p>_<pin> : the RGMII pins, without ``pads`` only.
    """

    def __init__(self, config: BoardConfig, pads=None):
        self.config = config
        self.pads = pads
        members = {"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1), "leds": Out(len(LEDS)), "phy_rst": Out(1)}
        if pads is None:
            for p in range(2):
                members.update({f"rgmii{p}_{name}": (In if d == "i" else Out)(w)
                                for name, (d, w) in RGMII_PINS.items()})
        super().__init__(members)
        self.switch = Switch(config.params)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.switch = sw = self.switch
        m.submodules.bridge = bridge = UartAxiLiteBridge(cfg.clk_freq, cfg.baud, AXIL_ADDR_WIDTH)
        connect(m, bridge.bus, sw.s_axil)
        m.d.comb += [bridge.rx.eq(self.uart_rx), self.uart_tx.eq(bridge.tx)]

        # The PHYs stay in reset for phy_reset_cycles after the board's reset; the transmit domain resets
        # with the board (its clock runs from the PLL), each receive domain too, through a synchroniser,
        # since its clock comes from the PHY and stops while the PHY is in reset.
        board_rst = ResetSignal("sync")
        hold = Signal(range(cfg.phy_reset_cycles + 1), init=cfg.phy_reset_cycles)
        with m.If(hold != 0):
            m.d.sync += hold.eq(hold - 1)
        m.d.comb += self.phy_rst.eq(hold != 0)

        for p in range(2):
            self._port(m, p, sw, board_rst)

        beat = Signal(cfg.heartbeat_bits)
        m.d.sync += beat.eq(beat + 1)
        m.d.comb += [self.leds[4].eq(beat[-1]), self.leds[5].eq(~self.phy_rst)]
        return m

    def _tx_reset(self, m, p, board_rst):
        """Port p's transmit reset: ``board_rst`` through a reset synchroniser into the ``tx`` clock, then one
        register of the port's own, which drives that port's transmit logic only.

        Both ports' synchronisers are the same logic, which yosys merges into one (``opt_merge``); the
        per-port register must stay two, so on the FPGA it is an ``FD1S3AY`` instance (a flip-flop whose
        initial value is 1; Amaranth's own Lattice platform instantiates ``FD1S3AX`` the same way) with
        ``keep``: yosys merges no instances. In simulation it is a plain register."""
        pre = f"tx{p}_rst"                       # the synchroniser's domain: the tx clock
        m.domains += ClockDomain(pre)
        m.d.comb += ClockSignal(pre).eq(ClockSignal("tx"))
        m.submodules[f"tx_reset{p}"] = ResetSynchronizer(board_rst, domain=pre)
        return self._reset_register(m, pre, ResetSignal(pre), f"tx{p}_rst_local")

    def _reset_register(self, m, domain, d, name):
        """A register of reset ``d`` in ``domain``'s clock that yosys keeps apart from any identical one."""
        q = Signal(init=1, reset_less=True, name=name)
        if self.pads is None:
            m.d[domain] += q.eq(d)
        else:
            m.submodules[f"{name}_ff"] = Instance("FD1S3AY", p_GSR="DISABLED", a_keep=1,
                                                 i_CK=ClockSignal(domain), i_D=d, o_Q=q)
        return q

    def _port(self, m, p, sw, board_rst):
        cfg, P = self.config, self.config.params
        rx_domain = f"rx{p}"
        m.domains += ClockDomain(rx_domain)          # its clock: the PHY's RXC, driven by RgmiiPhy
        # tx<p>: the `tx` clock with a reset of its own (one reset net across the die for both ports cost
        # 4.6-7.8 ns of routing, the 125 MHz path that missed): the board's reset synchronised into the tx
        # clock, then a register per port that the placer puts beside that port's logic
        tx_domain = f"tx{p}"
        m.domains += ClockDomain(tx_domain)
        m.d.comb += ClockSignal(tx_domain).eq(ClockSignal("tx"))
        m.d.comb += ResetSignal(tx_domain).eq(self._tx_reset(m, p, board_rst))
        m.submodules[f"phy{p}"] = phy = RgmiiPhy(pads=None if self.pads is None else self.pads[p],
                                                 rx_domain=rx_domain, tx_domain=tx_domain)
        if self.pads is None:
            for name, (d, _) in RGMII_PINS.items():
                outer, inner = getattr(self, f"rgmii{p}_{name}"), getattr(phy, name)
                m.d.comb += inner.eq(outer) if d == "i" else outer.eq(inner)
        m.submodules[f"rx_reset{p}"] = ResetSynchronizer(board_rst | self.phy_rst, domain=rx_domain)
        # DomainRenamer's result still shows the component's members
        m.submodules[f"mac_rx{p}"] = mac_rx = DomainRenamer(rx_domain)(MacRx())
        m.submodules[f"mac_tx{p}"] = mac_tx = DomainRenamer(tx_domain)(MacTx())
        m.submodules[f"rx_cdc{p}"] = rx_cdc = RxToAxis(P.data_width, cfg.rx_fifo_depth, rx_domain=rx_domain)
        # the transmit FIFO's write side: the switch clock with a reset register per port. AsyncFIFO resets
        # its read side from its write domain's reset through a synchroniser into the read clock; with `sync`
        # as both ports' write domain those synchronisers (same input, same tx clock) were merged into one,
        # whose output crossed the die to the other port's FIFO (4.5 ns of routing, 111 MHz on tx)
        egress = f"egress{p}"
        m.domains += ClockDomain(egress)
        m.d.comb += [ClockSignal(egress).eq(ClockSignal("sync")),
                     ResetSignal(egress).eq(self._reset_register(m, "sync", board_rst, f"egress{p}_rst_local"))]
        m.submodules[f"tx_cdc{p}"] = tx_cdc = AxisToTx(P.data_width, cfg.tx_fifo_depth, tx_domain=tx_domain,
                                                       w_domain=egress)
        connect(m, phy.rx, mac_rx.gmii)
        connect(m, mac_tx.gmii, phy.tx)
        connect(m, mac_rx.o, rx_cdc.i)
        connect(m, rx_cdc.o, sw.s_axis[p])
        connect(m, sw.m_axis[p], tx_cdc.i)
        connect(m, tx_cdc.o, mac_tx.i)

        # LED stretchers: no reset (they count down to 0 from their init value)
        rx_act = Signal(cfg.activity_bits, reset_less=True)
        tx_act = Signal(cfg.activity_bits, reset_less=True)
        for act, domain, event in ((rx_act, rx_domain, mac_rx.ev_frame), (tx_act, tx_domain, mac_tx.ev_frame)):
            with m.If(event):
                m.d[domain] += act.eq(-1)
            with m.Elif(act != 0):
                m.d[domain] += act.eq(act - 1)
        m.d.comb += [self.leds[p].eq(mac_rx.link), self.leds[2 + p].eq((rx_act != 0) | (tx_act != 0))]
