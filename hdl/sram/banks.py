"""The SRAM buffer's contribution banks: one block RAM per port holding that port's all-reduce payload rows.

An all-reduce payload row is written once, into the bank of the port it came from (by the port's
:class:`cais.hdl.alu.lane.IngressLane`), and read back when its set completes: the fold reader
(:class:`cais.hdl.alu.completion.FoldReader`) reads the same row address of every bank in one cycle.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais.params import SwitchParams

from ..common.bram import OutputRegisteredRAM
from ..latency import BANK_READ, BANK_WRITE

__all__ = ["ContributionBanks", "BANK_READ_LATENCY", "bank_depth", "bank_addr_bits"]

#: Clock edges from a read address (with ``rd_en``) to its data on ``rd_data``: the block RAM's
#: synchronous read, then its output register, the RAM block's own on ECP5
#: (:class:`~cais.hdl.common.bram.OutputRegisteredRAM`; :data:`cais.hdl.latency.BANK_READ`).
BANK_READ_LATENCY = BANK_READ


def bank_depth(params: SwitchParams) -> int:
    """Rows per bank: one per beat of payload, for each shadow set of every slot."""
    return params.slots * 2 * params.rows_per_set


def bank_addr_bits(params: SwitchParams) -> int:
    """Address bits of a contribution bank (:func:`bank_depth` rows)."""
    return ceil_log2(bank_depth(params))


class ContributionBanks(wiring.Component):
    """``params.ports`` banks of ``bank_depth(params)`` rows of ``data_width`` bits.

    Each bank has its own write port and one read port; the read ports of all banks share one address.
    A write in cycle ``t`` is visible to a read issued in cycle ``t + 2`` or later (:attr:`write_latency`,
    :data:`~cais.hdl.latency.BANK_WRITE`: the write is registered beside each block RAM, a copy per
    DP16KD on ECP5, so that no lane's logic drives the pins of all of a bank's blocks across the die; a read
    of the row being written is not defined on the FPGA; the switch issues neither: a job is read only
    after its frames finished writing, :mod:`cais.hdl.latency`). A read with ``rd_en`` in cycle ``t``
    presents every bank's row in ``rd_data`` from cycle ``t + 2`` (:data:`BANK_READ_LATENCY`: the synchronous read and the
    output register, inside the block RAM on ECP5) and holds it until the next enabled read's data
    replaces it. The rows have no reset value. Each bank is an
    :class:`~cais.hdl.common.bram.OutputRegisteredRAM` (``banks[p]``).

    Members
    -------
    wr_addr[p] : In(bank_addr_bits); wr_data[p] : In(data_width); wr_en[p] : In(1)
        Bank p's write port.
    rd_addr : In(bank_addr_bits); rd_en : In(1)
        The read address of every bank.
    rd_data[p] : Out(data_width)
        Bank p's row at the last enabled read address (the RAM's output register).
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        P, W, A = params.ports, params.data_width, bank_addr_bits(params)
        super().__init__({
            "wr_addr": In(A).array(P), "wr_data": In(W).array(P), "wr_en": In(1).array(P),
            "rd_addr": In(A), "rd_en": In(1),
            "rd_data": Out(W).array(P),
        })
        # Created here so tests can inspect them.
        self.banks = [OutputRegisteredRAM(W, bank_depth(params), registered_write=True) for _ in range(P)]
        assert all(bank.write_latency == BANK_WRITE for bank in self.banks)

    @property
    def read_latency(self) -> int:
        return BANK_READ_LATENCY

    @property
    def write_latency(self) -> int:
        return BANK_WRITE

    def elaborate(self, platform):
        m = Module()
        for p, bank in enumerate(self.banks):
            m.submodules[f"bank{p}"] = bank
            m.d.comb += [
                bank.wr_addr.eq(self.wr_addr[p]), bank.wr_data.eq(self.wr_data[p]), bank.wr_en.eq(self.wr_en[p]),
                bank.rd_addr.eq(self.rd_addr), bank.rd_en.eq(self.rd_en), self.rd_data[p].eq(bank.rd_data),
            ]
        return m
