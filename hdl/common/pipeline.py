"""Small pipeline helpers shared by the RTL blocks."""

from amaranth.hdl import Const, Signal, Value
from amaranth.lib import data

__all__ = ["delay_line"]


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
