"""The egress stage: cais.hdl.egress.ports's EgressCrossbar (P lane sources), ResultFanout and per port an EgressPort
(egress FIFO, result queue, EgressMerge, tx counter increments), wired as the switch wires them; top
``cais_egress`` (cais.hdl.blocks.EgressBlock).

The lanes and the result generator are test scaffolding (cais.hdl.blocks.AxisFrameSource): an AxiStreamSource
per lane (``s_axis__<s>``) and one for results (``s_res``) send frames whose ``tdest`` is the frame's egress
port mask; the scaffolding buffers each frame whole and requests it through FrameSourceSignature. An
AxiStreamSink takes each port's frames (``m_axis__<p>``).

The reference is the contract of docs/protocol.md 7.6 and docs/core-design.md section 5, written here:

* every frame arrives whole and byte-exact on exactly the ports of its mask, once (no loss, no duplicate);
* per (source, port) the frames keep their send order (a lane's forwarded frames; the results);
* tkeep is all ones on every beat but the last, contiguous from bit 0 and not empty on the last;
* no gap inside a frame on ``m_axis``: tvalid stays high from a frame's first beat shown to its last beat
  taken (under back-pressure too: the merge starts a frame only when it is whole in its queue), and a beat
  shown and not taken stays unchanged until taken (AXI4-Stream);
* the tx counter increments (``tx_frame``, ``tx_bytes``, registered twice): in every cycle, the frame end and
  the tkeep bits of the beat sent on the port two cycles before; in total, the port's frames and bytes;
* afterwards ``busy`` is low, and the scaffolding never ran dry mid-frame (``underrun``).

Cases: unicast permutations, an all-to-one hot spot (lengths up to max_frame), forwarded multicast, results to every port interleaved
with unicast frames, one-beat frames (forwarded and results, all masks), maximum-length frames (max_frame
forwarded, the longest result); each with and without idle insertion on the sources and back-pressure on the
sinks. Idle insertion / back-pressure: the first source / sink paused 3 cycles of 4 (Forencich's pattern),
the others at random (a seeded pattern each, about half the cycles), so the ports run at different paces.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from cais import protocol as proto
from cais.tb.common import (IDLE_BACKPRESSURE, clock_and_reset, pause_pattern, quiet_bfms, random_pauses,
                            tb_params)

CASES = ["unicast", "hotspot", "multicast", "results", "one_beat", "max_length"]


@dataclass
class Frame:
    src: int            # the lane, or P: the result source
    seq: int            # its place among the source's frames
    data: bytes
    mask: int           # its egress ports


def popcount(x: int) -> int:
    return bin(x).count("1")


class TB:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.P = P = tb_params()
        self.B = P.beat_bytes
        self.ports = P.ports
        self.res = P.ports                      # the result source's index
        self.rng = random.Random(seed)
        quiet_bfms(dut)
        bus = lambda name: AxiStreamBus.from_prefix(dut, name, bus_separator="__")  # noqa: E731
        self.sources = [AxiStreamSource(bus(f"s_axis__{s}"), dut.clk, dut.rst) for s in range(P.ports)]
        self.sources.append(AxiStreamSource(bus("s_res"), dut.clk, dut.rst))
        self.sinks = [AxiStreamSink(bus(f"m_axis__{p}"), dut.clk, dut.rst) for p in range(P.ports)]
        self.seq = [0] * (P.ports + 1)
        self.sent: list[Frame] = []
        # the monitor's view of each port: frames seen on the wire, counters, protocol faults
        self.frames = [[] for _ in range(P.ports)]
        self.tx_frames = [0] * P.ports
        self.tx_bytes = [0] * P.ports
        self.errors: list[str] = []
        self.cycle = 0

    # ------------------------------------------------------------------ stimulus
    def frame(self, src: int, length: int, mask: int) -> Frame:
        """A frame of ``length`` bytes from ``src``: byte 0 names the source, bytes 1-2 its sequence number
        (as far as the frame is long), the rest random."""
        assert 1 <= length and 0 < mask < 1 << self.ports
        seq = self.seq[src]
        self.seq[src] += 1
        tag = bytes([src]) + (seq & 0xFFFF).to_bytes(2, "little")
        data = (tag + self.rng.randbytes(max(0, length - 3)))[:length]
        f = Frame(src, seq, data, mask)
        self.sent.append(f)
        return f

    def random_mask(self, least: int = 1) -> int:
        while True:
            m = self.rng.randrange(1, 1 << self.ports)
            if popcount(m) >= least:
                return m

    @property
    def max_result(self) -> int:
        """Bytes of the longest result frame (the 30 header bytes and max_payload)."""
        return proto.HEADERS_BYTES + self.P.max_payload

    def stimulus(self, case: str) -> None:
        """The frames of ``case``, queued on the sources (each source sends its own in order, all at once)."""
        rng, P, B, all_ports = self.rng, self.ports, self.B, (1 << self.ports) - 1
        short = lambda: rng.choice([rng.randint(1, 3 * B), rng.randint(1, 200)])  # noqa: E731
        mixed = lambda: rng.choice([rng.randint(1, 3 * B), rng.randint(1, 200), rng.randint(200, self.P.max_frame)])  # noqa: E731
        if case == "unicast":                   # rounds of a random permutation lanes -> ports
            for _ in range(6):
                perm = list(range(P))
                rng.shuffle(perm)
                for s in range(P):
                    for _ in range(rng.randint(1, 3)):
                        self.frame(s, short(), 1 << perm[s])
        elif case == "hotspot":                 # every lane to port 0
            for s in range(P):
                for _ in range(8):
                    self.frame(s, mixed(), 1)
        elif case == "multicast":               # several ports per frame, some to all, some unicast
            for s in range(P):
                for i in range(9):
                    mask = all_ports if i % 3 == 0 else self.random_mask(2) if i % 3 == 1 else 1 << rng.randrange(P)
                    self.frame(s, short(), mask)
        elif case == "results":                 # results to every port between unicast frames
            for r in range(16):
                mask = all_ports if r % 4 else self.random_mask(2)
                self.frame(self.res, rng.randint(proto.HEADERS_BYTES + 4, self.max_result), mask)
            for s in range(P):
                for _ in range(8):
                    self.frame(s, mixed() if rng.random() < 0.3 else short(), 1 << rng.randrange(P))
        elif case == "one_beat":                # one-beat frames everywhere, results among them
            for s in range(P):
                for _ in range(16):
                    self.frame(s, rng.randint(1, B), self.random_mask())
            for _ in range(16):
                self.frame(self.res, rng.randint(1, B), all_ports if rng.random() < 0.7 else self.random_mask())
        elif case == "max_length":              # max_frame forwarded (unicast and multicast), longest results
            for s in range(P):
                self.frame(s, self.P.max_frame, 1 << ((s + 1) % P))
                self.frame(s, self.P.max_frame, self.random_mask(2))
            for _ in range(2):
                self.frame(self.res, self.max_result, all_ports)
        else:
            raise ValueError(case)
        for f in self.sent:
            self.sources[f.src].send_nowait(AxiStreamFrame(f.data, tdest=f.mask))

    # ------------------------------------------------------------------ monitor
    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"cycle {self.cycle}: {text}")

    async def _watch(self):
        """Every cycle, every port: the beat taken, the offer held, no gap inside a frame, the tx increments."""
        d, B = self.dut, self.B
        full = (1 << B) - 1
        ports = [(getattr(d, f"m_axis__{p}__tvalid"), getattr(d, f"m_axis__{p}__tready"),
                  getattr(d, f"m_axis__{p}__tdata"), getattr(d, f"m_axis__{p}__tkeep"),
                  getattr(d, f"m_axis__{p}__tlast"), getattr(d, f"tx_frame__{p}"), getattr(d, f"tx_bytes__{p}"))
                 for p in range(self.ports)]
        in_frame = [False] * self.ports          # a frame's first beat was taken, its last not yet
        offer = [None] * self.ports              # a beat shown and not taken
        beats = [bytearray() for _ in range(self.ports)]
        due = [[(0, 0), (0, 0)] for _ in range(self.ports)]   # the tx increments due in this cycle, the next
        while True:
            await RisingEdge(d.clk)              # the values of the cycle this edge ends
            self.cycle += 1
            for p, (tvalid, tready, tdata, tkeep, tlast, tx_frame, tx_bytes) in enumerate(ports):
                got = (int(tx_frame.value), tx_bytes.value.to_unsigned())
                if got != due[p][0]:
                    self.error(f"port {p}: tx_frame, tx_bytes {got}, want {due[p][0]}")
                self.tx_frames[p] += got[0]
                self.tx_bytes[p] += got[1]
                due[p] = [due[p][1], (0, 0)]
                if not tvalid.value:
                    if in_frame[p]:
                        self.error(f"port {p}: tvalid low inside a frame")
                    if offer[p] is not None:
                        self.error(f"port {p}: a beat shown was withdrawn before it was taken")
                    offer[p] = None
                    continue
                beat = (tdata.value.to_unsigned(), tkeep.value.to_unsigned(), int(tlast.value))
                if offer[p] is not None and beat != offer[p]:
                    self.error(f"port {p}: the beat shown changed before it was taken")
                if not tready.value:
                    offer[p] = beat
                    continue
                offer[p] = None
                data, keep, last = beat
                if last:
                    if keep == 0 or keep & (keep + 1):
                        self.error(f"port {p}: last beat tkeep {keep:#x} (not contiguous from bit 0)")
                elif keep != full:
                    self.error(f"port {p}: tkeep {keep:#x} before the last beat")
                n = popcount(keep)
                beats[p] += data.to_bytes(B, "little")[:n]
                due[p][1] = (last, n)
                if last:
                    self.frames[p].append(bytes(beats[p]))
                    beats[p] = bytearray()
                in_frame[p] = not last

    # ------------------------------------------------------------------ run and check
    async def start(self, idle: bool, backpressure: bool):
        await clock_and_reset(self.dut)
        cocotb.start_soon(self._watch())
        for i, source in enumerate(self.sources):
            if idle:
                source.set_pause_generator(pause_pattern() if i == 0 else random_pauses(self.rng))
        for i, sink in enumerate(self.sinks):
            if backpressure:
                sink.set_pause_generator(pause_pattern() if i == 0 else random_pauses(self.rng))

    def expected(self) -> dict[tuple[int, int], deque]:
        """(source, port) -> the frames the port must send from that source, in the source's order."""
        want = {(s, p): deque() for s in range(self.ports + 1) for p in range(self.ports)}
        for f in self.sent:
            for p in range(self.ports):
                if f.mask >> p & 1:
                    want[f.src, p].append(f)
        return want

    async def run_and_check(self):
        d = self.dut
        copies = sum(popcount(f.mask) for f in self.sent)
        beats = sum(popcount(f.mask) * -(-len(f.data) // self.B) for f in self.sent)
        for _ in range(30 * beats + 2000):
            await RisingEdge(d.clk)
            if sum(map(len, self.frames)) >= copies and all(s.empty() and not s.active for s in self.sources):
                break
        await ClockCycles(d.clk, 16)
        logging.getLogger("cocotb.tb_egress").info(
            "%d frames, %d copies, %d beats on the ports in %d cycles; per port %s frames",
            len(self.sent), copies, beats, self.cycle, [len(f) for f in self.frames])
        assert not self.errors, "\n".join(self.errors)
        got = sum(map(len, self.frames))
        assert got == copies, f"{got} frames sent on the ports, want {copies} (per port {list(map(len, self.frames))})"

        want = self.expected()
        for p in range(self.ports):
            for i, data in enumerate(self.frames[p]):
                assert data, f"port {p}: frame {i} is empty"
                src = data[0]
                assert src <= self.ports, f"port {p}: frame {i} names source {src}"
                queue = want[src, p]
                assert queue, f"port {p}: frame {i} from source {src} is one too many (duplicate or wrong port)"
                head = queue.popleft()
                if data != head.data:
                    later = [f.seq for f in queue if f.data == data]
                    assert not later, (f"port {p}: source {src}'s frame {later[0]} came before its frame "
                                       f"{head.seq} (order per source)")
                    assert False, (f"port {p}: frame {i} from source {src}: {len(data)} bytes, want its frame "
                                   f"{head.seq} ({len(head.data)} bytes) byte for byte")
        left = {k: [f.seq for f in q] for k, q in want.items() if q}
        assert not left, f"frames not sent ((source, port): seq): {left}"

        # the sinks saw the same frames as the monitor
        for p, sink in enumerate(self.sinks):
            frames = []
            while not sink.empty():
                frames.append(bytes(sink.recv_nowait().tdata))
            assert frames == self.frames[p], f"port {p}: the AxiStreamSink's frames differ from the wire's"

        # tx counters: every frame and every byte the port sent
        for p in range(self.ports):
            nbytes = sum(len(f) for f in self.frames[p])
            assert (self.tx_frames[p], self.tx_bytes[p]) == (len(self.frames[p]), nbytes), \
                f"port {p}: tx {self.tx_frames[p]} frames {self.tx_bytes[p]} bytes, want {len(self.frames[p])}, {nbytes}"
        assert d.underrun.value == 0, "a scaffolding source ran dry mid-frame"
        assert d.busy.value == 0, "busy with every frame sent"


@cocotb.test()
@cocotb.parametrize(case=CASES, **IDLE_BACKPRESSURE)
async def frames(dut, case, idle, backpressure):
    tb = TB(dut, seed=CASES.index(case) * 4 + 2 * idle + backpressure)
    await tb.start(idle, backpressure)
    tb.stimulus(case)
    await tb.run_and_check()
