"""The Lua dissector (wireshark/cais.lua) and the scapy layers (cais.dissect) decode a pcap that cais-switch
wrote: contributions of two ports, the switch's result, a repeat (RETRANSMIT) and host-ring DATA and ACK
frames, every field compared with cais.protocol's own parser of the same bytes.

tshark decodes it where it is installed (Debian's package: ``apt-get install tshark``); where it is not, the
scapy layer alone does, and the test says so (``-rP`` shows which ran). The end-to-end part needs root (a
namespace and veth pairs) and fails without it, as the other interface tests do."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from cais import protocol as proto
from cais.dissect import Cais, CaisHost
from cais.rawsock import PcapWriter, read_pcap
from netns import namespace, run_probe, switch_daemon, veth

LUA = Path(__file__).resolve().parents[2] / "wireshark" / "cais.lua"
CAIS_FIELDS = ("op_type", "group_id", "layer_id", "chunk_id", "total_chunks", "seq_num", "payload_len", "dtype",
               "red_op", "flags")
HOST_FIELDS = ("kind", "group_id", "op_seq", "step", "frag", "frags", "length")

PROBE = r"""
import json, sys, time
import numpy as np
from cais import protocol as proto
from cais.endpoint import connect
from cais.params import SwitchParams
from cais.rawsock import RawPort
from cais.registers import register_map
from cais.tables import Rule, rule_writes

c = connect(sys.argv[1])
h = [RawPort(f"h{i}") for i in range(2)]
regs = register_map(SwitchParams(**c.request("info")["params"]))
for addr, value in rule_writes(regs, 0, Rule.for_group(9, 0b11, base=0, count_log2=2, dtype=proto.DType.FP16)):
    c.request("write", addr=addr, value=value)
def contribution(port, values, flags=0):
    payload = np.asarray(values, ">f2").tobytes()
    hdr = proto.CaisHeader(group_id=9, layer_id=3, chunk_id=0, total_chunks=1, seq_num=5, payload_len=len(payload),
                           dtype=proto.DType.FP16, red_op=proto.ReduceOp.SUM, flags=flags)
    return proto.build_frame(hdr, payload, src=0x020000000100 | port, pad=True)
def await_frames(port, want, what):
    # each step waits for what the switch sends back (no fixed sleep: a busy machine is slow)
    got, end = [], time.monotonic() + 60
    while not want(got):
        assert time.monotonic() < end, f"never received {what}: {got}"
        got += port.recv_all()
        time.sleep(0.005)
def results(got):
    return [f for f in got if proto.parse_frame(f).cais is not None and proto.parse_frame(f).cais.flags & proto.Flags.RESULT]
h[0].send(contribution(0, [1.5, 2.0, -3.0]))
h[1].send(contribution(1, [0.25, 4.0, 1.0]))
await_frames(h[0], lambda got: results(got), "the result")
h[0].send(contribution(0, [1.5, 2.0, -3.0], flags=proto.Flags.RETRANSMIT))   # a repeat: the result again
await_frames(h[0], lambda got: results(got), "the result of the repeat")
data = proto.build_host_frame(proto.HostHeader(kind=proto.HostKind.DATA, group_id=9, op_seq=7, step=2, frag=1,
                                               frags=3, length=8), bytes(range(8)), dst=0x020000000101, src=0x020000000100)
ack = proto.build_host_frame(proto.HostHeader(kind=proto.HostKind.ACK, group_id=9, op_seq=7, step=2, frag=1, frags=3),
                             b"", dst=0x020000000100, src=0x020000000101)
h[0].send(data)
await_frames(h[1], lambda got: data in got, "the DATA frame")
h[1].send(ack)
await_frames(h[0], lambda got: ack in got, "the ACK frame")
print(json.dumps({"ok": True}))
"""


def tshark_decode(pcap: Path) -> list[dict]:
    """Every frame of `pcap` as tshark decodes it with the Lua dissector (JSON)."""
    p = subprocess.run(["tshark", "-X", f"lua_script:{LUA}", "-r", str(pcap), "-T", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Lua" not in p.stderr or "error" not in p.stderr.lower(), p.stderr
    return [f["_source"]["layers"] for f in json.loads(p.stdout)]


def _num(layer: dict, key: str) -> int:
    value = layer[key]
    return int(value, 16) if str(value).startswith("0x") else int(value)


def check_frames(frames: list[bytes], decoded: list[dict] | None) -> dict:
    """Compare every frame's CAIS / host header, as scapy and (if given) tshark decode it, with
    cais.protocol's parser; how many of each kind there were."""
    seen = {"cais": 0, "result": 0, "retransmit": 0, "host_data": 0, "host_ack": 0}
    for i, raw in enumerate(frames):
        eth = proto.EthHeader.unpack(raw)
        pkt = Ether(raw)
        t = decoded[i] if decoded is not None else None
        if eth.ethertype == proto.ETHERTYPE:
            ours = proto.parse_frame(raw)
            layer = pkt[Cais]
            want = {n: getattr(ours.cais, n) for n in CAIS_FIELDS}
            assert {n: int(layer.getfieldval(n)) for n in CAIS_FIELDS} == want
            assert layer[Raw].load == ours.payload
            if t is not None:
                got = {n: _num(t["cais"], f"cais.{n}") for n in CAIS_FIELDS}
                assert got == want, (i, got, want)
                assert t["cais.payload"].replace(":", "") == ours.payload.hex()
                assert int(t["cais"]["cais.flags_tree"]["cais.flags.result"]) == bool(ours.cais.flags & proto.Flags.RESULT)
            seen["cais"] += 1
            seen["result"] += bool(ours.cais.flags & proto.Flags.RESULT)
            seen["retransmit"] += bool(ours.cais.flags & proto.Flags.RETRANSMIT)
        elif eth.ethertype == proto.HOST_ETHERTYPE:
            hdr = proto.HostHeader.unpack(raw[proto.ETH_HEADER_BYTES:])
            want = {n: getattr(hdr, n) for n in HOST_FIELDS}
            assert {n: int(pkt[CaisHost].getfieldval(n)) for n in HOST_FIELDS} == want
            if t is not None:
                got = {n: _num(t["cais_host"], f"cais_host.{n}") for n in HOST_FIELDS}
                assert got == want, (i, got, want)
            seen["host_data" if hdr.kind == proto.HostKind.DATA else "host_ack"] += 1
    return seen


def decoders() -> str:
    return "tshark (wireshark/cais.lua) and scapy (cais.dissect)" if shutil.which("tshark") else \
        "scapy (cais.dissect) only: tshark is not installed"


def test_decode_a_pcap_written_by_the_package(tmp_path):
    """Without root: frames of every kind through PcapWriter (cais-switch's writer), decoded."""
    path = tmp_path / "frames.pcap"
    w = PcapWriter(path)
    frames = [proto.build_frame(proto.CaisHeader(group_id=g, seq_num=1000 + g, chunk_id=g, total_chunks=8,
                                                 payload_len=4 * g, dtype=g % 6, red_op=g % 3, flags=g % 4,
                                                 op_type=g % 3), bytes(range(4 * g)), pad=True) for g in range(1, 9)]
    frames.append(proto.build_host_frame(proto.HostHeader(kind=proto.HostKind.DATA, op_seq=2**31 + 5, step=1,
                                                          frag=0, frags=1, length=3), b"abc", dst=1, src=2))
    for f in frames:
        w.write(f)
    w.close()
    assert [f for _, f in read_pcap(path)] == frames
    decoded = tshark_decode(path) if shutil.which("tshark") else None
    seen = check_frames(frames, decoded)
    assert seen["cais"] == 8 and seen["host_data"] == 1
    print(f"decoded with {decoders()}")


def test_decode_a_pcap_written_by_cais_switch(tmp_path):
    with namespace() as ns:
        for i in range(2):
            veth(ns, f"s{i}", f"h{i}")
        with switch_daemon(ns, tmp_path, ["s0", "s1"]) as (_, sock, pcap):
            run_probe(ns, PROBE, sock)
    frames = [f for _, f in read_pcap(pcap / "port0.pcap")]
    decoded = tshark_decode(pcap / "port0.pcap") if shutil.which("tshark") else None
    seen = check_frames(frames, decoded)
    # port 0: its contribution and repeat, the result twice (the first time, and for the repeat), the
    # DATA it sent and the ACK port 1 sent it
    assert seen == {"cais": 4, "result": 2, "retransmit": 1, "host_data": 1, "host_ack": 1}, seen
    result = next(proto.parse_frame(f) for f in frames if proto.EthHeader.unpack(f).ethertype == proto.ETHERTYPE
                  and proto.parse_frame(f).cais.flags & proto.Flags.RESULT)
    assert np.array_equal(np.frombuffer(result.payload, ">f2"), np.array([1.75, 6.0, -2.0], np.float16))
    if decoded is not None:
        infos = [d["frame"]["frame.protocols"] for d in decoded]
        assert sum(p.endswith(":cais") for p in infos) == 4 and sum(p.endswith(":cais_host") for p in infos) == 2
    print(f"decoded with {decoders()}")
