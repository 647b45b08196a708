"""The exported ``cais_switch`` under cocotb + Verilator: the cross-check of the C++-driven link.

:class:`CocotbLink` runs the per-cycle rules of :mod:`cais.sim.links.wires` in Python against the
Verilated model through cocotb's VPI: its methods await the clock themselves (simulated time passes only
inside them), set the inputs after each rising edge and read what the edge sampled, a whole beat at a
time. Create it inside a cocotb test with ``await CocotbLink.start(dut, params)``.

:func:`run_cocotb` runs an entry point ``async def main(link, job)`` on it from outside the simulator: it
builds the model (cached) and runs this module's cocotb test :func:`cosim_main`, which reads the job from
the file named by ``$CAIS_COSIM_JOB``, creates the link, awaits the entry point and writes its result.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import cocotb

from cais.link import DEFAULT_CLOCK_HZ
from cais.params import SwitchParams

from ..entry import entry_sys_path, load_entry
from .wires import AXIL_INPUTS, AXIL_OUTPUTS, WireLink

__all__ = ["CocotbLink", "run_cocotb", "cosim_main", "CosimError", "COSIM_JOB_ENV"]

#: Environment variable naming the JSON job file that :func:`run_cocotb` hands to :func:`cosim_main`.
COSIM_JOB_ENV = "CAIS_COSIM_JOB"


class CocotbLink(WireLink):
    """A :class:`cais.link.SwitchLink` on the Verilated switch under cocotb (see :mod:`.wires`)."""

    def __init__(self, dut, params: SwitchParams, *, clock_hz: float = DEFAULT_CLOCK_HZ, period_ns: int = 10,
                 seed: int = 0, idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0):
        from cocotb.triggers import RisingEdge

        self.dut = dut
        self.period_ns = period_ns
        P = params.ports
        self._s = [[getattr(dut, f"s_axis_p{p}_{n}") for n in ("tdata", "tkeep", "tlast", "tvalid", "tready",
                                                                "tuser")]
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
            link._s[p][5].value = 0
            link._m[p][4].value = 1
        for name in AXIL_OUTPUTS:
            link._axil[name].value = 0
        Clock(dut.clk, link.period_ns, unit="ns").start()
        await link._reset(params.slots + 2)
        return link

    # ------------------------------------------------------------------ WireLink hooks
    def _set_beat(self, port: int, data: int, keep: int, last: bool, user: bool) -> None:
        tdata, tkeep, tlast = self._s[port][:3]
        tdata.value = data
        tkeep.value = keep
        tlast.value = int(last)
        self._s[port][5].value = int(user)

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


class CosimError(AssertionError):
    """The cocotb run of an entry point failed; the message ends with the simulator log's tail."""


def run_cocotb(params: SwitchParams, entry: str, job: dict, *, waves: bool = False, seed: int = 0,
               idle: float | list[float] = 0.0, backpressure: float | list[float] = 0.0,
               clock_hz: float = DEFAULT_CLOCK_HZ, keep_run: bool = False):
    """Run the entry point ``"module:function"`` (``async def main(link, job)``) on the Verilated switch.

    Builds with :func:`cais.sim.build.build_switch` (cached), runs the cocotb test :func:`cosim_main` and
    returns main's (JSON-serialisable) result as read back from JSON. Raises :class:`CosimError` with the
    log's tail when the run fails. The run folder is removed after a successful run unless ``waves`` or
    ``keep_run`` is set.
    """
    from ..build import build_switch, run_test

    if not isinstance(entry, str):
        raise TypeError("the cocotb backend needs the entry point as a 'module:function' string")
    module = entry.partition(":")[0]
    build = build_switch(params, waves=waves)
    with tempfile.TemporaryDirectory(prefix="cais-cosim-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps({
            "params": params.as_dict(), "entry": entry, "job": job, "out": str(out_file),
            "sys_path": entry_sys_path(module), "seed": seed, "idle": idle, "backpressure": backpressure,
            "clock_hz": clock_hz}))
        try:
            run = run_test(build, __name__, "cosim_main", extra_env={COSIM_JOB_ENV: str(job_file)})
        except AssertionError as exc:
            raise CosimError(f"{entry} on cocotb ({params.slug()}) failed: {exc}") from None
        if not out_file.is_file():
            raise CosimError(f"{entry} on cocotb ({params.slug()}): the test passed but wrote no result; "
                             f"log {run.log_file}")
        result = json.loads(out_file.read_text())
    if not (waves or keep_run):
        shutil.rmtree(run.run_dir, ignore_errors=True)
    return result


@cocotb.test()
async def cosim_main(dut):
    """The simulator side of :func:`run_cocotb` (not a test of its own: it runs the job it is handed)."""
    spec = json.loads(Path(os.environ[COSIM_JOB_ENV]).read_text())
    params = SwitchParams(**spec["params"])
    for folder in reversed(spec.get("sys_path", [])):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    main = load_entry(spec["entry"])
    width = len(dut.s_axis_p0_tdata)
    assert width == params.data_width, f"s_axis_p0_tdata is {width} bits, params say {params.data_width}"
    link = await CocotbLink.start(dut, params, seed=spec.get("seed", 0), idle=spec.get("idle", 0.0),
                                  backpressure=spec.get("backpressure", 0.0), clock_hz=spec["clock_hz"])
    result = await main(link, spec["job"])
    out = Path(spec["out"])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
