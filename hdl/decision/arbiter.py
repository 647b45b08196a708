"""Stage G's grant: round robin among the ports with a header waiting, one header per cycle."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..latency import ARBITER

__all__ = ["Arbiter", "lowest"]


def lowest(x):
    """One-hot: the lowest set bit of ``x`` (0 if none)."""
    return Cat(*(x[p] & ~x[:p].any() if p else x[0] for p in range(len(x))))


class Arbiter(wiring.Component):
    """Round-robin grant of one port's header per cycle; the header is taken in the next cycle.

    ``take`` is a register: the grant is computed from this cycle's requests and takes the header in the
    next cycle (the header stays offered until taken). A port being taken is not granted again in the
    same cycle, so each port is granted at most every other cycle and the ports together one header per
    cycle. While ``blocked``, only headers that need no slot state (``all_reduce`` low) are granted, in
    the cycle they are first offered as in any other.

    Members
    -------
    request : In(ports)
        The ports whose header is offered; a header stays offered, the same, until taken.
    all_reduce : In(ports)
        Per port: the offered header is a CAIS all-reduce frame (it needs the slot state).
    blocked : In(1)
        Maintenance holds all-reduce headers back in this cycle.
    hold : In(1)
        Grant no header in this cycle.
    take : Out(ports)
        One-hot, a register: the port whose header is taken in this cycle (granted in the cycle before).
    port : Out(range(ports))
        The taken port, binary (a register, meaningful with ``take``).
    stateful : Out(1)
        With ``take``: the taken header may need the slot state, for the maintenance's wait (exact while
        ``blocked``, when only headers that need none are granted; taken as needing it otherwise).

    ``latency`` (:data:`cais.hdl.latency.ARBITER`, 1): a header offered and granted in cycle t is taken in cycle t + 1.
    """

    latency = ARBITER

    def __init__(self, ports: int):
        self.ports = ports
        super().__init__({
            "request": In(ports), "all_reduce": In(ports), "blocked": In(1), "hold": In(1),
            "take": Out(ports), "port": Out(range(ports)), "stateful": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P = self.ports
        all_ports = (1 << P) - 1
        take, t_port, t_sf = Signal(P), Signal(range(P)), Signal()
        req = Signal(P)
        m.d.comb += req.eq(self.request & ~take & (Mux(self.blocked, 0, all_ports) | ~self.all_reduce))
        # Round robin, one-hot: the lowest requester above the last grant, else the lowest requester.
        above_last = Signal(P, init=all_ports & ~1)     # ports above the last grant (registered)
        above = req & above_last
        grant = Signal(P)
        m.d.comb += grant.eq(Mux(above.any(), lowest(above), lowest(req)))
        go = req.any() & ~self.hold
        m.d.sync += [take.eq(Mux(go, grant, 0)), t_sf.eq(~self.blocked | (grant & self.all_reduce).any())]
        with m.If(go):
            m.d.sync += [t_port.eq(Cat(*(Cat(*(grant[p] for p in range(P) if p >> k & 1)).any()
                                         for k in range(max(1, ceil_log2(P)))))),
                         above_last.eq(Cat(*((grant & ((1 << p) - 1)).any() for p in range(P))))]
        m.d.comb += [self.take.eq(take), self.port.eq(t_port), self.stateful.eq(t_sf)]
        return m
