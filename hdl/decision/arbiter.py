"""Stage G's grant: round robin among the ports with a header waiting, one header per cycle."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..common.pipeline import register_copy
from ..latency import ARBITER

__all__ = ["Arbiter", "above"]


def above(onehot):
    """The bits above the set bit of the one-hot ``onehot`` (0 if none is set)."""
    return Cat(*(onehot[:p].any() if p else Const(0, 1) for p in range(len(onehot))))


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
    ready : Out(ports)
        ``take`` again, from flip-flops of its own (:func:`~cais.hdl.common.pipeline.register_copy`): the
        ports' header queues pop on it, so each bit can sit beside its port while ``take`` stays beside the
        grant it feeds back into (one register for both was pulled to the ports: the whole switch measured
        2.6-3.3 ns of routing from it to the lookup and back into the grant, 96.60 MHz).
    lookup_take : Out(ports)
        ``take`` again, from flip-flops of their own beside the lookup, whose pick of the taken port's rule
        and MAC entry it selects (with one register, the lookup's wide selects pulled it away from the grant
        it feeds back into: the whole switch measured 2.6 + 2.2 ns of routing from it through a piece of the
        grant placed at the lookup and back, 106.46 MHz).
    stateful_next : Out(1)
        A header is taken in the next cycle and ``stateful`` then (``blocked`` low, ``hold`` low and a port
        requesting that is not taken now: the grant needs no more), for the maintenance's wait, which
        registers it (the whole switch measured 2.3 + 1.9 ns of routing from a register of the taken
        header's ``stateful`` to ``blocked``, and 2.95-3.03 ns from ``blocked`` through the grant into that
        register).
    port : Out(range(ports))
        The taken port, binary (a register, meaningful with ``take``).
    stateful : Out(1)
        With ``take``: the taken header may need the slot state, for the maintenance's wait (a register:
        ``blocked`` was low when it was granted; while ``blocked`` only headers that need none are granted,
        otherwise any is taken as needing it).

    ``latency`` (:data:`cais.hdl.latency.ARBITER`, 1): a header offered and granted in cycle t is taken in cycle t + 1.
    """

    latency = ARBITER

    def __init__(self, ports: int):
        self.ports = ports
        super().__init__({
            "request": In(ports), "all_reduce": In(ports), "blocked": In(1), "hold": In(1),
            "take": Out(ports), "ready": Out(ports), "port": Out(range(ports)), "stateful": Out(1),
            "lookup_take": Out(ports), "stateful_next": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P = self.ports
        take, t_port, t_sf = Signal(P), Signal(range(P)), Signal()
        # The round robin's state from registers only: the ports above the last take. ``last`` is that
        # mask as of the last cycle with a take; in a cycle with a take the take itself (the grant of the
        # cycle before) gives it. So no grant feeds the state, and the state's mask is ready early.
        last = Signal(P, init=((1 << P) - 1) & ~1)      # after reset: as if port 0 was taken last
        mask = Signal(P)
        m.d.comb += mask.eq(Mux(take.any(), above(take), last))
        m.d.sync += last.eq(mask)
        # ahead[p][q]: port q comes before port p in this cycle's order (the masked ports first, each
        # group lowest first), from registers only; the grant is then one flat term per port.
        def before(q, p):
            if q < p:
                return mask[q] | ~mask[p]
            return mask[q] & ~mask[p] if q > p else Const(0, 1)
        ahead = [Cat(*(before(q, p) for q in range(P))) for p in range(P)]
        req = Signal(P)
        m.d.comb += req.eq(self.request & ~take & ~(Mux(self.blocked, self.all_reduce, 0)))
        grant = Signal(P)
        m.d.comb += grant.eq(Cat(*(req[p] & ~(req & ahead[p]).any() for p in range(P))))
        next_take = Signal(P)
        m.d.comb += next_take.eq(Mux(self.hold, 0, grant))
        # (the copies reset as take does: no header is taken in the cycle after a reset)
        ready = register_copy(m, next_take, "ready_copy", platform, reset=True)
        lookup_take = register_copy(m, next_take, "lookup_take", platform, reset=True)
        # (while blocked no all-reduce header is granted: the grant's own bits are not needed)
        next_sf = ~self.blocked
        m.d.comb += self.stateful_next.eq(next_sf & ~self.hold & (self.request & ~take).any())
        m.d.sync += [take.eq(next_take), t_sf.eq(next_sf),
                     t_port.eq(Cat(*(Cat(*(grant[p] for p in range(P) if p >> k & 1)).any()
                                     for k in range(max(1, ceil_log2(P))))))]
        m.d.comb += [self.take.eq(take), self.ready.eq(ready), self.lookup_take.eq(lookup_take), self.port.eq(t_port),
                     self.stateful.eq(t_sf)]
        return m
