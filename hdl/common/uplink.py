"""What a frame of a switch with the uplink action carries beside a result's fields (docs/protocol.md
section 13): the result jobs and the result generator's frames share it."""

from amaranth.lib import data

__all__ = ["uplink_frame_layout"]


def uplink_frame_layout() -> data.StructLayout:
    """How a frame of a switch with the uplink action differs from a result: ``partial``: it is a partial
    for the parent switch (to ``dst``, the destination MAC of the frame that triggered it, in wire order,
    with flags 0, or RETRANSMIT with ``retransmit``), not a result."""
    return data.StructLayout({"partial": 1, "retransmit": 1, "dst": 48})
