"""Keyed seals on host frames (EtherType 0x88B6: the host ring, host-path broadcast and all-gather).

A host on a switch port can send a frame with any source MAC, and until the switch binds source MACs to
ports (docs/protocol.md, "Threat model") it forwards it like the real peer's. So a rank that holds the
controller's shared secret (``CAIS_TOKEN``) seals every host frame it sends with a 16-byte tag, the first
16 bytes of HMAC-SHA256 over the frame's Ethernet header, host header and payload, under a key of its job::

    key = HMAC-SHA256(token, "cais host frames v1\\0" + job name)
    frame = Ethernet header | host header | payload | tag (16 bytes) | padding to 60 bytes

and refuses a received host frame whose tag does not match (the sender's MAC, the collective, step and
fragment are all under the tag, so a frame cannot be moved to another collective or peer; a replayed
frame is a duplicate the engines already ignore). Every rank of a job has the token or none has it (the
controller refuses requests without it), so the ranks agree on whether frames are sealed.

Cost: 16 bytes of every host frame (the largest payload is 16 bytes smaller) and one HMAC-SHA256 per frame
sent and received (a few microseconds in CPython's C hmac, against tens of microseconds per frame of Python).
"""

from __future__ import annotations

import hashlib
import hmac

from . import protocol as proto

__all__ = ["FrameSeal", "SEAL_BYTES"]

SEAL_BYTES = 16
_LABEL = b"cais host frames v1\0"
_HOST_END = proto.ETH_HEADER_BYTES + proto.HOST_HEADER_BYTES


def _body_end(frame: bytes) -> int | None:
    """Where a host frame's payload ends (None: not a host frame, or shorter than its header says)."""
    if len(frame) < _HOST_END or int.from_bytes(frame[12:14], "big") != proto.HOST_ETHERTYPE:
        return None
    end = _HOST_END + proto.HostHeader.unpack(frame[proto.ETH_HEADER_BYTES:_HOST_END]).length
    return end if end <= len(frame) else None


class FrameSeal:
    """Seals and checks host frames under one job's key (module docstring).

    Members
    -------
    refused : int
        Host frames :meth:`open` refused (no tag or a wrong one).
    """

    def __init__(self, key: bytes):
        self._key = bytes(key)
        self.refused = 0

    @classmethod
    def for_job(cls, token: str, job: str) -> "FrameSeal":
        return cls(hmac.new(token.encode(), _LABEL + job.encode(), hashlib.sha256).digest())

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:SEAL_BYTES]

    def seal(self, frame: bytes) -> bytes:
        """A host frame with its tag (padding after it); any other frame as it is."""
        end = _body_end(frame)
        if end is None:
            return frame
        out = frame[:end] + self._tag(frame[:end])
        return out + bytes(max(0, proto.MIN_FRAME_BYTES - len(out)))

    def open(self, frame: bytes) -> bytes | None:
        """A received host frame without its tag (padded as :func:`cais.protocol.build_host_frame` pads),
        None when its tag is missing or wrong (counted); any other frame as it is."""
        end = _body_end(frame)
        if end is None:
            if len(frame) >= 14 and int.from_bytes(frame[12:14], "big") == proto.HOST_ETHERTYPE:
                self.refused += 1      # a host frame too short for what its header claims
                return None
            return frame
        if len(frame) < end + SEAL_BYTES or not hmac.compare_digest(frame[end:end + SEAL_BYTES],
                                                                      self._tag(frame[:end])):
            self.refused += 1
            return None
        body = frame[:end]
        return body + bytes(max(0, proto.MIN_FRAME_BYTES - len(body)))
