"""What `make verilog` writes beside the Verilog for an FPGA project: a C header of the register map (checked
by compiling it and comparing what the C compiler sees with cais.registers) and a FuseSoC core file."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cais.hdl.export import LINT_WAIVERS, render_fusesoc_core, write_integration_files
from cais.params import SwitchParams
from cais.regdoc import render_c_header
from cais.registers import MAGIC, VERSION, Kind, register_map


@pytest.mark.parametrize("params", [SwitchParams(), SwitchParams(ports=8, slots=128, float_units=False)],
                         ids=["default", "p8_int"])
def test_c_header_compiles_to_the_register_map(tmp_path, params):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (Verilator needs one too)"
    regmap = register_map(params)
    (tmp_path / "regs.h").write_text(render_c_header(regmap))
    expected, prints = {}, []

    def show(name, expr, value):
        expected[name] = value
        prints.append(f'    printf("{name} %llu\\n", (unsigned long long)({expr}));')

    show("MAGIC", "CAIS_MAGIC", MAGIC)
    show("VERSION", "CAIS_VERSION", VERSION)
    show("PORTS", "CAIS_PARAM_PORTS", params.ports)
    show("FLOAT_UNITS", "CAIS_PARAM_FLOAT_UNITS", int(params.float_units))
    for reg in regmap.registers:
        base = f"CAIS_REG_{reg.name}"
        if reg.count > 1:
            show(f"{reg.name}_COUNT", f"{base}_COUNT", reg.count)
            for i in range(reg.count):
                show(f"{reg.name}[{i}]", f"{base}({i})", reg.address(i))
        else:
            show(reg.name, base, reg.address())
        if reg.kind in (Kind.CONST, Kind.CONFIG):
            show(f"{reg.name}_RESET", f"{base}_RESET", reg.reset)
        for f in reg.fields:
            show(f"{reg.name}.{f.name}.shift", f"{base}_{f.name.upper()}_SHIFT", f.lsb)
            show(f"{reg.name}.{f.name}.mask", f"{base}_{f.name.upper()}_MASK", f.mask)
    source = tmp_path / "main.c"
    source.write_text('#include <stdio.h>\n#include "regs.h"\n#include "regs.h"  /* include guard */\n'
                      "int main(void) {\n" + "\n".join(prints) + "\n    return 0;\n}\n")
    exe = tmp_path / "main"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(source)], check=True,
                   capture_output=True)
    got = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                               check=True).stdout.splitlines())
    assert {k: int(v) for k, v in got.items()} == expected


def test_export_writes_header_and_core_beside_the_verilog(tmp_path):
    params = SwitchParams(ports=2)
    verilog = tmp_path / "my_switch.v"
    header, core = write_integration_files(params, verilog, "my_switch")
    assert header == tmp_path / "my_switch_regs.h" and core == tmp_path / "my_switch.core"
    assert "#ifndef MY_SWITCH_REGS_H" in header.read_text()
    text = core.read_text()
    assert text == render_fusesoc_core(params, "my_switch.v", "my_switch_regs.h", "my_switch")
    lines = text.splitlines()
    assert lines[0] == "CAPI=2:"
    assert "      - my_switch.v: {file_type: verilogSource}" in lines
    assert lines.count("    toplevel: my_switch") == 2
    assert all(f"          - -Wno-{code}" in lines for code, _ in LINT_WAIVERS)
    assert any(line.startswith("name: cais:switch:my_switch:") for line in lines)
