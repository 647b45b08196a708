"""A store-and-forward FIFO whose writer can take back a frame it has not committed."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["FrameFifo"]


class FrameFifo(wiring.Component):
    """Beats become visible to the reader only when the writer commits the frame they belong to.

    The ingress parser writes a frame as it arrives and decides at its last beat whether the frame is
    good (``commit``) or must be dropped (``rollback``), so a bad frame never reaches the switch core.

    Members
    -------
    w_data : In(width)
    w_en : In(1)
        Write ``w_data`` after the beats of the frame being written. Only when ``w_rdy``.
    w_rdy : Out(1)
        There is room for one more beat.
    level : Out(range(depth + 1))
        Beats held, committed or not (``depth - level`` beats can still be written).
    commit : In(1)
        Make every beat written so far (including one written in this cycle) visible to the reader.
    rollback : In(1)
        Forget the beats written since the last commit (and any written in this cycle).
    r_data : Out(width)
    r_valid : Out(1)
    r_ready : In(1)
        First-word-fall-through read side: ``r_data`` is the oldest committed beat while ``r_valid``.
    """

    def __init__(self, width: int, depth: int):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth must be a power of two"
        self.width, self.depth = width, depth
        super().__init__({
            "w_data": In(width), "w_en": In(1), "w_rdy": Out(1), "commit": In(1), "rollback": In(1),
            "r_data": Out(width), "r_valid": Out(1), "r_ready": In(1),
            "level": Out(range(depth + 1)),
        })
        self._mem = Memory(shape=width, depth=depth, init=[])

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = self._mem
        abits = (self.depth - 1).bit_length()
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))

        # Pointers carry one extra bit so that full and empty differ.
        wp_commit = Signal(abits + 1)
        wp = Signal(abits + 1)
        rp = Signal(abits + 1)

        m.d.comb += [self.level.eq((wp - rp)[:abits + 1]), self.w_rdy.eq(self.level != self.depth)]
        write = self.w_en & self.w_rdy
        m.d.comb += [wr.addr.eq(wp[:abits]), wr.data.eq(self.w_data), wr.en.eq(write)]
        wp_next = wp + write
        with m.If(self.rollback):
            m.d.sync += wp.eq(wp_commit)
        with m.Else():
            m.d.sync += wp.eq(wp_next)
            with m.If(self.commit):
                m.d.sync += wp_commit.eq(wp_next)

        m.d.comb += self.r_valid.eq(rp != wp_commit)
        pop = self.r_valid & self.r_ready
        rp_next = rp + pop
        m.d.sync += rp.eq(rp_next)
        # Read ahead at the pointer of the next cycle, so the head beat is ready without a bubble.
        m.d.comb += [rd.addr.eq(rp_next[:abits]), self.r_data.eq(rd.data)]
        return m
