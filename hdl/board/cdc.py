"""Between a MAC's bytes in its PHY's 125 MHz domain and the switch's AXI4-Stream beats in ``sync``.

:class:`RxToAxis` packs received bytes into beats in the PHY's domain and crosses them through an
``AsyncFIFO``; :class:`AxisToTx` crosses the switch's egress beats through an ``AsyncFIFO`` and unpacks them
into bytes in the transmit domain. A beat crosses as (data, byte count - 1, last, bad).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import AsyncFIFO, AsyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..common.axis import AxisSignature
from .mac import ByteStreamSignature

__all__ = ["RxToAxis", "AxisToTx"]


def _beat_layout(beat_bytes: int) -> data.StructLayout:
    return data.StructLayout({"data": 8 * beat_bytes, "count": range(beat_bytes), "last": 1, "bad": 1})


def _keep(count, beat_bytes: int):
    """tkeep of a beat holding count + 1 bytes (contiguous from lane 0)."""
    return Mux(count == beat_bytes - 1, (1 << beat_bytes) - 1,
               (Const(1, beat_bytes + 1) << (count + 1)) - 1)


class RxToAxis(wiring.Component):
    """Received bytes (``rx_domain``, one per cycle, no back-pressure) to AXI4-Stream beats (``sync``).

    A full FIFO cannot stop Ethernet: a beat that finds it full is lost and its frame is cut short with a
    terminating beat (one byte, ``tlast``, ``tuser``), written as soon as there is room, so the switch drops
    the frame as BAD_FCS; the rest of the frame and any frame that starts before the terminator is written
    are dropped whole, and ``ev_overflow`` counts each frame lost or cut.

    Members
    -------
    i : In(ByteStreamSignature(ready=False))
        In ``rx_domain``.
    o : Out(AxisSignature(data_width, user=True))
        In ``sync``.
    ev_overflow : Out(1)
        In ``rx_domain``.
    """

    def __init__(self, data_width: int, depth: int, *, rx_domain: str = "rx"):
        self.beat_bytes = data_width // 8
        self.depth = depth
        self.rx_domain = rx_domain
        super().__init__({"i": In(ByteStreamSignature(ready=False)),
                          "o": Out(AxisSignature(data_width, user=True)), "ev_overflow": Out(1)})

    def elaborate(self, platform):
        m = Module()
        B = self.beat_bytes
        layout = _beat_layout(B)
        rx = m.d[self.rx_domain]
        m.submodules.fifo = fifo = AsyncFIFO(width=layout.size, depth=self.depth, w_domain=self.rx_domain,
                                             r_domain="sync")

        # packing in rx_domain
        buf = Signal(8 * B, reset_less=True)
        count = Signal(range(B))           # bytes already in buf
        beat = Signal(layout)              # a finished beat, written this cycle when `put`
        put = Signal()
        dropping = Signal()                # the current frame lost a beat: drop the rest of it
        term = Signal()                    # a terminating beat is owed
        lanes = [buf.word_select(k, 8) for k in range(B)]
        with m.If(self.i.valid):
            with m.Switch(count):
                for k in range(B):
                    with m.Case(k):
                        rx += lanes[k].eq(self.i.data)
                        m.d.comb += beat.data.eq(Cat(*lanes[:k], self.i.data, Const(0, 8 * (B - k - 1))))
            m.d.comb += [beat.count.eq(count), beat.last.eq(self.i.last), beat.bad.eq(self.i.bad),
                         put.eq(self.i.last | (count == B - 1))]
            rx += count.eq(Mux(self.i.last, 0, count + 1))

        # the finished beat waits a cycle in a register: the byte packing and the FIFO's write control are
        # two steps at 125 MHz, not one
        put_r, beat_r = Signal(), Signal(layout, reset_less=True)
        rx += [put_r.eq(put), beat_r.eq(beat)]

        lose = Signal()                    # this beat is not written
        wrote_any = Signal()               # a beat of the current frame is in the FIFO
        m.d.comb += lose.eq(put_r & (dropping | term | ~fifo.w_rdy))
        with m.If(term & fifo.w_rdy):
            m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(Cat(Const(0, 8 * B), Const(0, range(B)), 1, 1))]
            rx += term.eq(0)
        with m.Elif(put_r & ~lose):
            m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(beat_r)]
            rx += wrote_any.eq(~beat_r.last)
        rx += self.ev_overflow.eq(lose & ~dropping)
        with m.If(lose):
            rx += [dropping.eq(~beat_r.last), wrote_any.eq(0)]
            with m.If(~dropping & wrote_any):
                rx += term.eq(1)

        # unpacking in sync
        out = Signal(layout)
        m.d.comb += [
            out.eq(fifo.r_data),
            self.o.tdata.eq(out.data), self.o.tkeep.eq(_keep(out.count, B)),
            self.o.tlast.eq(out.last), self.o.tuser.eq(out.bad),
            self.o.tvalid.eq(fifo.r_rdy), fifo.r_en.eq(self.o.tready),
        ]
        return m


class AxisToTx(wiring.Component):
    """The switch's egress beats (``sync``) to bytes for the MAC (``tx_domain``), through an
    ``AsyncFIFOBuffered`` of ``depth`` (rounded up to a power of two plus one) beats.

    Members
    -------
    i : In(AxisSignature(data_width))
        In ``w_domain`` (default ``sync``: the switch's clock).
    o : Out(ByteStreamSignature(ready=True))
        In ``tx_domain``; ``bad`` is always 0.
    """

    def __init__(self, data_width: int, depth: int, *, tx_domain: str = "tx", w_domain: str = "sync"):
        self.beat_bytes = data_width // 8
        self.depth = depth
        self.tx_domain, self.w_domain = tx_domain, w_domain
        super().__init__({"i": In(AxisSignature(data_width)), "o": Out(ByteStreamSignature(ready=True))})

    def elaborate(self, platform):
        m = Module()
        B = self.beat_bytes
        layout = _beat_layout(B)
        # buffered: the read data comes from a register, not from a block RAM's unregistered output (5.6 ns
        # on the ECP5) in front of the byte select at 125 MHz
        m.submodules.fifo = fifo = AsyncFIFOBuffered(width=layout.size, depth=self.depth, w_domain=self.w_domain,
                                                     r_domain=self.tx_domain)
        keep_count = Signal(range(B))      # the highest kept lane (tkeep is contiguous from lane 0)
        for k in range(B):
            with m.If(self.i.tkeep[k]):
                m.d.comb += keep_count.eq(k)
        w = Signal(layout)
        m.d.comb += [w.data.eq(self.i.tdata), w.count.eq(keep_count), w.last.eq(self.i.tlast),
                     fifo.w_data.eq(w), fifo.w_en.eq(self.i.tvalid), self.i.tready.eq(fifo.w_rdy)]

        # Two beat registers and a byte register in tx_domain: `cur` is being cut into bytes, `nxt` is
        # fetched ahead whenever it is empty (so the FIFO's read enable is a register's output), and the byte
        # for the MAC leaves from a register (the MAC's CRC network follows it). Each cut at 125 MHz.
        # Only the valid bits and the index reset: the beats and the byte are loaded before they are used
        # (fewer loads on the 125 MHz reset net).
        tx = m.d[self.tx_domain]
        cur, nxt = Signal(layout, reset_less=True), Signal(layout, reset_less=True)
        cur_valid, nxt_valid = Signal(), Signal()
        index = Signal(range(B))
        at_end = index == cur.count
        out_valid = Signal()
        out_data, out_last = Signal(8, reset_less=True), Signal(reset_less=True)
        m.d.comb += [
            self.o.valid.eq(out_valid), self.o.data.eq(out_data), self.o.last.eq(out_last),
            fifo.r_en.eq(~nxt_valid),
        ]
        take = self.o.ready | ~out_valid       # the byte register is free this cycle
        with m.If(take):
            tx += [out_valid.eq(cur_valid), out_data.eq(cur.data.word_select(index, 8)),
                   out_last.eq(cur.last & at_end)]
        step = take & cur_valid                # a byte of `cur` moves to the byte register
        with m.If(step & ~at_end):
            tx += index.eq(index + 1)
        with m.If((step & at_end) | ~cur_valid):
            tx += [cur.eq(nxt), cur_valid.eq(nxt_valid), index.eq(0)]
            tx += nxt_valid.eq(0)
        with m.If(~nxt_valid & fifo.r_rdy):
            tx += [nxt.eq(fifo.r_data), nxt_valid.eq(1)]
        return m
