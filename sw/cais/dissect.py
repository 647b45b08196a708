"""Scapy layers for the two CAIS frame formats: the switch's CAIS header and the host ring's header.

::

    from scapy.all import rdpcap
    import cais.dissect                    # binds both layers to their EtherTypes
    for pkt in rdpcap("port0.pcap"):
        if cais.dissect.Cais in pkt:
            print(pkt[cais.dissect.Cais].seq_num)

The layers are written from the documented field widths (docs/protocol.md, section 2, and docs/ring.md),
not from :data:`cais.protocol.HEADER_FIELDS`: tests/test_protocol.py checks one against the other, so a
mistake in either shows up as a disagreement. The EtherTypes come from :mod:`cais.protocol` (one
definition). The Lua dissector wireshark/cais.lua decodes the same two headers in Wireshark and tshark.
Needs scapy (the [test] extra, or ``pip install scapy``).

Members
-------
Cais : scapy Packet
    The 16-byte CAIS header (EtherType :data:`cais.protocol.ETHERTYPE`), then the payload.
CaisHost : scapy Packet
    The 16-byte host-ring header (EtherType :data:`cais.protocol.HOST_ETHERTYPE`), then the payload.
"""

from __future__ import annotations

from scapy.fields import BitEnumField, BitField, ByteEnumField, ByteField, FlagsField, IntField, ShortField
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from .protocol import ETHERTYPE, HOST_ETHERTYPE, DType, HostKind, OpType, ReduceOp

__all__ = ["Cais", "CaisHost", "FLAG_NAMES"]

# Flag bits of header byte 15, least significant first (cais.protocol.Flags: RESULT 0x01, RETRANSMIT 0x02)
FLAG_NAMES = ["RESULT", "RETRANSMIT", "b2", "b3", "b4", "b5", "b6", "b7"]


def _names(enum) -> dict:
    return {int(m): m.name for m in enum}


class Cais(Packet):
    """The CAIS header: 16 bytes, big-endian (docs/protocol.md)."""
    name = "CAIS"
    fields_desc = [
        ByteEnumField("op_type", 0, _names(OpType)),      # header byte 0
        ByteField("group_id", 0),                          # 1
        ShortField("layer_id", 0),                         # 2..3
        ShortField("chunk_id", 0),                         # 4..5
        ShortField("total_chunks", 1),                     # 6..7
        IntField("seq_num", 0),                            # 8..11
        ShortField("payload_len", 0),                      # 12..13
        BitEnumField("dtype", 0, 4, _names(DType)),        # 14, high nibble
        BitEnumField("red_op", 0, 4, _names(ReduceOp)),    # 14, low nibble
        FlagsField("flags", 0, 8, FLAG_NAMES),             # 15
    ]

    def extract_padding(self, s):
        # the payload is payload_len bytes; what follows is Ethernet padding to 60 bytes
        return s[:self.payload_len], s[self.payload_len:]


class CaisHost(Packet):
    """The host ring's header: 16 bytes, big-endian (docs/ring.md)."""
    name = "CAIS host ring"
    fields_desc = [
        ByteEnumField("kind", 0, _names(HostKind)),        # frame byte 14
        ByteField("group_id", 0),                          # 15
        IntField("op_seq", 0),                             # 16..19
        ShortField("step", 0),                             # 20..21
        ShortField("frag", 0),                             # 22..23
        ShortField("frags", 1),                            # 24..25
        ShortField("length", 0),                           # 26..27
        BitField("reserved", 0, 16),                       # 28..29
    ]

    def extract_padding(self, s):
        return s[:self.length], s[self.length:]


bind_layers(Ether, Cais, type=ETHERTYPE)
bind_layers(Ether, CaisHost, type=HOST_ETHERTYPE)
