"""cais-switch (cais.sim.daemon) on real interfaces: veth pairs in a namespace of the test's own, frames
through AF_PACKET, the control endpoint, per-port faults, the pcap files, and bad arguments."""

import json
import subprocess
import sys

import pytest

from cais.params import SwitchParams
from cais.rawsock import read_pcap
from cais.registers import register_map
from netns import namespace, rank_outputs, run_probe, switch_daemon, veth

PROBE = r"""
import json, sys, time
from cais import protocol as proto
from cais.endpoint import connect, EndpointError
from cais.params import SwitchParams
from cais.rawsock import RawPort
from cais.registers import register_map
from cais.tables import MacEntry, mac_writes

sock = sys.argv[1]
h = [RawPort(f"h{i}") for i in range(3)]
c = connect(sock)
out = {}

def frame(tag, dst=proto.BROADCAST_MAC):
    return proto.build_host_frame(proto.HostHeader(op_seq=tag), b"probe%d" % tag, dst=dst, src=0x02_00_00_00_01_00)

def arrivals(f, expect):
    # until `f` reached every port of `expect` (a generous deadline: a busy machine is slow), then a
    # moment more for copies on other ports (one would come out with those, not later)
    got, end = [[], [], []], time.monotonic() + 60
    while not all(f in got[i] for i in expect) and time.monotonic() < end:
        for i, port in enumerate(h):
            got[i] += port.recv_all()
        time.sleep(0.005)
    settle = time.monotonic() + 0.05
    while time.monotonic() < settle:
        for i, port in enumerate(h):
            got[i] += port.recv_all()
        time.sleep(0.005)
    return got

def error_of(**req):
    try:
        c.request(**req)
    except EndpointError as e:
        return str(e)
    return None

out["id"] = c.request("read", reg="ID")["value"]
c.request("write", reg="SWITCH_MAC_LO", value=0x1234)
out["mac_lo"] = c.request("read", reg="SWITCH_MAC_LO")["value"]
out["by_addr"] = c.request("read", addr=register_map(SwitchParams(ports=3))["SWITCH_MAC_LO"].address())["value"]
out["unknown"] = error_of(op="read", reg="NOPE")
out["index"] = error_of(op="read", reg="RX_FRAMES", index=7)
out["bad_op"] = error_of(op="frobnicate")
c.sock.sendall(b"not json\n")
out["bad_json"] = c.recv()
out["params"] = c.request("info")["params"]

f1 = frame(1)
h[0].send(f1)
got = arrivals(f1, (1, 2))
out["flood"] = [f1 in g for g in got]

regs = register_map(SwitchParams(**out["params"]))
target = 0x02_00_00_00_0A_0B
for addr, value in mac_writes(regs, 0, MacEntry(target, 2)):
    c.request("write", addr=addr, value=value)
f2 = frame(2, dst=target)
h[0].send(f2)
got = arrivals(f2, (2,))
out["unicast"] = [f2 in g for g in got]

c.request("fault", port=1, drop=1.0)
f3 = frame(3)
h[0].send(f3)
got = arrivals(f3, (2,))
out["faulty"] = [f3 in g for g in got]
out["fault_stats"] = c.request("stats")["faults"]["1"]
c.request("fault", port=1, drop=0.0)
f4 = frame(4)
h[0].send(f4)
got = arrivals(f4, (1, 2))
out["healed"] = [f4 in g for g in got]
out["rx0"] = c.request("read", reg="RX_FRAMES", index=0)["value"]
out["frames"] = [f.hex() for f in (f1, f2, f3, f4)]
print(json.dumps(out))
"""


def test_daemon_on_veth_pairs(tmp_path):
    with namespace() as ns:
        for i in range(3):
            veth(ns, f"s{i}", f"h{i}")
        with switch_daemon(ns, tmp_path, ["s0", "s1", "s2"]) as (daemon, sock, pcap):
            out = json.loads(run_probe(ns, PROBE, sock))
        assert daemon.returncode == 0            # SIGTERM: a clean stop
        assert not sock.exists()                 # the control socket is removed

    params = SwitchParams(ports=3)
    assert out["params"] == params.as_dict()     # as many ports as interfaces
    assert out["id"] == register_map(params)["ID"].reset
    assert out["mac_lo"] == 0x1234 and out["by_addr"] == 0x1234
    assert "no register named 'NOPE'" in out["unknown"]
    assert "index=7: not in 0..2" in out["index"]
    assert "unknown op" in out["bad_op"]
    assert out["bad_json"]["ok"] is False and "bad request" in out["bad_json"]["error"]
    assert out["flood"] == [False, True, True]          # broadcast: every port but the ingress
    assert out["unicast"] == [False, False, True]       # the MAC table entry written over the endpoint
    assert out["faulty"] == [False, False, True]        # port 1 drops everything on its wires
    assert out["fault_stats"]["egress_dropped"] == 1
    assert out["healed"] == [False, True, True]
    assert out["rx0"] == 4

    frames = [bytes.fromhex(f) for f in out["frames"]]
    port0 = [f for _, f in read_pcap(pcap / "port0.pcap")]
    port1 = [f for _, f in read_pcap(pcap / "port1.pcap")]
    port2 = [f for _, f in read_pcap(pcap / "port2.pcap")]
    assert port0 == frames                               # what port 0 received
    assert port1 == [frames[0], frames[3]]               # transmitted on port 1 (the dropped one is not)
    assert port2 == frames[:4]


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required"),
    (["nope0"], "no network interface named 'nope0'"),
    (["lo", "lo"], "an interface is named twice"),
    (["--ports", "1", "lo"], "ports"),
    (["--backend", "fpga", "lo"], "invalid choice"),
    (["--control", "nonsense", "lo"], "--control"),
    (["--fault", "0:drop=2", "lo"], "drop"),
    (["--fault", "3:drop=0.1", "lo"], "port 3 is not one of 0..0"),
    (["--fault", "0:loss", "lo"], "is not drop=R"),
    (["--ports", "2", "lo", "nope1", "nope2"], "3 interfaces, but --ports 2"),
    (["--pcap-max-mb", "1", "lo"], "need --pcap DIR"),
    (["--pcap", "/tmp/x", "--pcap-max-mb", "0.1", "--pcap-files", "2", "lo"], "each file needs at least 65575"),
    (["--pcap", "/tmp/x", "--pcap-files", "0", "lo"], "--pcap-files"),
    (["--pcap", "/tmp/x", "--pcap-max-mb", "0", "lo"], "--pcap-max-mb"),
])
def test_bad_arguments_one_line_exit_2(args, message):
    p = subprocess.run([sys.executable, "-m", "cais.sim.daemon", *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cais-switch: error:") and message in lines[0], p.stderr



# ---------------------------------------------------------------------- links that come and go, locks

def _stats(ns, sock):
    return json.loads(run_probe(ns, "import json, sys\nfrom cais.endpoint import connect\n"
                                    "print(json.dumps(connect(sys.argv[1]).request('stats')))", sock))


def _wait_stats(ns, sock, what, until, deadline_s=60.0):
    """Poll the daemon's stats until `until(stats)` holds (a generous deadline: a busy machine is slow)."""
    import time
    end = time.monotonic() + deadline_s
    while True:
        st = _stats(ns, sock)
        if until(st):
            return st
        assert time.monotonic() < end, f"{what}: {st}"
        time.sleep(0.05)


FLOOD = r"""
import json, sys, time
from cais import protocol as proto
from cais.rawsock import RawPort
tag, others = int(sys.argv[1]), [int(i) for i in sys.argv[2].split(",")]
h0, h = RawPort("h0"), {i: RawPort(f"h{i}") for i in others}
f = proto.build_host_frame(proto.HostHeader(op_seq=tag), b"flood%d" % tag, dst=proto.BROADCAST_MAC,
                           src=0x02_00_00_00_01_00)
h0.send(f)
got, end = {i: False for i in others}, time.monotonic() + 30
while not all(got.values()) and time.monotonic() < end:      # every other port must get it (or 30 s)
    for i, port in h.items():
        got[i] = got[i] or f in port.recv_all()
    time.sleep(0.005)
print(json.dumps([f in h0.recv_all()] + [got[i] for i in others]))
"""


def test_port_flapped_and_recreated_the_daemon_goes_on(tmp_path):
    """Port 1's interface set down (then up), then deleted with its veth and created again under the same
    name: the daemon logs and counts each loss, drops what it would send there, serves the other ports
    meanwhile, and carries port 1's frames again once it is back."""
    from netns import ip
    with namespace() as ns:
        for i in range(3):
            veth(ns, f"s{i}", f"h{i}")
        with switch_daemon(ns, tmp_path, ["s0", "s1", "s2"]) as (daemon, sock, pcap):
            assert json.loads(run_probe(ns, FLOOD, 1, "1,2")) == [False, True, True]

            ip("-n", ns, "link", "set", "s1", "down")
            st = _wait_stats(ns, sock, "port 1 seen down", lambda s: s["link_down"][1] == 1)
            assert st["ports_up"] == [True, False, True]
            # port 2 still carries frames; port 1's copy is dropped and counted
            drops = st["down_drops"][1]
            assert json.loads(run_probe(ns, FLOOD, 2, "2")) == [False, True]
            assert _stats(ns, sock)["down_drops"][1] == drops + 1

            ip("-n", ns, "link", "set", "s1", "up")
            st = _wait_stats(ns, sock, "port 1 back", lambda s: s["ports_up"][1])
            assert st["link_up"][1] == 1
            assert json.loads(run_probe(ns, FLOOD, 3, "1,2")) == [False, True, True]

            ip("-n", ns, "link", "del", "s1")           # h1 goes with it
            st = _wait_stats(ns, sock, "port 1 gone", lambda s: s["link_down"][1] == 2)
            assert st["ports_up"] == [True, False, True]
            veth(ns, "s1", "h1")
            st = _wait_stats(ns, sock, "port 1 re-created", lambda s: s["ports_up"][1])
            assert st["link_up"][1] == 2
            assert json.loads(run_probe(ns, FLOOD, 4, "1,2")) == [False, True, True]
            assert daemon.poll() is None                 # it never stopped
        assert daemon.returncode == 0
    log = (tmp_path / "switch.log").read_text()
    assert "Traceback" not in log, log
    assert log.count("port 1 (s1) down:") == 2 and log.count("port 1 (s1) up again") == 2, log


FLAP_RANK = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
import cais
from cais.cluster import contribution
pg = cais.init(timeout=30.0)
r, N, tmp = pg.rank, pg.world_size, Path(sys.argv[1])
want = np.sum(np.stack([contribution(q, 1 << 17, np.int32) for q in range(N)]), axis=0)
out = {"rank": r}
cais.barrier()
x = contribution(r, 1 << 17, np.int32)
work = cais.all_reduce(x, async_op=True)         # 2048 chunks: the link flaps under it
(tmp / f"started{r}").write_text("")
try:
    work.wait()
    out["during"] = bool(np.array_equal(x, want))
except cais.CollectiveError as e:
    out["during"] = f"CollectiveError: {e}"
end = time.monotonic() + 120
while not (tmp / "flapped").exists():             # the test set the port down and up again
    assert time.monotonic() < end, "the test never flapped the port"
    time.sleep(0.02)
if out["during"] is True:
    y = contribution(r, 5000, np.int32)
    try:
        cais.all_reduce(y)
        out["after"] = bool(np.array_equal(y, np.sum(np.stack([contribution(q, 5000, np.int32) for q in range(N)]), axis=0)))
    except cais.CollectiveError as e:
        out["after"] = f"CollectiveError: {e}"
print(json.dumps(out), flush=True)
if out["after"] is True if "after" in out else False:
    cais.barrier()
    cais.destroy_process_group()
os._exit(0)
"""


@pytest.mark.parametrize("how", ["flap", "recreate"])
def test_port_flap_mid_collective_ranks_finish_exact_or_fail_cleanly(tmp_path, how):
    """Two rank processes on cais-switch; while their all-reduce runs, the switch's port 0 goes down and
    up (flap), or its veth pair is deleted and created again (recreate: rank 0's end goes too, so rank 0's
    socket is gone for good): each rank's result is exact (numpy) or it gets a CollectiveError, nobody
    hangs, and the daemon goes on, having counted the loss and opened the port again. After a flap a
    further all-reduce is exact."""
    import os
    import time
    from cais.cluster import Cluster
    from netns import ip, require_root
    require_root()
    cluster = Cluster(2, tmp_path)
    try:
        cluster.create()
        switch, = cluster.start_switch([])
        procs = []
        for i, ns in enumerate(cluster.rank_ns):
            env = dict(os.environ, CAIS_RANK=str(i), CAIS_WORLD_SIZE="2", CAIS_IFACE=f"{cluster.tag}h{i}",
                       CAIS_SWITCH=cluster.control, CAIS_CONTROLLER=cluster.controller)
            procs.append(cluster._spawn(ns, ["-c", FLAP_RANK, str(tmp_path)], env, tmp_path / f"rank{i}.log"))
        end = time.monotonic() + 120
        while not all((tmp_path / f"started{i}").exists() for i in range(2)):
            assert time.monotonic() < end and all(p.poll() is None for p in procs), \
                [(tmp_path / f"rank{i}.log").read_text()[-2000:] for i in range(2)]
            time.sleep(0.02)
        port0 = f"{cluster.tag}s0"
        if how == "flap":
            ip("-n", cluster.switch_ns, "link", "set", port0, "down")
        else:
            ip("-n", cluster.switch_ns, "link", "del", port0)
        _wait_stats(cluster.switch_ns, cluster.control, "port 0 seen down", lambda s: s["link_down"][0] >= 1)
        if how == "flap":
            ip("-n", cluster.switch_ns, "link", "set", port0, "up")
        else:
            h0 = f"{cluster.tag}h0"
            ip("-n", cluster.switch_ns, "link", "add", port0, "type", "veth", "peer", "name", h0,
               "netns", cluster.rank_ns[0])
            ip("-n", cluster.switch_ns, "link", "set", port0, "up")
            ip("-n", cluster.rank_ns[0], "link", "set", h0, "up")
        st = _wait_stats(cluster.switch_ns, cluster.control, "port 0 back", lambda s: s["ports_up"][0])
        assert st["link_down"] == [1, 0] and st["link_up"] == [1, 0]
        (tmp_path / "flapped").write_text("")
        for p in procs:
            p.wait(180)                                   # a hang fails here
        outs = rank_outputs(tmp_path, 2)
        for out in outs:
            assert out["during"] is True or out["during"].startswith("CollectiveError"), out
            if out["during"] is True and how == "flap":
                assert out["after"] is True, out
            elif out["during"] is True:
                assert out["after"] is True or out["after"].startswith("CollectiveError"), out
        assert switch.poll() is None                      # the switch survived its link
    finally:
        cluster.close()
    log = (tmp_path / "switch.log").read_text()
    assert "Traceback" not in log and f"port 0 ({port0}) down:" in log, log


def test_second_daemon_refused_first_untouched(tmp_path):
    """A second cais-switch on the same control socket, or on an interface the first holds: one line,
    exit status 2; the first's socket file stays and it goes on answering."""
    from netns import python_in
    with namespace() as ns:
        for i in range(3):
            veth(ns, f"s{i}", f"h{i}")
        with switch_daemon(ns, tmp_path, ["s0", "s1"]) as (daemon, sock, pcap):
            for args, message in [(["--control", str(sock), "s2"], f"control socket {sock} is in use"),
                                  (["--control", str(tmp_path / "other.sock"), "s2", "s1"],
                                   "interface 's1' is in use")]:
                p = python_in(ns, ["-m", "cais.sim.daemon", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
                out, err = p.communicate(timeout=60)
                assert p.returncode == 2, err
                lines = err.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("cais-switch: error:") and message in lines[0], err
                assert "(pid " in lines[0], lines
                assert sock.exists()
                assert not (tmp_path / "other.sock").exists()
            assert _stats(ns, sock)["ports_up"] == [True, True]     # the first still serves
            assert daemon.poll() is None
        assert daemon.returncode == 0 and not sock.exists()


def test_second_daemon_on_a_tcp_control_address_refused_first_untouched(tmp_path):
    """The TCP form of --control: a second cais-switch on the first's 127.0.0.1:PORT is refused by the
    lock (one line naming the address and the holder's pid, exit status 2); one on a port that another
    program (not a cais-switch) listens on gets one line naming the address; the first goes on answering
    on its address and stops cleanly."""
    import socket
    import time
    from netns import ip, python_in, stop
    with namespace() as ns:
        ip("-n", ns, "link", "set", "lo", "up")          # the TCP control endpoint is on the namespace's loopback
        for i in range(3):
            veth(ns, f"s{i}", f"h{i}")
        ready, log = tmp_path / "ready", open(tmp_path / "switch.log", "wb")
        first = python_in(ns, ["-m", "cais.sim.daemon", "--control", "127.0.0.1:7710", "--ready-file", str(ready),
                               "s0", "s1"], stdout=log, stderr=log)
        try:
            end = time.monotonic() + 60
            while not ready.exists():
                assert first.poll() is None and time.monotonic() < end, (tmp_path / "switch.log").read_text()
                time.sleep(0.05)
            # another program on 127.0.0.1:7711 in the same namespace (a probe that listens until told)
            other = python_in(ns, ["-c", "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 7711)); "
                                   "s.listen(); print('listening', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert other.stdout.readline().strip() == "listening"
                for address, message in [("127.0.0.1:7710", "control endpoint 127.0.0.1:7710 is in use by another "
                                                             f"cais-switch (pid {first.pid}"),
                                         ("127.0.0.1:7711", "127.0.0.1:7711")]:
                    p = python_in(ns, ["-m", "cais.sim.daemon", "--control", address, "s2"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                    _, err = p.communicate(timeout=60)
                    lines = err.strip().splitlines()
                    assert p.returncode in (1, 2) and len(lines) == 1, err
                    assert lines[0].startswith("cais-switch: error:") and message in lines[0], err
                    if address.endswith("7710"):
                        assert p.returncode == 2, err
            finally:
                other.stdin.close()
                stop(other)
            st = json.loads(run_probe(ns, "import json, sys\nfrom cais.endpoint import connect\n"
                                          "print(json.dumps(connect(sys.argv[1]).request('stats')))", "127.0.0.1:7710"))
            assert st["ports_up"] == [True, True]          # the first still serves, on its address
            assert first.poll() is None
        finally:
            stop(first)
            log.close()
        assert first.returncode == 0


# ---------------------------------------------------------------------- pcap cap and rotation

def _frames_kept(path) -> list[int]:
    """The tags of the frames of a rotated capture, oldest file first (path.K-1, ..., path.1, path), read
    by scapy; each file is a whole pcap file of its own."""
    from scapy.utils import rdpcap
    files = sorted(path.parent.glob(path.name + ".*"), key=lambda f: -int(f.suffix[1:])) + [path]
    tags = []
    for f in files:
        for pkt in rdpcap(str(f)):
            tags.append(int.from_bytes(bytes(pkt)[14:18], "big"))
    return tags


def test_pcap_writer_caps_and_rotates_keeping_the_newest(tmp_path):
    """500 frames of 1000 bytes into a cap of 3 x 70,000 bytes: each file holds (70,000 - 24) // (16 + 1000)
    = 68 records (the pcap format: a 24-byte file header, a 16-byte record header), so the files hold
    24 (newest), 68 and 68 frames: 340..499, in order; no file beyond path.2; one file starts again."""
    from scapy.layers.l2 import Ether

    from cais.rawsock import PcapWriter

    def frame(i):
        return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src="02:00:00:00:01:00", type=0x88B6)) + i.to_bytes(4, "big") + bytes(982)

    path = tmp_path / "port0.pcap"
    w = PcapWriter(path, max_bytes=3 * 70_000, files=3)
    for i in range(500):
        w.write(frame(i), when=1000.0 + i)
        files = list(tmp_path.iterdir())
        assert sum(f.stat().st_size for f in files) <= 3 * 70_000 and len(files) <= 3
    w.close()
    per_file = (70_000 - 24) // (16 + 1000)
    assert per_file == 68 and w.rotations == 500 // per_file
    assert sorted(f.name for f in tmp_path.iterdir()) == ["port0.pcap", "port0.pcap.1", "port0.pcap.2"]
    assert _frames_kept(path) == list(range(500 - (500 % 68) - 2 * 68, 500))
    # one file: it starts again when full, so it holds the frames since its last start
    one = tmp_path / "one" / "port1.pcap"
    one.parent.mkdir()
    w = PcapWriter(one, max_bytes=70_000, files=1)
    for i in range(100):
        w.write(frame(i))
    w.close()
    assert _frames_kept(one) == list(range(68, 100)) and [f.name for f in one.parent.iterdir()] == ["port1.pcap"]
    with pytest.raises(ValueError, match="each file needs at least 65575 bytes"):
        PcapWriter(tmp_path / "small.pcap", max_bytes=100_000, files=2)


PCAP_PROBE = r"""
import sys, time
from cais.rawsock import RawPort
h0, h1 = RawPort("h0"), RawPort("h1")
for i in range(int(sys.argv[2])):
    f = b"\xff" * 6 + bytes.fromhex("020000000100") + b"\x88\xb6" + i.to_bytes(4, "big") + bytes(982)
    h0.send(f)
    end = time.monotonic() + 10
    while f not in h1.recv_all():       # flooded to port 1: the switch has taken it (and captured it)
        assert time.monotonic() < end, i
        time.sleep(0.001)
print("sent")
"""


def test_daemon_pcap_capped_and_rotated(tmp_path):
    """cais-switch --pcap-max-mb 0.2 --pcap-files 2 (100,000 bytes a file) on veth pairs: 300 frames of 1000
    bytes into port 0; its capture stays within the cap, keeps the newest frames in order, and scapy
    reads each file."""
    with namespace() as ns:
        for i in range(2):
            veth(ns, f"s{i}", f"h{i}")
        with switch_daemon(ns, tmp_path, ["s0", "s1"], ("--pcap-max-mb", "0.2", "--pcap-files", "2")) as (_, sock, pcap):
            assert run_probe(ns, PCAP_PROBE, sock, "300").strip() == "sent"
            files = sorted(pcap.glob("port0.pcap*"))
            assert [f.name for f in files] == ["port0.pcap", "port0.pcap.1"]
            assert sum(f.stat().st_size for f in files) <= 200_000
            kept = _frames_kept(pcap / "port0.pcap")
            per_file = (100_000 - 24) // (16 + 1000)
            assert kept == list(range(300 - (300 % per_file) - per_file, 300))
