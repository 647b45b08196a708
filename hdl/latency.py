"""The switch's cycle figures, composed from its blocks' latencies: the one place docs/interface.md's figures
come from (:data:`FORWARD_LATENCY`, :data:`RESULT_OVERHEAD`, :func:`result_latency`), read by
:mod:`cais.sim.timing`, the model link, the benches and the tests.

Each constant below is one block's latency, and the one definition of it: the block's attribute named
beside it is this constant (documented in the block's Members docstring), and that block's test or the
whole switch's timing tests (tests/sim/test_switch_timing.py, tests/sim/test_switch_verilator.py) measure it in
the RTL. The paths are sums of these terms, one comment per register on the way. The module imports no
Amaranth, so the model link and the daemon (numpy only) read the same figures as the RTL's tests.

Cycle convention (docs/interface.md): a beat counts in the cycle its ``tvalid`` and ``tready`` are both
high; "latency n" means what enters in cycle t comes out in cycle t + n.
"""

from __future__ import annotations

from cais import protocol as proto
from cais.params import SwitchParams

__all__ = ["INGRESS_DECIDE", "HEADER_QUEUE", "INGRESS_HEADER", "ARBITER", "RULE_LOOKUP", "SLOT_STATE",
           "LANE_REQUEST", "LANE_START", "LANE_FINISH", "FRAME_GRANT", "CROSSBAR_GRANT", "FRAME_FIFO", "EGRESS_PORT", "JOB_QUEUE",
           "REGISTER_SLICE", "FOLD_READER_START", "BANK_WRITE", "BANK_READ", "BANK_READ_REGISTERS", "RESULT_REQUEST",
           "forward_terms", "result_terms", "FORWARD_LATENCY", "RESULT_OVERHEAD", "frame_beats", "result_latency"]

# ---- the blocks' latencies (the attribute that is each one, in brackets)

#: [IngressPort.DECIDE_DELAY] A frame's last beat (cycle 0) to its commit and its header written into the
#: header queue: the beat's facts registered (0), the checks without the header registered (1, while the
#: header's last beat is stored), the header's checks registered (2), the verdict (3).
INGRESS_DECIDE = 3
#: [HeaderQueue.latency] An entry committed in cycle t is at the head in t + 2: the LUT RAM's write and
#: pointer, then the head's data register loaded from the RAM's read.
HEADER_QUEUE = 2
#: [IngressPort.header_latency] A good frame's last beat to its header offered on ``headers``.
INGRESS_HEADER = INGRESS_DECIDE + HEADER_QUEUE
#: [Arbiter.latency] A header offered (and granted) in cycle t is taken in t + 1 (``take``, a register).
ARBITER = 1
#: [RuleLookup.latency] The take to the looked-up header: stages T, B1, B2.
RULE_LOOKUP = 3
#: [SlotState.latency] The looked-up header to its decision on the lanes: stages S0, S1, S2, U, V.
SLOT_STATE = 5
#: [IngressLane.request_latency] A forwarded frame's decision, on an idle lane, to its request to the
#: egress crossbar (``fwd.req``, a register).
LANE_REQUEST = 1
#: [IngressLane.start_latency] A frame's decision, on an idle lane, to its first beat taken when it asks
#: no egress port (aggregated or dropped): the next-frame register, then the frame's ``active``.
LANE_START = 2
#: [IngressLane.finish_latency] A frame's last beat to its ``finished`` (a register); one cycle more when
#: its last payload row starts in its last beat (the row is written in the next cycle).
LANE_FINISH = 1
#: [ResultFanout.latency] A source's request (``req``) to its frame's first beat on the output: the grant
#: register, the source's first beat, the output register.
FRAME_GRANT = 3
#: [EgressCrossbar.latency] The same through the crossbar, which registers its sources' beats at its inputs
#: first (the lanes' beats come from every port's corner of the die).
CROSSBAR_GRANT = FRAME_GRANT + 1
#: [FrameFifo.latency with ``registered_output``] A beat written and committed in cycle t is at the head in
#: t + 4: the write, the block RAM's read, its output register, the skid (a flip-flop FIFO).
FRAME_FIFO = 4
#: [EgressPort.latency] A beat from the crossbar or the fanout to ``m_axis``: the port's input register,
#: then its egress FIFO or result queue (a FrameFifo with a registered output); the merge adds none when
#: the port is free.
EGRESS_PORT = 1 + FRAME_FIFO
#: [JobQueue.latency] The last frame a job waits for shows ``finished`` in t: the job is offered in t + 2
#: (the queue's input register, then ``o.valid``).
JOB_QUEUE = 2
#: [CreditSlice.latency] An item accepted by a slice in cycle t is offered from t + 1 (its output
#: register); the credit slice between the job queue and the fold reader
#: (cais.hdl.common.pipeline.CreditSlice).
REGISTER_SLICE = 1
#: [FoldReader.start_latency] A job offered to an idle fold reader to its first row read (``rd_en``): the
#: reader's ``active`` register.
FOLD_READER_START = 1
#: [ContributionBanks.read_latency, OutputRegisteredRAM.read_latency] A bank read to its data: the block
#: RAM's synchronous read, then its output register (on ECP5 the DP16KD's own, ``REGMODE_B = "OUTREG"``).
BANK_READ = 2
#: [ContributionBanks.write_latency] A row written (``wr_en``) in cycle t is seen by a bank read issued in
#: t + 2 or later: the write's registers beside each block RAM, then the RAM's write. It is on no path: a
#: job's rows are read at the earliest LANE_FINISH + JOB_QUEUE + REGISTER_SLICE + FOLD_READER_START cycles
#: after the last one's write (asserted below).
BANK_WRITE = 2
#: [cais.hdl.alu.completion.BANK_READ_REGISTERS] Register ranks between a bank's output and the fold chain.
BANK_READ_REGISTERS = 1
#: [ResultGenerator.request_latency] A result's rows all held (``rows_held``), the generator idle, to its
#: request to the result fanout (``out.req``, a register).
RESULT_REQUEST = 1


# A job's rows are read only after its frames' ``finished``, which comes LANE_FINISH cycles after a frame's
# last row is written (the lane's register), through the job queue and the reader's start: the banks'
# registered write must have landed by then.
assert LANE_FINISH + JOB_QUEUE + REGISTER_SLICE + FOLD_READER_START >= BANK_WRITE

# ---- the paths


def forward_terms() -> list[tuple[str, int]]:
    """A forwarded frame, its lane and its egress ports free: from its last beat in to its first beat out."""
    return [
        ("ingress: the checks, the commit, the header queue", INGRESS_HEADER),
        ("arbiter: the take", ARBITER),
        ("decision: rule lookup (T, B1, B2)", RULE_LOOKUP),
        ("decision: slot state (S0, S1, S2, U, V)", SLOT_STATE),
        ("lane: the request to the crossbar", LANE_REQUEST),
        ("crossbar: grant, first beat, input register, output register", CROSSBAR_GRANT),
        ("egress port: the input register, the egress FIFO's write, read and output register", EGRESS_PORT),
    ]


def result_terms() -> list[tuple[str, int]]:
    """The completing contribution, its lane and the fold reader idle, from its last beat in to the result's
    first beat out, besides the frame's beats, its rows and the fold chain (F): what :data:`RESULT_OVERHEAD`
    adds up. The frame streams its beats between the lane's start and its finish, and the reader reads a
    row per cycle between its start and the last read: those terms are ``beats - 1`` and ``rows - 1``,
    hence the two ``-1`` terms."""
    return [
        ("ingress: the checks, the commit, the header queue", INGRESS_HEADER),
        ("arbiter: the take", ARBITER),
        ("decision: rule lookup (T, B1, B2)", RULE_LOOKUP),
        ("decision: slot state (S0, S1, S2, U, V)", SLOT_STATE),
        ("lane: the next-frame register, then the first beat", LANE_START),
        ("lane: beats - 1 is counted in beats", -1),
        ("lane: finished, a register after the last row's write", LANE_FINISH),
        ("job queue: its input register, then o.valid", JOB_QUEUE),
        ("register slice to the fold reader: its output register", REGISTER_SLICE),
        ("fold reader: its start, the first read", FOLD_READER_START),
        ("fold reader: rows - 1 is counted in rows", -1),
        ("bank: the synchronous read and the RAM's output register", BANK_READ),
        ("bank: the register behind the RAM, in the fold reader", BANK_READ_REGISTERS),
        ("row queue: written, counted in rows_held a cycle before its head shows", FRAME_FIFO - 1),
        ("result generator: the request", RESULT_REQUEST),
        ("result fanout: grant, first beat, output register", FRAME_GRANT),
        ("egress port: the input register, the result queue's write, read and output register", EGRESS_PORT),
    ]


#: Cycles from a forwarded frame's last beat in to its first beat out on each of its ports, when its lane
#: and its egress ports are free, whatever the frame's length and the build (docs/interface.md).
FORWARD_LATENCY = sum(n for _, n in forward_terms())

#: The result latency's cycles besides the frame's beats, its rows and the fold chain (:func:`result_latency`).
RESULT_OVERHEAD = sum(n for _, n in result_terms())


def frame_beats(params: SwitchParams, payload_len: int) -> int:
    """Beats of a CAIS frame with ``payload_len`` bytes of payload, padded to 60 bytes if shorter."""
    length = max(proto.HEADERS_BYTES + payload_len, proto.MIN_FRAME_BYTES)
    return -(-length // params.beat_bytes)


def result_latency(params: SwitchParams, payload_len: int) -> int:
    """Cycles from the completing contribution's last beat in to the result's first beat out
    (docs/interface.md): ``beats + rows + F + RESULT_OVERHEAD``, F = ``params.fold_latency`` (the fold
    chain's and the rounding's latency, which the fold reader checks against its blocks), one cycle more
    when the last payload row starts in the frame's last beat (it is written in the next cycle)."""
    rows = -(-payload_len // params.beat_bytes)
    beats = frame_beats(params, payload_len)
    flush = beats == rows + proto.HEADERS_BYTES // params.beat_bytes
    return beats + rows + params.fold_latency + RESULT_OVERHEAD + int(flush)
