"""Issue 29, part 2 and M7: hostile clients of cais-switch's control endpoint (docs/security.md).

Each test starts a real cais-switch (the model) on veth pairs in a namespace of its own, attacks its control
socket as an outside client would (hostile lines, a client that never reads, more connections than file
descriptors, a non-root user), then checks that the daemon is alive, still forwards frames and still answers.
"""

import json
import os
import resource
import socket
import stat
import subprocess
import sys
import time

from cais.endpoint import connect
from cais.registers import register_map
from cais.params import SwitchParams
from daemons import raw_lines
from netns import namespace, python_in, run_probe, stop, veth
from nonroot import nonroot_uid

PORTS = 3

FORWARD = r"""
import json, sys, time
from cais import protocol as proto
from cais.rawsock import RawPort
tag = int(sys.argv[1])
h = [RawPort(f"h{i}") for i in range(3)]
f = proto.build_host_frame(proto.HostHeader(op_seq=tag), b"alive%d" % tag, dst=proto.BROADCAST_MAC,
                           src=0x02_00_00_00_01_00)
h[0].send(f)
got, end = [False, False], time.monotonic() + 20
while not all(got) and time.monotonic() < end:        # a broadcast reaches ports 1 and 2 (or 20 s pass)
    for i in (1, 2):
        got[i - 1] = got[i - 1] or f in h[i].recv_all()
    time.sleep(0.005)
print(json.dumps(got))
"""


def start_switch(ns, tmp_path, control, preexec_fn=None, extra=()):
    """cais-switch on s0..s2 of `ns`, control endpoint `control`; (process, log path) once ready."""
    ready, log_path = tmp_path / "ready", tmp_path / "switch.log"
    for i in range(PORTS):
        veth(ns, f"s{i}", f"h{i}")
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)     # a TCP control endpoint
    log = open(log_path, "wb")
    proc = python_in(ns, ["-m", "cais.sim.daemon", "--control", str(control), "--ready-file", str(ready), *extra,
                          *[f"s{i}" for i in range(PORTS)]], stdout=log, stderr=log, preexec_fn=preexec_fn)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)
    return proc, log_path


def forwards(ns, tag) -> bool:
    return json.loads(run_probe(ns, FORWARD, tag)) == [True, True]


HOSTILE = [
    b'{"op":"read","addr":1e400}',                                 # H3: OverflowError
    b'{"op":"write","reg":"RULE_SLOTS","fields":[1]}',             # H3: AttributeError
    b'{"op":"read","reg":"RX_FRAMES","index":1e400}',
    b"[" * 5000,                                                  # H3: RecursionError
    b'{"op":"read","addr":3.5}',
    b'{"op":"read","addr":true}',
    b'{"op":"read","addr":[0]}',
    b'{"op":"read","addr":-4}',
    b'{"op":"read","addr":4294967296}',
    b'{"op":"read","reg":["ID"]}',
    b'{"op":"read","reg":{"a":1}}',
    b'{"op":"write","reg":"SWITCH_MAC_LO","value":1.0}',
    b'{"op":"write","reg":"SWITCH_MAC_LO","value":"1"}',
    b'{"op":"write","reg":"SWITCH_MAC_LO","value":false}',
    b'{"op":"write","reg":"RULE_SLOTS","fields":{"base":1e400}}',
    b'{"op":"write","reg":"RULE_SLOTS","fields":{"nope":1}}',
    b'{"op":"fault","port":1,"drop":1e400}',
    b'{"op":"fault","port":1,"drop":NaN}',
    b'{"op":"fault","port":0.5}',
    b'{"op":"fault","port":1,"seed":1e400}',
    b'{"op":[1]}',
    b'\xff\xfe not utf-8',
    b'"a string"',
    b'{"op":"read","reg":"ID","x":' + b"[" * 50 + b"]" * 50 + b"}",
]


def test_hostile_lines_each_get_an_error_and_the_daemon_goes_on(tmp_path):
    sock = tmp_path / "sw.sock"
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, sock)
        try:
            answers = raw_lines(sock, who="the daemon", lines=HOSTILE + [b'{"op":"read","reg":"ID"}'])
            for line, answer in zip(HOSTILE, answers):
                assert answer["ok"] is False and answer["error"], (line[:60], answer)
                assert "\n" not in answer["error"] and len(answer["error"]) <= 250, answer
            params = SwitchParams(ports=PORTS)
            assert answers[-1] == {"ok": True, "value": register_map(params)["ID"].reset}   # same connection
            assert proc.poll() is None, log.read_text()
            assert forwards(ns, 1)
            mac_lo = register_map(params)["SWITCH_MAC_LO"].reset
            assert connect(str(sock)).request("read", reg="SWITCH_MAC_LO")["value"] == mac_lo   # nothing written
        finally:
            stop(proc)
        assert "Traceback" not in log.read_text()


def test_line_past_the_cap_is_refused_and_the_client_dropped(tmp_path):
    sock = tmp_path / "sw.sock"
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, sock)
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(60)
            s.connect(str(sock))
            got = b""
            try:
                s.sendall(b'{"op":"info","pad":"' + b"x" * (3 << 20))     # 3 MiB, no end of line
            except OSError:
                pass                                     # the daemon may close while we still send
            try:
                while True:
                    data = s.recv(1 << 16)
                    if not data:
                        break
                    got += data
            except ConnectionResetError:
                pass
            s.close()
            assert b"longer than" in got, got[:200]
            assert proc.poll() is None and forwards(ns, 2)
            assert connect(str(sock)).request("stats")["control_dropped"] == 1
        finally:
            stop(proc)


def test_client_that_never_reads_is_dropped_and_frames_keep_flowing(tmp_path):
    """H4: requests sent, answers never read. The daemon must not block on that client."""
    sock = tmp_path / "sw.sock"
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, sock)
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(sock))
            s.setblocking(False)
            burst, sent = b'{"op":"info"}\n' * 4096, 0
            while sent < 64 << 20:                     # until the socket takes no more (or 64 MiB)
                try:
                    sent += s.send(burst)
                except BlockingIOError:
                    break
                except OSError:
                    break                              # already dropped
            assert forwards(ns, 3), "no frame forwarded while a control client does not read"
            assert connect(str(sock)).request("stats")["control_dropped"] >= 1
            assert proc.poll() is None
            s.close()
        finally:
            stop(proc)
        assert "does not read its answers" in log.read_text()


def test_out_of_file_descriptors_the_daemon_backs_off_and_serves_again(tmp_path):
    """M5: more control connections than the daemon has descriptors for (RLIMIT_NOFILE 48)."""
    sock = tmp_path / "sw.sock"

    def few_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, sock, preexec_fn=few_fds)
        conns = []
        try:
            for _ in range(60):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.settimeout(5)
                try:
                    c.connect(str(sock))
                except OSError:
                    c.close()
                    break
                conns.append(c)
            deadline = time.monotonic() + 30
            while "too many control clients" not in log.read_text():
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.05)
            assert forwards(ns, 4)                     # frames go on: descriptors were kept for the ports
            for c in conns:
                c.close()
            conns.clear()
            c = connect(str(sock), retry_for=30, timeout=30)
            assert c.request("info")["params"]["ports"] == PORTS
            assert proc.poll() is None and forwards(ns, 5)
        finally:
            for c in conns:
                c.close()
            stop(proc)


def test_control_socket_is_0600_under_umask_000_and_refuses_another_user(tmp_path):
    """M7: the socket's mode no longer follows the umask; a non-root user cannot connect."""
    os.chmod(tmp_path, 0o755)                          # the folder alone does not keep the user out
    sock = tmp_path / "sw.sock"
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, sock, preexec_fn=lambda: os.umask(0))
        try:
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            uid = nonroot_uid()
            probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
                     "try:\n    s.connect(sys.argv[1])\n    print('connected')\n"
                     "except PermissionError:\n    print('refused')\n")
            out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                                  "-c", probe, str(sock)], capture_output=True, text=True, timeout=60)
            assert out.stdout.strip() == "refused", (out.stdout, out.stderr)
        finally:
            stop(proc)


NONROOT_WRITE = r"""
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
s.sendall(b'{"op":"write","reg":"SWITCH_MAC_LO","value":21845}\n{"op":"read","reg":"ID"}\n')
data = b""
try:
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
except ConnectionResetError:
    pass                  # closed with our lines unread: the answer may be lost, the refusal is in its log
print(json.dumps([json.loads(line) for line in data.splitlines()]))
"""


def test_tcp_control_refuses_a_non_root_local_user(tmp_path):
    """M7: on 127.0.0.1 every local user could program the switch; now only root and the daemon's user."""
    port = 7711
    with namespace() as ns:
        proc, log = start_switch(ns, tmp_path, f"127.0.0.1:{port}", extra=["--pcap", str(tmp_path / "pcap")])
        try:
            uid = nonroot_uid()
            out = subprocess.run(["ip", "netns", "exec", ns, "setpriv", f"--reuid={uid}", f"--regid={uid}",
                                  "--clear-groups", sys.executable, "-c", NONROOT_WRITE, str(port)],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            answers = json.loads(out.stdout)
            assert len(answers) <= 1 and all(not a["ok"] and f"uid {uid}" in a["error"] for a in answers), answers
            value = json.loads(run_probe(ns, "import json, sys\nfrom cais.endpoint import connect\n"
                                             "c = connect(sys.argv[1])\n"
                                             "print(json.dumps(c.request('read', reg='SWITCH_MAC_LO')['value']))",
                                         f"127.0.0.1:{port}"))
            assert value == register_map(SwitchParams(ports=PORTS))["SWITCH_MAC_LO"].reset   # never written
            assert proc.poll() is None and forwards(ns, 6)
        finally:
            stop(proc)
        assert f"refused a client of uid {uid}" in log.read_text()
