"""What the decision hands on: a lane's decision, a result job, and the bank rows they address."""

from amaranth.lib import data

from cais import protocol as proto
from cais.params import SwitchParams

from ..common.enums import Action, DType, ReduceOp
from ..common.uplink import uplink_frame_layout
from ..sram.banks import bank_addr_bits

__all__ = ["decision_layout", "job_layout", "bank_addr_bits"]


def decision_layout(params: SwitchParams) -> data.StructLayout:
    """What a lane needs to stream one frame."""
    return data.StructLayout({
        "action": Action,
        "mask": params.ports,                       # FORWARD: the egress ports
        "write": 1,                                 # AGGREGATE: write the payload rows into the port's bank
        "row_base": bank_addr_bits(params),         # ... from this bank row on
        "rows": range(params.rows_per_set + 1),     # ... this many
        "beats": range(params.max_frame_beats + 1),
        "length": range(params.max_frame + 1),      # bytes (the last beat's keep)
    })


def job_layout(params: SwitchParams) -> data.StructLayout:
    """A result to send: fold row ``0 .. rows-1`` of the set at ``row_base`` over the contributors' banks."""
    return data.StructLayout({
        "cais": proto.CAIS_HEADER_BYTES * 8,        # header of the triggering frame, wire order
        "mask": params.ports,                       # egress ports of the result
        "contributors": params.ports,               # banks folded, in ascending port order
        "row_base": bank_addr_bits(params),
        "rows": range(params.rows_per_set + 1),     # ceil(payload_len / B)
        "dtype": DType, "op": ReduceOp, "acc_fp32": 1, "saturate": 1,
        **({"up": uplink_frame_layout()} if params.uplink else {}),
    })

