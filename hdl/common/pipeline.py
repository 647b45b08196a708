"""Small pipeline helpers shared by the RTL blocks."""

from amaranth.hdl import ClockSignal, Const, Instance, Signal, Value
from amaranth.lib import data

__all__ = ["delay_line", "register_copy"]


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


def register_copy(m, value, name: str, platform):
    """``value`` registered once on ``m.d.sync`` (no reset) in flip-flops of its own, which synthesis keeps
    apart from every other register of the same value, so that each copy can be placed beside the logic it
    feeds (yosys' ``opt_merge`` folds identical registers into one, whatever their names or ``keep``
    attributes). For an ECP5 target (:func:`cais.hdl.common.bram.ecp5_target`) the copy is ``TRELLIS_FF``
    instances, which it does not merge; elsewhere (simulation, Verilator) a plain register, which behaves
    the same: a fabric flip-flop without reset powers up 0, as the register starts."""
    from .bram import ecp5_target

    value = Value.cast(value)
    q = Signal(len(value), name=name, reset_less=True)
    if not ecp5_target(platform):
        m.d.sync += q.eq(value)
        return q
    for i in range(len(value)):
        m.submodules[f"{name}_ff{i}"] = Instance(
            "TRELLIS_FF", p_GSR="DISABLED", p_CEMUX="1", p_CLKMUX="CLK", p_LSRMUX="LSR", p_REGSET="RESET",
            p_SRMODE="LSR_OVER_CE", i_CLK=ClockSignal(), i_LSR=Const(0, 1), i_CE=Const(1, 1), i_DI=value[i],
            o_Q=q[i])
    return q
