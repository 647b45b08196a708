"""Issue 29, parts 2 and 4 (M2, M4, M5): hostile clients of the ranks' coordinator and of the HTTP service.

The coordinator under attack is a real ``python -m cais.coordinator`` process driving a real cais-switch on
veth pairs in a namespace of the test's own; the attacker holds the token (a rank gone rogue, or a leaked
token) or does not.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from cais.config import Config
from cais.coordinator import Coordinator
from cais.endpoint import MAX_CONNECTIONS, EndpointError, connect
from cais.params import SwitchParams
from cais.service import ControllerService
from daemons import in_process_switch, raw_lines
from netns import namespace, python_in, stop, veth

TOKEN = "s3cret-for-tests"


@contextlib.contextmanager
def coordinator(tmp_path, ranks=2, preexec_fn=None):
    """cais-switch on `ranks` veth pairs and ``python -m cais.coordinator`` on it (its token in CAIS_TOKEN);
    yields (coordinator process, its socket, the switch's socket) once it answers."""
    sw_sock, coord_sock, ready = tmp_path / "sw.sock", tmp_path / "coord.sock", tmp_path / "ready"
    (tmp_path / "token").write_text(TOKEN + "\n")
    os.chmod(tmp_path / "token", 0o600)
    with namespace() as ns:
        for i in range(ranks):
            veth(ns, f"s{i}", f"h{i}")
        log = open(tmp_path / "switch.log", "wb")
        switch = python_in(ns, ["-m", "cais.sim.daemon", "--control", str(sw_sock), "--ready-file", str(ready),
                                *[f"s{i}" for i in range(ranks)]], stdout=log, stderr=log)
        coord = None
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert switch.poll() is None and time.monotonic() < deadline, (tmp_path / "switch.log").read_text()
                time.sleep(0.05)
            clog = open(tmp_path / "coord.log", "wb")
            coord = subprocess.Popen([sys.executable, "-m", "cais.coordinator", "--switch", str(sw_sock), "--listen",
                                      str(coord_sock), "--world-size", str(ranks)], stdout=clog, stderr=clog,
                                     start_new_session=True, env={"PATH": os.environ["PATH"], "CAIS_TOKEN": TOKEN},
                                     preexec_fn=preexec_fn)
            connect(str(coord_sock), retry_for=30, token=TOKEN).close()
            yield coord, coord_sock, sw_sock
        finally:
            if coord is not None:
                stop(coord)
            stop(switch)


def rank(sock, r, size=2):
    c = connect(str(sock), token=TOKEN, name=f"rank {r}")
    c.request("hello", rank=r, world_size=size)
    return c


def refused(conn, op, **fields) -> str:
    with pytest.raises(EndpointError) as e:
        conn.request(op, **fields)
    return str(e.value)


def test_coordinator_refuses_to_start_without_a_token(tmp_path):
    """M2: ``python -m cais.coordinator`` had no token option and checked none."""
    with coordinator(tmp_path) as (_, _, sw_sock):
        (tmp_path / "empty").write_text("\n")
        for extra, needle in (([], "a token is required"), (["--token-file", str(tmp_path / "empty")], "is empty")):
            out = subprocess.run([sys.executable, "-m", "cais.coordinator", "--switch", str(sw_sock), "--listen",
                                  str(tmp_path / "other.sock"), "--world-size", "2", *extra], capture_output=True,
                                 text=True, timeout=60, env={"PATH": os.environ["PATH"]})
            assert out.returncode == 2 and needle in out.stderr, out.stderr
            assert len(out.stderr.strip().splitlines()) == 1
        # with --token-file it runs, and wants that token
        coord = subprocess.Popen([sys.executable, "-m", "cais.coordinator", "--switch", str(sw_sock), "--listen",
                                  str(tmp_path / "other.sock"), "--world-size", "2", "--token-file",
                                  str(tmp_path / "token")], start_new_session=True, env={"PATH": os.environ["PATH"]},
                                 stderr=subprocess.DEVNULL)
        try:
            c = connect(str(tmp_path / "other.sock"), retry_for=30, token=TOKEN)
            assert c.request("ping")["ok"]
            wrong = connect(str(tmp_path / "other.sock"), token="wrong")
            assert "unauthorised" in refused(wrong, "hello", rank=0, world_size=2)
        finally:
            stop(coord)


def test_a_token_holder_cannot_speak_for_another_rank(tmp_path):
    """M2: requests name a rank; only the connection that joined as that rank may speak for it."""
    with coordinator(tmp_path) as (coord, sock, _):
        r0, r1 = rank(sock, 0), rank(sock, 1)
        intruder = connect(str(sock), token=TOKEN, name="intruder")
        # the reproducer: a rejoin on a live controller claimed rank 1, and its disconnect killed it
        assert "did not restart" in refused(intruder, "rejoin", rank=1, world_size=2, groups=[])
        assert "joined twice" in refused(intruder, "hello", rank=1, world_size=2)
        assert "no rank yet" in refused(intruder, "finished", rank=1, group=1, op_seq=0)
        assert "no rank yet" in refused(intruder, "decide", group=1, op_seq=0, nbytes=4, kind={})
        assert "said hello" in refused(intruder, "bye", rank=1)
        assert "no rank has that session" in refused(intruder, "attach", session="guess")
        # a rank speaks for itself only
        assert "this connection is rank 0" in refused(r0, "finished", rank=1, group=1, op_seq=0)
        assert "this connection is rank 0" in refused(r0, "group", rank=1, ranks=[0, 1], call=0)
        assert "did not restart" in refused(r0, "rejoin", rank=0, world_size=2, groups=[
            {"group_id": 1, "ranks": [0, 1], "base": 60, "count_log2": 5, "rule_index": 0,
             "next_seq": 2 ** 32 - 6, "next_op": 0, "world": True}])
        intruder.close()
        # rank 1 is alive and well: nobody could kill it
        assert r0.request("ping")["dead"] == [] and r1.request("ping")["dead"] == []
        assert coord.poll() is None


def test_bye_frees_the_rank_at_once(tmp_path):
    with coordinator(tmp_path) as (_, sock, _):
        r0, r1 = rank(sock, 0), rank(sock, 1)
        r1.request("bye", rank=1)
        again = rank(sock, 1)                          # the same rank joins again while r1's socket is open
        assert again.request("ping")["dead"] == [] and r0.request("ping")["dead"] == []
        r1.close()
        assert again.request("ping")["dead"] == []     # the old connection's end kills nobody


HOSTILE = [
    b"[" * 5000,
    b'{"op":"hello","rank":1e400,"world_size":2,"token":"' + TOKEN.encode() + b'"}',
    b'{"op":"hello","rank":true,"world_size":2,"token":"' + TOKEN.encode() + b'"}',
    b'{"op":"hello","rank":[0],"world_size":2,"token":"' + TOKEN.encode() + b'"}',
    b'{"op":"hello","rank":0,"world_size":1.5,"token":"' + TOKEN.encode() + b'"}',
    b'{"op":"ping","token":' + b"[" * 100 + b"]" * 100 + b"}",
    b'\xff\xfe',
    b'{"op":"ping","token":["' + TOKEN.encode() + b'"]}',
]


def test_hostile_lines_each_get_an_error_and_the_coordinator_goes_on(tmp_path):
    with coordinator(tmp_path) as (coord, sock, _):
        for line, answer in zip(HOSTILE, raw_lines(sock, HOSTILE, who="the coordinator")):
            assert answer["ok"] is False and answer["error"], (line[:60], answer)
        # a line past the cap: the connection ends (no quadratic buffering, no memory growth)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(str(sock))
        try:
            s.sendall(b'{"op":"ping","x":"' + b"x" * (4 << 20))
            assert s.recv(1 << 16) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
        s.close()
        assert coord.poll() is None
        assert rank(sock, 0).request("ping")["ok"]


@pytest.mark.slow               # waits out AUTH_IDLE_S (10 s)
def test_connection_cap_and_silence_before_the_token(tmp_path):
    """M5: connections past MAX_CONNECTIONS are closed at once; one that sends nothing is closed after
    AUTH_IDLE_S (10 s) instead of holding a thread for ever."""
    with coordinator(tmp_path) as (coord, sock, _):
        idle = []
        for _ in range(MAX_CONNECTIONS):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(sock))                       # blocking: waits while the backlog is full
            c.settimeout(60)
            idle.append(c)
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(str(sock))
        extra.settimeout(60)
        try:
            extra.sendall(json.dumps({"op": "ping", "token": TOKEN}).encode() + b"\n")
            assert extra.recv(4096) == b""            # closed, unanswered
        except (ConnectionResetError, BrokenPipeError):
            pass
        for c in idle:                                 # each silent one is closed by the coordinator
            try:
                assert c.recv(4096) == b""
            except ConnectionResetError:
                pass
            c.close()
        assert coord.poll() is None
        assert rank(sock, 0).request("ping")["ok"]


def test_out_of_file_descriptors_the_coordinator_keeps_accepting(tmp_path):
    """M5: at the descriptor limit the rank accept loop exited for good. Now it backs off and, once the
    silent connections are closed (AUTH_IDLE_S) or go, answers again."""
    import resource

    def few_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    with coordinator(tmp_path, preexec_fn=few_fds) as (coord, sock, _):
        conns = []
        try:
            for _ in range(MAX_CONNECTIONS):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.settimeout(2)
                try:
                    c.connect(str(sock))
                except OSError:                        # the backlog is full: it stopped accepting
                    c.close()
                    break
                conns.append(c)
            deadline = time.monotonic() + 30
            while "cannot accept" not in (tmp_path / "coord.log").read_text():
                assert time.monotonic() < deadline and coord.poll() is None, (tmp_path / "coord.log").read_text()
                time.sleep(0.05)
        finally:
            for c in conns:
                c.close()
        c = connect(str(sock), token=TOKEN, retry_for=30, timeout=30)
        c.request("hello", rank=0, world_size=2)
        assert c.request("ping")["ok"] and coord.poll() is None


PARAMS = SwitchParams(ports=4, slots=64)


@pytest.fixture
def switch(tmp_path):
    sock = str(tmp_path / "switch.sock")
    with in_process_switch(sock, PARAMS):
        yield sock


def test_rejoin_only_while_recovering_and_inside_the_quotas(switch, tmp_path):
    """M2: a recovering coordinator refuses groups outside sram_usage_limit or the per-group quota, and a
    second rejoin of a rank; a running job's ranks cannot rejoin."""
    coord = Coordinator(switch, 4, Config(), token=TOKEN, recover=True)
    coord.serve(str(tmp_path / "c.sock"))
    try:
        usable = int(Config().sram_usage_limit * PARAMS.slots)
        c = connect(str(tmp_path / "c.sock"), token=TOKEN)

        def group(**kw):
            return dict({"group_id": 1, "ranks": [0, 1], "base": 0, "count_log2": 5, "rule_index": 0,
                         "next_seq": 0, "next_op": 0, "world": True}, **kw)
        for g, needle in [(group(base=usable - 16), "exceed the quota"),          # past sram_usage_limit
                          (group(count_log2=6), "exceed the quota"),              # above slots_per_group
                          (group(next_seq=2 ** 40), "not in 0.."),
                          (group(next_seq=1.5), "must be an integer"),
                          (group(rule_index=99), "not in 0.."),
                          (group(group_id=0), "not in 1..255"),
                          (group(ranks=[1, 1]), "not in group")]:
            assert needle in refused(c, "rejoin", rank=0, world_size=2, groups=[g]), g
        assert coord.controller.groups == {}                     # nothing adopted, nothing written
        c.request("rejoin", rank=0, world_size=2, groups=[group()])
        again = connect(str(tmp_path / "c.sock"), token=TOKEN)
        assert "already rejoined" in refused(again, "rejoin", rank=0, world_size=2, groups=[group()])
        assert "already rank 0" in refused(c, "rejoin", rank=1, world_size=2, groups=[group()])
        # a job that started after the restart is not rejoined
        h = connect(str(tmp_path / "c.sock"), token=TOKEN)
        h.request("hello", rank=0, world_size=1, job="fresh", hosts=[3])
        late = connect(str(tmp_path / "c.sock"), token=TOKEN)
        assert "started after the restart" in refused(late, "rejoin", rank=0, world_size=1, job="fresh", hosts=[3],
                                                       groups=[])
    finally:
        coord.close()


def test_http_connection_cap(switch, tmp_path):
    """M5: 2,000 idle HTTP connections made 2,005 threads; past the cap a connection is closed at once."""
    svc = ControllerService(switch, 4, Config(), token=TOKEN)
    svc.serve(str(tmp_path / "ctl.sock"), "127.0.0.1:0")
    try:
        idle = [socket.create_connection(("127.0.0.1", svc.http_port), timeout=60) for _ in range(MAX_CONNECTIONS)]
        extra = socket.create_connection(("127.0.0.1", svc.http_port), timeout=60)
        try:
            extra.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
            assert extra.recv(4096) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
        extra.close()
        for c in idle:
            c.close()
        deadline = time.monotonic() + 30
        while True:                                  # the idle connections' threads end as they see EOF
            req = urllib.request.Request(f"http://127.0.0.1:{svc.http_port}/v1/health",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert json.loads(r.read())["ok"]
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        svc.close()


def _raw_http(port: int, request: bytes) -> list[tuple[int, bytes]]:
    """Send raw bytes to the HTTP service and read every response until it closes the connection: (status,
    body) each. Sent with ``Connection: close`` semantics where the request says so."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(request)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    s.close()
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                      if line.lower().startswith(b"content-length:"))
        out.append((status, rest[:length]))
        data = rest[length:]
    return out


def test_http_deep_json_chunked_bodies_escaped_and_rate_limited_logs(switch, tmp_path, caplog, monkeypatch):
    """L3: a body of 30,000 `[` got no answer (the parser's RecursionError killed the handler); a chunked
    body was not read, so its bytes came back as a second request; an unauthenticated path's ANSI escape
    went into the log as it was; every 401 logged a warning. Now: 400 naming the nesting; 501 and the
    connection closed after it (one response, nothing else taken for a request, no rule written); the
    escape logged as \\x1b; one warning for 40 refusals while the limiter's clock stands still, the next one
    (its clock past the interval) saying how many were kept quiet."""
    import logging
    svc = ControllerService(switch, 4, Config(), token=TOKEN)
    svc.serve(str(tmp_path / "ctl.sock"), "127.0.0.1:0")
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    try:
        deep = b"[" * 30_000
        answers = _raw_http(svc.http_port, b"POST /v1/rules HTTP/1.1\r\nHost: x\r\n" + auth
                            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(deep) + deep)
        assert [a[0] for a in answers] == [400] and b"nested deeper than" in answers[0][1], answers
        # a chunked body whose bytes are a whole request of their own (a rule): never run
        inner = json.dumps({"index": 5, "rule": {"group": [99, 255], "contributors": 3, "base": 60}}).encode()
        smuggled = (b"POST /v1/rules HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(inner)
                    + inner)
        chunked = (b"POST /v1/rules HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
                   + smuggled)
        answers = _raw_http(svc.http_port, chunked)
        assert [a[0] for a in answers] == [501], answers
        assert 5 not in [index for index, _, _ in svc.controller.dump_rules()]
        assert svc.http_refused.get("chunked") == 1
        # logs: the escape escaped; 40 refusals, one warning
        clock = [1000.0]
        monkeypatch.setattr(svc.token_warnings, "clock", lambda: clock[0])
        caplog.set_level(logging.WARNING, logger="cais.service")
        for i in range(40):
            _raw_http(svc.http_port, b"GET /\x1b[31mred" + str(i).encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        warnings = [r.getMessage() for r in caplog.records if "without the token" in r.getMessage()]
        assert len(warnings) == 1 and "\\x1b[31mred0" in warnings[0] and "\x1b" not in warnings[0], warnings
        clock[0] += 60
        _raw_http(svc.http_port, b"GET /again HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        warnings = [r.getMessage() for r in caplog.records if "without the token" in r.getMessage()]
        assert len(warnings) == 2 and "/again" in warnings[1] and "39 more refused" in warnings[1], warnings
        assert svc.http_refused["token"] == 41
    finally:
        svc.close()
