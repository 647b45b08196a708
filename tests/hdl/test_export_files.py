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


def _module_ports(text: str, name: str) -> set[str]:
    import re
    header = re.search(rf"^module {name}\((.*?)\);", text, re.M | re.S)
    assert header, f"no module {name}"
    return {p.strip() for p in header.group(1).split(",")}


def test_export_block_ingress_and_csr(tmp_path, capsys):
    """`make verilog ARGS="--block ..."`: each block is a top of its own whose plain ports carry the AXI names,
    and it lints clean with the documented waivers; the csr block has a port per register of the map."""
    from cais.hdl.export import main

    assert main(["--block", "ingress", "--out", str(tmp_path), "--lint"]) == 0
    ports = _module_ports((tmp_path / "cais_ingress.v").read_text(), "cais_ingress")
    assert {"clk", "rst", "s_axis__tdata", "s_axis__tkeep", "s_axis__tlast", "s_axis__tuser", "s_axis__tvalid",
            "s_axis__tready", "m_hdr__tdata", "m_hdr__tvalid", "m_hdr__tready", "m_axis__tdata", "m_axis__tvalid",
            "m_axis__tready", "drop", "drop_reason", "rx_frame", "rx_bytes", "busy"} == ports
    assert main(["--block", "csr", "--out", str(tmp_path), "--name", "regs"]) == 0
    ports = _module_ports((tmp_path / "regs.v").read_text(), "regs")
    regmap = register_map(SwitchParams())
    want = {f"s_axil__{n}" for n in ("awaddr", "awvalid", "awready", "wdata", "wstrb", "bresp", "araddr", "rdata",
                                      "rresp", "rvalid", "rready")}
    suffix = {Kind.CONFIG: [""], Kind.COMMAND: ["_stb", "_data"], Kind.COUNTER: ["_inc"], Kind.LEVEL: ["_value"],
              Kind.CONST: []}
    for reg in regmap:
        for end in suffix[reg.kind]:
            base = reg.name.lower() + end
            want |= {f"{base}__{i}" for i in range(reg.count)} if reg.count > 1 else {base}
    assert want <= ports, sorted(want - ports)


@pytest.mark.slow
def test_export_block_egress(tmp_path):
    """The egress block: an AXI4-Stream slave per lane and one for results (tdest: the port mask), an
    AXI4-Stream master and the tx increments per port; lint clean."""
    from cais.hdl.export import main

    P = SwitchParams().ports
    assert main(["--block", "egress", "--out", str(tmp_path), "--lint"]) == 0
    ports = _module_ports((tmp_path / "cais_egress.v").read_text(), "cais_egress")
    ins = [f"s_axis__{s}" for s in range(P)] + ["s_res"]
    want = {"clk", "rst", "busy", "underrun"}
    want |= {f"{i}__{m}" for i in ins for m in ("tdata", "tkeep", "tlast", "tdest", "tvalid", "tready")}
    want |= {f"m_axis__{p}__{m}" for p in range(P) for m in ("tdata", "tkeep", "tlast", "tvalid", "tready")}
    want |= {f"tx_{n}__{p}" for p in range(P) for n in ("frame", "bytes")}
    assert want == ports, sorted(want ^ ports)


def test_export_refuses_an_unknown_block(tmp_path):
    from cais.hdl.export import main

    with pytest.raises(SystemExit):
        main(["--block", "nonesuch", "--out", str(tmp_path)])
