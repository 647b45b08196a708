"""The reference model's per-rule sets in use (SETS_IN_USE) and set aging (AGING, AGED*, the event queue)
against hand-derived cases: the expected counts, cycles and events are worked out here from the register
docs (docs/registers.md, AGING), never by asking the model."""

import struct

import numpy as np
import pytest

from cais.params import MAX_RULES, SwitchParams
from cais.registers import AGE_UNIT_LOG2, AGED_QUEUE_DEPTH, RegisterFile, aging_period, register_map
from cais.sim.refmodel import SwitchModel
from cais.tables import Rule, rule_writes, slot_clear_writes

P = SwitchParams(ports=4, slots=8, rules=4)
RM = register_map(P)
UNIT = 1 << AGE_UNIT_LOG2
ETYPE = b"\x88\xb5"


def frame(port, seq, group=1, values=(1, 2)):
    payload = np.asarray(values, dtype=">i4").tobytes()
    hdr = struct.pack(">BBHHHIHBB", 0, group, 0, 0, 1, seq, len(payload), 0, 0)
    f = b"\xff" * 6 + bytes([2, 0, 0, 0, 0, port]) + ETYPE + hdr + payload
    return f + bytes(max(0, 60 - len(f)))


def switch(age=0, free=False):
    """Rule 1: group 1, ports 0-3, slots 0-3; rule 2: group 2, ports 0-1, slots 4-7 (rule 0 unused)."""
    m = SwitchModel(P)
    for addr, value in (rule_writes(RM, 1, Rule(group=(1, 0xFF), contributors=0b1111, results=0b1111,
                                                 base=0, count_log2=2))
                        + rule_writes(RM, 2, Rule(group=(2, 0xFF), contributors=0b0011, results=0b0011,
                                                  base=4, count_log2=2))):
        m.write(addr, value)
    if age:
        RegisterFile(m, RM).write("AGING", age=age, free=int(free))
    return m


def sets_in_use(m):
    return m.counters()["SETS_IN_USE"]


def event(m):
    ev = RM["AGED_EVENT"].unpack(m.read(RM["AGED_EVENT"].address()))
    ports = RM["AGED_PORTS"].unpack(m.read(RM["AGED_PORTS"].address()))
    return ev, ports


def test_registers_fit_free_offsets():
    # the new registers sit where nothing was, and the bound's constants are the documented ones
    assert RM["AGE_UNIT"].reset == UNIT == 1024
    assert aging_period(P) == 2 * 8 * 1024
    for p in (SwitchParams(rules=MAX_RULES), SwitchParams(slots=65536), SwitchParams(ports=16)):
        rm = register_map(p)
        assert rm.size <= 1024
        words = [r.address(i) for r in rm for i in range(r.count)]
        assert len(words) == len(set(words))


def test_sets_in_use_follow_the_writer():
    m = switch()
    assert sets_in_use(m) == [0, 0, 0, 0]
    m.receive(0, frame(0, seq=0))                 # rule 1: slot 0 set 0
    m.receive(0, frame(0, seq=1))                 # slot 1 set 0
    m.receive(1, frame(1, seq=0, group=2))        # rule 2: slot 4 set 0
    assert sets_in_use(m) == [0, 2, 1, 0]
    # seq 4 maps to slot 0 set 1: the port moves past set 0 (implicit ack empties it: only port 0 was in it)
    m.receive(0, frame(0, seq=4))
    assert m.slot_state(0)[0][0] == 0 and m.slot_state(0)[1][0] == 1
    assert sets_in_use(m) == [0, 2, 1, 0]
    # a duplicate writes the slot too (no change in its sets)
    m.receive(0, frame(0, seq=4))
    assert sets_in_use(m) == [0, 2, 1, 0]
    assert sum(sets_in_use(m)) == m.counters()["SLOTS_IN_USE"] == 3
    # a SLOT_CLEAR takes the slot's sets from its writer's count
    for addr, value in slot_clear_writes(RM, 1, 1):
        m.write(addr, value)
    assert sets_in_use(m) == [0, 1, 1, 0]


def test_sets_move_to_a_new_writer():
    # Rule 3 also maps group 2's frames onto slots 0-3 (overlapping quotas): slot 0's sets move to rule 3
    # when a rule-3 frame reaches it, even one that is refused (TAG_MISMATCH) and changes no set.
    m = switch()
    for addr, value in rule_writes(RM, 3, Rule(group=(3, 0xFF), contributors=0b1111, results=0b1111, base=0,
                                               count_log2=2)):
        m.write(addr, value)
    m.receive(0, frame(0, seq=0))
    m.receive(1, frame(1, seq=5))                 # slot 1 set 1
    assert sets_in_use(m) == [0, 2, 0, 0]
    m.receive(2, frame(2, seq=8, group=3))        # slot 0 set 0 holds tag 0: TAG_MISMATCH
    assert m.counters()["DROP_TAG_MISMATCH"] == 1
    assert sets_in_use(m) == [0, 1, 0, 1]
    assert m.counters()["SLOTS_IN_USE"] == 2


def test_aging_off_by_default():
    m = switch()
    assert m.read(RM["AGING"].address()) == 0
    m.receive(0, frame(0, seq=0))
    assert m.advance(10**9) == []
    c = m.counters()
    assert c["AGED_TOTAL"] == 0 and c["AGED"] == [0] * 4 and c["SLOTS_IN_USE"] == 1
    assert event(m)[0]["valid"] == 0


def test_dead_port_ages_after_the_age():
    age = 3
    m = switch(age=age)
    m.advance(100)
    m.receive(0, frame(0, seq=2))                 # slot 2 set 0, stamp 100
    m.advance(50)
    m.receive(1, frame(1, seq=2))                 # a second contribution at 150 restarts the age
    m.receive(2, frame(2, seq=2))                 # port 3 is dead
    # not aged at exactly age x unit cycles after the last contribution, aged one cycle later
    assert m.advance_to(150 + age * UNIT) == []
    assert m.advance(1) == [(2, 0, 1, 0b0111)]
    c = m.counters()
    assert c["AGED_TOTAL"] == 1 and c["AGED"] == [0, 1, 0, 0] and c["AGED_LOST"] == 0
    ev, ports = event(m)
    assert ev == {"slot": 2, "rule": 1, "set": 0, "valid": 1} and ports == {"ports": 0b0111, "queued": 1}
    # not freed: still in use, and aged only once in this fill, however long it waits
    assert c["SLOTS_IN_USE"] == 1 and sets_in_use(m) == [0, 1, 0, 0]
    assert m.advance(10 * age * UNIT) == []
    # duplicates of the live ports change nothing, the dead port's contribution completes the set
    m.receive(0, frame(0, seq=2))
    out = m.receive(3, frame(3, seq=2))
    assert len(out) == 4 and m.counters()["COMPLETED"] == 1
    m.write(RM["AGED_POP"].address(), 0)
    assert event(m)[0]["valid"] == 0 and event(m)[1]["queued"] == 0
    m.write(RM["AGED_POP"].address(), 0)          # popping an empty queue does nothing
    assert event(m)[0]["valid"] == 0


def test_set_fed_in_time_and_complete_set_never_age():
    m = switch(age=1)
    m.receive(0, frame(0, seq=0))                 # rule 1, slot 0 set 0: complete
    for p in (1, 2, 3):
        m.receive(p, frame(p, seq=0))
    for p in range(3):                            # slot 1 set 0: one more port within every age x unit cycles
        m.receive(p, frame(p, seq=1))
        assert m.advance(UNIT) == []
        m.receive(p, frame(p, seq=1))             # a duplicate: does not feed the set
    assert m.counters()["DUPLICATES"] == 3
    # the last contribution was UNIT cycles ago: one more cycle and it ages; the complete one never does
    assert m.advance(1) == [(1, 0, 1, 0b0111)]
    assert m.advance(100 * UNIT) == []
    assert m.counters()["AGED"] == [0, 1, 0, 0]


def test_free_releases_the_set_for_the_next_chunk():
    m = switch(age=2, free=True)
    m.receive(0, frame(0, seq=3, values=(5, 6)))
    m.receive(1, frame(1, seq=3, values=(5, 6)))
    assert sets_in_use(m) == [0, 1, 0, 0]
    assert m.advance(2 * UNIT + 1) == [(3, 0, 1, 0b0011)]
    c = m.counters()
    assert c["SLOTS_IN_USE"] == 0 and sets_in_use(m) == [0, 0, 0, 0] and c["AGED_TOTAL"] == 1
    assert m.slot_state(3) == ((0, 0, False), (0, 0, False))
    # the retransmission of the freed chunk by a live port starts a fresh fill, which may age again
    m.receive(0, frame(0, seq=3))
    assert m.counters()["CONTRIBUTIONS"] == 3 and m.slot_state(3)[0] == (1, 3, False)
    assert m.advance(2 * UNIT + 1) == [(3, 0, 1, 0b0001)]
    # the next chunk mapping to the set (seq 11: slot 3, set 0) starts it anew with only its own values
    for p in range(4):
        out = m.receive(p, frame(p, seq=11, values=(p, 10 * p)))
    payload = np.frombuffer(out[0][1][14 + 16:14 + 16 + 8], dtype=">i4")
    assert list(payload) == [0 + 1 + 2 + 3, 0 + 10 + 20 + 30]
    assert m.counters()["AGED_TOTAL"] == 2 and m.counters()["DROP_TAG_MISMATCH"] == 0


def test_queue_overflow_is_counted():
    m = switch(age=1)
    n = AGED_QUEUE_DEPTH + 2
    assert n <= 2 * P.slots
    for k in range(n):                            # group 1: slots 0-3, group 2: slots 4-7, both sets
        group, seq = (1, k) if k < 8 else (2, k - 8)
        port = seq >> 2 & 1                       # (so no frame acknowledges another's set)
        m.receive(port, frame(port, seq=seq, group=group))
    aged = m.advance(UNIT + 1)
    assert len(aged) == n and aged == sorted(aged)
    c = m.counters()
    assert c["AGED_TOTAL"] == n and c["AGED_LOST"] == n - AGED_QUEUE_DEPTH
    assert c["AGED"] == [0, 8, n - 8, 0]
    seen = []
    while event(m)[0]["valid"]:
        ev, ports = event(m)
        seen.append((ev["slot"], ev["set"], ev["rule"], ports["ports"]))
        assert ports["queued"] == AGED_QUEUE_DEPTH - len(seen) + 1
        m.write(RM["AGED_POP"].address(), 0)
    assert seen == aged[:AGED_QUEUE_DEPTH]


@pytest.mark.parametrize("free", [False, True])
def test_age_written_later_and_turned_off(free):
    m = switch()
    m.receive(0, frame(0, seq=0))
    m.advance(10 * UNIT)
    RegisterFile(m, RM).write("AGING", age=4, free=int(free))
    # the set has been idle for longer than the age: aged at once
    assert m.advance(0) == [(0, 0, 1, 1)]
    m.receive(0, frame(0, seq=1))
    RegisterFile(m, RM).write("AGING", 0)
    assert m.advance(100 * UNIT) == []
    assert m.counters()["AGED_TOTAL"] == 1
