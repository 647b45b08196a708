"""Stages S0, S1, S2, U, V and W: the slot-state read, the forwarding from the writes in flight,
``SetUpdate``, the decision and the state write (into :class:`cais.hdl.sram.state.SlotStateMemory`)."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams

from ..common.enums import Action, DropReason
from ..common.pipeline import register_copy
from ..control.tables import or_tree
from ..latency import SLOT_STATE
from ..sram.slots import (SetUpdate, SlotOutcome, age_stamp_bits, rule_index_bits, sets_in_use, state_entry_layout,
                          state_set_layout)
from ..sram.state import SlotStatePort, slot_bits
from .layouts import decision_layout, job_layout
from .lookup import carry_layout, lookup_layout

__all__ = ["SlotState", "write_layout", "new_stamp", "STATE_WRITE_LEAD"]

#: Cycles from a header's slot-state write (W) to its decision on the outputs: the outputs are registered
#: in W's cycle (stage V), so the cycle that shows a decision also shows, in the state memory, its write.
STATE_WRITE_LEAD = 1


def new_stamp(accepted, now, stamp):
    """A set's age stamp after a frame: the current age unit if the frame was accepted into it (a
    duplicate or a refused frame does not feed the set), else unchanged."""
    return Mux(accepted, now, stamp)


def write_layout(params: SwitchParams) -> data.StructLayout:
    """A header's slot-state write (stage W), for the counters: how many of the slot's sets are not empty
    after it, the old bitmaps, the writer's rule entry and the rule entries the old sets counted for."""
    P, rb = params.ports, rule_index_bits(params)
    return data.StructLayout({"new_used": 2, "old_bitmaps": 2 * P, "rule": rb, "old_rules": 2 * rb})


class SlotState(wiring.Component):
    """The slot-state pipeline: a header's slot read, its update and write, one header per cycle.

    Stages::

        S0: the slot-state read (addressed from B2's slot), its output registered; BAD_SLOT; an
            ordinary frame's ports                              (r_*; the entry in the memory's register)
        S1: the two oldest writes the read missed merged in; which newer write is the newest (f_*)
        S2: the state forwarded from the two newer writes; tag and length compares, and whether the
            other set holds the slot's next chunk (no implicit acknowledgement then)      (u_*)
        U:  the previous header's write forwarded, SetUpdate: the new state and the outcome, registered
            (w_*, v_*)
        V:  the decision, its events and its job from the registered outcome (the outputs); in the
            same cycle, as W: the state write

    Every memory output is registered before logic, and the slot-state loop is split: the state read
    misses the writes of the five headers ahead of it. They come from a short history of written states
    (``w_*``, ``h1_*``, ``h2_*``; the slot matches are found a stage ahead): S1 merges the two oldest, S2
    the next two, and U takes the fifth, the header one cycle ahead, from its registered result. The
    32-bit tag and the length compares are made in S2 (against the header one ahead too), so U works on
    bitmaps and a few bits, and it drives nothing but the next state and a few registered outcome bits.

    Members
    -------
    i : In(stream.Signature(lookup_layout, always_ready=True))
        The header in B2 (the lookup's registers).
    read_slot : In(slot bits)
        The slot of the header entering B2: the read is addressed from it (unless the maintenance reads).
    now : In(age stamp bits)
        The current age unit: an accepted contribution stamps its set with it.
    state : Out(SlotStatePort(read_en=False))
        The pipeline's port on the slot-state memory (:class:`cais.hdl.sram.state.SlotStateMemory`): the
        read addressed from ``read_slot`` in every cycle, its registered entry (S1's input), the write (W).
    lanes[p] : Out(stream.Signature(decision_layout, always_ready=True)); jobs : Out(stream.Signature(job_layout))
        The decision (on the lane of the header's port, the same payload on every lane) and a result job,
        ``latency`` cycles after the header is on ``i``.
    ev_* : Out(1); ev_drop_reason : Out(DropReason)
        One event pulse per decided frame, with its decision.
    written : Out(stream.Signature(write_layout, always_ready=True))
        The header's state write (stage W), in the cycle of the write: ``valid`` for every all-reduce
        header that reached the slot state.
    stateful_next : Out(1)
        An all-reduce header (one that reads or writes the slot state) is in S0 .. W in the next cycle:
        S0's, F's and U's next aggregate bits (one in W leaves), for the maintenance's wait.
    busy : Out(1)
        A header is in S0 .. V (not counting the outputs).
    ev_partial_sent : Out(1); ev_partial_resent : Out(1)
        Only with ``params.uplink`` (docs/protocol.md section 13): a set of a rule with the uplink action
        filled (its partial goes up: a job to the uplink port, flags 0, not a result: no ``ev_completed``);
        a local repeat to a sent set (a', the partial again, flags RETRANSMIT). The parent's result taken
        by a sent set is a contribution and a completion, its job folds the uplink port's bank alone (as
        does every re-serve of the set from then on).

    ``latency`` (:data:`cais.hdl.latency.SLOT_STATE`, 5): a header on ``i`` in cycle t is decided on the outputs in cycle t + 5 and writes its
    slot in t + 5 - :data:`STATE_WRITE_LEAD`. ``set_update`` builds the state transition
    (:class:`cais.hdl.sram.slots.SetUpdate`, given the ports) and ``new_stamp`` the stamp of the set (the formal
    harness's mutants come in through them). Every output is a register.
    """

    latency = SLOT_STATE

    def __init__(self, params: SwitchParams, *, set_update=SetUpdate, new_stamp=new_stamp):
        self.params = params
        self.set_update, self.new_stamp = set_update, new_stamp
        P = params.ports
        super().__init__({
            "i": In(stream.Signature(lookup_layout(params), always_ready=True)),
            "read_slot": In(slot_bits(params)), "now": In(age_stamp_bits(params)),
            "state": Out(SlotStatePort(params, read_en=False)),
            "lanes": Out(stream.Signature(decision_layout(params), always_ready=True)).array(P),
            "jobs": Out(stream.Signature(job_layout(params), always_ready=True)),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "written": Out(stream.Signature(write_layout(params), always_ready=True)),
            "stateful_next": Out(1), "busy": Out(1),
            **({"ev_partial_sent": Out(1), "ev_partial_resent": Out(1)} if params.uplink else {}),
        })

    def elaborate(self, platform):
        m = Module()
        s = self._registers()
        # W's set with FIRST's tag and length and not aged, and with the age unit's stamp when accepted (the
        # choices after W's registers: U's ``first`` and ``accepted`` drive one register each, not the wide
        # fields' clock enables)
        m.d.comb += [s.w_cur.eq(s.w_cur_r),
                     s.w_cur.tag.eq(Mux(s.w_first, s.v_c.tag, s.w_cur_r.tag)),
                     s.w_cur.length.eq(Mux(s.w_first, s.v_c.plen, s.w_cur_r.length)),
                     s.w_cur.aged.eq(~s.w_first & s.w_cur_r.aged),
                     s.w_cur.stamp.eq(self.new_stamp(s.w_stamped, s.w_now, s.w_cur_r.stamp))]
        m.d.comb += s.w_new.eq(Mux(s.w_set, Cat(s.w_oth, s.w_cur), Cat(s.w_cur, s.w_oth)))
        self._read(m, s)
        self._update(m, s, platform)            # (before S2's forwarding: it makes the compares S2 picks)
        self._forward(m, s)
        self._decide(m, s)
        self._write(m, s)
        m.d.comb += [self.busy.eq(s.r_valid | s.f_valid | s.u_valid | s.v_valid)]
        return m

    def _registers(self):
        """The stages' registers: each stage's header and what it carries; w, h1, h2 hold the written
        states."""
        prm = self.params
        P, sb, rb = prm.ports, slot_bits(prm), rule_index_bits(prm)
        ent, setl, carry_l = state_entry_layout(prm), state_set_layout(prm), carry_layout(prm)
        s = SimpleNamespace()
        for k in "rfuv":
            setattr(s, f"{k}_valid", Signal(name=f"{k}_valid"))
            setattr(s, f"{k}_agg", Signal(name=f"{k}_agg"))
            setattr(s, f"{k}_action", Signal(Action, name=f"{k}_action"))
            setattr(s, f"{k}_reason", Signal(DropReason, name=f"{k}_reason"))
            setattr(s, f"{k}_mask", Signal(P, name=f"{k}_mask"))
            setattr(s, f"{k}_c", Signal(carry_l, reset_less=True, name=f"{k}_c"))
        def reg(name, shape=1, reset_less=True):
            return Signal(shape, reset_less=reset_less, name=name)
        s.r_sel = reg("r_sel", 3)
        # S0's drop conditions, each registered on its own; S1 makes them the action and the reason
        s.r_spoofed, s.r_l2 = reg("r_spoofed"), reg("r_l2")
        s.r_no_route, s.r_bad_slot = reg("r_no_route"), reg("r_bad_slot")
        s.f_mem, s.f_sel = reg("f_mem", ent), reg("f_sel", 3)
        s.f_w_same = reg("f_w_same")        # the header in W (when this one is in S2) has its set
        s.u_cur, s.u_other = reg("u_cur", setl), reg("u_other", setl)
        s.u_tag_eq, s.u_len_eq, s.u_prev_same, s.u_same_set = (reg("u_tag_eq"), reg("u_len_eq"),
                                                               reg("u_prev_same", reset_less=False), reg("u_same_set"))
        s.u_eq_prev_tag, s.u_eq_prev_len = reg("u_eq_prev_tag"), reg("u_eq_prev_len")
        # copies of u_prev_same and u_same_set for the wide fields (tag, length, stamp, rule, aged), so that
        # the select of the few bits SetUpdate reads drives only those
        s.u_prev_wide, s.u_same_wide = reg("u_prev_wide", reset_less=False), reg("u_same_wide")
        s.u_other_next, s.u_prev_next = reg("u_other_next"), reg("u_prev_next")
        # W's new state as the header's set and the other one (``w_cur``, ``w_oth``, unswapped: U drives them
        # without the swap by the set bit, ``w_set``); ``w_new`` is the entry, swapped after the registers.
        # ``w_cur_r`` holds the header's set with its old tag, length, aged flag and stamp; ``w_cur`` is it
        # with the header's own (``v_c``'s, registered beside W) when it was FIRST (``w_first``), and with
        # the age unit of U's cycle (``w_now``) when the header was accepted (``w_stamped``).
        s.w_agg, s.w_slot, s.w_first = reg("w_agg", reset_less=False), reg("w_slot", sb), reg("w_first", reset_less=False)
        s.w_cur_r, s.w_oth, s.w_set = reg("w_cur", setl), reg("w_oth", setl), reg("w_set")
        s.w_stamped, s.w_now = reg("w_stamped", reset_less=False), reg("w_now", age_stamp_bits(prm))
        s.w_cur = Signal(setl, name="w_cur_new")
        s.w_new = Signal(ent, name="w_new")
        s.w_old = reg("w_old", 2 * P)
        s.w_rule, s.w_old_rule = reg("w_rule", rb), reg("w_old_rule", 2 * rb)
        s.h1_agg, s.h1_slot, s.h1_new = reg("h1_agg", reset_less=False), reg("h1_slot", sb), reg("h1_new", ent)
        s.h2_agg, s.h2_slot, s.h2_new = reg("h2_agg", reset_less=False), reg("h2_slot", sb), reg("h2_new", ent)
        s.v_outcome, s.v_accepted, s.v_complete = (reg("v_outcome", SlotOutcome, reset_less=False),
                                                   reg("v_accepted", reset_less=False),
                                                   reg("v_complete", reset_less=False))
        if prm.uplink:
            s.v_up_resend, s.v_parent_done = reg("v_up_resend", reset_less=False), reg("v_parent_done", reset_less=False)
        return s

    def _read(self, m, s):
        """S0: the state read, BAD_SLOT, SPOOFED_SOURCE, an ordinary frame's ports; S1: the older writes merged."""
        prm = self.params
        all_ports = (1 << prm.ports) - 1
        sb = slot_bits(prm)
        b = self.i.payload
        # The memory reads B2's slot (not transparent: a write in the cycle of the read is missed); its
        # entry comes from a register of the memory's own in S1 (state.read_data).
        m.d.comb += self.state.read_addr.eq(self.read_slot)
        # a spoofed source (found in B2, a register there) is dropped whatever B2 decided: not an ordinary
        # frame's forwarding (l2), not a candidate for the state
        spoofed = b.spoofed
        l2 = b.l2 & ~spoofed
        b_cand = self.i.valid & ~b.l2 & ~spoofed & (b.action == Action.AGGREGATE)
        bad = b.slot >= prm.slots
        # (W's header leaves; U's reaches W; B2's reaches S0: r_agg's next value)
        m.d.comb += self.stateful_next.eq((b_cand & ~bad) | s.r_agg | s.f_agg | s.u_agg)
        # flooded (a group or unknown destination), but never a host frame under MAC_POLICY.host_strict
        l2_dest = Mux(b.group | ~b.mac_hit, Mux(b.host_strict, 0, all_ports), b.mac_mask) & ~b.c.me
        # The read missed the writes of the five headers ahead; of them, the ones now in W and h1 are in
        # h1 and h2 when this one is in S1 (the newest wins).
        hit4 = s.w_agg & (s.w_slot == b.slot[:sb])
        hit5 = s.h1_agg & (s.h1_slot == b.slot[:sb])
        m.d.sync += s.r_sel.eq(Cat(hit4, ~hit4 & hit5, ~hit4 & ~hit5))
        # The drop conditions are registered apart and joined in S1 (the integer switch measured B2's
        # registers -> the slot compare and the route's mask -> the joined action, 6 LUT levels and 7.74 ns
        # of routing into r_action, 98.92 MHz).
        m.d.sync += [
            s.r_valid.eq(self.i.valid), s.r_agg.eq(b_cand & ~bad), s.r_mask.eq(Mux(l2, l2_dest, b.mask)),
            s.r_spoofed.eq(spoofed), s.r_l2.eq(l2), s.r_no_route.eq(l2 & (l2_dest == 0)),
            s.r_bad_slot.eq(b_cand & bad),
            s.r_action.eq(Mux(l2, Action.FORWARD, b.action)), s.r_reason.eq(b.reason),
            s.r_c.eq(b.c), s.r_c.slot.eq(b.slot[:sb]),
            s.r_c.row_base.eq(Cat(b.c.set, b.slot[:sb]) * prm.rows_per_set),
        ]
        # S1: the action and the reason, the older writes merged, the newest write found
        drop = s.r_spoofed | s.r_no_route | s.r_bad_slot
        m.d.sync += [
            s.f_action.eq(Mux(drop, Action.DROP, s.r_action)),
            s.f_reason.eq(Mux(s.r_spoofed, DropReason.SPOOFED_SOURCE,
                              Mux(s.r_l2, DropReason.NO_ROUTE, Mux(s.r_bad_slot, DropReason.BAD_SLOT, s.r_reason)))),
        ]
        m.d.sync += [
            s.f_valid.eq(s.r_valid), s.f_agg.eq(s.r_agg),
            s.f_mask.eq(s.r_mask), s.f_c.eq(s.r_c),
            s.f_mem.eq(or_tree(Mux(s.r_sel[k], src, 0) for k, src in enumerate((s.h1_new, s.h2_new, self.state.read_data)))),
        ]
        # Of the rest, the ones now in U and W are in W and h1 when this one is in S2.
        hit_w = s.u_agg & (s.u_c.slot == s.r_c.slot)
        hit_h1 = s.w_agg & (s.w_slot == s.r_c.slot)
        m.d.sync += [s.f_sel.eq(Cat(hit_w, ~hit_w & hit_h1, ~hit_w & ~hit_h1)), s.f_w_same.eq(s.u_c.set == s.r_c.set)]

    def _forward(self, m, s):
        """S2: the state forwarded from the newer writes, the compares."""
        setl = state_set_layout(self.params)
        cur, other = Signal(setl, name="fwd_cur"), Signal(setl, name="fwd_other")
        # (W's sets picked by whether the header's set is W's: no swap of W's entry on the way)
        w_same = s.f_w_same
        h1_cur, h1_other = s.h1_new[s.f_c.set], s.h1_new[~s.f_c.set]
        mem_cur, mem_other = s.f_mem[s.f_c.set], s.f_mem[~s.f_c.set]

        def pick(w, h1, mem):        # the newest write's (or the memory's), by S1's choice
            return or_tree(Mux(s.f_sel[k], src, 0) for k, src in enumerate((w, h1, mem)))
        m.d.comb += [cur.eq(pick(Mux(w_same, s.w_cur, s.w_oth), h1_cur, mem_cur)),
                     other.eq(pick(Mux(w_same, s.w_oth, s.w_cur), h1_other, mem_other))]
        # The compares of the forwarded sets, each source's before the pick (registers compared, then the
        # 3-way pick of one bit), not after the pick of the wide sets (the integer switch measured W's
        # FIRST bit -> the tag's choice -> the pick -> the tag compare into u_other_next, 8 LUT levels and
        # 7 ns of routing, 106.00 MHz). W's set of the header is FIRST's own tag and length or the old ones.
        # W's and h1's compares come made a cycle ahead (see _update: ``s.wc``); the memory's both sets are
        # compared here, then the header's set chosen (the decision alone measured S1's next tag -> the
        # compare with the other set, chosen by the set bit and picked, into u_other_next: 9 LUT levels,
        # 122.13 MHz).
        tag, plen, next_tag, hset = s.f_c.tag, s.f_c.plen, s.f_c.next_tag, s.f_c.set
        wc = s.wc

        def w_cur_is(key):
            return Mux(wc.first, getattr(wc, f"v_{key}"), getattr(wc, f"cur_{key}"))

        def of_set(eq, own):                   # of the header's set (own) or of the other set
            return Mux(hset, eq[1], eq[0]) if own else Mux(hset, eq[0], eq[1])

        def mem_is(field, value, own):
            return of_set([getattr(s.f_mem[k], field) == value for k in (0, 1)], own)
        tag_eq = pick(Mux(w_same, w_cur_is("tag"), wc.oth_tag), of_set(wc.h1_tag, True), mem_is("tag", tag, True))
        len_eq = pick(Mux(w_same, w_cur_is("len"), wc.oth_len), of_set(wc.h1_len, True),
                      mem_is("length", plen, True))
        other_next = pick(Mux(w_same, wc.oth_next, w_cur_is("next")), of_set(wc.h1_next, False),
                          mem_is("tag", next_tag, False))
        m.d.sync += [
            s.u_valid.eq(s.f_valid), s.u_agg.eq(s.f_agg), s.u_action.eq(s.f_action), s.u_reason.eq(s.f_reason),
            s.u_mask.eq(s.f_mask), s.u_c.eq(s.f_c), s.u_cur.eq(cur), s.u_other.eq(other),
            s.u_tag_eq.eq(tag_eq), s.u_len_eq.eq(len_eq), s.u_other_next.eq(other_next),
            # the header one ahead (in U now, in W when this one is in U)
            s.u_prev_same.eq(s.u_agg & (s.u_c.slot == s.f_c.slot)), s.u_same_set.eq(s.u_c.set == s.f_c.set),
            # (the copies differ from the originals only for a header that writes nothing, f_agg 0: the
            # difference keeps yosys from merging them into one register)
            s.u_prev_wide.eq(s.u_agg & (s.u_c.slot == s.f_c.slot) & s.f_agg),
            s.u_same_wide.eq((s.u_c.set == s.f_c.set) & s.f_agg),
            s.u_eq_prev_tag.eq(s.u_c.tag == s.f_c.tag), s.u_eq_prev_len.eq(s.u_c.plen == s.f_c.plen),
            s.u_prev_next.eq(s.u_c.tag == s.f_c.next_tag),
        ]

    def _update(self, m, s, platform):
        """U: the previous header's write forwarded, SetUpdate; the new state and the outcome registered, and
        the copies of W's tags and lengths for S2's compares (``s.wc``)."""
        setl = state_set_layout(self.params)
        u_c = s.u_c
        prev = s.u_prev_same
        s_cur, s_other = Signal(setl, name="s_cur"), Signal(setl, name="s_other")
        # (W's sets picked by whether the header's set is W's, a register: u_same_set; the fields SetUpdate
        # reads by the originals, the others by the copies)
        for name in setl.members:
            p_sel, same = ((prev, s.u_same_set) if name in ("bitmap", "done", "sent")
                           else (s.u_prev_wide, s.u_same_wide))
            m.d.comb += [s_cur[name].eq(Mux(p_sel, Mux(same, s.w_cur[name], s.w_oth[name]), s.u_cur[name])),
                         s_other[name].eq(Mux(p_sel, Mux(same, s.w_oth[name], s.w_cur[name]), s.u_other[name]))]
        # The header ahead changed this set's tag and length only if it was its FIRST.
        took_set = prev & s.u_same_set & s.w_first
        took_other = prev & ~s.u_same_set & s.w_first           # ... and the other set's
        uplink = self.params.uplink
        m.submodules.update = upd = (self.set_update(self.params.ports, uplink=True) if uplink
                                     else self.set_update(self.params.ports))
        m.d.comb += [
            upd.cur_bitmap.eq(s_cur.bitmap), upd.cur_done.eq(s_cur.done), upd.other_bitmap.eq(s_other.bitmap),
            upd.tag_eq.eq(Mux(took_set, s.u_eq_prev_tag, s.u_tag_eq)),
            upd.len_eq.eq(Mux(took_set, s.u_eq_prev_len, s.u_len_eq)),
            upd.other_newer.eq(Mux(took_other, s.u_prev_next, s.u_other_next)),
            upd.me.eq(u_c.me), upd.contributors.eq(u_c.contributors),
        ]
        new_cur, new_other = Signal(setl, name="new_cur"), Signal(setl, name="new_other")
        m.d.comb += [
            new_cur.bitmap.eq(upd.new_cur_bitmap), new_cur.done.eq(upd.new_cur_done),
            # (FIRST's tag and length and its aged flag, and an accepted contribution's stamp, are chosen
            # after W's registers, by w_first and w_stamped: see elaborate)
            new_cur.tag.eq(s_cur.tag), new_cur.length.eq(s_cur.length),
            new_cur.stamp.eq(s_cur.stamp), new_cur.aged.eq(s_cur.aged),
            new_other.eq(s_other), new_other.bitmap.eq(upd.new_other_bitmap),
            # the slot's sets now count for the writer's rule entry
            new_cur.rule.eq(u_c.rule), new_other.rule.eq(u_c.rule),
        ]
        if uplink:
            m.d.comb += [upd.cur_sent.eq(s_cur.sent), upd.up_on.eq(u_c.up.any()), upd.parent.eq(u_c.parent),
                         new_cur.sent.eq(upd.new_cur_sent)]
            m.d.sync += [s.v_up_resend.eq(upd.up_resend), s.v_parent_done.eq(upd.parent_done)]
        agg = s.u_valid & s.u_agg
        # Every contribution writes its slot back (unchanged when refused), so every one is forwarded.
        m.d.sync += [
            s.w_agg.eq(agg), s.w_slot.eq(u_c.slot), s.w_first.eq(agg & upd.first),
            # an accepted contribution stamps its set (aging); a first one starts a fill not yet aged
            s.w_stamped.eq(upd.accepted & ~u_c.parent if uplink else upd.accepted), s.w_now.eq(self.now),
            s.w_cur_r.eq(new_cur), s.w_oth.eq(new_other), s.w_set.eq(u_c.set),
            s.w_old.eq(Cat(s_cur.bitmap, s_other.bitmap)),
            s.w_rule.eq(u_c.rule), s.w_old_rule.eq(Cat(s_cur.rule, s_other.rule)),
            s.h1_agg.eq(s.w_agg), s.h1_slot.eq(s.w_slot), s.h1_new.eq(s.w_new),
            s.h2_agg.eq(s.h1_agg), s.h2_slot.eq(s.h1_slot), s.h2_new.eq(s.h1_new),
        ]
        # S2's compares with W's tags and lengths (its sets', and FIRST's own: V's), and with h1's entry (W's
        # now), made here a cycle ahead against the header in S1 (S2's next: f_c is r_c registered), so S2
        # picks among one-bit registers (W's registers sit by the memory's write port, which they feed: the
        # decision alone measured W's other set -> the next-tag compare -> the pick into u_other_next, 8 LUT
        # levels and 5.95 ns of routing, 119.36 MHz; with copies of W's fields beside S2, the integer
        # switch measured V's tag copy -> the compare -> FIRST's choice and the pick into u_tag_eq, 7 LUT
        # levels and 5.1 ns of routing, 115.47 MHz). FIRST itself from a copy.
        r = s.r_c

        def eq(a, b, name):
            q = Signal(name=f"s2_{name}")
            m.d.sync += q.eq(a == b)
            return q
        fields = {"tag": ("tag", "tag"), "next": ("tag", "next_tag"), "len": ("length", "plen")}
        s.wc = SimpleNamespace(first=register_copy(m, agg & upd.first, "s2_w_first", platform, reset=True))
        for key, (field, own) in fields.items():
            mine = getattr(r, own)
            setattr(s.wc, f"cur_{key}", eq(new_cur[field], mine, f"w_cur_{key}"))
            setattr(s.wc, f"oth_{key}", eq(new_other[field], mine, f"w_oth_{key}"))
            setattr(s.wc, f"v_{key}", eq(u_c.tag if field == "tag" else u_c.plen, mine, f"v_{key}"))
            setattr(s.wc, f"h1_{key}", [eq(s.w_new[k][field], mine, f"h1_{k}_{key}") for k in (0, 1)])
        # The outcome registered for V: U computes only the state the next header needs.
        m.d.sync += [
            s.v_valid.eq(s.u_valid), s.v_agg.eq(agg), s.v_action.eq(s.u_action), s.v_reason.eq(s.u_reason),
            s.v_mask.eq(s.u_mask), s.v_c.eq(u_c), s.v_outcome.eq(upd.outcome), s.v_accepted.eq(upd.accepted),
            s.v_complete.eq(upd.complete),
        ]

    def _decide(self, m, s):
        """V: the decision, its events and its job, from the registered outcome."""
        prm = self.params
        P = prm.ports
        v_c, outcome, v_agg, v_valid, v_action = s.v_c, s.v_outcome, s.v_agg, s.v_valid, s.v_action
        accepted = v_agg & s.v_accepted
        resend = v_agg & (outcome == SlotOutcome.RESEND)
        refused = v_agg & ((outcome == SlotOutcome.MISMATCH) | (outcome == SlotOutcome.LENGTH_MISMATCH))
        completes = v_agg & s.v_complete
        if prm.uplink:
            # a filled set of a rule with the uplink action sends its partial up; a' sends it again
            up_on = v_c.up.any()
            partial = completes & up_on & ~s.v_parent_done
            up_resend = v_agg & s.v_up_resend
            m.d.sync += [self.ev_partial_sent.eq(partial), self.ev_partial_resent.eq(up_resend)]
        drop_now = v_valid & ((v_action == Action.DROP) | refused)
        reason = Mux(refused, Mux(outcome == SlotOutcome.MISMATCH, DropReason.TAG_MISMATCH,
                                  DropReason.LENGTH_MISMATCH), s.v_reason)
        m.d.sync += [
            self.ev_drop.eq(drop_now), self.ev_drop_reason.eq(reason),
            self.ev_forwarded.eq(v_valid & (v_action == Action.FORWARD)),
            self.ev_contribution.eq(accepted), self.ev_completed.eq(completes & ~partial if prm.uplink else completes),
            self.ev_duplicate.eq(v_agg & ((outcome == SlotOutcome.REPEAT) | (outcome == SlotOutcome.RESEND))),
            self.ev_resent.eq(resend),
        ]
        push, d = Signal(P), Signal(decision_layout(prm))
        job_valid, job = Signal(), Signal(job_layout(prm))
        m.d.comb += [*(lane.valid.eq(push[p]) for p, lane in enumerate(self.lanes)),
                     *(lane.payload.eq(d) for lane in self.lanes),
                     self.jobs.valid.eq(job_valid), self.jobs.payload.eq(job)]
        m.d.sync += [
            push.eq(Mux(v_valid, v_c.me, 0)),
            d.action.eq(Mux(drop_now, Action.DROP, v_action)), d.mask.eq(s.v_mask), d.write.eq(accepted),
            d.row_base.eq(v_c.row_base), d.rows.eq(v_c.rows), d.beats.eq(v_c.beats), d.length.eq(v_c.length),
            job_valid.eq(completes | resend | up_resend if prm.uplink else completes | resend),
            job.cais.eq(v_c.cais), job.mask.eq(Mux(resend, v_c.me, v_c.results)),
            job.contributors.eq(v_c.contributors), job.row_base.eq(v_c.row_base),
            job.rows.eq(v_c.rows),
            job.dtype.eq(v_c.kind.dtype), job.op.eq(v_c.kind.op), job.acc_fp32.eq(v_c.kind.acc_fp32),
            job.saturate.eq(v_c.kind.saturate),
        ]
        if prm.uplink:
            # the partial (and its repeat) to the uplink port, from the local contributors' banks; the
            # parent's result, and every re-serve of a set done by it, from the uplink port's bank alone
            m.d.sync += [
                job.mask.eq(Mux(resend, v_c.me, Mux(partial | up_resend, v_c.up, v_c.results))),
                job.contributors.eq(Mux(up_on & (resend | s.v_parent_done), v_c.up, v_c.contributors)),
                job.up.partial.eq(partial | up_resend), job.up.retransmit.eq(up_resend), job.up.dst.eq(v_c.dst),
            ]

    def _write(self, m, s):
        """W: the state write (the memory puts the reset sweep's first, the maintenance's after it)."""
        m.d.comb += [self.state.write_en.eq(s.w_agg), self.state.write_addr.eq(s.w_slot),
                     self.state.write_data.eq(s.w_new)]
        w = self.written
        # (the sets in use counted on W's registers, before the swap by the set bit, which leaves the count
        # as it is: the integer switch measured W's set bit -> the swap -> the count -> a rule entry's
        # change, 6 LUT levels and 6.83 ns of routing, 113.65 MHz)
        m.d.comb += [w.valid.eq(s.w_agg), w.payload.new_used.eq(sets_in_use((s.w_cur_r, s.w_oth))),
                     w.payload.old_bitmaps.eq(s.w_old),
                     w.payload.rule.eq(s.w_rule), w.payload.old_rules.eq(s.w_old_rule)]
