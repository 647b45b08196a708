"""Whole Ethernet frames on a Linux interface (AF_PACKET raw sockets) and pcap files (stdlib only).

Used by the switch daemon (one :class:`RawPort` per switch port) and by a rank's driver (one for its NIC).
Needs Linux and CAP_NET_RAW (root). The socket is bound to one interface and every EtherType, put in
promiscuous mode (a rank's frames carry the driver's MAC addresses, not the interface's), and skips the
copies of its own transmissions the kernel hands back to packet sockets.

Tagged frames are refused and counted (``tagged``), never returned: the kernel strips a frame's outer
802.1Q/802.1ad tag before packet sockets see it and reports it only in PACKET_AUXDATA, so a tag-stacked
(QinQ) frame would otherwise look like a plain one at each hop that strips a tag (docs/protocol.md,
"Threat model"). A frame still carrying a VLAN EtherType after the strip is refused too.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

from .endpoint import open_private

__all__ = ["RawPort", "PcapWriter", "interface_error", "was_tagged", "VLAN_ETHERTYPES"]

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 1 << 4      # tpacket_auxdata.tp_status: the kernel stripped a VLAN tag (tci may be 0)
AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata: status, len, snaplen, mac, net, vlan_tci, vlan_tpid
VLAN_ETHERTYPES = (0x8100, 0x88A8, 0x9100)   # 802.1Q, 802.1ad (QinQ) and the old QinQ TPID
SEND_WAIT_S = 0.05     # how long a send waits for room in a full socket buffer
RCVBUF = 8 << 20       # a burst of result frames must not overflow the socket while Python is busy


CARRIER_WAIT_S = 5.0   # a veth end just set up reports its carrier a moment later


def interface_error(name: str, carrier_wait: float = CARRIER_WAIT_S) -> str:
    """Why `name` cannot carry frames ("" if it can): it must exist, be up, and get a carrier within
    `carrier_wait` seconds (a veth whose peer is down or gone never does)."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return f"no network interface named {name!r}"
    deadline = time.monotonic() + carrier_wait
    while True:
        try:
            with open(f"/sys/class/net/{name}/operstate") as f:
                state = f.read().strip()
            with open(f"/sys/class/net/{name}/flags") as f:
                up = int(f.read().strip(), 16) & 1
        except OSError:
            return ""
        if not up:
            return f"interface {name!r} is down (ip link set {name} up)"
        if state not in ("down", "lowerlayerdown", "dormant"):
            return ""           # up, or unknown (TAP devices, loopback)
        if time.monotonic() >= deadline:
            return f"interface {name!r} has no carrier after {carrier_wait:g} s (its peer is down or missing)"
        time.sleep(0.02)


class RawPort:
    """One interface as a frame port.

    Members
    -------
    name : str
        The interface name.
    sock : socket.socket
        The AF_PACKET socket (non-blocking; ``fileno()`` for select).
    send_drops : int
        Frames given up because the send buffer stayed full for ``SEND_WAIT_S``.
    tagged : int
        Frames refused because they carried an 802.1Q/802.1ad tag (module docstring).
    """

    def __init__(self, name: str, pcap: "PcapWriter | None" = None, carrier_wait: float = CARRIER_WAIT_S):
        why = interface_error(name, carrier_wait)
        if why:
            raise OSError(why)
        self.name, self.pcap = name, pcap
        self.ifindex = socket.if_nametoindex(name)   # a deleted and re-created interface gets a new one
        # protocol 0 first: the socket receives nothing until it is bound to the interface
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RCVBUF)
            self.sock.bind((name, ETH_P_ALL))
            mreq = struct.pack("iHH8s", self.ifindex, PACKET_MR_PROMISC, 0, b"")
            self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
            self.sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.send_drops = 0          # frames given up because the send buffer stayed full
        self.tagged = 0              # frames refused for a VLAN tag

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frame: bytes) -> None:
        try:
            self.sock.send(frame)
        except BlockingIOError:
            # the socket's send buffer is full (the peer reads slowly): wait a moment for room, then give
            # the frame up as a congested wire would (the protocols repeat what is lost)
            if not select.select([], [self.sock], [], SEND_WAIT_S)[1]:
                self.send_drops += 1
                return
            try:
                self.sock.send(frame)
            except BlockingIOError:
                self.send_drops += 1
                return
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
            # the interface's queue is full: its carrier is gone (the peer end is down) or it is congested;
            # lost like a frame on a congested wire, which the protocols repeat
            self.send_drops += 1
            return
        if self.pcap:
            self.pcap.write(frame)

    def recv_all(self, limit: int = 256) -> list[bytes]:
        """The frames waiting (up to `limit`), without blocking; own transmissions skipped, tagged frames
        refused and counted (``tagged``; they still go to the capture, as the kernel left them)."""
        out = []
        while len(out) < limit:
            try:
                data, anc, _, addr = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(AUXDATA.size))
            except (BlockingIOError, InterruptedError):
                break
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            if self.pcap:
                self.pcap.write(data)
            if was_tagged(data, anc):
                self.tagged += 1
                continue
            out.append(data)
        return out

    def close(self, pcap: bool = True) -> None:
        """Close the socket, and the capture unless `pcap` is False (a port that will be opened again)."""
        self.sock.close()
        if self.pcap and pcap:
            self.pcap.close()


def was_tagged(frame: bytes, ancillary) -> bool:
    """Whether a received frame carried a VLAN tag: one the kernel stripped (PACKET_AUXDATA says so) or
    one still in the frame (its EtherType is a VLAN TPID)."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, _ = AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID or tci:
                return True
    return len(frame) >= 14 and int.from_bytes(frame[12:14], "big") in VLAN_ETHERTYPES


class PcapWriter:
    """A classic pcap file (microsecond timestamps, LINKTYPE_ETHERNET), flushed after every frame so
    that a capture read while the daemon runs (or after it was killed) is complete.

    With `max_bytes` the capture is capped and rotated: at most `files` files (``path``, ``path.1``, ...
    ``path.<files-1>``, newest first), each at most ``max_bytes // files`` bytes, so the capture never takes
    more than `max_bytes` and always holds the newest frames. When the next record would not fit in
    ``path``, ``path.<files-2>`` moves to ``path.<files-1>`` (the oldest is dropped), ... ``path`` to
    ``path.1``, and a new ``path`` is started (with ``files=1`` the one file starts again).

    Members
    -------
    rotations : int
        Times a new file was started because the current one was full.
    """

    MAGIC, VERSION, SNAPLEN, LINKTYPE_ETHERNET = 0xA1B2C3D4, (2, 4), 65535, 1
    HEADER, RECORD = 24, 16          # bytes of the file header and of each record's header
    MIN_FILE = HEADER + RECORD + SNAPLEN   # a file holds at least one frame of any size

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None, files: int = 1):
        if files < 1:
            raise ValueError(f"pcap files={files}: at least 1")
        self.file_limit = None if max_bytes is None else max_bytes // files
        if self.file_limit is not None and self.file_limit < self.MIN_FILE:
            raise ValueError(f"pcap cap of {max_bytes} bytes over {files} files: each file needs at least "
                             f"{self.MIN_FILE} bytes (one frame of {self.SNAPLEN} bytes)")
        self.path, self.files, self.rotations = os.fspath(path), files, 0
        self._start()

    def _start(self) -> None:
        self.f = os.fdopen(open_private(self.path), "wb")     # 0600, no symbolic link followed
        self.f.write(struct.pack("<IHHiIII", self.MAGIC, *self.VERSION, 0, 0, self.SNAPLEN,
                                 self.LINKTYPE_ETHERNET))
        self.f.flush()
        self.size = self.HEADER

    def _rotate(self) -> None:
        self.f.close()
        for i in range(self.files - 1, 0, -1):
            older = self.path if i == 1 else f"{self.path}.{i - 1}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i}")
        self.rotations += 1
        self._start()

    def write(self, frame: bytes, when: float | None = None) -> None:
        t = time.time() if when is None else when
        sec = int(t)
        data = bytes(frame[:self.SNAPLEN])
        record = struct.pack("<IIII", sec, int((t - sec) * 1e6), len(data), len(frame)) + data
        if self.file_limit is not None and self.size + len(record) > self.file_limit:
            self._rotate()
        self.f.write(record)
        self.size += len(record)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def read_pcap(path) -> list[tuple[float, bytes]]:
    """The (timestamp, frame) records of a pcap file written by :class:`PcapWriter`."""
    with open(path, "rb") as f:
        data = f.read()
    magic, major, minor, _, _, _, linktype = struct.unpack_from("<IHHiIII", data, 0)
    if magic != PcapWriter.MAGIC or linktype != PcapWriter.LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: not a little-endian Ethernet pcap file")
    out, at = [], 24
    while at + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack_from("<IIII", data, at)
        out.append((sec + usec / 1e6, data[at + 16:at + 16 + incl]))
        at += 16 + incl
    return out
