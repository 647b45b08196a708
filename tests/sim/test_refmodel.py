"""Directed tests of the reference model (cais.sim.refmodel) against hand-derived expectations.

Expected frames are built here with struct from the documented layout, and expected reductions with
numpy in int64 followed by an explicit wrap, never by asking the model.
"""

import random
import struct
from fractions import Fraction

import numpy as np
import pytest

from cais.params import SwitchParams
from cais.registers import RegisterFile, register_map
from cais.sim.refmodel import SwitchModel
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

P = SwitchParams()          # 4 ports, 64 slots, 256-byte payloads, 8 rules, 16 MAC entries
RM = register_map(P)
ALL = 0b1111
SWITCH_MAC = bytes.fromhex("02ca15000000")
ETYPE = b"\x88\xb5"
AR, AG, BC, RS = 0, 1, 2, 3          # op_type code points
SUM, MAX, MIN = 0, 1, 2              # red_op code points
RESULT, RETRANSMIT = 0x01, 0x02      # flags

INT32, INT16, INT8, FP32, FP16, BF16 = range(6)   # dtype code points
DROP_NAMES = ["BAD_FCS", "BAD_FRAMING", "OVERSIZE", "RUNT", "BAD_CODE", "BAD_PAYLOAD_LEN", "BAD_LENGTH",
              "NO_RULE", "FOREIGN_PORT", "TYPE_MISMATCH", "PAYLOAD_TOO_LONG", "BAD_SLOT", "TAG_MISMATCH", "LENGTH_MISMATCH",
              "NO_ROUTE", "SPOOFED_SOURCE"]


# ----------------------------------------------------------------------------- helpers
def apply(model, writes):
    for addr, value in writes:
        model.write(addr, value)


def model_with(*rules, macs=(), params=P):
    m = SwitchModel(params)
    rm = register_map(params)
    for i, r in enumerate(rules):
        if r is not None:
            apply(m, rule_writes(rm, i, r))
    for i, e in enumerate(macs):
        apply(m, mac_writes(rm, i, e))
    return m


def header(op=AR, group=1, layer=0, chunk=0, total=1, seq=0, plen=0, dtype=0, red_op=SUM, flags=0):
    return struct.pack(">BBHHHIHBB", op, group, layer, chunk, total, seq, plen, (dtype << 4) | red_op, flags)


def cais_frame(values=(), *, payload=None, src_port=0, dst=b"\xff" * 6, pad_to=None, plen=None, **hdr):
    if payload is None:
        payload = np.asarray(values, dtype=">i4").tobytes()
    plen = len(payload) if plen is None else plen
    frame = dst + bytes([2, 0, 0, 0, 0, src_port]) + ETYPE + header(plen=plen, **hdr) + payload
    if pad_to is not None:
        frame += bytes(pad_to - len(frame))
    return frame


def result_frame(values=(), *, payload=None, **hdr):
    if payload is None:
        payload = np.asarray(values, dtype=">i4").tobytes()
    group = hdr.get("group", 1)
    hdr = dict(hdr, flags=RESULT)
    return bytes([0x03, 0xCA, 0x15, 0, 0, group]) + SWITCH_MAC + ETYPE + header(plen=len(payload), **hdr) + payload


def ordinary(dst: bytes, src_port=0, length=64, etype=b"\x08\x00"):
    head = dst + bytes([2, 0, 0, 0, 0, src_port]) + etype
    return head + bytes((i * 7) & 0xFF for i in range(length - len(head)))


def wrap32(x):
    return ((np.asarray(x, dtype=np.int64) + 2**31) % 2**32) - 2**31


def contribute(m, port, seq, values, **kw):
    return m.receive(port, cais_frame(values, seq=seq, src_port=port, **kw))


def drops(m):
    c = m.counters()
    return {n: c[f"DROP_{n}"] for n in DROP_NAMES if c[f"DROP_{n}"]}


def check_invariant(m):
    c = m.counters()
    assert sum(c["RX_FRAMES"]) == (c["FORWARDED"] + c["CONTRIBUTIONS"] + c["DUPLICATES"]
                                   + sum(c[f"DROP_{n}"] for n in DROP_NAMES))


# ----------------------------------------------------------------------------- registers
def test_constant_registers():
    m = SwitchModel(P)
    assert m.read(0x000) == 0x43414953
    assert m.read(0x004) == 0x00040005           # map version 4.5 (MAX_FRAME)
    assert m.read(0x02C) == 0b11                 # FEATURES: float units, port-order fold
    assert m.read(0x008) == 4
    assert m.read(0x00C) == 64
    assert m.read(0x010) == 64
    assert m.read(0x014) == 256
    assert m.read(0x018) == 8
    assert m.read(0x01C) == 16
    m.write(0x000, 0x1234)                       # read-only: ignored
    assert m.read(0x000) == 0x43414953
    m2 = SwitchModel(SwitchParams(ports=8, data_width=128, slots=128, max_payload=512, rules=16, mac_entries=32))
    assert [m2.read(a) for a in range(0x8, 0x20, 4)] == [8, 128, 128, 512, 16, 32]


def test_config_and_command_registers():
    m = SwitchModel(P)
    assert m.read(0x020) == 0x15000000 and m.read(0x024) == 0x02CA   # 02:ca:15:00:00:00 after reset
    m.write(0x040, 0xABCD)                       # RULE_GROUP staging reads back
    assert m.read(0x040) == 0xABCD
    m.write(0x040, 0xFFFF_FFFF)                  # only the defined fields (value, mask) are stored
    assert m.read(0x040) == 0xFFFF
    m.write(0x054, 0x100)                        # RULE_WRITE is write-only
    assert m.read(0x054) == 0
    assert m.read(0x3FC) == 0                    # unmapped
    with pytest.raises(ValueError):
        m.write(0x040, 1 << 32)


def test_register_file_works_on_model():
    m = SwitchModel(P)
    rf = RegisterFile(m, RM)
    assert rf.read("ID") == 0x43414953
    rf.write("RULE_PORTS", contributors=0b0011, results=0b1100)
    assert rf.read("RULE_PORTS") == 0x000C0003
    rf.write("RULE_GROUP", value=9, mask=0xFF)
    rf.write("RULE_WRITE", index=0, valid=1)
    out = m.receive(0, cais_frame([5], op=AG, group=9))
    assert [p for p, _ in out] == [2, 3]
    assert rf.read("FORWARDED") == 1
    assert rf.read("RX_FRAMES", 0) == 1 and rf.read("TX_FRAMES", 2) == 1 and rf.read("TX_FRAMES", 1) == 0


def test_switch_mac_register_sets_result_source():
    m = model_with(Rule.for_group(1, 0b0001))
    m.write(0x020, 0x33445566)
    m.write(0x024, 0x1122)
    out = contribute(m, 0, 0, [1])
    assert out[0][1][6:12] == bytes.fromhex("112233445566")


# ----------------------------------------------------------------------------- reduction
def _reduce_4(red_op, inputs, expected):
    m = model_with(Rule.for_group(1, ALL, ALL, base=0, count_log2=0, red_op=red_op))
    for p in range(3):
        assert contribute(m, p, 0, inputs[p], red_op=red_op) == []
    out = contribute(m, 3, 0, inputs[3], red_op=red_op)
    want = result_frame(expected, seq=0, red_op=red_op)
    assert out == [(0, want), (1, want), (2, want), (3, want)]
    c = m.counters()
    assert c["CONTRIBUTIONS"] == 4 and c["COMPLETED"] == 1 and c["TX_FRAMES"] == [1, 1, 1, 1]
    assert c["TX_BYTES"] == [len(want)] * 4
    check_invariant(m)
    return m


def test_sum_four_ports():
    rng = np.random.default_rng(7)
    inputs = rng.integers(-2**31, 2**31, size=(4, 64), dtype=np.int64)   # 256 bytes: max payload
    expected = wrap32(inputs.sum(axis=0))
    m = _reduce_4(SUM, inputs, expected)
    assert np.array_equal(m.values(0, 0), expected)


def test_max_and_min():
    inputs = [[1, -5, 7, -2**31], [3, -9, 7, 2**31 - 1], [-4, -1, 0, 0], [2, -7, -8, -1]]
    _reduce_4(MAX, inputs, [3, -1, 7, 2**31 - 1])
    _reduce_4(MIN, inputs, [-4, -9, -8, -2**31])


def test_int32_wraparound():
    inputs = [[2**31 - 1, -2**31, 2**31 - 1, 1], [1, -1, 2**31 - 1, 2], [0, 0, 2, 3], [0, 0, 0, 4]]
    # column 0: 0x7fffffff + 1 = 0x80000000 -> -2**31
    # column 1: -2**31 + -1 = -2**31 - 1 -> +2**31 - 1
    # column 2: 2 * (2**31 - 1) + 2 = 2**32 -> 0
    _reduce_4(SUM, inputs, [-2**31, 2**31 - 1, 0, 10])


def test_repeated_contribution_ignored():
    m = model_with(Rule.for_group(1, ALL))
    contribute(m, 0, 0, [10, 20])
    assert contribute(m, 0, 0, [1000, 2000], flags=RETRANSMIT) == []        # repeat, different payload
    assert m.counters()["DUPLICATES"] == 1
    assert m.slot_state(0) == ((0b0001, 0, False), (0, 0, False))
    contribute(m, 1, 0, [1, 2])
    contribute(m, 2, 0, [100, 200])
    out = contribute(m, 3, 0, [0, 0])
    assert out[0][1] == result_frame([111, 222], seq=0)
    c = m.counters()
    assert c["CONTRIBUTIONS"] == 4 and c["DUPLICATES"] == 1 and c["RESULTS_RESENT"] == 0
    check_invariant(m)


def test_late_repeat_after_completion_answered_to_that_port_only():
    m = model_with(Rule.for_group(1, ALL, base=3))
    for p in range(4):
        out = contribute(m, p, 0, [p + 1, -p], layer=7, chunk=2, total=5)
    done = result_frame([10, -6], seq=0, layer=7, chunk=2, total=5)
    assert [f for _, f in out] == [done] * 4
    # port 2 lost its result and retransmits (with a different payload: it is ignored)
    out = contribute(m, 2, 0, [99, 99], layer=7, chunk=2, total=5, flags=RETRANSMIT)
    assert out == [(2, done)]
    c = m.counters()
    assert c["DUPLICATES"] == 1 and c["RESULTS_RESENT"] == 1 and c["COMPLETED"] == 1
    assert c["TX_FRAMES"] == [1, 1, 2, 1]
    assert m.slot_state(3) == ((ALL, 0, True), (0, 0, False))
    check_invariant(m)


def test_single_contributor_completes_at_once():
    m = model_with(Rule.for_group(1, 0b0100, 0b0011))
    out = contribute(m, 2, 0, [-3, 4])
    assert out == [(0, result_frame([-3, 4], seq=0)), (1, result_frame([-3, 4], seq=0))]
    assert m.slot_state(0) == ((0b0100, 0, True), (0, 0, False))


def test_both_shadow_sets_in_flight():
    m = model_with(Rule.for_group(1, ALL, base=5, count_log2=0))   # one slot: seq even -> set 0, odd -> set 1
    for p in range(4):
        contribute(m, p, 0, [p])
    r0 = result_frame([6], seq=0)
    assert m.slot_state(5) == ((ALL, 0, True), (0, 0, False))
    assert contribute(m, 0, 1, [10]) == []
    assert m.slot_state(5) == ((0b1110, 0, True), (0b0001, 1, False))
    assert contribute(m, 1, 1, [20]) == []
    assert m.slot_state(5) == ((0b1100, 0, True), (0b0011, 1, False))
    assert m.counters()["SLOTS_IN_USE"] == 2
    assert contribute(m, 2, 0, [0]) == [(2, r0)]                  # port 2 missed its result of seq 0
    assert m.slot_state(5) == ((0b1100, 0, True), (0b0011, 1, False))
    assert contribute(m, 2, 1, [30]) == []
    assert m.slot_state(5) == ((0b1000, 0, True), (0b0111, 1, False))
    out = contribute(m, 3, 1, [40])
    assert out == [(p, result_frame([100], seq=1)) for p in range(4)]
    assert m.slot_state(5) == ((0, 0, True), (ALL, 1, True))
    assert m.counters()["SLOTS_IN_USE"] == 1
    assert m.values(5, 0)[0] == 6 and m.values(5, 1)[0] == 100
    check_invariant(m)


def test_a_stale_copy_acknowledges_nothing_once_its_port_moved_on():
    """Port 0 has seq 0's result and contributed seq 1 (the other set); then a copy of its seq 0 that the
    network kept back arrives. It gets the stored result (case a) but must not clear port 0's bit of set
    1, which holds seq 1 = 0 + count: else port 0's seq 1 is forgotten, the set waits for a repeat and
    the repeat counts a second contribution."""
    m = model_with(Rule.for_group(1, ALL, base=5, count_log2=0))   # one slot: seq even -> set 0, odd -> set 1
    for p in range(4):
        contribute(m, p, 0, [p])
    assert contribute(m, 0, 1, [10]) == []
    assert m.slot_state(5) == ((0b1110, 0, True), (0b0001, 1, False))
    assert contribute(m, 0, 0, [0]) == [(0, result_frame([6], seq=0))]   # the stale copy
    assert m.slot_state(5) == ((0b1110, 0, True), (0b0001, 1, False))   # port 0 still in set 1
    for p in (1, 2):
        assert contribute(m, p, 1, [10 * (p + 1)]) == []
    out = contribute(m, 3, 1, [40])                               # completes without a repeat of port 0
    assert out == [(p, result_frame([100], seq=1)) for p in range(4)]
    c = m.counters()
    assert (c["CONTRIBUTIONS"], c["COMPLETED"], c["DUPLICATES"], c["RESULTS_RESENT"]) == (8, 2, 1, 1)
    # a frame of the chunk before (set 1 holds seq 1, the frame is seq 2's: 2 - count) still acknowledges
    assert contribute(m, 0, 2, [1]) == []
    assert m.slot_state(5) == ((0b0001, 2, False), (0b1110, 1, True))
    check_invariant(m)


def test_slot_reuse_after_all_contributors_moved_on():
    m = model_with(Rule.for_group(1, ALL, count_log2=0))
    for p in range(4):
        contribute(m, p, 0, [1])
    for p in range(3):
        contribute(m, p, 1, [2])
    # port 3 has not moved to seq 1 yet: set 0 still holds seq 0 for it, seq 2 may not take it
    assert m.slot_state(0)[0] == (0b1000, 0, True)
    assert contribute(m, 0, 2, [3]) == []
    assert drops(m) == {"TAG_MISMATCH": 1}
    assert m.slot_state(0) == ((0b1000, 0, True), (0b0111, 1, False))
    contribute(m, 3, 1, [2])                                      # completes seq 1, frees set 0
    assert m.slot_state(0) == ((0, 0, True), (ALL, 1, True))
    for p in range(3):
        assert contribute(m, p, 2, [p * 5]) == []
    assert m.slot_state(0) == ((0b0111, 2, False), (0b1000, 1, True))
    out = contribute(m, 3, 2, [1])
    assert out == [(p, result_frame([16], seq=2)) for p in range(4)]
    check_invariant(m)


def test_window_over_several_slots():
    m = model_with(Rule.for_group(1, 0b0011, base=8, count_log2=2))   # slots 8..11
    for seq in range(4):
        contribute(m, 0, seq, [seq])
    assert m.counters()["SLOTS_IN_USE"] == 4
    for seq in range(4):
        assert contribute(m, 1, seq, [10])[0][1] == result_frame([seq + 10], seq=seq)
    assert m.counters()["SLOTS_IN_USE"] == 4
    assert [m.slot_state(s)[0] for s in range(8, 12)] == [(0b0011, q, True) for q in range(4)]
    contribute(m, 0, 4, [0])                                      # seq 4 -> slot 8, set 1
    assert m.slot_state(8) == ((0b0010, 0, True), (0b0001, 4, False))
    assert m.counters()["SLOTS_IN_USE"] == 5
    contribute(m, 1, 4, [0])
    assert m.slot_state(8) == ((0, 0, True), (0b0011, 4, True))
    assert m.counters()["SLOTS_IN_USE"] == 4
    # seq 9 -> slot 9, set 0 (9 div 4 = 2), which still holds seq 1 for both ports: outside the window
    assert contribute(m, 0, 9, [0]) == []
    assert drops(m) == {"TAG_MISMATCH": 1}
    contribute(m, 0, 5, [0])                                      # seq 5 -> slot 9, set 1: acks seq 1
    assert m.slot_state(9) == ((0b0010, 1, True), (0b0001, 5, False))


# ----------------------------------------------------------------------------- rejections
def test_foreign_port_rejected():
    m = model_with(Rule.for_group(1, 0b0111))
    contribute(m, 0, 0, [1])
    assert contribute(m, 3, 0, [1]) == []
    assert drops(m) == {"FOREIGN_PORT": 1}
    assert m.slot_state(0) == ((0b0001, 0, False), (0, 0, False))
    check_invariant(m)


def test_tag_mismatch_changes_nothing():
    m = model_with(Rule.for_group(1, ALL, count_log2=0))
    contribute(m, 0, 0, [1])
    contribute(m, 1, 1, [1])
    assert m.slot_state(0) == ((0b0001, 0, False), (0b0010, 1, False))
    assert contribute(m, 1, 2, [1]) == []                         # set 0 busy with seq 0
    assert drops(m) == {"TAG_MISMATCH": 1}
    # no implicit ack either: port 1's bit in set 1 survives
    assert m.slot_state(0) == ((0b0001, 0, False), (0b0010, 1, False))
    check_invariant(m)


def test_no_rule():
    m = model_with(Rule.for_group(1, ALL))
    assert contribute(m, 0, 0, [1], group=2) == []
    assert drops(m) == {"NO_RULE": 1}
    apply(m, rule_writes(RM, 0, Rule.for_group(1, ALL), valid=False))   # an invalid entry matches nothing
    assert contribute(m, 0, 0, [1], group=1) == []
    assert drops(m) == {"NO_RULE": 2}
    assert m.counters()["SLOTS_IN_USE"] == 0


def test_bad_slot():
    m = model_with(Rule.for_group(1, 0b0001, base=62, count_log2=2))   # quota 62..65, only 62..63 exist
    assert contribute(m, 0, 0, [1]) == [(0, result_frame([1], seq=0))]     # slot 62
    assert len(contribute(m, 0, 1, [1])) == 1                              # slot 63
    assert contribute(m, 0, 2, [1]) == []                                  # slot 64
    assert contribute(m, 0, 3, [1]) == []                                  # slot 65
    assert len(contribute(m, 0, 5, [1])) == 1                              # slot 63, set 1
    assert contribute(m, 0, 6, [1]) == []
    assert drops(m) == {"BAD_SLOT": 3}
    assert m.slot_state(63) == ((0, 1, True), (0b0001, 5, True))
    check_invariant(m)


# ----------------------------------------------------------------------------- malformed frames
GOOD_AG = cais_frame([1, 2], op=AG, group=1)


def _raw_cais(total_len, **hdr):
    """A CAIS frame of exactly total_len bytes whatever its payload_len says."""
    head = b"\xff" * 6 + bytes([2, 0, 0, 0, 0, 0]) + ETYPE + header(**hdr)
    return (head + bytes(range(256)) * 40)[:total_len]


MALFORMED = [
    ("BAD_FRAMING", GOOD_AG, False),
    ("BAD_FRAMING", b"", True),
    ("BAD_FRAMING", _raw_cais(1600, plen=4), False),            # framing checked before length
    ("OVERSIZE", ordinary(b"\xff" * 6, length=1515), True),
    ("OVERSIZE", _raw_cais(1515, plen=4), True),
    ("RUNT", b"\xff" * 13, True),
    ("RUNT", _raw_cais(29, plen=4), True),
    ("RUNT", _raw_cais(29, op=7, plen=0), True),                # runt before code
    ("BAD_CODE", _raw_cais(34, op=RS, plen=4), True),
    ("BAD_CODE", _raw_cais(34, op=0xFF, plen=4), True),
    ("BAD_CODE", _raw_cais(34, dtype=6, plen=4), True),          # first unassigned dtype
    ("BAD_CODE", _raw_cais(34, dtype=0xF, plen=4), True),
    ("BAD_CODE", _raw_cais(34, red_op=3, plen=4), True),
    ("BAD_CODE", _raw_cais(34, red_op=0xF, plen=4), True),
    ("BAD_CODE", _raw_cais(34, flags=RESULT, plen=4), True),
    ("BAD_CODE", _raw_cais(34, flags=0x04, plen=4), True),
    ("BAD_CODE", _raw_cais(34, flags=0x80 | RETRANSMIT, plen=4), True),
    ("BAD_CODE", _raw_cais(30, op=RS, plen=0), True),            # code before payload_len
    ("BAD_PAYLOAD_LEN", _raw_cais(30, plen=0), True),
    ("BAD_PAYLOAD_LEN", _raw_cais(60, plen=0), True),
    ("BAD_PAYLOAD_LEN", _raw_cais(290, plen=260), True),
    ("BAD_PAYLOAD_LEN", _raw_cais(36, plen=6), True),
    ("BAD_PAYLOAD_LEN", _raw_cais(60, plen=2), True),
    ("BAD_PAYLOAD_LEN", _raw_cais(100, plen=0xFFFF), True),      # payload_len before length
    ("BAD_LENGTH", _raw_cais(39, plen=8), True),
    ("BAD_LENGTH", _raw_cais(37, plen=8), True),
    ("BAD_LENGTH", _raw_cais(59, plen=8), True),
    ("BAD_LENGTH", _raw_cais(61, plen=8), True),
    ("BAD_LENGTH", _raw_cais(60, plen=32), True),                # 62 bytes needed: no shortening to 60
    ("BAD_LENGTH", _raw_cais(63, plen=32), True),
    ("BAD_LENGTH", _raw_cais(285, plen=256), True),
    ("BAD_LENGTH", _raw_cais(287, plen=256, op=AG), True),
]


@pytest.mark.parametrize("reason,frame,framing_ok", MALFORMED,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(MALFORMED)])
def test_malformed_frame_then_good_frame(reason, frame, framing_ok):
    _malformed_then_good(reason, frame, framing_ok=framing_ok)


@pytest.mark.parametrize("frame", [GOOD_AG, _raw_cais(1600, plen=4), b"\xff" * 13, _raw_cais(34, op=RS, plen=4)],
                         ids=["good_all_gather", "oversize", "runt", "bad_code"])
def test_bad_fcs_comes_first(frame):
    """A frame the MAC flagged (tuser on its last beat) is BAD_FCS whatever else is wrong or right with it."""
    _malformed_then_good("BAD_FCS", frame, fcs_ok=False)


def _malformed_then_good(reason, frame, **flags):
    m = model_with(Rule.for_group(1, ALL))
    assert m.receive(1, frame, **flags) == []
    assert drops(m) == {reason: 1}
    c = m.counters()
    assert c["RX_FRAMES"] == [0, 1, 0, 0] and c["RX_BYTES"] == [0, len(frame), 0, 0]
    assert c["TX_FRAMES"] == [0] * 4 and c["CONTRIBUTIONS"] == 0 and c["SLOTS_IN_USE"] == 0
    assert m.receive(1, GOOD_AG) == [(0, GOOD_AG), (2, GOOD_AG), (3, GOOD_AG)]
    out = contribute(m, 1, 0, [4])
    assert out == [] and m.slot_state(0) == ((0b0010, 0, False), (0, 0, False))
    check_invariant(m)


def test_retransmit_flag_and_other_header_fields_accepted():
    m = model_with(Rule.for_group(1, 0b0001))
    out = m.receive(0, cais_frame([5], flags=RETRANSMIT, total=0xFFFF, layer=0xBEEF, chunk=0xCAFE))
    assert out == [(0, result_frame([5], total=0xFFFF, layer=0xBEEF, chunk=0xCAFE))]


def test_shortest_frames_not_runt():
    m = model_with()
    f14 = ordinary(b"\xff" * 6, length=14)
    assert m.receive(0, f14) == [(1, f14), (2, f14), (3, f14)]
    m = model_with(Rule.for_group(1, ALL))
    assert m.receive(0, _raw_cais(34, plen=4)) == []
    assert m.counters()["CONTRIBUTIONS"] == 1 and drops(m) == {}


def test_padding_accepted():
    m = model_with(Rule.for_group(1, 0b0011))
    f0 = cais_frame([7], seq=0, pad_to=60)                        # 34 bytes padded to 60
    assert len(f0) == 60
    assert m.receive(0, f0) == []
    f1 = cais_frame([-2], seq=0, pad_to=60, src_port=1)
    f1 = f1[:34] + b"\x55" * 26                                  # pad bytes are ignored whatever they are
    out = m.receive(1, f1)
    want = result_frame([5], seq=0)
    assert len(want) == 34                                       # the result is not padded
    assert out == [(0, want), (1, want)]
    # 58 bytes padded to 60 is fine too, and an exact 62-byte frame
    m = model_with(Rule.for_group(1, 0b0001))
    assert m.receive(0, cais_frame(list(range(7)), pad_to=60))[0][1] == result_frame(list(range(7)))
    assert m.receive(0, cais_frame(list(range(8)), seq=1))[0][1] == result_frame(list(range(8)), seq=1)
    assert drops(m) == {}


def test_only_payload_len_bytes_matter_for_result():
    m = model_with(Rule.for_group(1, 0b0011))
    m.receive(0, cais_frame([1, 2, 3, 4], seq=0))
    out = m.receive(1, cais_frame([10, 20, 30, 40], seq=0))
    assert out[0][1] == result_frame([11, 22, 33, 44], seq=0)


# ----------------------------------------------------------------------------- ordinary frames
MAC_A = 0x020000000002
MAC_B = 0x02000000000B


def test_ordinary_known_unicast():
    m = model_with(macs=[MacEntry(MAC_A, 2)])
    f = ordinary(MAC_A.to_bytes(6, "big"))
    assert m.receive(0, f) == [(2, f)]
    c = m.counters()
    assert c["FORWARDED"] == 1 and c["TX_FRAMES"] == [0, 0, 1, 0] and c["TX_BYTES"] == [0, 0, 64, 0]
    assert c["RX_BYTES"] == [64, 0, 0, 0]
    check_invariant(m)


def test_ordinary_unknown_unicast_and_broadcast_flooded():
    m = model_with(macs=[MacEntry(MAC_A, 2)])
    f = ordinary(MAC_B.to_bytes(6, "big"))
    assert m.receive(1, f) == [(0, f), (2, f), (3, f)]
    b = ordinary(b"\xff" * 6, length=100)
    assert m.receive(3, b) == [(0, b), (1, b), (2, b)]
    assert m.counters()["FORWARDED"] == 2


def test_ordinary_multicast_flooded_even_if_in_mac_table():
    mc = 0x01005E000001
    m = model_with(macs=[MacEntry(mc, 2)])
    f = ordinary(mc.to_bytes(6, "big"))
    assert m.receive(0, f) == [(1, f), (2, f), (3, f)]


def test_ordinary_no_route_to_ingress():
    m = model_with(macs=[MacEntry(MAC_A, 2)])
    assert m.receive(2, ordinary(MAC_A.to_bytes(6, "big"))) == []
    assert drops(m) == {"NO_ROUTE": 1}
    check_invariant(m)


def test_mac_table_lowest_index_wins_and_invalidation():
    m = model_with(macs=[MacEntry(MAC_B, 0), MacEntry(MAC_A, 1), MacEntry(MAC_A, 3)])
    f = ordinary(MAC_A.to_bytes(6, "big"))
    assert m.receive(0, f) == [(1, f)]
    apply(m, mac_writes(RM, 1, None, valid=False))
    assert m.receive(0, f) == [(3, f)]
    assert m.read(0x060) == 0 and m.read(0x064) == 0             # staging of the invalidation
    apply(m, mac_writes(RM, 2, MacEntry(MAC_A, 3)))
    assert m.read(0x060) == 0x00000002 and m.read(0x064) == 0x0200


def test_cais_ethertype_with_other_destination_is_routed_by_rules_not_macs():
    m = model_with(Rule.for_group(1, ALL, ALL), macs=[MacEntry(MAC_A, 2)])
    f = cais_frame([1], op=AG, dst=MAC_A.to_bytes(6, "big"))
    assert [p for p, _ in m.receive(0, f)] == [1, 2, 3]


# ----------------------------------------------------------------------------- source binding, host frames
def with_src(frame: bytes, mac: int) -> bytes:
    return frame[:6] + mac.to_bytes(6, "big") + frame[12:]


def test_spoofed_source_dropped_before_the_core_checks():
    """A source MAC in the table bound to another port: SPOOFED_SOURCE, for ordinary and CAIS frames alike,
    after the parser's checks and before NO_RULE and FOREIGN_PORT; nothing emitted, nothing changed."""
    m = model_with(Rule.for_group(1, 0b0111, ALL), macs=[MacEntry(MAC_A, 2)])
    a = MAC_A
    assert m.receive(1, with_src(cais_frame([5], seq=0), a)) == []                  # port 1 contributes to group 1
    assert m.receive(3, with_src(cais_frame([5], group=77), a)) == []               # would be NO_RULE
    assert m.receive(3, with_src(cais_frame([5], seq=0), a)) == []                  # would be FOREIGN_PORT
    assert m.receive(0, with_src(ordinary(b"\xff" * 6), a)) == []                   # would be flooded
    assert m.receive(0, with_src(ordinary(b"\xff" * 6, etype=b"\x88\xb6"), a)) == []
    assert m.receive(1, with_src(cais_frame([5], seq=0), a)[:-1]) == []             # BAD_LENGTH comes first
    assert drops(m) == {"SPOOFED_SOURCE": 5, "BAD_LENGTH": 1}
    assert m.counters()["CONTRIBUTIONS"] == 0 and m.slot_state(0)[0] == (0, 0, False)
    # from its own port the address passes; an address in no entry is bound to nothing
    f = with_src(ordinary(b"\xff" * 6), a)
    assert m.receive(2, f) == [(0, f), (1, f), (3, f)]
    g = with_src(ordinary(b"\xff" * 6), MAC_B)
    assert m.receive(1, g) == [(0, g), (2, g), (3, g)]
    for port in (0, 1):
        m.receive(port, cais_frame([10 * port + 1], seq=0, src_port=port))
    out = m.receive(2, with_src(cais_frame([100], seq=0), a))
    assert [p for p, _ in out] == [0, 1, 2, 3] and out[0][1] == result_frame([112], seq=0)
    check_invariant(m)


def test_source_bound_to_the_lowest_valid_entry():
    """The same address in two entries: bound to the lower entry's port; an invalid entry binds nothing."""
    m = model_with(macs=[MacEntry(MAC_B, 0), MacEntry(MAC_A, 1), MacEntry(MAC_A, 3)])
    f = with_src(ordinary(b"\xff" * 6), MAC_A)
    assert m.receive(3, f) == [] and drops(m) == {"SPOOFED_SOURCE": 1}
    assert [p for p, _ in m.receive(1, f)] == [0, 2, 3]
    apply(m, mac_writes(RM, 1, None, valid=False))
    assert [p for p, _ in m.receive(3, f)] == [0, 1, 2]
    assert m.receive(1, f) == [] and drops(m) == {"SPOOFED_SOURCE": 2}
    apply(m, mac_writes(RM, 2, MacEntry(MAC_A, 3), valid=False))
    assert [p for p, _ in m.receive(1, f)] == [0, 2, 3]
    check_invariant(m)


def test_host_frames_never_flooded_under_host_strict():
    """MAC_POLICY.host_strict (0x06C bit 0): a host frame (EtherType 0x88B6) to an unknown or a group
    address is NO_ROUTE; to a known host it is forwarded; other ordinary frames are flooded as before.
    Without it (the reset value) host frames are flooded too."""
    host = b"\x88\xb6"
    m = model_with(macs=[MacEntry(MAC_A, 2)])
    unknown, known, bcast = (ordinary(MAC_B.to_bytes(6, "big"), etype=host), ordinary(MAC_A.to_bytes(6, "big"), etype=host),
                             ordinary(b"\xff" * 6, etype=host))
    assert [p for p, _ in m.receive(0, unknown)] == [1, 2, 3]
    assert [p for p, _ in m.receive(0, bcast)] == [1, 2, 3]
    m.write(0x06C, 1)
    assert m.read(0x06C) == 1
    assert m.receive(0, unknown) == [] and m.receive(1, bcast) == []
    assert m.receive(0, known) == [(2, known)]
    ip = ordinary(MAC_B.to_bytes(6, "big"))
    assert [p for p, _ in m.receive(0, ip)] == [1, 2, 3]
    assert drops(m) == {"NO_ROUTE": 2}
    check_invariant(m)


# ----------------------------------------------------------------------------- all-gather / broadcast
def test_all_gather_forwarded_to_results_minus_ingress():
    m = model_with(Rule.for_group(4, ALL, ALL))
    f = cais_frame([1, 2, 3], op=AG, group=4, seq=77)
    assert m.receive(1, f) == [(0, f), (2, f), (3, f)]
    c = m.counters()
    assert c["FORWARDED"] == 1 and c["CONTRIBUTIONS"] == 0 and c["SLOTS_IN_USE"] == 0
    padded = cais_frame([9], op=AG, group=4, pad_to=60)
    assert m.receive(0, padded) == [(1, padded), (2, padded), (3, padded)]   # unchanged, pad included
    check_invariant(m)


def test_broadcast_forwarding_foreign_and_no_route():
    m = model_with(Rule.for_group(5, 0b0001, 0b1110), Rule.for_group(6, 0b0010, 0b0010))
    f = cais_frame([1], op=BC, group=5)
    assert m.receive(0, f) == [(1, f), (2, f), (3, f)]
    assert m.receive(1, f) == []
    assert drops(m) == {"FOREIGN_PORT": 1}
    assert m.receive(1, cais_frame([1], op=BC, group=6)) == []
    assert drops(m) == {"FOREIGN_PORT": 1, "NO_ROUTE": 1}
    check_invariant(m)


# ----------------------------------------------------------------------------- tables
def test_slot_clear():
    m = model_with(Rule.for_group(1, 0b0011, base=5))
    contribute(m, 0, 0, [1])
    contribute(m, 1, 1, [1])
    m.receive(2, ordinary(b"\xff" * 6))
    model6 = model_with(Rule.for_group(1, 0b0011, base=6))
    contribute(model6, 0, 0, [1])
    assert m.slot_state(5) == ((0b0001, 0, False), (0b0010, 1, False))
    assert m.counters()["SLOTS_IN_USE"] == 2
    apply(m, slot_clear_writes(RM, 5, 1))
    assert m.slot_state(5) == ((0, 0, False), (0, 0, False))
    assert m.counters()["SLOTS_IN_USE"] == 0
    assert contribute(m, 0, 2, [1]) == []                         # would have been TAG_MISMATCH
    assert drops(m) == {} and m.slot_state(5)[0] == (0b0001, 2, False)


def test_slot_clear_forgets_completed_result():
    m = model_with(Rule.for_group(1, 0b0011, base=2, count_log2=1))
    contribute(m, 0, 1, [1])
    contribute(m, 1, 1, [1])
    contribute(m, 0, 0, [4])                                      # slot 2 busy
    assert m.slot_state(3) == ((0b0011, 1, True), (0, 0, False))
    apply(m, slot_clear_writes(RM, 3, 1))                         # only slot 3
    assert m.slot_state(2) == ((0b0001, 0, False), (0, 0, False))
    assert contribute(m, 0, 1, [1]) == []                         # no resend: a new first contribution
    assert m.slot_state(3) == ((0b0001, 1, False), (0, 0, False))
    assert m.counters()["RESULTS_RESENT"] == 0


def test_rule_priority_lowest_index_wins():
    m = model_with(Rule.for_group(7, 0b0011, 0b0011), Rule(contributors=ALL, results=ALL))
    f7 = cais_frame([1], op=AG, group=7)
    assert m.receive(0, f7) == [(1, f7)]
    f8 = cais_frame([1], op=AG, group=8)
    assert m.receive(0, f8) == [(1, f8), (2, f8), (3, f8)]
    assert m.receive(2, f7) == []                                 # rule 0 wins: no fallback to rule 1
    assert drops(m) == {"FOREIGN_PORT": 1}
    apply(m, rule_writes(RM, 0, None, valid=False))
    assert m.receive(2, f7) == [(0, f7), (1, f7), (3, f7)]
    # a specific rule after a wildcard never matches
    m = model_with(Rule(contributors=ALL, results=0b0001), Rule.for_group(7, ALL, ALL))
    assert m.receive(2, f7) == [(0, f7)]


def test_wildcard_masks():
    m = model_with(
        Rule(chunk=(1, 0x0001), contributors=0b0001, results=0b0010),          # odd chunks
        Rule(layer=(0x0100, 0xFF00), contributors=0b0001, results=0b0100),     # layers 0x100..0x1ff
        Rule(group=(0x20, 0xF0), contributors=0b0001, results=0b1000),         # groups 0x20..0x2f
        Rule(group=(0xFF, 0x0F), contributors=0b0001, results=0b1110),         # low nibble 0xf; value bits outside mask ignored
    )

    def route(group, layer, chunk):
        return [p for p, _ in m.receive(0, cais_frame([0], op=AG, group=group, layer=layer, chunk=chunk))]

    assert route(0, 0, 1) == [1]
    assert route(0, 0x0123, 2) == [2]
    assert route(0x2A, 0, 0) == [3]
    assert route(0x2A, 0x0150, 3) == [1]
    assert route(0x1F, 0, 0) == [1, 2, 3]
    assert route(0x0F, 0x0200, 4) == [1, 2, 3]
    assert route(0x30, 0x0200, 0) == []
    assert drops(m) == {"NO_RULE": 1}


def test_slots_in_use_counts_nonempty_sets():
    m = model_with(Rule.for_group(1, ALL, base=0, count_log2=3), Rule.for_group(2, 0b0001, base=40))
    assert m.counters()["SLOTS_IN_USE"] == 0
    for seq in range(8):
        contribute(m, 0, seq, [0])
    assert m.counters()["SLOTS_IN_USE"] == 8
    contribute(m, 0, 0, [0], group=2)                             # completes at once, still in use
    assert m.counters()["SLOTS_IN_USE"] == 9
    assert m.read(RM["SLOTS_IN_USE"].address()) == 9


# ----------------------------------------------------------------------------- table helpers
def test_rule_writes_hand_derived():
    writes = rule_writes(RM, 2, Rule.for_group(7, 0b1111, 0b0101, base=3, count_log2=2))
    assert writes == [(0x040, 0x0000FF07), (0x044, 0), (0x048, 0), (0x04C, 0x0005000F),
                      (0x050, 0x00020003), (0x058, 0), (0x054, 0x00000102)]
    writes = rule_writes(RM, 7, Rule(layer=(0x1234, 0xFFF0), chunk=(5, 0x000F)), valid=False)
    assert writes[1] == (0x044, 0xFFF01234) and writes[2] == (0x048, 0x000F0005) and writes[6] == (0x054, 7)
    # RULE_TYPE: dtype in 3:0, red_op in 7:4, acc_fp32 bit 8, saturate bit 9
    assert rule_writes(RM, 0, Rule.for_group(1, 1, dtype=FP16, red_op=MAX, acc_fp32=True))[5] == (0x058, 0x114)
    assert rule_writes(RM, 0, Rule.for_group(1, 1, dtype=INT8, red_op=MIN, saturate=True))[5] == (0x058, 0x222)
    assert mac_writes(RM, 3, MacEntry(0x0A0B0C0D0E0F, 2)) == [(0x060, 0x0C0D0E0F), (0x064, 0x0A0B),
                                                              (0x068, 0x00010203)]
    assert slot_clear_writes(RM, 4, 3) == [(0x028, 4), (0x028, 5), (0x028, 6)]


@pytest.mark.parametrize("make,field", [
    (lambda: rule_writes(RM, 0, Rule(group=(0x100, 0xFF))), "Rule.group.value"),
    (lambda: rule_writes(RM, 0, Rule(layer=(0, 0x10000))), "Rule.layer.mask"),
    (lambda: rule_writes(RM, 0, Rule(contributors=0x10)), "Rule.contributors"),
    (lambda: rule_writes(RM, 0, Rule(results=0x10000)), "Rule.results"),
    (lambda: rule_writes(RM, 0, Rule(base=0x10000)), "Rule.base"),
    (lambda: rule_writes(RM, 0, Rule(count_log2=32)), "Rule.count_log2"),
    (lambda: rule_writes(RM, 8, Rule()), "index"),
    (lambda: rule_writes(RM, 0, None), "rule"),
    (lambda: Rule(group=5), "Rule.group"),
    (lambda: Rule(contributors=-1), "Rule.contributors"),
    (lambda: Rule.for_group(256, 1), "Rule.group"),
    (lambda: MacEntry(1 << 48, 0), "MacEntry.mac"),
    (lambda: mac_writes(RM, 0, MacEntry(1, 4)), "MacEntry.port"),
    (lambda: mac_writes(RM, 16, MacEntry(1, 0)), "index"),
    (lambda: slot_clear_writes(RM, 60, 5), "slot_clear"),
])
def test_table_validation(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_rule_defaults():
    r = Rule()
    assert (r.group, r.layer, r.chunk) == ((0, 0), (0, 0), (0, 0))
    assert Rule.for_group(3, 0b0110).results == 0b0110
    assert Rule.for_group(3, 0b0110, count_log2=4).slot_count == 16


# ----------------------------------------------------------------------------- random mix
def test_accounting_invariant_random_mix():
    rng = random.Random(2024)
    m = model_with(
        Rule.for_group(1, ALL, ALL, base=0, count_log2=2),
        Rule.for_group(2, 0b0111, ALL, base=60, count_log2=3),     # partly outside the slot memory
        Rule(group=(0x10, 0xF0), contributors=0b0011, results=0b1111),
        Rule.for_group(6, ALL, ALL, base=20, count_log2=2, dtype=FP16, acc_fp32=True),
        macs=[MacEntry(MAC_A, 2), MacEntry(MAC_B, 0)],
    )
    rx_frames = [0] * 4
    rx_bytes = [0] * 4
    tx_frames = [0] * 4
    tx_bytes = [0] * 4
    for _ in range(3000):
        port = rng.randrange(4)
        kind = rng.random()
        framing_ok = rng.random() > 0.03
        if kind < 0.2:
            dst = rng.choice([MAC_A, MAC_B, 0xFFFFFFFFFFFF, 0x020000000099, 0x01005E000001])
            frame = ordinary(dst.to_bytes(6, "big"), src_port=port, length=rng.choice([13, 14, 60, 64, 1514, 1515]))
            if rng.random() < 0.1:          # MAC_A's source (bound to port 2) from any port
                frame = frame[:6] + MAC_A.to_bytes(6, "big") + frame[12:]
        else:
            seq = rng.randrange(12)
            # mostly one payload_len per chunk (as workers send), sometimes another (LENGTH_MISMATCH)
            plen = [4, 8, 64, 4, 8, 64][seq % 6] if rng.random() < 0.8 else rng.choice([4, 8, 64, 256, 0, 6, 260])
            op = rng.choice([AR, AR, AR, AG, BC, RS, 9])
            group = rng.choice([1, 1, 2, 0x13, 5, 6, 6])
            dtype = (FP16 if group == 6 else INT32) if rng.random() < 0.9 else rng.choice([INT16, FP32, 7])
            frame = cais_frame(payload=bytes(rng.randrange(256) for _ in range(plen)), src_port=port,
                               op=op, group=group, seq=seq,
                               red_op=rng.choice([SUM, SUM, SUM, SUM, MAX, MIN, 3]), dtype=dtype,
                               flags=rng.choice([0, 0, 0, RETRANSMIT, RESULT]), plen=plen)
            r = rng.random()
            if r < 0.05:
                frame = frame[:-1]
            elif r < 0.1:
                frame = frame + b"\0" * max(0, 60 - len(frame)) if len(frame) < 60 else frame + b"\0"
            elif r < 0.12:
                frame = frame[:rng.randrange(31)]
        out = m.receive(port, frame, framing_ok=framing_ok, fcs_ok=rng.random() > 0.02)
        rx_frames[port] += 1
        rx_bytes[port] += len(frame)
        assert [p for p, _ in out] == sorted(p for p, _ in out)
        for p, f in out:
            tx_frames[p] += 1
            tx_bytes[p] += len(f)
        check_invariant(m)
        if rng.random() < 0.01:
            apply(m, slot_clear_writes(RM, rng.randrange(8), 1))
    c = m.counters()
    assert c["RX_FRAMES"] == rx_frames and c["RX_BYTES"] == rx_bytes
    assert c["TX_FRAMES"] == tx_frames and c["TX_BYTES"] == tx_bytes
    assert c["SLOTS_IN_USE"] == sum((st[0] != 0) for s in range(P.slots) for st in m.slot_state(s))
    # every reason and every outcome happened at least once in the mix
    for n in DROP_NAMES:
        assert c[f"DROP_{n}"] > 0 or n == "PAYLOAD_TOO_LONG", n
    for n in ("FORWARDED", "CONTRIBUTIONS", "DUPLICATES", "COMPLETED", "RESULTS_RESENT"):
        assert c[n] > 0, n


# ----------------------------------------------------------------------------- element types (RULE_TYPE)
# Expected float results are computed here with numpy's own float32 / float16 arithmetic in arrival order,
# and bfloat16 with exact fractions and a hand-written round-to-nearest-even; never with cais.numerics.
FP32_QNAN, FP16_QNAN, BF16_QNAN = 0x7FC00000, 0x7E00, 0x7FC0


def typed_frame(payload, dtype, red_op=SUM, **kw):
    return cais_frame(payload=payload, dtype=dtype, red_op=red_op, **kw)


def run_in_order(rule, dtype, payloads, red_op=SUM, seq=0, m=None, ports=None, params=P):
    """Contributions in the given order (port i sends payloads[i]); returns (model, result payload)."""
    m = m or model_with(rule, params=params)
    ports = list(range(len(payloads))) if ports is None else ports
    out = []
    for port, payload in zip(ports, payloads):
        out = m.receive(port, typed_frame(payload, dtype, red_op, seq=seq, src_port=port))
    assert out, drops(m)
    return m, out[0][1][30:]


def f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def test_rule_type_staging_register():
    m = SwitchModel(P)
    m.write(0x058, 0xFFFF_FFFF)
    assert m.read(0x058) == 0x7FF       # dtype 3:0, red_op 7:4, acc_fp32 8, saturate 9, reproducible 10
    rf = RegisterFile(m, RM)
    rf.write("RULE_GROUP", value=4, mask=0xFF)
    rf.write("RULE_PORTS", contributors=0b0011, results=0b0011)
    rf.write("RULE_TYPE", dtype=INT16, red_op=MIN, acc_fp32=0, saturate=0)
    rf.write("RULE_WRITE", index=0, valid=1)
    rf.write("RULE_GROUP", value=5, mask=0xFF)              # RULE_TYPE keeps its value for the next rule
    rf.write("RULE_SLOTS", base=1, count_log2=0)
    rf.write("RULE_WRITE", index=1, valid=1)
    vals = lambda *v: np.asarray(v, dtype=">i2").tobytes()
    for group in (4, 5):
        assert m.receive(0, typed_frame(vals(5, -7), INT16, MIN, group=group)) == []
        out = m.receive(1, typed_frame(vals(-3, 2), INT16, MIN, group=group, src_port=1))
        assert out[0][1][30:] == vals(-3, -7)
    assert m.receive(0, typed_frame(vals(1, 1), INT16, SUM, group=4, seq=1)) == []
    assert m.receive(0, typed_frame(vals(1, 1), INT32, MIN, group=4, seq=1)) == []
    assert drops(m) == {"TYPE_MISMATCH": 2}
    check_invariant(m)


def test_type_mismatch_dtype_and_red_op_change_nothing():
    m = model_with(Rule.for_group(1, ALL, count_log2=0))    # int32 SUM; one slot: seq 0 set 0, seq 1 set 1
    for p in range(4):
        contribute(m, p, 0, [p])
    contribute(m, 0, 1, [1])
    state = m.slot_state(0)
    assert state == ((0b1110, 0, True), (0b0001, 1, False))
    i16 = np.asarray([1, 2], dtype=">i2").tobytes()
    assert m.receive(1, typed_frame(i16, INT16, seq=1, src_port=1)) == []              # dtype
    assert m.receive(1, cais_frame([1], seq=1, red_op=MAX, src_port=1)) == []          # red_op
    assert m.receive(2, cais_frame([1], seq=0, red_op=MIN, src_port=2)) == []          # no re-sent result
    assert m.receive(0, cais_frame([1], seq=1, red_op=MAX)) == []                      # not a duplicate
    assert drops(m) == {"TYPE_MISMATCH": 4}
    assert m.slot_state(0) == state                                                    # and no implicit ack
    c = m.counters()
    assert c["DUPLICATES"] == 0 and c["RESULTS_RESENT"] == 0 and c["CONTRIBUTIONS"] == 5
    check_invariant(m)


def test_rule_checks_order():
    fp16 = lambda n: np.zeros(n, dtype=">f2").tobytes()
    m = model_with(Rule.for_group(1, 0b0111, count_log2=0, dtype=FP16, acc_fp32=True),
                   Rule.for_group(2, ALL, base=P.slots, dtype=FP16, acc_fp32=True))   # quota outside memory
    assert m.receive(3, typed_frame(fp16(100), INT16, group=1, src_port=3)) == []
    assert drops(m) == {"FOREIGN_PORT": 1}                  # before TYPE_MISMATCH
    assert m.receive(0, typed_frame(fp16(100), BF16, group=1)) == []
    assert drops(m) == {"FOREIGN_PORT": 1, "TYPE_MISMATCH": 1}   # before BAD_SLOT
    assert m.receive(0, typed_frame(fp16(128), FP16, group=2)) == []
    assert drops(m)["BAD_SLOT"] == 1
    assert m.receive(0, typed_frame(fp16(4), FP16, group=1, seq=0)) == []
    assert m.receive(0, typed_frame(fp16(4), FP16, group=1, seq=2)) == []
    assert drops(m) == {"FOREIGN_PORT": 1, "TYPE_MISMATCH": 1, "BAD_SLOT": 1, "TAG_MISMATCH": 1}
    # all-gather and broadcast are forwarded whatever their dtype, red_op and length
    for op in (AG, BC):
        f = typed_frame(fp16(128), INT8, MAX, op=op, group=1)
        assert [p for p, _ in m.receive(0, f)] == [1, 2]
    check_invariant(m)


@pytest.mark.parametrize("dtype,acc", [(FP16, True), (BF16, True), (FP16, False), (BF16, False), (FP32, True),
                                       (INT16, True), (INT8, True), (INT32, False)])
@pytest.mark.parametrize("reproducible", [False, True])
def test_every_kind_holds_max_payload(dtype, acc, reproducible):
    """Each port's contribution has its own bank, so every kind of rule takes max_payload bytes."""
    m = model_with(Rule.for_group(1, 0b0001, dtype=dtype, acc_fp32=acc, reproducible=reproducible))
    out = m.receive(0, typed_frame(bytes(P.max_payload), dtype))
    assert drops(m) == {}
    assert out == [(0, result_frame(payload=bytes(P.max_payload), dtype=dtype))]


def test_float_units_false_drops_float_codes():
    params = SwitchParams(float_units=False)
    assert params.dtypes == (INT32, INT16, INT8) and SwitchParams().dtypes == tuple(range(6))
    m = model_with(Rule.for_group(1, ALL, dtype=FP32), Rule.for_group(2, 0b0001, dtype=INT8), params=params)
    for dtype in (FP32, FP16, BF16):
        assert m.receive(0, typed_frame(bytes(8), dtype)) == []
        assert m.receive(0, typed_frame(bytes(8), dtype, op=AG)) == []     # every CAIS frame is checked
    assert drops(m) == {"BAD_CODE": 6}
    assert m.receive(0, typed_frame(bytes(8), INT16)) == []                # an integer type: the rule decides
    assert drops(m) == {"BAD_CODE": 6, "TYPE_MISMATCH": 1}
    out = m.receive(0, typed_frame(bytes([1, 2, 0xFF]), INT8, group=2))
    assert out == [(0, result_frame(payload=bytes([1, 2, 0xFF]), dtype=INT8, group=2))]
    m = model_with(Rule.for_group(1, 0b0001, dtype=FP32))                   # with float units: reduced
    assert len(m.receive(0, typed_frame(bytes(8), FP32))) == 1


def test_fp32_sum_in_port_order_whatever_the_arrival_order():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-40, 40, (4, 64)))).astype(np.float32)
    x[:, 0] = [2.0**24, 1, -2.0**24, 1]           # order matters: ((2**24 + 1) - 2**24) + 1 = 1, not 2
    rule = Rule.for_group(1, ALL, dtype=FP32)
    want = x[0].copy()
    for p in (1, 2, 3):
        want = want + x[p]                         # float32 + float32: IEEE binary32 addition
    assert want[0] == 1.0
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]):
        _, got = run_in_order(rule, FP32, [x[p].astype(">f4").tobytes() for p in order], ports=order)
        assert got == want.astype(">f4").tobytes(), order


def test_fp32_special_values_hand_derived():
    tiny, big = 2.0**-149, float(np.finfo(np.float32).max)
    cols = [  # contributions of ports 0, 1 in order -> result bits
        ((np.inf, 1.0), 0x7F800000), ((np.inf, -np.inf), FP32_QNAN), ((-np.inf, -big), 0xFF800000),
        ((-0.0, -0.0), 0x80000000), ((-0.0, 0.0), 0x00000000), ((0.0, -0.0), 0x00000000),
        ((1.5, -1.5), 0x00000000), ((tiny, tiny), 0x00000002), ((-tiny, tiny), 0x00000000),
        ((2.0**-126 - tiny, tiny), 0x00800000),                  # largest subnormal + smallest: smallest normal
        ((big, big), 0x7F800000), ((-big, -big), 0xFF800000),
        ((big, 2.0**103), 0x7F800000),                           # largest + half an ulp: tie, rounds to inf
        ((2.0**24, 1.0), 0x4B800000), ((2.0**24 + 2, 1.0), 0x4B800002),   # ties to even: down, then up
    ]
    a = np.array([c[0][0] for c in cols], dtype=np.float32)
    b = np.array([c[0][1] for c in cols], dtype=np.float32)
    want = np.array([c[1] for c in cols], dtype=np.uint32)
    want[-1] = f32_bits(2.0**24 + 4)                          # 2**24 + 3 -> 2**24 + 4
    nan_in = [0xFF800001, 0x7FA12345, 0x7FC00001]          # signalling, payloads, negative: all NaN
    a = np.concatenate([f32_bits(a), nan_in, f32_bits([1.0])]).astype(">u4")
    b = np.concatenate([f32_bits(b), f32_bits([1.0, 2.0, 3.0]), nan_in[:1]]).astype(">u4")
    want = np.concatenate([want, [FP32_QNAN] * 4]).astype(np.uint32)
    _, got = run_in_order(Rule.for_group(1, 0b0011, dtype=FP32), FP32, [a.tobytes(), b.tobytes()])
    assert [hex(v) for v in np.frombuffer(got, ">u4")] == [hex(v) for v in want]


def test_fp16_wire_versus_fp32_accumulation():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-12, 10, (4, 64)))).astype(np.float16)
    x[:, 0] = [2048, 1, 1, 1]
    wire = x[0].copy()
    for p in range(1, 4):
        wire = wire + x[p]                              # float16 + float16: rounded to float16 each time
    wide = x[0].astype(np.float32)
    for p in range(1, 4):
        wide = wide + x[p].astype(np.float32)
    once = wide.astype(np.float16)                      # rounded once, at the end
    payloads = [x[p].astype(">f2").tobytes() for p in range(4)]
    _, got_wire = run_in_order(Rule.for_group(1, ALL, dtype=FP16), FP16, payloads)
    m, got_acc = run_in_order(Rule.for_group(1, ALL, dtype=FP16, acc_fp32=True), FP16, payloads)
    assert got_wire == wire.astype(">f2").tobytes()
    assert got_acc == once.astype(">f2").tobytes()
    # 2048 + 1 + 1 + 1: each +1 is a tie that rounds back to 2048; in fp32 the sum is 2051, a tie -> 2052
    assert np.frombuffer(got_wire, ">u2")[0] == 0x6800 and np.frombuffer(got_acc, ">u2")[0] == 0x6802
    assert got_wire != got_acc
    acc = m.values(0, 0)                 # float32, one per element of the longest fp16 payload (128)
    assert acc.dtype == np.float32 and len(acc) == 128 and np.array_equal(acc[:64], wide)


def test_fp16_special_values_hand_derived():
    cols = [((np.inf, -np.inf), FP16_QNAN), ((65504, 16), 0x7C00), ((65504, 8), 0x7BFF),
            ((-0.0, -0.0), 0x8000), ((2.0**-24, 2.0**-24), 0x0002), ((2.0**-14, -2.0**-24), 0x03FF)]
    a = np.array([c[0][0] for c in cols], dtype=np.float16)
    b = np.array([c[0][1] for c in cols], dtype=np.float16)
    payloads = [np.append(a, np.uint16(0xFC01).view(np.float16)).astype(">f2").tobytes(),
                np.append(b, np.float16(1)).astype(">f2").tobytes()]
    want = [c[1] for c in cols] + [FP16_QNAN]
    for acc in (False, True):
        _, got = run_in_order(Rule.for_group(1, 0b0011, dtype=FP16, acc_fp32=acc), FP16, payloads)
        assert list(np.frombuffer(got, ">u2")) == want, acc


def _bf16_value(bits):
    return Fraction(float((np.uint32(bits) << np.uint32(16)).view(np.float32)))


def _bf16_round(x: Fraction, neg_zero=False) -> int:
    """Exact rational -> bfloat16 bits, round to nearest even (8 significant bits, emin -126)."""
    if x == 0:
        return 0x8000 if neg_zero else 0
    sign, x = (0x8000, -x) if x < 0 else (0, x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    e = max(e, -126)
    quantum = Fraction(2) ** (e - 7)
    q, r = divmod(x, quantum)
    if r * 2 > quantum or (r * 2 == quantum and q % 2):
        q += 1
    value = q * quantum
    if value >= Fraction(2) ** 128:
        return sign | 0x7F80
    return sign | int(np.float32(float(value)).view(np.uint32) >> 16)


def test_bf16_wire_and_fp32_accumulation_exact_reference():
    rng = np.random.default_rng(9)
    f = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-130, 120, (4, 64)))).astype(np.float32)
    x = (f.view(np.uint32) >> 16).astype(np.uint16)          # truncated to bf16: any bf16 values will do
    x[:, 0] = [0x4380, 0x3F80, 0x3F80, 0x3F80]               # 256 + 1 + 1 + 1
    x[:, 1] = [0x0001, 0x0001, 0x8001, 0x0001]               # subnormals: 2**-133 steps
    payloads = [x[p].astype(">u2").tobytes() for p in range(4)]
    wire = list(x[0])
    for p in range(1, 4):
        wire = [_bf16_round(_bf16_value(a) + _bf16_value(b), a == b == 0x8000) for a, b in zip(wire, x[p])]
    wide = (x[0].astype(np.uint32) << 16).view(np.float32)
    for p in range(1, 4):
        wide = wide + (x[p].astype(np.uint32) << 16).view(np.float32)
    once = [_bf16_round(Fraction(float(v)), bool(np.signbit(v))) for v in wide]
    _, got_wire = run_in_order(Rule.for_group(1, ALL, dtype=BF16), BF16, payloads)
    _, got_acc = run_in_order(Rule.for_group(1, ALL, dtype=BF16, acc_fp32=True), BF16, payloads)
    assert list(np.frombuffer(got_wire, ">u2")) == wire
    assert list(np.frombuffer(got_acc, ">u2")) == once
    # 256 + 1 + 1 + 1: ties back to 256 (0x4380) each time in bf16; 259 in fp32, a tie -> 260 (0x4382)
    assert wire[0] == 0x4380 and once[0] == 0x4382 and wire[1] == once[1] == 0x0002


@pytest.mark.parametrize("dtype,scale,wrap,sat", [(INT8, 16, 32, -33), (INT16, 4096, 8192, -8193)])
def test_narrow_int_sum_wrap_and_saturate(dtype, scale, wrap, sat):
    """docs/numerics.md section 7: 7 - 5 + 5 + 5 - 3 - 7 scaled, folded in port order (port p sends the
    p-th term) whether the frames arrive in that order or reversed."""
    params = SwitchParams(ports=6)
    seq4 = [7, -5, 5, 5, -3, -7]
    fmt = ">i1" if dtype == INT8 else ">i2"
    payloads = [np.asarray([v * scale, 1], dtype=fmt).tobytes() for v in seq4]
    for saturate, want in ((False, wrap), (True, sat)):
        rule = Rule.for_group(1, 0b111111, dtype=dtype, saturate=saturate)
        _, got = run_in_order(rule, dtype, payloads, params=params)
        assert list(np.frombuffer(got, fmt)) == [want, 6]
        _, got = run_in_order(rule, dtype, payloads[::-1], ports=list(range(6))[::-1], params=params)
        assert list(np.frombuffer(got, fmt)) == [want, 6]


def test_narrow_int_max_min_signed():
    for dtype, fmt in ((INT16, ">i2"), (INT8, ">i1")):
        lo, hi = (-2**15, 2**15 - 1) if dtype == INT16 else (-128, 127)
        a = np.asarray([lo, hi, -1, 0, 5], dtype=fmt).tobytes()
        b = np.asarray([hi, lo, 1, -1, 5], dtype=fmt).tobytes()
        for op, want in ((MAX, [hi, hi, 1, 0, 5]), (MIN, [lo, lo, -1, -1, 5])):
            _, got = run_in_order(Rule.for_group(1, 0b0011, dtype=dtype, red_op=op), dtype, [a, b], red_op=op)
            assert list(np.frombuffer(got, fmt)) == want


def test_float_max_min_zero_ties():
    """docs/numerics.md section 4: on -0 / +0 float32 (and bf16, and fp16 accumulated in fp32) return the
    incoming value, float16 the stored one; NaN wins and comes out canonical."""
    cases = [(FP32, False, ">f4", 0x80000000, FP32_QNAN), (FP16, False, ">f2", 0x8000, FP16_QNAN),
             (FP16, True, ">f2", 0x8000, FP16_QNAN), (BF16, False, ">u2", 0x8000, BF16_QNAN),
             (BF16, True, ">u2", 0x8000, BF16_QNAN)]
    for dtype, acc, fmt, neg0, qnan in cases:
        ufmt = ">u4" if fmt == ">f4" else ">u2"
        one = {FP32: 0x3F800000, FP16: 0x3C00, BF16: 0x3F80}[dtype]
        nan = qnan | 1 if dtype == FP32 else qnan | 1
        first = np.asarray([neg0, 0, neg0, nan, one], dtype=ufmt).tobytes()
        second = np.asarray([0, neg0, neg0, one, nan], dtype=ufmt).tobytes()
        incoming = dtype != FP16 or acc
        for op in (MAX, MIN):
            rule = Rule.for_group(1, 0b0011, dtype=dtype, red_op=op, acc_fp32=acc)
            _, got = run_in_order(rule, dtype, [first, second], red_op=op)
            want = [0 if incoming else neg0, neg0 if incoming else 0, neg0, qnan, qnan]
            assert [hex(v) for v in np.frombuffer(got, ufmt)] == [hex(v) for v in want], (dtype, acc, op)


def test_length_mismatch_keeps_the_set():
    """A chunk's first contribution fixes its payload_len (docs/protocol.md 7.3): a frame of the same chunk
    with another payload_len is dropped as LENGTH_MISMATCH before and after completion, changes nothing
    and acknowledges nothing; the set completes with the frames of the right length."""
    m = model_with(Rule.for_group(1, 0b0111, dtype=FP16, acc_fp32=True, count_log2=0))
    f16 = lambda *v: np.asarray(v, dtype=">f2").tobytes()
    m.receive(0, typed_frame(f16(1.5, 2), FP16))
    m.receive(1, typed_frame(f16(1, 2, -0.0, 4), FP16, src_port=1))          # longer: dropped
    m.receive(1, typed_frame(f16(1), FP16, src_port=1))                      # shorter: dropped
    assert drops(m) == {"LENGTH_MISMATCH": 2}
    assert m.slot_state(0)[0] == (0b0001, 0, False)
    m.receive(1, typed_frame(f16(1, 1), FP16, src_port=1))
    out = m.receive(2, typed_frame(f16(0.5, -1), FP16, src_port=2))
    assert [p for p, _ in out] == [0, 1, 2] and out[0][1][30:] == f16(3, 2)
    assert m.receive(2, typed_frame(f16(0.5, -1, 0, 0), FP16, src_port=2)) == []   # a longer repeat: no resend
    assert drops(m) == {"LENGTH_MISMATCH": 3}
    assert m.counters()["RESULTS_RESENT"] == 0 and m.counters()["DUPLICATES"] == 0
    # seq 1 (set 1): the dropped frame did not acknowledge set 0 for port 0 ...
    m.receive(0, typed_frame(f16(1, 2, 3), FP16, seq=1))
    assert m.slot_state(0)[0][0] == 0b0110
    assert m.receive(0, typed_frame(f16(1, 2, 3, 4), FP16, seq=0)) == []      # ... and the stored length stays


def test_values_accessor_types():
    m = SwitchModel(P)
    assert m.values(3, 1).dtype == np.int32 and len(m.values(3, 1)) == 64 and not m.values(3, 1).any()
    for dtype, acc, want, n in ((INT32, False, np.int32, 64), (INT16, False, np.int16, 128),
                                (INT8, False, np.int8, 256), (FP32, False, np.float32, 64),
                                (FP16, False, np.float16, 128), (FP16, True, np.float32, 128),
                                (BF16, False, np.uint16, 128), (BF16, True, np.float32, 128)):
        m = model_with(Rule.for_group(1, 0b0011, dtype=dtype, acc_fp32=acc))
        m.receive(0, typed_frame(bytes(8), dtype))
        v = m.values(0, 0)
        assert v.dtype == want and len(v) == n, dtype


def test_reproducible_folds_in_port_order():
    """A reproducible rule gives the bits of arrival in ascending port order, whatever the real order."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((4, 12)) * np.exp2(rng.integers(-30, 30, (4, 12)))).astype(np.float32)
    x[:, 0] = [1, 2.0**24, 1, -2.0**24]           # port order: ((1 + 2**24) - ...) differs from other orders
    want = x[0].copy()
    for p in (1, 2, 3):
        want = want + x[p]
    rule = Rule.for_group(1, ALL, dtype=FP32, reproducible=True)
    payloads = [x[p].astype(">f4").tobytes() for p in range(4)]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        m, got = run_in_order(rule, FP32, [payloads[p] for p in order], ports=order)
        assert got == want.astype(">f4").tobytes(), order
        assert np.array_equal(m.values(0, 0)[:12], want)
    # int8 saturating sums too: 7 - 5 + 5 + 5 (x16) in port order clamps at 127 after 112 + -80 + 80 + 80
    m = model_with(Rule.for_group(1, ALL, dtype=INT8, saturate=True, reproducible=True))
    for port, v in ((3, 80), (1, -80), (0, 112), (2, 80)):
        out = m.receive(port, typed_frame(np.int8(v).tobytes(), INT8, src_port=port))
    assert out[0][1][30:] == bytes([127])          # 112 - 80 = 32, + 80 = 112, + 80 = 192 -> 127


