"""The Ethernet frame check sequence (IEEE 802.3 clause 3.2.9): CRC-32, one definition.

The board's MACs (:mod:`cais.hdl.board.mac`) derive their per-byte CRC logic from :func:`crc_update`
(its linear map over GF(2)), and the tests compare both against ``zlib.crc32``, an independent
implementation of the same CRC.
"""

from __future__ import annotations

__all__ = ["POLY_REFLECTED", "CRC_INIT", "crc_update", "fcs", "with_fcs", "fcs_ok", "RESIDUE", "FCS_BYTES"]

#: x^32 + x^26 + x^23 + x^22 + x^16 + x^12 + x^11 + x^10 + x^8 + x^7 + x^5 + x^4 + x^2 + x + 1, bit-reversed:
#: Ethernet sends each byte least significant bit first, so the register shifts right.
POLY_REFLECTED = 0xEDB88320
#: The register's value before a frame's first byte (and the FCS is the register inverted).
CRC_INIT = 0xFFFFFFFF
FCS_BYTES = 4


def crc_update(crc: int, data: bytes | bytearray) -> int:
    """The CRC register after shifting in *data* (no initial value or final inversion applied)."""
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (POLY_REFLECTED if crc & 1 else 0)
    return crc


def fcs(frame: bytes | bytearray) -> bytes:
    """The 4 FCS bytes of *frame* (destination MAC .. last payload or pad byte), in wire order."""
    return (crc_update(CRC_INIT, frame) ^ 0xFFFFFFFF).to_bytes(FCS_BYTES, "little")


def with_fcs(frame: bytes | bytearray) -> bytes:
    return bytes(frame) + fcs(frame)


#: The register after a frame and its correct FCS, whatever the frame: what a receiver compares with.
RESIDUE = crc_update(CRC_INIT, fcs(b""))


def fcs_ok(frame_and_fcs: bytes | bytearray) -> bool:
    """True when the last 4 bytes are the correct FCS of the bytes before them."""
    return len(frame_and_fcs) >= FCS_BYTES and crc_update(CRC_INIT, frame_and_fcs) == RESIDUE
