"""The "cais" torch backend deployed: rank processes started as torchrun starts them (env://: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) on veth pairs to cais-switch in network namespaces.
The plain API's host-path collectives and int64 against numpy, async torch works, DDP with the block
floating point hook bit-identical to the co-simulation's run, a shape mismatch failing every rank, and a
rank that dies failing the others' next collective (no hang); the switch unreachable at init. Root only."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from cais.cluster import Cluster
from netns import namespace, rank_outputs, require_root, veth

RANK = r"""
import json, os, signal, sys, time
import numpy as np, torch, torch.distributed as dist
import cais, cais.torch as ct
from cais.hostops import ShapeMismatch
from cais.torch import hooks
sys.path.insert(0, sys.argv[1])
import test_torch as T
dist.init_process_group("cais")                       # env://, as torchrun sets it
r, n = dist.get_rank(), dist.get_world_size()
out = {"rank": r}
rng = [np.random.default_rng(q) for q in range(n)]
# the plain API (cais.dist, initialised by the backend): int64, fold ops and the composed collectives
big = [g.integers(-2**62, 2**62, 50, dtype=np.int64) for g in rng]
x = big[r].copy(); cais.all_reduce(x)
y = big[r].copy(); cais.all_reduce(y, op="max")
p = np.array([r + 2, -(r + 1), 3], np.int32); cais.all_reduce(p, op=cais.ReduceOp.PRODUCT)
red = np.full(4, r + 1, np.int16); cais.reduce(red, dst=1)
gl = np.zeros((n, 3), np.float32) if r == 0 else None
cais.gather(np.full(3, r, np.float32), gl, dst=0)
sc = np.zeros(2, np.int32)
cais.scatter(sc, [np.full(2, 10 + q, np.int32) for q in range(n)] if r == 2 else None, src=2)
a2a = np.zeros((n, 2), np.int64)
cais.all_to_all(a2a, np.array([[10 * r + j, j] for j in range(n)], np.int64))
got = np.zeros(5, np.float64)
if r == 0:
    cais.send(np.linspace(0, 1, 5), dst=2)
elif r == 2:
    cais.recv(got, src=0)
with np.errstate(over="ignore"):
    want_sum = np.sum(np.stack(big), axis=0)
out["plain"] = {
    "int64_sum": bool(np.array_equal(x, want_sum)), "int64_max": bool(np.array_equal(y, np.max(np.stack(big), axis=0))),
    "product": p.tolist() == [2 * 3 * 4, -6, 27], "reduce": red.tolist() == ([6] * 4 if r == 1 else [r + 1] * 4),
    "gather": gl.tolist() == [[q] * 3 for q in range(n)] if r == 0 else True,
    "scatter": sc.tolist() == [10 + r] * 2, "all_to_all": a2a.tolist() == [[10 * q + r, r] for q in range(n)],
    "send_recv": np.array_equal(got, np.linspace(0, 1, 5)) if r == 2 else True}
# torch: async all-reduce (its future completes when the switch's result is in), bf16, the gathers
t = torch.arange(1000, dtype=torch.float32) * (r + 1)
work = dist.all_reduce(t, async_op=True)
fut = work.get_future()
fut.wait()
out["async"] = bool(torch.equal(fut.value()[0], torch.arange(1000, dtype=torch.float32) * 6)) and work.is_completed()
h = torch.full((33,), r + 1.5, dtype=torch.bfloat16); dist.all_reduce(h, op=dist.ReduceOp.MAX)
out["bf16_max"] = bool((h == n + 0.5).all())
ag = torch.zeros(n * 4, dtype=torch.int8); dist.all_gather_into_tensor(ag, torch.full((4,), r, dtype=torch.int8))
out["all_gather"] = ag.tolist() == [q for q in range(n) for _ in range(4)]
rs = torch.zeros(2); dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n) + r)
out["reduce_scatter"] = rs.tolist() == [n * (2 * r) + 3, n * (2 * r + 1) + 3]
out["paths"] = ct.backend_of().path_counts()
# DDP with the block floating point hook: bit-identical to the co-simulation's run (the test compares)
out["ddp"] = [p.reshape(-1).view("uint32").tolist() for p in T.train(r, hooks.block_fp_hook)]
try:
    dist.all_reduce(torch.ones(7 if r == 1 else 8))
    out["mismatch"] = None
except ShapeMismatch as e:
    out["mismatch"] = str(e)
dist.barrier()
if r == n - 1:
    os.kill(os.getpid(), signal.SIGKILL)              # dies between two steps: no bye
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(1000))
    out["after_death"] = None
except Exception as e:                                # noqa: BLE001 - reported
    out["after_death"] = f"{type(e).__name__}: {e}"
out["after_death_s"] = time.monotonic() - t0          # reported, not asserted
print(json.dumps(out), flush=True)
# rank 0's process hosts the coordinator: it stays until every survivor has its answer
done = os.environ["DONE_DIR"]
open(os.path.join(done, f"done{r}"), "w").close()
end = time.monotonic() + 60
while r == 0 and time.monotonic() < end and not all(os.path.exists(os.path.join(done, f"done{q}")) for q in range(n - 1)):
    time.sleep(0.05)
os._exit(0)
"""


@pytest.mark.slow
def test_deployed_backend_end_to_end(tmp_path):
    require_root()
    from cais.torch import hooks
    from cais.sim.torch_ranks import run_ranks
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sw"))
    import test_torch as T
    ranks = 3
    cosim = run_ranks(lambda r: T.train(r, hooks.block_fp_hook), ranks)
    cluster = Cluster(ranks, tmp_path, one_host=True)
    try:
        cluster.create()
        cluster.start_switch([])
        config = tmp_path / "cais.toml"
        config.write_text('[cais]\noffload = "always"\n')
        procs = []
        for i in range(ranks):
            env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT="29555", CAIS_IFACE=f"{cluster.tag}h{{local_rank}}", CAIS_SWITCH=cluster.control,
                       CAIS_CONTROLLER=cluster.controller, CAIS_CONFIG=str(config), CAIS_TIMEOUT="30",
                       OMP_NUM_THREADS="1", DONE_DIR=str(tmp_path))
            procs.append(cluster._spawn(cluster.rank_ns[i], ["-c", RANK, os.path.join(os.path.dirname(__file__),
                                                                                        "..", "sw")],
                                        env, tmp_path / f"rank{i}.log"))
        for p in procs:
            p.wait(240)
        outs = rank_outputs(tmp_path, ranks - 1)                 # the last one killed itself
    finally:
        cluster.close()
    import signal
    assert procs[-1].returncode == -signal.SIGKILL
    for r, out in enumerate(outs):
        assert all(out["plain"].values()), out["plain"]
        assert out["async"] and out["bf16_max"] and out["all_gather"] and out["reduce_scatter"], out
        assert out["paths"].get("switch", 0) > 0 and "ring" not in out["paths"], out["paths"]
        got = [np.array(a, np.uint32).view(np.float32) for a in out["ddp"]]
        assert [g.tobytes() for g in got] == [c.reshape(-1).tobytes() for c in cosim[r]]
        assert out["mismatch"] and "disagree" in out["mismatch"], out
        assert out["after_death"] and "died" in out["after_death"], out
        print(f"rank {r}: the collective after rank {ranks - 1}'s death failed in {out['after_death_s']:.2f} s")


UNREACHABLE = r"""
import json, sys, time, torch.distributed as dist
import cais.torch
from cais.endpoint import EndpointError
t0 = time.monotonic()
try:
    dist.init_process_group("cais", init_method="tcp://127.0.0.1:29556", rank=0, world_size=1)
    print(json.dumps({"error": None}))
except EndpointError as e:
    print(json.dumps({"error": str(e), "seconds": time.monotonic() - t0}))
"""


def test_switch_unreachable_at_init_is_named(tmp_path):
    """torch's tcp:// rendezvous succeeds, then the backend cannot reach cais-switch's control endpoint:
    init_process_group raises naming it, once the connect timeout (1 s here) is over."""
    with namespace() as ns:
        veth(ns, "s0", "h0")
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", UNREACHABLE], capture_output=True,
                           text=True, timeout=120,
                           env=dict(os.environ, CAIS_CONNECT_TIMEOUT="1", CAIS_IFACE="h0",
                                    CAIS_SWITCH=str(tmp_path / "nothing.sock"),
                                    CAIS_CONTROLLER=str(tmp_path / "coord.sock")))
    assert p.stdout, p.stderr[-2000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["error"] and "switch control endpoint" in out["error"] and "within 1 s" in out["error"], out
