"""Scapy layers for the two CAIS frame formats: the switch's CAIS header and the host ring's header.

::

    from scapy.all import rdpcap
    import cais.dissect                    # binds both layers to their EtherTypes
    for pkt in rdpcap("port0.pcap"):
        if cais.dissect.Cais in pkt:
            print(pkt[cais.dissect.Cais].seq_num)

The layers are written from the documented field widths (docs/protocol.md, section 2, and docs/ring.md),
not from :data:`cais.protocol.HEADER_FIELDS`: tests/sw/test_protocol.py checks one against the other, so a
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

from .protocol import (ETHERTYPE, HEADER_FIELDS, HOST_ETHERTYPE, HOST_HEADER_FIELDS, RESERVED_FIELDS, DType,
                       HostKind, OpType, ReduceOp)

__all__ = ["Cais", "CaisHost", "FLAG_NAMES"]

# Flag bits of header byte 15, least significant first (cais.protocol.Flags: RESULT 0x01, RETRANSMIT 0x02)
FLAG_NAMES = ["RESULT", "RETRANSMIT", "b2", "b3", "b4", "b5", "b6", "b7"]


def _names(enum) -> dict:
    return {int(m): m.name for m in enum}


#: Fields whose values have names, and the defaults that differ from 0.
_ENUMS = {"op_type": _names(OpType), "dtype": _names(DType), "red_op": _names(ReduceOp), "kind": _names(HostKind)}
_DEFAULTS = {"total_chunks": 1, "frags": 1}


def _field(name: str, bits: int):
    """The scapy field of one (name, bits) entry of cais.protocol's header layouts."""
    default = _DEFAULTS.get(name, 0)
    if name == "flags":
        return FlagsField(name, default, bits, FLAG_NAMES)
    if name in _ENUMS:
        return ByteEnumField(name, default, _ENUMS[name]) if bits == 8 else \
            BitEnumField(name, default, bits, _ENUMS[name])
    return {8: ByteField, 16: ShortField, 32: IntField}[bits](name, default)


class Cais(Packet):
    """The CAIS header: 16 bytes, big-endian (docs/protocol.md), from HEADER_FIELDS with the reserved
    word split as RESERVED_FIELDS says."""
    name = "CAIS"
    fields_desc = [f for name, bits in HEADER_FIELDS
                   for f in ([_field(n, b) for n, b in RESERVED_FIELDS] if name == "reserved"
                             else [_field(name, bits)])]

    def extract_padding(self, s):
        # the payload is payload_len bytes; what follows is Ethernet padding to 60 bytes
        return s[:self.payload_len], s[self.payload_len:]


class CaisHost(Packet):
    """The host ring's header: 16 bytes, big-endian (docs/ring.md), from HOST_HEADER_FIELDS."""
    name = "CAIS host ring"
    fields_desc = [BitField(name, 0, bits) if name == "reserved" else _field(name, bits)
                   for name, bits in HOST_HEADER_FIELDS]

    def extract_padding(self, s):
        return s[:self.length], s[self.length:]


bind_layers(Ether, Cais, type=ETHERTYPE)
bind_layers(Ether, CaisHost, type=HOST_ETHERTYPE)
