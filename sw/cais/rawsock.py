"""Whole Ethernet frames on a Linux interface (AF_PACKET raw sockets) and pcap files (stdlib only).

Used by the switch daemon (one :class:`RawPort` per switch port) and by a rank's driver (one for its NIC).
Needs Linux and CAP_NET_RAW (root). The socket is bound to one interface and every EtherType, put in
promiscuous mode (a rank's frames carry the driver's MAC addresses, not the interface's), and skips the
copies of its own transmissions the kernel hands back to packet sockets.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

__all__ = ["RawPort", "PcapWriter", "interface_error"]

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
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
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.send_drops = 0          # frames given up because the send buffer stayed full

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
        """The frames waiting (up to `limit`), without blocking; own transmissions skipped."""
        out = []
        while len(out) < limit:
            try:
                data, addr = self.sock.recvfrom(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            if self.pcap:
                self.pcap.write(data)
            out.append(data)
        return out

    def close(self, pcap: bool = True) -> None:
        """Close the socket, and the capture unless `pcap` is False (a port that will be opened again)."""
        self.sock.close()
        if self.pcap and pcap:
            self.pcap.close()


class PcapWriter:
    """A classic pcap file (microsecond timestamps, LINKTYPE_ETHERNET), flushed after every frame so
    that a capture read while the daemon runs (or after it was killed) is complete."""

    MAGIC, VERSION, SNAPLEN, LINKTYPE_ETHERNET = 0xA1B2C3D4, (2, 4), 65535, 1

    def __init__(self, path: str | os.PathLike):
        self.path = path
        from .endpoint import open_private
        self.f = os.fdopen(open_private(path), "wb")     # 0600, no symbolic link followed
        self.f.write(struct.pack("<IHHiIII", self.MAGIC, *self.VERSION, 0, 0, self.SNAPLEN,
                                 self.LINKTYPE_ETHERNET))
        self.f.flush()

    def write(self, frame: bytes, when: float | None = None) -> None:
        t = time.time() if when is None else when
        sec = int(t)
        data = bytes(frame[:self.SNAPLEN])
        self.f.write(struct.pack("<IIII", sec, int((t - sec) * 1e6), len(data), len(frame)) + data)
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
