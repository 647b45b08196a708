"""Driver + controller co-simulated against the switch backends, with seeded faults.

The reference-model backend runs the long and lossy scenarios; the RTL backends run shorter ones, and
all three must agree on a seeded scenario with 5% loss on every port. Every test ends in an exact
result, checked against numpy inside the workload (``correct``) and here again via its digest.
"""

import numpy as np
import pytest

from cais import protocol as proto
from cais.comm import World
from cais.config import Config
from cais.link import run_sync
from cais.params import SwitchParams
from cais.sim.backends import ModelLink, run_backend
from cais.sim.workload import reference_reduce

ENTRY = "cais.sim.workload:all_reduce_job"


def job(**kw):
    base = {"ranks": 4, "elements": 3000, "op": "sum", "seed": 3, "config": {}}
    base.update(kw)
    return base


def run(kind, **kw):
    j = job(**kw)
    summary = run_backend(kind, SwitchParams(ports=max(2, j["ranks"])), ENTRY, j)
    assert summary["correct"], summary
    return summary


@pytest.mark.parametrize("loss,dup,reorder", [(0.0, 0.0, 0.0), (0.01, 0.0, 0.0), (0.05, 0.02, 0.02),
                                              (0.10, 0.05, 0.05), (0.0, 0.10, 0.10)])
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_model_faults_exact(loss, dup, reorder, ranks):
    s = run("model", ranks=ranks, loss=loss, duplicate=dup, reorder=reorder, config={"offload": "always"},
            collectives=2)
    assert s["paths"] == ["switch"]
    if loss:
        assert sum(s["retransmissions"]) > 0


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_model_ops_and_odd_lengths(op):
    for elements in (1, 63, 64, 65, 1000):
        run("model", op=op, elements=elements, loss=0.03)


def test_controller_keeps_small_two_rank_collectives_on_hosts():
    s = run("model", ranks=2, elements=500)
    assert s["paths"] == ["ring"]
    assert not s["decisions"][0]["offload"] and "score" in s["decisions"][0]["reason"]
    assert s["counters"]["CONTRIBUTIONS"] == 0          # nothing reached the slots


def test_never_offload_runs_the_ring_through_the_switch():
    s = run("model", elements=5000, loss=0.05, config={"offload": "never"})
    assert s["paths"] == ["ring"]
    assert s["counters"]["FORWARDED"] > 0 and s["counters"]["CONTRIBUTIONS"] == 0


def test_retries_run_out_and_the_ring_finishes():
    s = run("model", elements=5000, loss=0.15, config={"offload": "always", "retry_limit": 0})
    assert "ring" in s["paths"]
    assert any("falls back" in e["event"] for e in s["events"])
    assert s["stats"]["fallback_ratio"] > 0


def test_api_groups_async_and_shapes():
    params = SwitchParams(ports=4)
    link = ModelLink(params)
    data = [np.arange(24, dtype=np.int32).reshape(2, 3, 4) * (r + 1) for r in range(4)]

    def fn(comm):
        work = comm.all_reduce(data[comm.rank], op="max", async_op=True)
        pair = comm.new_group([1, 2]) if comm.rank in (1, 2) else None
        total = work.wait()
        small = comm.all_reduce(data[comm.rank][0], group=pair) if pair else None
        return total, small, work.path

    results = run_sync(World(link, config=Config(offload="always")).run(fn))
    for r, (total, small, path) in enumerate(results):
        assert total.shape == (2, 3, 4) and np.array_equal(total, data[3])
        assert path == "switch"
        if r in (1, 2):
            assert np.array_equal(small, reference_reduce([data[1][0], data[2][0]], proto.ReduceOp.SUM))
        else:
            assert small is None


def test_wait_all_returns_every_outstanding_result_in_order():
    link = ModelLink(SwitchParams(ports=3))
    data = [np.arange(300, dtype=np.int32) + 1000 * r for r in range(3)]

    def fn(comm):
        works = [comm.all_reduce(data[comm.rank][k::3], op=op, async_op=True)
                 for k, op in enumerate(("sum", "max", "min"))]
        results = comm.wait_all()
        assert all(w.is_completed() for w in works) and comm.wait_all() == []
        return results

    for total, biggest, smallest in run_sync(World(link, config=Config(offload="always")).run(fn)):
        assert np.array_equal(total, sum(d[0::3].astype(np.int64) for d in data).astype(np.int32))
        assert np.array_equal(biggest, data[2][1::3]) and np.array_equal(smallest, data[0][2::3])


def test_bad_calls_are_refused():
    link = ModelLink(SwitchParams())

    def fn(comm):
        comm.all_reduce(np.zeros(3, dtype=np.int64))

    with pytest.raises(TypeError, match="int32"):
        run_sync(World(link).run(fn))
    with pytest.raises(ValueError, match="ranks=9"):
        World(ModelLink(SwitchParams()), ranks=9)


def test_lossless_model_and_amaranth_send_the_same_frames():
    model = run("model", elements=700, config={"offload": "always"})
    rtl = run("amaranth", elements=700, config={"offload": "always"})
    assert model["result_sha256"] == rtl["result_sha256"]
    for key in ("RX_FRAMES", "RX_BYTES", "TX_FRAMES", "TX_BYTES", "CONTRIBUTIONS", "COMPLETED"):
        assert model["counters"][key] == rtl["counters"][key], key
    assert model["frames_sent"] == rtl["frames_sent"] and model["bytes_sent"] == rtl["bytes_sent"]


@pytest.mark.cocotb
def test_three_backends_agree_with_five_percent_loss():
    kw = dict(elements=1200, loss=0.05, seed=11, config={"offload": "always"})
    digests = {kind: run(kind, **kw)["result_sha256"] for kind in ("model", "amaranth", "cocotb")}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.cocotb
def test_verilator_faults_exact():
    s = run("cocotb", elements=4000, loss=0.05, duplicate=0.02, reorder=0.02, config={"offload": "always"})
    assert sum(s["retransmissions"]) > 0


@pytest.mark.cocotb
def test_verilator_lossless_matches_model_frames():
    model = run("model", elements=2000, config={"offload": "always"})
    rtl = run("cocotb", elements=2000, config={"offload": "always"})
    for key in ("RX_FRAMES", "RX_BYTES", "TX_FRAMES", "TX_BYTES", "CONTRIBUTIONS", "COMPLETED"):
        assert model["counters"][key] == rtl["counters"][key], key
    assert model["frames_sent"] == rtl["frames_sent"]
