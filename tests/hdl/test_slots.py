"""SlotUpdate against the set state machine of docs/protocol.md section 7.3, written here from the text.

A slot is two sets ``(bitmap, tag, done, length)``. For a contribution of port w with seq_num t and
payload_len n to set s, exactly one case applies, checked in order: a (tag == t and done: resend, or a
length mismatch when n differs from the set's length), b (bitmap == 0: first, the set takes length n),
c (tag != t: busy, nothing changes), a length mismatch (n differs from the set's length: nothing changes),
d (w in bitmap: repeat), e (further contribution). In every case but c and the length mismatch, port w's
bit of the other set is cleared (the implicit acknowledgement), unless the other set's tag is t + count
(the slot's next chunk, count = the group's quota): then the frame is a stale copy. ``in_use_delta`` is the change in the
number of sets with a non-empty bitmap. States written as 3-tuples have length 8, as have their frames.
"""

import itertools
import random

import pytest

from cais.hdl.sram.slots import SlotOutcome, SlotUpdate

from blocksim import run

LEN_BITS = 9
DEFAULT_LEN = 8


def reference(state, s, w, t, contributors, length=DEFAULT_LEN, count=1):
    """(outcome, complete, new_state, in_use_delta) per docs/protocol.md 7.3; new_state has the shape of
    ``state`` (3-tuples without the length, 4-tuples with it)."""
    with_len = len(state[0]) == 4
    sets = [dict(bitmap=x[0], tag=x[1], done=x[2], length=x[3] if with_len else DEFAULT_LEN) for x in state]
    cur, other = sets[s], sets[1 - s]
    me = 1 << w
    complete = False
    if cur["tag"] == t and cur["done"]:
        outcome = "RESEND" if cur["length"] == length else "LENGTH_MISMATCH"
    elif cur["bitmap"] == 0:
        outcome = "FIRST"
        cur.update(bitmap=me, tag=t, done=(me == contributors), length=length)
        complete = cur["done"]
    elif cur["tag"] != t:
        outcome = "MISMATCH"
    elif cur["length"] != length:
        outcome = "LENGTH_MISMATCH"
    elif cur["bitmap"] & me:
        outcome = "REPEAT"
    else:
        outcome = "ADD"
        cur["bitmap"] |= me
        if cur["bitmap"] == contributors:
            cur["done"] = True
            complete = True
    if outcome not in ("MISMATCH", "LENGTH_MISMATCH") and other["tag"] != (t + count) % 2**32:
        other["bitmap"] &= ~me
    new = tuple((x["bitmap"], x["tag"], bool(x["done"])) + ((x["length"],) if with_len else ()) for x in sets)
    delta = sum(x[0] != 0 for x in new) - sum(x[0] != 0 for x in state)
    return outcome, complete, new, delta


def check_cases(ports, cases):
    """``cases``: iterable of (state, set, port, tag, contributors[, length[, count]]), states as 3- or
    4-tuples; compares the block with reference()."""
    dut = SlotUpdate(ports, LEN_BITS)
    failures = []
    counts = {}

    async def tb(ctx):
        for state, s, w, t, contrib, *rest in cases:
            n, count = (list(rest) + [DEFAULT_LEN, 1][len(rest):])[:2]
            state = tuple(tuple(x) + (() if len(x) == 4 else (DEFAULT_LEN,)) for x in state)
            ctx.set(dut.state, [{"bitmap": b, "tag": g, "done": int(d), "length": ln} for b, g, d, ln in state])
            ctx.set(dut.set, s)
            ctx.set(dut.port, w)
            ctx.set(dut.tag, t)
            ctx.set(dut.next_tag, (t + count) % 2**32)
            ctx.set(dut.length, n)
            ctx.set(dut.contributors, contrib)
            outcome, complete, new, delta = reference(state, s, w, t, contrib, n, count)
            counts[outcome] = counts.get(outcome, 0) + 1
            ns = ctx.get(dut.new_state)
            got = (SlotOutcome(ctx.get(dut.outcome)).name, bool(ctx.get(dut.complete)),
                   tuple((ns[i].bitmap, ns[i].tag, bool(ns[i].done), ns[i].length) for i in (0, 1)),
                   ctx.get(dut.in_use_delta))
            want = (outcome, complete, new, delta)
            if got != want and len(failures) < 5:
                failures.append(f"state={state} set={s} port={w} tag={t:#x} contributors={contrib:#b}: "
                                f"got {got}, want {want}")

    run(dut, tb, clock=False)
    assert not failures, "\n".join(failures)
    return counts


# ----------------------------------------------------------------------------- directed
def test_reference_against_protocol_example():
    """The reference itself replays the worked example of docs/protocol.md 7.5 (states copied from the doc)."""
    ALL = 0b1111
    st = ((0, 0, False), (0, 0, False))
    trace = []

    def send(port, seq):
        nonlocal st
        outcome, complete, st, _ = reference(st, seq % 2, port, seq, ALL)
        trace.append((outcome, complete))
        return outcome, complete

    for p in (0, 1, 2):
        send(p, 0)
    assert st == ((0b0111, 0, False), (0, 0, False))
    assert send(3, 0) == ("ADD", True)
    assert st == ((0b1111, 0, True), (0, 0, False))
    send(0, 1)
    assert st == ((0b1110, 0, True), (0b0001, 1, False))
    assert send(2, 0) == ("RESEND", False)
    assert st == ((0b1110, 0, True), (0b0001, 1, False))
    assert send(1, 2) == ("MISMATCH", False)
    assert st == ((0b1110, 0, True), (0b0001, 1, False))
    for p in (1, 2, 3):
        send(p, 1)
    assert trace[-1] == ("ADD", True)
    assert st == ((0, 0, True), (0b1111, 1, True))
    send(1, 2)
    assert st == ((0b0010, 2, False), (0b1101, 1, True))


@pytest.mark.parametrize("ports", [4, 16])
def test_protocol_example_on_block(ports):
    """docs/protocol.md 7.5 on the block: each step's new_state fed back as the next state."""
    ALL = 0b1111
    dut = SlotUpdate(ports, LEN_BITS)
    expected = [
        # (port, seq, outcome, complete, set 0, set 1, in_use_delta)
        (0, 0, "FIRST", False, (0b0001, 0, False), (0, 0, False), 1),
        (1, 0, "ADD", False, (0b0011, 0, False), (0, 0, False), 0),
        (2, 0, "ADD", False, (0b0111, 0, False), (0, 0, False), 0),
        (3, 0, "ADD", True, (0b1111, 0, True), (0, 0, False), 0),
        (0, 1, "FIRST", False, (0b1110, 0, True), (0b0001, 1, False), 1),
        (2, 0, "RESEND", False, (0b1110, 0, True), (0b0001, 1, False), 0),
        (1, 2, "MISMATCH", False, (0b1110, 0, True), (0b0001, 1, False), 0),
        (1, 1, "ADD", False, (0b1100, 0, True), (0b0011, 1, False), 0),
        (2, 1, "ADD", False, (0b1000, 0, True), (0b0111, 1, False), 0),
        (3, 1, "ADD", True, (0, 0, True), (0b1111, 1, True), -1),
        (1, 2, "FIRST", False, (0b0010, 2, False), (0b1101, 1, True), 1),
    ]

    async def tb(ctx):
        state = [{"bitmap": 0, "tag": 0, "done": 0, "length": 0}, {"bitmap": 0, "tag": 0, "done": 0, "length": 0}]
        ctx.set(dut.contributors, ALL)
        ctx.set(dut.length, 8)
        for port, seq, outcome, complete, s0, s1, delta in expected:
            ctx.set(dut.state, state)
            ctx.set(dut.port, port)
            ctx.set(dut.tag, seq)
            ctx.set(dut.next_tag, seq + 1)
            ctx.set(dut.set, seq % 2)
            assert SlotOutcome(ctx.get(dut.outcome)).name == outcome, (port, seq)
            assert ctx.get(dut.complete) == complete, (port, seq)
            assert ctx.get(dut.in_use_delta) == delta, (port, seq)
            ns = ctx.get(dut.new_state)
            got = tuple((ns[i].bitmap, ns[i].tag, bool(ns[i].done)) for i in (0, 1))
            assert got == (s0, s1), (port, seq)
            state = [{"bitmap": b, "tag": g, "done": int(d), "length": 8} for b, g, d in got]

    run(dut, tb, clock=False)


@pytest.mark.parametrize("ports", [4, 16])
def test_each_case_directed(ports):
    """One hand-written example of each case a-e, both sets, with the expected result spelt out."""
    T, U = 0x1234_5678, 0xFFFF_FFFF
    C = 0b1011
    cases_and_expect = [
        # a: completed set with the same tag: RESEND; other set loses bit w; own set unchanged
        ((((0b1011, T, True), (0b0011, 9, False)), 0, 1, T, C),
         ("RESEND", False, ((0b1011, T, True), (0b0001, 9, False)), 0)),
        # a wins over b: a completed set whose bitmap emptied still resends to its own tag
        ((((0, T, True), (0b0010, 9, False)), 0, 1, T, C),
         ("RESEND", False, ((0, T, True), (0, 9, False)), -1)),
        # b: free set (done from an old chunk with another tag): first contribution, done cleared
        ((((0b0001, 7, False), (0, U, True)), 1, 0, T, C),
         ("FIRST", False, ((0, 7, False), (0b0001, T, False)), 0)),
        # b with a single contributor: complete at once
        ((((0, 0, False), (0, 0, False)), 0, 3, U, 0b1000),
         ("FIRST", True, ((0b1000, U, True), (0, 0, False)), 1)),
        # c: busy with another chunk (done or not): nothing changes, not even the other set
        ((((0b0010, 5, True), (0b0001, 3, False)), 0, 0, 7, C),
         ("MISMATCH", False, ((0b0010, 5, True), (0b0001, 3, False)), 0)),
        ((((0b0001, 3, False), (0b0010, 5, False)), 1, 0, 7, C),
         ("MISMATCH", False, ((0b0001, 3, False), (0b0010, 5, False)), 0)),
        # d: repeat before completion: own set unchanged, other set loses bit w
        ((((0b1001, 4, False), (0b0011, T, False)), 1, 1, T, C),
         ("REPEAT", False, ((0b1001, 4, False), (0b0011, T, False)), 0)),
        ((((0b1011, 4, True), (0b0011, T, False)), 1, 0, T, C),
         ("REPEAT", False, ((0b1010, 4, True), (0b0011, T, False)), 0)),
        # e: further contribution, not yet complete
        ((((0b0001, T, False), (0b0010, 2, True)), 0, 1, T, C),
         ("ADD", False, ((0b0011, T, False), (0, 2, True)), -1)),
        # e: completes
        ((((0b0011, T, False), (0b1000, 2, True)), 0, 3, T, C),
         ("ADD", True, ((0b1011, T, True), (0, 2, True)), -1)),
        # b takes the frame's length; the other set keeps its own
        ((((0, 7, False, 0), (0b0001, 9, False, 20)), 0, 0, T, C, 12),
         ("FIRST", False, ((0b0001, T, False, 12), (0, 9, False, 20)), 0)),
        # the chunk with another payload_len, before and after completion: nothing changes, no acknowledgement
        ((((0b0001, T, False, 12), (0b0010, 9, False, 12)), 0, 1, T, C, 16),
         ("LENGTH_MISMATCH", False, ((0b0001, T, False, 12), (0b0010, 9, False, 12)), 0)),
        ((((0b1011, T, True, 12), (0b0010, 9, False, 12)), 0, 1, T, C, 8),
         ("LENGTH_MISMATCH", False, ((0b1011, T, True, 12), (0b0010, 9, False, 12)), 0)),
        # a stale copy: the other set holds the slot's next chunk (T + count), so no acknowledgement, after
        # completion (a) and before (d); with count 4 the same tags are not next, so the bit is cleared
        ((((0b1011, T, True), (0b0011, T + 1, False)), 0, 1, T, C),
         ("RESEND", False, ((0b1011, T, True), (0b0011, T + 1, False)), 0)),
        ((((0b1011, T, False), (0b0010, T + 1, False)), 0, 1, T, C),
         ("REPEAT", False, ((0b1011, T, False), (0b0010, T + 1, False)), 0)),
        ((((0b1011, T, True), (0b0011, T + 1, False)), 0, 1, T, C, 8, 4),
         ("RESEND", False, ((0b1011, T, True), (0b0001, T + 1, False)), 0)),
        ((((0b1011, U, True), (0b0010, 3, False)), 0, 1, U, C, 8, 4),
         ("RESEND", False, ((0b1011, U, True), (0b0010, 3, False)), 0)),     # U + 4 wraps to 3
        # the tag is checked before the length
        ((((0b0001, 5, False, 12), (0, 9, False, 12)), 0, 1, T, C, 16),
         ("MISMATCH", False, ((0b0001, 5, False, 12), (0, 9, False, 12)), 0)),
    ]
    for (args, want) in cases_and_expect:
        assert reference(*args) == want, args          # the reference agrees with the hand-derived table
    check_cases(ports, [args for args, _ in cases_and_expect])


@pytest.mark.slow
def test_exhaustive_small_4_ports():
    """Every current bitmap, done, tag (equal/different), set, port, and a spread of other sets and contributors."""
    T = 0xCAFE_0001
    # the last: the slot's next chunk (T + count, count 1), so no implicit acknowledgement
    others = [(0, 0, False), (0b1111, 5, True), (0b0101, T, False), (0b0110, T + 1, False)]
    contribs = [0b1111, 0b1001, 0b0001]
    cases = []
    for bitmap, done, same_tag, s, w, other, contrib, length in itertools.product(
            range(16), (False, True), (True, False), (0, 1), range(4), others, contribs, (8, 12)):
        cur = (bitmap, T if same_tag else T + 3, done)
        state = (cur, other) if s == 0 else (other, cur)
        cases.append((state, s, w, T, contrib, length))
    counts = check_cases(4, cases)
    assert set(counts) == {"RESEND", "FIRST", "MISMATCH", "LENGTH_MISMATCH", "REPEAT", "ADD"}


# ----------------------------------------------------------------------------- random
@pytest.mark.parametrize("ports,seed", [(4, 11), (16, 12)])
def test_random_states(ports, seed):
    rng = random.Random(seed)
    full = (1 << ports) - 1

    def bitmap():
        r = rng.random()
        return 0 if r < 0.2 else full if r < 0.3 else rng.getrandbits(ports)

    cases = []
    for _ in range(2000):
        t = rng.choice([0, 0xFFFF_FFFF, rng.getrandbits(32)])
        count = 1 << rng.randrange(32)
        tags = [t, t ^ (1 << rng.randrange(32)), rng.getrandbits(32), (t + count) % 2**32]
        state = tuple((bitmap(), rng.choice(tags), rng.random() < 0.4, rng.choice((8, 8, 8, 12))) for _ in range(2))
        w = rng.randrange(ports)
        r = rng.random()
        if r < 0.3:            # contributors = the current bitmap plus w: an ADD completes
            s_guess = rng.randrange(2)
            contrib = state[s_guess][0] | (1 << w)
            s = s_guess
        else:
            contrib = full if r < 0.5 else rng.getrandbits(ports) | (1 << w)
            s = rng.randrange(2)
        cases.append((state, s, w, t, contrib, 8, count))
    counts = check_cases(ports, cases)
    assert min(counts.values()) > 50, counts
