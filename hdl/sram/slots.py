"""Aggregation slot state: the per-set bookkeeping of SwitchML's loss-tolerant protocol, with tags."""

import enum

from amaranth.hdl import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais.params import SwitchParams
from cais.registers import register_map

__all__ = ["SlotOutcome", "set_layout", "entry_layout", "SetUpdate", "SlotUpdate", "rule_index_bits",
           "age_stamp_bits", "state_set_layout", "state_entry_layout", "sets_in_use"]


class SlotOutcome(enum.IntEnum):
    """What an all-reduce contribution does to its slot set (cases of docs/protocol.md)."""
    RESEND = 0     # a: repeat to a completed set: send the stored result to the contributor alone
    FIRST = 1      # b: the set was free: store the values
    MISMATCH = 2   # c: the set holds another chunk: drop
    REPEAT = 3     # d: repeat to an incomplete set: nothing
    ADD = 4        # e: a new contributor: reduce into the values
    LENGTH_MISMATCH = 5  # the set holds this chunk with another payload_len: drop


def set_layout(ports: int, len_bits: int, rule_bits: int = 0, stamp_bits: int = 0, sent: bool = False
               ) -> data.StructLayout:
    """One shadow set: the slot discipline's fields, and (when their widths are given) the rule entry of the
    frame that last wrote the slot (``rule``: the SETS_IN_USE count the set is in) and the aging state
    (``stamp``: the age unit of its last accepted contribution, ``aged``: aged in this fill); with ``sent``
    (a switch with the uplink action, docs/protocol.md section 13) the ``sent`` bit: the set's partial went
    up to the parent switch and the parent's result is due."""
    fields = {"bitmap": ports, "tag": 32, "done": 1, "length": len_bits}
    if rule_bits:
        fields["rule"] = rule_bits
    if stamp_bits:
        fields["stamp"], fields["aged"] = stamp_bits, 1
    if sent:
        fields["sent"] = 1
    return data.StructLayout(fields)


def entry_layout(ports: int, len_bits: int, rule_bits: int = 0, stamp_bits: int = 0) -> data.ArrayLayout:
    """One slot: its two shadow sets."""
    return data.ArrayLayout(set_layout(ports, len_bits, rule_bits, stamp_bits), 2)


def rule_index_bits(params: SwitchParams) -> int:
    """Bits of a rule entry's index."""
    return max(1, ceil_log2(params.rules))


def age_stamp_bits(params: SwitchParams) -> int:
    """Bits of a set's age stamp (age units, modulo 2**bits): the largest age (AGING.age) plus one scan
    period (2 x slots units, docs/registers.md) and the unit of rounding stay below the wrap, so an age
    compare of a set visited once per period never wraps past the age."""
    age = register_map(params)["AGING"].field("age").width
    return ((1 << age) + 2 * params.slots + 1).bit_length()


def state_set_layout(params: SwitchParams) -> data.StructLayout:
    """A shadow set as the decision's slot-state memory holds it."""
    return set_layout(params.ports, params.slot_len_bits, rule_index_bits(params), age_stamp_bits(params),
                      sent=params.uplink)


def state_entry_layout(params: SwitchParams) -> data.ArrayLayout:
    """A slot as the decision's slot-state memory holds it: its two shadow sets."""
    return data.ArrayLayout(state_set_layout(params), 2)


def sets_in_use(sets):
    """How many of a slot's two shadow sets (``sets[0]``, ``sets[1]``: an entry or a pair of set views) are
    in use, i.e. hold a contribution: SLOTS_IN_USE counts these."""
    return (sets[0].bitmap != 0) + (sets[1].bitmap != 0)


class SetUpdate(wiring.Component):
    """The state transition of one slot for one contribution, on the bits that change, combinational.

    The tag and length comparisons come in as two bits, so a pipeline can make them a stage earlier (or
    forward them) and keep this, the part of the slot update that depends on the previous contribution's
    bitmaps, short. A set's tag and length change only in FIRST, to the contribution's own.

    Members
    -------
    cur_bitmap : In(ports); cur_done : In(1); other_bitmap : In(ports)
        The set the chunk maps to (bitmap, done) and the other set's bitmap, before the contribution.
    tag_eq : In(1); len_eq : In(1)
        The set's tag equals the chunk's seq_num; its length equals the chunk's payload_len.
    other_newer : In(1)
        The other set holds the slot's next chunk (its tag is seq_num + the quota's count): the frame is
        older than its port's contribution there (a copy the network kept back), so it acknowledges
        nothing.
    me : In(ports); contributors : In(ports)
        The contributing port (one-hot) and the rule's contributor ports.
    outcome : Out(SlotOutcome)
    first : Out(1)
        FIRST: the set takes the chunk's tag and length.
    accepted : Out(1)
        FIRST or ADD: the payload is a contribution.
    complete : Out(1)
        This contribution completed the set: multicast the result.
    new_cur_bitmap : Out(ports); new_cur_done : Out(1); new_other_bitmap : Out(ports)
        The bits after the contribution.

    With ``uplink`` (a switch with the uplink action, docs/protocol.md section 13), also:

    cur_sent : In(1); up_on : In(1); parent : In(1)
        The set's partial went up (sent); the rule's uplink action is in force; the frame is the parent's
        result (from the uplink port; ``me`` is then not used).
    new_cur_sent : Out(1)
        The sent bit after the frame: set when a contribution fills the set under the uplink action (the
        set is then not done: ``complete`` means "send the partial up"), cleared by the parent's result.
    up_resend : Out(1)
        a': a local repeat to a sent set (``outcome`` REPEAT): send the kept partial up again.
    parent_done : Out(1)
        The parent's result taken by a sent set (``outcome`` ADD, ``accepted``, ``complete``): the set is
        done, its value the parent's (a parent's result to a done set is REPEAT, to any other TAG_MISMATCH).
    """

    def __init__(self, ports: int, uplink: bool = False):
        self.ports, self.uplink = ports, uplink
        members = {
            "cur_bitmap": In(ports), "cur_done": In(1), "other_bitmap": In(ports), "tag_eq": In(1), "len_eq": In(1),
            "other_newer": In(1), "me": In(ports), "contributors": In(ports),
            "outcome": Out(SlotOutcome), "first": Out(1), "accepted": Out(1), "complete": Out(1),
            "new_cur_bitmap": Out(ports), "new_cur_done": Out(1), "new_other_bitmap": Out(ports),
        }
        if uplink:
            members.update({"cur_sent": In(1), "up_on": In(1), "parent": In(1),
                            "new_cur_sent": Out(1), "up_resend": Out(1), "parent_done": Out(1)})
        super().__init__(members)

    def elaborate(self, platform):
        if self.uplink:
            return self._elaborate_uplink()
        m = Module()
        b, me, teq, leq = self.cur_bitmap, self.me, self.tag_eq, self.len_eq
        # The cases of docs/protocol.md 7.3 in their order, as flat terms (each case excludes the ones before).
        resend_case = self.cur_done & teq
        free = b == 0
        first = ~resend_case & free
        mismatch = ~resend_case & ~free & ~teq
        lmm = (resend_case & ~leq) | (~resend_case & ~free & teq & ~leq)
        repeat = ~resend_case & ~free & teq & leq & (b & me).any()
        add = ~resend_case & ~free & teq & leq & ~(b & me).any()
        accepted = first | add
        done = (b | me) == self.contributors           # (b is 0 in FIRST)
        m.d.comb += [
            self.first.eq(first), self.accepted.eq(accepted), self.complete.eq(accepted & done),
            self.new_cur_bitmap.eq(Mux(accepted, b | me, b)),
            self.new_cur_done.eq(Mux(accepted, done, self.cur_done)),
            # The implicit acknowledgement: a port that contributes to one set has its result of the other
            # (unless the other set already holds the port's next chunk: this frame is a stale copy).
            self.new_other_bitmap.eq(Mux(mismatch | lmm | self.other_newer, self.other_bitmap,
                                         self.other_bitmap & ~me)),
        ]
        self._outcome(m, resend_case & leq, first, mismatch, lmm, repeat)
        return m


    def _outcome(self, m, resend, first, mismatch, lmm, repeat):
        """The outcome of section 7.3's cases, in their order of precedence (ADD when none holds)."""
        with m.If(resend):
            m.d.comb += self.outcome.eq(SlotOutcome.RESEND)
        with m.Elif(first):
            m.d.comb += self.outcome.eq(SlotOutcome.FIRST)
        with m.Elif(mismatch):
            m.d.comb += self.outcome.eq(SlotOutcome.MISMATCH)
        with m.Elif(lmm):
            m.d.comb += self.outcome.eq(SlotOutcome.LENGTH_MISMATCH)
        with m.Elif(repeat):
            m.d.comb += self.outcome.eq(SlotOutcome.REPEAT)
        with m.Else():
            m.d.comb += self.outcome.eq(SlotOutcome.ADD)

    def _elaborate_uplink(self):
        """The transition with the uplink action: the local frames' cases of section 7.3 with the sent state
        (a filled set is sent, not done; a' re-sends the partial), and the parent's result (section 13.2)."""
        m = Module()
        b, me, teq, leq, up, sent = self.cur_bitmap, self.me, self.tag_eq, self.len_eq, self.up_on, self.cur_sent
        parent, local = self.parent, ~self.parent
        # local frames: the cases of section 7.3 in their order, as flat terms
        resend_case = self.cur_done & teq
        free = b == 0
        first = local & ~resend_case & free
        mismatch_l = ~resend_case & ~free & ~teq
        lmm_l = (resend_case & ~leq) | (~resend_case & ~free & teq & ~leq)
        repeat_l = ~resend_case & ~free & teq & leq & (b & me).any()
        add = local & ~resend_case & ~free & teq & leq & ~(b & me).any()
        filled = (b | me) == self.contributors           # (b is 0 in FIRST)
        # the parent's result: to a set that sent this chunk up (its tag), or the done one again
        mismatch_p = ~teq | ~(sent | self.cur_done)
        lmm_p = ~mismatch_p & ~leq
        repeat_p = ~mismatch_p & leq & self.cur_done
        take_p = parent & ~mismatch_p & leq & ~self.cur_done
        accepted = first | add | take_p
        mismatch = Mux(parent, mismatch_p, mismatch_l)
        lmm = Mux(parent, lmm_p, lmm_l)
        local_in = (first | add) & filled                # every local contributor is in
        m.d.comb += [
            self.first.eq(first), self.accepted.eq(accepted), self.complete.eq(local_in | take_p),
            self.parent_done.eq(take_p), self.up_resend.eq(local & repeat_l & sent & up),
            self.new_cur_bitmap.eq(Mux(first | add, b | me, b)),
            self.new_cur_done.eq(Mux(first | add, filled & ~up, self.cur_done | take_p)),
            # (a set done is not sent: done supersedes sent, as in the model's view)
            self.new_cur_sent.eq(Mux(first | add, Mux(filled, up, sent & add), sent & ~take_p)),
            # the implicit acknowledgement (local frames only: the parent's result acknowledges nothing)
            self.new_other_bitmap.eq(Mux(parent | mismatch | lmm | self.other_newer, self.other_bitmap,
                                         self.other_bitmap & ~me)),
        ]
        self._outcome(m, local & resend_case & leq, first, mismatch, lmm, Mux(parent, repeat_p, repeat_l))
        return m


class SlotUpdate(wiring.Component):
    """The state transition of one slot for one contribution, combinational: the whole slot in and out,
    the comparisons and :class:`SetUpdate`.

    Members
    -------
    state : In(entry_layout)
        The slot's two sets before the contribution.
    set : In(1); port : In(range(ports)); tag : In(32); length : In(len_bits); contributors : In(ports)
        The set the chunk maps to, the contributing (ingress) port, the chunk's seq_num and payload_len,
        and the rule's contributor ports.
    next_tag : In(32)
        The seq_num of the slot's next chunk: seq_num + the quota's count (modulo 2**32).
    outcome : Out(SlotOutcome)
    complete : Out(1)
        This contribution completed the set: multicast the result.
    new_state : Out(entry_layout)
        The slot after the contribution (equal to ``state`` for MISMATCH and LENGTH_MISMATCH).
    in_use_delta : Out(signed(3))
        Change in the number of non-empty sets of this slot.
    """

    def __init__(self, ports: int, len_bits: int):
        self.ports = ports
        super().__init__({
            "state": In(entry_layout(ports, len_bits)), "set": In(1), "port": In(range(ports)), "tag": In(32),
            "next_tag": In(32), "length": In(len_bits), "contributors": In(ports),
            "outcome": Out(SlotOutcome), "complete": Out(1), "new_state": Out(entry_layout(ports, len_bits)),
            "in_use_delta": Out(data.signed(3)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.step = step = SetUpdate(self.ports)
        cur = self.state[self.set]
        other = self.state[~self.set]
        new_cur = self.new_state[self.set]
        new_other = self.new_state[~self.set]
        m.d.comb += [
            step.cur_bitmap.eq(cur.bitmap), step.cur_done.eq(cur.done), step.other_bitmap.eq(other.bitmap),
            step.tag_eq.eq(cur.tag == self.tag), step.len_eq.eq(cur.length == self.length),
            step.other_newer.eq(other.tag == self.next_tag),
            step.me.eq(1 << self.port), step.contributors.eq(self.contributors),
            self.outcome.eq(step.outcome), self.complete.eq(step.complete),
            self.new_state.eq(self.state),
            new_cur.bitmap.eq(step.new_cur_bitmap), new_cur.done.eq(step.new_cur_done),
            new_other.bitmap.eq(step.new_other_bitmap),
        ]
        with m.If(step.first):
            m.d.comb += [new_cur.tag.eq(self.tag), new_cur.length.eq(self.length)]

        m.d.comb += self.in_use_delta.eq(sets_in_use(self.new_state) - sets_in_use(self.state))
        return m
