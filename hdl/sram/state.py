"""The SRAM buffer's slot-state memory: one entry per slot (its two shadow sets), its addressing between
the decision's pipeline and its maintenance, and the reset sweep that empties it after reset."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais.params import SwitchParams

from ..common.bram import OutputRegisteredRAM
from .slots import state_entry_layout

__all__ = ["SlotStateMemory", "SlotStatePort", "STATE_READ_LATENCY", "slot_bits"]

#: Clock edges from a read address to its entry on ``read_data``: the block RAM's synchronous read, then
#: the register its output goes through before any logic (the RAM's own on ECP5:
#: :class:`cais.hdl.common.bram.OutputRegisteredRAM`).
STATE_READ_LATENCY = OutputRegisteredRAM.read_latency


def slot_bits(params: SwitchParams) -> int:
    """Bits of a slot-state address (at least one)."""
    return max(1, ceil_log2(params.slots))


class SlotStatePort(wiring.Signature):
    """One user's access to the slot-state memory, from the user's side: a read (``read_addr``; its entry on
    ``read_data`` :data:`STATE_READ_LATENCY` cycles later) and a write (``write_en``, ``write_addr``,
    ``write_data``). ``read_en`` (the maintenance's port only) takes the read port for this cycle."""

    def __init__(self, params: SwitchParams, *, read_en: bool):
        sb, ent = slot_bits(params), state_entry_layout(params)
        super().__init__({
            **({"read_en": Out(1)} if read_en else {}),
            "read_addr": Out(sb), "read_data": In(ent),
            "write_en": Out(1), "write_addr": Out(sb), "write_data": Out(ent),
        })


class SlotStateMemory(wiring.Component):
    """``params.slots`` entries of :func:`cais.hdl.sram.slots.state_entry_layout`, one read port and one
    write port, shared by the decision's slot-state pipeline and its maintenance.

    Reads: the memory reads ``pipe.read_addr`` in every cycle, or ``maint.read_addr`` while
    ``maint.read_en``. The read is synchronous and its output is registered: the entry read in cycle t is on
    ``read_data`` (both ports show the same register) in cycle t + :data:`STATE_READ_LATENCY`. A read of
    the slot written in the same cycle has no defined result (on ECP5 the RAM is a DP16KD with its output
    register, :class:`cais.hdl.common.bram.OutputRegisteredRAM`, whose two ports then collide; the
    simulation model returns the old entry): a user must not use such a read's entry. The decision never
    does: its pipeline forwards the write its read collides with (``SlotState``: the write then in W is
    in ``h1`` when the header is in B2, and ``hit5`` takes ``h1``'s entry instead of the read's), and the
    maintenance reads and writes only while no all-reduce header is in flight and holds new ones back
    (``Maintenance``). tests/hdl/test_state_collisions.py runs the decision with every colliding read
    replaced by garbage.

    Writes, one per cycle, in this order: the reset sweep's, the pipeline's, the maintenance's (the others
    are dropped: the decision keeps all-reduce headers back during the sweep, and the maintenance writes
    only while none is in flight). The reset sweep: from reset the memory (which has no reset value)
    writes slot s empty in cycle s, one slot per cycle.

    Members
    -------
    pipe : In(SlotStatePort(read_en=False))
        The slot-state pipeline's read (every cycle) and write.
    maint : In(SlotStatePort(read_en=True))
        The maintenance's reads and writes (SLOT_CLEAR, the aging scanner).
    sweeping : Out(1)
        A register: the reset sweep writes in this cycle (1 from reset for ``slots`` cycles).
    sweep_last : Out(1)
        The sweep writes its last slot in this cycle.

    ``ram`` is the RAM (:class:`~cais.hdl.common.bram.OutputRegisteredRAM`, or one given: a test's with
    another simulation form of the colliding reads) and ``mem`` its simulation
    form's memory (``ram.mem``: the formal harness adds read ports to it, tests read it; it is not part of
    an ECP5 synthesis). ``read_latency`` (:data:`STATE_READ_LATENCY`) is the read's latency.
    """

    read_latency = STATE_READ_LATENCY

    @property
    def mem(self):
        """The RAM's simulation-form memory (``ram.mem``)."""
        return self.ram.mem

    def __init__(self, params: SwitchParams, *, ram: OutputRegisteredRAM | None = None):
        self.params = params
        self.ram = OutputRegisteredRAM(state_entry_layout(params), params.slots) if ram is None else ram
        super().__init__({
            "pipe": In(SlotStatePort(params, read_en=False)), "maint": In(SlotStatePort(params, read_en=True)),
            "sweeping": Out(1, init=1), "sweep_last": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = ram = self.ram
        pipe, mt = self.pipe, self.maint
        slots = self.params.slots
        # One read port: the maintenance's read takes it for the cycle. Its output is the RAM's register
        # (block RAM output timing), shared by both users.
        m.d.comb += [ram.rd_addr.eq(Mux(mt.read_en, mt.read_addr, pipe.read_addr)), ram.rd_en.eq(1),
                     pipe.read_data.eq(ram.rd_data), mt.read_data.eq(ram.rd_data)]
        # The reset sweep: slot s in cycle s after reset.
        sweep = Signal(range(max(2, slots)))
        with m.If(self.sweeping):
            m.d.sync += [sweep.eq(sweep + 1), self.sweeping.eq(sweep != slots - 1)]
        m.d.comb += self.sweep_last.eq(self.sweeping & (sweep == slots - 1))
        with m.If(self.sweeping):
            m.d.comb += [ram.wr_addr.eq(sweep), ram.wr_data.eq(0), ram.wr_en.eq(1)]
        with m.Elif(pipe.write_en):
            m.d.comb += [ram.wr_addr.eq(pipe.write_addr), ram.wr_data.eq(pipe.write_data), ram.wr_en.eq(1)]
        with m.Else():      # (the maintenance's address and data whatever its enable: selects from registers)
            m.d.comb += [ram.wr_addr.eq(mt.write_addr), ram.wr_data.eq(mt.write_data), ram.wr_en.eq(mt.write_en)]
        return m
