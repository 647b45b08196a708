"""Broadcast and all-gather of opaque blocks, reliable, without I/O: one rank's side of one collective.

Every rank of the group knows the byte length of every rank's block; the ranks in ``senders`` send theirs
(broadcast: the root only; all-gather: everyone) and every rank ends up with every sender's block.

Two transports, the same acknowledgements:

* ``via_switch``: a sender's chunk is one CAIS frame (``op_type`` BROADCAST or ALL_GATHER, dtype INT8, so
  any byte count travels; ``seq_num`` = the collective's ``op_seq``, ``chunk_id`` the chunk). The switch
  forwards it to every other port of the group's rule (docs/protocol.md): one transmission reaches all
  receivers. The sender is known by the frame's source MAC.
* host: the same chunk as a host DATA frame (:class:`~cais.protocol.HostHeader`, ``step`` = chunk,
  ``frag`` = the sender's ring index, ``frags`` = its chunk count), unicast to each receiver through the
  switch's MAC table, for groups the switch has no rule for.

Each receiver answers every copy of a chunk with a host ACK (same ``step``/``frag``) unicast to its sender.
A sender repeats a chunk that some receiver has not acknowledged after the retransmission timeout
(:class:`cais.rto.RetransmitTimer`, doubling per retry; via the switch the repeat reaches every receiver
again, duplicates are ignored); after ``retry_limit`` timeouts in a row without any acknowledgement the
engine is ``failed`` and :attr:`missing` names the receivers that never answered.

Like the ring, a rank that is :attr:`done` must keep answering (re-ACKing) repeated chunks for a while:
its last ACK may have been lost.
"""

from __future__ import annotations

import numpy as np

from . import protocol as proto
from .protocol import ETH_HEADER_BYTES, HOST_ETHERTYPE, HOST_HEADER_BYTES, HostHeader, HostKind
from .rto import RetransmitTimer

__all__ = ["ForwardGather"]

_HOST_END = ETH_HEADER_BYTES + HOST_HEADER_BYTES


class ForwardGather:
    """Rank `rank_index` of the ring `macs` in one broadcast / all-gather (module docstring).

    At most `window` chunks of this rank's block are unacknowledged at a time (the receivers' sockets and
    the switch's queues hold that much), and a round of timeouts repeats at most `burst` of them (the
    lowest first; the others wait for the next round).

    `sizes[i]` is ring index i's block length in bytes; `data` this rank's own block (bytes of
    ``sizes[rank_index]``; ignored unless this rank is in `senders`). `chunk_bytes` is the payload per
    frame (via the switch: at most its max_payload). :attr:`blocks` holds every sender's block once
    :attr:`result_ready`.
    """

    def __init__(self, rank_index: int, macs: list[int], group_id: int, op_seq: int, sizes: list[int],
                 senders, data: bytes, *, chunk_bytes: int, timeout_s: float, retry_limit: int,
                 via_switch: bool, op_type: proto.OpType = proto.OpType.ALL_GATHER, window: int = 32,
                 burst: int = 4, now: float = 0.0):
        n = len(macs)
        if len(sizes) != n or not 0 <= rank_index < n:
            raise ValueError("sizes: one per rank; rank_index in range")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes={chunk_bytes}: must be positive")
        self.rank, self.n, self.macs = rank_index, n, list(macs)
        self.group_id, self.op_seq = group_id, op_seq
        self.sizes = [int(s) for s in sizes]
        self.senders = sorted(set(int(s) for s in senders))
        self.chunk_bytes, self.retry_limit, self.via_switch = chunk_bytes, retry_limit, via_switch
        if window < 1:
            raise ValueError(f"window={window}: must be at least 1")
        self.window, self.burst = window, max(1, burst)
        self.op_type = proto.OpType(op_type)
        self.timer = RetransmitTimer(timeout_s)
        self.chunks = [-(-s // chunk_bytes) for s in self.sizes]
        if max(self.chunks, default=0) > 0xFFFF:
            raise ValueError("a block needs more than 65535 chunks (16-bit chunk field)")
        self.blocks = {i: bytearray(self.sizes[i]) for i in self.senders}
        self._got = {i: set() for i in self.senders if i != rank_index}
        self._receivers = [i for i in range(n) if i != rank_index]
        self.sending = rank_index in self.senders
        if self.sending:
            own = bytes(data)
            if len(own) != self.sizes[rank_index]:
                raise ValueError(f"data: {len(own)} bytes, sizes[{rank_index}] = {self.sizes[rank_index]}")
            self.blocks[rank_index][:] = own
        # chunk -> [receivers not yet acknowledged, deadline, timeouts in a row, first sent]
        self._unacked: dict[int, list] = {}
        self._acks: list[bytes] = []            # ACK frames owed, sent by the next poll()
        self._next = 0
        self._backoff = 0
        self.failed = False
        self.frames_sent = self.retransmissions = self.duplicates = 0
        self.started_at = now

    # ------------------------------------------------------------------ state
    @property
    def result_ready(self) -> bool:
        return all(len(self._got[i]) == self.chunks[i] for i in self._got)

    @property
    def done(self) -> bool:
        return self.result_ready and (not self.sending or (self._next == self.chunks[self.rank]
                                                           and not self._unacked))

    @property
    def missing(self) -> list[int]:
        """Ring indices that have not acknowledged every chunk of this rank's block, or whose block has not
        fully arrived here."""
        out = {r for entry in self._unacked.values() for r in entry[0]}
        out |= {i for i in self._got if len(self._got[i]) < self.chunks[i]}
        return sorted(out)

    def next_deadline(self) -> float | None:
        if self.failed or not self._unacked:
            return None
        return min(e[1] for e in self._unacked.values())

    # ------------------------------------------------------------------ frames
    def _chunk_payload(self, chunk: int) -> bytes:
        lo = chunk * self.chunk_bytes
        return bytes(self.blocks[self.rank][lo:lo + self.chunk_bytes])

    def _frames(self, chunk: int, to: list[int], retransmit: bool) -> list[bytes]:
        payload = self._chunk_payload(chunk)
        me = self.macs[self.rank]
        if self.via_switch:
            hdr = proto.CaisHeader(op_type=self.op_type, group_id=self.group_id, layer_id=self.op_seq & 0xFFFF,
                                   chunk_id=chunk, total_chunks=self.chunks[self.rank],
                                   seq_num=self.op_seq & 0xFFFF_FFFF, payload_len=len(payload),
                                   dtype=proto.DType.INT8, red_op=proto.ReduceOp.SUM,
                                   flags=int(proto.Flags.RETRANSMIT) if retransmit else 0)
            return [proto.build_frame(hdr, payload, dst=proto.result_mac(self.group_id), src=me, pad=True)]
        hdr = HostHeader(HostKind.DATA, self.group_id, self.op_seq, chunk, self.rank, self.chunks[self.rank],
                         len(payload))
        return [proto.build_host_frame(hdr, payload, dst=self.macs[r], src=me) for r in to]

    def poll(self, now: float) -> list[bytes]:
        """ACKs owed, repeats due, then the chunks the window allows."""
        out, self._acks = self._acks, []
        if self.failed:
            return out
        due = [(chunk, entry) for chunk, entry in sorted(self._unacked.items()) if now >= entry[1]]
        if due:
            # one timeout event however many chunks fell due at once: the limit counts rounds of
            # repeats without any acknowledgement in between, not chunks
            if self._backoff >= self.retry_limit:
                self.failed = True
                return out
            self._backoff += 1
        # a few repeats per round, as TCP resends the first unacknowledged segment (a whole window
        # repeated every round would only congest a slow switch further); the others wait for the next
        # round without backing off, since they were not sent again
        next_round = None
        for i, (chunk, entry) in enumerate(due):
            if i < self.burst:
                entry[2] += 1
                entry[1] = now + self.timer.timeout(entry[2])
                next_round = entry[1] if next_round is None else min(next_round, entry[1])
                out += self._frames(chunk, sorted(entry[0]), True)
                self.retransmissions += 1
        if next_round is not None:
            # every chunk still waiting waits for the next round, not only those due now: the window's
            # chunks were sent as acknowledgements came, so their deadlines are spread; each one falling due
            # alone would count as a round of its own, and a silence of one timeout (peers that start the
            # collective late) would use up the retry limit in milliseconds instead of backing off
            for entry in self._unacked.values():
                entry[1] = max(entry[1], next_round)
        if self.sending:
            while self._next < self.chunks[self.rank] and len(self._unacked) < self.window:
                chunk = self._next
                self._unacked[chunk] = [set(self._receivers), now + self.timer.timeout(0), 0, now]
                out += self._frames(chunk, self._receivers, False)
                self._next += 1
            if not self._receivers:
                self._unacked.clear()
        self.frames_sent += len(out)
        return out

    def receive(self, frame: bytes, now: float) -> bool:
        """Take a frame; True if it belonged to this collective."""
        if len(frame) < ETH_HEADER_BYTES:
            return False
        ethertype = int.from_bytes(frame[12:14], "big")
        src = int.from_bytes(frame[6:12], "big")
        if ethertype == proto.ETHERTYPE:
            f = proto.parse_frame(frame)
            h = f.cais
            if (h is None or h.op_type != self.op_type or h.group_id != self.group_id
                    or h.seq_num != self.op_seq & 0xFFFF_FFFF or h.flags & proto.Flags.RESULT):
                return False
            sender = self.macs.index(src) if src in self.macs else -1
            return self._data(sender, h.chunk_id, h.total_chunks, bytes(f.payload[:h.payload_len]))
        if ethertype != HOST_ETHERTYPE or len(frame) < _HOST_END:
            return False
        if int.from_bytes(frame[0:6], "big") != self.macs[self.rank]:
            return False
        hdr = HostHeader.unpack(frame[ETH_HEADER_BYTES:_HOST_END])
        if hdr.group_id != self.group_id or hdr.op_seq != self.op_seq:
            return False
        if hdr.kind == HostKind.DATA:
            if hdr.frag >= self.n or src != self.macs[hdr.frag]:
                return False
            return self._data(hdr.frag, hdr.step, hdr.frags, bytes(frame[_HOST_END:_HOST_END + hdr.length]))
        if hdr.kind == HostKind.ACK and hdr.frag == self.rank and src in self.macs:
            entry = self._unacked.get(hdr.step)
            if entry is not None:
                receiver = self.macs.index(src)
                if receiver in entry[0]:
                    entry[0].discard(receiver)
                    self._backoff = 0           # progress: the path works
                    if entry[2] == 0:
                        self.timer.sample(now - entry[3])
                if not entry[0]:
                    del self._unacked[hdr.step]
            return True
        return False

    def _data(self, sender: int, chunk: int, total: int, payload: bytes) -> bool:
        if sender not in self._got or total != self.chunks[sender] or chunk >= total:
            return False
        lo = chunk * self.chunk_bytes
        if len(payload) != min(self.chunk_bytes, self.sizes[sender] - lo):
            return False
        ack = HostHeader(HostKind.ACK, self.group_id, self.op_seq, chunk, sender, total, 0)
        self._acks.append(proto.build_host_frame(ack, b"", dst=self.macs[sender], src=self.macs[self.rank]))
        if chunk in self._got[sender]:
            self.duplicates += 1
            return True
        self._got[sender].add(chunk)
        self.blocks[sender][lo:lo + len(payload)] = payload
        return True

    def block(self, index: int, dtype) -> np.ndarray:
        """Ring index `index`'s block as an array of `dtype` (little-endian on the wire)."""
        return np.frombuffer(bytes(self.blocks[index]), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
