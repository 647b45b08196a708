"""The SRAM buffer as one component: the slot-state memory (with its addressing and reset sweep) and the
contribution banks, behind one interface.

::

    decision's SlotState ----- state ---+
    decision's Maintenance --- maint ---+--> SlotStateMemory (state.py): one entry per slot, sweep after reset
    lanes[p] ---------- wr_*[p] --------+
    fold reader ------- rd_* -----------+--> ContributionBanks (banks.py): one bank of rows per port
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams

from .banks import ContributionBanks, bank_addr_bits
from .state import SlotStateMemory, SlotStatePort

__all__ = ["SramBuffer"]


class SramBuffer(wiring.Component):
    """Every block RAM of the card's aggregation state.

    Members
    -------
    state : In(SlotStatePort(read_en=False))
        The decision's slot-state pipeline: its read (every cycle) and write of the slot state.
    maint : In(SlotStatePort(read_en=True))
        The decision's maintenance (SLOT_CLEAR, the aging scanner): its reads and writes.
    sweeping : Out(1); sweep_last : Out(1)
        The reset sweep writes a slot empty in this cycle (from reset, one slot per cycle); its last one.
    wr_addr[p] : In(bank_addr_bits); wr_data[p] : In(data_width); wr_en[p] : In(1)
        Bank p's write port (port p's lane: its all-reduce payload rows).
    rd_addr : In(bank_addr_bits); rd_en : In(1); rd_data[p] : Out(data_width)
        The fold reader's read of the same row of every bank.

    The contracts and latencies are the parts': :class:`~cais.hdl.sram.state.SlotStateMemory` (reads
    ``state_read_latency`` = 2 cycles, writes in the order sweep, pipeline, maintenance) and
    :class:`~cais.hdl.sram.banks.ContributionBanks` (reads ``bank_read_latency`` = 2 cycles: the RAM's read and its output register).
    ``state_memory`` and ``banks`` are the parts themselves (the formal harness and tests look inside).
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        P, W, A = params.ports, params.data_width, bank_addr_bits(params)
        super().__init__({
            "state": In(SlotStatePort(params, read_en=False)), "maint": In(SlotStatePort(params, read_en=True)),
            "sweeping": Out(1), "sweep_last": Out(1),
            "wr_addr": In(A).array(P), "wr_data": In(W).array(P), "wr_en": In(1).array(P),
            "rd_addr": In(A), "rd_en": In(1), "rd_data": Out(W).array(P),
        })
        self.state_memory = SlotStateMemory(params)
        self.banks = ContributionBanks(params)

    @property
    def state_read_latency(self) -> int:
        return self.state_memory.read_latency

    @property
    def bank_read_latency(self) -> int:
        return self.banks.read_latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.state_memory = mem = self.state_memory
        m.submodules.banks = banks = self.banks
        wiring.connect(m, wiring.flipped(self.state), mem.pipe)
        wiring.connect(m, wiring.flipped(self.maint), mem.maint)
        m.d.comb += [self.sweeping.eq(mem.sweeping), self.sweep_last.eq(mem.sweep_last)]
        for p in range(self.params.ports):
            m.d.comb += [banks.wr_addr[p].eq(self.wr_addr[p]), banks.wr_data[p].eq(self.wr_data[p]),
                         banks.wr_en[p].eq(self.wr_en[p]), self.rd_data[p].eq(banks.rd_data[p])]
        m.d.comb += [banks.rd_addr.eq(self.rd_addr), banks.rd_en.eq(self.rd_en)]
        return m
