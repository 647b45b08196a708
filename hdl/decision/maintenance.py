"""The slot state's maintenance: SLOT_CLEAR, the aging scanner and its event queue (the reset sweep is the
slot-state memory's own: :class:`cais.hdl.sram.state.SlotStateMemory`)."""

from amaranth.hdl import C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, AGED_QUEUE_DEPTH, RegisterMap

from ..common.pipeline import register_copy
from ..control.tables import TableProgramSignature, field_bits
from ..sram.slots import age_stamp_bits, rule_index_bits, state_entry_layout, state_set_layout
from ..sram.state import SlotStatePort, slot_bits

__all__ = ["Maintenance", "age_due", "past_age", "CLEAR_QUEUE_DEPTH"]

#: The SLOT_CLEARs the maintenance holds, written and not yet started. The AXI4-Lite bridge takes a write at
#: most every 4 cycles (address, strobe, latch, response: :class:`cais.hdl.control.csr.AXI4LiteToCSR`) and
#: started clears leave at one per 4 cycles (read, wait, write, then the next starts), so the queue grows
#: only while its oldest waits: for the all-reduce headers in flight (``drained``, up to about 9 cycles
#: after ``blocked`` rises) behind an aging visit that just started (5 cycles), about 14 cycles, 4 writes at
#: most. With 4 entries the controller's SLOT_CLEARs written back to back never wait in the traffic; only
#: the reset sweep (NUM_SLOTS cycles) holds them longer, and then the bridge holds the next write back
#: (``clear_full``) rather than lose one. Flip-flops: 4 x (slot bits + 1).
CLEAR_QUEUE_DEPTH = 4


def past_age(elapsed, rolls, age):
    """Whether ``elapsed + rolls`` (a unit more when ``rolls``: the age clock's unit ends between the cycle
    ``elapsed`` was found in and now), modulo 2 ** len(elapsed), is more than ``age``: without the adder,
    so the elapsed units found a cycle early cost the decision one compare."""
    top = (1 << len(elapsed)) - 1
    return Mux(rolls, (elapsed >= age) & (elapsed != top), elapsed > age)


def age_due(s, over_age):
    """Whether the visited set ``s`` (a state set) ages now: partly filled (bitmap not empty, not complete),
    not aged in this fill, and its last accepted contribution more than the age before now (``over_age``:
    the units since its stamp, modulo the stamp's bits, which leave room for the largest age and one scan
    period)."""
    due = (s.bitmap != 0) & ~s.done & ~s.aged & over_age
    if "sent" in s.shape().members:     # a tree leaf's sent set waits for its parent, not a rank: not aged
        due = due & ~s.sent
    return due


class Maintenance(wiring.Component):
    """What changes the slot state besides the headers: SLOT_CLEAR and aging; it waits for the memory's reset
    sweep (one slot per cycle after reset: memories do not reset) and holds all-reduce headers back meanwhile.

    A SLOT_CLEAR waits until no all-reduce header is in the pipeline (``drained``), then reads the slot (for
    the counters) and writes it empty. SLOT_CLEARs written while one waits are queued (``clear_depth``
    entries, :data:`CLEAR_QUEUE_DEPTH`) and carried out in the order written, each as a clear alone is, one
    every 5 cycles while ``drained``; a full queue raises ``clear_full``, and the register bridge takes no
    write until it falls (a strobe that finds the queue full, and no clear starting, is ignored: only a
    source that does not wait for ``clear_full`` can lose one). While ``AGING.age`` is not 0, a scanner
    visits one set per age unit (``age_unit_log2`` cycles), every set in turn, through the same machinery
    (after the clears queued): it waits for the headers in flight, reads the slot, picks the visited set from the registered read (a cycle of its own), decides
    whether it ages (a cycle of its own, from the picked set) and writes the set freed or marked aged, so
    it adds nothing to the slot-state loop and no new header reads the slot before the write. Each set
    keeps the age unit of its last accepted contribution (``stamp``, modulo 2**stamp bits) and an ``aged``
    bit; the aged sets are queued as events (AGED_EVENT, AGED_PORTS).

    Members
    -------
    program : In(TableProgramSignature)
        SLOT_CLEAR, AGING and AGED_POP (the rest is the lookup's).
    drained : In(1)
        No all-reduce header is in the pipeline, from the take to its write.
    sweeping : In(1); sweep_last : In(1)
        The memory's reset sweep writes in this cycle; it writes its last slot in this cycle.
    clear_full : Out(1)
        A register: the SLOT_CLEAR queue is full; a SLOT_CLEAR written from the next cycle on waits until it
        falls (the register bridge holds AXI4-Lite writes back meanwhile). It rises at most 1 cycle after
        the strobe that fills the queue.
    blocked : Out(1)
        A register: hold all-reduce headers back in this cycle (the sweep, a clear queued, a visit due or
        starting). One granted in the cycle after it falls reads the slot state (S0) after the maintenance's
        write: a clear blocks the cycle after its start too, the scanner, which writes a cycle later, the
        two cycles after its start.
    state : Out(SlotStatePort(read_en=True))
        Its reads and writes of the slot-state memory (the pipeline's writes go before its own).
    now : Out(age stamp bits)
        The age clock's unit: an accepted contribution stamps its set with it.
    cleared : Out(1); cleared_entry : Out(state_entry_layout); visit_aged : Out(1); visit_free : Out(1);
    visit_rule : Out(rule index bits)
        For the counters: a clear writes the slot whose entry was ``cleared_entry`` (a register); a
        visited set aged and is written in this cycle (emptied with ``visit_free``), counted for
        ``visit_rule``.
    aged : Out(1); aged_rule : Out(range(rules)); aged_slot, aged_set : Out; aged_lost : Out(1)
        Registers, in the cycle after an aged set's write: a pulse, the rule entry it counts for, which set;
        ``aged_lost``: its event found the queue full.
    aged_event : Out(32); aged_ports : Out(32)
        The AGED_EVENT and AGED_PORTS words of the oldest queued event (``program.aged_pop_stb`` pops it).

    ``latency`` (5): a SLOT_CLEAR strobed in cycle t while ``drained`` (and no clear queued or under way)
    writes its slot in cycle t + 5; each queued one starts 5 cycles after the one before it, while ``drained``;
    ``visit_latency`` (5): a visit due in cycle t while ``drained`` writes in t + 5 (the write comes only if
    the set aged; it decides in t + 4 from the age clock and ``AGING`` of that cycle). ``age_due`` decides
    whether a visited set ages (the formal harness's mutant comes in through it). The age clock
    (``age_clock``, in cycles; its upper bits count age units) is read by the formal harness.
    """

    latency = 5
    visit_latency = 5

    def __init__(self, params: SwitchParams, regmap: RegisterMap, *, age_unit_log2: int = AGE_UNIT_LOG2,
                 age_due=age_due, clear_depth: int = CLEAR_QUEUE_DEPTH):
        if clear_depth < 2:
            raise ValueError(f"clear_depth must be at least 2, not {clear_depth}")
        self.params, self.regmap, self.clear_depth = params, regmap, clear_depth
        self.age_unit_log2, self.age_due = age_unit_log2, age_due
        # The age clock, in cycles (its upper bits count age units): the formal harness reads it.
        self.age_clock = Signal(age_unit_log2 + age_stamp_bits(params))
        super().__init__({
            "program": In(TableProgramSignature(regmap)), "drained": In(1), "sweeping": In(1), "sweep_last": In(1),
            "blocked": Out(1), "clear_full": Out(1), "state": Out(SlotStatePort(params, read_en=True)),
            "now": Out(age_stamp_bits(params)),
            "cleared": Out(1), "cleared_entry": Out(state_entry_layout(params)),
            "visit_aged": Out(1), "visit_free": Out(1), "visit_rule": Out(rule_index_bits(params)),
            "aged": Out(1), "aged_rule": Out(range(params.rules)), "aged_slot": Out(range(params.slots)),
            "aged_set": Out(1), "aged_lost": Out(1), "aged_event": Out(32), "aged_ports": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        sb = slot_bits(prm)
        # The age clock: age units (AGE_UNIT_LOG2 cycles each) modulo 2**stamp bits, free running; an accepted
        # contribution stamps its set with it.
        U = self.age_unit_log2
        clock = self.age_clock
        m.d.sync += clock.eq(clock + 1)
        m.d.comb += self.now.eq(clock[U:])
        aging = self.regmap["AGING"]
        aging_on = field_bits(self.program.aging, aging.field("age")) != 0

        sweeping = self.sweeping
        # A SLOT_CLEAR: queued (``_clear_queue``), then clr_read, clr_wait, clr_hold (the read slot registered
        # here for the counters, so the memory's output drives only flip-flops across the die: the integer
        # switch measured the memory's output register -> 4.11 ns of routing -> the counters' change logic,
        # 111.98 MHz), clr_write.
        clr_read, clr_wait, clr_hold, clr_write = Signal(), Signal(), Signal(), Signal()
        clr_cur = Signal(sb)
        # The aging scanner's visit (one set per age unit while aging is on): due, then read, wait, pick (the
        # visited set from the registered read), decide (from the picked set) and write; it starts when no
        # clear waits (a clear goes first).
        scan_due, sc_read, sc_wait, sc_pick, sc_decide, sc_write = (Signal(), Signal(), Signal(), Signal(),
                                                                    Signal(), Signal())
        scan_pos = Signal(sb + 1)                 # the next set to visit: slot, set
        sc_set = Signal()
        clearing = (clr_read | clr_wait | clr_hold | clr_write
                    | sc_read | sc_wait | sc_pick | sc_decide | sc_write)
        start_clear = Signal()
        clear_pending, next_pending, head_slot, head_valid = self._clear_queue(m, start_clear, platform)
        m.d.comb += start_clear.eq(clear_pending & ~clearing & ~sweeping & self.drained)
        start_scan = scan_due & ~clear_pending & ~clearing & ~sweeping & self.drained
        next_read = start_clear & head_valid
        tick = clock[:U] == (1 << U) - 1 if U else 1
        next_due = aging_on & ((tick & ~sweeping) | (scan_due & ~start_scan))
        with m.If(start_clear):
            m.d.sync += clr_cur.eq(head_slot)
        with m.If(start_scan):
            m.d.sync += [clr_cur.eq(scan_pos[1:]), sc_set.eq(scan_pos[0]),
                         scan_pos.eq(Mux(scan_pos == 2 * prm.slots - 1, 0, scan_pos + 1))]
        m.d.sync += [clr_read.eq(next_read), clr_wait.eq(clr_read), clr_hold.eq(clr_wait), clr_write.eq(clr_hold),
                     scan_due.eq(next_due), sc_read.eq(start_scan), sc_wait.eq(sc_read),
                     sc_pick.eq(sc_wait), sc_decide.eq(sc_pick), sc_write.eq(sc_decide)]
        blocked = Signal(init=1)
        m.d.sync += blocked.eq((sweeping & ~self.sweep_last) | next_pending | start_clear | next_due | start_scan
                               | sc_read)
        with m.If(clr_hold):
            m.d.sync += self.cleared_entry.eq(self.state.read_data)
        m.d.comb += [self.blocked.eq(blocked), self.cleared.eq(clr_write),
                     self.state.read_en.eq(clr_read | sc_read), self.state.read_addr.eq(clr_cur)]

        sc_go, sc_entry = self._visit(m, clr_cur, sc_set, sc_pick, sc_decide, sc_write, aging_on, tick)
        st = self.state
        # A clear's write (the slot emptied), or the visited set aged: freed or marked.
        # The address and data whatever the enable, so the visit's decision drives only the enable (the
        # integer switch measured the decision -> the write address -> the memory's address mux -> the block
        # RAMs' address pins, 5 LUT levels and 2.74 ns on the last net, 114.06 MHz).
        m.d.comb += [st.write_en.eq(clr_write | sc_go), st.write_addr.eq(clr_cur),
                     st.write_data.eq(Mux(clr_write, 0, sc_entry))]
        return m

    def _clear_queue(self, m, pop, platform):
        """The SLOT_CLEARs written and not started, oldest first: a shift register of ``clear_depth`` entries
        (the oldest always in entry 0, so the clear's start and ``blocked`` see flip-flops) and a thermometer
        of its occupancy (``occ[i]``: more than i queued). ``pop``: the oldest starts in this cycle. A strobe
        is queued unless the queue is full and none starts. Returns whether a clear waits (a register),
        whether one will wait in the next cycle (for ``blocked``), the oldest's slot and whether that slot
        exists (a SLOT_CLEAR of a slot >= NUM_SLOTS is ignored: it starts and writes nothing)."""
        D, sb = self.clear_depth, slot_bits(self.params)
        entry = data.StructLayout({"slot": sb, "valid": 1})
        queue = [Signal(entry, name=f"clear_q{i}", reset_less=True) for i in range(D)]
        occ = Signal(D, name="clear_occ")
        word = self.program.slot_clear_data[:16]
        new = Signal(entry)
        m.d.comb += [new.slot.eq(word[:sb]), new.valid.eq(word < self.params.slots)]
        push = Signal()
        m.d.comb += push.eq(self.program.slot_clear_stb & (~occ[D - 1] | pop))
        below = Cat(C(1, 1), occ[:-1])            # below[i]: more than i - 1 queued (i is the first free place)
        above = Cat(occ[1:], C(0, 1))             # above[i]: more than i + 1 queued
        for i in range(D):
            with m.If(pop):                        # the rest move up a place; a new one goes after them
                with m.If(push & occ[i] & ~above[i]):
                    m.d.sync += queue[i].eq(new)
                if i + 1 < D:                      # (the last place, if not written, is empty after a start)
                    with m.Else():
                        m.d.sync += queue[i].eq(queue[i + 1])
            with m.Elif(push & below[i] & ~occ[i]):
                m.d.sync += queue[i].eq(new)
        occ_next = Mux(push & ~pop, below, Mux(pop & ~push, above, occ))
        m.d.sync += occ.eq(occ_next)
        # clear_full: occ's last bit in a flip-flop of its own, which the placer can put beside the register
        # bridge it holds (the maintenance sits with the decision, the bridge with the register bank)
        m.d.comb += self.clear_full.eq(register_copy(m, occ_next[D - 1], "clear_full", platform, reset=True))
        head = queue[0]
        return occ[0], push | occ[1] | (occ[0] & ~pop), head.slot, head.valid

    def _visit(self, m, clr_cur, sc_set, sc_pick, sc_decide, sc_write, aging_on, tick):
        """The scanner's pick (the visited set and the entry to write, from ``state.read_data``: the slot;
        the units elapsed since its stamp, and whether the age unit ends, ``tick``), its decision (from the
        picked set) and the aged events' queue; returns the aged pulse (the write of the visited set) and the
        entry it writes."""
        prm = self.params
        P, ent, setl = prm.ports, state_entry_layout(prm), state_set_layout(prm)
        rule_bits = rule_index_bits(prm)
        aging = self.regmap["AGING"]
        age = field_bits(self.program.aging, aging.field("age"))
        age_free = field_bits(self.program.aging, aging.field("free"))
        sc_due, sc_free = Signal(), Signal()
        sc_go = sc_write & sc_due                  # the visited set aged: its write, counters, event
        sc_entry, sc_rule, sc_bitmap = (Signal(ent, reset_less=True), Signal(rule_bits, reset_less=True),
                                        Signal(P, reset_less=True))
        seen = data.View(ent, self.state.read_data.as_value())
        vis = seen[sc_set]
        freed, marked = Signal(setl), Signal(setl)
        m.d.comb += [freed.eq(0), marked.eq(vis), marked.aged.eq(1)]
        new_set = Mux(age_free, freed, marked)
        picked = Signal(setl, reset_less=True)     # the visited set, registered in the pick cycle
        # its age in units, found here, and whether the unit ends here: the decide cycle compares only (from
        # the age clock through now - stamp and the compare in one cycle, two carry chains, the whole
        # integer switch measured 9.39 ns, 106.45 MHz)
        elapsed, rolls = Signal(len(vis.stamp), reset_less=True), Signal(reset_less=True)
        with m.If(sc_pick):
            m.d.sync += [
                picked.eq(vis), elapsed.eq((self.now - vis.stamp)[:len(vis.stamp)]), rolls.eq(tick),
                sc_free.eq(age_free), sc_rule.eq(vis.rule), sc_bitmap.eq(vis.bitmap),
                sc_entry.eq(Mux(sc_set, Cat(seen[0], new_set), Cat(new_set, seen[1]))),
            ]
        with m.If(sc_decide):
            m.d.sync += sc_due.eq(self.age_due(picked, past_age(elapsed, rolls, age)) & aging_on)
        m.d.comb += [self.visit_aged.eq(sc_go), self.visit_free.eq(sc_free), self.visit_rule.eq(sc_rule)]
        # The event queue (AGED_EVENT, AGED_PORTS), pushed with the write; AGED_POP pops it.
        ev_l = data.StructLayout({"slot": slot_bits(prm), "set": 1, "rule": rule_bits, "ports": P})
        m.submodules.aged_queue = queue = SyncFIFO(width=ev_l.size, depth=AGED_QUEUE_DEPTH)
        head = data.View(ev_l, queue.r_data)
        m.d.comb += [
            queue.w_data.eq(Cat(clr_cur, sc_set, sc_rule, sc_bitmap)), queue.w_en.eq(sc_go),
            queue.r_en.eq(self.program.aged_pop_stb),
        ]
        ev_reg, ports_reg = self.regmap["AGED_EVENT"], self.regmap["AGED_PORTS"]

        def placed(reg, name, value):
            return Value.cast(value) << reg.field(name).lsb
        valid = queue.r_rdy
        m.d.sync += [
            self.aged.eq(sc_go), self.aged_rule.eq(sc_rule), self.aged_slot.eq(clr_cur), self.aged_set.eq(sc_set),
            self.aged_lost.eq(sc_go & ~queue.w_rdy),
            self.aged_event.eq(Mux(valid, placed(ev_reg, "slot", head.slot) | placed(ev_reg, "set", head.set)
                                   | placed(ev_reg, "rule", head.rule) | placed(ev_reg, "valid", valid), 0)),
            self.aged_ports.eq(Mux(valid, placed(ports_reg, "ports", head.ports), 0)
                               | placed(ports_reg, "queued", queue.level)),
        ]
        return sc_go, sc_entry
