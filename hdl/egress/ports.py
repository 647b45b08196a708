"""The egress: whole frames to every port at its own line rate.

* :class:`EgressCrossbar`: the lanes' forwarded frames to the ports' egress FIFOs (a frame gets all of its
  ports at once: a lane streams it once from its ingress FIFO).
* :class:`ResultFanout`: the result generator's frames into the ports' result queues, written into all of
  a result's queues at once when each has room for the whole frame.
* :class:`EgressMerge`: per port, whole frames from the egress FIFO and the result queue, round-robin at
  frame boundaries, into ``m_axis``.
* :class:`EgressPort`: one port's egress FIFO, result queue and merge, their credits back to the crossbar
  and the fanout, and the port's tx counter increments (what :class:`cais.hdl.switch.Switch` puts behind
  each port of the core).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.axis import AxisSignature
from ..common.frame_fifo import FrameFifo
from ..common.pipeline import delay_line, register_copy
from ..latency import CROSSBAR_GRANT, EGRESS_PORT, FRAME_GRANT
from ..parser.ingress import popcount

__all__ = ["EgressCrossbar", "EgressMerge", "EgressPort", "FrameSourceSignature", "ResultFanout", "beat_layout"]


def beat_layout(data_width: int) -> data.StructLayout:
    """One beat for an egress FIFO: its bytes, which of them are valid, and whether it ends its frame (in
    this order, so ``as_value()`` is the FIFO's word)."""
    return data.StructLayout({"data": data_width, "keep": data_width // 8, "last": 1})


class FrameSourceSignature(wiring.Signature):
    """Whole frames offered to the :class:`EgressCrossbar`, from the source's side.

    The request is a register of the source and the grant a register of the crossbar, so no path runs
    from one to the other in a cycle. A source may ask while its previous frame still streams: ``req`` in
    cycle ``c`` promises that the previous frame's last beat is in cycle ``c + 1`` or earlier, so a grant
    decided in ``c`` (shown in ``c + 1``) starts the frame in ``c + 2`` right behind it.

    Members
    -------
    req : Out(1); mask : Out(ports); beats : Out(range(max_beats + 1))
        A frame waits for the egress ports in ``mask``; it is ``beats`` beats long. Held, unchanged, up
        to and including the cycle in which its grant is shown.
    grant : In(1)
        One cycle: the frame's first beat comes in the next cycle, and its other beats in the cycles
        after, one per cycle without a gap.
    data : Out(data_width); keep : Out(data_width // 8); last : Out(1); valid : Out(1)
        The granted frame's beats; each is taken the cycle it is offered.
    """

    def __init__(self, ports: int, data_width: int, max_beats: int):
        super().__init__({
            "req": Out(1), "mask": Out(ports), "beats": Out(range(max_beats + 1)), "grant": In(1),
            "data": Out(data_width), "keep": Out(data_width // 8), "last": Out(1), "valid": Out(1),
        })


def order_after(S: int, first: int) -> list[list[int]]:
    """before[t][s] of the rotating order that starts at source ``first``: t is ranked ahead of s."""
    return [[int((t - first) % S < (s - first) % S) for s in range(S)] for t in range(S)]


class EgressCrossbar(wiring.Component):
    """Gives each frame all of its egress ports at once, then copies its beats to them.

    A source (:class:`FrameSourceSignature`) asks with ``req``, ``mask`` (its frame's ports) and ``beats``.
    The allocation is computed from registers only (the sources' requests, the crossbar's own state) and
    its result is the ``grant`` register: a frame asking in cycle ``c`` is granted (``grant`` in ``c + 1``,
    first beat in ``c + 2``) when every port of its mask

    * is free from cycle ``c + 2`` on: the crossbar counts, per port, the cycles until the frames it has
      granted there have passed (streams have no gaps), so a port's next frame is granted during its
      current one and follows it without a bubble (except behind a one-beat frame, one cycle);
    * has credit for the whole frame: each port's credit starts at the egress FIFO's depth, loses a
      frame's beats when the frame is granted and gets one back for each beat read out of the FIFO
      (``freed``), so a frame granted but not yet written counts against the room, and a started frame
      is written to every port back to back, no port waiting on another mid-frame. The check is
      registered a cycle ahead (from the credit less the frames being shown granted, the freed beats a
      cycle late): exact for a request that was already asking, and for one in its first cycle (whose
      length may have just changed) room for a longest frame, so such a request to a port with less room
      waits a cycle.

    Sources are ranked in rotating order, all at once: a request reserves its ports for the requests
    ranked behind it, and the first requester keeps the head of the order until it is granted, so a
    multicast frame is not starved by unicast frames taking its ports one at a time.

    The beats pass through a register per source at the crossbar's inputs, then through its output
    registers (two cycles): ``egress`` is registers, and no path runs from a lane's beat (its port's
    ingress FIFO, in that port's corner) through the port choice into the output register (the float
    switch measured 3.04 + 1.83 + 3.02 ns of routing on that path, 91.89 MHz); ownership follows the beats
    a cycle late.

    Members
    -------
    sources[s] : In(FrameSourceSignature)
    freed[p] : In(1)
        A beat left egress FIFO p (in this cycle or earlier: a late credit is only conservative).
    egress[p] : Out(stream.Signature(beat_layout(data_width), always_ready=True))
        Beats for egress FIFO p, registered (the credits make sure it has room).
    busy : Out(1)
        A frame is granted and not yet written.

    ``latency`` (:data:`cais.hdl.latency.CROSSBAR_GRANT`, 4): a request in cycle c, granted at once, puts
    the frame's first beat on ``egress`` in c + 4 (the grant register, the source's beat, the input
    register, the output register).
    """

    latency = CROSSBAR_GRANT

    def __init__(self, sources: int, ports: int, data_width: int, max_beats: int, depth: int):
        self.n_sources, self.ports, self.max_beats, self.depth = sources, ports, max_beats, depth
        super().__init__({
            "sources": In(FrameSourceSignature(ports, data_width, max_beats)).array(sources),
            "freed": In(1).array(ports),
            "egress": Out(stream.Signature(beat_layout(data_width), always_ready=True)).array(ports),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        S, P = self.n_sources, self.ports
        src = self.sources

        granted = Signal(S)                   # the grant registers (shown to the sources)
        was_first = Signal(S)                 # ... and whether that source was the head of the order
        m.d.comb += [src[s].grant.eq(granted[s]) for s in range(S)]

        # Per port, from the grants shown in this cycle (each source still shows the granted request):
        # the new owner, its frame's beats.
        new_owner = [Signal(S, name=f"new_owner{p}") for p in range(P)]
        new_beats = [Signal(range(self.max_beats + 1), name=f"new_beats{p}") for p in range(P)]
        new = Signal(P)
        for p in range(P):
            m.d.comb += [
                new_owner[p].eq(Cat(granted[s] & src[s].mask[p] for s in range(S))),
                new[p].eq(new_owner[p].any()),
            ]
            acc = Const(0, len(new_beats[p]))
            for s in range(S):
                acc = acc | (src[s].beats & new_owner[p][s].replicate(len(new_beats[p])))
            m.d.comb += new_beats[p].eq(acc)

        # The sources' beats registered at the inputs (only the valid bits reset), and the grants a cycle
        # late to meet them.
        beat_in = [{field: delay_line(m, getattr(src[s], field), 1, f"in_{field}{s}", reset_less=field != "valid")
                    for field in ("valid", "last", "keep", "data")} for s in range(S)]
        new_d = delay_line(m, new, 1, "new", reset_less=False)
        new_owner_d = [delay_line(m, new_owner[p], 1, f"new_owner{p}") for p in range(P)]

        # Ownership and the beats, from the first beat of a granted frame to its last.
        owner = [Signal(S, name=f"owner{p}") for p in range(P)]          # one-hot
        owned = Signal(P)
        releasing = Signal(P)
        for p in range(P):
            def sel(field, width):
                acc = Const(0, width)
                for s in range(S):
                    acc = acc | (beat_in[s][field] & owner[p][s].replicate(width))
                return acc
            w_en = owned[p] & sel("valid", 1)
            last = sel("last", 1)
            m.d.comb += releasing[p].eq(w_en & last)
            # the beat itself needs no reset: valid says whether there is one
            out = self.egress[p]
            beat = Signal(out.payload.shape(), name=f"beat{p}", reset_less=True)
            m.d.sync += [
                out.valid.eq(w_en),
                beat.data.eq(sel("data", len(out.payload.data))), beat.keep.eq(sel("keep", len(out.payload.keep))),
                beat.last.eq(last),
            ]
            m.d.comb += out.payload.eq(beat)
            with m.If(new_d[p]):
                m.d.sync += owner[p].eq(new_owner_d[p])
        m.d.sync += owned.eq((owned & ~releasing) | new_d)

        # Cycles until each port is free of the frames granted to it (a frame shown granted in g has its
        # beats in g+1 .. g+beats), and whether it is free from two cycles on (a frame granted now starts
        # then). In the cycle a port's grant is shown it is not free, so its credit is up to date first.
        # (left <= 2 is a register of its own, from the next value's cases: the integer switch measured
        # left -> the compare's carry chain -> the ports' check -> the grant, 9.94 ns)
        left = [Signal(range(self.max_beats + 1), name=f"left{p}") for p in range(P)]
        left_le2 = [Signal(init=1, name=f"left_le2_{p}") for p in range(P)]
        free = Signal(P)
        for p in range(P):
            with m.If(new[p]):
                m.d.sync += left[p].eq(new_beats[p])
            with m.Elif(left[p] != 0):
                m.d.sync += left[p].eq(left[p] - 1)
            short = Cat(new_owner[p][s] & (src[s].beats <= 2) for s in range(S)).any()   # new_beats <= 2
            m.d.sync += left_le2[p].eq(Mux(new[p], short, left[p] <= 3))
            m.d.comb += free[p].eq(left_le2[p] & ~new[p])

        # Credit: beats each egress FIFO can still take, less the frames granted and not yet written.
        credit = [Signal(range(self.depth + 1), init=self.depth, name=f"credit{p}") for p in range(P)]
        for p in range(P):
            m.d.sync += credit[p].eq(credit[p] - new_beats[p] + self.freed[p])

        # Allocation, all sources at once, from registers: source s is granted when it asks (and is not
        # being shown its grant), its ports are free and have credit for its frame, and no source ahead of
        # it in the rotating order asks for any of them. A request reserves its ports for the sources
        # behind it, granted or not, so a multicast frame is not starved.
        asking = Signal(S)
        m.d.comb += asking.eq(Cat(src[s].req for s in range(S)) & ~granted)

        # The credit check, registered: in cycle c, for cycle c + 1, whether each port's credit then covers
        # each source's frame (ge) and a longest frame (room), so no compare of a lane's length runs into
        # the grant (the integer switch measured a lane's beats -> 1.4 ns -> the compare's carry chain -> the
        # rotating order -> the grant, 10.65 ns). The credit of c + 1 is this cycle's less the beats of the
        # frames shown granted now, plus those freed: a port shown granted now is free in c + 1 only behind a
        # frame of at most 2 beats, so 2 is taken off for it, and freed beats count a cycle later (a late
        # credit is only conservative). ge is exact for a source that asks in c and still asks in c + 1
        # (its frame, mask and beats stay until its grant is shown); a source that starts asking in c + 1
        # may show another frame's beats in c, so its first cycle's check is room.
        was_asking = Signal(S)
        m.d.sync += was_asking.eq(asking)
        room = [Signal(name=f"room{p}") for p in range(P)]
        ge = [[Signal(name=f"credit_ge_{s}_{p}") for p in range(P)] for s in range(S)]

        def at_least(value, n):                   # value >= n, a constant 0 past value's range (lint)
            return value >= n if n <= self.depth else Const(0, 1)
        for p in range(P):
            m.d.sync += room[p].eq(Mux(new[p], at_least(credit[p], self.max_beats + 2),
                                       at_least(credit[p], self.max_beats)))
            for s in range(S):
                # (both compares made, the grant shown picks: new in front of an adder and a compare measured
                # a lane's mask -> new -> the chains -> ge, 8.81-8.99 ns)
                m.d.sync += ge[s][p].eq(Mux(new[p], credit[p] >= src[s].beats + 2, credit[p] >= src[s].beats))
        before = [[Signal(name=f"before_{t}_{s}", init=order_after(S, 0)[t][s]) for s in range(S)]
                  for t in range(S)]
        win = Signal(S)
        first = Signal(S)
        for s in range(S):
            fits = Cat(*(~src[s].mask[p] | Mux(was_asking[s], ge[s][p], room[p]) for p in range(P))).all()
            ports_free = (src[s].mask & ~free) == 0
            ahead = Cat(Const(0, 1), *(asking[t] & before[t][s] & (src[t].mask & src[s].mask).any()
                                       for t in range(S) if t != s)).any()
            m.d.comb += [
                win[s].eq(asking[s] & fits & ports_free & ~ahead),
                first[s].eq(asking[s] & ~Cat(Const(0, 1), *(asking[t] & before[t][s]
                                                              for t in range(S) if t != s)).any()),
            ]
        m.d.sync += [granted.eq(win), was_first.eq(first)]
        # The head of the order moves past the first requester once it is granted (while its grant is
        # shown, it does not ask, so the order among the others is the same either way).
        for s in range(S):
            with m.If(granted[s] & was_first[s]):
                after = order_after(S, (s + 1) % S)
                m.d.sync += [before[t][u].eq(after[t][u]) for t in range(S) for u in range(S)]

        m.d.comb += self.busy.eq(owned.any() | granted.any() | new_d.any() | Cat(b["valid"] for b in beat_in).any()
                                 | Cat(e.valid for e in self.egress).any())
        return m


class ResultFanout(wiring.Component):
    """Writes each result frame into the result queue of every port of its mask, all at once.

    The result generator (:class:`FrameSourceSignature`, the same handshake as :class:`EgressCrossbar`'s
    sources) asks with ``req``, ``mask`` and ``beats``; a frame asking in cycle ``c`` is granted (``grant``
    in ``c + 1``, a register, first beat in ``c + 2``) when every queue of its mask has credit for the whole
    frame. A queue's credit starts at its depth, loses a frame's beats when the frame is granted and gets
    one back for each beat read out of the queue (``freed``), so a granted frame is written to every queue
    back to back, none waiting on another. Nothing else writes the queues and the generator sends one
    frame at a time, so no port needs to be free: a port that is sending a forwarded frame takes the
    result later, from its queue (:class:`EgressMerge`), while the other ports send it at once.

    The beats pass through one register (the data shared by all queues, a valid bit per queue): ``queues``
    is registers; the source is one block, so the fanout needs no input register (a result's first beat
    reaches its queues a cycle sooner than a forwarded one reaches the egress FIFOs).

    ``depth`` must hold the longest frame the source sends (a longer one would never be granted).

    Members
    -------
    source : In(FrameSourceSignature)
    freed[p] : In(1)
        A beat left result queue p (in this cycle or earlier: a late credit is only conservative).
    queues[p] : Out(stream.Signature(beat_layout(data_width), always_ready=True))
        Beats for result queue p, registered (the credits make sure it has room).
    busy : Out(1)
        A frame is granted and not yet written.

    ``latency`` (:data:`cais.hdl.latency.FRAME_GRANT`, 3): a request in cycle c, granted at once, puts
    the frame's first beat on ``queues`` in c + 3 (the grant register, the source's beat, the output
    register).
    """

    latency = FRAME_GRANT

    def __init__(self, ports: int, data_width: int, max_beats: int, depth: int):
        self.ports, self.max_beats, self.depth = ports, max_beats, depth
        super().__init__({
            "source": In(FrameSourceSignature(ports, data_width, max_beats)),
            "freed": In(1).array(ports),
            "queues": Out(stream.Signature(beat_layout(data_width), always_ready=True)).array(ports),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, src = self.ports, self.source

        granted = Signal()                     # the grant register (shown to the source)
        m.d.comb += src.grant.eq(granted)
        credit = [Signal(range(self.depth + 1), init=self.depth, name=f"credit{p}") for p in range(P)]
        for p in range(P):
            taken = Mux(granted & src.mask[p], src.beats, 0)     # the source still shows the granted request
            m.d.sync += credit[p].eq(credit[p] - taken + self.freed[p])
        fits = Cat(*(~src.mask[p] | (credit[p] >= src.beats) for p in range(P))).all()
        m.d.sync += granted.eq(src.req & ~granted & fits)

        # The ports of the frame being written: its grant is shown in the cycle before its first beat (and
        # in the previous frame's last beat at the latest), so the mask register changes between frames.
        dest = Signal(P)
        with m.If(granted):
            m.d.sync += dest.eq(src.mask)
        beat = Signal(beat_layout(len(src.data)), reset_less=True)
        valid = Signal(P)
        m.d.sync += [
            beat.data.eq(src.data), beat.keep.eq(src.keep), beat.last.eq(src.last),
            valid.eq(Mux(src.valid, dest, 0)),
        ]
        for p in range(P):
            m.d.comb += [self.queues[p].payload.eq(beat), self.queues[p].valid.eq(valid[p])]
        m.d.comb += self.busy.eq(granted | valid.any())
        return m


class EgressMerge(wiring.Component):
    """One egress port: whole frames from its forwarded-frame FIFO and its result queue, round-robin at
    frame boundaries, never a gap inside a frame.

    Both inputs are first-word-fall-through FIFOs that receive every frame back to back, one beat per
    cycle (the crossbar's and the fanout's contract), and show their head beat in registers
    (:class:`~cais.hdl.common.frame_fifo.FrameFifo` with ``registered_output``): once a frame's first beat is at
    the head, each of its later beats is at the head by the cycle after the one before it was read, so a
    frame that is started is sent to its end at the sink's pace.

    The choice is a register (``owner``: the input whose frame is being sent, or none). With none, the
    port shows the head of the input whose turn it is (the result queue if it waits and the last frame
    sent was forwarded or the FIFO is empty, else the FIFO), in the same cycle, so the merge adds no cycle
    of latency; a beat shown and not taken makes that input the owner, so the offer never changes under a
    stalled sink (AXI4-Stream). At a frame's last beat taken the owner becomes none, so in the next cycle
    the other input's head, if it waits (a whole frame: that input is not being read), is shown, else the
    same input's next frame: frames of both inputs follow each other without a bubble, alternating while
    both wait. ``o`` is the inputs' registers through a 2-to-1 choice whose select is itself a register,
    chosen a cycle ahead from the owner's, the turn's and the inputs' next values (``fwd_valid_next``,
    ``res_valid_next``: each input's ``valid`` of the next cycle), in two copies: one for the wide data
    choice, one for the handshakes (one select computed from the inputs' valid in the cycle, fanned out to
    the data, sat away from both FIFOs: the whole switch measured 1.9 + 2.1 ns of routing from a result
    queue's valid through it into the egress FIFO's pop, 111.52 MHz). A frame's end enters that choice from
    the inputs' own copies of their heads' last bit (``fwd_last``, ``res_last``), not from ``o``'s: the
    whole switch measured 5.6-7.0 ns of routing from a queue's head through the data's multiplexers and
    ``o``'s last into the select. ``o.ready`` drives the inputs' ``ready`` through one AND.

    Members
    -------
    fwd : In(stream.Signature(beat_layout(data_width)))
        The port's forwarded frames (its egress FIFO).
    res : In(stream.Signature(beat_layout(data_width)))
        The port's result frames (its result queue).
    fwd_valid_next, res_valid_next : In(1)
        ``fwd.valid`` and ``res.valid`` of the next cycle (the FIFOs' ``r_valid_next``).
    fwd_last, res_last : In(1)
        ``fwd.payload.last`` and ``res.payload.last`` (the FIFOs' ``r_last``: the same bits, from copies).
    o : Out(stream.Signature(beat_layout(data_width)))
        The port's frames.
    busy : Out(1)
        A frame is being sent.
    """

    def __init__(self, data_width: int):
        layout = beat_layout(data_width)
        super().__init__({
            "fwd": In(stream.Signature(layout)), "res": In(stream.Signature(layout)),
            "fwd_valid_next": In(1), "res_valid_next": In(1), "fwd_last": In(1), "res_last": In(1),
            "o": Out(stream.Signature(layout)), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        f, r, o = self.fwd, self.res, self.o
        owner = Signal(2)                      # one-hot: 1 the FIFO, 2 the result queue; 0 none
        last_res = Signal()                    # the last frame sent was a result
        # sel_res: the result queue is shown; in every cycle it is the owner's input, or with none the
        # input whose turn it is (the result queue if it waits and the last frame sent was forwarded or
        # the FIFO is empty), registered from the next cycle's owner, last_res and valid bits.
        sel_res = Signal()
        ending = o.ready & Mux(sel_res, r.valid & self.res_last, f.valid & self.fwd_last)
        owner_next = Mux(ending, 0, Mux(o.valid, Cat(~sel_res, sel_res), owner))
        last_res_next = Mux(ending, sel_res, last_res)
        turn_next = self.res_valid_next & (~self.fwd_valid_next | ~last_res_next)
        sel_next = Signal()
        m.d.comb += sel_next.eq(Mux(owner_next.any(), owner_next[1], turn_next))
        m.d.sync += [owner.eq(owner_next), last_res.eq(last_res_next), sel_res.eq(sel_next)]
        sel_data = register_copy(m, sel_next, "sel_data", platform)
        m.d.comb += [
            o.payload.eq(Mux(sel_data, r.payload, f.payload)),
            o.valid.eq(Mux(sel_res, r.valid, f.valid)),
            f.ready.eq(o.ready & ~sel_res), r.ready.eq(o.ready & sel_res),
        ]
        m.d.comb += self.busy.eq(owner.any())
        return m


class EgressPort(wiring.Component):
    """One egress port behind the core: a FIFO of forwarded frames fed by the crossbar, a result queue fed
    by the result fanout, and an :class:`EgressMerge` of the two into ``m_axis`` (whole frames, round-robin
    at frame boundaries).

    Every beat is committed as it is written (the FIFO's frame commit is not needed here). The crossbar
    and the fanout count their FIFOs' room themselves (credits); a beat read out gives its credit back a
    cycle later, from a register (``fwd_freed``, ``res_freed``). Both FIFOs' outputs are registered (2
    cycles more than the RAM's read-ahead): the whole switch measured 5.2 ns of routing from the RAM's slow
    output into the tx counters' register without it; the merge adds one 2-to-1 choice after those
    registers, with a registered owner. Both inputs are registered before their FIFOs, beside them (the
    crossbar and the fanout are elsewhere on the die).

    Members
    -------
    fwd : In(stream.Signature(beat_layout(data_width), always_ready=True))
        Forwarded beats from the crossbar (its ``egress[p]``), written into the egress FIFO.
    res : In(stream.Signature(beat_layout(data_width), always_ready=True))
        Result beats from the fanout (its ``queues[p]``), written into the result queue.
    fwd_freed, res_freed : Out(1)
        A beat left the egress FIFO / the result queue in the previous cycle (registers).
    m_axis : Out(AxisSignature(data_width))
        The port's frames.
    tx_frame : Out(1); tx_bytes : Out(range(data_width // 8 + 1))
        The tx counters' increments: a frame's last beat was sent two cycles before; the bytes (tkeep
        bits) of the beat sent two cycles before. Registers: ``tkeep`` of a sent beat is registered first
        (``tready`` comes from outside, late in the cycle), then counted into the second.
    busy : Out(1)
        A beat is held in an input register, the egress FIFO or the result queue.

    ``latency`` (:data:`cais.hdl.latency.EGRESS_PORT`, 5): a beat on ``fwd`` or ``res`` in cycle t is on
    ``m_axis`` from t + 5 when the port is free (the input register, then the FIFO's
    :attr:`FrameFifo.latency`; the merge adds none).
    """

    latency = EGRESS_PORT

    def __init__(self, data_width: int, fifo_depth: int, queue_depth: int):
        self.data_width, self.fifo_depth, self.queue_depth = data_width, fifo_depth, queue_depth
        layout = beat_layout(data_width)
        super().__init__({
            "fwd": In(stream.Signature(layout, always_ready=True)),
            "res": In(stream.Signature(layout, always_ready=True)),
            "fwd_freed": Out(1), "res_freed": Out(1),
            "m_axis": Out(AxisSignature(data_width)),
            "tx_frame": Out(1), "tx_bytes": Out(range(data_width // 8 + 1)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        W, B = self.data_width, self.data_width // 8
        width = W + B + 1
        m.submodules.egress = fifo = FrameFifo(width, self.fifo_depth, registered_output=True)
        m.submodules.results = rq = FrameFifo(width, self.queue_depth, registered_output=True)
        m.submodules.merge = merge = EgressMerge(W)
        # Each input is registered first, beside its queue: the crossbar and the fanout sit elsewhere on
        # the die, and a beat's valid drives the queue's pointers and level (the whole switch measured
        # 3.8 ns of routing from the fanout's valid into a result queue's w_rdy, then 2.5 ns more).
        held_in = []
        for q, src, name in ((fifo, self.fwd, "fwd"), (rq, self.res, "res")):
            valid = delay_line(m, src.valid, 1, f"{name}_in_valid", reset_less=False)
            payload = delay_line(m, src.payload, 1, f"{name}_in_payload")
            m.d.comb += [q.w_data.eq(payload), q.w_en.eq(valid), q.commit.eq(valid)]
            held_in.append(valid)
        m.d.comb += [
            merge.fwd.payload.eq(fifo.r_data), merge.fwd.valid.eq(fifo.r_valid), fifo.r_ready.eq(merge.fwd.ready),
            merge.res.payload.eq(rq.r_data), merge.res.valid.eq(rq.r_valid), rq.r_ready.eq(merge.res.ready),
            merge.fwd_valid_next.eq(fifo.r_valid_next), merge.res_valid_next.eq(rq.r_valid_next),
            merge.fwd_last.eq(fifo.r_last), merge.res_last.eq(rq.r_last),
        ]
        m.d.comb += self.busy.eq(fifo.held | rq.held | Cat(*held_in).any())
        out = self.m_axis
        m.d.comb += [
            Cat(out.tdata, out.tkeep, out.tlast).eq(merge.o.payload),
            out.tvalid.eq(merge.o.valid), merge.o.ready.eq(out.tready),
        ]
        m.d.sync += [self.fwd_freed.eq(fifo.r_valid & fifo.r_ready), self.res_freed.eq(rq.r_valid & rq.r_ready)]
        # tx increments: the sent tkeep registered, then counted and registered again (as the ingress does),
        # so only a flip-flop feeds the register bank's counter across the die (the count straight into the
        # bank measured 6.07 ns of routing after it, 101.64 MHz; summed before the first register, it pulled
        # the port's output multiplexer towards the bank, 92.81 MHz)
        sent = out.tvalid & out.tready
        tx_keep, tx_last = Signal(B), Signal()
        m.d.sync += [tx_keep.eq(Mux(sent, out.tkeep, 0)), tx_last.eq(sent & out.tlast),
                     self.tx_bytes.eq(popcount(tx_keep)), self.tx_frame.eq(tx_last)]
        return m
