"""The uplink action of aggregation trees on the reference model (docs/protocol.md section 13), case by case.

Expected frames are built here with struct from the documented layout and expected reductions with numpy
(int64 then an explicit wrap; float32 folds written out in the documented order), never by asking the
model. A leaf here has 4 ports: ranks on ports 0..2, the uplink on port 3; the spine's ports 0 and 1
lead to two leaves.
"""

import struct

import numpy as np
import pytest

from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.refmodel import SwitchModel
from cais.tables import Rule, rule_writes

TREE = SwitchParams(uplink=True)
RM = register_map(TREE)
SWITCH_MAC = bytes.fromhex("02ca15000000")
ETYPE = b"\x88\xb5"
AR, AG = 0, 1
SUM = 0
FP32 = 3
RESULT, RETRANSMIT = 0x01, 0x02
RANKS, UP = 0b0111, 3


def header(op=AR, group=1, seq=0, plen=0, dtype=0, red_op=SUM, flags=0):
    return struct.pack(">BBHHHIHBB", op, group, 0, 0, 1, seq, plen, (dtype << 4) | red_op, flags)


def payload_of(values, dtype=0):
    return np.asarray(values, dtype=">f4" if dtype == FP32 else ">i4").tobytes()


def contribution(values, port, seq=0, flags=0, dtype=0, op=AR):
    p = payload_of(values, dtype)
    return b"\xff" * 6 + bytes([2, 0, 0, 0, 1, port]) + ETYPE + header(op, seq=seq, plen=len(p), dtype=dtype,
                                                                       flags=flags) + p


def partial(values, seq=0, flags=0, dtype=0):
    """What a leaf sends up: the ranks' destination, the switch's source, flags 0 (RETRANSMIT again)."""
    p = payload_of(values, dtype)
    return b"\xff" * 6 + SWITCH_MAC + ETYPE + header(seq=seq, plen=len(p), dtype=dtype, flags=flags) + p


def result(values, seq=0, dtype=0):
    p = payload_of(values, dtype)
    return bytes([3, 0xCA, 0x15, 0, 0, 1]) + SWITCH_MAC + ETYPE + header(seq=seq, plen=len(p), dtype=dtype,
                                                                        flags=RESULT) + p


def wrap32(x):
    return ((np.asarray(x, dtype=np.int64) + 2**31) % 2**32) - 2**31


def switch(contributors, *, uplink=None, params=TREE, dtype=0, count_log2=0):
    m = SwitchModel(params)
    for addr, value in rule_writes(RM, 0, Rule.for_group(1, contributors, base=0, count_log2=count_log2, dtype=dtype,
                                                         uplink=uplink is not None)):
        m.write(addr, value)
    if uplink is not None:
        m.write(RM["UPLINK"].address(), RM["UPLINK"].pack(port=uplink, enable=1))
    return m


def leaf(**kw):
    return switch(RANKS, uplink=UP, **kw)


X = [[5, -7, 2**31 - 1, 0], [11, 13, 1, -1], [-100, 0, 0, 3]]     # ranks 0..2 of a leaf


def filled(m, seq=0):
    out = []
    for p in range(3):
        out = m.receive(p, contribution(X[p], p, seq))
    return out


def test_a_filled_leaf_sends_one_partial_up_and_keeps_it():
    m = leaf()
    out = filled(m)
    assert out == [(UP, partial(wrap32(np.sum(X, axis=0))))]
    c = m.counters()
    assert (c["PARTIALS_SENT"], c["COMPLETED"], c["CONTRIBUTIONS"]) == (1, 0, 3)
    assert m.slot_state(0)[0] == (RANKS, 0, False) and m.sent(0) == (True, False)


def test_a_repeat_while_waiting_sends_the_partial_again_not_added():
    m = leaf()
    filled(m)
    out = m.receive(1, contribution(X[1], 1, flags=RETRANSMIT))
    assert out == [(UP, partial(wrap32(np.sum(X, axis=0)), flags=RETRANSMIT))]
    c = m.counters()
    assert (c["DUPLICATES"], c["PARTIALS_RESENT"], c["CONTRIBUTIONS"]) == (1, 1, 3)


def test_the_parents_result_goes_to_every_rank_and_the_set_is_done():
    m = leaf()
    filled(m)
    total = [1, 2, 3, 4]                 # whatever the parent says is the result
    out = m.receive(UP, result(total))
    assert out == [(p, result(total)) for p in range(3)]
    c = m.counters()
    assert (c["COMPLETED"], c["CONTRIBUTIONS"], c["PARTIALS_SENT"]) == (1, 4, 1)
    assert m.slot_state(0)[0] == (RANKS, 0, True) and m.sent(0) == (False, False)
    # the parent's result again (duplicated on the wire, or re-served): counted, nothing sent
    assert m.receive(UP, result(total)) == []
    # a rank that lost its copy gets it re-served, as on a single switch
    assert m.receive(2, contribution(X[2], 2, flags=RETRANSMIT)) == [(2, result(total))]
    c = m.counters()
    assert (c["DUPLICATES"], c["RESULTS_RESENT"], c["COMPLETED"]) == (2, 1, 1)


def test_a_result_for_a_set_that_did_not_send_is_refused():
    m = leaf()
    m.receive(0, contribution(X[0], 0))
    assert m.receive(UP, result([1, 2, 3, 4])) == []          # the set still collects
    assert m.receive(UP, result([1, 2, 3, 4], seq=2)) == []    # another chunk of the set
    assert m.counters()["DROP_TAG_MISMATCH"] == 2
    assert m.receive(UP, result([1, 2], seq=0)) == []          # not the chunk's length: the tag check first
    assert m.counters()["DROP_TAG_MISMATCH"] == 3
    filled(m)
    assert m.receive(UP, result([1, 2])) == []
    assert m.counters()["DROP_LENGTH_MISMATCH"] == 1


def test_results_come_only_from_the_uplink_port():
    m = leaf()
    filled(m)
    assert m.receive(1, result([1, 2, 3, 4])) == []            # a rank cannot send a result
    assert m.counters()["DROP_BAD_CODE"] == 1
    plain = switch(RANKS)                                     # no uplink: the port is nothing special
    assert plain.receive(UP, result([1, 2, 3, 4])) == []
    assert plain.counters()["DROP_BAD_CODE"] == 1


def test_a_rule_without_the_uplink_action_refuses_the_parents_result():
    m = switch(RANKS)
    m.write(RM["UPLINK"].address(), RM["UPLINK"].pack(port=UP, enable=1))
    assert m.receive(UP, result([1, 2, 3, 4])) == []
    assert m.counters()["DROP_FOREIGN_PORT"] == 1


@pytest.mark.parametrize("why", ["no FEATURES.uplink", "UPLINK.enable 0"])
def test_without_the_uplink_on_an_uplink_rule_completes_locally(why):
    if why == "no FEATURES.uplink":
        m = leaf(params=SwitchParams())
    else:
        m = leaf()
        m.write(RM["UPLINK"].address(), RM["UPLINK"].pack(port=UP, enable=0))
    want = result(wrap32(np.sum(X, axis=0)))
    assert filled(m) == [(p, want) for p in range(3)]
    assert m.counters()["PARTIALS_SENT"] == 0


def test_the_leaf_passes_all_gather_frames_up_and_down():
    m = leaf()
    f = contribution([9], 1, op=AG)
    assert m.receive(1, f) == [(0, f), (2, f), (UP, f)]
    g = contribution([8], 5, op=AG)
    assert m.receive(UP, g) == [(0, g), (1, g), (2, g)]


def spine():
    return switch(0b11)


def shuttle(leaves, top, frames, lose=()):
    """Carry ``frames`` [(leaf, port, frame)] through the tree: each leaf's uplink port 3 is the spine's
    port ``leaf``. ``lose``: (hop, n) pairs, the n-th frame (0-based) on hop "up" or "down" disappears.
    Returns what each leaf's rank ports got, as {(leaf, port): [frames]}."""
    got: dict = {}
    hops = {"up": 0, "down": 0}
    queue = list(frames)
    while queue:
        where, port, frame = queue.pop(0)
        if where == "spine":
            for out_port, data in top.receive(port, frame):
                hops["down"] += 1
                if ("down", hops["down"] - 1) not in lose:
                    queue.append((out_port, UP, data))
            continue
        for out_port, data in leaves[where].receive(port, frame):
            if out_port == UP:
                hops["up"] += 1
                if ("up", hops["up"] - 1) not in lose:
                    queue.append(("spine", where, data))
            else:
                got.setdefault((where, out_port), []).append(data)
    return got


Y = [[1, 1, 1, 1], [2, 2, 2, 2], [-3, 4, 2**31 - 1, 6]]


def first_sends():
    return [(lf, p, contribution((X if lf == 0 else Y)[p], p)) for lf in (0, 1) for p in range(3)]


def repeats(leaf_index):
    data = X if leaf_index == 0 else Y
    return [(leaf_index, p, contribution(data[p], p, flags=RETRANSMIT)) for p in range(3)]


TOTAL = wrap32(np.sum(X, axis=0) + np.sum(Y, axis=0))


def test_two_leaves_and_a_spine_every_rank_gets_the_sum():
    leaves, top = [leaf(), leaf()], spine()
    got = shuttle(leaves, top, first_sends())
    assert got == {(lf, p): [result(TOTAL)] for lf in (0, 1) for p in range(3)}
    for m, contributions in zip(leaves, (4, 4)):
        c = m.counters()
        assert (c["CONTRIBUTIONS"], c["COMPLETED"], c["PARTIALS_SENT"]) == (contributions, 1, 1)
    c = top.counters()
    assert (c["CONTRIBUTIONS"], c["COMPLETED"]) == (2, 1)


def test_a_lost_upstream_partial_is_sent_again_on_a_ranks_repeat():
    leaves, top = [leaf(), leaf()], spine()
    got = shuttle(leaves, top, first_sends(), lose={("up", 0)})      # leaf 0's partial is lost
    assert got == {} and top.slot_state(0)[0] == (0b10, 0, False)
    got = shuttle(leaves, top, repeats(0)[:1])     # rank 0 of leaf 0 times out first: one re-send completes it
    assert got == {(lf, p): [result(TOTAL)] for lf in (0, 1) for p in range(3)}
    assert leaves[0].counters()["PARTIALS_RESENT"] == 1
    c = top.counters()
    assert (c["CONTRIBUTIONS"], c["DUPLICATES"], c["COMPLETED"]) == (2, 0, 1)


def test_a_lost_downstream_result_is_re_served_by_the_parent():
    leaves, top = [leaf(), leaf()], spine()
    # the spine's multicast: to port 0 (leaf 0) first, then port 1; the copy to leaf 1 is lost
    got = shuttle(leaves, top, first_sends(), lose={("down", 1)})
    assert got == {(0, p): [result(TOTAL)] for p in range(3)}
    assert leaves[1].sent(0) == (True, False)
    got = shuttle(leaves, top, repeats(1)[2:])      # rank 2 of leaf 1 repeats: the partial goes up again
    assert got == {(1, p): [result(TOTAL)] for p in range(3)}
    c = top.counters()
    assert (c["CONTRIBUTIONS"], c["DUPLICATES"], c["RESULTS_RESENT"], c["COMPLETED"]) == (2, 1, 1, 1)
    # every further repeat of leaf 1's ranks is served by the leaf itself
    got = shuttle(leaves, top, repeats(1)[:1])
    assert got == {(1, 0): [result(TOTAL)]} and top.counters()["DUPLICATES"] == 1


def test_a_stale_partial_is_kept_out_by_the_tag():
    leaves, top = [leaf(), leaf()], spine()
    # chunks 0 and 1 through both leaves (count 1: seq 0 uses set 0, seq 1 set 1, seq 2 set 0 again)
    for seq in (0, 1):
        got = shuttle(leaves, top, [(lf, p, contribution(X[p], p, seq)) for lf in (0, 1) for p in range(3)])
        assert len(got) == 6
    # leaf 0's partial of seq 2 takes the spine's set 0 (freed by the partials of seq 1)
    shuttle(leaves, top, [(0, p, contribution(X[p], p, 2)) for p in range(3)])
    assert top.slot_state(0)[0] == (0b01, 2, False)
    # an old copy of leaf 1's partial of seq 0, held back in the network, is refused: no stale result
    assert top.receive(1, partial(wrap32(2 * np.sum(X, axis=0)), seq=0)) == []
    assert top.counters()["DROP_TAG_MISMATCH"] == 1
    assert top.slot_state(0)[0] == (0b01, 2, False)


def f32(x):
    return np.float32(x)


def test_floats_fold_in_the_documented_order():
    """Leaf partials fold their ranks in port order, the spine its leaves in port order: whatever the
    arrival order, the bits are ((a0 + a1) + a2) + ((b0 + b1) + b2) in float32."""
    a = [[1e8, 1.0, -3.5], [1.0, 1e-3, 7.25], [-1e8, 2.0, 1e7]]
    b = [[0.5, 1e9, 3.0], [3.0, -1e9, 1e-7], [1.0, 1.0, -1e7]]
    want = np.array([(f32(f32(x[0]) + f32(x[1])) + f32(x[2])) for x in zip(*a)], dtype=np.float32)
    want_b = np.array([(f32(f32(x[0]) + f32(x[1])) + f32(x[2])) for x in zip(*b)], dtype=np.float32)
    total = want + want_b
    flat = np.sum(np.array(a + b, dtype=np.float32), axis=0, dtype=np.float32)
    assert not np.array_equal(total, flat)          # the data tells the tree's order from a flat fold
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        leaves, top = [leaf(dtype=FP32), leaf(dtype=FP32)], switch(0b11, dtype=FP32)
        sends = [(lf, p, contribution((a if lf == 0 else b)[p], p, dtype=FP32)) for lf in (1, 0) for p in order]
        got = shuttle(leaves, top, sends)
        assert got == {(lf, p): [result(total, dtype=FP32)] for lf in (0, 1) for p in range(3)}


def test_a_sent_set_is_not_aged_a_partly_filled_one_is():
    """AGING on a leaf: a set that sent its partial waits for the parent, not for a rank: never aged; a
    set of the next chunk missing rank 2 ages after age x AGE_UNIT cycles (1024 per unit)."""
    m = switch(RANKS, uplink=UP, count_log2=1)           # two slots: seq 0 in slot 0, seq 1 in slot 1
    m.write(RM["AGING"].address(), RM["AGING"].pack(age=1, free=1))
    filled(m)                                             # seq 0: sent
    for p in range(2):                                    # seq 1: ranks 0, 1 only
        m.receive(p, contribution(X[p], p, seq=1))
    assert m.advance(1024 + 1) == [(1, 0, 0, 0b011)]     # (slot, set, rule entry, bitmap): seq 1's alone
    assert m.sent(0) == (True, False) and m.slot_state(0)[0] == (RANKS, 0, False)
    assert m.counters()["AGED_TOTAL"] == 1


def test_three_levels_a_middle_switch_is_a_parent_and_a_leaf():
    """Any depth: four leaves (ranks on ports 0..2, uplink 3) under two middle switches (children on ports
    0, 1, uplink 3) under a top switch (children on ports 0, 1). The middle switches' partials go up, the
    top's result comes down two levels; the first partial of middle switch 1 is lost and a rank's repeat
    (through its leaf, which sends its partial again, and the middle switch, which sends its own again)
    brings it back. Every rank gets the sum of the 12 contributions."""
    leaves = [leaf() for _ in range(4)]
    mids = [switch(0b11, uplink=UP) for _ in range(2)]
    top = switch(0b11)
    data = [[[(lf * 3 + p) * 10 + k for k in range(4)] for p in range(3)] for lf in range(4)]
    total = wrap32(np.sum(np.array(data).reshape(12, 4), axis=0))
    # node -> model; wires: (leaf k, port 3) <-> (mid k // 2, port k % 2); (mid j, port 3) <-> (top, port j)
    nodes = {("leaf", k): leaves[k] for k in range(4)} | {("mid", j): mids[j] for j in range(2)} | {("top", 0): top}
    peer = {}
    for k in range(4):
        peer[("leaf", k), UP], peer[("mid", k // 2), k % 2] = (("mid", k // 2), k % 2), (("leaf", k), UP)
    for j in range(2):
        peer[("mid", j), UP], peer[("top", 0), j] = (("top", 0), j), (("mid", j), UP)
    got: dict = {}
    lost = {"mid 1 up": 1}

    def run(sends):
        queue = list(sends)
        while queue:
            node, port, frame = queue.pop(0)
            for out_port, data_ in nodes[node].receive(port, frame):
                if (node, out_port) in peer:
                    if node == ("mid", 1) and out_port == UP and lost["mid 1 up"]:
                        lost["mid 1 up"] -= 1
                        continue
                    queue.append((*peer[node, out_port], data_))
                else:
                    got.setdefault((node[1], out_port), []).append(data_)

    run([(("leaf", k), p, contribution(data[k][p], p)) for k in range(4) for p in range(3)])
    assert got == {} and mids[1].sent(0) == (True, False) and top.slot_state(0)[0] == (0b01, 0, False)
    run([(("leaf", 3), 2, contribution(data[3][2], 2, flags=RETRANSMIT))])
    assert got == {(k, p): [result(total)] for k in range(4) for p in range(3)}
    assert [m.counters()["PARTIALS_RESENT"] for m in leaves + mids] == [0, 0, 0, 1, 0, 1]
    assert [m.counters()["CONTRIBUTIONS"] for m in leaves + mids + [top]] == [4, 4, 4, 4, 3, 3, 2]
