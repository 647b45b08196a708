"""Small pipeline helpers shared by the RTL blocks."""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Mux, ResetSignal, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..latency import REGISTER_SLICE

__all__ = ["delay_line", "register_copy", "CreditSlice"]


def delay_line(m, value, cycles: int, name: str, *, reset_less: bool = True):
    """``value`` delayed by ``cycles`` registers on ``m.d.sync`` (``value`` itself for 0): a chain with one
    write point per register, named ``<name>_d1 ..``. ``reset_less=False`` for what a reset must clear
    (valid bits). A :class:`~amaranth.lib.data.View` stays a view of its layout. A constant stays a
    constant when ``reset_less``: data registers fed a constant would only hold it after their first edge
    and keep the logic behind them alive (a store-only slot ALU's controls)."""
    if reset_less and isinstance(value, Const):
        return value
    if not isinstance(value, data.View):
        value = Value.cast(value)
    for k in range(cycles):
        reg = Signal(value.shape(), name=f"{name}_d{k + 1}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def register_copy(m, value, name: str, platform, *, enable=None, reset: bool = False):
    """``value`` registered once on ``m.d.sync`` in flip-flops of their own, which synthesis keeps
    apart from every other register of the same value, so that each copy can be placed beside the logic it
    feeds (yosys' ``opt_merge`` folds identical registers into one, whatever their names or ``keep``
    attributes, and ``memory_dff`` folds a register behind a memory's read into the memory). For an ECP5
    target (:func:`cais.hdl.common.bram.ecp5_target`) the copy is ``TRELLIS_FF`` instances, which it does
    not merge; elsewhere (simulation, Verilator) a plain register, which behaves the same: a fabric
    flip-flop without reset powers up 0, as the register starts. With ``enable`` the copy loads only in the
    cycles ``enable`` is high (the flip-flops' clock enable) and holds otherwise. With ``reset`` the copy
    is cleared by the domain's reset as a register of the domain is (a synchronous reset on the
    flip-flops' LSR): a copy of a control register that must be 0 in the cycle after a one-cycle reset."""
    from .bram import ecp5_target

    value = Value.cast(value)
    q = Signal(len(value), name=name, reset_less=not reset)
    if not ecp5_target(platform):
        with m.If(1 if enable is None else enable):
            m.d.sync += q.eq(value)
        return q
    ce, cemux = (Const(1, 1), "1") if enable is None else (enable, "CE")
    lsr = ResetSignal(allow_reset_less=True) if reset else Const(0, 1)
    for i in range(len(value)):
        m.submodules[f"{name}_ff{i}"] = Instance(
            "TRELLIS_FF", p_GSR="DISABLED", p_CEMUX=cemux, p_CLKMUX="CLK", p_LSRMUX="LSR", p_REGSET="RESET",
            p_SRMODE="LSR_OVER_CE", i_CLK=ClockSignal(), i_LSR=lsr, i_CE=ce, i_DI=value[i],
            o_Q=q[i])
    return q


class CreditSlice(wiring.Component):
    """A stream between blocks the placer puts far apart, at full rate, with no signal crossing between
    them that combines with the far side's logic in the same cycle: the producer's ``i.ready`` is a flip-flop
    of a credit count beside it, and the consumer's ``o.ready`` drives only a queue beside the consumer.

    A two-entry register slice (an output register and a spare, ``i.ready`` the spare being empty) also
    registers ``i.ready``, but that flip-flop follows ``o.ready`` and therefore sits beside the consumer,
    and the producer's pop logic reads it across the die (the integer switch measured 3.9-4.5 + 4.5-4.7 ns
    of routing from the job slice's ``spare_valid`` through the job queue's pop into its level). Here the
    producer spends one of ``depth + 1`` credits per item; the item crosses as the producer's ``valid &
    ready`` and payload into the consumer's side: an output register and a ``depth``-entry queue behind it
    (LUT RAM). Every item that leaves the output returns its credit through a flip-flop. A credit comes
    back three cycles after it was spent when the consumer takes at once, so ``depth >= 2`` keeps one
    item per cycle.

    Items leave in order; an item accepted in cycle ``t`` is offered from ``t + 1`` (:attr:`latency`).
    Only the valid bits, counts and pointers are reset.

    Members
    -------
    i : In(stream.Signature(shape)); o : Out(stream.Signature(shape))
    busy : Out(1)
        An item is held (in the output register or the queue).
    """

    latency = REGISTER_SLICE

    def __init__(self, shape, depth: int = 4):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, not {depth}")
        self.shape, self.depth = shape, depth
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "busy": Out(1)})
        self._mem = Memory(shape=shape, depth=depth, init=[])

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        # The producer's side: the credits, and whether one is left (i.ready), both registers.
        credits = Signal(range(D + 2), init=D + 1)
        has_credit = Signal(init=1)
        returned = Signal()                          # the consumer's side: an item left last cycle
        send = self.i.valid & has_credit
        nxt_credits = credits - send + returned
        m.d.sync += [credits.eq(nxt_credits), has_credit.eq(nxt_credits != 0)]
        m.d.comb += self.i.ready.eq(has_credit)

        # The consumer's side: the output register, and the queue behind it.
        m.submodules.mem = mem = self._mem
        wr, rd = mem.write_port(), mem.read_port(domain="comb")
        abits = ceil_log2(D)
        wp, rp = Signal(abits), Signal(abits)
        held = Signal(range(D + 1))                   # items in the queue (not the output register)
        out_valid = Signal()
        out = Signal(self.shape, reset_less=True)
        free = ~out_valid | self.o.ready              # the output register is free after this cycle
        empty = held == 0
        to_out = free & empty                         # an item arriving now goes straight to the output
        push = send & ~to_out
        pop = free & ~empty
        m.d.comb += [wr.addr.eq(wp), wr.data.eq(self.i.payload), wr.en.eq(push), rd.addr.eq(rp),
                     self.o.valid.eq(out_valid), self.o.payload.eq(out), self.busy.eq(out_valid | ~empty)]
        m.d.sync += [wp.eq(wp + push), rp.eq(rp + pop), held.eq(held + push - pop),
                     returned.eq(self.o.valid & self.o.ready)]
        with m.If(free):
            m.d.sync += [out_valid.eq(~empty | send),
                         out.eq(Mux(empty, Value.cast(self.i.payload), Value.cast(rd.data)))]
        return m
