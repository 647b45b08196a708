"""Enumeration shapes of the RTL: signals of these shapes show member names in waveforms.

The protocol's enumerations (:mod:`cais.protocol`, the one definition) are mirrored as Amaranth
``IntEnum`` shapes of the width their fields have, so a signal holding a drop reason, an element type or
an operator reads ``TAG_MISMATCH`` or ``FP16`` in a VCD. ``IntEnum`` members are integers: they compare
and assign with the protocol's members and with plain numbers alike. :class:`Action` is the core's own.
"""

import types

from amaranth.lib import enum

from cais import protocol as proto

__all__ = ["DropReason", "DType", "ReduceOp", "OpType", "Action", "mirror"]


def mirror(py_enum: type, width: int) -> type:
    """An Amaranth ``IntEnum`` shape of ``width`` bits with the members of the Python enum ``py_enum``."""
    def body(namespace):
        for member in py_enum:
            namespace[member.name] = member.value
    return types.new_class(py_enum.__name__, (enum.IntEnum,), {"shape": width}, body)


DropReason = mirror(proto.DropReason, 4)
DType = mirror(proto.DType, 4)
ReduceOp = mirror(proto.ReduceOp, 4)
OpType = mirror(proto.OpType, 8)


class Action(enum.IntEnum, shape=2):
    """What the core does with a frame it decided."""
    DROP = 0
    FORWARD = 1
    AGGREGATE = 2
