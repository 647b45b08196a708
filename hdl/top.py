"""The exported top: the switch with the flat port names FPGA tools and cocotbext-axi expect.

Ports (p = 0 .. ports-1): ``clk``, ``rst`` (synchronous, active high); ``s_axis_p<p>_{tdata,tkeep,tlast,tuser,
tvalid,tready}`` (ingress), ``m_axis_p<p>_{...}`` (egress); ``s_axil_{awaddr,awprot,awvalid,awready,wdata,
wstrb,wvalid,wready,bresp,bvalid,bready,araddr,arprot,arvalid,arready,rdata,rresp,rvalid,rready}``.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from cais.params import SwitchParams

from .common.axis import AxisSignature
from .control.csr import AXI4LiteSignature
from .switch import AXIL_ADDR_WIDTH, Switch

__all__ = ["SwitchTop"]


def _flat(prefix: str, signature: wiring.Signature, flip: bool) -> dict:
    members = {}
    for name, member in signature.members.items():
        members[f"{prefix}_{name}"] = member.flip() if flip else member
    return members


class SwitchTop(wiring.Component):
    """:class:`cais.hdl.switch.Switch` with every interface member as a top-level port."""

    def __init__(self, params: SwitchParams = SwitchParams()):
        self.params = params
        members = {}
        for p in range(params.ports):
            members.update(_flat(f"s_axis_p{p}", AxisSignature(params.data_width, user=True), flip=True))
        for p in range(params.ports):
            members.update(_flat(f"m_axis_p{p}", AxisSignature(params.data_width), flip=False))
        members.update(_flat("s_axil", AXI4LiteSignature(AXIL_ADDR_WIDTH), flip=True))
        super().__init__(members)
        self.switch = Switch(params)

    def elaborate(self, platform):
        m = Module()
        m.submodules.switch = sw = self.switch
        for p in range(self.params.ports):
            for prefix, bus in ((f"s_axis_p{p}", sw.s_axis[p]), (f"m_axis_p{p}", sw.m_axis[p])):
                for name, member in bus.signature.members.items():
                    inner, outer = getattr(bus, name), getattr(self, f"{prefix}_{name}")
                    m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        for name, member in sw.s_axil.signature.members.items():
            inner, outer = getattr(sw.s_axil, name), getattr(self, f"s_axil_{name}")
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        return m
