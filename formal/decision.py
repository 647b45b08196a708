"""The formal harness of the decision pipeline and its slot state (``Decision`` with ``SetUpdate`` and
the state memory inside it).

Every input of the decision is free in every cycle (headers, requests, ``hold``, every table-programming
word and strobe, SLOT_CLEAR), constrained only by the decision's input contract (a request stays up
with the same header until taken; the header's ``all_reduce`` bit is the ingress's: a CAIS all-reduce
frame) and by no reset after the start. The properties are stated on the
decision's outputs and on its state memory, read through combinational read ports the harness adds:

- ``push``: every taken header gets exactly one decision, on its own port, DECISION_LATENCY cycles later.
- ``busy``: BUSY is 0 only when no header is inside (none taken and not yet decided).
- ``events``: counters conserve frames: a decision comes with exactly one of drop / forwarded /
  contribution / duplicate, nothing else does; a completion is a contribution, a resend a duplicate;
  a result job exactly with a completion or a resend.
- ``in_use``: SLOTS_IN_USE equals the number of sets whose bitmap is not empty, in every cycle, a cycle late
  (its change is registered before its adder).
- ``per_rule``: SETS_IN_USE of each rule entry equals the number of non-empty sets whose stored writer is
  that entry, in every cycle, a cycle late (its change is registered first too), so the entries add up to
  SLOTS_IN_USE in every cycle.
- ``aging``: the scanner ages (frees or marks) only a set that is partly filled (bitmap not empty, not
  complete), not aged in this fill, and whose stamp is more than AGING.age units older than the age clock
  of its decision; a complete set is never freed by aging.
- ``stamp``: a set's stamp changes only with a contribution accepted into it, to the age unit of the
  contribution's update (so with ``aging``: a set with an accepted contribution within the age is never
  aged); its aged bit rises only when the scanner ages it and falls only with a first contribution or
  when the set is emptied.

With the uplink action (``UPLINK_PARAMS``, ``UPLINK_PROPERTIES``; docs/protocol.md section 13), ``UPLINK``
is one more free input, ``events`` counts the partials' jobs too, and:

- ``sent``: no set is sent and done at once; a set becomes sent only with a partial-sent decision naming
  it; a sent set becomes done only with a contribution (the parent's result) naming it; the scanner never
  ages a sent set.

(``gains`` and ``no_twice`` are not asserted there: the parent's result is a contribution from the uplink
port that sets no bit.)

The harness's decision counts the age in units of 2**:data:`FORMAL_AGE_UNIT_LOG2` cycles (the scanner
visits a set every unit), so aging is reachable in few cycles.
- ``gains``: a set's bitmap gains a port only from a contribution of that port to that set (and loses
  nothing then); it loses a port only from a frame of that port to the other set of its slot (the
  implicit acknowledgement), or everything to a clear or the sweep.
- ``no_twice``: a contribution is accepted only from a port whose bit was clear, and sets it; a port
  whose bit was set counts a duplicate and changes nothing in its set (but the rule entry it counts for).
- ``frozen``: a completed set keeps its tag, length and done bit and takes no contribution (its values
  in the banks stay unchanged) until it is freed (bitmap empty).
- ``isolation``: a frame changes no slot but the one its decision names, and there only its own set
  and its own port's bit of the other set (the implicit acknowledgement); a clear or the sweep after
  reset changes a slot only to empty. Groups own disjoint quotas, so no frame of one group changes
  another group's sets.

``MUTANTS`` are deliberately broken variants, one per property, built by giving the decision a broken
part through its constructor (``set_update``, ``writer_delta``, ``age_due``, ``new_stamp``) or by breaking
one output of the decision as this harness sees it; each must fail its
property with a counterexample reachable from reset (:mod:`cais.formal.prove`).
"""

import functools

from amaranth.hdl import Assert, Assume, Cat, Module, Mux, ResetSignal, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from cais.hdl.decision import DECISION_LATENCY, STATE_WRITE_LEAD, Decision, attach_state_memory
from cais.hdl.common.enums import DropReason
from cais.hdl.parser.header import FrameHeader
from cais.hdl.sram.slots import SetUpdate, SlotOutcome, state_set_layout
from cais.hdl.sram.state import SlotStateMemory
from cais.hdl.control.tables import TableProgramSignature
from cais.params import SwitchParams
from cais.protocol import OpType
from cais.registers import register_map

__all__ = ["PROPERTIES", "MUTANTS", "UPLINK_MUTANTS", "DecisionHarness", "FORMAL_PARAMS", "FORMAL_AGE_UNIT_LOG2", "UPLINK_PARAMS",
           "UPLINK_PROPERTIES"]

#: The properties, in the order of the module docstring.
PROPERTIES = ("push", "busy", "events", "in_use", "gains", "no_twice", "frozen", "isolation", "per_rule", "aging",
              "stamp")

#: The smallest switch with everything in it: 2 ports, 2 slots (4 sets), two rules (so sets can move between
#: the entries' SETS_IN_USE), one MAC entry.
FORMAL_PARAMS = SwitchParams(ports=2, slots=2, rules=2, mac_entries=1)
#: The same with the uplink action, and the properties proved on it (module docstring).
UPLINK_PARAMS = SwitchParams(ports=2, slots=2, rules=2, mac_entries=1, uplink=True)
UPLINK_PROPERTIES = ("push", "busy", "events", "in_use", "frozen", "isolation", "per_rule", "aging", "stamp", "sent")
#: log2 of the harness decision's age unit: one cycle (the scanner visits a set in every cycle it can).
FORMAL_AGE_UNIT_LOG2 = 0


class _BrokenSetUpdate(SetUpdate):
    """``SetUpdate`` with one deliberate bug (``kind``), for the mutants of the slot discipline."""

    def __init__(self, ports: int, kind: str):
        super().__init__(ports)
        self.kind = kind

    def elaborate(self, platform):
        m = Module()
        # The real transition, fed from this component's inputs, its outputs passed on except the bug.
        m.submodules.real = real = SetUpdate(self.ports)
        members = self.signature.members
        for name in (n for n, member in members.items() if member.flow == In):
            m.d.comb += getattr(real, name).eq(getattr(self, name))
        outs = {name: getattr(real, name) for name, member in members.items() if member.flow == Out}
        if self.kind == "bit_toggles":            # a repeat clears its port's bit
            outs["new_cur_bitmap"] = Mux(real.outcome == SlotOutcome.REPEAT, self.cur_bitmap & ~self.me,
                                         real.new_cur_bitmap)
        elif self.kind == "repeat_accepted":      # a repeat is taken as a new contribution
            rep = real.outcome == SlotOutcome.REPEAT
            outs["outcome"] = Mux(rep, SlotOutcome.ADD, real.outcome)
            outs["accepted"] = real.accepted | rep
        elif self.kind == "done_overwritten":     # a completed set with another tag is taken as free
            over = self.cur_done & ~self.tag_eq & (self.cur_bitmap != 0)
            outs["outcome"] = Mux(over, SlotOutcome.FIRST, real.outcome)
            outs["first"], outs["accepted"] = real.first | over, real.accepted | over
            outs["new_cur_bitmap"] = Mux(over, self.me, real.new_cur_bitmap)
            outs["new_cur_done"] = Mux(over, self.me == self.contributors, real.new_cur_done)
            outs["complete"] = Mux(over, self.me == self.contributors, real.complete)
        elif self.kind == "other_set_wiped":      # a contribution empties the whole other set
            outs["new_other_bitmap"] = Mux(real.accepted, 0, real.new_other_bitmap)
        for name, value in outs.items():
            m.d.comb += getattr(self, name).eq(value)
        return m


def _writer_delta_unmoved(entry, writer, new_used, old_used, old_rule):
    """``writer_delta`` broken: the slot's old sets are taken from the writer's entry, whoever stored them."""
    return Mux(writer == entry, new_used - old_used[0] - old_used[1], 0)


def _age_due_complete(s, over_age):
    """``age_due`` broken: the done bit is not looked at."""
    return (s.bitmap != 0) & ~s.aged & over_age


def _age_due_sent(s, over_age):
    """``age_due`` broken (uplink): the sent bit is not looked at."""
    return (s.bitmap != 0) & ~s.done & ~s.aged & over_age


def _stamp_always(accepted, now, stamp):
    """``new_stamp`` broken: any frame that writes the set renews its stamp."""
    return now


#: mutant -> (the property it must fail, what is broken).
MUTANTS = {
    "push_lost": ("push", "the decision of a duplicate is not pushed to its lane"),
    "busy_misses_take": ("busy", "BUSY does not count the header being taken"),
    "event_lost": ("events", "a resend is not counted as a duplicate"),
    "in_use_late": ("in_use", "SLOTS_IN_USE follows the state a cycle later than documented"),
    "bit_toggles": ("gains", "SetUpdate: a repeat clears its port's bit"),
    "repeat_accepted": ("no_twice", "SetUpdate: a repeat is accepted as a new contribution"),
    "done_overwritten": ("frozen", "SetUpdate: a completed set with another tag is overwritten"),
    "other_set_wiped": ("isolation", "SetUpdate: a contribution empties the other set of its slot"),
    "rule_not_moved": ("per_rule", "writer_delta: a write takes the slot's old sets from the writer's entry, "
                                   "not from the entry that stored them"),
    "complete_aged": ("aging", "age_due: a complete set is aged too"),
    "duplicate_feeds": ("stamp", "new_stamp: a duplicate (any frame that writes the set) renews its stamp"),
    "sent_aged": ("sent", "age_due: a sent set (uplink) is aged too"),
}
#: The mutants refuted on UPLINK_PARAMS (the others on FORMAL_PARAMS).
UPLINK_MUTANTS = ("sent_aged",)


def _broken_parts(mutant):
    """The Decision constructor's parts a mutant replaces (none for the design as it is, or for a mutant
    that breaks an output as the harness sees it)."""
    if mutant is None:
        return {}
    if MUTANTS[mutant][1].startswith("SetUpdate"):
        return {"set_update": functools.partial(_BrokenSetUpdate, kind=mutant)}
    return {"rule_not_moved": {"writer_delta": _writer_delta_unmoved},
            "complete_aged": {"age_due": _age_due_complete},
            "sent_aged": {"age_due": _age_due_sent},
            "duplicate_feeds": {"new_stamp": _stamp_always}}.get(mutant, {})


class DecisionHarness(wiring.Component):
    """The decision with free inputs, its input contract assumed and the properties asserted.

    Members
    -------
    meta[p] : In(frame_meta_layout); request : In(ports); hold : In(1); program : In(TableProgramSignature)
        Passed to the decision (free for the solver).

    ``check`` names the properties asserted (default: all of :data:`PROPERTIES`); ``mutant`` one of
    :data:`MUTANTS` (default: none, the design as it is).
    """

    def __init__(self, params: SwitchParams = FORMAL_PARAMS, *, check=PROPERTIES, mutant=None):
        if mutant is not None and mutant not in MUTANTS:
            raise ValueError(f"unknown mutant {mutant!r}")
        rps = params.rows_per_set
        if rps & (rps - 1):
            raise ValueError("the harness decodes row_base by a shift: rows_per_set must be a power of two")
        self.params, self.check, self.mutant = params, tuple(check), mutant
        self.regmap = register_map(params)
        self.dec = Decision(params, self.regmap, age_unit_log2=FORMAL_AGE_UNIT_LOG2, **_broken_parts(mutant))
        # The SRAM buffer's slot-state memory, and combinational read ports of it, one per slot (the
        # harness's view of every set).
        self.state_memory = SlotStateMemory(params)
        self.probes = [self.state_memory.mem.read_port(domain="comb") for _ in range(params.slots)]
        super().__init__({
            "meta": In(self.dec.meta_layout).array(params.ports), "request": In(params.ports), "hold": In(1),
            "program": In(TableProgramSignature(self.regmap)),
            **({"uplink": In(32)} if params.uplink else {}),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, S, L = prm.ports, prm.slots, DECISION_LATENCY
        setl = state_set_layout(prm)
        dec = self.dec
        attach_state_memory(m, dec, self.state_memory)

        def asserted(name, test):
            if name in self.check:
                m.d.comb += Assert(test, name)

        for p in range(P):
            m.d.comb += [dec.headers[p].payload.eq(self.meta[p]), dec.headers[p].valid.eq(self.request[p])]
        m.d.comb += dec.hold.eq(self.hold)
        if prm.uplink:
            m.d.comb += dec.uplink.eq(self.uplink)
        take = Cat(h.ready for h in dec.headers)           # the decision's streams as vectors
        dec_push = Cat(lane.valid for lane in dec.lanes)
        wiring.connect(m, wiring.flipped(self.program), dec.program)

        # The decision's input contract, and no reset after the start (the initial state is the reset state).
        prev_req, prev_take = Signal(P), Signal(P)
        prev_meta = [Signal(self.dec.meta_layout, name=f"prev_meta{p}") for p in range(P)]
        m.d.sync += [prev_req.eq(self.request), prev_take.eq(take)]
        m.d.sync += [prev_meta[p].eq(self.meta[p]) for p in range(P)]
        for p in range(P):
            with m.If(prev_req[p] & ~prev_take[p]):
                m.d.comb += Assume(self.request[p] & (self.meta[p].as_value() == prev_meta[p].as_value()))
        m.d.comb += Assume(~ResetSignal())
        # ... and the ingress's all_reduce bit is the header's (a CAIS all-reduce frame).
        for p in range(P):
            hdr = FrameHeader(self.meta[p].hdr)
            m.d.comb += Assume(self.meta[p].all_reduce == (hdr.is_cais & (hdr.op_type == OpType.ALL_REDUCE)))

        # The outputs as this harness sees them (a mutant breaks one).
        push, busy, in_use = dec_push, dec.busy, dec.slots_in_use
        ev_dup, ev_resent = dec.ev_duplicate, dec.ev_resent
        if self.mutant == "push_lost":
            push = Mux(dec.ev_duplicate, 0, dec_push)
        elif self.mutant == "busy_misses_take":
            busy = dec.busy & ~take.any()
        elif self.mutant == "event_lost":
            ev_dup = dec.ev_duplicate & ~dec.ev_resent
        elif self.mutant == "in_use_late":
            late = Signal(32)
            m.d.sync += late.eq(dec.slots_in_use)
            in_use = late

        # push, busy: the takes of the last L cycles.
        dly = Signal(P * L)
        m.d.sync += dly.eq(Cat(take, dly[:-P]))
        asserted("push", push == dly[-P:])
        asserted("busy", busy | ((dly[:-P] == 0) & (take == 0)))

        # events
        decided = push.any()
        classes = Cat(dec.ev_drop, dec.ev_forwarded, dec.ev_contribution, ev_dup)
        one = Mux(decided, (classes != 0) & ((classes & (classes - 1)) == 0), classes == 0)
        if prm.uplink:
            ev_partial, ev_partial_resent = dec.ev_partial_sent, dec.ev_partial_resent
            asserted("events", one & (~dec.ev_completed | dec.ev_contribution) & (~ev_resent | ev_dup)
                     & (~ev_partial | dec.ev_contribution) & (~ev_partial_resent | ev_dup)
                     & ~(ev_partial & dec.ev_completed)
                     & (dec.jobs.valid == (dec.ev_completed | ev_resent | ev_partial | ev_partial_resent)))
        else:
            asserted("events", one & (~dec.ev_completed | dec.ev_contribution) & (~ev_resent | ev_dup)
                     & (dec.jobs.valid == (dec.ev_completed | ev_resent)))

        # The slot state now and one cycle ago.
        sets = [data.View(setl, self.probes[s].data.as_value()[k * setl.size:(k + 1) * setl.size])
                for s in range(S) for k in range(2)]
        for s in range(S):
            m.d.comb += self.probes[s].addr.eq(s)
        prev = [Signal(setl, name=f"prev_set{i}") for i in range(2 * S)]
        m.d.sync += [prev[i].eq(sets[i]) for i in range(2 * S)]
        started = Signal()                      # prev holds a real cycle
        m.d.sync += started.eq(1)

        # SLOTS_IN_USE and SETS_IN_USE follow the state a cycle late (their changes are registered first)
        count_prev = sum(prev[i].bitmap != 0 for i in range(2 * S))
        asserted("in_use", ~started | (in_use == count_prev))
        per_rule = [dec.sets_in_use[e] for e in range(prm.rules)]
        asserted("per_rule", ~started | (Cat(*(per_rule[e] == sum((prev[i].bitmap != 0) & (prev[i].rule == e)
                                                                  for i in range(2 * S))
                                              for e in range(prm.rules))).all() & (sum(per_rule) == in_use)))

        # The set the decision names (row_base = (slot * 2 + set) * rows_per_set) and its port, as of the
        # cycle whose state shows the decision's write: the write is STATE_WRITE_LEAD cycles before the
        # decision and shows in the memory one cycle after it, so the decision is delayed by
        # 1 - STATE_WRITE_LEAD cycles (0: the decision's own cycle shows the set after its write).
        delay = 1 - STATE_WRITE_LEAD
        assert delay in (0, 1), "the harness compares the state one cycle apart"
        shift = (prm.rows_per_set - 1).bit_length()
        named = Signal(range(2 * S))
        m.d.comb += named.eq(dec.lanes[0].payload.row_base >> shift)
        p_named, p_me = Signal.like(named), Signal(P)
        p_contrib, p_dup = Signal(), Signal()
        p_refused, p_partial = Signal(), Signal()
        refused = dec.ev_drop & ((dec.ev_drop_reason == DropReason.TAG_MISMATCH)
                                 | (dec.ev_drop_reason == DropReason.LENGTH_MISMATCH))
        m.d["sync" if delay else "comb"] += [
            p_named.eq(named), p_me.eq(push), p_contrib.eq(decided & dec.ev_contribution),
            p_dup.eq(decided & ev_dup), p_refused.eq(decided & refused),
            p_partial.eq(decided & dec.ev_partial_sent if prm.uplink else 0)]
        p_agg = p_contrib | p_dup | p_refused

        # The scanner's write shows in the cycle of dec.aged (as a decision's does); it decided two cycles
        # before, from the age clock and AGING of then.
        aging_reg = self.regmap["AGING"]
        age_now = self.program.aging[aging_reg.field("age").lsb:][:aging_reg.field("age").width]
        U = FORMAL_AGE_UNIT_LOG2
        unit_now = dec.age_clock[U:]
        age_d = [Signal.like(age_now, name=f"age_d{k}") for k in (1, 2)]
        unit_d = [Signal.like(unit_now, name=f"unit_d{k}") for k in (1, 2)]
        m.d.sync += [age_d[0].eq(age_now), age_d[1].eq(age_d[0]), unit_d[0].eq(unit_now), unit_d[1].eq(unit_d[0])]
        aged_i = Signal(range(2 * S))
        m.d.comb += aged_i.eq(Cat(dec.aged_set, dec.aged_slot))
        gains_ok, twice_ok, frozen_ok, iso_ok, aging_ok, stamp_ok, sent_ok = [], [], [], [], [], [], []
        kept = [name for name, _ in setl if name != "rule"]
        for i in range(2 * S):
            old, new = prev[i], sets[i]
            mine = p_agg & (p_named == i)                 # the decision a cycle ago named this set
            sibling = p_agg & (p_named == (i ^ 1))        # ... or the other set of its slot
            gained, lost = new.bitmap & ~old.bitmap, old.bitmap & ~new.bitmap
            emptied = new.as_value() == 0                 # a clear or the sweep
            gains_ok.append(~started | emptied | ((gained == 0) & (lost == 0))
                            | ((lost == 0) & p_contrib & (p_named == i) & (gained == p_me))
                            | ((gained == 0) & sibling & (lost == p_me)))
            twice_ok.append(~started | ~(p_contrib & (p_named == i)) | (((old.bitmap & p_me) == 0)
                                                                         & (new.bitmap == (old.bitmap | p_me))))
            # (a duplicate writes its slot too: the sets now count for its rule entry, nothing else changes)
            twice_ok.append(~started | ~(p_dup & (p_named == i)) | Cat(*(getattr(new, f) == getattr(old, f)
                                                                         for f in kept)).all())
            busy_set = old.done & (old.bitmap != 0)
            frozen_ok.append(~started | ~busy_set | (new.bitmap == 0)
                             | ((new.tag == old.tag) & (new.length == old.length) & new.done))
            frozen_ok.append(~started | ~(busy_set & p_contrib & (p_named == i)))
            # (the rule entry a slot's sets count for is per_rule's; every write of the slot sets it)
            changed = ~Cat(*(getattr(new, f) == getattr(old, f) for f in kept)).all()
            own_ack = ((new.bitmap == (old.bitmap & ~p_me)) & (new.tag == old.tag) & (new.length == old.length)
                       & (new.done == old.done))
            scanned = dec.aged & (aged_i == i)
            marked = Cat(*(getattr(new, f) == getattr(old, f) for f in kept if f != "aged")).all() & new.aged
            iso_ok.append(~started | ~changed | emptied | mine | (sibling & own_ack) | (scanned & marked))
            elapsed = (unit_d[1] - old.stamp)[:len(old.stamp)]
            aging_ok.append(~started | ~scanned | ((old.bitmap != 0) & ~old.done & ~old.aged & (elapsed > age_d[1])
                                                  & (emptied | marked)))
            # the stamp: the unit of the contribution's update (U), two cycles before its decision
            fed = p_contrib & (p_named == i)
            stamp_ok.append(~started | emptied | (new.stamp == old.stamp) | (fed & (new.stamp == unit_d[1])))
            stamp_ok.append(~started | emptied | (new.aged == old.aged) | (new.aged & scanned)
                            | (~new.aged & fed & (old.bitmap == 0)))
            if prm.uplink:
                sent_ok += [
                    ~(new.sent & new.done),
                    ~started | ~(new.sent & ~old.sent) | (p_partial & (p_named == i)),
                    ~started | ~(old.sent & ~old.done & new.done) | (p_contrib & (p_named == i)),
                    ~started | ~(scanned & old.sent),
                ]
        asserted("gains", Cat(*gains_ok).all())
        asserted("no_twice", Cat(*twice_ok).all())
        asserted("frozen", Cat(*frozen_ok).all())
        asserted("isolation", Cat(*iso_ok).all())
        asserted("aging", Cat(*aging_ok).all())
        asserted("stamp", Cat(*stamp_ok).all())
        if prm.uplink:
            asserted("sent", Cat(*sent_ok).all())
        return m
