"""The controller: the offload score, quotas under the memory limit, threshold and warnings."""

import logging

import pytest

from cais.config import Config
from cais.controller import Controller, offload_score
from cais.link import run_sync
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.backends import ModelLink


def spy_writes(link) -> list[int]:
    """The addresses of every register write ``link`` carries from now on, in order."""
    writes = []
    real_write = link.write

    async def spy(addr, value):
        writes.append(addr)
        await real_write(addr, value)
    link.write = spy
    return writes


def test_score_hand_derived():
    # N = 4, D = 4000 B, BW = 1000 B/s, a = 1 s, Q = 0:
    # T_hosts = 2*3*(1 + 4000/4000) = 12; T_switch = 2 + 4 + 0 = 6; score = (1 - 6/12) * 3/4 = 0.375
    assert offload_score(4000, 4, 1000.0, 1.0, 0.0) == pytest.approx(0.375)
    # queueing in the switch lowers it: T_switch = 9 -> (1 - 9/12) * 3/4 = 0.1875
    assert offload_score(4000, 4, 1000.0, 1.0, 3.0) == pytest.approx(0.1875)
    # two ranks save nothing without queueing, lose with it
    assert offload_score(4000, 2, 1000.0, 1.0, 0.0) == pytest.approx(0.0)
    assert offload_score(4000, 2, 1000.0, 1.0, 1.0) < 0
    # latency-bound collectives gain most: D -> 0 gives (1 - 2a / (2(N-1)a)) (1 - 1/N) = (2/3)(3/4)
    assert offload_score(0, 4, 1000.0, 1.0, 0.0) == pytest.approx(0.5)


def make(params=SwitchParams(), **cfg):
    link = ModelLink(params)
    ctl = Controller(link, Config(**cfg), list(range(params.ports)), [0x020000000100 | p for p in range(params.ports)])
    run_sync(ctl.start())
    return link, ctl


def test_groups_get_rules_and_disjoint_quotas_until_the_memory_limit():
    params = SwitchParams(slots=64)
    link, ctl = make(params, slots_per_group=16, sram_usage_limit=0.75)   # 48 slots may be handed out
    groups = [run_sync(ctl.create_group([0, 1, 2, 3])) for _ in range(4)]
    quotas = [(g.base, g.slot_count) for g in groups[:3]]
    assert quotas == [(0, 16), (16, 16), (32, 16)]
    assert not groups[3].offloadable and "sram_usage_limit" in groups[3].why_not
    # the rules landed in the switch: a contribution of group 2 is taken into a slot, one of an unknown
    # group is dropped
    from cais import protocol as proto
    for group_id in (groups[1].group_id, 99):
        hdr = proto.CaisHeader(group_id=group_id, seq_num=0, payload_len=4)
        link.model.receive(0, proto.build_frame(hdr, bytes(4), pad=True))
    counters = link.model.counters()
    assert counters["CONTRIBUTIONS"] == 1 and counters["DROP_NO_RULE"] == 1
    d = ctl.decide(groups[3].group_id, 0, 10_000, 0.0)
    assert not d.offload and "host only" in d.reason


def test_quota_halves_to_fit():
    link, ctl = make(SwitchParams(slots=16), slots_per_group=8, sram_usage_limit=1.0)
    a = run_sync(ctl.create_group([0, 1]))
    b = run_sync(ctl.create_group([2, 3]))
    assert (a.base, a.slot_count, b.base, b.slot_count) == (0, 8, 8, 8)
    c = run_sync(ctl.create_group([0, 3]))
    assert not c.offloadable


def test_same_decision_for_every_rank_and_one_collective_at_a_time():
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1]))
    d0 = ctl.decide(g.group_id, 0, 1000, 0.0)
    assert ctl.decide(g.group_id, 0, 1000, 5.0) is d0
    assert ctl.decide(g.group_id, 1, 1000, 0.0) is None      # collective 0 is not finished everywhere
    ctl.finished(0, g.group_id, 0)
    assert ctl.decide(g.group_id, 1, 1000, 0.0) is None
    ctl.finished(1, g.group_id, 0)
    assert ctl.decide(g.group_id, 1, 1000, 0.0).offload


def test_fallback_empties_the_quota_before_the_next_collective(caplog):
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1]))
    ctl.decide(g.group_id, 0, 1000, 0.0)
    with caplog.at_level(logging.WARNING, logger="cais.controller"):
        ctl.request_fallback(g.group_id, 0, 1, 0.0, "test")
    assert ctl.fell_back(g.group_id, 0) and "falls back" in caplog.text
    ctl.finished(0, g.group_id, 0)
    ctl.finished(1, g.group_id, 0)
    assert ctl.decide(g.group_id, 1, 1000, 0.0) is None       # the quota must be emptied first
    writes = spy_writes(link)
    run_sync(ctl.service(0.0))
    assert writes.count(register_map(link.params)["SLOT_CLEAR"].address()) == g.slot_count
    assert ctl.decide(g.group_id, 1, 1000, 0.0) is not None


def test_threshold_rises_under_memory_pressure_and_fallbacks_warn(caplog):
    link, ctl = make(offload_threshold=0.2)
    g = run_sync(ctl.create_group([0, 1, 2, 3]))
    counters = run_sync(ctl.read_counters())

    async def pressured():
        return dict(counters, SLOTS_IN_USE=int(0.9 * 2 * link.params.slots))
    ctl.read_counters = pressured
    run_sync(ctl.evaluate(0.1))
    run_sync(ctl.evaluate(0.2))
    assert ctl.threshold == pytest.approx(0.3)
    assert ctl.stats()["sram_usage"] == pytest.approx(0.9, abs=0.01)

    async def relaxed():
        return counters
    ctl.read_counters = relaxed
    run_sync(ctl.evaluate(0.3))
    assert ctl.threshold == pytest.approx(0.25)
    # two offloaded collectives, one fell back: 50% > 10% -> a warning
    for op in (0, 1):
        ctl._ops.pop((g.group_id, op), None)
    ctl.config = Config(offload="always")
    ctl.decide(g.group_id, 0, 1000, 0.0)
    for r in range(4):
        ctl.finished(r, g.group_id, 0)
    ctl.decide(g.group_id, 1, 1000, 0.0)
    ctl.request_fallback(g.group_id, 1, 0, 0.0, "test")
    with caplog.at_level(logging.WARNING, logger="cais.controller"):
        stats = run_sync(ctl.evaluate(0.4))
    assert stats["fallback_ratio"] == pytest.approx(0.5)
    assert "fallback ratio 50%" in caplog.text


def test_start_refuses_a_link_without_a_switch():
    class Nothing(ModelLink):
        async def read(self, addr):
            return 0
    link = Nothing(SwitchParams())
    ctl = Controller(link, Config(), [0, 1, 2, 3], [1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="no CAIS switch"):
        run_sync(ctl.start())


# ---------------------------------------------------------------- typed rules
from cais import protocol as proto  # noqa: E402
from cais.allreduce import CollectiveKind  # noqa: E402


def _frame(group_id, kind, seq=0, plen=4):
    hdr = proto.CaisHeader(group_id=group_id, seq_num=seq, payload_len=plen, dtype=kind.dtype, red_op=kind.op)
    return proto.build_frame(hdr, bytes(plen), pad=True)


def test_features_read_at_start():
    for units in (True, False):
        _, ctl = make(SwitchParams(float_units=units))
        assert ctl.float_units is units and ctl.reproducible
        assert (proto.DType.FP32 in ctl.dtypes) is units and proto.DType.INT8 in ctl.dtypes


def test_the_switch_features_win_over_the_configured_parameters():
    class NoFold(ModelLink):          # a switch whose FEATURES says: no reproducible rules
        async def read(self, addr):
            value = await super().read(addr)
            features = register_map(self.params)["FEATURES"]
            return value & ~features.field("reproducible").mask if addr == features.address() else value
    link = NoFold(SwitchParams())     # configured with the fold
    ctl = Controller(link, Config(offload="always"), [0, 1, 2, 3], [1, 2, 3, 4])
    run_sync(ctl.start())
    fp32 = CollectiveKind.make(proto.DType.FP32, proto.ReduceOp.SUM, reproducible=True)
    assert not ctl.reproducible and ctl.capacity(fp32) == 0
    g = run_sync(ctl.create_group([0, 1, 2, 3]))
    d = ctl.decide(g.group_id, 0, 100, 0.0, fp32)
    assert not d.offload and "FEATURES.reproducible = 0" in d.reason


def test_rule_retyped_before_a_collective_of_another_kind():
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1, 2, 3]))
    int_sum = CollectiveKind()
    assert ctl.decide(g.group_id, 0, 4000, 0.0, int_sum).offload     # the rule's kind already: no wait
    for r in range(4):
        ctl.finished(r, g.group_id, 0)
    fp16 = CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.SUM, acc_fp32=True, reproducible=True)
    assert ctl.decide(g.group_id, 1, 4000, 0.0, fp16) is None            # held: the rule is retyped first
    assert ctl.pending
    writes = spy_writes(link)
    run_sync(ctl.service(0.0))
    regs = register_map(link.params)
    assert regs["RULE_TYPE"].address() in writes and regs["RULE_WRITE"].address() in writes
    assert writes.count(regs["SLOT_CLEAR"].address()) == g.slot_count     # new accumulator layout
    d = ctl.decide(g.group_id, 1, 4000, 0.0, fp16)
    assert d.offload and not ctl.pending and d.kind == fp16 and ctl.retypes == 1
    # chunks: every kind's set holds max_payload (256) bytes, each port's contribution in its own bank;
    # seq after op 0's
    assert d.chunk_bytes == 256
    assert ctl.capacity(CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.SUM, reproducible=True)) == 256
    assert d.seq_base == -(-4000 // 256)
    # the switch takes the new kind and refuses the old one
    link.model.receive(0, _frame(g.group_id, fp16, seq=d.seq_base))
    link.model.receive(1, _frame(g.group_id, int_sum, seq=d.seq_base))
    c = link.model.counters()
    assert c["DROP_TYPE_MISMATCH"] == 1
    # an operator change alone keeps the slots
    for r in range(4):
        ctl.finished(r, g.group_id, 1)
    fp16_max = CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.MAX, reproducible=True)
    assert ctl.decide(g.group_id, 2, 100, 0.0, fp16_max) is None
    writes.clear()
    run_sync(ctl.service(0.0))
    assert regs["SLOT_CLEAR"].address() in writes      # acc_fp32 went away: another layout
    for r in range(4):
        ctl.finished(r, g.group_id, 2)
    fp16_min = CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.MIN, reproducible=True)
    assert ctl.decide(g.group_id, 3, 100, 0.0, fp16_min) is None
    writes.clear()
    run_sync(ctl.service(0.0))
    assert regs["SLOT_CLEAR"].address() not in writes and regs["RULE_WRITE"].address() in writes


def test_retype_waits_for_an_idle_switch():
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1]))
    link.send(0, _frame(g.group_id, CollectiveKind()))                     # a frame still on its way
    assert ctl.decide(g.group_id, 0, 100, 0.0, CollectiveKind.make(proto.DType.INT8, proto.ReduceOp.MAX)) is None
    run_sync(ctl.service(0.0))
    assert ctl.pending                                                       # not yet: the switch is busy
    run_sync(link.advance(1000))
    run_sync(ctl.service(0.0))
    assert not ctl.pending and ctl.decide(g.group_id, 0, 100, 0.0) is not None
    assert link.model.counters()["DROP_TYPE_MISMATCH"] == 0                 # the old frame met the old rule


def test_a_waiting_retype_holds_new_collectives_until_the_switch_drains():
    link, ctl = make(offload="always")
    a = run_sync(ctl.create_group([0, 1]))
    b = run_sync(ctl.create_group([2, 3]))
    db = ctl.decide(b.group_id, 0, 100, 0.0)                               # rank 2 has its answer
    link.send(2, _frame(b.group_id, CollectiveKind()))                     # and sends: the switch is busy
    int8_max = CollectiveKind.make(proto.DType.INT8, proto.ReduceOp.MAX)
    assert ctl.decide(a.group_id, 0, 100, 0.0, int8_max) is None           # held for the retype
    assert ctl.pending_work() == [f"group {a.group_id}: rule waits for an idle switch to be retyped to int8 max"]
    assert ctl.decide(b.group_id, 0, 100, 0.0) is db                       # rank 3 gets the same answer
    for r in (2, 3):
        ctl.finished(r, b.group_id, 0)
    assert ctl.decide(b.group_id, 1, 100, 0.0) is None                     # a new collective waits: no new
    run_sync(ctl.service(0.0))                                             # traffic keeps the switch busy
    assert ctl.pending
    run_sync(link.advance(1000))
    run_sync(ctl.service(0.0))
    assert not ctl.pending
    assert ctl.decide(a.group_id, 0, 100, 0.0, int8_max).offload and ctl.decide(b.group_id, 1, 100, 0.0).offload


def test_kinds_the_switch_cannot_reduce_stay_on_the_hosts():
    # no float units
    _, ctl = make(SwitchParams(float_units=False), offload="always")
    g = run_sync(ctl.create_group([0, 1]))
    d = ctl.decide(g.group_id, 0, 100, 0.0, CollectiveKind.make(proto.DType.FP32, proto.ReduceOp.SUM))
    assert not d.offload and "float units" in d.reason and not ctl.pending


def test_kind_normalisation():
    k = CollectiveKind.make(proto.DType.INT32, proto.ReduceOp.SUM, acc_fp32=True, saturate=True, reproducible=True)
    assert k == CollectiveKind()                         # none of the flags changes an int32 wrap sum
    k = CollectiveKind.make(proto.DType.INT8, proto.ReduceOp.SUM, saturate=True, reproducible=True)
    assert k.saturate and k.reproducible
    k = CollectiveKind.make(proto.DType.BF16, proto.ReduceOp.MAX, acc_fp32=True, reproducible=True)
    assert not k.acc_fp32 and k.reproducible
    assert str(CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.SUM, acc_fp32=True)) == "fp16 sum acc_fp32"
