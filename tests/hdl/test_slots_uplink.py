"""SetUpdate with the uplink action against the leaf's set of docs/protocol.md section 13.2, written here from
the text.

A local frame (from a rank's port w) meets the cases of section 7.3 with the sent state: a filled set under
the uplink action becomes sent, not done (its partial goes up: ``complete``); a repeat to a sent set (a')
re-sends the partial (``up_resend``, outcome REPEAT). The parent's result (``parent``) is checked in this
order: the set's tag is not the chunk's, or it is neither sent nor done: TAG_MISMATCH; another payload_len:
LENGTH_MISMATCH; done: a duplicate (REPEAT); sent: taken (ADD, accepted, complete, ``parent_done``), the set
done and no longer sent. The parent's result never changes a bitmap (no implicit acknowledgement).
"""

import itertools

from cais.hdl.sram.slots import SetUpdate, SlotOutcome

from blocksim import run

PORTS = 4


def reference(b, done, sent, teq, leq, other, other_newer, w, contributors, up, parent):
    """(outcome, first, accepted, complete, up_resend, parent_done, bitmap, done, sent, other bitmap)."""
    me = 1 << w
    first = accepted = complete = up_resend = parent_done = False
    if parent:
        if not teq or not (sent or done):
            outcome = "MISMATCH"
        elif not leq:
            outcome = "LENGTH_MISMATCH"
        elif done:
            outcome = "REPEAT"
        else:
            outcome, accepted, complete, parent_done = "ADD", True, True, True
            done, sent = True, False
        return outcome, first, accepted, complete, up_resend, parent_done, b, done, sent, other
    if teq and done:
        outcome = "RESEND" if leq else "LENGTH_MISMATCH"
    elif b == 0:
        outcome, first, accepted = "FIRST", True, True
        b, done, sent = me, False, False
    elif not teq:
        outcome = "MISMATCH"
    elif not leq:
        outcome = "LENGTH_MISMATCH"
    elif b & me:
        outcome = "REPEAT"
        up_resend = sent and up
    else:
        outcome, accepted = "ADD", True
        b |= me
    if accepted and b == contributors:          # filled: the partial goes up, or the result out
        complete = True
        if up:
            sent = True
        else:
            done, sent = True, False        # (a set done is not sent)
    if outcome not in ("MISMATCH", "LENGTH_MISMATCH") and not other_newer:
        other &= ~me
    return outcome, first, accepted, complete, up_resend, parent_done, b, done, sent, other


def test_every_state_and_frame_on_4_ports():
    """Every bitmap, done, sent, tag and length compare, port, uplink in force or not, local or parent's
    frame, with two rules' contributors."""
    dut = SetUpdate(PORTS, uplink=True)
    failures, seen = [], set()
    cases = list(itertools.product(range(16), (0, 1), (0, 1), (0, 1), (0, 1), (0b1111,), (0, 1), range(3),
                                   (0b0111, 0b0011), (0, 1), (0, 1)))

    async def tb(ctx):
        for b, done, sent, teq, leq, other, newer, w, contrib, up, parent in cases:
            for sig, v in ((dut.cur_bitmap, b), (dut.cur_done, done), (dut.cur_sent, sent), (dut.tag_eq, teq),
                           (dut.len_eq, leq), (dut.other_bitmap, other), (dut.other_newer, newer),
                           (dut.me, 1 << (PORTS - 1 if parent else w)), (dut.contributors, contrib),
                           (dut.up_on, up), (dut.parent, parent)):
                ctx.set(sig, v)
            want = reference(b, bool(done), bool(sent), teq, leq, other, newer, w, contrib, up, parent)
            if parent:          # the parent's frame comes from the uplink port, never a contributor
                want = reference(b, bool(done), bool(sent), teq, leq, other, newer, PORTS - 1, contrib, up, parent)
            got = (SlotOutcome(ctx.get(dut.outcome)).name, *(bool(ctx.get(s)) for s in (
                       dut.first, dut.accepted, dut.complete, dut.up_resend, dut.parent_done)),
                   ctx.get(dut.new_cur_bitmap), bool(ctx.get(dut.new_cur_done)), bool(ctx.get(dut.new_cur_sent)),
                   ctx.get(dut.new_other_bitmap))
            seen.add((want[0], parent, want[4], want[5]))
            if got != tuple(want) and len(failures) < 5:
                failures.append(f"b={b:04b} done={done} sent={sent} teq={teq} leq={leq} other={other:04b} "
                                f"newer={newer} w={w} contributors={contrib:04b} up={up} parent={parent}: "
                                f"got {got}, want {want}")

    run(dut, tb, clock=False)
    assert not failures, "\n".join(failures)
    # every case of both kinds of frame occurred
    assert {o for o, p, *_ in seen if not p} == {"RESEND", "FIRST", "MISMATCH", "LENGTH_MISMATCH", "REPEAT", "ADD"}
    assert {o for o, p, *_ in seen if p} == {"MISMATCH", "LENGTH_MISMATCH", "REPEAT", "ADD"}
    assert any(r for _, _, r, _ in seen) and any(d for *_, d in seen)
