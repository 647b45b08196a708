"""cais.dist: a rank's switch engine starts its clock when the controller's decision arrives, not before.

On the Verilated leaf-spine cluster a ``decide`` took 0.4-6 s (the controller programs three slow
daemons; the other ranks' requests come first). The progress thread handed the engine the time from before
the request: the first frames were stamped seconds in the past, every chunk's deadline had passed when it
was sent, and the whole window was repeated at once (docs/protocol.md 13.7). Here the rank's ProcessGroup
runs one step against a stand-in coordinator whose ``decide`` advances a fake clock by 3 s; no sockets,
no threads, nothing sleeps.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from cais import dist
from cais import protocol as proto
from cais.allreduce import CollectiveKind
from cais.config import Config
from cais.controller.registry import GroupInfo

DECIDE_S = 3.0


def test_the_engine_starts_when_the_decision_arrives(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(dist.time, "monotonic", lambda: clock[0])
    config = Config(timeout_ms=50.0)
    sent = []
    pg = object.__new__(dist.ProcessGroup)
    pg.rank, pg.mac, pg.config, pg.timeout = 0, 0x020000000100, config, 60.0
    pg.port, pg._seal = SimpleNamespace(send=sent.append), None
    pg._lock, pg._next_op, pg._switch_timers = threading.Lock(), {}, {}

    def rpc(name, **fields):
        if name == "status":                      # asked once the engine runs: nobody fell back
            return {"fell_back": False}
        assert name == "decide"
        clock[0] += DECIDE_S                      # the controller programs slow switches meanwhile
        return {"decision": {"offload": True, "path": "switch", "code": "score_above_threshold", "reason": "-",
                             "score": 1.0, "threshold": 0.2, "seq_base": 0, "chunk_bytes": 256,
                             "nbytes": fields["nbytes"], "ranks": [0, 1], "kind": "int32 sum"}}

    pg._rpc = rpc
    group = GroupInfo(1, (0, 1), (0, 1), base=0, count_log2=5, rule_index=0)
    data = np.arange(64 * 40, dtype=np.int32)           # 40 chunks: a window of 32 goes out
    kind = CollectiveKind.make(proto.DType.INT32, proto.ReduceOp.SUM)
    op = dist._Op("all_reduce", SimpleNamespace(path=None), group, 0, data=data, ckind=kind, ar_seq=0,
                  state="decide", deadline=clock[0] + 60.0)
    start = clock[0]
    assert dist.ProcessGroup._step(pg, op, start) is False
    engine = op.engine
    assert op.state == "switch" and len(sent) == engine.window == 32
    # stamped when they left, after the decision: not one is due before a whole timeout has passed
    assert {engine._chunks[i].first_sent for i in range(32)} == {start + DECIDE_S}
    assert engine.next_deadline() == start + DECIDE_S + config.timeout_s
    assert engine.poll(clock[0]) == [] and engine.retransmissions == 0
