"""The integer reduce ALU: combines a beat of incoming elements with the beat stored in a slot set."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais import protocol as proto

__all__ = ["ReduceALU", "byteswap", "INTEGER_TYPES"]

# Integer element types and their widths in bytes, from the protocol's one definition.
INTEGER_TYPES = {dt: proto.ELEMENT_BYTES[dt] for dt in (proto.DType.INT32, proto.DType.INT16, proto.DType.INT8)}


def byteswap(value, nbytes: int):
    """Reverse the bytes of ``value``: the wire is big-endian, AXI4-Stream puts byte 0 in the low bits."""
    return Cat(*(value[8 * i:8 * i + 8] for i in reversed(range(nbytes))))


class ReduceALU(wiring.Component):
    """Element-wise reduction of two beats of big-endian signed integers, combinational.

    The beat holds int32, int16 or int8 elements (``dtype``); element ``i`` is payload bytes
    ``i*n .. i*n+n-1`` for n-byte elements. SUM wraps modulo 2**(8n) (two's complement), or, with
    ``saturate``, clamps to the type's range; MAX and MIN compare as signed.

    Wrap-around is exact whenever the final sum fits the type, whatever the intermediate sums did (the
    arithmetic is modulo 2**(8n), which is associative); saturation bounds the error when the final sum
    does not fit, but can be wrong when only an intermediate sum overflowed. docs/numerics.md shows both
    on the sequence 7 - 5 + 5 + 5 - 3 - 7.

    Members
    -------
    a, b : In(data_width)
        Two beats in wire byte order (``a`` the stored values, ``b`` the incoming ones).
    op : In(4)
        A :class:`cais.protocol.ReduceOp`.
    dtype : In(4)
        A :class:`cais.protocol.DType` of :data:`INTEGER_TYPES` (0, INT32, when left unconnected).
    saturate : In(1)
        SUM saturates instead of wrapping.
    result : Out(data_width)
        ``a op b``, in wire byte order.
    """

    def __init__(self, data_width: int):
        self.data_width = data_width
        super().__init__({"a": In(data_width), "b": In(data_width), "op": In(4), "dtype": In(4),
                          "saturate": In(1), "result": Out(data_width)})

    def elaborate(self, platform):
        m = Module()
        per_type = {}
        for dtype, nbytes in INTEGER_TYPES.items():
            bits = 8 * nbytes
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            out = Signal(self.data_width, name=f"{dtype.name.lower()}_result")
            for lane in range(self.data_width // bits):
                sl = slice(lane * bits, (lane + 1) * bits)
                a = byteswap(self.a[sl], nbytes).as_signed()
                b = byteswap(self.b[sl], nbytes).as_signed()
                total = Signal(range(2 * lo, 2 * hi + 1), name=f"{dtype.name.lower()}_sum{lane}")
                m.d.comb += total.eq(a + b)
                clamped = Mux(total > hi, Const(hi, bits), Mux(total < lo, Const(lo, bits), total[:bits]))
                r = Signal(bits, name=f"{dtype.name.lower()}_lane{lane}")
                with m.Switch(self.op):
                    with m.Case(proto.ReduceOp.MAX):
                        m.d.comb += r.eq(Mux(a > b, a, b))
                    with m.Case(proto.ReduceOp.MIN):
                        m.d.comb += r.eq(Mux(a < b, a, b))
                    with m.Default():
                        m.d.comb += r.eq(Mux(self.saturate, clamped, total[:bits]))
                m.d.comb += out[sl].eq(byteswap(r, nbytes))
            per_type[dtype] = out
        with m.Switch(self.dtype):
            for dtype, out in per_type.items():
                with m.Case(dtype):
                    m.d.comb += self.result.eq(out)
        return m
