"""Header fields of a received frame, decoded in hardware from the wire bytes.

The byte layout comes from :mod:`cais.protocol` (the one definition); this module only turns it into
slices of a signal that holds the first :data:`HEADERS_BYTES` bytes of a frame, byte ``i`` at bits
``8*i .. 8*i+7`` (the AXI4-Stream byte order).
"""

from amaranth.hdl import Cat, Const

from cais import protocol as proto

__all__ = ["HEADER_BITS", "field_offsets", "be_bytes", "cais_field", "FrameHeader"]

HEADER_BITS = proto.HEADERS_BYTES * 8


def field_offsets() -> dict:
    """Byte offset in the frame and byte size of every CAIS header field."""
    offsets, at = {}, proto.ETH_HEADER_BYTES
    for name, bits in proto.HEADER_FIELDS:
        offsets[name] = (at, bits // 8)
        at += bits // 8
    return offsets


def be_bytes(hdr, offset: int, size: int):
    """The big-endian value of ``size`` bytes at frame byte ``offset`` of ``hdr``."""
    return Cat(*(hdr[8 * (offset + i):8 * (offset + i + 1)] for i in reversed(range(size))))


def cais_field(cais_hdr, name: str):
    """Field ``name`` of a 16-byte CAIS header held on its own (byte 0 = op_type at bits 0..7)."""
    offset, size = field_offsets()[name]
    return be_bytes(cais_hdr, offset - proto.ETH_HEADER_BYTES, size)


class FrameHeader:
    """Named views of the header bytes of a frame (Ethernet and CAIS fields)."""

    def __init__(self, hdr):
        self.bits = hdr
        self.dst_mac = be_bytes(hdr, 0, 6)
        self.src_mac = be_bytes(hdr, 6, 6)
        self.ethertype = be_bytes(hdr, 12, 2)
        self.is_cais = self.ethertype == Const(proto.ETHERTYPE, 16)
        for name, (offset, size) in field_offsets().items():
            setattr(self, name, be_bytes(hdr, offset, size))
        at = dict(proto.HEADER_FIELDS)["reserved"]
        for name, bits in proto.RESERVED_FIELDS:
            at -= bits
            setattr(self, name, self.reserved[at:at + bits])
        # first octet's least significant bit: group (broadcast or multicast) address
        self.dst_is_group = hdr[0]

    def cais_bytes(self):
        """The 16 CAIS header bytes, in wire order."""
        return self.bits[8 * proto.ETH_HEADER_BYTES:8 * proto.HEADERS_BYTES]
