"""The CAIS switch: ingress ports, switch core, egress ports and control/status registers."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect

from cais import protocol as proto
from cais.params import ParamError, SwitchParams
from cais.registers import register_map

from .common.axis import AxisSignature
from .control.csr import AXI4LiteSignature, AXI4LiteToCSR, RegisterBank
from .control.tables import field_bits
from .core import SwitchCore
from .egress.ports import EgressPort
from .parser.ingress import IngressPort

__all__ = ["Switch", "AXIL_ADDR_WIDTH", "check_buildable"]


def _element(member, index: int, count: int):
    """Element ``index`` of a register bank member of a register array (a plain member when count is 1)."""
    return member[index] if count > 1 else member

AXIL_ADDR_WIDTH = 12   # one 4 KiB page; addresses outside the register map answer with an error


def check_buildable(params: SwitchParams) -> None:
    """Raise :class:`ParamError` for parameters this RTL cannot build (beyond SwitchParams' own checks)."""
    # Nothing beyond them at present (uplink=True builds the uplink action, docs/protocol.md section 13).


class Switch(wiring.Component):
    """The whole switch, with structured ports (see :class:`cais.hdl.top.SwitchTop` for flat names).

    Members
    -------
    s_axis[p] : In(AxisSignature(data_width, user=True))
        Ingress of port p.
    m_axis[p] : Out(AxisSignature(data_width))
        Egress of port p.
    s_axil : In(AXI4LiteSignature(12))
        Control and status registers (docs/registers.md).
    """

    def __init__(self, params: SwitchParams = SwitchParams()):
        check_buildable(params)
        self.params = params
        self.regmap = register_map(params)
        super().__init__({
            "s_axis": In(AxisSignature(params.data_width, user=True)).array(params.ports),
            "m_axis": Out(AxisSignature(params.data_width)).array(params.ports),
            "s_axil": In(AXI4LiteSignature(AXIL_ADDR_WIDTH)),
        })
        self.core = SwitchCore(params, self.regmap)
        # The value of the BUSY register, cycle by cycle (for simulation: the register reads it).
        self.busy = Signal()

    def elaborate(self, platform):
        m = Module()
        P = self.params

        m.submodules.axil = axil = AXI4LiteToCSR(AXIL_ADDR_WIDTH)
        m.submodules.core = core = self.core
        # BUSY: the core's parts and every port's ingress and egress, registered as they are in the bank
        busy_parts = len(core.busy_parts) + 2 * P.ports
        m.submodules.regs = regs = RegisterBank(self.regmap, addr_width=AXIL_ADDR_WIDTH,
                                                level_any={"BUSY": busy_parts})
        connect(m, wiring.flipped(self.s_axil), axil.axil)
        connect(m, axil.csr, regs.csr)
        # A full SLOT_CLEAR queue holds the next write back (a register, from the write's strobe's next cycle)
        m.d.comb += axil.w_hold.eq(self.core.decision.clear_full)

        m.d.comb += [
            # the bank's members of the table registers, by the names both derive from the register map
            *(getattr(core.program, name).eq(getattr(regs, name)) for name in core.program.signature.members),
            core.switch_mac.eq(Cat(regs.switch_mac_lo, regs.switch_mac_hi[:16])),
            regs.slots_in_use_value.eq(core.slots_in_use),
        ]
        busy = [core.busy_parts]

        # Core events -> counters. Drops come from every ingress port and from the core, so a reason's
        # counter may advance by several in one cycle. Every event comes from a register (an ingress port's
        # drops one-hot, one flip-flop per reason) and the bank registers each increment before its adder,
        # so a sum of events is the only logic between them.
        # (the core drops a frame only for a reason after the parser's: a parser's drop never reaches it)
        drops = {r: [] if r in proto.PARSER_DROPS else [core.ev_drop & (core.ev_drop_reason == r)]
                 for r in proto.DropReason}
        m.d.comb += [
            regs.forwarded_inc.eq(core.ev_forwarded),
            regs.contributions_inc.eq(core.ev_contribution),
            regs.duplicates_inc.eq(core.ev_duplicate),
            regs.completed_inc.eq(core.ev_completed),
            regs.results_resent_inc.eq(core.ev_resent),
        ]
        if P.uplink:    # the uplink action (docs/protocol.md section 13)
            up_reg = self.regmap["UPLINK"]
            up_port, up_en = field_bits(regs.uplink, up_reg.field("port")), field_bits(regs.uplink, up_reg.field("enable"))
            m.d.comb += [core.uplink.eq(regs.uplink), regs.partials_sent_inc.eq(core.ev_partial_sent),
                         regs.partials_resent_inc.eq(core.ev_partial_resent)]
        else:           # no uplink action in this build: no partial is ever sent
            m.d.comb += [regs.partials_sent_inc.eq(0), regs.partials_resent_inc.eq(0)]

        for p in range(P.ports):
            m.submodules[f"ingress{p}"] = ing = IngressPort(P)
            connect(m, wiring.flipped(self.s_axis[p]), ing.s_axis)
            connect(m, ing.headers, core.headers[p])
            connect(m, ing.beats, core.beats[p])
            if P.uplink:
                m.d.comb += ing.uplink.eq(up_en & (up_port == p))
            m.d.comb += [regs.rx_frames_inc[p].eq(ing.rx_frame), regs.rx_bytes_inc[p].eq(ing.rx_bytes)]
            busy.append(ing.busy)
            for i, r in enumerate(proto.PARSER_DROPS):
                drops[r].append(ing.drop_counted[i])

            # Egress: the port's egress FIFO, result queue and merge (whole frames into m_axis), the credits
            # back to the core's crossbar and fanout, and the tx counters' increments.
            m.submodules[f"egress{p}"] = eg = EgressPort(P.data_width, P.egress_depth, P.result_queue_depth)
            connect(m, core.egress[p], eg.fwd)
            connect(m, core.results[p], eg.res)
            connect(m, eg.m_axis, wiring.flipped(self.m_axis[p]))
            m.d.comb += [core.e_freed[p].eq(eg.fwd_freed), core.r_freed[p].eq(eg.res_freed),
                         regs.tx_frames_inc[p].eq(eg.tx_frame), regs.tx_bytes_inc[p].eq(eg.tx_bytes)]
            busy.append(eg.busy)

        # The decision's per-rule-entry state (issue 12, 13), read from it directly.
        dec = self.core.decision
        for e in range(P.rules):
            m.d.comb += [_element(regs.sets_in_use_value, e, P.rules).eq(dec.sets_in_use[e]),
                         _element(regs.aged_inc, e, P.rules).eq(dec.aged & (dec.aged_rule == e))]
        m.d.comb += [regs.aged_total_inc.eq(dec.aged), regs.aged_lost_inc.eq(dec.aged_lost),
                     regs.aged_event_value.eq(dec.aged_event), regs.aged_ports_value.eq(dec.aged_ports)]

        for r, events in drops.items():
            m.d.comb += getattr(regs, f"drop_{r.name.lower()}_inc").eq(sum(events))
        m.d.comb += [regs.busy_value.eq(Cat(*busy)), self.busy.eq(regs.busy_value.any())]
        return m
