"""The controller: the offload score, quotas under the memory limit, threshold and warnings."""

import logging

import pytest

from cais.config import Config
from cais import controller as ctl_mod
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
        ctl.registry.ops.pop((g.group_id, op), None)
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


def test_a_waiting_retype_holds_only_its_own_group():
    """Issue 12: retyping group a's rule waits for a's frames, not for the whole switch to drain."""
    link, ctl = make(offload="always")
    a = run_sync(ctl.create_group([0, 1]))
    b = run_sync(ctl.create_group([2, 3]))
    db = ctl.decide(b.group_id, 0, 100, 0.0)                               # rank 2 has its answer
    link.send(2, _frame(b.group_id, CollectiveKind()))                     # and sends: the switch is busy
    int8_max = CollectiveKind.make(proto.DType.INT8, proto.ReduceOp.MAX)
    assert ctl.decide(a.group_id, 0, 100, 0.0, int8_max) is None           # held for the retype
    assert ctl.pending_work() == [f"group {a.group_id}: rule waits for the group's frames to drain to be "
                                  "retyped to int8 max"]
    assert ctl.decide(b.group_id, 0, 100, 0.0) is db                       # rank 3 gets the same answer
    for r in (2, 3):
        ctl.finished(r, b.group_id, 0)
    assert ctl.decide(b.group_id, 1, 100, 0.0).offload                     # b goes on while a waits
    run_sync(ctl.service(0.0))
    assert ctl.pending                                                     # busy, a's drain time not over

    async def never_idle():                                                # other groups' traffic goes on
        return False
    ctl.switch_idle = never_idle
    ctl.report_rtts([3 * ctl.config.timeout_s])                           # a slow round trip: a longer bound
    drain = ctl_mod.DRAIN_TIMEOUTS * 3 * ctl.config.timeout_s
    assert ctl.drain_time() == pytest.approx(drain)
    run_sync(ctl.service(drain * 0.99))
    assert ctl.pending
    run_sync(ctl.service(drain))                                           # a's frames are out by now
    assert not ctl.pending
    assert ctl.decide(a.group_id, 0, 100, drain, int8_max).offload
    assert ctl.group_counters(a.group_id)["kind"] == "int8 max"


def test_alerts_fire_once_and_clear_once(caplog):
    """One event when the fallback ratio goes above 10% and one when it is back, not one per evaluation."""
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1]))
    ctl.decide(g.group_id, 0, 1000, 0.0)
    ctl.request_fallback(g.group_id, 0, 0, 0.0, "test")
    for r in (0, 1):
        ctl.finished(r, g.group_id, 0)
    run_sync(ctl.service(0.0))                                            # the quota emptied
    with caplog.at_level(logging.INFO, logger="cais.controller"):
        for t in range(1, 21):
            run_sync(ctl.evaluate(0.1 * t))
    fired = [e for _, e in ctl.events if e.startswith("ALERT fallback_ratio")]
    assert len(fired) == 1 and "100% exceeds 10%" in fired[0]
    assert caplog.text.count("ALERT fallback_ratio") == 1
    # good collectives: at 1 in 10 (10% <= 10%) it clears, once
    for op in range(1, 11):
        assert ctl.decide(g.group_id, op, 1000, 3.0).offload
        for r in (0, 1):
            ctl.finished(r, g.group_id, op)
        run_sync(ctl.evaluate(3.0 + op))
    cleared = [e for _, e in ctl.events if e.startswith("CLEARED fallback_ratio")]
    assert len(cleared) == 1 and "fallback ratio 10% back" in cleared[0]
    assert len([e for _, e in ctl.events if "fallback_ratio" in e]) == 2
    alert = next(a for a in ctl.stats()["alerts"] if a["name"] == "fallback_ratio")
    assert (alert["active"], alert["fired"], alert["cleared"]) == (False, 1, 1)


def test_bytes_reduced_counts_the_bytes_actually_reduced():
    """fp16 collectives reduce 2-byte elements in chunks of their own size: the bytes reduced are the bytes
    the collectives carried through the switch, not completed chunks x chunk_size; totals by path only grow
    (what Prometheus' rate() takes), so an evaluation after the run still shows them."""
    link, ctl = make(offload="always", chunk_size=256)
    g = run_sync(ctl.create_group([0, 1, 2, 3]))
    fp16 = CollectiveKind.make(proto.DType.FP16, proto.ReduceOp.SUM, acc_fp32=True)
    run_sync(ctl.evaluate(1.0))
    assert ctl.decide(g.group_id, 0, 3000, 1.0, fp16) is None             # retype first
    run_sync(ctl.service(1.0))
    d = ctl.decide(g.group_id, 0, 3000, 1.0, fp16)
    for r in range(4):
        ctl.finished(r, g.group_id, 0)
    stats = run_sync(ctl.evaluate(3.0))
    assert stats["bytes_by_path"] == {"switch": 3000, "fallback": 0, "host": 0}
    assert stats["collectives_by_path"] == {"switch": 1, "fallback": 0, "host": 0}
    assert run_sync(ctl.evaluate(9.0))["bytes_by_path"]["switch"] == 3000      # no new bytes: the total stays
    chunks = -(-3000 // d.chunk_bytes)
    gc = stats["groups"][g.group_id]
    assert (gc["completions"], gc["contributions"], gc["bytes_reduced"]) == (chunks, 4 * chunks, 3000)
    assert stats["collective_latency_s"]["count"] == 1


def test_operator_rules_are_checked_and_dumped():
    from cais.tables import Rule
    link, ctl = make(SwitchParams(slots=64), slots_per_group=16)
    g = run_sync(ctl.create_group([0, 1]))
    writes = spy_writes(link)
    for rule, index, why in [
            (Rule.for_group(200, 0b11, base=48, count_log2=2), g.rule_index, "belongs to group"),
            (Rule.for_group(200, 0b11, base=8, count_log2=2), 5, "overlap group"),
            (Rule.for_group(200, 0b11, base=62, count_log2=2), 5, "beyond the switch's 64 slots"),
            (Rule(group=(0, 0), contributors=1, base=48), 5, "would take group"),
            (Rule.for_group(200, 1 << 20, base=48), 5, "contributors"),
            (Rule.for_group(200, 0b11, base=48), 99, "not in 0..")]:
        with pytest.raises(ValueError, match=why):
            run_sync(ctl.add_rule(index, rule))
    assert writes == []                                                     # refused: nothing written
    rule = Rule.for_group(200, 0b11, base=48, count_log2=2)
    run_sync(ctl.add_rule(5, rule))
    with pytest.raises(ValueError, match="exists"):
        run_sync(ctl.add_rule(5, rule))
    assert [(i, o) for i, o, _ in ctl.dump_rules()] == [(g.rule_index, f"group {g.group_id}"), (5, "operator")]
    # the rule is in the switch: a contribution of group 200 on port 0 takes a set
    link.model.receive(0, _frame(200, CollectiveKind()))
    assert link.model.counters()["CONTRIBUTIONS"] == 1
    h = run_sync(ctl.create_group([2, 3]))                                  # skips the operator's slots
    assert not (48 <= h.base < 52) and h.rule_index != 5
    with pytest.raises(ValueError, match="goes with the group"):
        run_sync(ctl.del_rule(g.rule_index))
    assert run_sync(ctl.del_rule(5)) == rule
    with pytest.raises(KeyError):
        run_sync(ctl.del_rule(5))


def test_a_new_controller_adopts_the_groups_the_ranks_re_register():
    link, ctl = make(offload="always")
    g = run_sync(ctl.create_group([0, 1, 2]))
    d = ctl.decide(g.group_id, 0, 4000, 0.0)
    for r in range(3):
        ctl.finished(r, g.group_id, 0)
    # a restart: a new controller on the same switch, the ranks tell it what they hold
    new = Controller(link, ctl.config, list(range(link.params.ports)), ctl.rank_macs)
    run_sync(new.start())
    info = run_sync(new.adopt_group(g.group_id, [0, 1, 2], g.base, g.count_log2, g.rule_index, g.next_seq, 1))
    assert (info.base, info.slot_count, info.rule_index, info.next_seq) == (g.base, g.slot_count, g.rule_index,
                                                                            d.seq_base + -(-4000 // d.chunk_bytes))
    with pytest.raises(ValueError, match="differently"):
        run_sync(new.adopt_group(g.group_id, [0, 1], g.base, g.count_log2, g.rule_index, 0, 1))
    d1 = new.decide(g.group_id, 1, 4000, 0.0)                              # collective 0 was before it
    assert d1.offload and d1.seq_base == info.next_seq - -(-4000 // d1.chunk_bytes)
    assert run_sync(new.create_group([0, 1])).group_id != g.group_id


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


def test_per_group_counters_add_up_to_the_switch_counters():
    """The controller's per-group accounting against what the switch itself counted: two groups, three
    element types, no loss: the groups' completions and contributions sum to COMPLETED and CONTRIBUTIONS."""
    import numpy as np
    from cais.comm import World
    link = ModelLink(SwitchParams())
    world = World(link, ranks=4, config=Config(offload="always"))
    before = link.model.counters()

    def fn(comm):
        pair = comm.new_group([0, 1]) if comm.rank in (0, 1) else None
        comm.all_reduce(np.arange(700, dtype=np.int32) + comm.rank)
        comm.all_reduce(np.ones(300, dtype=np.float16), op="max")
        if pair is not None:
            comm.all_reduce(np.arange(1000, dtype=np.int32), group=pair)
        return comm.rank

    run_sync(world.run(fn))
    after = link.model.counters()
    groups = [world.controller.group_counters(g) for g in sorted(world.controller.groups)]
    assert [g["collectives"] for g in groups] == [2, 1] and all(g["fell_back"] == 0 for g in groups)
    assert sum(g["completions"] for g in groups) == after["COMPLETED"] - before["COMPLETED"] > 0
    assert sum(g["contributions"] for g in groups) == after["CONTRIBUTIONS"] - before["CONTRIBUTIONS"]
    world_group, pair = groups
    assert pair["contributions"] == 2 * pair["completions"] == 2 * -(-4000 // 256)
    assert world_group["bytes_reduced"] == 700 * 4 + 300 * 2


def model_sets_in_use(model, base, count) -> int:
    """The non-empty sets of a quota, counted from the model's slot state (independent of SETS_IN_USE)."""
    return sum(bool(bitmap) for slot in range(base, base + count) for bitmap, _, _ in model.slot_state(slot))


async def sets_in_use_job(link) -> list[dict]:
    """Two groups on their own ports; group A gets a half-done chunk (one of its two ports contributed),
    group B two complete chunks and a third half done; then B's ports move past chunks 0 and 1 (chunks 8
    and 9 use the other sets of their slots). The controller's per-group counters after each phase."""
    from cais import protocol as proto
    from cais.sim.links.base import wait_idle
    ctl = Controller(link, Config(slots_per_group=8), [0, 1, 2, 3], [0x020000000100 | p for p in range(4)])
    await ctl.start()
    a, b = await ctl.create_group([0, 1]), await ctl.create_group([2, 3])

    async def phase(frames):
        for port, group, seq in frames:
            hdr = proto.CaisHeader(group_id=group.group_id, seq_num=seq, payload_len=4)
            link.send(port, proto.build_frame(hdr, bytes(4), src=0x020000000100 | port, pad=True))
        assert await wait_idle(link, limit=link.cycle + 20_000)
        link.take_received()
        st = await ctl.evaluate(link.cycle / link.clock_hz)
        return {"a": st["groups"][a.group_id], "b": st["groups"][b.group_id], "total": st["counters"]["SLOTS_IN_USE"],
                "quotas": [(a.base, a.slot_count), (b.base, b.slot_count)]}
    first = await phase([(0, a, 0)] + [(p, b, seq) for seq in (0, 1) for p in (2, 3)] + [(3, b, 2)])
    second = await phase([(p, b, seq) for seq in (8, 9) for p in (2, 3)])
    return [first, second]


@pytest.mark.parametrize("backend", ["model", pytest.param("verilator", marks=pytest.mark.verilator)])
def test_sets_in_use_per_group_hand_derived(backend):
    """Sets in use per group (SETS_IN_USE of the group's rule entry), hand-derived: A 1, B 3 (a complete
    set stays in use until its ports move past it), adding up to SLOTS_IN_USE; after B's ports moved past
    its complete chunks, B still 3 (chunks 8 and 9 complete, chunk 2 half done). On the model also against
    the sets counted from its slot state."""
    from cais.sim.backends import run_model
    box = {}

    async def main(link):
        box["link"] = link
        return await sets_in_use_job(link)
    if backend == "model":
        phases = run_model(SwitchParams(ports=4), main)
    else:
        from cais.sim.links.verilator import run_verilator
        phases = run_verilator(SwitchParams(ports=4), main)
    (first, second) = phases
    assert (first["a"]["sets_in_use"], first["b"]["sets_in_use"], first["total"]) == (1, 3, 4)
    assert first["b"]["sets_allocated"] == 16 and first["a"]["sets_aged"] == 0
    assert (second["a"]["sets_in_use"], second["b"]["sets_in_use"], second["total"]) == (1, 3, 4)
    if backend == "model":
        model = box["link"].model
        (abase, acount), (bbase, bcount) = second["quotas"]
        assert model_sets_in_use(model, abase, acount) == 1 and model_sets_in_use(model, bbase, bcount) == 3


def test_aging_programmed_from_the_configured_age_and_the_clock():
    """AGING.age = set_age_ms at the link's clock in AGE_UNIT cycles, rounded up, with free; 0 turns it
    off; an age the 16-bit field cannot hold is refused naming the key and the largest age."""
    from cais.registers import register_map
    regs = register_map(SwitchParams())
    for ms, clock in ((250.0, 156.25e6), (2.0, 100e6), (0.0, 156.25e6)):
        link = ModelLink(SwitchParams(), clock_hz=clock)
        ctl = Controller(link, Config(set_age_ms=ms), [0, 1, 2, 3], [1, 2, 3, 4])
        run_sync(ctl.start())
        f = regs["AGING"].unpack(run_sync(link.read(regs["AGING"].address())))
        unit = run_sync(link.read(regs["AGE_UNIT"].address()))
        want = -(-round(ms / 1000 * clock) // unit)
        assert (f["age"], f["free"]) == (want, int(ms > 0))
        if ms:
            assert (f["age"] - 1) * unit < ms / 1000 * clock <= f["age"] * unit
    assert want == 0
    link = ModelLink(SwitchParams())
    with pytest.raises(ValueError, match=r"set_age_ms=500: at most 429\.\d ms"):
        run_sync(Controller(link, Config(set_age_ms=500.0), [0], [1]).start())


def test_removed_group_frees_rule_slots_and_its_collectives():
    """A group removed (its job ended) with a collective fallen back and its cleanup pending: its rule
    entry is invalid in the switch (a contribution of it is dropped), its slots and rule go to the next
    group, and no pending work of it is left."""
    from cais import protocol as proto
    link, ctl = make(SwitchParams(slots=16), slots_per_group=8, sram_usage_limit=1.0, offload="always")
    a = run_sync(ctl.create_group([0, 1]))
    b = run_sync(ctl.create_group([2, 3]))
    assert ctl.slots_allocated == 16
    assert ctl.decide(a.group_id, 0, 4000, 0.0).offload
    ctl.request_fallback(a.group_id, 0, 0, 0.0, "test")
    ctl.finished(0, a.group_id, 0)
    ctl.finished(1, a.group_id, 0)
    assert ctl.pending                                   # its slots wait to be emptied
    run_sync(ctl.remove_group(a.group_id))
    assert not ctl.pending and ctl.slots_allocated == 8
    assert not any(g == a.group_id for g, _ in ctl.registry.ops)
    hdr = proto.CaisHeader(group_id=a.group_id, seq_num=0, payload_len=4)
    link.model.receive(0, proto.build_frame(hdr, bytes(4), pad=True))
    assert link.model.counters()["DROP_NO_RULE"] == 1     # its rule entry is gone from the switch
    c = run_sync(ctl.create_group([0, 1]))
    assert (c.base, c.slot_count, c.rule_index) == (a.base, a.slot_count, a.rule_index)
    run_sync(ctl.service(10.0))                          # nothing of the removed group is done any more
    assert sorted(ctl.groups) == sorted([b.group_id, c.group_id])


def test_counter_extender_adds_the_modular_difference_across_a_wrap():
    """Hand-made reads of a 32-bit counter: 10, 2**32 - 6, 4 (a wrap: +10), 4, then a switch reset (the
    register restarts at 0) and 7: the total is the sum of the true increments."""
    from cais.controller import CounterExtender
    regs = register_map(SwitchParams(ports=2))
    ext = CounterExtender(regs)
    totals = []
    for raw, reset in ((10, False), (2**32 - 6, False), (4, False), (4, False), (7, True)):
        if reset:
            ext.rebase()
        out = ext.extend({"RX_FRAMES": [raw, 0], "DROP_NO_RULE": raw, "SLOTS_IN_USE": raw})
        assert out["SLOTS_IN_USE"] == raw                          # a level is not a counter: as read
        totals.append(out["RX_FRAMES"][0])
        assert out["DROP_NO_RULE"] == out["RX_FRAMES"][0] and out["RX_FRAMES"][1] == 0
    assert totals == [10, 2**32 - 6, 2**32 + 4, 2**32 + 4, 2**32 + 11]


def test_controller_counters_go_past_2_to_the_32():
    """The model's RX_FRAMES register set just below 2**32, then 5 real frames wrap it: the controller's
    statistics and its per-port counters keep counting (2**32 - 2 + 5), as the raw register reads 3."""
    from cais import protocol as proto
    link, ctl = make()
    run_sync(ctl.evaluate(0.0))
    link.model._counters["RX_FRAMES"][1] = 2**32 - 2
    assert run_sync(ctl.evaluate(1.0))["ports"][1]["rx_frames"] == 2**32 - 2
    for _ in range(5):
        link.model.receive(1, proto.build_frame(proto.CaisHeader(group_id=99, seq_num=0, payload_len=4), bytes(4),
                                                pad=True))
    assert run_sync(ctl.read_counters())["RX_FRAMES"][1] == 3           # the register wrapped
    st = run_sync(ctl.evaluate(2.0))
    assert st["ports"][1]["rx_frames"] == 2**32 + 3 and st["counters"]["RX_FRAMES"][1] == 2**32 + 3
    assert st["drops"]["NO_RULE"] == 5


def test_every_rank_logs_each_decision_with_its_reason(caplog):
    """A small job on the in-process world (the model), offload=auto: every rank logs, at INFO, each
    decision it gets with the path, the reason code, the score and the threshold; the controller's record
    says the same."""
    import re

    import numpy as np

    from cais.comm import World

    def job(comm):
        return [comm.all_reduce(np.full(n, comm.rank + 1, np.int32)) for n in (64, 4096, 64)]

    world = World(ModelLink(SwitchParams(ports=4)), config=Config(timeout_ms=0.05))
    with caplog.at_level(logging.INFO, logger="cais.comm"):
        results = run_sync(world.run(job))
    for out in results:
        for x, n in zip(out, (64, 4096, 64)):
            np.testing.assert_array_equal(x, np.full(n, 1 + 2 + 3 + 4, np.int32))
    lines = [r.getMessage() for r in caplog.records if r.name == "cais.comm" and r.levelno == logging.INFO]
    pattern = re.compile(r"rank (\d): group (\d+) collective (\d+) \((\d+) B\) -> (switch|host) \[(\w+)\] "
                         r"score (-?[\d.]+) threshold ([\d.]+): (.*)")
    seen = sorted((int(m[1]), int(m[3]), m[5], m[6], float(m[7])) for m in map(pattern.fullmatch, lines) if m)
    assert len(seen) == len(lines) == 4 * 3, lines
    want = sorted((rank, op, d.path, d.code.value, round(d.score, 3)) for rank in range(4)
                  for _, _, op, d in world.controller.decisions)
    assert seen == want
    assert all(code in ("score_above_threshold", "score_below_threshold") for *_, code, _ in seen)
    assert all((path == "switch") == (code == "score_above_threshold") for _, _, path, code, _ in seen)


def test_hosts_bound_to_their_ports_and_host_frames_not_flooded_again_after_a_reset():
    """The controller binds every host's MAC to its port and sets MAC_POLICY.host_strict: on the model,
    a frame claiming host 1's address from port 3 is SPOOFED_SOURCE, a host frame (0x88B6) to an address
    in no entry is NO_ROUTE. A switch reset forgets both (the frames pass again, flooded); check_reset puts
    them back. With more hosts than MAC entries, host frames stay flooded (host_strict 0)."""
    from cais import protocol as proto
    link, ctl = make()
    hdr = proto.HostHeader(length=4)
    spoofed = proto.build_host_frame(hdr, bytes(4), dst=0x020000000100, src=0x020000000101)
    stray = proto.build_host_frame(hdr, bytes(4), dst=0x02000000FFFF, src=0x020000000103)

    def outcome():
        before = link.model.counters()
        outs = [[p for p, _ in link.model.receive(3, f)] for f in (spoofed, stray)]
        after = link.model.counters()
        return outs, {r: after[f"DROP_{r}"] - before[f"DROP_{r}"] for r in ("SPOOFED_SOURCE", "NO_ROUTE")}

    assert outcome() == ([[], []], {"SPOOFED_SOURCE": 1, "NO_ROUTE": 1})
    run_sync(link.reset())
    assert outcome() == ([[0, 1, 2], [0, 1, 2]], {"SPOOFED_SOURCE": 0, "NO_ROUTE": 0})   # the table is empty
    assert run_sync(ctl.check_reset(1.0))
    assert outcome() == ([[], []], {"SPOOFED_SOURCE": 1, "NO_ROUTE": 1})
    few = SwitchParams(mac_entries=2)
    link2 = ModelLink(few)
    run_sync(Controller(link2, Config(), [0, 1, 2, 3], [0x020000000100 | p for p in range(4)]).start())
    assert link2.model.read(register_map(few)["MAC_POLICY"].address()) == 0
