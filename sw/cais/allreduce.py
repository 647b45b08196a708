"""One rank's side of one all-reduce through the switch, without I/O (the driver's protocol logic).

The engine turns an array into CAIS contributions and result frames back into the reduced array:

- chunks of ``chunk_size`` bytes; chunk ``i`` of the collective carries ``seq_num = seq_base + i``, the
  group-wide chunk sequence number that picks its slot and shadow set in the switch (docs/protocol.md);
- a chunk is sent only when the result of the chunk that used its slot before it has arrived (the
  slot's other set is then free again: SwitchML's self-clocking), and never more than ``window``
  chunks are in flight, so switch memory cannot overflow and a set is never reused too early;
- a chunk whose result is late is sent again after the retransmission timeout (``timeout_s`` at
  first, then what measured round trips say: :mod:`cais.rto`), doubling each retry until a new result
  arrives; after ``retry_limit`` timeouts in a row with no result arriving, the engine gives up
  (``failed``) and the caller falls back to the host ring;
- duplicate results are ignored.

It never sleeps or reads a clock: the caller passes ``now`` (seconds of simulated time) to ``poll`` and
``receive`` and asks ``next_deadline`` when to call again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import protocol as proto
from .rto import RetransmitTimer

__all__ = ["SwitchAllReduce", "chunk_count", "SWITCH_RTO_FLOOR"]

SWITCH_RTO_FLOOR = 0.1   # measured timeouts go down to a tenth of timeout_ms


def chunk_count(elements: int, itemsize: int, chunk_size: int) -> int:
    """Chunks a collective of `elements` items takes (every rank computes the same number)."""
    per_chunk = chunk_size // itemsize
    return -(-elements // per_chunk)


@dataclass
class _Chunk:
    index: int
    sent_at: float = -1.0       # last transmission; -1 before the first
    first_sent: float = -1.0
    retries: int = 0
    backoff: int = 0            # timeouts since this rank last received any new result
    deadline: float = 0.0
    done: bool = False


class SwitchAllReduce:
    """Sends one rank's contributions for one collective and collects the results.

    `slot_count` is the group's quota (a power of two) and `window` the largest number of chunks in
    flight (at most `slot_count`). `mac` is the rank's address, used as the source of its frames.
    """

    def __init__(self, *, data: np.ndarray, op: proto.ReduceOp, group_id: int, seq_base: int, slot_count: int,
                 window: int, chunk_size: int, timeout_s: float, retry_limit: int, mac: int, layer_id: int = 0,
                 now: float = 0.0):
        if data.dtype != np.int32:
            raise TypeError(f"the switch reduces int32 arrays, not {data.dtype}")
        if slot_count < 1 or slot_count & (slot_count - 1):
            raise ValueError(f"slot_count={slot_count}: must be a power of two")
        self.data = np.ascontiguousarray(data.reshape(-1)).astype(">i4")
        self.op = proto.ReduceOp(op)
        self.group_id, self.seq_base, self.layer_id = group_id, seq_base, layer_id
        self.slot_count = slot_count
        self.window = max(1, min(window, slot_count))
        self.per_chunk = chunk_size // 4
        # The switch's round trip is steady, so the timer may fall well below the configured one: a lost
        # chunk stalls its slot (and every peer's window) until it is resent.
        self.timer = RetransmitTimer(timeout_s, floor=SWITCH_RTO_FLOOR, warmup=self.window)
        self.retry_limit, self.mac = retry_limit, mac
        self.nchunks = chunk_count(len(self.data), 4, chunk_size)
        self.result = np.zeros(len(self.data), dtype=np.int32)
        self._chunks = [_Chunk(i) for i in range(self.nchunks)]
        self._next = 0                # next chunk never sent
        self._in_flight: dict[int, _Chunk] = {}
        self._remaining = self.nchunks
        self.failed = False
        # figures for the caller and the controller
        self.frames_sent = 0
        self.bytes_sent = 0
        self.retransmissions = 0
        self.duplicate_results = 0
        self.rtts: list[float] = []        # round trips of chunks sent once
        self.first_rtt: float | None = None  # of chunk 0: what the collective met when it started

    # ---------------------------------------------------------------- state
    @property
    def done(self) -> bool:
        return self._remaining == 0

    @property
    def chunks_done(self) -> int:
        return self.nchunks - self._remaining

    @property
    def seq_end(self) -> int:
        """The first sequence number after this collective's chunks."""
        return self.seq_base + self.nchunks

    def next_deadline(self) -> float | None:
        if self.done or self.failed or not self._in_flight:
            return None
        return min(c.deadline for c in self._in_flight.values())

    # ---------------------------------------------------------------- frames
    def _frame(self, chunk: _Chunk, retransmit: bool) -> bytes:
        lo = chunk.index * self.per_chunk
        values = self.data[lo:lo + self.per_chunk]
        hdr = proto.CaisHeader(
            op_type=proto.OpType.ALL_REDUCE, group_id=self.group_id, layer_id=self.layer_id & 0xFFFF,
            chunk_id=chunk.index & 0xFFFF, total_chunks=min(self.nchunks, 0xFFFF),
            seq_num=(self.seq_base + chunk.index) & 0xFFFF_FFFF, payload_len=values.nbytes,
            dtype=proto.DType.INT32, red_op=self.op,
            flags=int(proto.Flags.RETRANSMIT) if retransmit else 0)
        return proto.build_frame(hdr, values.tobytes(), dst=proto.result_mac(self.group_id), src=self.mac,
                                 pad=True)

    def _send(self, chunk: _Chunk, now: float) -> bytes:
        retransmit = chunk.sent_at >= 0
        if retransmit:
            chunk.retries += 1
            chunk.backoff += 1
            self.retransmissions += 1
        else:
            chunk.first_sent = now
        chunk.sent_at = now
        chunk.deadline = now + self.timer.timeout(chunk.backoff)
        frame = self._frame(chunk, retransmit)
        self.frames_sent += 1
        self.bytes_sent += len(frame)
        return frame

    def _slot_free(self, index: int) -> bool:
        """The chunk that used this chunk's slot before it (in either set) has its result."""
        before = index - self.slot_count
        return before < 0 or self._chunks[before].done

    def poll(self, now: float) -> list[bytes]:
        """Frames to transmit now: retransmissions that are due, then new chunks the window allows."""
        if self.failed:
            return []
        out = []
        for chunk in sorted(self._in_flight.values(), key=lambda c: c.index):
            if now >= chunk.deadline:
                if chunk.backoff >= self.retry_limit:
                    self.failed = True
                    return out
                out.append(self._send(chunk, now))
        while (self._next < self.nchunks and len(self._in_flight) < self.window
               and self._slot_free(self._next)):
            chunk = self._chunks[self._next]
            self._in_flight[chunk.index] = chunk
            out.append(self._send(chunk, now))
            self._next += 1
        return out

    def receive(self, frame: bytes, now: float) -> bool:
        """Take a result frame of this collective; returns whether the frame belonged to it."""
        f = proto.parse_frame(frame)
        h = f.cais
        if h is None or not (h.flags & proto.Flags.RESULT) or h.group_id != self.group_id:
            return False
        index = (h.seq_num - self.seq_base) & 0xFFFF_FFFF
        if index >= self.nchunks:
            return False
        chunk = self._chunks[index]
        if chunk.done:
            self.duplicate_results += 1
            return True
        values = np.frombuffer(f.payload, dtype=">i4")
        lo = index * self.per_chunk
        if len(values) != min(self.per_chunk, len(self.data) - lo):
            return False   # not a result of this chunk (a stale frame of another collective)
        self.result[lo:lo + len(values)] = values
        chunk.done = True
        self._in_flight.pop(index, None)
        self._remaining -= 1
        # Progress: the path works. Like TCP after a new acknowledgement, chunks still waiting start their
        # backoff again, so a chunk that waited long for a slow peer is not left on a huge timer (and the
        # retry limit counts timeouts without any progress, not the waits behind a peer's loss).
        rto = self.timer.rto
        for other in self._in_flight.values():
            if other.backoff:
                other.backoff = 0
                other.deadline = min(other.deadline, now + rto)
        if chunk.retries == 0:   # Karn: a retransmitted chunk's round trip is ambiguous
            self.timer.sample(now - chunk.first_sent)
            self.rtts.append(now - chunk.first_sent)
            if index == 0:
                self.first_rtt = now - chunk.first_sent
        return True
