"""AXI4-Stream, the data interface of every switch port."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AxisSignature"]


class AxisSignature(wiring.Signature):
    """AXI4-Stream as seen from the source (the transmitter).

    Members
    -------
    tdata : Out(data_width)
        Frame bytes, byte 0 of the beat in ``tdata[7:0]``.
    tkeep : Out(data_width // 8)
        Byte enables: all ones on every beat but the last; on the last beat, contiguous ones from bit 0.
    tlast : Out(1)
        Last beat of a frame.
    tuser : Out(1), with ``user=True``
        On the last beat: the frame is bad (a receiving MAC's FCS error); ignored on other beats.
    tvalid : Out(1)
    tready : In(1)
    """

    def __init__(self, data_width: int, *, user: bool = False):
        self.data_width = data_width
        self.user = user
        super().__init__({
            "tdata": Out(data_width),
            "tkeep": Out(data_width // 8),
            "tlast": Out(1),
            **({"tuser": Out(1)} if user else {}),
            "tvalid": Out(1),
            "tready": In(1),
        })
