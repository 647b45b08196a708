"""The switch core: every port at line rate at once (docs/core-design.md, candidate B).

::

    ingress headers --> Decision (A arbiter, B tables, C slot state) --> per-port decisions, result jobs
                          +-- state, maint --> SramBuffer: the slot-state memory
    ingress beats ---> IngressLane[p] --+--> forwarded frames --> EgressCrossbar --> egress FIFOs
                                        +--> payload rows --> SramBuffer: bank[p]
                                                               |
    JobQueue (waits for the rows) --> CreditSlice --> FoldReader (all banks, FoldChain) --> CreditSlice
        --> ResultGenerator --> ResultFanout --> result queues

(each port's egress FIFO, result queue and EgressMerge of the two are an EgressPort, one per port of :class:`Switch`)

Each port has a lane that streams its decided frames out of its ingress FIFO at one beat per cycle and
a bank that holds its contributions: an all-reduce payload row is written once, into the bank of the
port it came from, never read and modified. A set that completes becomes a result job; its rows are
read from every contributor's bank in the same cycle and folded in ascending port order by a pipelined
chain, one row per cycle, so every result is the port-order fold of docs/numerics.md whatever the order
of arrival. The decision pipeline takes one header per cycle from all ports together.
"""

from amaranth.hdl import Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import RegisterMap

from .alu.completion import FoldReader, JobQueue
from .alu.lane import IngressLane
from .common.enums import Action, DropReason
from .common.pipeline import CreditSlice
from .control.tables import TableProgramSignature
from .decision import DECISION_HEADERS, Decision
from .egress.ports import EgressCrossbar, ResultFanout, beat_layout
from .egress.results import ResultGenerator, result_frame_layout
from .parser.ingress import frame_meta_layout
from .sram.buffer import SramBuffer

__all__ = ["SwitchCore", "Action"]


class SwitchCore(wiring.Component):
    """Everything between the ingress FIFOs and the egress FIFOs.

    Members
    -------
    headers[p] : In(stream.Signature(frame_meta_layout)); beats[p] : In(stream.Signature(data_width))
        The good frames of each ingress port (see :class:`cais.hdl.parser.ingress.IngressPort`): a header is
        taken (``ready``, a register of the decision) only while its lane has room for its decision.
    egress[p] : Out(stream.Signature(beat_layout(data_width), always_ready=True))
        Forwarded beats for egress FIFO p (registers); each is taken the cycle it is offered.
    e_freed[p] : In(1)
        A beat left egress FIFO p, in this cycle or earlier (the crossbar's credit: a frame starts only
        when all of its ports have room for it).
    results[p] : Out(stream.Signature(beat_layout(data_width), always_ready=True))
        Result beats for result queue p (registers); each is taken the cycle it is offered.
    r_freed[p] : In(1)
        A beat left result queue p, in this cycle or earlier (the fanout's credit).
    program : In(TableProgramSignature)
        Table programming from the register bank (words of the register map).
    switch_mac : In(48)
    ev_* : Out(1); ev_drop_reason : Out(DropReason); slots_in_use : Out(32)
        One pulse per frame decided, for the counters; the number of non-empty sets.
    busy : Out(1)
        A frame is queued or in flight anywhere in the core (not the slot-state sweep after reset).
    busy_parts : Out(3 * ports + 9)
        ``busy`` is their OR: each says a frame is in one block (the register bank registers them as they
        are and ORs them after, :class:`~cais.hdl.control.csr.RegisterBank`'s ``level_any``).
    uplink : In(32); ev_partial_sent : Out(1); ev_partial_resent : Out(1)
        Only with ``params.uplink`` (docs/protocol.md section 13): the UPLINK register's word; a partial sent
        to the parent switch, sent again.
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap):
        self.params, self.regmap = params, regmap
        P, W = params.ports, params.data_width
        self.meta_layout = frame_meta_layout(params)
        super().__init__({
            "headers": In(stream.Signature(self.meta_layout)).array(P),
            "beats": In(stream.Signature(W)).array(P),
            "egress": Out(stream.Signature(beat_layout(W), always_ready=True)).array(P), "e_freed": In(1).array(P),
            "results": Out(stream.Signature(beat_layout(W), always_ready=True)).array(P), "r_freed": In(1).array(P),
            "program": In(TableProgramSignature(regmap)),
            "switch_mac": In(48),
            "ev_drop": Out(1), "ev_drop_reason": Out(DropReason), "ev_forwarded": Out(1), "ev_contribution": Out(1),
            "ev_duplicate": Out(1), "ev_completed": Out(1), "ev_resent": Out(1),
            "slots_in_use": Out(32),
            "busy": Out(1), "busy_parts": Out(3 * P + 9),
            **({"uplink": In(32), "ev_partial_sent": Out(1), "ev_partial_resent": Out(1)} if params.uplink else {}),
        })
        # Created here so tests can inspect them.
        self.decision = Decision(params, regmap)
        self.sram = SramBuffer(params)

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        P = prm.ports
        busy = []

        m.submodules.decision = dec = self.decision
        wiring.connect(m, wiring.flipped(self.program), dec.program)
        m.d.comb += [
            self.ev_drop.eq(dec.ev_drop), self.ev_drop_reason.eq(dec.ev_drop_reason),
            self.ev_forwarded.eq(dec.ev_forwarded), self.ev_contribution.eq(dec.ev_contribution),
            self.ev_duplicate.eq(dec.ev_duplicate), self.ev_completed.eq(dec.ev_completed),
            self.ev_resent.eq(dec.ev_resent), self.slots_in_use.eq(dec.slots_in_use),
        ]
        if prm.uplink:
            m.d.comb += [dec.uplink.eq(self.uplink), self.ev_partial_sent.eq(dec.ev_partial_sent),
                         self.ev_partial_resent.eq(dec.ev_partial_resent)]
        busy += [dec.busy, *(lane.valid for lane in dec.lanes), dec.jobs.valid]

        m.submodules.jobs = jobs = JobQueue(prm)
        # The reader's take (its start, from its own counts) drives only the slice's registers beside it; the
        # queue pops into the slice from two registers of its own (its head's valid, the slice's credit), so
        # no path runs from the reader's state, or from a register beside the reader, through every
        # position of the queue.
        m.submodules.job_slice = job_slice = CreditSlice(jobs.layout)
        m.submodules.reader = reader = FoldReader(prm)
        # The generator's take (its start, which waits for the fanout's grant) drives only this slice's
        # registers beside it, not the reader's frame queue's output register and the generator's counts
        # across the die (the float switch measured 3.08 + 3.11 + 3.32 ns of routing from the generator's
        # nxt_valid through the take into its rows owed); a credit slice, as the job slice, so the frame
        # queue's pop reads a credit flip-flop of its own, not a register beside the generator.
        m.submodules.frame_slice = frame_slice = CreditSlice(result_frame_layout(prm))
        m.submodules.results = res = ResultGenerator(prm)
        m.submodules.sram = sram = self.sram
        wiring.connect(m, dec.state, sram.state)
        wiring.connect(m, dec.maint, sram.maint)
        m.d.comb += [dec.sweeping.eq(sram.sweeping), dec.sweep_last.eq(sram.sweep_last)]
        m.submodules.egress = xbar = EgressCrossbar(P, P, prm.data_width, prm.max_frame_beats, prm.egress_depth)
        m.submodules.fanout = fanout = ResultFanout(P, prm.data_width, prm.max_frame_beats, prm.result_queue_depth)
        # Headers in the decision pipeline (and the one granted now) may each queue a job: grant one only
        # if they all fit.
        m.d.comb += dec.hold.eq(jobs.level > jobs.depth - DECISION_HEADERS)

        for p in range(P):
            m.submodules[f"lane{p}"] = lane = IngressLane(prm)
            # a header is offered only while its lane has room for the decision
            hdr = self.headers[p]
            m.d.comb += [
                dec.headers[p].payload.eq(hdr.payload), dec.headers[p].valid.eq(hdr.valid & lane.credit),
                hdr.ready.eq(dec.headers[p].ready), lane.taken.eq(dec.headers[p].ready),
                sram.wr_addr[p].eq(lane.bank_addr), sram.wr_data[p].eq(lane.bank_data), sram.wr_en[p].eq(lane.bank_en),
                reader.rd_data[p].eq(sram.rd_data[p]),
                jobs.finished[p].eq(lane.finished), jobs.open_after[p].eq(lane.open_after),
            ]
            wiring.connect(m, dec.lanes[p], lane.decisions)
            wiring.connect(m, wiring.flipped(self.beats[p]), lane.beats)
            wiring.connect(m, lane.fwd, xbar.sources[p])
            busy.append(lane.busy)

        m.d.comb += [sram.rd_addr.eq(reader.rd_addr), sram.rd_en.eq(reader.rd_en)]
        wiring.connect(m, dec.jobs, jobs.i)
        wiring.connect(m, jobs.o, job_slice.i)
        wiring.connect(m, job_slice.o, reader.jobs)
        wiring.connect(m, reader.frames, frame_slice.i)
        wiring.connect(m, frame_slice.o, res.jobs)
        wiring.connect(m, reader.rows, res.rows)
        m.d.comb += [res.rows_held.eq(reader.rows_held), res.switch_mac.eq(self.switch_mac)]
        wiring.connect(m, res.out, fanout.source)
        busy += [jobs.level != 0, job_slice.busy, reader.busy, frame_slice.busy, res.busy, xbar.busy, fanout.busy]

        for p in range(P):
            wiring.connect(m, xbar.egress[p], wiring.flipped(self.egress[p]))
            m.d.comb += xbar.freed[p].eq(self.e_freed[p])
            wiring.connect(m, fanout.queues[p], wiring.flipped(self.results[p]))
            m.d.comb += fanout.freed[p].eq(self.r_freed[p])
        busy += [h.valid for h in self.headers]
        assert len(busy) == len(self.busy_parts), "busy_parts' width is the count of the parts"
        m.d.comb += [self.busy_parts.eq(Cat(*busy)), self.busy.eq(self.busy_parts.any())]
        return m
