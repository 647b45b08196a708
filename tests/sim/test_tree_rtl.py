"""The uplink action on the Verilated RTL (docs/protocol.md section 13), against the reference model.

The hop-by-hop cases of ``test_tree_model.py`` run again with every switch a :class:`Twin`: the reference
model and the Verilated RTL (the C++-driven link, one build of ``SwitchParams(uplink=True)``, the tree's
4-port leaf, shared by every test here) side by side. Each frame goes into both; the frames the RTL sends
must be the model's, frame for frame, and its counters the model's after every frame. The cases' own
expectations (frames built with struct, sums with numpy) then hold for the RTL as well.
"""

from __future__ import annotations

import numpy as np
import pytest

import test_tree_model as cases
from cais.link import run_sync
from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, Kind, register_map
from cais.sim.links.base import read_counters, wait_idle
from cais.sim.refmodel import SwitchModel

pytestmark = pytest.mark.verilator

TREE = cases.TREE


class Twin:
    """A switch that is the reference model and the Verilated RTL at once (module docstring): ``receive``,
    ``write`` and ``counters`` go to both and are compared; anything else is the model's."""

    def __init__(self, params: SwitchParams = TREE):
        from cais.sim.links.verilator import VerilatorLink
        self.model = SwitchModel(params)
        self.link = VerilatorLink(params)
        self.regmap = register_map(params)
        self.frames = 0

    def close(self):
        self.link.close()

    def __getattr__(self, name):
        return getattr(self.model, name)

    def write(self, addr: int, value: int) -> None:
        self.model.write(addr, value)
        run_sync(self.link.write(addr, value))

    def read(self, addr: int) -> int:
        return run_sync(self.link.read(addr))

    def _settle(self) -> None:
        assert run_sync(wait_idle(self.link, limit=self.link.cycle + 20_000)), "the RTL did not go idle"

    def receive(self, port: int, frame: bytes, **kw):
        want = self.model.receive(port, frame, **kw)
        self.link.send(port, frame)
        self._settle()
        got = sorted(self.link.take_received())
        self.frames += 1
        assert got == sorted(want), f"frame {self.frames} on port {port}: the RTL sent {got}, the model {want}"
        self._check_counters()
        return want

    def _check_counters(self):
        got = run_sync(read_counters(self.link))
        want = {k: v for k, v in self.model.counters().items() if self.regmap[k].kind is Kind.COUNTER}
        diff = {k: (got[k], v) for k, v in want.items() if got[k] != v}
        assert not diff, f"after frame {self.frames}: counters (RTL, model) differ: {diff}"

    def counters(self):
        self._check_counters()
        return self.model.counters()


@pytest.fixture
def twins(monkeypatch):
    """The model cases' ``SwitchModel`` replaced by :class:`Twin` while a test runs."""
    made = []

    def make(params=TREE):
        made.append(Twin(params))
        return made[-1]

    monkeypatch.setattr(cases, "SwitchModel", make)
    yield made
    for t in made:
        t.close()


CASES = [
    "test_a_filled_leaf_sends_one_partial_up_and_keeps_it",
    "test_a_repeat_while_waiting_sends_the_partial_again_not_added",
    "test_the_parents_result_goes_to_every_rank_and_the_set_is_done",
    "test_a_result_for_a_set_that_did_not_send_is_refused",
    "test_results_come_only_from_the_uplink_port",
    "test_a_rule_without_the_uplink_action_refuses_the_parents_result",
    "test_the_leaf_passes_all_gather_frames_up_and_down",
    "test_two_leaves_and_a_spine_every_rank_gets_the_sum",
    "test_a_lost_upstream_partial_is_sent_again_on_a_ranks_repeat",
    "test_a_lost_downstream_result_is_re_served_by_the_parent",
    "test_a_stale_partial_is_kept_out_by_the_tag",
    "test_floats_fold_in_the_documented_order",
    "test_three_levels_a_middle_switch_is_a_parent_and_a_leaf",
]


@pytest.mark.parametrize("name", CASES)
def test_the_model_case_on_the_rtl(twins, name):
    getattr(cases, name)()
    assert twins and sum(t.frames for t in twins) > 0      # the RTL saw every frame of the case


@pytest.mark.parametrize("why", ["UPLINK.enable 0"])
def test_without_the_uplink_on_an_uplink_rule_completes_locally_on_the_rtl(twins, why):
    cases.test_without_the_uplink_on_an_uplink_rule_completes_locally(why)


def test_the_rtl_reports_the_uplink_feature():
    t = Twin()
    try:
        features = t.regmap["FEATURES"].unpack(t.read(t.regmap["FEATURES"].address()))
        assert features["uplink"] == 1
    finally:
        t.close()


def test_a_sent_set_is_not_aged_on_the_rtl(twins):
    """AGING on an RTL leaf: the sent set of seq 0 is never aged; seq 1's set, missing rank 2, is, within
    the documented bound (age units plus one scan period of 2 x slots units)."""
    m = cases.switch(cases.RANKS, uplink=cases.UP, count_log2=1)
    m.write(cases.RM["AGING"].address(), cases.RM["AGING"].pack(age=1, free=0))
    cases.filled(m)
    for p in range(2):
        m.receive(p, cases.contribution(cases.X[p], p, seq=1))
    bound = (1 + 2 * TREE.slots + 2) << AGE_UNIT_LOG2
    run_sync(m.link.advance(bound))
    rm = cases.RM
    assert m.read(rm["AGED_TOTAL"].address()) == 1
    event = rm["AGED_EVENT"].unpack(m.read(rm["AGED_EVENT"].address()))
    assert (event["valid"], event["slot"], event["set"]) == (1, 1, 0)
    assert rm["AGED_PORTS"].unpack(m.read(rm["AGED_PORTS"].address()))["ports"] == 0b011
    # the sent set still takes its parent's result
    total = [1, 2, 3, 4]
    assert m.link.take_received() == []
    m.link.send(cases.UP, cases.result(total))
    m._settle()
    assert sorted(m.link.take_received()) == [(p, cases.result(total)) for p in range(3)]


def test_a_faulty_tree_on_rtl_leaves():
    """2 leaves of 3 ranks on the Verilated RTL (this module's build, the 4-port leaf) under the RTL spine
    (the default build), 60 chunks, 5% loss + 5% duplication + 5% reordering on every hop and on the ranks'
    wires: every rank's result equals numpy's sum, and every switch's counters are conserved (each leaf
    60 x (3 + 1) CONTRIBUTIONS, 60 PARTIALS_SENT, every switch 60 COMPLETED)."""
    from cais.sim.tree import run_tree
    s = run_tree({"leaves": 2, "ranks_per_leaf": 3, "elements": 64 * 60, "seed": 3, "loss": 0.05,
                  "duplicate": 0.05, "reorder": 0.05, "leaf_backend": "verilator", "spine_backend": "verilator"})
    t = s["tree"]
    assert (t["leaf_backend"], t["spine_backend"]) == ("verilator", "verilator")
    assert s["routes"] == ["switch native"] and t["built"]
    assert t["chunks"] == 60 and t["conservation"] == [] and t["unwired"] == 0
    assert all(t["hop_faults"][k] for k in ("dropped", "duplicated", "reordered"))
    leaves = t["switch_counters"][:2]
    assert all(c["PARTIALS_RESENT"] for c in leaves)       # the leaves' a' case happened
    assert s["correct"]


def test_back_to_back_chunks_through_a_leaf_pipeline():
    """Frames in flight together: each batch sends the three ranks' contributions of chunk t and the
    parent's result of chunk t - 1 at once (an outcome that does not depend on their order), so the
    slot-state pipeline forwards sent bits between headers a cycle apart; count_log2 1 (chunks alternate
    between two slots, each chunk's set shared with chunk t - 4). The RTL's frames of each batch are the
    model's (as multisets), and its counters after every batch."""
    t = Twin()
    try:
        rm = cases.RM
        for addr, value in cases.rule_writes(rm, 0, cases.Rule.for_group(1, cases.RANKS, base=0, count_log2=1,
                                                                        uplink=True)):
            t.write(addr, value)
        t.write(rm["UPLINK"].address(), rm["UPLINK"].pack(port=cases.UP, enable=1))
        rng = np.random.default_rng(5)
        chunks = 12
        data = rng.integers(-2**31, 2**31, size=(chunks, 3, 16), dtype=np.int64)
        for seq in range(chunks + 1):
            batch = [(p, cases.contribution(data[seq][p], p, seq)) for p in range(3)] if seq < chunks else []
            if seq:
                # the parent's result of the chunk before: its partial times 2 (the other leaf's the same)
                batch.append((cases.UP, cases.result(cases.wrap32(2 * data[seq - 1].sum(axis=0)), seq=seq - 1)))
            want = [f for port, frame in batch for f in t.model.receive(port, frame)]
            for port, frame in batch:
                t.link.send(port, frame)
            t._settle()
            got = t.link.take_received()
            assert sorted(got) == sorted(want), f"chunk {seq}"
            partials = [f for p, f in want if p == cases.UP]
            results = [f for p, f in want if p != cases.UP]
            assert len(partials) == (seq < chunks) and len(results) == 3 * (seq > 0)
            t._check_counters()
        c = t.counters()
        assert (c["PARTIALS_SENT"], c["COMPLETED"], c["CONTRIBUTIONS"]) == (chunks, chunks, 4 * chunks)
    finally:
        t.close()
