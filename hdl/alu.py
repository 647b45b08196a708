"""The reduce ALU: combines a beat of incoming elements with the beat stored in a slot set."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

__all__ = ["ReduceALU", "byteswap"]


def byteswap(value, nbytes: int):
    """Reverse the bytes of ``value``: the wire is big-endian, AXI4-Stream puts byte 0 in the low bits."""
    return Cat(*(value[8 * i:8 * i + 8] for i in reversed(range(nbytes))))


class ReduceALU(wiring.Component):
    """Element-wise reduction of two beats of big-endian int32 elements, combinational.

    int32 SUM wraps modulo 2**32 (two's complement); MAX and MIN compare as signed. Lane ``i`` holds
    payload bytes ``4i .. 4i+3`` of the beat.

    Members
    -------
    a, b : In(data_width)
        Two beats in wire byte order (``a`` the stored values, ``b`` the incoming ones).
    op : In(4)
        A :class:`cais.protocol.ReduceOp`.
    result : Out(data_width)
        ``a op b``, in wire byte order.
    """

    LANE_BITS = 32

    def __init__(self, data_width: int):
        self.data_width = data_width
        super().__init__({"a": In(data_width), "b": In(data_width), "op": In(4), "result": Out(data_width)})

    def elaborate(self, platform):
        m = Module()
        W = self.LANE_BITS
        for lane in range(self.data_width // W):
            a = byteswap(self.a[lane * W:(lane + 1) * W], W // 8).as_signed()
            b = byteswap(self.b[lane * W:(lane + 1) * W], W // 8).as_signed()
            r = Signal(W, name=f"lane{lane}")
            with m.Switch(self.op):
                with m.Case(proto.ReduceOp.MAX):
                    m.d.comb += r.eq(Mux(a > b, a, b))
                with m.Case(proto.ReduceOp.MIN):
                    m.d.comb += r.eq(Mux(a < b, a, b))
                with m.Default():
                    m.d.comb += r.eq(a + b)
            m.d.comb += self.result[lane * W:(lane + 1) * W].eq(byteswap(r, W // 8))
        return m
