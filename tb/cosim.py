"""The cocotb side of :func:`cais.sim.backends.run_cocotb`: run a backend-independent entry point on the
Verilated ``cais_switch``.

``$CAIS_COSIM_JOB`` names a JSON file written by ``run_cocotb``: the switch parameters, the entry point
``"module:function"`` (``async def main(link, job)``), its ``job``, the file to write the result to, extra
``sys_path`` folders for importing the entry point, and the link options (seed, idle, backpressure,
clock_hz). The test resets the switch, creates a :class:`cais.sim.links.cocotb.CocotbLink`, awaits the entry
point and writes its result as JSON (atomically: a temporary file renamed into place).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import cocotb

from cais.params import SwitchParams
from cais.sim.backends import COSIM_JOB_ENV, load_entry
from cais.sim.links.cocotb import CocotbLink

__all__ = ["cosim_main"]


@cocotb.test()
async def cosim_main(dut):
    spec = json.loads(Path(os.environ[COSIM_JOB_ENV]).read_text())
    params = SwitchParams(**spec["params"])
    for folder in reversed(spec.get("sys_path", [])):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    main = load_entry(spec["entry"])
    width = len(dut.s_axis_p0_tdata)
    assert width == params.data_width, f"s_axis_p0_tdata is {width} bits, params say {params.data_width}"
    bare = None
    if spec["job"].get("bare_clock_cycles"):
        # The simulator's floor for comparison: the same model with only a clock running, no Python
        # touching any signal, in this process.
        import time

        from cocotb.clock import Clock
        from cocotb.triggers import ClockCycles
        clock = Clock(dut.clk, 10, unit="ns")
        clock.start()
        dut.rst.value = 1
        t0 = time.perf_counter()
        await ClockCycles(dut.clk, spec["job"]["bare_clock_cycles"])
        bare = spec["job"]["bare_clock_cycles"] / (time.perf_counter() - t0)
        clock.stop()
    link = await CocotbLink.start(dut, params, seed=spec.get("seed", 0), idle=spec.get("idle", 0.0),
                                  backpressure=spec.get("backpressure", 0.0),
                                  **({"clock_hz": spec["clock_hz"]} if "clock_hz" in spec else {}))
    result = await main(link, spec["job"])
    if bare is not None:
        result["bare_clock_cycles_per_s"] = bare
    out = Path(spec["out"])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
