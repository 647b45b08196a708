"""A 1 Gb/s Ethernet MAC on the GMII-like byte interface of :class:`cais.hdl.board.rgmii.RgmiiPhy`.

Receive (:class:`MacRx`): strips the preamble and SFD, checks the FCS and the length, and hands the frame
without its FCS on, one byte per cycle, with a ``bad`` flag on the last byte. Transmit (:class:`MacTx`):
sends the preamble and SFD, pads to 60 bytes, appends the FCS and keeps the inter-frame gap.

Both run in their PHY's 125 MHz domain (``sync`` here; the board renames it). The CRC logic is derived
from the one definition of the FCS, :func:`cais.fcs.crc_update` (the CRC is linear over GF(2)).
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais.fcs import CRC_INIT, RESIDUE, crc_update

__all__ = ["crc_byte", "GmiiSignature", "ByteStreamSignature", "MacRx", "MacTx",
           "PREAMBLE", "SFD", "MIN_FRAME_FCS", "MIN_PAYLOAD_FRAME", "IFG_BYTES"]

PREAMBLE = 0x55          # 7 of these, then the SFD
SFD = 0xD5
PREAMBLE_BYTES = 7
MIN_FRAME_FCS = 64       # shortest valid frame with its FCS; shorter ones received are runts
MIN_PAYLOAD_FRAME = 60   # a frame shorter than this without FCS is padded with zeros on transmit
IFG_BYTES = 12           # inter-frame gap, byte times


def _columns(n_bits: int, fn) -> list[int]:
    return [fn(1 << j) for j in range(n_bits)]


_CRC_COLS = _columns(32, lambda c: crc_update(c, b"\0"))           # the register's contribution
_DATA_COLS = _columns(8, lambda d: crc_update(0, bytes([d])))       # the byte's contribution


def crc_byte(crc, byte):
    """The CRC register after one more byte: each bit an XOR of the register and byte bits whose unit
    vectors set it in :func:`cais.fcs.crc_update` (a 32x40 matrix derived, not copied)."""
    bits = []
    for i in range(32):
        terms = [crc[j] for j in range(32) if _CRC_COLS[j] >> i & 1]
        terms += [byte[k] for k in range(8) if _DATA_COLS[k] >> i & 1]
        bit = terms[0]
        for t in terms[1:]:
            bit = bit ^ t
        bits.append(bit)
    return Cat(*bits)


class GmiiSignature(wiring.Signature):
    """One byte per cycle between a PHY interface and a MAC, as seen from the side that sends.

    Members
    -------
    data : Out(8)
    en : Out(1)
        The byte is part of a frame (RX: RX_DV; TX: TX_EN).
    er : Out(1)
        An error (RX: the PHY saw a bad symbol; TX: make the PHY send one).
    """

    def __init__(self):
        super().__init__({"data": Out(8), "en": Out(1), "er": Out(1)})


class ByteStreamSignature(wiring.Signature):
    """Frames as bytes, as seen from the source: ``bad`` on the last byte marks the frame bad (it becomes
    ``tuser``). With ``ready=False`` the sink must take every byte (the receive path: Ethernet cannot wait).

    Members
    -------
    data : Out(8)
    valid : Out(1)
    last : Out(1)
    bad : Out(1)
    ready : In(1), with ``ready=True``
    """

    def __init__(self, *, ready: bool):
        members = {"data": Out(8), "valid": Out(1), "last": Out(1), "bad": Out(1)}
        if ready:
            members["ready"] = In(1)
        super().__init__(members)


class MacRx(wiring.Component):
    """Receive half of the MAC.

    A frame starts at the SFD after any number of preamble bytes (a frame starting with anything else is
    ignored until RX_DV falls). Byte *k* of the frame leaves when byte *k* + 5 arrives (4 FCS bytes and
    one held back), the held byte leaves with ``last`` when RX_DV falls. ``bad`` on it when the FCS is
    wrong (which includes a frame cut short: RX_DV fell early), when RX_ER was seen, or when the frame is a
    runt (shorter than 64 bytes with its FCS). A frame of fewer than 5 bytes leaves nothing. Longer
    frames than the switch takes pass: the switch drops them as OVERSIZE.

    Members
    -------
    gmii : In(GmiiSignature())
        From the PHY interface.
    o : Out(ByteStreamSignature(ready=False))
        The frame without preamble, SFD and FCS; registered.
    ev_frame, ev_bad_fcs, ev_runt, ev_error : Out(1)
        One-cycle events with the last byte of a frame: sent on; its FCS was wrong; a runt (also a
        fragment of fewer than 5 bytes, which sends nothing); RX_ER was seen.
    link : Out(1)
        The link bit of RGMII in-band status (RXD[0] between frames), for a PHY that sends it.
    """

    gmii: In(GmiiSignature())
    o: Out(ByteStreamSignature(ready=False))
    ev_frame: Out(1)
    ev_bad_fcs: Out(1)
    ev_runt: Out(1)
    ev_error: Out(1)
    link: Out(1)

    def elaborate(self, platform):
        m = Module()
        g, o = self.gmii, self.o

        crc = Signal(32, init=CRC_INIT, reset_less=True)     # loaded at each frame's start
        held = Signal(range(6))                    # bytes in the shift register (saturates at 5)
        sr = [Signal(8, name=f"sr{i}", reset_less=True) for i in range(5)]   # sr[0] newest
        length = Signal(range(MIN_FRAME_FCS + 1))  # saturates at 64: only the runt check needs it
        err = Signal()

        m.d.sync += [o.valid.eq(0), o.last.eq(0), o.bad.eq(0),
                     self.ev_frame.eq(0), self.ev_bad_fcs.eq(0), self.ev_runt.eq(0), self.ev_error.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~g.en & ~g.er):
                    m.d.sync += self.link.eq(g.data[0])
                with m.If(g.en):
                    m.d.sync += [crc.eq(CRC_INIT), held.eq(0), length.eq(0), err.eq(g.er)]
                    with m.If(g.data == SFD):
                        m.next = "FRAME"
                    with m.Elif(g.data != PREAMBLE):
                        m.next = "SKIP"
            with m.State("SKIP"):
                with m.If(~g.en):
                    m.next = "IDLE"
            with m.State("FRAME"):
                with m.If(g.en):
                    m.d.sync += crc.eq(crc_byte(crc, g.data))
                    m.d.sync += [sr[0].eq(g.data), *(sr[i].eq(sr[i - 1]) for i in range(1, 5))]
                    with m.If(held < 5):
                        m.d.sync += held.eq(held + 1)
                    with m.Else():
                        m.d.sync += [o.valid.eq(1), o.data.eq(sr[4])]
                    with m.If(length < MIN_FRAME_FCS):
                        m.d.sync += length.eq(length + 1)
                    with m.If(g.er):
                        m.d.sync += err.eq(1)
                with m.Else():
                    runt = length < MIN_FRAME_FCS
                    fcs_bad = crc != RESIDUE
                    m.d.sync += [self.ev_runt.eq(runt), self.ev_error.eq(err)]
                    with m.If(held == 5):
                        m.d.sync += [o.valid.eq(1), o.data.eq(sr[4]), o.last.eq(1),
                                     o.bad.eq(fcs_bad | runt | err),
                                     self.ev_frame.eq(1), self.ev_bad_fcs.eq(fcs_bad)]
                    m.next = "IDLE"
        return m


class MacTx(wiring.Component):
    """Transmit half of the MAC.

    Waits for a byte, sends 7 preamble bytes and the SFD, then takes one byte per cycle up to ``last``,
    pads with zeros to 60 bytes, sends the FCS and stays idle for the 12-byte gap. The source must have
    each byte ready when it is due (the board's FIFOs run ahead); a byte missing mid-frame is an underrun:
    the MAC sends TX_ER (the PHY turns it into an error symbol, the receiver drops the frame), drops the
    rest of that frame and counts ``ev_underrun``. ``bad`` on a frame's last byte is ignored.

    Members
    -------
    i : In(ByteStreamSignature(ready=True))
    gmii : Out(GmiiSignature())
        To the PHY interface; registered.
    ev_frame, ev_underrun : Out(1)
        One-cycle events: a frame's last FCS byte was sent; an underrun.
    """

    i: In(ByteStreamSignature(ready=True))
    gmii: Out(GmiiSignature())
    ev_frame: Out(1)
    ev_underrun: Out(1)

    def elaborate(self, platform):
        m = Module()
        i, g = self.i, self.gmii

        # Only the control state resets (the FSM, count, TX_EN, TX_ER, the events): the data registers are
        # loaded before they are used, and fewer loads on the reset net keep it short at 125 MHz.
        crc = Signal(32, reset_less=True)
        count = Signal(range(max(MIN_PAYLOAD_FRAME, IFG_BYTES, PREAMBLE_BYTES) + 1))
        fcs = Signal(32, reset_less=True)
        data = Signal(8, reset_less=True)       # TXD, registered; 0 between frames
        m.d.comb += g.data.eq(data)

        # The CRC folds in each byte as it is registered for sending, so the FCS's first byte is the
        # register inverted (one gate to the output). The source's byte must come from a register (125 MHz:
        # AxisToTx's output stage), as it passes the CRC's XOR network.
        m.d.sync += [g.en.eq(0), g.er.eq(0), data.eq(0), self.ev_frame.eq(0), self.ev_underrun.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(i.valid):
                    m.d.sync += [g.en.eq(1), data.eq(PREAMBLE), count.eq(1)]
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.sync += g.en.eq(1)
                with m.If(count == PREAMBLE_BYTES):
                    m.d.sync += [data.eq(SFD), count.eq(0), crc.eq(CRC_INIT)]
                    m.next = "DATA"
                with m.Else():
                    m.d.sync += [data.eq(PREAMBLE), count.eq(count + 1)]
            with m.State("DATA"):
                m.d.comb += i.ready.eq(1)
                m.d.sync += g.en.eq(1)
                with m.If(i.valid):
                    m.d.sync += [data.eq(i.data), crc.eq(crc_byte(crc, i.data))]
                    with m.If(count < MIN_PAYLOAD_FRAME):
                        m.d.sync += count.eq(count + 1)
                    with m.If(i.last):
                        m.next = "PAD"
                with m.Else():
                    m.d.sync += [g.er.eq(1), self.ev_underrun.eq(1)]
                    m.next = "DRAIN"
            with m.State("PAD"):
                with m.If(count < MIN_PAYLOAD_FRAME):
                    m.d.sync += [g.en.eq(1), data.eq(0), crc.eq(crc_byte(crc, Const(0, 8))),
                                 count.eq(count + 1)]
                with m.Else():
                    # the FCS: the register inverted, least significant byte first
                    m.d.sync += [g.en.eq(1), data.eq(~crc[:8]), fcs.eq(~crc >> 8), count.eq(1)]
                    m.next = "FCS"
            with m.State("FCS"):
                m.d.sync += [g.en.eq(1), data.eq(fcs[:8]), fcs.eq(fcs >> 8), count.eq(count + 1)]
                with m.If(count == 3):
                    m.d.sync += [self.ev_frame.eq(1), count.eq(0)]
                    m.next = "GAP"
            with m.State("DRAIN"):
                m.d.comb += i.ready.eq(1)
                with m.If(i.valid & i.last):
                    m.d.sync += count.eq(0)
                    m.next = "GAP"
            with m.State("GAP"):
                # the GAP state's first cycle is the first idle byte on the wire (g.en was set for the last)
                m.d.sync += count.eq(count + 1)
                with m.If(count == IFG_BYTES - 1):
                    m.next = "IDLE"
        return m
