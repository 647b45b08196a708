"""The switch's blocks as tops of their own, with plain ports, for Verilog export and the cocotb testbenches.

``python -m cais.hdl.export --block NAME`` writes one of :data:`BLOCKS`; tb/<block>/ simulates it.
Streams come out as AXI4-Stream ports (``<name>__tdata``, ``__tvalid``, ``__tready``; ``tkeep``/``tlast``
only where the block has them) so cocotbext-axi's models drive them (``bus_separator="__"``):

========  ====================================  ==========================================================
block     wraps                                 ports
========  ====================================  ==========================================================
ingress   :class:`cais.hdl.ingress.IngressPort`  ``s_axis`` (tdata tkeep tlast tuser), ``m_hdr`` (tdata: the
                                                frame_meta_layout bits), ``m_axis`` (tdata: the beats),
                                                ``drop``, ``drop_reason``, ``rx_frame``, ``rx_bytes``, ``busy``
sram      :class:`cais.hdl.sram.ContributionBanks`  its own members (``wr_addr__0`` ..., ``rd_data__0`` ...)
alu       :class:`cais.hdl.fold.FoldChain`       ``s_axis`` (tdata: :func:`fold_input_fields` packed, tvalid),
                                                ``m_axis`` (tdata: the result word, tvalid); no tready: the
                                                chain takes a set of rows every cycle
csr       :class:`cais.hdl.csr.AXI4LiteToCSR` +  ``s_axil`` (AXI4-Lite) and every member of the register bank
          :class:`cais.hdl.csr.RegisterBank`     (``switch_mac_lo``, ``rule_write_stb``, ``rx_bytes_inc__0`` ...)
switch    :class:`cais.hdl.top.SwitchTop`        the exported switch (``s_axis_p0_tdata`` ...)
========  ====================================  ==========================================================
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import register_map

from .axis import AxisSignature
from .csr import AXI4LiteSignature, AXI4LiteToCSR, RegisterBank
from .enums import DropReason, DType, ReduceOp

__all__ = ["StreamPorts", "IngressBlock", "BanksBlock", "FoldBlock", "CsrBlock", "BLOCKS", "block_top",
           "fold_input_fields", "CSR_ADDR_WIDTH"]

#: The AXI4-Lite address width of the csr block (the switch's: one 4 KiB page).
CSR_ADDR_WIDTH = 12


class StreamPorts(wiring.Signature):
    """A stream as AXI4-Stream names, seen from the source: ``tdata``, ``tvalid`` and, unless
    ``ready=False``, ``tready``."""

    def __init__(self, width: int, *, ready: bool = True):
        super().__init__({"tdata": Out(width), "tvalid": Out(1), **({"tready": In(1)} if ready else {})})


def _stream_out(m, outer, inner):
    """An amaranth.lib.stream interface ``inner`` (its source side) onto StreamPorts ``outer``."""
    m.d.comb += [outer.tdata.eq(inner.payload), outer.tvalid.eq(inner.valid), inner.ready.eq(outer.tready)]


class IngressBlock(wiring.Component):
    """:class:`cais.hdl.ingress.IngressPort` with its header and beat streams as AXI4-Stream ports."""

    def __init__(self, params: SwitchParams):
        from .ingress import IngressPort

        self.params = params
        self.port = IngressPort(params)
        self.meta_layout = self.port.meta_layout
        super().__init__({
            "s_axis": In(AxisSignature(params.data_width, user=True)),
            "m_hdr": Out(StreamPorts(self.meta_layout.size)),
            "m_axis": Out(StreamPorts(params.data_width)),
            "drop": Out(1), "drop_reason": Out(DropReason), "rx_frame": Out(1), "rx_bytes": Out(8), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.ingress = port = self.port
        wiring.connect(m, wiring.flipped(self.s_axis), port.s_axis)
        _stream_out(m, self.m_hdr, port.headers)
        _stream_out(m, self.m_axis, port.beats)
        m.d.comb += [self.drop.eq(port.drop), self.drop_reason.eq(port.drop_reason), self.rx_frame.eq(port.rx_frame),
                     self.rx_bytes.eq(port.rx_bytes), self.busy.eq(port.busy)]
        return m


def BanksBlock(params: SwitchParams):
    """:class:`cais.hdl.sram.ContributionBanks` as it is: its members are plain ports already."""
    from .sram import ContributionBanks

    return ContributionBanks(params)


def fold_input_fields(ports: int, data_width: int) -> list[tuple[str, int]]:
    """(name, bits) of the alu block's ``s_axis__tdata``, from bit 0 up: ``row0 .. row{P-1}``, ``mask``,
    ``dtype``, ``op``, ``acc_fp32``, ``saturate``."""
    return ([(f"row{p}", data_width) for p in range(ports)]
            + [("mask", ports), ("dtype", DType.as_shape().width), ("op", ReduceOp.as_shape().width),
               ("acc_fp32", 1), ("saturate", 1)])


class FoldBlock(wiring.Component):
    """:class:`cais.hdl.fold.FoldChain` with its inputs packed into one stream (``s_axis``) and its result
    on another (``m_axis``); neither has ``tready``: a set of rows enters whenever ``s_axis__tvalid``, and
    its result leaves :attr:`latency` cycles later with ``m_axis__tvalid``."""

    def __init__(self, params: SwitchParams):
        from .fold import FoldChain

        self.params = params
        self.chain = FoldChain(params.ports, params.data_width, float_units=params.float_units)
        self.layout = data.StructLayout(dict(fold_input_fields(params.ports, params.data_width)))
        super().__init__({
            "s_axis": In(StreamPorts(self.layout.size, ready=False)),
            "m_axis": Out(StreamPorts(2 * params.data_width, ready=False)),
        })

    @property
    def latency(self) -> int:
        return self.chain.latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.chain = chain = self.chain
        i = data.View(self.layout, self.s_axis.tdata)
        m.d.comb += [chain.i_valid.eq(self.s_axis.tvalid), chain.mask.eq(i.mask), chain.dtype.eq(i.dtype),
                     chain.op.eq(i.op), chain.acc_fp32.eq(i.acc_fp32), chain.saturate.eq(i.saturate)]
        m.d.comb += [chain.rows[p].eq(i[f"row{p}"]) for p in range(self.params.ports)]
        m.d.comb += [self.m_axis.tdata.eq(chain.result), self.m_axis.tvalid.eq(chain.o_valid)]
        return m


class CsrBlock(wiring.Component):
    """The switch's control registers as the switch builds them: :class:`AXI4LiteToCSR` in front of the
    :class:`RegisterBank` of ``register_map(params)`` (address width :data:`CSR_ADDR_WIDTH`), every bank
    member but the CSR bus a port of the same name (register arrays: ``<name>__<i>``)."""

    def __init__(self, params: SwitchParams):
        self.params = params
        self.regmap = register_map(params)
        self.bridge = AXI4LiteToCSR(CSR_ADDR_WIDTH)
        self.bank = RegisterBank(self.regmap, addr_width=CSR_ADDR_WIDTH)
        members = {"s_axil": In(AXI4LiteSignature(CSR_ADDR_WIDTH))}
        members.update({name: member for name, member in self.bank.signature.members.items() if name != "csr"})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge, m.submodules.bank = self.bridge, self.bank
        wiring.connect(m, wiring.flipped(self.s_axil), self.bridge.axil)
        wiring.connect(m, self.bridge.csr, self.bank.csr)
        for name, member in self.signature.members.items():
            if name == "s_axil":
                continue
            outer, inner = getattr(self, name), getattr(self.bank, name)
            pairs = list(zip(outer, inner)) if member.dimensions else [(outer, inner)]
            for o, i in pairs:
                m.d.comb += o.eq(i) if member.flow == Out else i.eq(o)
        return m


def _switch(params: SwitchParams):
    from .top import SwitchTop

    return SwitchTop(params)


#: block name -> (factory(params), the Verilog top module's name)
BLOCKS = {
    "ingress": (IngressBlock, "cais_ingress"),
    "sram": (BanksBlock, "cais_sram"),
    "alu": (FoldBlock, "cais_alu"),
    "csr": (CsrBlock, "cais_csr"),
    "switch": (_switch, "cais_switch"),
}


def block_top(block: str, params: SwitchParams):
    """The component of ``block`` (a name of :data:`BLOCKS`) for ``params``."""
    try:
        factory, _ = BLOCKS[block]
    except KeyError:
        raise ValueError(f"unknown block {block!r}; one of {', '.join(BLOCKS)}") from None
    return factory(params)
