"""The CAIS header layout of cais.protocol against an independent description written with scapy.

The scapy layers of cais.dissect (what the package ships for tools and captures) are written from the
documented field widths (docs/protocol.md, docs/ring.md), not from protocol.HEADER_FIELDS, so a mistake in
either shows up as a disagreement.
"""

import random

import pytest
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from cais.dissect import Cais as CaisScapy, CaisHost

from cais.protocol import (BROADCAST_MAC, CAIS_HEADER_BYTES, ETHERTYPE, HEADER_FIELDS, HEADERS_BYTES,
                           HOST_ETHERTYPE, HOST_HEADER_BYTES, MIN_FRAME_BYTES, RESERVED_FIELDS, CaisHeader, DType,
                           EthHeader, Flags, HostHeader, OpType, ReduceOp, build_frame, build_host_frame,
                           mac_to_str, parse_frame, result_mac)


FIELDS = ("op_type", "group_id", "layer_id", "chunk_id", "total_chunks", "seq_num", "payload_len",
          "dtype", "red_op", "flags")
WIDTHS = {"op_type": 8, "group_id": 8, "layer_id": 16, "chunk_id": 16, "total_chunks": 16, "seq_num": 32,
          "payload_len": 16, "dtype": 4, "red_op": 4, "flags": 8}


def random_header(rng: random.Random) -> dict:
    return {name: rng.randrange(1 << w) for name, w in WIDTHS.items()}


def mac(rng):
    return rng.randrange(1 << 48)


def test_constants():
    assert ETHERTYPE == 0x88B5
    assert CAIS_HEADER_BYTES == 16
    assert HEADERS_BYTES == 30
    assert MIN_FRAME_BYTES == 60
    assert len(CaisScapy()) == 16
    assert [n for n, _ in HEADER_FIELDS][:6] == list(FIELDS[:6])
    assert dict(HEADER_FIELDS)["payload_len"] == 16 and dict(HEADER_FIELDS)["reserved"] == 16
    assert RESERVED_FIELDS == (("dtype", 4), ("red_op", 4), ("flags", 8))


def test_pack_matches_scapy():
    rng = random.Random(1)
    for _ in range(300):
        f = random_header(rng)
        ours = CaisHeader(**f).pack()
        theirs = bytes(CaisScapy(**f))
        assert ours == theirs, f


def test_unpack_matches_scapy():
    rng = random.Random(2)
    for _ in range(300):
        f = random_header(rng)
        hdr = CaisHeader.unpack(bytes(CaisScapy(**f)))
        assert {n: getattr(hdr, n) for n in FIELDS} == f


def test_frame_built_by_scapy_parses():
    rng = random.Random(3)
    for _ in range(200):
        f = random_header(rng)
        f["payload_len"] = 4 * rng.randrange(0, 65)
        payload = bytes(rng.randrange(256) for _ in range(f["payload_len"]))
        dst, src = mac(rng), mac(rng)
        raw = bytes(Ether(dst=mac_to_str(dst), src=mac_to_str(src)) / CaisScapy(**f) / Raw(payload))
        frame = parse_frame(raw)
        assert frame.eth == EthHeader(dst, src, ETHERTYPE)
        assert {n: getattr(frame.cais, n) for n in FIELDS} == f
        assert frame.payload == payload
        # and our builder makes the same bytes
        assert build_frame(CaisHeader(**f), payload, dst=dst, src=src) == raw


def test_frame_built_by_us_dissected_by_scapy():
    rng = random.Random(4)
    for _ in range(200):
        f = random_header(rng)
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        dst, src = mac(rng), mac(rng)
        raw = build_frame(CaisHeader(**f), payload, dst=dst, src=src)
        pkt = Ether(raw)
        assert pkt.type == 0x88B5
        assert pkt.dst == mac_to_str(dst) and pkt.src == mac_to_str(src)
        layer = pkt[CaisScapy]
        assert {n: layer.getfieldval(n) for n in FIELDS} == f
        assert bytes(layer.payload) == payload


def test_round_trip():
    rng = random.Random(5)
    for _ in range(300):
        hdr = CaisHeader(**random_header(rng))
        assert CaisHeader.unpack(hdr.pack()) == hdr
        assert len(hdr.pack()) == 16


def test_byte_offsets_hand_derived():
    # Distinct recognisable values so each field's bytes can be located in the frame.
    hdr = CaisHeader(op_type=0x11, group_id=0x22, layer_id=0x3344, chunk_id=0x5566, total_chunks=0x7788,
                     seq_num=0x99AABBCC, payload_len=0x0004, dtype=0xD, red_op=0xE, flags=0xF0)
    raw = build_frame(hdr, b"\x01\x02\x03\x04", dst=0x0A0B0C0D0E0F, src=0x101112131415)
    assert raw[0:6] == bytes.fromhex("0a0b0c0d0e0f")      # destination MAC
    assert raw[6:12] == bytes.fromhex("101112131415")     # source MAC
    assert raw[12:14] == b"\x88\xb5"                      # EtherType
    assert raw[14] == 0x11                                # op_type       (header byte 0)
    assert raw[15] == 0x22                                # group_id      (header byte 1)
    assert raw[16:18] == b"\x33\x44"                      # layer_id      (header bytes 2..3)
    assert raw[18:20] == b"\x55\x66"                      # chunk_id      (header bytes 4..5)
    assert raw[20:22] == b"\x77\x88"                      # total_chunks  (header bytes 6..7)
    assert raw[22:26] == b"\x99\xaa\xbb\xcc"              # seq_num       (header bytes 8..11)
    assert raw[26:28] == b"\x00\x04"                      # payload_len   (header bytes 12..13)
    assert raw[28] == 0xDE                                # dtype << 4 | red_op (header byte 14)
    assert raw[29] == 0xF0                                # flags         (header byte 15)
    assert raw[30:34] == b"\x01\x02\x03\x04"              # payload
    assert len(raw) == 34
    assert hdr.reserved == 0xDEF0


def test_padding_and_parse_ignores_pad():
    hdr = CaisHeader(payload_len=8, dtype=DType.INT32, red_op=ReduceOp.MAX)
    raw = build_frame(hdr, bytes(range(8)), pad=True)
    assert len(raw) == 60 and raw[38:] == bytes(22)
    assert parse_frame(raw).payload == bytes(range(8))
    assert Ether(raw)[CaisScapy].payload_len == 8
    # a long frame is never padded
    assert len(build_frame(CaisHeader(payload_len=64), bytes(64), pad=True)) == 94


def test_ordinary_frame_has_no_cais_header():
    raw = bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src="02:00:00:00:00:09", type=0x0800) / Raw(b"x" * 46))
    f = parse_frame(raw)
    assert f.cais is None and f.eth.ethertype == 0x0800 and f.eth.dst == BROADCAST_MAC
    assert f.payload == b"x" * 46


@pytest.mark.parametrize("group", [0, 1, 0x7F, 0xFF])
def test_result_mac(group):
    assert mac_to_str(result_mac(group)) == f"03:ca:15:00:00:{group:02x}"
    assert result_mac(group) >> 40 & 1  # group (multicast) bit set


def test_code_points():
    assert [(m.name, m.value) for m in OpType] == [("ALL_REDUCE", 0), ("ALL_GATHER", 1), ("BROADCAST", 2),
                                                    ("REDUCE_SCATTER", 3)]
    assert [(m.name, m.value) for m in ReduceOp] == [("SUM", 0), ("MAX", 1), ("MIN", 2)]
    assert Flags.RESULT == 0x01 and Flags.RETRANSMIT == 0x02
    assert DType.INT32 == 0


HOST_WIDTHS = {"kind": 8, "group_id": 8, "op_seq": 32, "step": 16, "frag": 16, "frags": 16, "length": 16}


def test_host_layer_matches_the_host_header():
    """cais.dissect.CaisHost against cais.protocol.HostHeader / build_host_frame, both ways."""
    rng = random.Random(6)
    assert len(CaisHost()) == HOST_HEADER_BYTES
    for _ in range(200):
        f = {name: rng.randrange(1 << w) for name, w in HOST_WIDTHS.items()}
        f["kind"] = rng.randrange(2)
        f["length"] = rng.randrange(0, 40)
        payload = bytes(rng.randrange(256) for _ in range(f["length"]))
        dst, src = mac(rng), mac(rng)
        raw = build_host_frame(HostHeader(**f), payload, dst=dst, src=src)
        pkt = Ether(raw)
        assert pkt.type == HOST_ETHERTYPE
        layer = pkt[CaisHost]
        assert {n: layer.getfieldval(n) for n in HOST_WIDTHS} == f
        assert (pkt[Raw].load if Raw in pkt else b"") == payload     # the padding to 60 bytes is not payload
        theirs = bytes(Ether(dst=mac_to_str(dst), src=mac_to_str(src), type=HOST_ETHERTYPE) / CaisHost(**f)
                       / Raw(payload))
        assert raw[:len(theirs)] == theirs and not any(raw[len(theirs):])


def test_cais_layer_stops_at_payload_len():
    raw = build_frame(CaisHeader(payload_len=4, flags=Flags.RESULT | Flags.RETRANSMIT), b"\x01\x02\x03\x04", pad=True)
    layer = Ether(raw)[CaisScapy]
    assert layer[Raw].load == b"\x01\x02\x03\x04"            # then the padding
    assert layer.flags.RESULT and layer.flags.RETRANSMIT
    assert layer.sprintf("%op_type% %dtype% %red_op%") == "ALL_REDUCE INT32 SUM"
