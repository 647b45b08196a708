"""make cluster: a 4-rank CAIS cluster on one machine, in network namespaces it creates (needs root).

::

    sudo .venv/bin/python -m cais.cluster                 # 4 ranks, the reference model, the default sizes
    sudo .venv/bin/python -m cais.cluster --ranks 3 --elements 500
    sudo .venv/bin/python -m cais.cluster --topology leaf-spine      # 2 leaves x 4 ranks under a spine

What it does:

1. creates one network namespace for the switch and one per rank (names ``c<pid>sw``, ``c<pid>r<i>``),
   and one veth pair per rank: ``c<pid>s<i>`` in the switch's namespace (switch port i),
   ``c<pid>h<i>`` in rank i's; IPv6 is turned off in them so that the kernel sends nothing of its own;
2. starts ``cais-switch`` (``python -m cais.sim.daemon``, the model backend) in the switch namespace on the
   ``s`` ends, its control endpoint a Unix socket in a temporary folder;
3. starts ``cais-controller`` (:mod:`cais.service`) in the switch namespace: the ranks' endpoint a Unix
   socket, the HTTP API and /metrics on the namespace's loopback, a fresh random token in a file;
4. starts one rank process per namespace (``python -m cais.cluster --worker``, configured through the
   ``CAIS_*`` variables of :func:`cais.dist.init`, ``CAIS_COORDINATOR=external``, ``CAIS_TOKEN``);
5. each rank runs every collective of :data:`SUITE` and checks its result against numpy (each rank
   knows every rank's contribution: they come from a seed); one all-reduce runs with 5% loss on one link
   (rank 0 sets it through the switch's control endpoint between two barriers); then every rank pauses,
   the controller is stopped and started again with ``--recover``, and the ranks go on (they rejoin with
   their groups): an all-reduce of the world group and of a group made before the restart;
6. runs every cais-cli command against the controller (add-rule, dump-rules, show-groups, show-stats,
   watch, del-rule, one with --json, show-jobs) while the ranks wait at the end (their job's groups
   go when it ends), and scrapes /metrics, printing a few lines of each;
7. prints the summary table, CORRECT per collective when every rank's result matched, and removes the
   namespaces (and with them the veth pairs) and the temporary folder, also on Ctrl-C or SIGTERM.

With ``--topology leaf-spine`` (``--leaves`` 2, ``--ranks-per-leaf`` 4) it runs an aggregation tree
(docs/protocol.md section 13) instead of one switch: one cais-switch daemon per leaf (namespace
``c<pid>l<k>``: its ranks' ``s`` ends, then the uplink ``c<pid>u<k>`` on port ``ranks-per-leaf``, built with
the uplink action) and one for the spine (``c<pid>sw``: the other ends ``c<pid>d<k>`` of the uplinks, port k
for leaf k), and cais-controller programs them as one switch (``--tree``); each rank's control endpoint is
its leaf's. The rest is the same. With ``--backend verilator`` every daemon runs the Verilated RTL: the
leaves a build with the uplink action and ``ranks-per-leaf`` + 1 ports, the spine the default build
(``TreeTopology.spine_params_on``). On either backend the controller offloads every all-reduce
(:data:`CLUSTER_CONTROLLER`).

No traffic leaves the namespaces it made: the ranks and the switch only use the veth pairs and Unix
sockets. The exit status is 0 only if every collective was CORRECT on every rank.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "SUITE", "Cluster"]

LOSS = 0.05          # the lossy collective's loss rate
LOSSY_PORT = 1       # on the wire of switch port 1 (rank 1), both directions
RANK_TIMEOUT_S = 240.0

#: (name, what it runs): the collectives every rank runs, in this order
LOSSY = f"all_reduce int32 sum, {LOSS:.0%} loss on link {LOSSY_PORT}"
RESTARTED = "all_reduce int32 sum after a controller restart"
RESTARTED_PAIR = "all_reduce int32 sum, group [0, 1], after the restart"
SUITE = ["all_reduce int32 sum", "all_reduce int32 max", "all_reduce fp16 sum", "all_reduce bf16 sum",
         "all_reduce fp32 avg", "broadcast fp32 (src last)", "all_gather int32", "reduce_scatter int32 sum",
         "barrier", LOSSY, RESTARTED, RESTARTED_PAIR]
RESTART_WAIT_S = 60.0
#: The controller's settings (a ``--config`` file): every all-reduce through the switches, whatever the
#: round trips. Its offload score weighs the round trips the ranks measure, in wall-clock time: a cais-switch
#: daemon steps the Verilated RTL some thousand times slower than the hardware (round trips of 0.1-1 s
#: through a tree of three, docs/protocol.md 13.7), and on "auto" it sent 6-7 of the world group's 11
#: all-reduces, the lossy one too, to the host ring; the model's daemon answers in milliseconds, and on a
#: loaded machine "auto" sent the lossy all-reduce to the host ring too, where no frame crosses the lossy
#: link. The ranks keep the deployed ``timeout_ms`` (50 ms): their timer learns the slow round trips
#: (cais.rto).
CLUSTER_CONTROLLER = {"offload": "always"}
#: what make cluster asks cais-cli, in this order (the rule: an operator rule on a free index and slots)
CLI_COMMANDS = [["add-rule", "7", "--group", "200", "--contributors", "0,1", "--base", "60", "--count-log2", "1",
                 "--dtype", "fp16", "--op", "max"],
                ["dump-rules"], ["show-groups"], ["show-stats"], ["watch", "--count", "1"], ["del-rule", "7"],
                ["--json", "show-groups"], ["show-jobs"], ["show-decisions", "--last", "5"]]


class Interrupted(Exception):
    """SIGINT / SIGTERM / SIGHUP arrived: clean up and stop."""


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# ---------------------------------------------------------------------- the rank side
def contribution(rank: int, n: int, dtype, seed: int = 11, ranks: int = 4) -> np.ndarray:
    """Rank `rank`'s input: small values, so every sum of up to `ranks` of them, partial ones included, is
    exact in every type (then numpy's sum is the switch's, whatever the order of additions, and an
    aggregation tree's rounded partials are exact too): floats are quarters k/4 with |k| <= 256 // ranks, so
    every sum has |k| <= 256, 8 significant bits (bf16's)."""
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind == "f":
        limit = max(1, 256 // max(ranks, 4))
        return (rng.integers(-limit, limit + 1, n) / 4).astype(dtype)
    return rng.integers(-1000, 1001, n).astype(dtype)


def _worker() -> int:
    """One rank: init from the environment, the suite, a JSON report to $CAIS_REPORT."""
    import logging

    import cais as dist
    from cais.endpoint import connect

    # the rank's log: each offload decision with its path, score, threshold and reason (cais.dist, INFO)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s %(message)s")

    report_path = os.environ["CAIS_REPORT"]
    n_elem = int(os.environ.get("CAIS_ELEMENTS", "4096"))
    rows: list[dict] = []

    def record(name, got, want, work_path, t0):
        ok = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
        bad = int(np.count_nonzero(got != want)) if got.shape == want.shape else -1
        rows.append({"name": name, "correct": bool(ok), "path": work_path, "ms": (time.monotonic() - t0) * 1e3,
                     "elements": int(want.size), "wrong": bad})

    try:
        pg = dist.init()
        r, N = pg.rank, pg.world_size
        xs = lambda dt, n=n_elem: [contribution(q, n, dt, ranks=N) for q in range(N)]       # noqa: E731
        pair = dist.new_group([0, 1])          # a group made before the controller restart (None off it)

        for name, dt, op, reduce in (("all_reduce int32 sum", np.int32, "sum", np.sum),
                                     ("all_reduce int32 max", np.int32, "max", np.max),
                                     ("all_reduce fp16 sum", np.float16, "sum", np.sum)):
            a = xs(dt)
            buf = a[r].copy()
            t0 = time.monotonic()
            work = dist.all_reduce(buf, op=op, async_op=True)
            work.wait()
            want = reduce(np.stack(a).astype(np.float64), axis=0).astype(dt)
            record(name, buf, want, work.path, t0)

        a = xs(np.float32)                      # bf16: float32 arrays holding bf16 values, sent as bf16
        buf = a[r].copy()
        t0 = time.monotonic()
        work = dist.all_reduce(buf, op="sum", dtype="bf16", async_op=True)
        work.wait()
        record("all_reduce bf16 sum", buf, np.sum(np.stack(a), axis=0, dtype=np.float64).astype(np.float32),
               work.path, t0)

        a = xs(np.float32)
        buf = a[r].copy()
        t0 = time.monotonic()
        work = dist.all_reduce(buf, op=dist.ReduceOp.AVG, async_op=True)
        work.wait()
        total = np.sum(np.stack(a), axis=0, dtype=np.float64).astype(np.float32)
        record("all_reduce fp32 avg", buf, (total / np.float32(N)).astype(np.float32), work.path, t0)

        src = N - 1
        a = xs(np.float32)
        buf = a[r].copy() if r == src else np.zeros(n_elem, np.float32)
        t0 = time.monotonic()
        work = dist.broadcast(buf, src=src, async_op=True)
        work.wait()
        record("broadcast fp32 (src last)", buf, a[src], work.path, t0)

        a = xs(np.int32)
        out = np.zeros((N, n_elem), np.int32)
        t0 = time.monotonic()
        work = dist.all_gather(out, a[r], async_op=True)
        work.wait()
        record("all_gather int32", out, np.stack(a), work.path, t0)

        m = max(1, n_elem // N)
        a = xs(np.int32, N * m)
        out = np.zeros(m, np.int32)
        t0 = time.monotonic()
        work = dist.reduce_scatter(out, a[r], async_op=True)
        work.wait()
        record("reduce_scatter int32 sum", out, np.sum(np.stack(a), axis=0).astype(np.int32)[r * m:(r + 1) * m],
               work.path, t0)

        t0 = time.monotonic()
        dist.barrier()
        record("barrier", np.ones(1, np.int32), np.ones(1, np.int32), "switch", t0)

        switch = connect(os.environ["CAIS_SWITCH"], name="switch control endpoint") if r == 0 else None
        if switch:
            switch.request("fault", port=LOSSY_PORT, drop=LOSS, seed=7)
        dist.barrier()
        a = xs(np.int32, 4 * n_elem)
        buf = a[r].copy()
        t0 = time.monotonic()
        work = dist.all_reduce(buf, async_op=True)
        work.wait()
        record(LOSSY, buf, np.sum(np.stack(a), axis=0).astype(np.int32), work.path, t0)
        dist.barrier()
        if switch:
            stats = switch.request("stats")["faults"].get(str(LOSSY_PORT), {})
            rows[-1]["dropped"] = stats.get("ingress_dropped", 0) + stats.get("egress_dropped", 0)
            switch.request("fault", port=LOSSY_PORT, drop=0.0)
            switch.close()
        # the controller restarts while every rank waits: the orchestrator sees every rank's file
        pause = Path(os.environ["CAIS_PAUSE_DIR"])
        (pause / f"paused{r}").write_text("")
        deadline = time.monotonic() + RESTART_WAIT_S
        while not (pause / "resumed").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller was not restarted within {RESTART_WAIT_S:g} s")
            time.sleep(0.02)
        a = xs(np.int32)
        buf = a[r].copy()
        t0 = time.monotonic()
        work = dist.all_reduce(buf, async_op=True)
        work.wait()
        record(RESTARTED, buf, np.sum(np.stack(a), axis=0).astype(np.int32), work.path, t0)
        rows[-1]["rejoins"] = pg.rejoins
        if pair is not None:
            buf = a[r].copy()
            t0 = time.monotonic()
            work = dist.all_reduce(buf, group=pair, async_op=True)
            work.wait()
            record(RESTARTED_PAIR, buf, (a[0] + a[1]).astype(np.int32), work.path, t0)
        else:
            rows.append({"name": RESTARTED_PAIR, "correct": True, "path": "-", "ms": 0.0, "elements": n_elem,
                         "wrong": 0, "member": False})
        dist.barrier()
        # the job runs on while the orchestrator operates the controller (its groups go when the job ends)
        (pause / f"done{r}").write_text("")
        deadline = time.monotonic() + RESTART_WAIT_S
        while not (pause / "operated").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the orchestrator did not run cais-cli within {RESTART_WAIT_S:g} s")
            time.sleep(0.02)
        dist.destroy_process_group()
        status = 0
    except BaseException as e:        # noqa: BLE001 - reported to the orchestrator, then the exit status
        rows.append({"name": "error", "correct": False, "error": f"{type(e).__name__}: {e}"})
        status = 1
    Path(report_path).write_text(json.dumps({"rows": rows}))
    return status


# ---------------------------------------------------------------------- the orchestrator
def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Cluster:
    """Namespaces, veth pairs, the switch and the rank processes of one run; :meth:`close` removes all.

    Members
    -------
    tag : str
        ``c<pid>``: every name this run creates starts with it.
    rank_ns : list[str]
        Each rank's namespace: one each, or with ``one_host=True`` one for all (loopback up), as the
        processes of one node that torchrun starts (docs/torch.md).
    namespaces : list[str]
        Created so far (removed by :meth:`close`).
    procs : list[subprocess.Popen]
        Started so far (ended by :meth:`close`).
    """

    def __init__(self, ranks: int, tmp: Path, one_host: bool = False, tree: tuple[int, int] | None = None):
        self.ranks, self.tmp = ranks, tmp
        self.tag = f"c{os.getpid()}"
        self.switch_ns = f"{self.tag}sw"
        # a tree: (leaves, ranks per leaf); its switches are the leaves, then the spine (in switch_ns)
        self.tree = tree
        leaves = tree[0] if tree else 0
        self.switch_nss = [f"{self.tag}l{k}" for k in range(leaves)] + [self.switch_ns]
        self.controls = ([str(tmp / f"switch{k}.sock") for k in range(leaves)] + [str(tmp / "switch.sock")])
        # one_host: every rank's interface in one namespace (a node with a NIC per rank, as torchrun
        # launches them: its loopback is up, for torch's own rendezvous on MASTER_ADDR=127.0.0.1)
        self.one_host = one_host
        self.rank_ns = [f"{self.tag}hosts"] * ranks if one_host else [f"{self.tag}r{i}" for i in range(ranks)]
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.control = self.controls[0]     # one switch: its endpoint; a tree: leaf 0's
        self.controller = str(tmp / "controller.sock")
        self.token_file = tmp / "token"
        self.token_file.write_text(secrets.token_hex(16))
        self.token_file.chmod(0o600)
        self.http = None                     # 127.0.0.1:PORT in the switch's namespace, once it listens
        self.controller_config: dict = {}    # cais.config.Config settings of the controller (a --config file)

    def create(self) -> None:
        for ns in dict.fromkeys(self.switch_nss + self.rank_ns):
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            if ns == self.switch_ns or self.one_host:
                _ip("-n", ns, "link", "set", "lo", "up")     # the controller's HTTP endpoint is on loopback
            for key in ("all", "default"):
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"],
                               check=True, capture_output=True)
        for i, ns in enumerate(self.rank_ns):
            self._veth(self.switch_nss[self.leaf_of(i)], f"{self.tag}s{i}", ns, f"{self.tag}h{i}")
        for k in range(len(self.switch_nss) - 1):      # a tree's uplinks: leaf k's last port, the spine's port k
            self._veth(self.switch_nss[k], f"{self.tag}u{k}", self.switch_ns, f"{self.tag}d{k}")

    def leaf_of(self, rank: int) -> int:
        """The switch a rank's wire leads to (0 for one switch)."""
        return rank // self.tree[1] if self.tree else 0

    @staticmethod
    def _veth(ns_a: str, end_a: str, ns_b: str, end_b: str) -> None:
        _ip("-n", ns_a, "link", "add", end_a, "type", "veth", "peer", "name", end_b, "netns", ns_b)
        _ip("-n", ns_a, "link", "set", end_a, "up")
        _ip("-n", ns_b, "link", "set", end_b, "up")

    def _spawn(self, ns: str, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def start_switch(self, extra: list[str], wait_s: float = 30.0, backend: str = "model") -> list[subprocess.Popen]:
        """cais-switch on the switch ends (a tree: one per leaf and the spine, built as
        :class:`cais.controller.tree.TreeTopology` says for `backend`); returns once every one listens
        (`wait_s`: a Verilator backend is built first). `extra`: more cais-switch options (not --backend)."""
        extra = ["--backend", backend, *extra]
        if not self.tree:
            return [self._daemon(self.switch_ns, self.control, "switch", extra,
                                 [f"{self.tag}s{i}" for i in range(self.ranks)], wait_s)]
        from .controller.tree import TreeTopology
        topology = TreeTopology(*self.tree)
        leaf = topology.leaf_params
        spine = topology.spine_params_on(backend)
        per_leaf = topology.ranks_per_leaf
        out = [self._daemon(self.switch_nss[k], self.controls[k], f"switch{k}",
                            extra + ["--ports", str(leaf.ports), "--uplink", str(leaf.uplink).lower()],
                            [f"{self.tag}s{i}" for i in range(k * per_leaf, (k + 1) * per_leaf)] + [f"{self.tag}u{k}"],
                            wait_s) for k in range(topology.leaves)]
        out.append(self._daemon(self.switch_ns, self.controls[-1], "switch", extra + ["--ports", str(spine.ports)],
                                [f"{self.tag}d{k}" for k in range(topology.leaves)], wait_s))
        return out

    def _daemon(self, ns: str, control: str, name: str, extra: list[str], ifaces: list[str],
                wait_s: float) -> subprocess.Popen:
        ready = self.tmp / f"{name}.ready"
        p = self._spawn(ns, ["-m", "cais.sim.daemon", "--control", control, "--ready-file", str(ready), *extra,
                             *ifaces], dict(os.environ), self.tmp / f"{name}.log")
        deadline = time.monotonic() + wait_s
        while not ready.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cais-switch ({name}) did not start: "
                                   + (self.tmp / f"{name}.log").read_text()[-2000:])
            time.sleep(0.05)
        return p

    def start_controller(self, recover: bool = False, wait_s: float = 30.0, extra: tuple = (),
                         world_size: int | None = None) -> subprocess.Popen:
        """cais-controller in the switch's namespace for ranks 0 .. `world_size` - 1 (default: every rank of
        the cluster) on the ports of the same numbers; returns once it listens (its HTTP port known)."""
        ready = self.tmp / "controller.ready"
        ready.unlink(missing_ok=True)
        n = sum(1 for p in self.tmp.glob("controller*.log"))
        log = self.tmp / f"controller{n}.log"
        switches = ([a for c in self.controls for a in ("--switch", c)] + ["--tree", "x".join(map(str, self.tree))]
                    if self.tree else ["--switch", self.control])
        if self.controller_config:
            path = self.tmp / "controller.toml"
            path.write_text(_toml(self.controller_config))
            extra = ("--config", str(path), *extra)
        p = self._spawn(self.switch_ns, ["-m", "cais.service", *switches, "--listen", self.controller,
                                         "--http", "127.0.0.1:0", "--world-size", str(world_size or self.ranks), "--token-file",
                                         str(self.token_file), "--ready-file", str(ready)]
                        + (["--recover"] if recover else []) + list(extra), dict(os.environ), log)
        deadline = time.monotonic() + wait_s
        while not ready.exists() or not ready.read_text().strip():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("cais-controller did not start: " + log.read_text()[-2000:])
            time.sleep(0.05)
        self.http = f"127.0.0.1:{int(ready.read_text())}"
        return p

    def restart_controller(self, old: subprocess.Popen, ranks: list[subprocess.Popen]) -> subprocess.Popen:
        """Once every rank paused: stop the controller, start it again with --recover, let the ranks on."""
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not all((self.tmp / f"paused{i}").exists() for i in range(self.ranks)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in ranks):
                raise RuntimeError("the ranks did not reach the controller restart")
            time.sleep(0.05)
        os.killpg(old.pid, signal.SIGTERM)
        old.wait(10)
        new = self.start_controller(recover=True)
        (self.tmp / "resumed").write_text("")
        return new

    def cli(self, args: list[str]) -> subprocess.CompletedProcess:
        """cais-cli in the switch's namespace (where the controller's loopback is)."""
        return subprocess.run(["ip", "netns", "exec", self.switch_ns, sys.executable, "-m", "cais.cli",
                               "--controller", self.http, "--token-file", str(self.token_file), *args],
                              capture_output=True, text=True, timeout=60)

    def scrape(self) -> str:
        """/metrics of the controller, with the token."""
        code = ("import sys, urllib.request; r = urllib.request.Request(sys.argv[1] + '/metrics', headers="
                "{'Authorization': 'Bearer ' + open(sys.argv[2]).read().strip()}); "
                "sys.stdout.write(urllib.request.urlopen(r, timeout=10).read().decode())")
        p = subprocess.run(["ip", "netns", "exec", self.switch_ns, sys.executable, "-c", code, f"http://{self.http}",
                            str(self.token_file)], capture_output=True, text=True, timeout=60)
        if p.returncode:
            raise RuntimeError(f"scraping /metrics failed: {p.stderr.strip()[-500:]}")
        return p.stdout

    def start_ranks(self, elements: int, config: dict | None = None) -> list[subprocess.Popen]:
        """One rank process per namespace; `config`: :class:`cais.config.Config` settings for every rank
        (a TOML file in the temporary folder, ``CAIS_CONFIG``)."""
        out = []
        extra = {}
        if config:
            path = self.tmp / "ranks.toml"
            path.write_text(_toml(config))
            extra["CAIS_CONFIG"] = str(path)
        for i, ns in enumerate(self.rank_ns):
            env = dict(os.environ, **extra, CAIS_RANK=str(i), CAIS_WORLD_SIZE=str(self.ranks),
                       CAIS_IFACE=f"{self.tag}h{i}",
                       CAIS_SWITCH=self.controls[self.leaf_of(i)], CAIS_CONTROLLER=self.controller,
                       CAIS_REPORT=str(self.tmp / f"rank{i}.json"), CAIS_ELEMENTS=str(elements),
                       CAIS_TIMEOUT="60", CAIS_COORDINATOR="external", CAIS_TOKEN=self.token_file.read_text(),
                       CAIS_PAUSE_DIR=str(self.tmp))
            out.append(self._spawn(ns, ["-m", "cais.cluster", "--worker"], env, self.tmp / f"rank{i}.log"))
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)     # its own session: ip netns exec and python
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces.clear()


def _toml(config: dict) -> str:
    """A TOML file's text of :class:`cais.config.Config` settings (its ``[cais]`` table)."""
    return "[cais]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())


def summary(reports: list[dict], ranks: int, backend: str = "model") -> tuple[str, bool]:
    """The table (one row per collective of :data:`SUITE`, CORRECT when every rank matched numpy) and
    whether all were."""
    lines = [f"{'collective':<53} {'elements':>8} {'path':<7} {'ms (max)':>9}  result",
             "-" * 91]
    all_ok = True
    names = list(SUITE)
    for name in names:
        rows = [next((x for x in rep.get("rows", []) if x["name"] == name), None) for rep in reports]
        if any(x is None for x in rows):
            missing = [i for i, x in enumerate(rows) if x is None]
            lines.append(f"{name:<53} {'':>8} {'':<7} {'':>9}  NOT RUN (ranks {missing})")
            all_ok = False
            continue
        wrong = [i for i, x in enumerate(rows) if not x["correct"]]
        paths = sorted({x["path"] or "?" for x in rows if x.get("member", True)})
        extra = f" ({rows[0]['dropped']} frames dropped)" if "dropped" in rows[0] else ""
        if "rejoins" in rows[0]:
            extra = f" (every rank rejoined: {min(x.get('rejoins', 0) for x in rows)} time)"
        result = "CORRECT" if not wrong else f"WRONG on ranks {wrong}"
        all_ok &= not wrong
        lines.append(f"{name:<53} {rows[0]['elements']:>8} {'/'.join(paths):<7} "
                     f"{max(x['ms'] for x in rows):>9.1f}  {result}{extra}")
    for i, rep in enumerate(reports):
        for x in rep.get("rows", []):
            if x["name"] == "error":
                lines.append(f"rank {i}: {x['error']}")
                all_ok = False
    lines.append("-" * 91)
    lines.append(f"{ranks} rank processes, cais-switch ({backend}): "
                 + ("every collective CORRECT" if all_ok else "FAILED"))
    return "\n".join(lines), all_ok


def operate(cluster: Cluster) -> bool:
    """Every cais-cli command of :data:`CLI_COMMANDS` and a scrape of /metrics, a few lines of each;
    True when every command succeeded and the metrics have every family make cluster looks for."""
    ok = True
    for args in CLI_COMMANDS:
        p = cluster.cli(args)
        lines = (p.stdout.strip() or p.stderr.strip()).splitlines()
        print(f"\n$ cais-cli {' '.join(args)}" + ("" if p.returncode == 0 else f"   (exit {p.returncode})"))
        for line in lines[:8] if args[0] != "--json" else [lines[0][:200] + " ..."] if lines else []:
            print("  " + line)
        ok &= p.returncode == 0
    metrics = cluster.scrape()
    wanted = ("cais_group_completions_total", "cais_group_contributions_total", "cais_collective_latency_seconds_count",
              "cais_queue_delay_seconds_count", "cais_collectives_total", "cais_collective_bytes_total",
              "cais_offload_decisions_total", "cais_fallback_ratio",
              'cais_drops_total{reason="NO_RULE"}', 'cais_port_rx_frames_total{port="0"}', "cais_sets_in_use",
              "cais_group_sets_allocated", "cais_group_sets_in_use", "cais_group_sets_aged_total")
    print("\n$ curl -H 'Authorization: Bearer ...' http://" + cluster.http + "/metrics   (a few lines)")
    for line in metrics.splitlines():
        if line.startswith(wanted):
            print("  " + line)
    missing = [w for w in wanted if w not in metrics]
    if missing:
        print(f"cais.cluster: /metrics lacks {missing}", file=sys.stderr)
    return ok and not missing


def main(argv=None) -> int:
    from . import cmdline
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker()
    p = cmdline.Parser(prog="cais-cluster", description="A CAIS cluster in network namespaces of its own: "
                   "cais-switch (model) and one process per rank; runs every collective and checks it (root).")
    p.add_argument("--ranks", type=cmdline.integer(2), default=4)
    p.add_argument("--elements", type=cmdline.integer(1), default=4096, help="elements per rank (default 4096)")
    p.add_argument("--backend", choices=("model", "verilator"), default="model",
                   help="cais-switch's backend (default: model; verilator builds the exported Verilog first)")
    p.add_argument("--keep-logs", metavar="DIR", default=None, help="copy the switch's and ranks' logs here")
    p.add_argument("--topology", choices=("single", "leaf-spine"), default="single",
                   help="one switch, or an aggregation tree: --leaves leaves of --ranks-per-leaf ranks under a spine")
    p.add_argument("--leaves", type=cmdline.integer(2), default=2, help="leaf-spine: leaf switches (default 2)")
    p.add_argument("--ranks-per-leaf", type=cmdline.integer(1), default=4, help="leaf-spine: ranks per leaf (4)")
    cmdline.add_version(p)
    args = p.parse_args(argv)
    tree = None
    if args.topology == "leaf-spine":
        from .controller.tree import TreeError, TreeTopology
        try:
            args.ranks = TreeTopology(args.leaves, args.ranks_per_leaf).ranks
        except TreeError as e:
            p.error(str(e))
        tree = (args.leaves, args.ranks_per_leaf)
    if args.ranks > 16:
        p.error("--ranks: at most 16 (the switch's ports)")
    if os.geteuid() != 0:
        print("cais.cluster: error: needs root (it creates network namespaces and veth pairs)", file=sys.stderr)
        return 2
    if shutil.which("ip") is None:
        print("cais.cluster: error: needs ip(8) from iproute2", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    tmp = Path(tempfile.mkdtemp(prefix="cais-cluster-"))
    cluster = Cluster(args.ranks, tmp, tree=tree)
    ok = False
    try:
        cluster.create()
        cluster.start_switch([], wait_s=30.0 if args.backend == "model" else 600.0, backend=args.backend)
        cluster.controller_config = dict(CLUSTER_CONTROLLER)
        controller = cluster.start_controller()
        ranks = cluster.start_ranks(args.elements)
        controller = cluster.restart_controller(controller, ranks)
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not all((tmp / f"done{i}").exists() for i in range(args.ranks)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in ranks):
                break                      # a rank failed or hangs: its report says why
            time.sleep(0.05)
        operated = operate(cluster)        # while the job runs: its groups are there to be shown
        (tmp / "operated").write_text("")
        for proc in ranks:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"cais.cluster: a rank did not finish within {RANK_TIMEOUT_S:g} s", file=sys.stderr)
                break
        reports = []
        for i in range(args.ranks):
            path = tmp / f"rank{i}.json"
            reports.append(json.loads(path.read_text()) if path.exists() else
                           {"rows": [{"name": "error", "correct": False,
                                      "error": "no report; log tail: " + (tmp / f"rank{i}.log").read_text()[-800:]}]})
        table, ok = summary(reports, args.ranks, args.backend if not tree else
                            f"{args.backend}; {tree[0]} leaves and a spine, {tree[0] + 1} daemons")
        print(table, flush=True)
        ok &= operated
    except Interrupted as e:
        print(f"cais.cluster: interrupted ({e}); cleaning up", file=sys.stderr)
    except (subprocess.CalledProcessError, RuntimeError) as e:
        detail = getattr(e, "stderr", "") or ""
        print(f"cais.cluster: error: {e} {detail.strip()}", file=sys.stderr)
    finally:
        # cleanup must not be interrupted half-way: ignore further signals until it is done
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        cluster.close()
        if args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            for log in tmp.glob("*.log"):
                shutil.copy(log, Path(args.keep_logs) / log.name)
        shutil.rmtree(tmp, ignore_errors=True)
        for s, handler in old.items():
            signal.signal(s, handler)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
