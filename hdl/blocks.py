"""The switch's blocks as tops of their own, with plain ports, for Verilog export and the cocotb testbenches.

``python -m cais.hdl.export --block NAME`` writes one of :data:`BLOCKS`; tb/<block>/ simulates it.
Streams come out as AXI4-Stream ports (``<name>__tdata``, ``__tvalid``, ``__tready``; ``tkeep``/``tlast``
only where the block has them) so cocotbext-axi's models drive them (``bus_separator="__"``):

========  ====================================  ==========================================================
block     wraps                                 ports
========  ====================================  ==========================================================
ingress   :class:`cais.hdl.parser.ingress.IngressPort`  ``s_axis`` (tdata tkeep tlast tuser), ``m_hdr`` (tdata: the
                                                frame_meta_layout bits), ``m_axis`` (tdata: the beats),
                                                ``drop``, ``drop_reason``, ``rx_frame``, ``rx_bytes``, ``busy``
sram      :class:`cais.hdl.sram.buffer.SramBuffer`    its own members (``state__read_addr`` ..., ``maint__read_en``
                                                ..., ``sweeping``, ``wr_addr__0`` ..., ``rd_data__0`` ...)
alu       :class:`cais.hdl.alu.fold.FoldChain`       ``s_axis`` (tdata: :func:`fold_input_fields` packed, tvalid),
                                                ``m_axis`` (tdata: the result word, tvalid); no tready: the
                                                chain takes a set of rows every cycle
csr       :class:`cais.hdl.control.csr.AXI4LiteToCSR` +  ``s_axil`` (AXI4-Lite) and every member of the register bank
          :class:`cais.hdl.control.csr.RegisterBank`     (``switch_mac_lo``, ``rule_write_stb``, ``rx_bytes_inc__0`` ...)
egress    :class:`cais.hdl.egress.ports.EgressCrossbar`  ``s_axis__<s>`` per lane and ``s_res`` (tdata tkeep tlast tdest:
          + ``ResultFanout`` + ``EgressPort``     the frame's port mask), ``m_axis__<p>`` (tdata tkeep tlast),
          per port                              ``tx_frame__<p>``, ``tx_bytes__<p>``, ``busy``, ``underrun``
switch    :class:`cais.hdl.top.SwitchTop`        the exported switch (``s_axis_p0_tdata`` ...)
uart      :class:`cais.hdl.board.uart_bridge.`   ``rx``, ``tx``, ``framing_errors``, ``error_replies`` and the
          ``UartAxiLiteBridge`` + the csr block  csr block's bank members (its ``s_axil`` is the bridge's)
========  ====================================  ==========================================================
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import register_map

from .alu.fold import FoldChain
from .board.uart_bridge import UartAxiLiteBridge
from .common.axis import AxisSignature
from .common.enums import DropReason, DType, ReduceOp
from .common.frame_fifo import FrameFifo
from .control.csr import AXI4LiteSignature, AXI4LiteToCSR, RegisterBank
from .egress.ports import EgressCrossbar, EgressPort, FrameSourceSignature, ResultFanout
from .parser.ingress import IngressPort
from .sram.buffer import SramBuffer
from .top import SwitchTop

__all__ = ["StreamPorts", "IngressBlock", "SramBlock", "FoldBlock", "CsrBlock", "AxisDestSignature",
           "AxisFrameSource", "EgressBlock", "BLOCKS", "block_top",
           "fold_input_fields", "CSR_ADDR_WIDTH", "UartBlock", "UART_CLK_FREQ", "UART_BAUD"]

#: The AXI4-Lite address width of the csr block (the switch's: one 4 KiB page).
CSR_ADDR_WIDTH = 12
#: The uart block's clock (the testbenches' 10 ns clock, cais.tb.common.CLOCK_NS) and line rate: 8 cycles
#: per bit, so a simulated request and its reply take about 1300 cycles.
UART_CLK_FREQ = 100_000_000
UART_BAUD = UART_CLK_FREQ // 8


class StreamPorts(wiring.Signature):
    """A stream as AXI4-Stream names, seen from the source: ``tdata``, ``tvalid`` and, unless
    ``ready=False``, ``tready``."""

    def __init__(self, width: int, *, ready: bool = True):
        super().__init__({"tdata": Out(width), "tvalid": Out(1), **({"tready": In(1)} if ready else {})})


def _stream_out(m, outer, inner):
    """An amaranth.lib.stream interface ``inner`` (its source side) onto StreamPorts ``outer``."""
    m.d.comb += [outer.tdata.eq(inner.payload), outer.tvalid.eq(inner.valid), inner.ready.eq(outer.tready)]


class IngressBlock(wiring.Component):
    """:class:`cais.hdl.parser.ingress.IngressPort` with its header and beat streams as AXI4-Stream ports."""

    def __init__(self, params: SwitchParams):
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


def SramBlock(params: SwitchParams):
    """:class:`cais.hdl.sram.buffer.SramBuffer` as it is: its members are plain ports already."""
    return SramBuffer(params)


def fold_input_fields(ports: int, data_width: int) -> list[tuple[str, int]]:
    """(name, bits) of the alu block's ``s_axis__tdata``, from bit 0 up: ``row0 .. row{P-1}``, ``mask``,
    ``dtype``, ``op``, ``acc_fp32``, ``saturate``."""
    return ([(f"row{p}", data_width) for p in range(ports)]
            + [("mask", ports), ("dtype", DType.as_shape().width), ("op", ReduceOp.as_shape().width),
               ("acc_fp32", 1), ("saturate", 1)])


class FoldBlock(wiring.Component):
    """:class:`cais.hdl.alu.fold.FoldChain` with its inputs packed into one stream (``s_axis``) and its result
    on another (``m_axis``); neither has ``tready``: a set of rows enters whenever ``s_axis__tvalid``, and
    its result leaves :attr:`latency` cycles later with ``m_axis__tvalid``."""

    def __init__(self, params: SwitchParams):
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
        _pass_through(m, self, self.bank, [name for name in self.signature.members if name != "s_axil"])
        return m


def _pass_through(m, outer, inner, names):
    """Connect members ``names`` of component ``outer`` to the same-named members of ``inner`` (a submodule)."""
    for name in names:
        member = outer.signature.members[name]
        o, i = getattr(outer, name), getattr(inner, name)
        pairs = list(zip(o, i)) if member.dimensions else [(o, i)]
        for a, b in pairs:
            m.d.comb += a.eq(b) if member.flow == Out else b.eq(a)


class UartBlock(wiring.Component):
    """The UART control path of a board: :class:`~cais.hdl.board.uart_bridge.UartAxiLiteBridge` (at
    :data:`UART_CLK_FREQ`, :data:`UART_BAUD`, its default timeout) driving the csr block's AXI4-Lite port;
    ``rx``, ``tx``, the bridge's counters and every other member of the csr block are ports."""

    def __init__(self, params: SwitchParams):
        self.params = params
        self.csr = CsrBlock(params)
        self.bridge = UartAxiLiteBridge(UART_CLK_FREQ, UART_BAUD, CSR_ADDR_WIDTH)
        self._bank_members = [name for name in self.csr.signature.members if name != "s_axil"]
        members = {name: member for name, member in self.bridge.signature.members.items() if name != "bus"}
        members.update({name: self.csr.signature.members[name] for name in self._bank_members})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge, m.submodules.csr = self.bridge, self.csr
        wiring.connect(m, self.bridge.bus, self.csr.s_axil)
        _pass_through(m, self, self.bridge, ["rx", "tx", "framing_errors", "error_replies"])
        _pass_through(m, self, self.csr, self._bank_members)
        return m


class AxisDestSignature(wiring.Signature):
    """AXI4-Stream with ``tdest`` (``dest_width`` bits, the same on every beat of a frame), from the source:
    ``tdata tkeep tlast tdest tvalid tready``."""

    def __init__(self, data_width: int, dest_width: int):
        super().__init__({
            "tdata": Out(data_width), "tkeep": Out(data_width // 8), "tlast": Out(1), "tdest": Out(dest_width),
            "tvalid": Out(1), "tready": In(1),
        })


class AxisFrameSource(wiring.Component):
    """Test scaffolding: an AXI4-Stream slave whose frames are offered as a
    :class:`~cais.hdl.egress.ports.FrameSourceSignature` source (what a lane or the result generator is to the
    egress), so cocotbext-axi's AxiStreamSource can drive the egress blocks. Not part of the switch.

    Each frame is buffered whole (a :class:`~cais.hdl.common.frame_fifo.FrameFifo` of ``depth`` beats, committed at
    its last beat), its port mask (``tdest`` of its last beat) and beat count queued beside it; then it
    asks (``req``, ``mask``, ``beats``: registers) and, granted, streams its beats one per cycle without a
    gap. Like a lane, it asks for the next frame while the current one streams, as early as the signature
    allows (``req`` in cycle c only if the current frame's last beat is in c + 1 or earlier), so granted
    frames follow each other back to back. A frame must be 1 .. ``max_beats`` beats and fit ``depth``.

    Members
    -------
    s_axis : In(AxisDestSignature(data_width, ports))
    o : Out(FrameSourceSignature(ports, data_width, max_beats))
    busy : Out(1)
        A frame is buffered, asking or streaming.
    underrun : Out(1)
        Sticky: a beat was due while the buffer had none (a fault of this scaffolding; never expected).
    """

    def __init__(self, ports: int, data_width: int, max_beats: int, depth: int):
        assert depth >= max_beats
        self.ports, self.data_width, self.max_beats, self.depth = ports, data_width, max_beats, depth
        super().__init__({
            "s_axis": In(AxisDestSignature(data_width, ports)),
            "o": Out(FrameSourceSignature(ports, data_width, max_beats)),
            "busy": Out(1), "underrun": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, W, B = self.ports, self.data_width, self.data_width // 8
        s, o = self.s_axis, self.o
        beats_w = len(o.beats)
        m.submodules.buf = buf = FrameFifo(W + B + 1, self.depth)
        m.submodules.meta = meta = fifo.SyncFIFOBuffered(width=P + beats_w, depth=4)

        # write side: every beat into the buffer, committed with its frame's last beat; mask and beats queued
        count = Signal(range(self.max_beats + 1))           # beats of the frame being received so far
        take = s.tvalid & s.tready
        m.d.comb += [
            s.tready.eq(buf.w_rdy & meta.w_rdy),
            buf.w_data.eq(Cat(s.tdata, s.tkeep, s.tlast)), buf.w_en.eq(take), buf.commit.eq(take & s.tlast),
            meta.w_data.eq(Cat(s.tdest, count + 1)), meta.w_en.eq(take & s.tlast),
        ]
        with m.If(take):
            m.d.sync += count.eq(Mux(s.tlast, 0, count + 1))

        # read side: ask for the next frame once the current one ends in the next cycle or the one after
        req = Signal()
        mask = Signal(P)
        beats = Signal(beats_w)
        left = Signal(beats_w)                               # beats still to stream, this cycle's included
        load = meta.r_rdy & ~req & (left <= 3)
        m.d.comb += [o.req.eq(req), o.mask.eq(mask), o.beats.eq(beats), meta.r_en.eq(load)]
        with m.If(load):
            m.d.sync += [req.eq(1), mask.eq(meta.r_data[:P]), beats.eq(meta.r_data[P:])]
        with m.If(o.grant):
            m.d.sync += [req.eq(0), left.eq(beats)]
        with m.Elif(left != 0):
            m.d.sync += left.eq(left - 1)
        streaming = left != 0
        m.d.comb += [
            Cat(o.data, o.keep, o.last).eq(buf.r_data), o.valid.eq(streaming), buf.r_ready.eq(streaming),
            self.busy.eq(buf.held | meta.r_rdy | req | streaming),
        ]
        with m.If(streaming & ~buf.r_valid):
            m.d.sync += self.underrun.eq(1)
        return m


class EgressBlock(wiring.Component):
    """The switch's egress stage as :class:`cais.hdl.core.SwitchCore` and :class:`cais.hdl.switch.Switch`
    wire it: an :class:`~cais.hdl.egress.ports.EgressCrossbar` of P lane sources, a
    :class:`~cais.hdl.egress.ports.ResultFanout` and per port an :class:`~cais.hdl.egress.ports.EgressPort` (egress
    FIFO, result queue, :class:`~cais.hdl.egress.ports.EgressMerge`, credits, tx counter increments), with the
    switch's depths and frame lengths.

    The lanes and the result generator are replaced by test scaffolding, one :class:`AxisFrameSource`
    each: AXI4-Stream slaves ``s_axis__<s>`` (lane s) and ``s_res`` (the result source) whose ``tdest`` is
    the frame's egress port mask; each buffers a frame whole and then requests it through
    ``FrameSourceSignature`` with that mask and its beat count. Result frames must fit the result queue
    (``result_queue_depth`` beats; the generator sends at most ``result_frame_beats``).

    Members
    -------
    s_axis[s] : In(AxisDestSignature(data_width, ports))
    s_res : In(AxisDestSignature(data_width, ports))
    m_axis[p] : Out(AxisSignature(data_width))
    tx_frame[p] : Out(1); tx_bytes[p] : Out(range(beat_bytes + 1))
        Port p's tx counter increments (:class:`~cais.hdl.egress.ports.EgressPort`).
    busy : Out(1)
        A frame is anywhere in the block (scaffolding included).
    underrun : Out(1)
        A scaffolding source ran dry mid-frame (sticky; never expected).
    """

    def __init__(self, params: SwitchParams):
        self.params = params
        P, W = params.ports, params.data_width
        super().__init__({
            "s_axis": In(AxisDestSignature(W, P)).array(P),
            "s_res": In(AxisDestSignature(W, P)),
            "m_axis": Out(AxisSignature(W)).array(P),
            "tx_frame": Out(1).array(P), "tx_bytes": Out(range(params.beat_bytes + 1)).array(P),
            "busy": Out(1), "underrun": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, W = prm.ports, prm.data_width
        # the scaffolding buffers hold two longest frames, so the next frame arrives while one streams
        depth = 1 << (2 * prm.max_frame_beats - 1).bit_length()
        m.submodules.xbar = xbar = EgressCrossbar(P, P, W, prm.max_frame_beats, prm.egress_depth)
        m.submodules.fanout = fanout = ResultFanout(P, W, prm.max_frame_beats, prm.result_queue_depth)
        busy = [xbar.busy, fanout.busy]
        underrun = []
        sources = [(self.s_axis[s], xbar.sources[s], f"lane{s}") for s in range(P)]
        sources.append((self.s_res, fanout.source, "res"))
        for outer, inner, name in sources:
            m.submodules[f"src_{name}"] = src = AxisFrameSource(P, W, prm.max_frame_beats, depth)
            wiring.connect(m, wiring.flipped(outer), src.s_axis)
            wiring.connect(m, src.o, inner)
            busy.append(src.busy)
            underrun.append(src.underrun)
        for p in range(P):
            m.submodules[f"egress{p}"] = eg = EgressPort(W, prm.egress_depth, prm.result_queue_depth)
            wiring.connect(m, xbar.egress[p], eg.fwd)
            wiring.connect(m, fanout.queues[p], eg.res)
            wiring.connect(m, eg.m_axis, wiring.flipped(self.m_axis[p]))
            m.d.comb += [xbar.freed[p].eq(eg.fwd_freed), fanout.freed[p].eq(eg.res_freed),
                         self.tx_frame[p].eq(eg.tx_frame), self.tx_bytes[p].eq(eg.tx_bytes)]
            busy.append(eg.busy)
        m.d.comb += [self.busy.eq(Cat(*busy).any()), self.underrun.eq(Cat(*underrun).any())]
        return m


def _switch(params: SwitchParams):
    return SwitchTop(params)


#: block name -> (factory(params), the Verilog top module's name)
BLOCKS = {
    "ingress": (IngressBlock, "cais_ingress"),
    "sram": (SramBlock, "cais_sram"),
    "alu": (FoldBlock, "cais_alu"),
    "csr": (CsrBlock, "cais_csr"),
    "egress": (EgressBlock, "cais_egress"),
    "switch": (_switch, "cais_switch"),
    "uart": (UartBlock, "cais_uart"),
}


def block_top(block: str, params: SwitchParams):
    """The component of ``block`` (a name of :data:`BLOCKS`) for ``params``."""
    try:
        factory, _ = BLOCKS[block]
    except KeyError:
        raise ValueError(f"unknown block {block!r}; one of {', '.join(BLOCKS)}") from None
    return factory(params)
