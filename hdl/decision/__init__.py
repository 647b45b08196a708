"""The decision pipeline: one frame header per cycle, from the ingress ports' queued headers to a decision
for the port's lane and, for a set that completes or a resend, a result job.

The pipeline is the composition of its parts, each a component of its own with its latency::

    Arbiter (arbiter.py)        G: round-robin grant; the take a register                 latency 1
    RuleLookup (lookup.py)      G: the rule and MAC compares, in parts; T: the take selects the offered
                                headers' finished picks, registered with the header; B1: the rule's and
                                MAC entry's fields; B2: slot, set, the source binding,
                                the stateless drops                                        latency 3
    SlotState (slot_state.py)   S0: the state read, BAD_SLOT, SPOOFED_SOURCE, an ordinary frame's ports; S1, S2: the
                                forwarding from the writes in flight, the compares; U: SetUpdate;
                                V: the decision, events and job; W: the state write         latency 5
    Maintenance (maintenance.py)  SLOT_CLEAR, the aging scanner, the aged events
    UsageCounters (counters.py)   SLOTS_IN_USE and SETS_IN_USE per rule entry

The slot state itself lives in the SRAM buffer (:class:`cais.hdl.sram.buffer.SramBuffer`: the memory, its read
and write arbitration between the pipeline and the maintenance, the reset sweep): ``SlotState`` and
``Maintenance`` use it through a port each, the decision's ``state`` and ``maint``. A decision alone (a test,
the formal harness) gets a memory of its own with :func:`attach_state_memory`.

One header per cycle, never stalled: the arbiter holds headers back instead (``hold``, and the
maintenance's ``blocked`` for all-reduce headers only). :data:`DECISION_LATENCY` is the lookup's and the
slot state's latencies: from the take to the decision.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, RegisterMap

from ..common.enums import DropReason
from ..control.tables import TableProgramSignature
from ..parser.ingress import frame_meta_layout
from ..sram.slots import SetUpdate
from ..sram.state import SlotStatePort, SlotStateMemory
from .arbiter import Arbiter
from .counters import UsageCounters, writer_delta
from .layouts import bank_addr_bits, decision_layout, job_layout
from .lookup import RuleLookup
from .maintenance import Maintenance, age_due
from .slot_state import STATE_WRITE_LEAD, SlotState, new_stamp

__all__ = ["Decision", "decision_layout", "job_layout", "bank_addr_bits", "DECISION_LATENCY", "DECISION_HEADERS",
           "STATE_WRITE_LEAD", "Arbiter", "RuleLookup", "SlotState", "Maintenance", "UsageCounters",
           "writer_delta", "new_stamp", "age_due", "attach_state_memory"]

#: Clock edges from the cycle a header is taken (``take``) to its decision on ``push``/``decision``
#: (and its events, and its job on ``job_valid``/``job``).
DECISION_LATENCY = RuleLookup.latency + SlotState.latency
#: Headers that may each still queue a job when ``hold`` is sampled: the one granted in that cycle (taken
#: in the next) and those taken in the ``DECISION_LATENCY + 1`` cycles up to it.
DECISION_HEADERS = DECISION_LATENCY + 2


class Decision(wiring.Component):
    """Decides every good frame: drop (with a reason), forward (to a port mask) or aggregate.

    Members
    -------
    headers[p] : In(stream.Signature(frame_meta_layout))
        Port p's oldest undecided header, offered while ``valid`` (the port has a header and room for its
        decision); ``ready`` takes it. ``ready`` is a register, granted in the cycle before from the
        ``valid`` bits: a header must stay offered, the same, until taken. Its ``all_reduce`` bit must be
        the header's (a CAIS all-reduce frame): only such a header waits for maintenance (the reset sweep,
        a SLOT_CLEAR, an aging visit); any other is granted in the cycle it is first offered.
    hold : In(1)
        Grant no header this cycle (the result jobs have no room for what may complete: the
        :data:`DECISION_HEADERS` headers in flight may each queue one).
    lanes[p] : Out(stream.Signature(decision_layout, always_ready=True))
        A decision for port p's lane (at most one port's ``valid`` per cycle, the same ``payload`` on
        every port), :data:`DECISION_LATENCY` cycles after the take.
    jobs : Out(stream.Signature(job_layout, always_ready=True))
        A result to send, in decision order, with the decision.
    program : In(TableProgramSignature); ev_* : Out(1); ev_drop_reason : Out(DropReason);
    slots_in_use : Out(32)
        Table programming, one event pulse per decided frame for the counters (with its decision), non-empty
        sets (updated with the decision).
    sets_in_use[e] : Out(32)
        Per rule entry: the non-empty sets of the slots whose last writer (an all-reduce frame that reached
        the slot state) matched entry ``e``, a cycle after ``slots_in_use`` counts them: they add up to
        ``slots_in_use`` of the cycle before.
    aged : Out(1); aged_rule : Out(range(rules)); aged_slot, aged_set : Out; aged_lost : Out(1)
        A set aged (AGING, docs/registers.md), in the cycle of its write (freed, or marked aged): a pulse,
        the rule entry it counts for, which set; ``aged_lost``: its event found the queue full.
    aged_event : Out(32); aged_ports : Out(32)
        The AGED_EVENT and AGED_PORTS words of the oldest queued event (``program.aged_pop_stb`` pops it).
    clear_full : Out(1)
        The maintenance's SLOT_CLEAR queue is full: no SLOT_CLEAR strobe may come from the next cycle on
        until it falls (the switch holds AXI4-Lite writes back meanwhile, :class:`Maintenance`).
    state : Out(SlotStatePort(read_en=False)); maint : Out(SlotStatePort(read_en=True))
        The slot-state pipeline's and the maintenance's ports on the SRAM buffer's slot-state memory.
    sweeping : In(1); sweep_last : In(1)
        The memory's reset sweep writes in this cycle; it writes its last slot.
    busy : Out(1)
        A header is in the pipeline (not counting the outputs).
    uplink : In(32); ev_partial_sent : Out(1); ev_partial_resent : Out(1)
        Only with ``params.uplink`` (docs/protocol.md section 13): the UPLINK register's word (the lookup's)
        and the slot state's events of the uplink action.

    Every output is a register. ``age_unit_log2`` is the age unit's (:data:`cais.registers.AGE_UNIT_LOG2`
    but in the formal harness); ``set_update``, ``new_stamp``, ``age_due`` and ``writer_delta`` are the
    parts' (:class:`SlotState`, :class:`Maintenance`, :class:`UsageCounters`), replaced only by the
    formal harness's mutants. ``age_clock`` is the maintenance's, for the formal harness.
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap, *, age_unit_log2: int = AGE_UNIT_LOG2,
                 set_update=SetUpdate, new_stamp=new_stamp, age_due=age_due, writer_delta=writer_delta):
        self.params, self.regmap = params, regmap
        P = params.ports
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "headers": In(stream.Signature(self.meta_layout)).array(P), "hold": In(1),
            "lanes": Out(stream.Signature(decision_layout(params), always_ready=True)).array(P),
            "jobs": Out(stream.Signature(job_layout(params), always_ready=True)),
            "program": In(TableProgramSignature(regmap)),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1),
            "sets_in_use": Out(32).array(params.rules),
            "aged": Out(1), "aged_rule": Out(range(params.rules)), "aged_slot": Out(range(params.slots)),
            "aged_set": Out(1), "aged_lost": Out(1), "aged_event": Out(32), "aged_ports": Out(32),
            "clear_full": Out(1),
            "state": Out(SlotStatePort(params, read_en=False)), "maint": Out(SlotStatePort(params, read_en=True)),
            "sweeping": In(1), "sweep_last": In(1),
            **({"uplink": In(32), "ev_partial_sent": Out(1), "ev_partial_resent": Out(1)} if params.uplink else {}),
        })
        self.age_unit_log2 = age_unit_log2
        self.arbiter = Arbiter(P)
        self.lookup = RuleLookup(params, regmap)
        self.slot_state = SlotState(params, set_update=set_update, new_stamp=new_stamp)
        self.maintenance = Maintenance(params, regmap, age_unit_log2=age_unit_log2, age_due=age_due)
        self.counters = UsageCounters(params, writer_delta=writer_delta)
        self.age_clock = self.maintenance.age_clock

    def elaborate(self, platform):
        m = Module()
        m.submodules.arbiter = arb = self.arbiter
        m.submodules.lookup = look = self.lookup
        m.submodules.slot_state = st = self.slot_state
        m.submodules.maintenance = mt = self.maintenance
        m.submodules.counters = cnt = self.counters
        P = self.params.ports

        # Arbiter and lookup: the offered headers, the take.
        m.d.comb += [
            arb.request.eq(Cat(h.valid for h in self.headers)),
            arb.all_reduce.eq(Cat(h.payload.all_reduce for h in self.headers)),
            arb.blocked.eq(mt.blocked), arb.hold.eq(self.hold),
            *(h.ready.eq(arb.ready[p]) for p, h in enumerate(self.headers)),
            *(look.headers[p].eq(h.payload) for p, h in enumerate(self.headers)),
            look.take.eq(arb.lookup_take), look.port.eq(arb.port), look.taken_stateful.eq(arb.stateful),
        ]
        wiring.connect(m, wiring.flipped(self.program), look.program, mt.program)
        # The slot state: the looked-up header, the memory's ports; the decision's outputs.
        wiring.connect(m, look.o, st.i)
        wiring.connect(m, st.state, wiring.flipped(self.state))
        wiring.connect(m, mt.state, wiring.flipped(self.maint))
        m.d.comb += [mt.sweeping.eq(self.sweeping), mt.sweep_last.eq(self.sweep_last)]
        m.d.comb += [st.read_slot.eq(look.read_slot), st.now.eq(mt.now)]
        for p in range(P):
            wiring.connect(m, st.lanes[p], wiring.flipped(self.lanes[p]))
        wiring.connect(m, st.jobs, wiring.flipped(self.jobs))
        m.d.comb += [getattr(self, name).eq(getattr(st, name))
                     for name in ("ev_drop", "ev_drop_reason", "ev_forwarded", "ev_contribution", "ev_duplicate",
                                  "ev_completed", "ev_resent")]
        if self.params.uplink:
            m.d.comb += [look.uplink.eq(self.uplink), self.ev_partial_sent.eq(st.ev_partial_sent),
                         self.ev_partial_resent.eq(st.ev_partial_resent)]
        # Maintenance waits for the all-reduce headers in flight, from the take to the write: exactly
        # (a clear or a visit that started a cycle later than it could lost SLOT_CLEARs written close
        # together while a pending clear was one register; they queue now), from a register of each
        # part's view of the next cycle (registers but for the arbiter's, which needs no grant) and B2's
        # own flip-flop, so that the wait's start and ``blocked`` see no logic of the far parts (the whole
        # switch measured the lookup's B2 registers -> its decode -> ``drained`` -> ``blocked``, 6 LUT
        # levels and 6.98 ns of routing, 113.31 MHz).
        drained_else = Signal(init=1)
        m.d.sync += drained_else.eq(~(arb.stateful_next | look.stateful_next | st.stateful_next))
        m.d.comb += mt.drained.eq(drained_else & ~look.stateful_b2)
        m.d.comb += [getattr(self, name).eq(getattr(mt, name))
                     for name in ("aged", "aged_rule", "aged_slot", "aged_set", "aged_lost", "aged_event",
                                  "aged_ports", "clear_full")]
        # The counters: every write of the slot state.
        wiring.connect(m, st.written, cnt.written)
        m.d.comb += [cnt.sweeping.eq(self.sweeping), cnt.cleared.eq(mt.cleared),
                     cnt.cleared_entry.eq(mt.cleared_entry), cnt.visit_aged.eq(mt.visit_aged),
                     cnt.visit_free.eq(mt.visit_free), cnt.visit_rule.eq(mt.visit_rule),
                     self.slots_in_use.eq(cnt.slots_in_use),
                     *(self.sets_in_use[e].eq(cnt.sets_in_use[e]) for e in range(self.params.rules))]
        m.d.comb += self.busy.eq(arb.take.any() | look.busy | st.busy)
        return m


def attach_state_memory(m: Module, decision: Decision, memory: SlotStateMemory | None = None) -> SlotStateMemory:
    """Add *decision* and a slot-state memory of its own (*memory*, or a new one) to module *m*, connected as
    the switch's SRAM buffer connects them; return the memory. For a decision without the rest of the switch."""
    memory = SlotStateMemory(decision.params) if memory is None else memory
    m.submodules.decision, m.submodules.state_memory = decision, memory
    wiring.connect(m, decision.state, memory.pipe)
    wiring.connect(m, decision.maint, memory.maint)
    m.d.comb += [decision.sweeping.eq(memory.sweeping), decision.sweep_last.eq(memory.sweep_last)]
    return memory
