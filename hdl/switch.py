"""The CAIS switch: ingress ports, switch core, egress ports and control/status registers."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map

from .axis import AxisSignature
from .core import SwitchCore
from .csr import AXI4LiteSignature, AXI4LiteToCSR, RegisterBank
from .egress import EgressMerge
from .frame_fifo import FrameFifo
from .ingress import IngressPort, popcount

__all__ = ["Switch", "AXIL_ADDR_WIDTH"]


def _element(member, index: int, count: int):
    """Element ``index`` of a register bank member of a register array (a plain member when count is 1)."""
    return member[index] if count > 1 else member

AXIL_ADDR_WIDTH = 12   # one 4 KiB page; addresses outside the register map answer with an error


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
        B = P.beat_bytes

        m.submodules.axil = axil = AXI4LiteToCSR(AXIL_ADDR_WIDTH)
        m.submodules.regs = regs = RegisterBank(self.regmap, addr_width=AXIL_ADDR_WIDTH)
        connect(m, wiring.flipped(self.s_axil), axil.axil)
        connect(m, axil.csr, regs.csr)

        m.submodules.core = core = self.core
        m.d.comb += [
            # the bank's members of the table registers, by the names both derive from the register map
            *(getattr(core.program, name).eq(getattr(regs, name)) for name in core.program.signature.members),
            core.switch_mac.eq(Cat(regs.switch_mac_lo, regs.switch_mac_hi[:16])),
            regs.slots_in_use_value.eq(core.slots_in_use),
        ]
        busy = [core.busy]

        # Core events -> counters. Drops come from every ingress port and from the core, so a reason's
        # counter may advance by several in one cycle. Every event comes from a register and the bank
        # registers each increment before its adder, so a sum of events is the only logic between them.
        drops = {r: [core.ev_drop & (core.ev_drop_reason == r)] for r in proto.DropReason}
        m.d.comb += [
            regs.forwarded_inc.eq(core.ev_forwarded),
            regs.contributions_inc.eq(core.ev_contribution),
            regs.duplicates_inc.eq(core.ev_duplicate),
            regs.completed_inc.eq(core.ev_completed),
            regs.results_resent_inc.eq(core.ev_resent),
        ]

        for p in range(P.ports):
            m.submodules[f"ingress{p}"] = ing = IngressPort(P)
            connect(m, wiring.flipped(self.s_axis[p]), ing.s_axis)
            connect(m, ing.headers, core.headers[p])
            connect(m, ing.beats, core.beats[p])
            m.d.comb += [regs.rx_frames_inc[p].eq(ing.rx_frame), regs.rx_bytes_inc[p].eq(ing.rx_bytes)]
            busy.append(ing.busy)
            for r in proto.PARSER_DROPS:
                drops[r].append(ing.drop & (ing.drop_reason == r))

            # Egress: per port a FIFO of forwarded frames fed by the core's crossbar, a result queue fed by
            # its result fanout, and a merge of the two into m_axis (whole frames, round-robin at frame
            # boundaries). Every beat is committed as it is written (the FIFO's frame commit is not needed
            # here). The crossbar and the fanout count their FIFOs' room themselves (credits); a beat read
            # out gives its credit back a cycle later, from a register. Both FIFOs' outputs are registered
            # (2 cycles more than the RAM's read-ahead): the whole switch measured 5.2 ns of routing from
            # the RAM's slow output into the tx counters' register without it; the merge adds one 2-to-1
            # choice after those registers, with a registered owner.
            width = P.data_width + B + 1
            m.submodules[f"egress{p}"] = fifo = FrameFifo(width, P.egress_depth, registered_output=True)
            m.submodules[f"results{p}"] = rq = FrameFifo(width, P.result_queue_depth, registered_output=True)
            m.submodules[f"merge{p}"] = merge = EgressMerge(P.data_width)
            for q, src in ((fifo, core.egress[p]), (rq, core.results[p])):
                m.d.comb += [q.w_data.eq(src.payload), q.w_en.eq(src.valid), q.commit.eq(src.valid)]
            m.d.comb += [
                merge.fwd.payload.eq(fifo.r_data), merge.fwd.valid.eq(fifo.r_valid), fifo.r_ready.eq(merge.fwd.ready),
                merge.res.payload.eq(rq.r_data), merge.res.valid.eq(rq.r_valid), rq.r_ready.eq(merge.res.ready),
            ]
            busy += [fifo.held, rq.held]
            out = self.m_axis[p]
            m.d.comb += [
                Cat(out.tdata, out.tkeep, out.tlast).eq(merge.o.payload),
                out.tvalid.eq(merge.o.valid), merge.o.ready.eq(out.tready),
            ]
            e_freed, r_freed = Signal(name=f"egress_freed{p}"), Signal(name=f"results_freed{p}")
            m.d.sync += [e_freed.eq(fifo.r_valid & fifo.r_ready), r_freed.eq(rq.r_valid & rq.r_ready)]
            m.d.comb += [core.e_freed[p].eq(e_freed), core.r_freed[p].eq(r_freed)]
            # tx increments from the beat sent, registered first: tready comes from outside, too late in
            # the cycle for a count and an adder behind it
            sent = out.tvalid & out.tready
            tx_keep = Signal(B, name=f"tx_keep_{p}")
            tx_last = Signal(name=f"tx_last_{p}")
            m.d.sync += [tx_keep.eq(Mux(sent, out.tkeep, 0)), tx_last.eq(sent & out.tlast)]
            m.d.comb += [regs.tx_frames_inc[p].eq(tx_last), regs.tx_bytes_inc[p].eq(popcount(tx_keep))]

        # The decision's per-rule-entry state (issue 12, 13), read from it directly.
        dec = self.core.decision
        for e in range(P.rules):
            m.d.comb += [_element(regs.sets_in_use_value, e, P.rules).eq(dec.sets_in_use[e]),
                         _element(regs.aged_inc, e, P.rules).eq(dec.aged & (dec.aged_rule == e))]
        m.d.comb += [regs.aged_total_inc.eq(dec.aged), regs.aged_lost_inc.eq(dec.aged_lost),
                     regs.aged_event_value.eq(dec.aged_event), regs.aged_ports_value.eq(dec.aged_ports)]

        for r, events in drops.items():
            m.d.comb += getattr(regs, f"drop_{r.name.lower()}_inc").eq(sum(events))
        m.d.comb += [self.busy.eq(Cat(*busy).any()), regs.busy_value.eq(self.busy)]
        return m
