"""A store-and-forward FIFO whose writer can take back a frame it has not committed."""

from types import SimpleNamespace

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..latency import BANK_READ, FRAME_FIFO
from .bram import OutputRegisteredRAM
from .pipeline import delay_line, register_copy

__all__ = ["FrameFifo", "SKID_DEPTH"]

#: Beats of the flip-flop FIFO (the skid) behind a registered output's RAM. A credit taken by a fetch in
#: cycle t is back for a fetch in t + BANK_READ + 2 at the soonest (the RAM's read and output register, the
#: beat's cycle at the skid's head, then its pop), so this many keep the reader at a beat per cycle.
SKID_DEPTH = BANK_READ + 2


class FrameFifo(wiring.Component):
    """Beats become visible to the reader only when the writer commits the frame they belong to.

    The ingress parser writes a frame as it arrives and decides at its last beat whether the frame is
    good (``commit``) or must be dropped (``rollback``), so a bad frame never reaches the switch core.

    Two read sides, chosen by ``registered_output``:

    - ``False``: ``r_data`` comes straight from the block RAM, read ahead (with a write-to-read bypass) so
      a beat committed in cycle ``t`` is at the head in cycle ``t + 1``; ``r_valid`` is a compare of the
      pointers.
    - ``True``: ``r_data`` and ``r_valid`` come from flip-flops, and no handshake reaches the block RAM: the
      RAM (an :class:`~cais.hdl.common.bram.OutputRegisteredRAM`, on ECP5 DP16KD blocks with their own
      output register) reads at the read pointer in every cycle, its enables tied high; a read that
      fetches a committed beat puts it, two cycles later, into the skid, a FIFO of :data:`SKID_DEPTH`
      flip-flop beats whose head is ``r_data``. A beat is fetched only with a credit (a skid entry kept
      for it) and the reader's pop gives the credit back, so the reader's ``r_ready`` drives the skid's
      head pointer and the credits, nothing wide. A beat committed in cycle ``t`` is at the head in cycle
      ``t + 4`` (:data:`cais.hdl.latency.FRAME_FIFO`: the fetch, the RAM's read and output register, the
      skid), and the reader takes one beat per cycle. The RAM's data is used only at committed
      addresses, so it needs no bypass. ``w_rdy`` is a flip-flop too, so the RAM's write side (address,
      data, enable) is fed by registers and the writer's logic, not by a compare of the read pointer: it
      counts the writes, commits and rollbacks up to the last clock edge exactly and the RAM's reads one
      cycle late (a beat fetched in cycle ``t`` frees its room for ``w_rdy`` from ``t + 2``).

    Members
    -------
    w_data : In(width)
    w_en : In(1)
        Write ``w_data`` after the beats of the frame being written. Only when ``w_rdy``.
    w_rdy : Out(1)
        There is room for one more beat (with ``registered_output``, as of the RAM reads of the cycle
        before; a flip-flop).
    level : Out(range(depth + 1))
        Beats held in the RAM, committed or not (``depth - level`` beats can still be written); with a
        registered output, up to :data:`SKID_DEPTH` more beats are on their way to the reader outside the
        RAM.
    held : Out(1)
        Some beat is held, committed or not, in the RAM or on its way to the reader.
    commit : In(1)
        Make every beat written so far (including one written in this cycle) visible to the reader.
    rollback : In(1)
        Forget the beats written since the last commit (and any written in this cycle).
    r_data : Out(width)
    r_valid : Out(1)
    r_ready : In(1)
        First-word-fall-through read side: ``r_data`` is the oldest committed beat while ``r_valid``.
    r_valid_next : Out(1)
        Only with ``registered_output``: ``r_valid`` of the next cycle (its flip-flop's input), for a reader
        that registers a choice made from it.
    r_last : Out(1)
        Only with ``registered_output``: ``r_data``'s top bit (a frame's last beat, in the egress port's
        beats), from a copy of the skid's flip-flops of that bit and a multiplexer of its own, for a reader
        whose control needs the frame's end apart from the wide data's multiplexers and their fanout.
    """

    @property
    def latency(self) -> int:
        """Cycles from a beat's commit to its first cycle at the head (with ``registered_output``:
        :data:`cais.hdl.latency.FRAME_FIFO`; without, the read-ahead's one)."""
        return FRAME_FIFO if self.registered_output else 1

    def __init__(self, width: int, depth: int, registered_output: bool = False):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth must be a power of two"
        self.width, self.depth, self.registered_output = width, depth, registered_output
        super().__init__({
            "w_data": In(width), "w_en": In(1), "w_rdy": Out(1), "commit": In(1), "rollback": In(1),
            "r_data": Out(width), "r_valid": Out(1), "r_ready": In(1),
            "level": Out(range(depth + 1)), "held": Out(1),
            **({"r_valid_next": Out(1), "r_last": Out(1)} if registered_output else {}),
        })
        # The registered output's RAM has its read data registered inside the block (on ECP5 the DP16KD's
        # own output register, which yosys' inference never sets).
        self._mem = (OutputRegisteredRAM(width, depth) if registered_output
                     else Memory(shape=width, depth=depth, init=[]))

    def elaborate(self, platform):
        m = Module()
        # (the registered output's RAM is "ram": its own Memory inside is "mem", a name Verilog must not nest)
        m.submodules["ram" if self.registered_output else "mem"] = mem = self._mem
        abits = (self.depth - 1).bit_length()
        if self.registered_output:
            wr = SimpleNamespace(addr=mem.wr_addr, data=mem.wr_data, en=mem.wr_en)
        else:
            wr = mem.write_port()

        # Pointers carry one extra bit so that full and empty differ.
        wp_commit = Signal(abits + 1)
        wp = Signal(abits + 1)
        rp = Signal(abits + 1)          # the next beat the RAM is read for

        m.d.comb += self.level.eq((wp - rp)[:abits + 1])

        def full(w):
            # the pointers differ by exactly depth (an equality compare, not the subtraction of level)
            return (w[:abits] == rp[:abits]) & (w[abits] != rp[abits])

        if self.registered_output:
            # Registered: the room after this edge's write, commit or rollback, against this cycle's read
            # pointer (each candidate compared from registers, then chosen).
            w_rdy = Signal(init=1)
            m.d.comb += self.w_rdy.eq(w_rdy)
        else:
            m.d.comb += self.w_rdy.eq(~full(wp))
        write = self.w_en & self.w_rdy
        m.d.comb += [wr.addr.eq(wp[:abits]), wr.data.eq(self.w_data), wr.en.eq(write)]
        wp_next = Mux(write, wp + 1, wp)          # the increment off the path from write
        with m.If(self.rollback):
            m.d.sync += wp.eq(wp_commit)
        with m.Else():
            m.d.sync += wp.eq(wp_next)
            with m.If(self.commit):
                m.d.sync += wp_commit.eq(wp_next)
        if self.registered_output:
            m.d.sync += w_rdy.eq(~Mux(self.rollback, full(wp_commit), Mux(write, full(wp + 1), full(wp))))

        if not self.registered_output:
            rd = mem.read_port(transparent_for=(wr,))
            m.d.comb += self.r_valid.eq(rp != wp_commit)
            pop = self.r_valid & self.r_ready
            rp_next = rp + pop
            m.d.sync += rp.eq(rp_next)
            # Read ahead at the pointer of the next cycle, so the head beat is ready without a bubble.
            m.d.comb += [rd.addr.eq(rp_next[:abits]), self.r_data.eq(rd.data)]
            m.d.comb += self.held.eq(wp != rp)
            return m

        # The read side: the RAM reads at rp in every cycle (its enables are constants, so no handshake
        # reaches the block's pins); a read that fetches a committed beat is in the RAM block's output
        # register mem.read_latency cycles later, then in the skid, a small FIFO of flip-flops
        # whose head is r_data. A fetch takes a credit (a skid entry kept for it) and the reader's pop gives
        # it back, so every fetched beat finds its entry and the reader's ready drives only the skid's head
        # pointer and the credits.
        skid = Array(Signal(self.width, reset_less=True, name=f"skid{i}") for i in range(SKID_DEPTH))
        head = Signal(range(SKID_DEPTH))
        tail = Signal(range(SKID_DEPTH))
        count = Signal(range(SKID_DEPTH + 1))
        credits = Signal(range(SKID_DEPTH + 1), init=SKID_DEPTH)
        out_valid = Signal()
        fetch = (rp != wp_commit) & (credits != 0)
        landed = delay_line(m, fetch, mem.read_latency, "landed", reset_less=False)   # rd_data is a beat
        pop = out_valid & self.r_ready
        # The RAM's address from flip-flops of its own, beside the block, while rp stays beside the fetch
        # and credit logic it feeds (one register for both sat at the block: the switch with float units
        # measured 2.9 + 2.7 ns of routing from a result queue's rd_addr through its fetch into its credits).
        rp_next = Mux(fetch, rp + 1, rp)
        m.d.sync += rp.eq(rp_next)
        m.d.comb += [mem.rd_addr.eq(register_copy(m, rp_next[:abits], "rd_addr_copy", platform)), mem.rd_en.eq(1)]
        with m.If(landed):
            m.d.sync += [skid[tail].eq(mem.rd_data), tail.eq(tail + 1)]
        skid_last = Array(register_copy(m, mem.rd_data[-1], f"skid_last{i}", platform, enable=landed & (tail == i))
                          for i in range(SKID_DEPTH))
        with m.If(pop):
            m.d.sync += head.eq(head + 1)
        count_next = count + landed - pop
        m.d.comb += self.r_valid_next.eq(count_next != 0)
        m.d.sync += [count.eq(count_next), out_valid.eq(self.r_valid_next), credits.eq(credits - fetch + pop)]
        m.d.comb += [
            self.r_data.eq(skid[head]), self.r_valid.eq(out_valid), self.r_last.eq(skid_last[head]),
            # the RAM's beats, the reads on their way (SKID_DEPTH - credits - count of them) and the skid's
            self.held.eq((wp != rp) | (credits + count != SKID_DEPTH) | out_valid),
        ]
        return m
