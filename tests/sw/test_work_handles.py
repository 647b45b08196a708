"""Work handles of the in-process World never deadlock: 2-3 outstanding collectives of mixed kinds
(int32 SUM, fp16 MAX, int16 MIN, on the switch and on the host ring), waited for in every order, with
blocking calls mixed in; every result checked against numpy.

A deadlock shows up as the world thread waiting forever, so each scenario runs in a thread with a
deadline and fails (instead of hanging the suite) if it is not back in time.
"""

import itertools
import threading

import numpy as np
import pytest

from cais.comm import World
from cais.config import Config
from cais.link import run_sync
from cais.params import SwitchParams
from cais.sim.links.model import ModelLink

RANKS = 3
DEADLINE_S = 60.0

# (dtype, op, numpy reduction): three kinds, so the group's rule is retyped between them
KINDS = [(np.int32, "sum", np.sum), (np.float16, "max", np.max), (np.int16, "min", np.min)]


def contribution(rank: int, k: int, n: int = 300) -> np.ndarray:
    dtype = KINDS[k][0]
    return ((np.arange(n) * (k + 3) + 7 * rank) % 61 - 30).astype(dtype)


def expected(k: int) -> np.ndarray:
    dtype, _, reduce = KINDS[k]
    return reduce(np.stack([contribution(r, k) for r in range(RANKS)]), axis=0).astype(dtype)


def run_with_deadline(world: World, fn):
    box = {}

    def target():
        try:
            box["results"] = run_sync(world.run(fn))
        except BaseException as e:   # noqa: BLE001 - re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), "deadlock: the world did not finish within the deadline"
    if "error" in box:
        raise box["error"]
    return box["results"]


@pytest.mark.parametrize("offload", ["always", "never"])
@pytest.mark.parametrize("count", [2, 3])
def test_outstanding_works_waited_in_every_order(offload, count):
    orders = list(itertools.permutations(range(count)))

    def fn(comm):
        out = []
        for order in orders:
            works = [comm.all_reduce(contribution(comm.rank, k), op=KINDS[k][1], async_op=True)
                     for k in range(count)]
            results = {}
            for i in order:
                results[i] = works[i].wait()
                assert works[i].is_completed()
            out.append([results[k] for k in range(count)])
        return out

    world = World(ModelLink(SwitchParams(ports=4)), ranks=RANKS, config=Config(offload=offload))
    for per_rank in run_with_deadline(world, fn):
        assert len(per_rank) == len(orders)
        for results in per_rank:
            for k, got in enumerate(results):
                assert got.dtype == KINDS[k][0]
                np.testing.assert_array_equal(got, expected(k))


@pytest.mark.parametrize("offload", ["always", "never"])
def test_async_then_blocking_then_wait(offload):
    """async, async, blocking, then the async ones in reverse order: the blocking call returns while
    two collectives are still outstanding."""
    def fn(comm):
        w0 = comm.all_reduce(contribution(comm.rank, 0), op="sum", async_op=True)
        w1 = comm.all_reduce(contribution(comm.rank, 1), op="max", async_op=True)
        blocking = comm.all_reduce(contribution(comm.rank, 2), op="min")
        return w1.wait(), w0.wait(), blocking, comm.wait_all()

    world = World(ModelLink(SwitchParams(ports=4)), ranks=RANKS, config=Config(offload=offload))
    for r1, r0, r2, rest in run_with_deadline(world, fn):
        np.testing.assert_array_equal(r0, expected(0))
        np.testing.assert_array_equal(r1, expected(1))
        np.testing.assert_array_equal(r2, expected(2))
        assert len(rest) == 2
        np.testing.assert_array_equal(rest[0], expected(0))
        np.testing.assert_array_equal(rest[1], expected(1))


@pytest.mark.slow
def test_driver_md_api_example_completes():
    """docs/driver.md's example (an async all-reduce, then blocking ones, then the wait) used to hang."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent.parent / "docs" / "driver.md").read_text()
    code = re.search(r"## API\n.*?```python\n(.*?)```", text, re.S).group(1)
    head, sep, _ = code.partition("results = await World(link")
    assert sep and "async_op=True" in head and "work.wait()" in head
    scope = {}
    exec(compile(head, "docs/driver.md", "exec"), scope)      # the imports and train(), as written
    world = World(ModelLink(SwitchParams(ports=4)), ranks=4, config=Config(timeout_ms=0.05))
    results = run_with_deadline(world, scope["train"])
    for rank, (total, pair, acts, bf) in enumerate(results):
        np.testing.assert_array_equal(total, np.full(1 << 18, 0 + 1 + 2 + 3, np.int32))
        if rank < 2:
            np.testing.assert_array_equal(pair, np.full(10, 1, np.int32))    # max over ranks 0 and 1
        else:
            assert pair is None
        np.testing.assert_array_equal(acts, np.full(1000, 4, np.float16))
        np.testing.assert_array_equal(bf, np.full(1000, 4, np.float32))


def test_new_group_called_by_every_rank_or_by_members_only():
    """torch style (every rank calls new_group; non-members get None) and members-only calls give the
    same groups: the n-th call with a list of ranks is the n-th group of those ranks."""
    def fn(comm):
        pair = comm.new_group([0, 1])                                 # every rank calls it
        tail = comm.new_group([1, 2]) if comm.rank in (1, 2) else None   # members only
        out = {}
        if pair is not None:
            out["pair"] = comm.all_reduce(np.full(4, comm.rank + 1, np.int32), group=pair)
        if tail is not None:
            out["tail"] = comm.all_reduce(np.full(4, comm.rank + 1, np.int32), group=tail)
        return pair, tail, out

    world = World(ModelLink(SwitchParams(ports=4)), ranks=RANKS)
    results = run_with_deadline(world, fn)
    assert results[2][0] is None and results[0][1] is None
    assert results[0][0] == results[1][0] and results[1][1] == results[2][1]
    assert results[0][0].group_id != results[1][1].group_id
    for rank, (_, _, out) in enumerate(results):
        if rank in (0, 1):
            np.testing.assert_array_equal(out["pair"], np.full(4, 3, np.int32))
        if rank in (1, 2):
            np.testing.assert_array_equal(out["tail"], np.full(4, 5, np.int32))
