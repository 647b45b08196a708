"""The coordinator's side of a dead rank in the process world (docs/reliability.md section 8, "The
process world"), without namespaces: cais-switch's event loop (the model, no interfaces) in a thread,
the coordinator in this process, rank connections over its JSON-lines endpoint. A rank whose connection
ends without bye is dropped from its job's groups at once; the collective it had finished stands, the
one it had not is redone (its epoch moves on, the finishers are forgotten); the next collective runs on
the switch with the ranks left as the rule's contributors."""

import time

import pytest

from cais.allreduce import CollectiveKind
from cais.config import Config
from cais.coordinator import Coordinator, kind_to_dict
from cais.endpoint import connect
from cais.params import SwitchParams

from daemons import in_process_switch

__all__: list[str] = []


@pytest.fixture
def coordinator(tmp_path):
    sock = str(tmp_path / "switch.sock")
    with in_process_switch(sock, SwitchParams(ports=4)):
        coord = Coordinator(sock, 4, Config(offload="always"), token="t")
        coord.serve(str(tmp_path / "coord.sock"))
        conns = [connect(str(tmp_path / "coord.sock"), name="rank", token="t") for _ in range(4)]
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        try:
            yield coord, conns
        finally:
            for c in conns:
                c.close()
            coord.close()


def decide(conn, op_seq):
    """The decision of the world group's collective `op_seq` (asked again while the controller is busy)."""
    end = time.monotonic() + 60                      # a safety net
    while True:
        reply = conn.request("decide", group=1, op_seq=op_seq, nbytes=4000, kind=kind_to_dict(CollectiveKind()))
        if reply["decision"] is not None:
            return reply
        assert time.monotonic() < end, "no decision"
        time.sleep(0.01)


def status(conn, op_seq):
    return conn.request("status", group=1, op_seq=op_seq)


def die(coord, conns, rank):
    """Rank `rank`'s connection ends without bye; returns once the coordinator has dropped it."""
    conns[rank].close()
    end = time.monotonic() + 60                      # a safety net: the coordinator notices in a thread
    while rank not in conns[0].request("ping")["dead"]:
        assert time.monotonic() < end, "the coordinator never saw the connection end"
        time.sleep(0.01)


def test_a_dead_rank_that_finished_stands_one_that_did_not_is_redone(coordinator):
    coord, conns = coordinator
    world = coord.controller.groups[1]
    # collective 0: rank 3 finishes it, then dies: every chunk had its contribution, it stands
    assert decide(conns[0], 0)["decision"]["offload"]
    conns[3].request("finished", rank=3, group=1, op_seq=0)
    die(coord, conns, 3)
    st = status(conns[0], 0)
    assert (st["epoch"], st["ranks"], st["ports"], st["fell_back"]) == (0, [0, 1, 2], [0, 1, 2], False), st
    for r in (0, 1, 2):
        assert not status(conns[0], 0)["all_finished"]
        conns[r].request("finished", rank=r, group=1, op_seq=0)
    assert status(conns[0], 0)["all_finished"]
    # collective 1: ranks 0 and 1 finish it, rank 2 dies before it did: redone by ranks 0 and 1
    reply = decide(conns[0], 1)
    assert reply["ranks"] == [0, 1, 2] and reply["epoch"] == 0 and reply["decision"]["offload"]
    for r in (0, 1):
        conns[r].request("finished", rank=r, group=1, op_seq=1)
    die(coord, conns, 2)
    st = status(conns[1], 1)
    assert (st["epoch"], st["ranks"], st["fell_back"], st["all_finished"]) == (1, [0, 1], True, False), st
    assert decide(conns[1], 1)["epoch"] == 1         # a rank that decides late learns it must redo
    conns[0].request("finished", rank=0, group=1, op_seq=1)
    assert not status(conns[0], 1)["all_finished"]     # the finishers of the abandoned run are forgotten
    conns[1].request("finished", rank=1, group=1, op_seq=1)
    assert status(conns[0], 1)["all_finished"]
    # collective 2: on the switch, the rule's contributors the ranks left
    reply = decide(conns[0], 2)
    assert reply["decision"]["offload"] and reply["ranks"] == [0, 1] and reply["epoch"] == 0
    assert world.ranks == (0, 1) and sorted(world.dropped) == [2, 3] and not world.rule_stale
    assert coord.controller.group_rule(world).contributors == 0b0011
    assert [e["dead"] for e in coord.jobs_view()["jobs"]] == [[2, 3]]


def test_a_finish_of_an_abandoned_run_does_not_count(coordinator):
    """A rank that finished the collective's first run on the switch after a peer died (and before it
    learnt of the redo) reports it with the old epoch: ignored, so the ranks left wait for its redo."""
    coord, conns = coordinator
    decide(conns[0], 0)
    die(coord, conns, 3)
    assert status(conns[0], 0)["epoch"] == 1
    conns[1].request("finished", rank=1, group=1, op_seq=0, epoch=0)       # stale: the abandoned run
    for r in (0, 2):
        conns[r].request("finished", rank=r, group=1, op_seq=0, epoch=1)
    assert not status(conns[0], 0)["all_finished"]
    conns[1].request("finished", rank=1, group=1, op_seq=0, epoch=1)
    assert status(conns[0], 0)["all_finished"]
