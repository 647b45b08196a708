"""From a completed set to its result rows: the job queue, which holds each job until the contributions
it folds are written, and the fold reader, which reads one row of every contributor's bank per cycle and
folds it in ascending port order (docs/core-design.md, candidate B)."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from cais import protocol as proto
from cais.params import SwitchParams

from ..common.frame_fifo import FrameFifo
from ..common.pipeline import delay_line, register_copy
from ..decision import DECISION_HEADERS, bank_addr_bits, job_layout
from ..egress.results import result_frame_layout, result_frame_shape
from ..latency import BANK_READ, BANK_READ_REGISTERS, FOLD_READER_START, FRAME_FIFO, JOB_QUEUE
from ..parser.header import cais_field
from .fold import FoldChain, ResultRow
from .lane import LANE_DECISIONS, OPEN_BITS

__all__ = ["JobQueue", "FoldReader", "job_depth", "ROW_QUEUE_LATENCY", "BANK_READ_REGISTERS"]

#: Cycles from a folded row's write into the row queue to its first cycle on ``FoldReader.rows`` (a
#: :class:`~cais.hdl.common.frame_fifo.FrameFifo` with a registered output: the block RAM's output goes straight
#: into a register, no logic between).
ROW_QUEUE_LATENCY = FRAME_FIFO

# BANK_READ_REGISTERS (exported from here too): register ranks between a bank's block RAM output and the
# fold chain, cais.hdl.latency's.


def job_depth(params: SwitchParams) -> int:
    """Result jobs the queue holds. A job waits for the frames decided before it (up to LANE_DECISIONS + 1
    per lane), then for the fold chain; in the shortest frames (60 bytes) that many jobs are in flight at
    once when every port sends at line rate, and the decision pipeline holds back when the queue is full
    (its own depth of headers may each add one)."""
    shortest = -(-proto.MIN_FRAME_BYTES // params.beat_bytes)
    chain = params.fold_latency
    in_flight = ((LANE_DECISIONS + 1) * shortest + chain + 8) // shortest + DECISION_HEADERS
    return 1 << ceil_log2(in_flight)


class JobQueue(wiring.Component):
    """Result jobs in decision order, each released once every frame decided before it has finished.

    A job folds rows that frames of several ports wrote, and those frames may still be streaming into
    their banks when the job is decided (a long frame decided first, a short one completing the set).
    Each job therefore records, per port, how many frames of that port were decided and unfinished when
    it was queued (``open_after``), and counts them down as the lanes finish frames (``finished``); the
    head leaves when its counts are all zero.

    Every input (``i``, ``open_after``, ``finished``) is registered first, beside the queue: the lanes'
    ``finished`` come from every port's corner of the die, and the countdown behind them fans out to every
    position (the whole switch measured 11 ns of routing from a lane's ``finished`` through the countdown
    into ``o.valid``). The queue then works on the registered inputs, one cycle behind, exactly as it would
    on the inputs themselves. The jobs sit in a LUT RAM (written at the registered push, ``o.payload`` read
    from it at the registered read pointer: one LUT-RAM read from a register). The counts sit in a shift
    register ordered by age, position 0 being the head's, so that ``o.valid`` is a register computed from
    the next counts of position 0 alone: no pointer-selected read on the path into the fold reader.
    ``level`` is a register and counts the job in the input register too, and a popped job until the cycle
    after its pop (the decision's hold reads it, beside the decision: only a registered pop crosses to it).
    A job pushed with all counts zero in cycle ``t``, or one whose last frame finishes in cycle ``t``, is
    ready in cycle ``t + 2`` (:attr:`latency`). Inputs to outputs: none combinational (``o.ready`` only
    enters registers).

    Members
    -------
    i : In(stream.Signature(job_layout, always_ready=True)); open_after : In(OPEN_BITS).array(ports)
        Jobs in decision order (the queue never refuses one: the decision holds back by ``level``), and
        with each, per port, the frames it waits for.
    finished[p] : In(range(3))
        Per port: frames finished this cycle (their bank writes are done).
    level : Out(range(depth + 1))
        Jobs queued (registered; a popped job counts one cycle longer).
    o : Out(stream.Signature(job_layout))
        The oldest job; ``o.valid`` (registered): it is queued and its frames are finished.

    ``latency`` (:data:`cais.hdl.latency.JOB_QUEUE`, 2): the head job whose last frame shows ``finished``
    in cycle t is offered in t + 2 (the input register, then ``o.valid``).
    """

    latency = JOB_QUEUE

    def __init__(self, params: SwitchParams):
        self.params = params
        P = params.ports
        self.layout = job_layout(params)
        self.depth = job_depth(params)
        super().__init__({
            "i": In(stream.Signature(self.layout, always_ready=True)),
            "open_after": In(OPEN_BITS).array(P), "finished": In(range(3)).array(P),
            "level": Out(range(self.depth + 1)),
            "o": Out(stream.Signature(self.layout)),
        })
        self._mem = Memory(shape=self.layout, depth=self.depth, init=[])

    def elaborate(self, platform):
        m = Module()
        P, D = self.params.ports, self.depth
        m.submodules.mem = mem = self._mem
        wr, rd = mem.write_port(), mem.read_port(domain="comb")
        abits = ceil_log2(D)
        assert D >= 2 and D == 1 << abits
        wp, rp = Signal(abits), Signal(abits)          # D is a power of two: the pointers wrap by themselves
        level = Signal(range(D + 1))
        # The inputs' register (see the docstring); the job's payload needs no reset.
        # (push in flip-flops of its own: as a register yosys merged it with the register bank's copy of the
        # same valid bit for BUSY, far away: 4.76 ns of routing into the counts, 109.54 MHz)
        push = register_copy(m, self.i.valid, "push", platform, reset=True)
        job = delay_line(m, self.i.payload, 1, "job")
        open_after = [delay_line(m, self.open_after[p], 1, f"open_after{p}", reset_less=False) for p in range(P)]
        finished = [delay_line(m, self.finished[p], 1, f"finished{p}", reset_less=False) for p in range(P)]
        pop = self.o.ready & self.o.valid
        m.d.comb += [wr.addr.eq(wp), wr.data.eq(job), wr.en.eq(push), rd.addr.eq(rp),
                     self.o.payload.eq(rd.data), self.level.eq(level)]
        # level counts a job until the cycle after its pop: the pop, registered, is all that crosses from
        # the queue's head to the decision that reads level (the count only errs on the full side).
        pop_d = delay_line(m, pop, 1, "pop", reset_less=False)
        m.d.sync += [wp.eq(wp + push), rp.eq(rp + pop), level.eq(level + self.i.valid - pop_d)]

        # Position k holds the counts of the k-th oldest job; occ is the thermometer code of the level.
        # A free position's counts are never read (a job landing there writes them): no reset.
        counts = [[Signal(OPEN_BITS, name=f"open{k}_{p}", reset_less=True) for p in range(P)] for k in range(D)]
        occ = Signal(D)
        with m.If(push & ~pop):
            m.d.sync += occ.eq(Cat(1, occ[:-1]))
        with m.Elif(pop & ~push):
            m.d.sync += occ.eq(occ[1:])

        def countdown(c, p):
            return Mux(c > finished[p], c - finished[p], 0)

        zero_open = Cat(*(open_after[p] == 0 for p in range(P))).all()
        head_if = {}                                   # position 0's next state being ready, per case
        for k in range(D):
            # Where a pushed job lands: the first free position, or the last occupied one after a pop.
            land_keep = ~occ[k] & (occ[k - 1] if k else 1)
            land_pop = occ[k] & (~occ[k + 1] if k + 1 < D else 1)
            for p in range(P):
                c = counts[k][p]
                above = countdown(counts[k + 1][p], p) if k + 1 < D else Const(0, OPEN_BITS)   # none above the top
                with m.If(pop):
                    m.d.sync += c.eq(Mux(push & land_pop, open_after[p], above))
                with m.Else():
                    m.d.sync += c.eq(Mux(push & land_keep, open_after[p], countdown(c, p)))
            if k == 0:
                # ready next cycle: position 0 occupied and all its next counts zero
                for case, src, land, held in (("keep", counts[0], land_keep, occ[0]),
                                              ("pop", counts[1], land_pop, occ[1])):
                    done = Cat(*(src[p] <= finished[p] for p in range(P))).all()
                    head_if[case] = Mux(push & land, zero_open, held & done)
        ready = Signal()
        m.d.sync += ready.eq(Mux(pop, head_if["pop"], head_if["keep"]))
        m.d.comb += self.o.valid.eq(ready)
        return m


class FoldReader(wiring.Component):
    """Reads each job's rows from every bank at once and folds them into result rows.

    Row ``j`` of a job is read from address ``row_base + j`` of all banks in one cycle; the banks' read
    data is registered, the rows of the contributors go through a :class:`~cais.hdl.alu.fold.FoldChain` in
    ascending port order, fp32 accumulators are rounded to the wire format
    (:class:`~cais.hdl.alu.fold.ResultRow`), and the row is queued for the result generator. A read is
    issued only when the queue is sure to have room for it, so the reader runs at one row per cycle while
    the generator keeps up, across jobs without a bubble.

    Timing: a row read (``rd_en``) in cycle ``t`` is written into the row queue in cycle ``t + 3 + F``
    (the bank's read and its output register, :data:`~cais.hdl.latency.BANK_READ` = 2, the
    :data:`BANK_READ_REGISTERS` = 1 register here, then ``F`` =
    ``SwitchParams.fold_latency``: the chain and the rounding) and is offered on ``rows`` from cycle
    ``t + 3 + F +`` :data:`ROW_QUEUE_LATENCY`; it counts
    in ``rows_held`` one cycle before. ``rd_addr``, ``rows_held`` and the room check are registers;
    ``rd_en`` and ``jobs.ready`` are two LUT levels from registers (the head's ``jobs.valid``, the frame
    queue's room); ``rows`` and ``frames`` come from registers (the row queue's block RAM output goes
    straight into its output register). Combinational input-to-output paths: ``jobs.valid`` ->
    ``jobs.ready`` (one level), ``rows.ready`` -> the queues' read enables (internal).

    Members
    -------
    jobs : In(stream.Signature(job_layout))
        The head of the :class:`JobQueue`.
    frames : Out(stream.Signature(result_frame_layout))
        The job's frame, for the result generator, queued as its first row is read.
    rd_addr : Out(bank_addr_bits); rd_en : Out(1); rd_data[p] : In(data_width)
        The banks' read ports (synchronous: data the cycle after an enabled address).
    rows : Out(stream.Signature(data_width)); rows_held : Out(16)
        Result rows in job order; how many are queued.
    busy : Out(1)

    ``start_latency`` (:data:`cais.hdl.latency.FOLD_READER_START`, 1): a job offered in cycle t to an idle
    reader has its first row read (``rd_en``) in t + 1.
    """

    start_latency = FOLD_READER_START

    def __init__(self, params: SwitchParams):
        self.params = params
        W, P = params.data_width, params.ports
        self.chain = FoldChain(P, W, float_units=params.float_units)
        self.narrow = ResultRow(W, params.float_units)
        assert self.chain.latency + self.narrow.latency == params.fold_latency, \
            "SwitchParams.fold_latency is the chain's and the rounding's"
        # Two jobs' rows (the generator sends a frame once all its rows are in, while the next job's are
        # read) and the rows in flight (bank read, its register, chain and rounding).
        self.row_depth = 1 << ceil_log2(2 * params.rows_per_set + params.fold_latency + 5)
        # Frames the reader may run ahead of the generator: enough for the fold's latency in the shortest
        # frames (60 bytes), so a stream of short results does not wait on the fold.
        shortest = -(-proto.MIN_FRAME_BYTES // params.beat_bytes)
        self.frame_depth = 1 << ceil_log2((params.fold_latency + 9) // shortest + 2)
        super().__init__({
            "jobs": In(stream.Signature(job_layout(params))),
            "frames": Out(stream.Signature(result_frame_layout(params))),
            "rd_addr": Out(bank_addr_bits(params)), "rd_en": Out(1), "rd_data": In(W).array(P),
            "rows": Out(stream.Signature(W)), "rows_held": Out(16),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        W = prm.data_width
        depth = self.row_depth

        m.submodules.frame_queue = frames = SyncFIFOBuffered(
            width=data.Layout.cast(result_frame_layout(prm)).size, depth=self.frame_depth)
        # The row queue: a block RAM whose slow output goes straight into the output register (a FIFO of
        # LUT RAM behind it measured 3.0 ns of routing after the RAM's 5.8 ns), so the result generator's
        # logic starts at a flip-flop. Every row is committed as it is written.
        m.submodules.row_queue = rows_q = FrameFifo(W, depth, registered_output=True)
        taken = Signal()
        held = Signal(range(depth + 4))                 # rows queued, counted one cycle before they show
        m.d.comb += [
            self.frames.payload.eq(frames.r_data), self.frames.valid.eq(frames.r_rdy),
            frames.r_en.eq(self.frames.ready),
            self.rows.payload.eq(rows_q.r_data), self.rows.valid.eq(rows_q.r_valid),
            rows_q.r_ready.eq(self.rows.ready),
            taken.eq(self.rows.ready & rows_q.r_valid), self.rows_held.eq(held),
        ]

        # the job being read: written at its start, used only while active (no reset)
        kind = Signal(data.StructLayout({"contributors": prm.ports, "dtype": 4, "op": 4, "acc_fp32": 1,
                                         "saturate": 1}), reset_less=True)
        active = Signal()
        addr = Signal(len(self.rd_addr), reset_less=True)              # the next row's bank address
        left = Signal(range(prm.rows_per_set + 1), reset_less=True)    # rows of the job not yet read
        last = Signal(reset_less=True)                                 # left == 1

        # Rows read and not yet taken by the generator (in flight or queued): a read is issued only while
        # that is below the queue's depth, so every row read finds room. depth is a power of two and
        # occupied never exceeds it, so "room" is its top bit clear.
        occupied = Signal(range(depth + 1))
        room = ~occupied[-1]
        issue = active & room
        m.d.sync += occupied.eq(occupied + issue - taken)
        m.d.comb += [self.rd_en.eq(issue), self.rd_addr.eq(addr)]
        with m.If(issue):
            m.d.sync += [addr.eq(addr + 1), left.eq(left - 1), last.eq(left == 2)]

        # The next job starts as the current one reads its last row.
        can_start = ~active | (issue & last)
        start = can_start & self.jobs.valid & frames.w_rdy
        job = self.jobs.payload
        frame = data.View(result_frame_layout(prm), frames.w_data)
        m.d.comb += [
            self.jobs.ready.eq(start),
            frames.w_en.eq(start),
            frame.cais.eq(job.cais), frame.mask.eq(job.mask), frame.rows.eq(job.rows),
        ]
        beats, keep = result_frame_shape(cais_field(job.cais, "payload_len"), prm.beat_bytes)
        m.d.comb += [frame.beats.eq(beats), frame.keep.eq(keep)]
        if prm.uplink:
            m.d.comb += frame.up.eq(job.up)
        with m.If(start):
            m.d.sync += [
                active.eq(1), addr.eq(job.row_base), left.eq(job.rows), last.eq(job.rows == 1),
                kind.contributors.eq(job.contributors), kind.dtype.eq(job.dtype), kind.op.eq(job.op),
                kind.acc_fp32.eq(job.acc_fp32), kind.saturate.eq(job.saturate),
            ]
        with m.Elif(issue & last):
            m.d.sync += active.eq(0)

        # The banks' read data is registered twice: a block RAM's output is slow (5.6-5.8 ns) and the banks
        # sit apart on the die, so the first register is the RAM's own output register (the DP16KD's,
        # OutputRegisteredRAM) and the second, here, carries the row to the chain (with only a fabric
        # register behind a bare RAM, the whole switch measured 4.4-5.0 ns of routing after its 5.8 ns).
        # The chain takes the row with the job's kind as it was at the read.
        m.submodules.chain = chain = self.chain
        read_kind = delay_line(m, kind, BANK_READ + BANK_READ_REGISTERS, "read_kind")
        read_valid = delay_line(m, issue, BANK_READ + BANK_READ_REGISTERS, "read_valid", reset_less=False)
        m.d.comb += [
            chain.i_valid.eq(read_valid), chain.mask.eq(read_kind.contributors),
            chain.dtype.eq(read_kind.dtype), chain.op.eq(read_kind.op), chain.acc_fp32.eq(read_kind.acc_fp32),
            chain.saturate.eq(read_kind.saturate),
            *(chain.rows[p].eq(delay_line(m, self.rd_data[p], BANK_READ_REGISTERS, f"rd_data{p}"))
              for p in range(prm.ports)),
        ]
        out_acc = delay_line(m, read_kind.acc_fp32, chain.latency, "out_acc")
        out_dtype = delay_line(m, read_kind.dtype, chain.latency, "out_dtype")
        m.submodules.narrow = narrow = self.narrow
        m.d.comb += [narrow.word.eq(chain.result), narrow.acc_fp32.eq(out_acc), narrow.dtype.eq(out_dtype)]
        wrote = delay_line(m, chain.o_valid, narrow.latency, "wrote", reset_less=False)
        m.d.comb += [rows_q.w_en.eq(wrote), rows_q.commit.eq(wrote), rows_q.w_data.eq(narrow.row)]
        # A row written in cycle c shows on ``rows`` from cycle c + ROW_QUEUE_LATENCY; it counts in
        # rows_held a cycle before, so a frame whose rows are all held finds its first row when it starts.
        # (The rows behind it follow one per cycle.)
        m.d.sync += held.eq(held + delay_line(m, wrote, ROW_QUEUE_LATENCY - 2, "held_in", reset_less=False) - taken)
        m.d.comb += self.busy.eq(active | (occupied != 0) | frames.r_rdy)
        return m
