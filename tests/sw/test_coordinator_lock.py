"""The coordinator's locks (cais.coordinator.Coordinator.handle): a rank's request that does not program
the switch (ping, status, fallback, finished) is answered while other work holds the switch.

The switch here is the reference model behind a gate: while the gate is shut, every register access waits
on a threading.Event, as a slow daemon's answer would. A rank's hello that programs its job's group waits
there, holding ``switch_lock``; the other job's ranks must still be answered. Nothing sleeps: the test
waits on events, with a long safety net that only a broken coordinator reaches.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from cais.allreduce import CollectiveKind
from cais.config import Config
from cais.coordinator import Coordinator, kind_to_dict
from cais.endpoint import connect
from cais.params import SwitchParams
from cais.sim.links.model import ModelLink

SAFETY_S = 20.0      # a rank's request timeout: only a coordinator that holds the answer behind the switch
                     # reaches it (the old one did: the ping timed out)


class GatedSwitch:
    """The model's registers behind a gate: an access waits while ``gate`` is clear (``waiting`` is set
    then, so a test knows some work is stuck in the switch)."""

    backend = "model (gated)"

    def __init__(self, params: SwitchParams):
        self.model = ModelLink(params)
        self.params, self.clock_hz = params, self.model.clock_hz
        self.around_io = contextlib.nullcontext
        self.gate, self.waiting = threading.Event(), threading.Event()
        self.gate.set()
        self.accesses = 0

    def _pass(self):
        if not self.gate.is_set():
            self.waiting.set()
            assert self.gate.wait(3 * SAFETY_S), "the gate was never opened"   # outlives a rank's timeout
        self.accesses += 1

    async def read(self, addr: int) -> int:
        with self.around_io():
            self._pass()
            return self.model.read_now(addr)

    async def write(self, addr: int, value: int) -> None:
        with self.around_io():
            self._pass()
            self.model.write_now(addr, value)

    def close(self) -> None:
        self.gate.set()


def in_thread(fn):
    """Run ``fn`` in a thread; returns (done event, box holding its result or exception)."""
    done, box = threading.Event(), {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, box


@pytest.fixture
def gated(tmp_path):
    switch = GatedSwitch(SwitchParams(ports=4))
    coord = Coordinator(switch, 4, Config(offload="always"), token="t")
    address = str(tmp_path / "coord.sock")
    coord.serve(address)
    conns = []

    def rank():
        conns.append(connect(address, name="rank", token="t", timeout=SAFETY_S))
        return conns[-1]
    try:
        yield switch, coord, rank
    finally:
        switch.gate.set()
        for c in conns:
            c.close()
        coord.close()


def test_rank_requests_are_answered_while_the_switch_is_being_programmed(gated):
    switch, coord, rank = gated
    # job "a" on hosts 0 and 1, its world group programmed and its collective 0 decided (gate open)
    a0, a1 = rank(), rank()
    for r, c in enumerate((a0, a1)):
        c.request("hello", rank=r, world_size=2, job="a", hosts=[0, 1])
    gid = coord.jobs["a"].world.group_id
    assert a0.request("decide", group=gid, op_seq=0, nbytes=4000,
                      kind=kind_to_dict(CollectiveKind()))["decision"]["offload"]
    # job "b" on hosts 2 and 3: its hello programs a group, and the switch does not answer
    switch.gate.clear()
    b0 = rank()
    hello_done, hello = in_thread(lambda: b0.request("hello", rank=0, world_size=2, job="b", hosts=[2, 3]))
    assert switch.waiting.wait(SAFETY_S), "job b's hello never reached the switch"
    assert not hello_done.is_set()
    assert not coord.switch_lock.acquire(blocking=False), "the hello's thread holds the switch lock"
    accesses = switch.accesses
    # meanwhile job a's ranks are answered: a ping, the collective's status, its finish, a fall back's word
    assert a1.request("ping") == {"ok": True, "dead": []}
    st = a1.request("status", group=gid, op_seq=0)
    assert (st["fell_back"], st["all_finished"], st["ranks"]) == (False, False, [0, 1])
    a0.request("finished", rank=0, group=gid, op_seq=0, epoch=0)
    a1.request("finished", rank=1, group=gid, op_seq=0, epoch=0)
    assert a1.request("status", group=gid, op_seq=0)["all_finished"]
    assert switch.accesses == accesses and not hello_done.is_set()   # none of them went to the switch
    # the switch answers: job b's hello completes, and its group is programmed
    switch.gate.set()
    assert hello_done.wait(SAFETY_S) and "error" not in hello, hello
    assert hello["result"]["ok"] and coord.jobs["b"].world is not None
    # a request that does talk to the switch still waits for the one that holds it
    switch.gate.clear()
    switch.waiting.clear()
    decide_done, decide = in_thread(lambda: a0.request("decide", group=gid, op_seq=1, nbytes=4000,
                                                       kind=kind_to_dict(CollectiveKind())))
    assert switch.waiting.wait(SAFETY_S)
    assert a1.request("status", group=gid, op_seq=0)["all_finished"]
    switch.gate.set()
    assert decide_done.wait(SAFETY_S) and decide["result"]["decision"]["offload"]
