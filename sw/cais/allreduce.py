"""One rank's side of one all-reduce through the switch, without I/O (the driver's protocol logic).

The engine turns an array into CAIS contributions and result frames back into the reduced array:

- the array's elements travel in their wire type (:class:`~cais.protocol.DType`: int32, int16, int8, fp32,
  fp16, bf16; values encoded and decoded by :mod:`cais.numerics`, bf16 as uint16 bit patterns);
- chunks of :func:`chunk_payload` bytes: the largest multiple of the element size not above
  ``chunk_size`` nor the switch's ``max_payload`` (every rule's set capacity); chunk ``i``
  of the collective carries ``seq_num = seq_base + i``, the group-wide chunk sequence number that picks
  its slot and shadow set in the switch (docs/protocol.md);
- a chunk is sent only when the result of the chunk that used its slot before it has arrived (the
  slot's other set is then free again: SwitchML's self-clocking), and never more than ``window``
  chunks are in flight, so switch memory cannot overflow and a set is never reused too early;
- a chunk whose result is late is sent again after the retransmission timeout (``timeout_s`` at
  first, then what measured round trips say: :mod:`cais.rto`), doubling each retry until a new result
  arrives (the timer keeps a margin above a steady round trip, takes upper bounds when a whole window was
  answered only after repeats, and may start from the rank's previous collective's timer: :mod:`cais.rto`);
  after ``retry_limit`` timeouts in a row with no result arriving, and no earlier than
  :func:`retry_horizon` after the last new result (the same span at every rank, whatever its own timer
  measured: a rank that waits for a peer must outwait the peer's timer), the engine gives up
  (``failed``) and the caller falls back to the host ring;
- duplicate results are ignored.

It never sleeps or reads a clock: the caller passes ``now`` (seconds of simulated time) to ``poll`` and
``receive`` and asks ``next_deadline`` when to call again.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from . import numerics
from . import protocol as proto
from .rto import RetransmitTimer

__all__ = ["SwitchAllReduce", "CollectiveKind", "chunk_count", "chunk_payload", "SWITCH_RTO_FLOOR", "SWITCH_RTO_MARGIN",
           "retry_horizon"]

SWITCH_RTO_FLOOR = 0.1   # measured timeouts go down to a tenth of timeout_ms
SWITCH_RTO_MARGIN = 1 / 8   # and stay an eighth of the round trip above it (cais.rto: RFC 9002's 9/8)

_HEADER = proto.HEADER_STRUCT
_RESULT = int(proto.Flags.RESULT)        # its bit in the reserved word (flags are the low byte)


@dataclass(frozen=True)
class CollectiveKind:
    """What a switch rule must say for a collective's frames (``RULE_TYPE``), and how the host fallback
    reduces them: element type, operator, fp32 accumulation (fp16/bf16 only), saturation (int16/int8 SUM
    only) and reproducible order. Use :meth:`make`, which drops the flags that mean nothing for the type."""
    dtype: proto.DType = proto.DType.INT32
    op: proto.ReduceOp = proto.ReduceOp.SUM
    acc_fp32: bool = False
    saturate: bool = False
    reproducible: bool = False

    @classmethod
    def make(cls, dtype, op, *, acc_fp32: bool = False, saturate: bool = False,
             reproducible: bool = False) -> "CollectiveKind":
        """The kind, normalised: acc_fp32 only for fp16/bf16 SUM, saturate only for int16/int8 SUM, and
        reproducible only where the result could depend on the arrival order (float reductions, and
        saturating sums: integer wrap sums and integer max/min are order independent, so they keep the
        full set capacity and give the same bits anyway)."""
        dtype, op = proto.DType(dtype), proto.ReduceOp(op)
        acc_fp32 = numerics.widens(dtype, acc_fp32) and op == proto.ReduceOp.SUM
        saturate = bool(saturate) and dtype in (proto.DType.INT16, proto.DType.INT8) and op == proto.ReduceOp.SUM
        reproducible = bool(reproducible) and (dtype in proto.FLOAT_DTYPES or saturate)
        return cls(dtype, op, acc_fp32, saturate, reproducible)

    @property
    def itemsize(self) -> int:
        return proto.ELEMENT_BYTES[self.dtype]

    @property
    def is_float(self) -> bool:
        return self.dtype in proto.FLOAT_DTYPES

    def rule_fields(self) -> dict:
        """Keyword arguments of :class:`cais.tables.Rule` for this kind."""
        return {"dtype": self.dtype, "red_op": self.op, "acc_fp32": self.acc_fp32, "saturate": self.saturate,
                "reproducible": self.reproducible}

    def __str__(self) -> str:
        flags = [name for name in ("acc_fp32", "saturate", "reproducible") if getattr(self, name)]
        return f"{self.dtype.name.lower()} {self.op.name.lower()}" + "".join(f" {f}" for f in flags)


def chunk_payload(chunk_size: int, capacity: int, itemsize: int) -> int:
    """Payload bytes of a full chunk: the largest multiple of `itemsize` not above `chunk_size` nor the
    rule's set `capacity` (0 if not even one element fits)."""
    return min(chunk_size, capacity) // itemsize * itemsize


def chunk_count(elements: int, itemsize: int, chunk_size: int) -> int:
    """Chunks a collective of `elements` items takes (every rank computes the same number); `chunk_size`
    is the payload of a full chunk (:func:`chunk_payload`)."""
    per_chunk = chunk_size // itemsize
    if per_chunk < 1:
        raise ValueError(f"chunk_size={chunk_size}: smaller than one {itemsize}-byte element")
    return -(-elements // per_chunk)


def retry_horizon(timeout_s: float, retry_limit: int) -> float:
    """How long a chunk without any result is retried before the engine gives up, with the timer at
    `timeout_s` (the initial one, before measured round trips): its timeouts before the first and every
    further transmission, ``retry_limit`` retransmissions then one more timeout (docs/driver.md)."""
    timer = RetransmitTimer(timeout_s)
    return sum(timer.timeout(k) for k in range(retry_limit + 1))


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

    `data` holds values of the wire type `dtype` (default: the one of the array's dtype,
    :func:`cais.numerics.wire_dtype`; bf16 must be named, its values being uint16 bit patterns).
    `slot_count` is the group's quota (a power of two) and `window` the largest number of chunks in
    flight (at most `slot_count`). A chunk carries :func:`chunk_payload` bytes: `chunk_size` cut to the
    rule's set `capacity` (default: no limit) and to a multiple of the element size. `mac` is the rank's
    address, used as the source of its frames. `history`: the timer of this rank's previous collective
    through the same switch, with the same `timeout_s` (its round trips start this one's:
    :meth:`cais.rto.RetransmitTimer.adopt`).
    :attr:`result` is in the values' type (:func:`cais.numerics.native_dtype`).
    """

    def __init__(self, *, data: np.ndarray, op: proto.ReduceOp, group_id: int, seq_base: int, slot_count: int,
                 window: int, chunk_size: int, timeout_s: float, retry_limit: int, mac: int, layer_id: int = 0,
                 now: float = 0.0, dtype: proto.DType | None = None, capacity: int | None = None,
                 history: RetransmitTimer | None = None):
        data = np.asarray(data)
        if dtype is None:
            dtype = numerics.wire_dtype(data.dtype)
            if dtype is None:
                raise TypeError(f"the switch reduces int32, int16, int8, float32 and float16 arrays (bf16 as "
                                f"uint16 bits with dtype=DType.BF16), not {data.dtype}")
        self.dtype = proto.DType(dtype)
        native = numerics.native_dtype(self.dtype)
        if data.dtype.newbyteorder("=") != native:
            raise TypeError(f"dtype={self.dtype.name}: the values must be a {native} array, not {data.dtype}")
        if slot_count < 1 or slot_count & (slot_count - 1):
            raise ValueError(f"slot_count={slot_count}: must be a power of two")
        self.itemsize = proto.ELEMENT_BYTES[self.dtype]
        self.chunk_bytes = chunk_payload(chunk_size, chunk_size if capacity is None else capacity, self.itemsize)
        if self.chunk_bytes < self.itemsize:
            raise ValueError(f"chunk_size={chunk_size}, capacity={capacity}: not even one "
                             f"{self.dtype.name} element fits a chunk")
        self.data = np.ascontiguousarray(data.reshape(-1)).astype(native)
        self.op = proto.ReduceOp(op)
        self.group_id, self.seq_base, self.layer_id = group_id, seq_base, layer_id
        self.slot_count = slot_count
        self.window = max(1, min(window, slot_count))
        self.per_chunk = self.chunk_bytes // self.itemsize
        # The switch's round trip is steady, so the timer may fall well below the configured one: a lost
        # chunk stalls its slot (and every peer's window) until it is resent. It never grows past it: the
        # round trips measured here include the peers' repeats (cais.rto). Steady also means RTTVAR falls
        # to nothing: the margin keeps the timer an eighth of the round trip above it.
        self.timer = RetransmitTimer(timeout_s, floor=SWITCH_RTO_FLOOR, warmup=self.window, ceiling=1.0,
                                     margin=SWITCH_RTO_MARGIN)
        if history is not None:
            self.timer.adopt(history)
        self.retry_limit, self.mac = retry_limit, mac
        # Giving up needs retry_limit timeouts in a row and this long without a new result: a rank whose
        # measured timer is short (down to SWITCH_RTO_FLOOR) must not give up on a peer still repeating
        # on the initial timer's schedule (at most RetransmitTimer.longest apart).
        self.horizon = retry_horizon(timeout_s, retry_limit)
        self._progress_at = now       # the last new result (or the start)
        self.nchunks = chunk_count(len(self.data), self.itemsize, self.chunk_bytes)
        # payload bytes of the last chunk (the others carry chunk_bytes)
        self._last_bytes = len(self.data) * self.itemsize - (self.nchunks - 1) * self.chunk_bytes
        self._native = native
        # the result frames' payloads, kept as they came (wire order): decoded once, when asked (result)
        self._result_wire = bytearray(len(self.data) * self.itemsize)
        self._result: np.ndarray | None = None
        self._chunks = [_Chunk(i) for i in range(self.nchunks)]
        self._next = 0                # next chunk never sent
        self._in_flight: dict[int, _Chunk] = {}
        self._deadlines: list[tuple[float, int]] = []   # heap of (deadline, chunk); stale entries skipped
        self._backed_off: set[int] = set()      # chunks in flight whose backoff is not 0
        self._remaining = self.nchunks
        self._unsampled = 0           # results in a row of repeated chunks (no round trip sample)
        self.failed = False
        # figures for the caller and the controller
        self.frames_sent = 0
        self.bytes_sent = 0
        self.retransmissions = 0
        self.duplicate_results = 0
        self.rtts: list[float] = []        # round trips of chunks sent once
        self.first_rtt: float | None = None  # of chunk 0: what the collective met when it started
        self._wire_np = proto.numpy_dtype(self.dtype)
        self._eth = proto.EthHeader(proto.result_mac(group_id), mac, proto.ETHERTYPE).pack()
        # the header fields every chunk of this collective has in common
        self._fixed = (int(proto.OpType.ALL_REDUCE), self.group_id, self.layer_id & 0xFFFF)
        self._total = min(self.nchunks, 0xFFFF)
        self._ethertype = proto.ETHERTYPE.to_bytes(2, "big")
        self._reserved = {retransmit: int(proto.CaisHeader(dtype=self.dtype, red_op=self.op, flags=int(
            proto.Flags.RETRANSMIT) if retransmit else 0).reserved) for retransmit in (False, True)}
        self._result_reserved = proto.CaisHeader(dtype=self.dtype, red_op=self.op).reserved & 0xFF00
        # Per-frame work is what limits a co-simulation's speed: every chunk's frame for its first transmission
        # (proto.build_frame of its CaisHeader and payload, padded) is built here, all at once with numpy, and
        # sending it is a slice: frame i starts at i * _stride, and is _stride bytes long but for the last
        # chunk's (_last_frame bytes). Repeats are packed when sent (_frame), with their payload from here.
        # The rows are the only copy kept (1.12 x the data's bytes at the default chunk; the encoded payload
        # is dropped once copied in), read through a memoryview so no second copy is made.
        self._stride = max(proto.HEADERS_BYTES + self.chunk_bytes, proto.MIN_FRAME_BYTES)
        self._last_frame = max(proto.HEADERS_BYTES + self._last_bytes, proto.MIN_FRAME_BYTES)
        self._frames = self._first_frames(numerics.encode(self.dtype, self.data))

    def _first_frames(self, wire: bytes) -> memoryview:
        """Every chunk's frame for its first transmission, back to back, each in a row of _stride bytes
        (zeros after a frame shorter than the row: the last chunk's padding)."""
        n, eth, start = self.nchunks, proto.ETH_HEADER_BYTES, proto.HEADERS_BYTES
        rows = np.zeros((n, self._stride), np.uint8)
        rows[:, :eth] = np.frombuffer(self._eth, np.uint8)
        header = np.zeros(n, proto.header_dtype())
        index = np.arange(n, dtype=np.int64)
        header["op_type"], header["group_id"], header["layer_id"] = self._fixed
        header["chunk_id"] = index & 0xFFFF
        header["total_chunks"] = self._total
        header["seq_num"] = (self.seq_base + index) & 0xFFFF_FFFF
        header["payload_len"] = self.chunk_bytes
        if n:
            header["payload_len"][-1] = self._last_bytes
        header["reserved"] = self._reserved[False]
        rows[:, eth:start] = header.view(np.uint8).reshape(n, proto.CAIS_HEADER_BYTES)
        if n:                    # the payloads: every chunk's but the last one full
            body = np.frombuffer(wire, np.uint8)
            full = (n - 1) * self.chunk_bytes
            rows[:n - 1, start:start + self.chunk_bytes] = body[:full].reshape(n - 1, self.chunk_bytes)
            rows[n - 1, start:start + self._last_bytes] = body[full:]
        return memoryview(rows.reshape(-1))

    # ---------------------------------------------------------------- state
    @property
    def done(self) -> bool:
        return self._remaining == 0

    @property
    def result(self) -> np.ndarray:
        """The reduced values (zeros where no result came yet), in the values' type: the result payloads
        decoded at once, on the first read after a result arrived."""
        if self._result is None:
            self._result = np.frombuffer(self._result_wire, self._wire_np).astype(self._native)
        return self._result

    @property
    def chunks_done(self) -> int:
        return self.nchunks - self._remaining

    @property
    def seq_end(self) -> int:
        """The first sequence number after this collective's chunks."""
        return self.seq_base + self.nchunks

    def next_deadline(self) -> float | None:
        if self.failed or not self._in_flight:      # (done: nothing is in flight)
            return None
        heap, flight = self._deadlines, self._in_flight
        while True:              # drop entries of chunks done or re-timed since (there is a valid one)
            deadline, index = heap[0]
            chunk = flight.get(index)
            if chunk is not None and chunk.deadline == deadline:
                return deadline
            heapq.heappop(heap)

    # ---------------------------------------------------------------- frames
    def _frame(self, chunk: _Chunk, retransmit: bool) -> bytes:
        """The chunk's frame: ``proto.build_frame`` of its header and payload, padded (byte for byte; a
        test checks it), from the bytes packed in ``__init__``."""
        at = chunk.index * self._stride
        if not retransmit:
            return bytes(self._frames[at:at + (self._stride if chunk.index != self.nchunks - 1 else self._last_frame)])
        at += proto.HEADERS_BYTES
        payload = self._frames[at:at + (self.chunk_bytes if chunk.index != self.nchunks - 1 else self._last_bytes)]
        frame = self._eth + _HEADER.pack(
            *self._fixed, chunk.index & 0xFFFF, self._total, (self.seq_base + chunk.index) & 0xFFFF_FFFF,
            len(payload), self._reserved[retransmit]) + payload
        if len(frame) < proto.MIN_FRAME_BYTES:
            frame += bytes(proto.MIN_FRAME_BYTES - len(frame))
        return frame

    def _send(self, chunk: _Chunk, now: float) -> bytes:
        retransmit = chunk.sent_at >= 0
        if retransmit:
            chunk.retries += 1
            chunk.backoff += 1
            self._backed_off.add(chunk.index)
            self.retransmissions += 1
        else:
            chunk.first_sent = now
        chunk.sent_at = now
        # timeout(0) is the RTO itself: a chunk without backoff (nearly every one) reads it directly
        chunk.deadline = now + (self.timer.timeout(chunk.backoff) if chunk.backoff else self.timer.rto)
        heapq.heappush(self._deadlines, (chunk.deadline, chunk.index))
        frame = self._frame(chunk, retransmit)
        self.frames_sent += 1
        self.bytes_sent += len(frame)
        return frame

    def poll(self, now: float) -> list[bytes]:
        """Frames to transmit now: retransmissions that are due, then new chunks the window allows."""
        if self.failed:
            return []
        out = []
        heap = self._deadlines
        if heap and now >= heap[0][0]:      # else every deadline, even a stale one, is later
            earliest = self.next_deadline()
            if earliest is not None and now >= earliest:
                due = [chunk for chunk in self._in_flight.values() if now >= chunk.deadline]
                for chunk in sorted(due, key=lambda c: c.index):
                    if chunk.backoff >= self.retry_limit and now - self._progress_at >= self.horizon:
                        self.failed = True
                        return out
                    out.append(self._send(chunk, now))
        flight, chunks = self._in_flight, self._chunks
        while self._next < self.nchunks and len(flight) < self.window:
            # the chunk that used this chunk's slot before it (in either set) must have its result
            before = self._next - self.slot_count
            if before >= 0 and not chunks[before].done:
                break
            chunk = chunks[self._next]
            flight[chunk.index] = chunk
            out.append(self._send(chunk, now))
            self._next += 1
        return out

    def receive(self, frame: bytes, now: float) -> bool:
        """Take a result frame of this collective; returns whether the frame belonged to it."""
        # proto.parse_frame's fields, read in place (this runs for every result frame)
        if len(frame) < proto.HEADERS_BYTES or frame[12:14] != self._ethertype:
            return False
        _op, group_id, _layer, _chunk, _total, seq_num, payload_len, reserved = _HEADER.unpack_from(
            frame, proto.ETH_HEADER_BYTES)
        if not reserved & _RESULT or group_id != self.group_id:
            return False
        index = (seq_num - self.seq_base) & 0xFFFF_FFFF
        if index >= self.nchunks:
            return False
        chunk = self._chunks[index]
        if chunk.done:
            self.duplicate_results += 1
            return True
        want = self.chunk_bytes if index != self.nchunks - 1 else self._last_bytes
        if (reserved & 0xFF00 != self._result_reserved or payload_len != want
                or len(frame) < proto.HEADERS_BYTES + payload_len):
            return False   # not a result of this chunk (a stale frame of another collective)
        at, start = index * self.chunk_bytes, proto.HEADERS_BYTES
        self._result_wire[at:at + payload_len] = frame[start:start + payload_len]
        self._result = None
        chunk.done = True
        self._progress_at = now
        self._in_flight.pop(index, None)
        self._remaining -= 1
        if self._backed_off:
            # Progress: the path works. Like TCP after a new acknowledgement, chunks still waiting start their
            # backoff again, so a chunk that waited long for a slow peer is not left on a huge timer (and the
            # retry limit counts timeouts without any progress, not the waits behind a peer's loss).
            self._backed_off.discard(index)
            rto = self.timer.rto
            for other_index in self._backed_off:
                other = self._in_flight[other_index]
                other.backoff = 0
                if now + rto < other.deadline:
                    other.deadline = now + rto
                    heapq.heappush(self._deadlines, (other.deadline, other_index))
            self._backed_off.clear()
        if chunk.retries == 0:   # Karn: a retransmitted chunk's round trip is ambiguous
            rtt = now - chunk.first_sent
            self._unsampled = 0
            self.timer.sample(rtt)
            self.rtts.append(rtt)
            if index == 0:
                self.first_rtt = rtt
        else:
            # ... but if a whole window was answered only after repeats before any round trip was measured,
            # the configured timeout is shorter than the path and Karn's rule alone would leave the timer
            # nothing to learn from (cais.rto)
            self._unsampled += 1
            if self._unsampled >= self.window and self.timer.srtt is None:
                self.timer.bound(now - chunk.first_sent)
        return True
