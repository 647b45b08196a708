"""Host-side fallback: a loss-tolerant ring all-reduce engine for one rank and one collective.

When a collective does not go through the switch (the controller's decision, or a chunk that ran out of
retries), the ranks finish it among themselves with a ring all-reduce. Its frames are ordinary Ethernet
traffic for the switch (EtherType :data:`~cais.protocol.HOST_ETHERTYPE`, header
:class:`~cais.protocol.HostHeader`, built with :func:`~cais.protocol.build_host_frame`), unicast rank to
rank through the switch's MAC table. docs/ring.md describes the schedule and the reliability rules.

The engine is sans-IO: it never reads a clock, sleeps, or touches a socket. The caller drives it::

    eng = RingAllReduce(rank, macs, group_id, op_seq, data, ReduceOp.SUM, macs[rank], timeout_s, now=t)
    while not eng.done:
        send(eng.poll(t))                   # frames to transmit now
        ... wait for a frame or until eng.next_deadline() ...
        eng.receive(frame, t)               # then poll() again: receive() may owe ACKs

Given the same sequence of calls with the same arguments the engine emits byte-identical frames.

Arithmetic: for the switch's wire types (``dtype``: int32, int16, int8, fp32, fp16, bf16 as uint16 bits)
every reduction is :func:`cais.numerics.combine`, rounded to the wire format at every step, as the partial
sums travel in it. Block ``b`` of the result is the left fold of the contributions in ring order starting
at ring index ``b``: ``((x_b op x_(b+1)) op ...) op x_(b-1)`` (the travelling partial is the stored
operand, the receiver's own contribution the incoming one). Other numpy types (float64, ...) are reduced
with numpy's ufuncs.

``reproducible=True`` runs an **all-gather of the contributions** instead (N-1 steps, each carrying one
rank's whole array) and then every rank folds them locally in ``fold_order`` (default: ring order) with
:func:`cais.numerics.accumulate` and :func:`cais.numerics.result_values` (``acc_fp32``, ``saturate``), as
a reproducible switch rule folds its ports' contributions: the same bits, whatever the timing. It sends
(N-1)·D bytes per rank instead of 2(N-1)·D/N.

A rank that is :attr:`~RingAllReduce.done` must still answer its predecessor: the ACK of the
predecessor's last fragment may have been lost, and only this engine can re-ACK it. Keep feeding the
engine the frames of its (group_id, op_seq) until the predecessor is known to be done (for example when
its first frame of the group's next collective arrives, if ranks start a collective only after the
previous one is done).
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from . import numerics
from .protocol import (ETH_HEADER_BYTES, HOST_ETHERTYPE, HOST_HEADER_BYTES, DType, EthHeader, HostHeader,
                       HostKind, ReduceOp, build_host_frame)
from .rto import RetransmitTimer

__all__ = ["RingAllReduce", "block_bounds", "MAX_BACKOFF", "DEFAULT_MAX_PAYLOAD", "DEFAULT_WINDOW"]

# Payload bytes per frame by default: a full 1514-byte untagged frame (14 + 16 + 1484).
DEFAULT_MAX_PAYLOAD = 1500 - HOST_HEADER_BYTES
# The RTO backs off (doubles per expiry) up to this multiple of the configured timeout.
MAX_BACKOFF = 64
# DATA fragments a rank has sent and not yet had acknowledged, at most (docs/ring.md, "Window"). The
# queue a window builds at the rank's port must stay inside the retransmission timer: 16 full frames are
# 19 us at 10 Gb/s (the simulated switch's 8-byte ports at 156.25 MHz) and 194 us at 1 Gb/s, against the
# default 100 us timer (which backs off and learns the longer round trip at 1 Gb/s, cais.rto).
DEFAULT_WINDOW = 16

_HDR_END = ETH_HEADER_BYTES + HOST_HEADER_BYTES  # payload starts here (byte 30)


def block_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """[start, stop) of the n contiguous blocks of an array of `length` elements (np.array_split rule:
    the first ``length % n`` blocks have one element more)."""
    q, rem = divmod(length, n)
    out, start = [], 0
    for i in range(n):
        stop = start + q + (1 if i < rem else 0)
        out.append((start, stop))
        start = stop
    return out


class RingAllReduce:
    """Ring all-reduce of one 1-D array for rank `rank_index` of the ring `ring_macs` (see module doc).

    Step s (0 <= s < 2(N-1)): rank r sends block ``(r - s) mod N`` to rank ``(r + 1) mod N``; steps
    0..N-2 are the reduce-scatter (the receiver reduces the block into its copy), steps N-1..2N-3 the
    all-gather (the receiver stores it). Rank r sends step s only after it has applied all of step s-1.

    `dtype` is the wire type of the values (default: the array's, for int32/int16/int8/float32/float16;
    bf16 bits as a uint16 array need ``dtype=DType.BF16``; other numpy types use numpy's ufuncs).
    `saturate` clamps integer sums. With `reproducible` the N blocks are the ranks' whole contributions,
    only all-gathered (steps 0..N-2), and the result is their fold in `fold_order` (ring indices; default
    0..N-1) with fp32 accumulation if `acc_fp32`. With `reduce_scatter` only steps 0..N-2 run: the rank
    then holds the reduction of block :attr:`owned_block` (``(rank_index + 1) mod N``) only.
    """

    def __init__(self, rank_index: int, ring_macs: list[int], group_id: int, op_seq: int, data: np.ndarray,
                 op: ReduceOp, my_mac: int, timeout_s: float, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 now: float = 0.0, *, dtype: DType | None = None, saturate: bool = False,
                 reproducible: bool = False, acc_fp32: bool = False, fold_order: list[int] | None = None,
                 reduce_scatter: bool = False, window: int = DEFAULT_WINDOW):
        n = len(ring_macs)
        if n < 1:
            raise ValueError("ring_macs: the ring needs at least one rank")
        if len(set(ring_macs)) != n:
            raise ValueError("ring_macs: every rank needs its own MAC address")
        if not 0 <= rank_index < n:
            raise ValueError(f"rank_index={rank_index}: must be in 0..{n - 1}")
        if my_mac != ring_macs[rank_index]:
            raise ValueError("my_mac must be ring_macs[rank_index] (the successor accepts DATA only from it)")
        if 2 * (n - 1) > 1 << 16:
            raise ValueError(f"{n} ranks: the 16-bit step field allows at most 32768")
        if not 0 <= group_id < 1 << 8:
            raise ValueError(f"group_id={group_id}: must fit 8 bits")
        if not 0 <= op_seq < 1 << 32:
            raise ValueError(f"op_seq={op_seq}: must fit 32 bits")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s}: must be positive")
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"window={window!r}: must be an integer of at least 1 (fragments in flight)")
        self.window = window
        self.op = ReduceOp(op)
        arr = np.asarray(data)
        if arr.ndim != 1:
            raise ValueError(f"data: must be 1-D, has shape {arr.shape}")
        native = arr.dtype.newbyteorder("=")
        if dtype is None:
            dtype = numerics.wire_dtype(native)
        elif numerics.native_dtype(dtype) != native:
            raise TypeError(f"dtype={DType(dtype).name}: the values must be a {numerics.native_dtype(dtype)} "
                            f"array, not {arr.dtype}")
        self.dtype = None if dtype is None else DType(dtype)
        self.saturate = bool(saturate)
        self.acc_fp32 = bool(acc_fp32)
        self.reproducible = bool(reproducible)
        if self.reproducible and self.dtype is None:
            raise TypeError(f"reproducible: needs a wire type (int32, int16, int8, fp32, fp16, bf16), not {arr.dtype}")
        self.fold_order = list(range(n)) if fold_order is None else [int(i) for i in fold_order]
        if sorted(self.fold_order) != list(range(n)):
            raise ValueError(f"fold_order={fold_order}: must be a permutation of 0..{n - 1}")
        self.length = len(arr)
        # Work on a private copy in native byte order; the wire carries big-endian elements. Reproducible:
        # room for every rank's contribution, block i = ring index i's, ours in place.
        if self.reproducible:
            self._buf = np.zeros(n * self.length, dtype=native)
            self._buf[rank_index * self.length:(rank_index + 1) * self.length] = arr
        else:
            self._buf = arr.astype(native, copy=True)
        self._wire = self._buf.dtype.newbyteorder(">")
        self._folded: np.ndarray | None = None
        self._item = self._buf.dtype.itemsize
        if max_payload > 0xFFFF:
            raise ValueError(f"max_payload={max_payload}: the 16-bit length field allows at most 65535")
        self._frag_elems = max_payload // self._item
        if self._frag_elems < 1:
            raise ValueError(f"max_payload={max_payload}: smaller than one {self._buf.dtype} element")

        self.rank = rank_index
        self.n = n
        self.group_id = group_id
        self.op_seq = op_seq
        self.my_mac = my_mac
        self.timeout_s = float(timeout_s)
        self.timer = RetransmitTimer(self.timeout_s, MAX_BACKOFF)
        self.pred_mac = ring_macs[(rank_index - 1) % n]
        self.succ_mac = ring_macs[(rank_index + 1) % n]
        if reduce_scatter and self.reproducible:
            raise ValueError("reduce_scatter: not with reproducible (which all-gathers contributions)")
        self.reduce_scatter = bool(reduce_scatter)
        self.steps = (n - 1) if self.reproducible or self.reduce_scatter else 2 * (n - 1)
        if self.reproducible:
            self._bounds = [(i * self.length, (i + 1) * self.length) for i in range(n)]
        else:
            self._bounds = block_bounds(len(self._buf), n)
        self._frags = [self._frag_count(b) for b in range(n)]
        if max(self._frags) > 0xFFFF:
            raise ValueError("data: a block needs more than 65535 fragments (16-bit frags field)")

        # Sending side.
        self._send_step = 0        # next own step to send
        self._pending: dict[tuple[int, int], list] = {}  # (step, frag) -> [frame, deadline, retries, sent]
        self._unsent: deque[tuple[int, int, bytes]] = deque()  # (step, frag, frame) waiting for the window
        self._timers: list[tuple[float, int, int]] = []  # heap of (deadline, step, frag); stale entries skipped
        self._acks: list[bytes] = []  # ACK frames owed, sent by the next poll()
        self._backed_off_until = now  # the RTO backs off at most once in this long (cais.rto)
        # Receiving side.
        self._recv_step = 0        # steps 0.._recv_step-1 are applied completely
        self._got: list[set[int]] = [set() for _ in range(self.steps)]  # fragments received per step
        self._held: dict[int, dict[int, bytes]] = {}  # future step -> frag -> payload, applied in order
        self._missing = self._frags_of_recv_step(0) if self.steps else 0

        self.frames_sent = 0
        self.bytes_sent = 0
        self.retransmissions = 0
        self.acks_sent = 0
        self.duplicates_received = 0
        self.started_at = now  # informational: the engine reads time only from poll()

    # ------------------------------------------------------------------ public state
    @property
    def result_ready(self) -> bool:
        """This rank holds the full all-reduced array."""
        return self._recv_step == self.steps

    @property
    def owned_block(self) -> int:
        """The block this rank holds fully reduced after the reduce-scatter steps."""
        return (self.rank + 1) % self.n

    @property
    def done(self) -> bool:
        """The result is ready and every DATA fragment this rank sent has been acknowledged."""
        return self.result_ready and self._send_step == self.steps and not self._pending and not self._unsent

    @property
    def result(self) -> np.ndarray:
        """The all-reduced array (native byte order, the input's dtype)."""
        if not self.result_ready:
            raise RuntimeError("result: the ring all-reduce has not finished on this rank")
        if not self.reproducible:
            return self._buf
        if self._folded is None:
            acc = None
            for i in self.fold_order:
                acc = numerics.accumulate(self.dtype, self.op, acc, self._buf[i * self.length:(i + 1) * self.length],
                                          acc_fp32=self.acc_fp32, saturate=self.saturate)
            self._folded = np.asarray(numerics.result_values(self.dtype, acc, acc_fp32=self.acc_fp32),
                                      dtype=self._buf.dtype)
        return self._folded

    def next_deadline(self) -> float | None:
        """Earliest retransmission time of an unacknowledged DATA fragment, None if none is pending."""
        self._drop_stale_timers()
        return self._timers[0][0] if self._timers else None

    # ------------------------------------------------------------------ driving
    def poll(self, now: float) -> list[bytes]:
        """Frames to transmit now: owed ACKs, expired retransmissions, then newly allowed DATA (as far as the
        window allows: a fragment's timer starts when it is handed out here)."""
        out = self._acks
        self._acks = []
        expired = []
        self._drop_stale_timers()
        while self._timers and self._timers[0][0] <= now:  # in (deadline, step, frag) order: deterministic
            expired.append(heapq.heappop(self._timers))
            self._drop_stale_timers()
        if expired and now >= self._backed_off_until:     # once per RTO, however many fragments expired
            self.timer.back_off()
            self._backed_off_until = now + self.timer.rto
        for _, step, frag in expired:               # repeated after the (backed-off) RTO: RFC 6298 5.4-5.6
            p = self._pending[(step, frag)]
            p[2] += 1
            p[1] = now + self.timer.rto
            heapq.heappush(self._timers, (p[1], step, frag))
            out.append(p[0])
            self.retransmissions += 1
        while self._send_step < self.steps and self._recv_step >= self._send_step:
            self._queue_data_step(self._send_step)
            self._send_step += 1
        deadline = now + self.timer.rto
        while self._unsent and len(self._pending) < self.window:
            step, frag, frame = self._unsent.popleft()
            self._pending[(step, frag)] = [frame, deadline, 0, now]
            heapq.heappush(self._timers, (deadline, step, frag))
            out.append(frame)
        self.frames_sent += len(out)
        self.bytes_sent += sum(len(f) for f in out)
        return out

    def receive(self, frame: bytes, now: float) -> bool:
        """Take a frame in. Returns True if it was a DATA or ACK frame of this collective (consumed),
        False for anything else (other EtherType, destination, group, op_seq, malformed): ignored."""
        if len(frame) < _HDR_END:
            return False
        eth = EthHeader.unpack(frame[:ETH_HEADER_BYTES])
        if eth.ethertype != HOST_ETHERTYPE or eth.dst != self.my_mac:
            return False
        hdr = HostHeader.unpack(frame[ETH_HEADER_BYTES:_HDR_END])
        if hdr.group_id != self.group_id or hdr.op_seq != self.op_seq or hdr.step >= self.steps:
            return False
        if hdr.kind == HostKind.DATA:
            return self._on_data(eth, hdr, frame, now)
        if hdr.kind == HostKind.ACK:
            if eth.src != self.succ_mac or hdr.length != 0:
                return False
            p = self._pending.pop((hdr.step, hdr.frag), None)  # unknown or repeated ACKs are harmless
            if p is not None and p[2] == 0:   # Karn: only fragments sent once give a round trip
                self.timer.sample(now - p[3])
            return True
        return False

    # ------------------------------------------------------------------ internals
    def _drop_stale_timers(self) -> None:
        """Pop heap entries of acknowledged fragments or superseded deadlines off the top."""
        timers, pending = self._timers, self._pending
        while timers:
            deadline, step, frag = timers[0]
            p = pending.get((step, frag))
            if p is not None and p[1] == deadline:
                return
            heapq.heappop(timers)

    def _frag_count(self, block: int) -> int:
        start, stop = self._bounds[block]
        return max(1, -(-(stop - start) // self._frag_elems))  # an empty block is one empty fragment

    def _frag_range(self, block: int, frag: int) -> tuple[int, int]:
        start, stop = self._bounds[block]
        lo = start + frag * self._frag_elems
        return lo, min(stop, lo + self._frag_elems)

    def _send_block(self, step: int) -> int:
        return (self.rank - step) % self.n

    def _recv_block(self, step: int) -> int:
        return (self.rank - 1 - step) % self.n

    def _frags_of_recv_step(self, step: int) -> int:
        return self._frags[self._recv_block(step)]

    def _queue_data_step(self, step: int) -> None:
        block = self._send_block(step)
        frags = self._frags[block]
        for frag in range(frags):
            lo, hi = self._frag_range(block, frag)
            payload = self._buf[lo:hi].astype(self._wire).tobytes()  # a snapshot: later stores can't change it
            hdr = HostHeader(HostKind.DATA, self.group_id, self.op_seq, step, frag, frags, len(payload))
            self._unsent.append((step, frag, build_host_frame(hdr, payload, dst=self.succ_mac, src=self.my_mac)))

    def _on_data(self, eth: EthHeader, hdr: HostHeader, frame: bytes, now: float) -> bool:
        if eth.src != self.pred_mac:
            return False
        block = self._recv_block(hdr.step)
        frags = self._frags[block]
        if hdr.frags != frags or hdr.frag >= frags:
            return False
        lo, hi = self._frag_range(block, hdr.frag)
        if hdr.length != (hi - lo) * self._item or len(frame) < _HDR_END + hdr.length:
            return False
        # ACK every copy: the first ACK may have been lost.
        ack = HostHeader(HostKind.ACK, self.group_id, self.op_seq, hdr.step, hdr.frag, hdr.frags, 0)
        self._acks.append(build_host_frame(ack, b"", dst=self.pred_mac, src=self.my_mac))
        self.acks_sent += 1
        got = self._got[hdr.step]
        if hdr.frag in got:
            self.duplicates_received += 1  # already applied (or held): reductions are not idempotent
            return True
        got.add(hdr.frag)
        payload = bytes(frame[_HDR_END:_HDR_END + hdr.length])  # `length` cuts off the Ethernet padding
        if hdr.step == self._recv_step:
            self._apply(hdr.step, hdr.frag, payload)
            self._missing -= 1
            self._advance()
        else:  # a later step (earlier ones are complete, so their fragments were duplicates)
            self._held.setdefault(hdr.step, {})[hdr.frag] = payload
        return True

    def _advance(self) -> None:
        while self._missing == 0 and self._recv_step < self.steps:
            self._recv_step += 1
            if self._recv_step == self.steps:
                break
            self._missing = self._frags_of_recv_step(self._recv_step)
            for frag, payload in sorted(self._held.pop(self._recv_step, {}).items()):
                self._apply(self._recv_step, frag, payload)
                self._missing -= 1

    def _apply(self, step: int, frag: int, payload: bytes) -> None:
        lo, hi = self._frag_range(self._recv_block(step), frag)
        if hi == lo:
            return
        vals = np.frombuffer(payload, dtype=self._wire).astype(self._buf.dtype)
        dst = self._buf[lo:hi]
        if self.reproducible or step >= self.n - 1:   # all-gather: the block is final, store it
            dst[...] = vals
        elif self.dtype is not None:   # reduce-scatter: the travelling partial (op) our contribution
            dst[...] = numerics.combine(self.dtype, self.op, vals, dst, self.saturate)
        elif self.op == ReduceOp.SUM:  # other numpy types: numpy's own arithmetic (integer SUM wraps)
            np.add(dst, vals, out=dst)
        elif self.op == ReduceOp.MAX:
            np.maximum(dst, vals, out=dst)
        else:
            np.minimum(dst, vals, out=dst)
