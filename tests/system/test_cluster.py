"""End to end: `python -m cais.cluster` (what `make cluster` runs) with a small size: namespaces and veth
pairs, cais-switch with the model, 4 rank processes; every collective CORRECT against numpy; nothing left
behind, also when interrupted. Root only: fails (does not skip) without it."""

import signal
import subprocess
import sys
import time

import pytest

from cais.cluster import CLI_COMMANDS, LOSSY, RESTARTED, SUITE
from netns import namespaces_with, require_root


@pytest.mark.slow
def test_cluster_every_collective_correct(tmp_path):
    require_root()
    p = subprocess.Popen([sys.executable, "-m", "cais.cluster", "--ranks", "4", "--elements", "300",
                          "--keep-logs", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=400)
    assert p.returncode == 0, out + err
    rows = [line for line in out.splitlines() if any(line.startswith(n) for n in SUITE) and "  CORRECT" in line]
    assert len(rows) == len(SUITE), out
    for name in SUITE:
        assert any(line.startswith(name) for line in rows), (name, out)
    lossy = next(line for line in rows if line.startswith(LOSSY))
    dropped = int(lossy.split("(")[-1].split()[0])
    assert dropped > 0, lossy                      # the 5% loss really dropped frames
    assert "every collective CORRECT" in out
    assert "all_reduce int32 sum" in out and "switch" in rows[0]
    # the controller restarted and every rank rejoined, losing no group (the pair's all-reduce ran)
    assert "(every rank rejoined: 1 time)" in next(line for line in rows if line.startswith(RESTARTED))
    # every cais-cli command succeeded against the running cluster, the metrics were scraped
    for args in CLI_COMMANDS:
        assert f"$ cais-cli {' '.join(args)}\n" in out, (args, out)
    assert "rule 7 added" in out and "rule 7 deleted" in out and " 7 operator  200/0xff" in out
    assert "P50" in out and "P99" in out
    metrics = dict(line.strip().rsplit(" ", 1) for line in out.splitlines() if line.startswith("  cais_"))
    assert float(metrics['cais_group_completions_total{group="1"}']) >= 1
    assert float(metrics['cais_group_contributions_total{group="1"}']) == \
        4 * float(metrics['cais_group_completions_total{group="1"}'])      # 4 members, no fallback after the restart
    assert float(metrics['cais_group_sets_allocated{group="2"}']) > 0        # the pair, made before the restart
    assert float(metrics["cais_collective_latency_seconds_count"]) >= 2
    assert not namespaces_with(f"c{p.pid}"), "namespaces left behind"
    # every rank logged each decision it got, with its path, reason code, score and threshold; the same
    # decisions as the controller's show-decisions (its latest 5, by group and collective; ranks 0 and 1 are
    # in both groups, the world and the pair)
    import re
    from cais.controller import Reason
    line = re.compile(r"cais\.dist: INFO rank (\d): group (\d+) collective (\d+) \(\d+ B\) -> (switch|host) "
                      r"\[(\w+)\] score -?[\d.]+ threshold [\d.]+: .+")
    logged = {}
    for r in range(4):
        got = [m for m in map(line.fullmatch, (tmp_path / f"rank{r}.log").read_text().splitlines()) if m]
        assert got and all(int(m[1]) == r and m[5] in {c.value for c in Reason} for m in got), r
        assert all(Reason(m[5]).path == m[4] for m in got)
        logged[r] = {(int(m[2]), int(m[3])): (m[4], m[5]) for m in got}
    shown = out.split("$ cais-cli show-decisions --last 5\n", 1)[1].split("\n\n$ ", 1)[0].splitlines()[2:]
    rows = [row.split() for row in shown if row.strip() and not row.strip()[0].isdigit()]
    assert rows, out
    for row in rows:
        group, op, path, code = int(row[1]), int(row[2]), row[5], row[8]
        assert all(logged[r][(group, op)] == (path, code) for r in (0, 1)), row    # ranks 0, 1: in every group


def test_cluster_removes_its_namespaces_when_interrupted():
    require_root()
    p = subprocess.Popen([sys.executable, "-m", "cais.cluster", "--ranks", "2", "--elements", "100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(namespaces_with(f"c{p.pid}")) < 3:          # the switch's and both ranks'
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    time.sleep(1.0)                                        # processes started, collectives running
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "interrupted" in err
    assert not namespaces_with(f"c{p.pid}"), "namespaces left behind after SIGINT"


@pytest.mark.verilator
def test_cluster_on_the_verilated_switch():
    """The same cluster with cais-switch --backend verilator: the exported Verilog serves the ranks."""
    require_root()
    p = subprocess.run([sys.executable, "-m", "cais.cluster", "--ranks", "4", "--elements", "300",
                        "--backend", "verilator"], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cais-switch (verilator): every collective CORRECT" in p.stdout
    rows = [line for line in p.stdout.splitlines() if any(line.startswith(n) for n in SUITE) and "  CORRECT" in line]
    assert len(rows) == len(SUITE), p.stdout


def leaf_spine_cluster(tmp_path, ranks_per_leaf: int, backend: str, timeout_s: float) -> str:
    """`make cluster ARGS="--topology leaf-spine"` with 2 leaves of `ranks_per_leaf` ranks on `backend`: three
    cais-switch daemons wired by veth pairs, cais-controller programming them as one switch. Checks that
    every collective was CORRECT through the tree and that no namespace is left; returns the output."""
    require_root()
    p = subprocess.Popen([sys.executable, "-m", "cais.cluster", "--topology", "leaf-spine", "--leaves", "2",
                          "--ranks-per-leaf", str(ranks_per_leaf), "--elements", "300", "--backend", backend,
                          "--keep-logs", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out + err
    rows = [line for line in out.splitlines() if any(line.startswith(n) for n in SUITE) and "  CORRECT" in line]
    assert len(rows) == len(SUITE), out
    assert (f"{2 * ranks_per_leaf} rank processes, cais-switch ({backend}; 2 leaves and a spine, 3 daemons): "
            "every collective CORRECT") in out
    assert "switch" in rows[0]                      # the world's first all-reduce went through the tree
    assert {f"switch{k}.log" for k in range(2)} | {"switch.log"} <= {f.name for f in tmp_path.iterdir()}
    assert not namespaces_with(f"c{p.pid}"), "namespaces left behind"
    return out


@pytest.mark.slow
def test_leaf_spine_cluster_every_collective_correct(tmp_path):
    """2 leaves of 2 ranks under a spine, on the reference model."""
    leaf_spine_cluster(tmp_path, 2, "model", 400)


@pytest.mark.verilator
def test_leaf_spine_cluster_on_the_verilated_rtl(tmp_path):
    """The leaf-spine cluster with every cais-switch daemon on the Verilated RTL: 2 leaves of 3 ranks, so the
    leaves are the uplink build tests/sim/test_tree_rtl.py makes (4 ports, the uplink action) and the spine
    the default build (TreeTopology.rtl_spine_params): no build of its own."""
    from cais.controller.tree import TreeTopology
    from cais.params import SwitchParams
    topology = TreeTopology(2, 3)
    assert topology.leaf_params == SwitchParams(uplink=True) and topology.rtl_spine_params == SwitchParams()
    leaf_spine_cluster(tmp_path, 3, "verilator", 1200)
    # every daemon ran the RTL: leaves of 4 ports (3 ranks and the uplink), the spine of 4 (2 wired)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("switch0", "switch1", "switch")}
    assert all("cais-switch: verilator backend, 4 ports" in text for text in logs.values()), logs
