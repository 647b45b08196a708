"""The egress crossbar: whole frames from several sources (the lanes' forwarded frames, the result
generator) to the egress FIFOs, every port at its own line rate."""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["EgressCrossbar", "FrameSourceSignature"]


class FrameSourceSignature(wiring.Signature):
    """Whole frames offered to the :class:`EgressCrossbar`, from the source's side.

    Members
    -------
    req : Out(1); mask : Out(ports); beats : Out(range(max_beats + 1))
        A frame waits for the egress ports in ``mask``; it is ``beats`` beats long.
    grant : In(1)
        The ports are the source's from the next cycle until the frame's last beat.
    data : Out(data_width); keep : Out(data_width // 8); last : Out(1); valid : Out(1)
        The granted frame's beats; each is taken the cycle it is offered.
    """

    def __init__(self, ports: int, data_width: int, max_beats: int):
        super().__init__({
            "req": Out(1), "mask": Out(ports), "beats": Out(range(max_beats + 1)), "grant": In(1),
            "data": Out(data_width), "keep": Out(data_width // 8), "last": Out(1), "valid": Out(1),
        })


class EgressCrossbar(wiring.Component):
    """Gives each frame all of its egress ports at once, then copies its beats to them.

    A source (:class:`FrameSourceSignature`) asks with ``req``, ``mask`` (its frame's ports) and ``beats``.
    A frame is granted when each of its ports is free (or freed by its owner's last beat in this cycle)
    and has room for the whole frame (``room``, beats the egress FIFO can still take), so once started it
    is written to every port back to back and no port waits on another mid-frame. ``grant`` is
    combinational; the ports are the source's from the next cycle, whose beats (``valid`` ..) go to each
    of them the cycle they are offered, until the beat with ``last``.

    Sources are ranked in rotating order from a pointer, all at once: a request reserves its ports for
    the requests ranked behind it, and the first requester keeps the pointer until it is granted, so a
    multicast frame is not starved by unicast frames taking its ports one at a time.

    Members
    -------
    sources[s] : In(FrameSourceSignature)
    room[p] : In
    w_data[p], w_keep[p], w_last[p], w_en[p] : Out
        Beats for egress FIFO p.
    busy : Out(1)
        Some port is owned by a frame not yet finished.
    """

    def __init__(self, sources: int, ports: int, data_width: int, max_beats: int, depth: int):
        self.n_sources, self.ports = sources, ports
        B = data_width // 8
        super().__init__({
            "sources": In(FrameSourceSignature(ports, data_width, max_beats)).array(sources),
            "room": In(range(depth + 1)).array(ports),
            "w_data": Out(data_width).array(ports), "w_keep": Out(B).array(ports),
            "w_last": Out(1).array(ports), "w_en": Out(1).array(ports),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        S, P = self.n_sources, self.ports
        src = self.sources
        owner = [Signal(range(S), name=f"owner{p}") for p in range(P)]
        owned = Signal(P)
        ptr = Signal(range(S))

        # Per port: the owner's beat this cycle, and whether it is the owner's last.
        releasing = Signal(P)
        w_en = Signal(P)
        for p in range(P):
            def sel(field):
                return Array(getattr(src[s], field) for s in range(S))[owner[p]]
            m.d.comb += [
                self.w_data[p].eq(sel("data")), self.w_keep[p].eq(sel("keep")), self.w_last[p].eq(sel("last")),
                w_en[p].eq(owned[p] & sel("valid")),
                self.w_en[p].eq(w_en[p]),
                releasing[p].eq(w_en[p] & sel("last")),
            ]

        # Room of each port for a frame starting next cycle: this cycle's write still lands.
        fits = Signal(S)
        for s in range(S):
            m.d.comb += fits[s].eq(Cat(*(~src[s].mask[p] | (self.room[p] - w_en[p] >= src[s].beats)
                                          for p in range(P))).all())

        # Allocation, all sources at once: source s is granted when it asks, its frame fits, none of its
        # ports is owned (or being released in this cycle), and no source ahead of it in the rotating order
        # asks for any of them. A request reserves its ports for the sources behind it, granted or not, so
        # a multicast frame is not starved by unicast frames taking its ports one at a time.
        claimed = owned & ~releasing
        rank = [Signal(range(S), name=f"rank{s}") for s in range(S)]      # place in the order from ptr
        for s in range(S):
            m.d.comb += rank[s].eq(Mux(s >= ptr, s - ptr, s + S - ptr))

        def ahead_of(s, overlapping):
            return Cat(Const(0, 1), *(src[t].req & (rank[t] < rank[s])
                                      & ((src[t].mask & src[s].mask).any() if overlapping else 1)
                                      for t in range(S) if t != s)).any()

        for s in range(S):
            m.d.comb += src[s].grant.eq(src[s].req & fits[s] & ((src[s].mask & claimed) == 0)
                                        & ~ahead_of(s, overlapping=True))
        # The pointer moves past the first requester in the order once it is granted, and stays on it
        # while it waits.
        for s in range(S):
            with m.If(src[s].grant & ~ahead_of(s, overlapping=False)):
                m.d.sync += ptr.eq(s + 1 if s + 1 < S else 0)

        new_owned = Signal(P)
        for s in range(S):
            for p in range(P):
                with m.If(src[s].grant & src[s].mask[p]):
                    m.d.sync += owner[p].eq(s)
                    m.d.comb += new_owned[p].eq(1)
        m.d.sync += owned.eq((owned & ~releasing) | new_owned)
        m.d.comb += self.busy.eq(owned.any())
        return m
