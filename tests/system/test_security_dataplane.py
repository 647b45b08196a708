"""Issue 29, data plane: a host on a switch port cannot change another job's results with tagged frames (H1)
or with frames that claim a rank's source MAC (H2).

Everything runs in network namespaces the test creates (tests/netns.py conventions: root, fail rather
than skip): cais-switch (the model) with three or four ports, two ranks of one job on ports 0 and 1, and an
attacker on the last port that builds its frames with scapy (an encoder independent of cais.protocol's).
"""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import pytest

from cais import protocol as proto
from cais.comm import host_mac
from cais.cluster import Cluster
from cais.endpoint import connect
from netns import rank_outputs, require_root

ELEMENTS = 1024          # whole 256-byte chunks of int32: every forged result has the length a chunk wants
ITERATIONS = 3
FORGED = 5000            # the value the attacker wants in every element

RANK = r"""
import json, os, sys
import numpy as np
import cais
pg = cais.init(timeout=60, offload=os.environ["CAIS_TEST_OFFLOAD"])
r, n = pg.rank, int(os.environ["ELEMENTS"])
out = {"rank": r, "results": [], "paths": []}
for i in range(int(os.environ["ITERATIONS"])):
    buf = np.full(n, r + 1 + i, np.int32)
    work = cais.all_reduce(buf, async_op=True)
    work.wait()
    out["results"].append(buf.tolist())
    out["paths"].append(work.path)
out["refused"] = getattr(pg, "frames_refused", None)   # None before issue 29
cais.destroy_process_group()
print(json.dumps(out), flush=True)
"""

ATTACKER = r"""
import os, socket, sys, time
frames_hex, iface, stop = sys.argv[1], sys.argv[2], sys.argv[3]
pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.002       # between two rounds of the frames
frames = [bytes.fromhex(h) for h in frames_hex.split(",")]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
sent, end = 0, time.monotonic() + 120          # bounded: it stops by itself
while not os.path.exists(stop) and time.monotonic() < end:
    for f in frames:
        s.send(f)
        sent += 1
    time.sleep(pause)
print(sent, flush=True)
"""


def qinq_results(group_id: int, seqs, value: int) -> list[bytes]:
    """RESULT frames of `group_id` for chunks `seqs`, every element `value`, inside an 802.1ad tag and an
    802.1Q tag, source the switch's MAC (built with scapy)."""
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
    from scapy.packet import Raw
    out = []
    for seq in seqs:
        payload = int(value).to_bytes(4, "big") * 64
        hdr = proto.CaisHeader(group_id=group_id, seq_num=seq, payload_len=len(payload), flags=proto.Flags.RESULT)
        cais = proto.build_frame(hdr, payload)[proto.ETH_HEADER_BYTES:]    # the header and payload only
        pkt = (Ether(dst=proto.mac_to_str(proto.result_mac(group_id)), src=proto.mac_to_str(proto.SWITCH_MAC_DEFAULT))
               / Dot1AD(vlan=10) / Dot1Q(vlan=20, type=proto.ETHERTYPE) / Raw(cais))
        out.append(bytes(pkt))
    return out


def run(tmp_path, attacker_frames: list[bytes], offload: str, elements: int = ELEMENTS, token: str | None = None):
    """Two ranks of one job on ports 0 and 1 all-reduce while port 2 sends `attacker_frames` over and over;
    returns (rank outputs, the daemon's stats, frames the attacker sent)."""
    require_root()
    cluster = Cluster(3, tmp_path)
    stop = tmp_path / "stop"
    try:
        cluster.create()
        cluster.start_switch([])
        attacker = _start_attacker(cluster, 2, [str(stop)], attacker_frames, tmp_path,
                                   lambda: _arrived(_daemon_stats(cluster)), "the attacker's frames never reached the switch")
        procs = []
        for i in range(2):
            env = {**os.environ, "CAIS_RANK": str(i), "CAIS_WORLD_SIZE": "2", "CAIS_IFACE": f"{cluster.tag}h{i}",
                   "CAIS_SWITCH": cluster.control, "CAIS_CONTROLLER": cluster.controller,
                   "CAIS_TEST_OFFLOAD": offload, "ELEMENTS": str(elements), "ITERATIONS": str(ITERATIONS)}
            env.pop("CAIS_TOKEN", None)
            if token is not None:
                env["CAIS_TOKEN"] = token
            procs.append(cluster._spawn(cluster.rank_ns[i], ["-c", RANK], env, tmp_path / f"rank{i}.log"))
        for p in procs:
            p.wait(120)
        stats = _daemon_stats(cluster)
        stop.touch()
        attacker.wait(30)
        outs = rank_outputs(tmp_path, 2)
        sent = int((tmp_path / "attacker.log").read_text().split()[-1])
        return outs, stats, sent
    finally:
        stop.touch()
        cluster.close()


def _start_attacker(cluster, host: int, args: list[str], frames: list[bytes], tmp_path, seen, what: str):
    """Start ATTACKER in host ``host``'s namespace sending ``frames`` (``args``: until when, and how often),
    and wait until ``seen()`` (the switch saw them) or fail with ``what`` (or the attacker's log if it died)."""
    log = tmp_path / "attacker.log"
    attacker = cluster._spawn(cluster.rank_ns[host], ["-c", ATTACKER, ",".join(f.hex() for f in frames),
                                                     f"{cluster.tag}h{host}", *args], dict(os.environ), log)
    deadline = time.monotonic() + 30
    while not seen():
        assert attacker.poll() is None, log.read_text()
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return attacker


def _arrived(stats: dict) -> bool:
    """Port 2's frames reach the daemon (taken, or refused for their tags)."""
    return stats["frames_in"][2] + stats.get("tagged_drops", [0] * 3)[2] > 0


def _daemon_stats(cluster) -> dict:
    conn = connect(cluster.control, timeout=10, name="switch")
    try:
        return conn.request("stats")
    finally:
        conn.close()


def test_qinq_result_from_a_foreign_port_changes_no_result(tmp_path):
    """H1: RESULT frames of the job's group in two VLAN tags (802.1ad outside, 802.1Q inside), source the
    switch's MAC, sent from port 2 before and while two ranks all-reduce. Each tag a veth strips used to
    leave a plain frame for the next hop, and the ranks took the attacker's 5000s. Now the daemon refuses
    every one of them (counted per port in its stats) and nothing forged reaches a rank: every result is
    the exact sum (numpy), on the switch path."""
    frames = qinq_results(1, range(0, 4 * ITERATIONS * ELEMENTS // 64), FORGED)
    outs, stats, sent = run(tmp_path, frames, "always")
    for i in range(ITERATIONS):
        want = (np.full(ELEMENTS, 1 + i, np.int32) + np.full(ELEMENTS, 2 + i, np.int32)).tolist()
        for out in outs:
            assert out["results"][i] == want, f"rank {out['rank']} iteration {i}: {out['results'][i][:4]}..."
            assert out["paths"][i] == "switch"
    assert stats["tagged_drops"][2] > 0 and stats["tagged_drops"][:2] == [0, 0], stats
    assert sent >= stats["tagged_drops"][2]
    for out in outs:
        assert out["refused"]["tagged"] == 0 and out["refused"]["result_source"] == 0, out["refused"]


RING_ELEMENTS = 64       # a block of 32 int32 per rank of two: one fragment per ring step


def forged_ring_data(src: int, dst: int, group_id: int, op_seqs, value: int) -> list[bytes]:
    """Host-ring DATA frames of every step of a 2-rank ring for collectives `op_seqs`, every element
    `value`, claiming `src` (a rank's MAC) as their source (built with scapy)."""
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    payload = int(value).to_bytes(4, "big") * (RING_ELEMENTS // 2)
    out = []
    for op_seq in op_seqs:
        for step in (0, 1):
            hdr = proto.HostHeader(kind=proto.HostKind.DATA, group_id=group_id, op_seq=op_seq, step=step, frag=0,
                                   frags=1, length=len(payload))
            pkt = Ether(dst=proto.mac_to_str(dst), src=proto.mac_to_str(src), type=proto.HOST_ETHERTYPE) \
                / Raw(hdr.pack() + payload)
            out.append(bytes(pkt))
    return out


def spoofed_contributions(src: int, group_id: int, seqs, value: int) -> list[bytes]:
    """All-reduce contributions (int32 SUM, 64 elements) of `group_id` for chunks `seqs`, every element
    `value`, claiming `src` (a rank's MAC) as their source (built with scapy)."""
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    out = []
    for seq in seqs:
        payload = int(value).to_bytes(4, "big") * 64
        hdr = proto.CaisHeader(group_id=group_id, seq_num=seq, payload_len=len(payload))
        pkt = Ether(dst=proto.mac_to_str(proto.BROADCAST_MAC), src=proto.mac_to_str(src), type=proto.ETHERTYPE) \
            / Raw(hdr.pack() + payload)
        out.append(bytes(pkt))
    return out


def _registers(cluster, *names) -> dict:
    """Switch registers by name (per-port ones as lists), read through cais-switch's control endpoint."""
    from cais.params import SwitchParams
    from cais.registers import register_map
    conn = connect(cluster.control, timeout=10, name="switch")
    try:
        regs = register_map(SwitchParams(**conn.request("info")["params"]))
        return {n: [conn.request("read", reg=n, index=i)["value"] for i in range(regs[n].count)]
                if regs[n].count > 1 else conn.request("read", reg=n)["value"] for n in names}
    finally:
        conn.close()


@pytest.mark.parametrize("offload", ["never", "always"])
def test_frames_claiming_rank_0_from_another_port_are_dropped_at_the_switch(tmp_path, offload):
    """H2: a scapy host on port 3 sends host-ring DATA frames (rank 0 to rank 1, every step of the first
    collectives) and all-reduce contributions of the world group, all claiming rank 0's source MAC, before
    and while ranks 0 and 1 all-reduce on the host ring ("never") or through the switch ("always"). The
    controller (started first) bound each rank's MAC to its port, so the switch drops every one of the
    attacker's frames as SPOOFED_SOURCE (counted: every frame port 3 sent, none as FOREIGN_PORT), nothing
    forged reaches a rank (no refusal there), and both ranks get the exact sum (numpy). Before the
    binding the forged ring frames crossed the switch, and without the seal rank 1 took them first."""
    require_root()
    frames = forged_ring_data(host_mac(0), host_mac(1), 1, range(16), 1000) \
        + spoofed_contributions(host_mac(0), 1, range(4 * ITERATIONS), 1000)
    cluster = Cluster(4, tmp_path)
    stop = tmp_path / "stop"
    (tmp_path / "cais.toml").write_text(f'[cais]\noffload = "{offload}"\n')
    try:
        cluster.create()
        cluster.start_switch([])
        cluster.start_controller(world_size=2, extra=("--config", str(tmp_path / "cais.toml")))
        attacker = _start_attacker(cluster, 3, [str(stop), "0.05"], frames, tmp_path,
                                   lambda: _registers(cluster, "DROP_SPOOFED_SOURCE")["DROP_SPOOFED_SOURCE"],
                                   "the attacker's frames were never dropped as SPOOFED_SOURCE")
        procs = []
        for i in range(2):
            env = {**os.environ, "CAIS_RANK": str(i), "CAIS_WORLD_SIZE": "2", "CAIS_IFACE": f"{cluster.tag}h{i}",
                   "CAIS_SWITCH": cluster.control, "CAIS_CONTROLLER": cluster.controller,
                   "CAIS_COORDINATOR": "external", "CAIS_TOKEN": cluster.token_file.read_text(),
                   "CAIS_TEST_OFFLOAD": offload, "ELEMENTS": str(RING_ELEMENTS), "ITERATIONS": str(ITERATIONS)}
            procs.append(cluster._spawn(cluster.rank_ns[i], ["-c", RANK], env, tmp_path / f"rank{i}.log"))
        for p in procs:
            p.wait(120)
        stop.touch()
        attacker.wait(30)
        outs = rank_outputs(tmp_path, 2)
        # the daemon may still hold frames the attacker sent: read until two rounds agree (a quiet switch)
        regs, deadline = None, time.monotonic() + 60
        while True:
            last, regs = regs, _registers(cluster, "RX_FRAMES", "DROP_SPOOFED_SOURCE", "DROP_FOREIGN_PORT")
            if regs == last:
                break
            assert time.monotonic() < deadline, f"the switch never went quiet: {regs}"
            time.sleep(0.2)
    finally:
        stop.touch()
        cluster.close()
    path = "ring" if offload == "never" else "switch"
    for i in range(ITERATIONS):
        want = (np.full(RING_ELEMENTS, 1 + i, np.int32) + np.full(RING_ELEMENTS, 2 + i, np.int32)).tolist()
        for out in outs:
            assert out["results"][i] == want, f"rank {out['rank']} iteration {i}: {out['results'][i][:4]}..."
            assert out["paths"][i] == path
    assert regs["RX_FRAMES"][3] > 0 and regs["DROP_SPOOFED_SOURCE"] == regs["RX_FRAMES"][3], regs
    assert regs["DROP_FOREIGN_PORT"] == 0, regs
    for out in outs:
        assert not any(out["refused"].values()), out["refused"]


def test_seal_against_a_hand_computed_hmac():
    """cais.seal: the tag is HMAC-SHA256 (hashlib, computed here) under HMAC(token, label + job), after the
    payload; opening gives the frame back as build_host_frame made it; any changed byte, another job's
    key, a missing tag or a frame too short for its header is refused and counted; CAIS frames pass."""
    import hashlib
    import hmac

    from cais.seal import SEAL_BYTES, FrameSeal
    hdr = proto.HostHeader(kind=proto.HostKind.DATA, group_id=3, op_seq=7, step=1, frag=0, frags=1, length=8)
    frame = proto.build_host_frame(hdr, bytes(range(8)), dst=host_mac(1), src=host_mac(0))
    seal = FrameSeal.for_job("secret", "jobA")
    sealed = seal.seal(frame)
    key = hmac.new(b"secret", b"cais host frames v1\0jobA", hashlib.sha256).digest()
    body = frame[:30 + 8]
    assert sealed[:38] == body and sealed[38:38 + SEAL_BYTES] == hmac.new(key, body, hashlib.sha256).digest()[:16]
    assert len(sealed) == 60 and seal.open(sealed) == frame and seal.refused == 0
    for at in (0, 6, 11, 17, 31, 38, 53):           # dst, src MAC, op_seq, payload, the tag itself
        bad = bytearray(sealed)
        bad[at] ^= 1
        assert seal.open(bytes(bad)) is None, at
    assert FrameSeal.for_job("secret", "jobB").open(sealed) is None
    assert seal.open(frame) is None                 # unsealed: 22 pad bytes of zeros are no tag
    short = proto.build_host_frame(hdr.__class__(length=200), b"", dst=host_mac(1), src=host_mac(0))
    assert seal.open(short) is None and seal.refused == 1 + 7 + 1
    cais_frame = proto.build_frame(proto.CaisHeader(payload_len=4), bytes(4), pad=True)
    assert seal.seal(cais_frame) == cais_frame and seal.open(cais_frame) == cais_frame


def test_raw_port_refuses_tagged_frames(tmp_path):
    """RawPort on one end of a veth pair; from the other end (scapy-built frames): an 802.1Q frame, a
    priority-tagged one (VLAN 0), a QinQ one, a frame whose EtherType is still 0x8100 inside an outer
    802.1ad tag... each refused and counted; the plain frame sent last is the only one returned."""
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
    from scapy.packet import Raw
    from netns import namespace, run_probe, veth
    cais_body = proto.build_frame(proto.CaisHeader(payload_len=4), bytes(4))[proto.ETH_HEADER_BYTES:]
    eth = dict(dst="02:00:00:00:01:01", src="02:00:00:00:01:00")
    tagged = [Ether(**eth) / Dot1Q(vlan=5, type=proto.ETHERTYPE) / Raw(cais_body),
              Ether(**eth) / Dot1Q(vlan=0, prio=3, type=proto.ETHERTYPE) / Raw(cais_body),
              Ether(**eth) / Dot1AD(vlan=1) / Dot1Q(vlan=2, type=proto.ETHERTYPE) / Raw(cais_body),
              Ether(**eth) / Dot1Q(vlan=1) / Dot1Q(vlan=2) / Dot1Q(vlan=3, type=proto.ETHERTYPE) / Raw(cais_body)]
    plain = bytes(Ether(**eth, type=proto.ETHERTYPE) / Raw(cais_body))
    probe = r"""
import select, socket, sys, time
from cais.rawsock import RawPort
port = RawPort(sys.argv[2])
tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
tx.bind((sys.argv[1], 0))
for h in sys.argv[3].split(","):
    tx.send(bytes.fromhex(h))
got, end = [], time.monotonic() + 20
while not got and time.monotonic() < end:
    select.select([port.sock], [], [], 1.0)
    got += port.recv_all()
print(port.tagged, ",".join(f.hex() for f in got))
"""
    with namespace() as ns:
        veth(ns, "ta", "tb")
        out = run_probe(ns, probe, "ta", "tb", ",".join(bytes(p).hex() for p in tagged + [plain]))
    count, frames = out.split()
    assert int(count) == len(tagged) and [bytes.fromhex(h) for h in frames.split(",")] == [plain]
