"""cais-switch (cais.sim.daemon) on real interfaces: veth pairs in a namespace of the test's own, frames
through AF_PACKET, the control endpoint, per-port faults, the pcap files, and bad arguments."""

import json
import subprocess
import sys

import pytest

from cais.params import SwitchParams
from cais.rawsock import read_pcap
from cais.registers import register_map
from netns import namespace, run_probe, switch_daemon, veth

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

def arrivals(wait=0.3):
    end, got = time.monotonic() + wait, [[], [], []]
    while time.monotonic() < end:
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
got = arrivals()
out["flood"] = [f1 in g for g in got]

regs = register_map(SwitchParams(**out["params"]))
target = 0x02_00_00_00_0A_0B
for addr, value in mac_writes(regs, 0, MacEntry(target, 2)):
    c.request("write", addr=addr, value=value)
f2 = frame(2, dst=target)
h[0].send(f2)
got = arrivals()
out["unicast"] = [f2 in g for g in got]

c.request("fault", port=1, drop=1.0)
f3 = frame(3)
h[0].send(f3)
got = arrivals()
out["faulty"] = [f3 in g for g in got]
out["fault_stats"] = c.request("stats")["faults"]["1"]
c.request("fault", port=1, drop=0.0)
f4 = frame(4)
h[0].send(f4)
got = arrivals()
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
    assert "index 7 out of range" in out["index"]
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
])
def test_bad_arguments_one_line_exit_2(args, message):
    p = subprocess.run([sys.executable, "-m", "cais.sim.daemon", *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cais-switch: error:") and message in lines[0], p.stderr

