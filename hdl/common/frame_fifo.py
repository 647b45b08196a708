"""A store-and-forward FIFO whose writer can take back a frame it has not committed."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..latency import FRAME_FIFO

__all__ = ["FrameFifo"]


class FrameFifo(wiring.Component):
    """Beats become visible to the reader only when the writer commits the frame they belong to.

    The ingress parser writes a frame as it arrives and decides at its last beat whether the frame is
    good (``commit``) or must be dropped (``rollback``), so a bad frame never reaches the switch core.

    Two read sides, chosen by ``registered_output``:

    - ``False``: ``r_data`` comes straight from the block RAM, read ahead (with a write-to-read bypass) so
      a beat committed in cycle ``t`` is at the head in cycle ``t + 1``; ``r_valid`` is a compare of the
      pointers.
    - ``True``: ``r_data`` and ``r_valid`` are flip-flops behind the block RAM's output (a two-beat
      pipeline, RAM output then output register, each stage advancing when the next is free), so no
      logic follows the RAM's slow output and the reader sees registers; a beat committed in cycle ``t``
      is at the head in cycle ``t + 3``, and the reader still takes one beat per cycle. The RAM is read
      only at committed addresses, so it needs no bypass. ``w_rdy`` is a flip-flop too, so the RAM's
      write side (address, data, enable) is fed by registers and the writer's logic, not by a compare of
      the read pointer: it counts the writes, commits and rollbacks up to the last clock edge exactly and
      the RAM's reads one cycle late (a beat read out of the RAM in cycle ``t`` frees its room for
      ``w_rdy`` from ``t + 2``).

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
        registered output, up to two more beats are on their way to the reader outside the RAM.
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
        })
        # With the registered output the RAM is never read at the address being written: yosys need not
        # add its read-during-write logic (a compare and a mux after the RAM's slow output).
        self._mem = Memory(shape=width, depth=depth, init=[],
                           attrs={"no_rw_check": 1} if registered_output else None)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = self._mem
        abits = (self.depth - 1).bit_length()
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

        rd = mem.read_port()            # reads committed beats only, never the one being written
        ram_valid = Signal()            # rd.data holds the beat at rp - 1
        out_data = Signal(self.width, reset_less=True)
        out_valid = Signal()
        out_free = ~out_valid | self.r_ready
        ram_free = ~ram_valid | out_free          # rd.data may be replaced: the RAM's read enable
        fetch = ram_free & (rp != wp_commit)
        m.d.comb += [rd.addr.eq(rp[:abits]), rd.en.eq(ram_free)]
        with m.If(ram_free):
            m.d.sync += ram_valid.eq(fetch)
        with m.If(fetch):
            m.d.sync += rp.eq(rp + 1)
        with m.If(out_free):
            m.d.sync += [out_valid.eq(ram_valid), out_data.eq(rd.data)]
        m.d.comb += [
            self.r_data.eq(out_data), self.r_valid.eq(out_valid),
            self.held.eq((wp != rp) | ram_valid | out_valid),
        ]
        return m
