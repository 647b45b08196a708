"""The exported ``cais_switch`` under cocotb + Verilator: the cross-check of the C++-driven link.

:class:`CocotbLink` runs the per-cycle rules of :mod:`cais.sim.links.wires` in Python against the
Verilated model through cocotb's VPI: its methods await the clock themselves (simulated time passes only
inside them), set the inputs after each rising edge and read what the edge sampled, a whole beat at a
time. Create it inside a cocotb test with ``await CocotbLink.start(dut, params)``;
:func:`cais.sim.backends.run_cocotb` runs an entry point on it from outside the simulator.
"""

from __future__ import annotations

from cais.link import DEFAULT_CLOCK_HZ
from cais.params import SwitchParams

from .wires import AXIL_INPUTS, AXIL_OUTPUTS, WireLink

__all__ = ["CocotbLink"]


class CocotbLink(WireLink):
    """A :class:`cais.link.SwitchLink` on the Verilated switch under cocotb (see :mod:`.wires`)."""

    def __init__(self, dut, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, period_ns: int = 10,
                 seed: int = 0, idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0):
        from cocotb.triggers import RisingEdge

        self.dut = dut
        self.period_ns = period_ns
        P = params.ports
        self._s = [[getattr(dut, f"s_axis_p{p}_{n}") for n in ("tdata", "tkeep", "tlast", "tvalid", "tready")]
                   for p in range(P)]
        self._m = [[getattr(dut, f"m_axis_p{p}_{n}") for n in ("tdata", "tkeep", "tlast", "tvalid", "tready")]
                   for p in range(P)]
        self._axil = {n: getattr(dut, f"s_axil_{n}") for n in AXIL_OUTPUTS + AXIL_INPUTS}
        self._rising = RisingEdge(dut.clk)
        super().__init__(params, clock_hz=clock_hz, seed=seed, idle=idle, backpressure=backpressure)

    @classmethod
    async def start(cls, dut, params: SwitchParams, **kw) -> "CocotbLink":
        """Start the clock, reset the switch and wait for its slot-state sweep: cycle 0."""
        from cocotb.clock import Clock

        link = cls(dut, params, **kw)
        for p in range(params.ports):
            link._s[p][3].value = 0
            link._m[p][4].value = 1
        for name in AXIL_OUTPUTS:
            link._axil[name].value = 0
        Clock(dut.clk, link.period_ns, unit="ns").start()
        await link._reset(params.slots + 2)
        return link

    # ------------------------------------------------------------------ WireLink hooks
    def _set_beat(self, port: int, data: int, keep: int, last: bool) -> None:
        tdata, tkeep, tlast = self._s[port][:3]
        tdata.value = data
        tkeep.value = keep
        tlast.value = int(last)

    def _set_valid(self, port: int, valid: bool) -> None:
        self._s[port][3].value = int(valid)

    def _set_ready(self, port: int, ready: bool) -> None:
        self._m[port][4].value = int(ready)

    def _set_bus(self, **values: int) -> None:
        for name, value in values.items():
            self._axil[name].value = value

    def _set_reset(self, value: int) -> None:
        self.dut.rst.value = value

    async def _edge(self) -> None:
        await self._rising

    # After `await RisingEdge(clk)` (and before ReadOnly) cocotb shows the values the edge sampled.
    def _s_ready(self, port: int) -> bool:
        return self._s[port][4].value == 1

    def _m_valid(self, port: int) -> bool:
        return self._m[port][3].value == 1

    def _beat(self, port: int) -> tuple[int, int, bool]:
        tdata, tkeep, tlast = self._m[port][:3]
        return tdata.value.to_unsigned(), tkeep.value.to_unsigned(), tlast.value == 1

    def _bus_sample(self) -> dict:
        return {name: (self._axil[name].value.to_unsigned() if name in ("bresp", "rresp", "rdata")
                       else int(self._axil[name].value)) for name in AXIL_INPUTS}
