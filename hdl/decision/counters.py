"""SLOTS_IN_USE and SETS_IN_USE: the non-empty sets, in all and per rule entry."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams

from ..sram.slots import rule_index_bits, sets_in_use, state_entry_layout
from .slot_state import write_layout

__all__ = ["UsageCounters", "writer_delta"]


def writer_delta(entry: int, writer, new_used, old_used, old_rule):
    """The change of rule entry ``entry``'s sets in use when a frame of entry ``writer`` writes a slot:
    the slot's sets after the write (``new_used`` non-empty) count for the writer, and each set that was
    not empty before (``old_used[k]``) leaves the entry that stored it (``old_rule[k]``)."""
    return (Mux(writer == entry, new_used, 0) - (old_used[0] & (old_rule[0] == entry))
            - (old_used[1] & (old_rule[1] == entry)))


class UsageCounters(wiring.Component):
    """The counts of non-empty sets, moved by every write of the slot state (the writes are exclusive).

    Members
    -------
    written : In(stream.Signature(write_layout, always_ready=True))
        A header's state write (its sets in use after it, the old bitmaps and rule entries).
    sweeping : In(1)
        The reset sweep is on: nothing counts.
    cleared : In(1); cleared_entry : In(state_entry_layout)
        A SLOT_CLEAR writes empty the slot whose entry was ``cleared_entry``.
    visit_aged : In(1); visit_free : In(1); visit_rule : In(rule index bits)
        The aging scanner writes an aged set (emptied with ``visit_free``) that counts for ``visit_rule``.
    slots_in_use : Out(32)
        The non-empty sets, ``latency`` cycles after the write (the change is registered before the adder:
        a SLOT_CLEAR's change comes from a register of the maintenance, beside the memory's output).
    sets_in_use[e] : Out(32)
        Per rule entry: the non-empty sets whose slot's last writer (an all-reduce frame that reached the
        slot state) matched entry ``e``, ``rule_latency`` cycles after the write (the compares of the entry
        indices and the adder are a cycle apart): they add up to ``slots_in_use`` in every cycle.

    ``writer_delta`` computes an entry's change for a header's write (the formal harness's mutant comes
    in through it). Every output is a register.
    """

    latency = 2
    rule_latency = 2

    def __init__(self, params: SwitchParams, *, writer_delta=writer_delta):
        self.params, self.writer_delta = params, writer_delta
        super().__init__({
            "written": In(stream.Signature(write_layout(params), always_ready=True)), "sweeping": In(1),
            "cleared": In(1), "cleared_entry": In(state_entry_layout(params)),
            "visit_aged": In(1), "visit_free": In(1), "visit_rule": In(rule_index_bits(params)),
            "slots_in_use": Out(32), "sets_in_use": Out(32).array(params.rules),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P, R, rule_bits = prm.ports, prm.rules, rule_index_bits(prm)
        ent = state_entry_layout(prm)
        w = self.written.payload

        f_mem_v = data.View(ent, self.cleared_entry.as_value())
        in_use = Signal(32)
        m.d.comb += self.slots_in_use.eq(in_use)
        # Per rule entry: a write moves the slot's sets from their stored entries to the writer's.
        per_rule = [Signal(32, name=f"sets_in_use{e}") for e in range(R)]
        m.d.comb += [self.sets_in_use[e].eq(per_rule[e]) for e in range(R)]
        old_used = [w.old_bitmaps[:P] != 0, w.old_bitmaps[P:] != 0]
        old_rule = [w.old_rules[:rule_bits], w.old_rules[rule_bits:]]
        # One adder each, its operand the AND-OR of the (exclusive) write's change, so the path into it is a
        # few LUTs from registers whatever writes.

        def change(w_term, clr_term, sc_term):
            terms = [Signal(signed(3), name=n) for n in ("d_w", "d_clr", "d_sc")]
            m.d.comb += [terms[0].eq(Mux(self.written.valid, w_term, 0)), terms[1].eq(Mux(self.cleared, clr_term, 0)),
                         terms[2].eq(Mux(self.visit_aged, sc_term, 0))]
            return terms[0] | terms[1] | terms[2]
        # The change is registered first, then added (latency 2), as per rule entry below.
        in_use_d = Signal(signed(3))
        m.d.sync += [in_use_d.eq(Mux(self.sweeping, 0, change(w.new_used - (old_used[0] + old_used[1]),
                                                              -sets_in_use(f_mem_v), -self.visit_free))),
                     in_use.eq(in_use + in_use_d)]
        # Per rule entry the change is registered first too: SETS_IN_USE follows the state as SLOTS_IN_USE
        # does.
        per_rule_d = [Signal(signed(3), name=f"sets_in_use_d{e}") for e in range(R)]
        m.d.sync += [per_rule_d[e].eq(Mux(self.sweeping, 0, change(
            self.writer_delta(e, w.rule, w.new_used, old_used, old_rule),
            -(((f_mem_v[0].bitmap != 0) & (f_mem_v[0].rule == e))
              + ((f_mem_v[1].bitmap != 0) & (f_mem_v[1].rule == e))),
            -(self.visit_free & (self.visit_rule == e))))) for e in range(R)]
        m.d.sync += [per_rule[e].eq(per_rule[e] + per_rule_d[e]) for e in range(R)]
        return m
