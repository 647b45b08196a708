"""The CAIS wire protocol: the one definition of the frame layout, code points and limits.

The RTL (``cais.hdl``), the reference model (``cais.sim.refmodel``), the testbenches and the driver all
import their header layout, enums and constants from here; docs/protocol.md describes the same facts.

A CAIS frame is an Ethernet II frame (no FCS on the AXI4-Stream side, no VLAN tag) whose EtherType is
:data:`ETHERTYPE`, followed by the 16-byte CAIS header and ``payload_len`` bytes of big-endian elements::

    offset  size  field
    0       6     destination MAC
    6       6     source MAC
    12      2     EtherType = 0x88B5
    14      16    CAIS header (see HEADER_FIELDS)
    30      n     payload (n = payload_len)
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field, replace

__all__ = [
    "ETHERTYPE", "ETH_HEADER_BYTES", "CAIS_HEADER_BYTES", "HEADERS_BYTES", "MIN_FRAME_BYTES",
    "MAX_FRAME_BYTES", "BROADCAST_MAC", "SWITCH_MAC_DEFAULT",
    "OpType", "DType", "ReduceOp", "Flags", "DropReason", "CHECK_ORDER",
    "HEADER_FIELDS", "RESERVED_FIELDS", "HEADER_STRUCT", "header_dtype", "CaisHeader", "EthHeader", "Frame",
    "ELEMENT_BYTES", "INTEGER_DTYPES", "FLOAT_DTYPES", "SUPPORTED_DTYPES", "supported_dtypes", "SUPPORTED_OPS",
    "result_mac", "mac_to_bytes", "mac_to_str", "build_frame", "parse_frame",
    "numpy_dtype", "HOST_ETHERTYPE", "HostKind", "HOST_HEADER_FIELDS", "HOST_HEADER_BYTES", "HostHeader",
    "build_host_frame",
]

# IEEE 802 "Local Experimental EtherType 1" (IEEE Std 802-2014, 9.2.2): free for experiments, never
# assigned to a product protocol, so CAIS cannot collide with real traffic.
ETHERTYPE = 0x88B5

ETH_HEADER_BYTES = 14
CAIS_HEADER_BYTES = 16
HEADERS_BYTES = ETH_HEADER_BYTES + CAIS_HEADER_BYTES  # payload starts here (byte 30)
# Shortest Ethernet frame without FCS: a shorter CAIS frame arrives padded to this length.
MIN_FRAME_BYTES = 60
# Longest untagged Ethernet frame without FCS; longer frames are dropped as OVERSIZE.
MAX_FRAME_BYTES = 1514

BROADCAST_MAC = 0xFF_FF_FF_FF_FF_FF
# Locally administered unicast address the switch uses as source of the frames it originates.
SWITCH_MAC_DEFAULT = 0x02_CA_15_00_00_00
# Result frames go to a locally administered multicast address carrying the group: 03:ca:15:00:00:<group>.
RESULT_MAC_BASE = 0x03_CA_15_00_00_00


class OpType(enum.IntEnum):
    """The collective a frame belongs to (header byte 0)."""
    ALL_REDUCE = 0
    ALL_GATHER = 1
    BROADCAST = 2
    REDUCE_SCATTER = 3  # reserved: not implemented by the switch yet, dropped as BAD_CODE


class DType(enum.IntEnum):
    """Element type of the payload (high nibble of header byte 14). Elements are big-endian."""
    INT32 = 0
    INT16 = 1
    INT8 = 2
    FP32 = 3
    FP16 = 4
    BF16 = 5


class ReduceOp(enum.IntEnum):
    """Reduction operator (low nibble of header byte 14)."""
    SUM = 0
    MAX = 1
    MIN = 2


class Flags(enum.IntFlag):
    """Header byte 15. Bits not listed here must be zero."""
    RESULT = 0x01       # set by the switch on the frames it originates (results and re-sent results)
    RETRANSMIT = 0x02   # set by a worker on a repeated contribution; the switch treats it as informational


ELEMENT_BYTES = {DType.INT32: 4, DType.INT16: 2, DType.INT8: 1, DType.FP32: 4, DType.FP16: 2, DType.BF16: 2}
INTEGER_DTYPES = (DType.INT32, DType.INT16, DType.INT8)
FLOAT_DTYPES = (DType.FP32, DType.FP16, DType.BF16)
# Every element type the switch can reduce; a switch built without float units (SwitchParams.float_units)
# reduces INTEGER_DTYPES only and drops the float codes as BAD_CODE.
SUPPORTED_DTYPES = INTEGER_DTYPES + FLOAT_DTYPES
SUPPORTED_OPS = (OpType.ALL_REDUCE, OpType.ALL_GATHER, OpType.BROADCAST)


def supported_dtypes(float_units: bool) -> tuple[DType, ...]:
    """The element types a switch reduces: with or without its float units."""
    return SUPPORTED_DTYPES if float_units else INTEGER_DTYPES


_WIRE_TYPES = {DType.INT32: ">i4", DType.INT16: ">i2", DType.INT8: "i1", DType.FP32: ">f4", DType.FP16: ">f2",
               DType.BF16: ">u2"}
_NUMPY_DTYPES: dict = {}


def numpy_dtype(dtype: DType):
    """The numpy dtype (big-endian, as on the wire) of a payload element; bf16 as its raw 16 bits."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:            # once per type (every frame's payload asks)
        import numpy as np
        found = _NUMPY_DTYPES[dtype] = np.dtype(_WIRE_TYPES[DType(dtype)])
    return found


class DropReason(enum.IntEnum):
    """Why the switch dropped a frame. Each reason has its own counter.

    Checks run in this order and the first that fails names the reason. The first seven are decided by
    the ingress parser from the frame alone; the rest by the switch core from its tables and slot state
    (NO_ROUTE ends either path: an ordinary frame's MAC lookup, or a forwarded collective's result ports).
    Codes are never renumbered: a reason added later takes the next free value, and :data:`CHECK_ORDER`
    gives the order the checks run in.
    """
    BAD_FCS = 0          # the MAC flagged the frame bad: tuser high on its last beat (an FCS error)
    BAD_FRAMING = 1      # tkeep of a beat before tlast is not all ones, or the last beat's tkeep is not contiguous from byte 0
    OVERSIZE = 2         # frame longer than MAX_FRAME_BYTES
    RUNT = 3             # shorter than its headers: < 14 bytes, or a CAIS frame < 30 bytes
    BAD_CODE = 4         # unknown or unsupported op_type, dtype, red_op, or a flag bit that must be zero is set
    BAD_PAYLOAD_LEN = 5  # payload_len is 0, above the switch's max payload, or not a whole number of elements
    BAD_LENGTH = 6       # frame length differs from 30 + payload_len (padding to 60 bytes allowed)
    NO_RULE = 7          # no valid rule matches (group_id, layer_id, chunk_id)
    FOREIGN_PORT = 8     # the ingress port is not one of the rule's contributors
    TYPE_MISMATCH = 9    # an all-reduce frame's dtype or red_op differs from its rule's
    PAYLOAD_TOO_LONG = 10  # never counted: every set holds max_payload (kept so codes and counters stay put)
    BAD_SLOT = 11        # the rule's quota maps the chunk outside the slot memory
    TAG_MISMATCH = 12    # the slot set is busy with another chunk (its seq_num differs)
    LENGTH_MISMATCH = 13  # the slot set holds this chunk, but the frame's payload_len differs from the set's
    NO_ROUTE = 14        # the frame's destination set, without the ingress port, is empty
    SPOOFED_SOURCE = 15  # the source MAC is in the MAC table bound to another port than the ingress port


#: The drop reasons in the order the checks run (the first that fails names the reason): the parser's, then
#: the source binding, then the core's rule and slot checks.
CHECK_ORDER = tuple(sorted(DropReason, key=lambda r: (r > DropReason.BAD_LENGTH,
                                                      r != DropReason.SPOOFED_SOURCE, r)))


PARSER_DROPS = tuple(r for r in DropReason if r <= DropReason.BAD_LENGTH)


# The CAIS header, in wire order: (name, bits). Big-endian, 16 bytes in all.
# payload_len and the reserved word are 16 bits each: a frame's payload never exceeds 65535 bytes.
HEADER_FIELDS = (
    ("op_type", 8),
    ("group_id", 8),
    ("layer_id", 16),
    ("chunk_id", 16),
    ("total_chunks", 16),
    ("seq_num", 32),
    ("payload_len", 16),
    ("reserved", 16),
)
# The reserved word's split, from its most significant bit down: (name, bits).
RESERVED_FIELDS = (
    ("dtype", 4),
    ("red_op", 4),
    ("flags", 8),
)
assert sum(b for _, b in HEADER_FIELDS) == CAIS_HEADER_BYTES * 8
assert sum(b for _, b in RESERVED_FIELDS) == dict(HEADER_FIELDS)["reserved"]

_HEADER_STRUCT = struct.Struct(">BBHHHIHH")
assert _HEADER_STRUCT.size == CAIS_HEADER_BYTES
#: The header's fields in wire order, as ``struct`` packs them (the reserved word whole); for code that packs
#: or reads headers in place, once per frame, without a :class:`CaisHeader`.
HEADER_STRUCT = _HEADER_STRUCT


def header_dtype():
    """The header as a numpy structured dtype (big-endian fields of :data:`HEADER_FIELDS`, 16 bytes): for
    code that packs the headers of many frames at once."""
    import numpy as np
    return np.dtype([(name, f">u{bits // 8}") for name, bits in HEADER_FIELDS])


def _pack_reserved(dtype: int, red_op: int, flags: int) -> int:
    return (int(dtype) << 12) | (int(red_op) << 8) | int(flags)


@dataclass(frozen=True)
class CaisHeader:
    op_type: int = OpType.ALL_REDUCE
    group_id: int = 0
    layer_id: int = 0
    chunk_id: int = 0
    total_chunks: int = 1
    seq_num: int = 0
    payload_len: int = 0
    dtype: int = DType.INT32
    red_op: int = ReduceOp.SUM
    flags: int = 0

    @property
    def reserved(self) -> int:
        return _pack_reserved(self.dtype, self.red_op, self.flags)

    def pack(self) -> bytes:
        return _HEADER_STRUCT.pack(int(self.op_type), self.group_id, self.layer_id, self.chunk_id,
                                   self.total_chunks, self.seq_num, self.payload_len, self.reserved)

    @classmethod
    def unpack(cls, data: bytes) -> "CaisHeader":
        op, grp, layer, chunk, total, seq, plen, res = _HEADER_STRUCT.unpack(bytes(data[:CAIS_HEADER_BYTES]))
        return cls(op, grp, layer, chunk, total, seq, plen, res >> 12, (res >> 8) & 0xF, res & 0xFF)

    def replace(self, **kw) -> "CaisHeader":
        return replace(self, **kw)


@dataclass(frozen=True)
class EthHeader:
    dst: int
    src: int
    ethertype: int

    def pack(self) -> bytes:
        return mac_to_bytes(self.dst) + mac_to_bytes(self.src) + self.ethertype.to_bytes(2, "big")

    @classmethod
    def unpack(cls, data: bytes) -> "EthHeader":
        data = bytes(data)
        return cls(int.from_bytes(data[0:6], "big"), int.from_bytes(data[6:12], "big"),
                   int.from_bytes(data[12:14], "big"))


def mac_to_bytes(mac: int) -> bytes:
    return int(mac).to_bytes(6, "big")


def mac_to_str(mac: int) -> str:
    return ":".join(f"{b:02x}" for b in mac_to_bytes(mac))


def result_mac(group_id: int) -> int:
    """Destination MAC of the result frames of a group."""
    return RESULT_MAC_BASE | (group_id & 0xFF)


def build_frame(hdr: CaisHeader, payload: bytes, dst: int = BROADCAST_MAC, src: int = 0x02_00_00_00_00_01,
                pad: bool = False) -> bytes:
    """A CAIS frame as bytes (what goes on one AXI4-Stream port). `pad` pads to MIN_FRAME_BYTES."""
    frame = EthHeader(dst, src, ETHERTYPE).pack() + hdr.pack() + bytes(payload)
    if pad and len(frame) < MIN_FRAME_BYTES:
        frame += bytes(MIN_FRAME_BYTES - len(frame))
    return frame


@dataclass(frozen=True)
class Frame:
    """A frame taken apart: Ethernet header, and for CAIS frames the CAIS header and payload."""
    eth: EthHeader
    cais: CaisHeader | None = None
    payload: bytes = field(default=b"")


def parse_frame(data: bytes) -> Frame:
    """Take a frame apart without validating it (the switch's checks live in the reference model)."""
    data = bytes(data)
    eth = EthHeader.unpack(data)
    if eth.ethertype != ETHERTYPE or len(data) < HEADERS_BYTES:
        return Frame(eth, None, data[ETH_HEADER_BYTES:])
    hdr = CaisHeader.unpack(data[ETH_HEADER_BYTES:])
    return Frame(eth, hdr, data[HEADERS_BYTES:HEADERS_BYTES + hdr.payload_len])


# ---------------------------------------------------------------- host-side fallback frames
# When a collective stays on the hosts (the controller's decision, or a chunk that ran out of retries),
# the ranks run a ring all-reduce whose frames are ordinary traffic for the switch: EtherType 0x88B6
# (IEEE 802 Local Experimental EtherType 2), unicast host to host through the MAC table.
HOST_ETHERTYPE = 0x88B6


class HostKind(enum.IntEnum):
    DATA = 0   # a fragment of a ring step's block
    ACK = 1    # acknowledges one DATA fragment (same group_id, op_seq, step, frag)


# The host fallback header, in wire order after the Ethernet header: (name, bits). Big-endian, 16 bytes.
HOST_HEADER_FIELDS = (
    ("kind", 8),       # HostKind
    ("group_id", 8),
    ("op_seq", 32),    # which collective of the group (counts from 0 per group, same on every rank)
    ("step", 16),      # ring step: 0 .. N-2 reduce-scatter, N-1 .. 2N-3 all-gather
    ("frag", 16),      # fragment of the step's block
    ("frags", 16),     # fragments in the step's block
    ("length", 16),    # payload bytes in this frame
    ("reserved", 16),  # zero
)
HOST_HEADER_BYTES = 16
assert sum(b for _, b in HOST_HEADER_FIELDS) == HOST_HEADER_BYTES * 8
_HOST_STRUCT = struct.Struct(">BBIHHHHH")


@dataclass(frozen=True)
class HostHeader:
    kind: int = HostKind.DATA
    group_id: int = 0
    op_seq: int = 0
    step: int = 0
    frag: int = 0
    frags: int = 1
    length: int = 0

    def pack(self) -> bytes:
        return _HOST_STRUCT.pack(int(self.kind), self.group_id, self.op_seq, self.step, self.frag, self.frags,
                                 self.length, 0)

    @classmethod
    def unpack(cls, data: bytes) -> "HostHeader":
        kind, grp, op_seq, step, frag, frags, length, _ = _HOST_STRUCT.unpack(bytes(data[:HOST_HEADER_BYTES]))
        return cls(kind, grp, op_seq, step, frag, frags, length)


def build_host_frame(hdr: HostHeader, payload: bytes, dst: int, src: int) -> bytes:
    """A host fallback frame, padded to the Ethernet minimum."""
    frame = EthHeader(dst, src, HOST_ETHERTYPE).pack() + hdr.pack() + bytes(payload)
    return frame + bytes(max(0, MIN_FRAME_BYTES - len(frame)))
