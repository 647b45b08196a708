"""cais-controller and cais-cli without namespaces: cais-switch's event loop (the model, no interfaces) on a
Unix socket in a thread, the service in this process, rank clients over the JSON-lines endpoint, cais-cli
as a subprocess. The token, the HTTP API, the metrics, a restart that loses no group, and a catalogue of
bad requests and arguments that are refused and change nothing."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from cais.cli import Client, ServiceError
from cais.config import Config
from cais.coordinator import kind_to_dict
from cais.allreduce import CollectiveKind
from cais.endpoint import EndpointError, connect
from cais.params import SwitchParams
from cais.service import ControllerService

from daemons import in_process_switch
from inprocess import run_main

TOKEN = "s3cret-token"
PARAMS = SwitchParams(ports=4)


@pytest.fixture
def switch(tmp_path):
    sock = str(tmp_path / "switch.sock")
    with in_process_switch(sock, PARAMS) as daemon:
        yield sock, daemon


def start(switch_sock, tmp_path, recover=False, name="ctl"):
    svc = ControllerService(switch_sock, 4, Config(offload="always", reevaluate_interval_ms=20), token=TOKEN,
                            recover=recover)
    svc.serve(str(tmp_path / f"{name}.sock"), "127.0.0.1:0")
    return svc


def cli(svc, *args, token=TOKEN):
    env = {"PATH": "/usr/bin:/bin", "CAIS_TOKEN": token} if token else {"PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "cais.cli", "--controller", f"127.0.0.1:{svc.http_port}", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def cli_here(svc, *args, token=TOKEN):
    """cais-cli in this process (tests/inprocess.py), with :func:`cli`'s environment for the CAIS variables:
    for the catalogue's many calls; :func:`cli` runs the installed command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIS_")}
    if token:
        env["CAIS_TOKEN"] = token
    return run_main(["-m", "cais.cli", "--controller", f"127.0.0.1:{svc.http_port}", *args], env=env)


def rank_clients(svc, tmp_path, name="ctl"):
    return [connect(str(tmp_path / f"{name}.sock"), name="rank", token=TOKEN) for _ in range(4)]


def one_collective(conns, group, op_seq, nbytes=1000, rtt=50e-6):
    d = None
    while d is None:
        d = conns[0].request("decide", group=group, op_seq=op_seq, nbytes=nbytes, kind=kind_to_dict(CollectiveKind()))["decision"]
    for r, c in enumerate(conns):
        c.request("finished", rank=r, group=group, op_seq=op_seq, rtt=rtt * (1 + r))
    return d


def http(svc, method, path, body=None, token=TOKEN, headers=None):
    req = urllib.request.Request(f"http://127.0.0.1:{svc.http_port}{path}", data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def state(svc):
    """What a refused request must not change: rules, groups, the switch's rule-related writes."""
    c = Client(f"127.0.0.1:{svc.http_port}", TOKEN)
    return json.dumps([c.request("GET", "/v1/rules")["rules"], c.request("GET", "/v1/groups")["groups"]], sort_keys=True)


def test_cli_and_metrics_against_a_running_service(switch, tmp_path):
    sock, daemon = switch
    svc = start(sock, tmp_path)
    try:
        conns = rank_clients(svc, tmp_path)
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        for op in range(3):
            d = one_collective(conns, 1, op, nbytes=1000)
            assert d["offload"]
        # add-rule, dump-rules, del-rule
        p = cli(svc, "add-rule", "7", "--group", "200", "--contributors", "2,3", "--base", "56", "--count-log2", "2",
                "--dtype", "fp16", "--op", "max")
        assert p.returncode == 0 and p.stdout.strip() == "rule 7 added", p.stderr
        p = cli(svc, "--json", "dump-rules")
        rules = json.loads(p.stdout)["rules"]
        assert [(x["index"], x["owner"]) for x in rules] == [(0, "group 1"), (7, "operator")]
        assert rules[1]["rule"]["group"] == [200, 255] and rules[1]["rule"]["contributors"] == 0b1100
        p = cli(svc, "dump-rules")
        assert p.returncode == 0 and "operator" in p.stdout and "fp16 max" in p.stdout and "2,3" in p.stdout
        # show-groups: the controller's accounting, chunks x ranks, as the switch's counters say
        g = json.loads(cli(svc, "--json", "show-groups").stdout)["groups"][0]
        chunks = -(-1000 // 256)
        assert (g["collectives"], g["offloaded"], g["completions"], g["contributions"], g["bytes_reduced"]) == \
            (3, 3, 3 * chunks, 3 * chunks * 4, 3000)
        assert "host only" not in cli(svc, "show-groups").stdout
        # show-stats: P50 / P99 of the queue delay (rtt - min rtt: 0, 50, 100, 150 us per collective)
        st = _until(lambda: json.loads(cli(svc, "--json", "show-stats").stdout)["stats"],
                    lambda st: st["queue_delay_s"]["count"] == 12, "an evaluation with the 12 round trips")
        assert st["queue_delay_s"]["p50"] == pytest.approx(50e-6) and st["queue_delay_s"]["p99"] == pytest.approx(150e-6)
        assert st["collective_latency_s"]["count"] == 3 and st["bytes_reduced"] == 3000
        text = cli(svc, "show-stats").stdout
        assert "P50 50 us  P99 150 us" in text and "switch 3 (3000 B)" in text
        p = cli(svc, "--json", "watch", "--count", "2", "--interval", "0.05")
        assert p.returncode == 0 and len(p.stdout.strip().splitlines()) == 2
        p = cli(svc, "del-rule", "7")
        assert p.returncode == 0 and p.stdout.strip() == "rule 7 deleted"
        # metrics: scraped with the token, the histograms and the derived counters
        status, body = http(svc, "GET", "/metrics")
        text = body.decode()
        assert status == 200
        assert 'cais_group_completions_total{group="1"} %d.0' % (3 * chunks) in text
        assert 'cais_group_contributions_total{group="1"} %d.0' % (12 * chunks) in text
        assert "cais_queue_delay_seconds_count 12.0" in text and "cais_collective_latency_seconds_count 3.0" in text
        assert 'cais_group_sets_allocated{group="1"} 64.0' in text
        assert 'cais_drops_total{reason="NO_RULE"} 0.0' in text and "cais_fallback_ratio 0.0" in text
        assert 'cais_collective_bytes_total{path="switch"} 3000.0' in text
        status, _ = http(svc, "GET", "/metrics", token=None)
        assert status == 401
        status, body = http(svc, "GET", "/metrics")
        assert 'cais_requests_refused_total{endpoint="http",reason="token"} 1.0' in body.decode()
    finally:
        svc.close()


def test_restart_loses_no_group(switch, tmp_path):
    sock, daemon = switch
    svc = start(sock, tmp_path)
    conns = rank_clients(svc, tmp_path)
    for r, c in enumerate(conns):
        c.request("hello", rank=r, world_size=4)
    # a second group: ranks 1 and 2
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, conns[r].request("group", rank=r, ranks=[1, 2], call=0)["group"]))
               for r in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)                        # a safety net: returns once answered
    pair = out[1]
    d = one_collective(conns, 1, 0, nbytes=4000)
    before = Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/groups")["groups"]
    for c in conns:
        c.close()
    svc.close()                                            # the controller goes away
    svc = start(sock, tmp_path, recover=True, name="ctl2")
    try:
        conns = rank_clients(svc, tmp_path, "ctl2")
        with pytest.raises(EndpointError, match="rejoin"):
            conns[0].request("decide", group=1, op_seq=1, nbytes=4000, kind=kind_to_dict(CollectiveKind()))
        world = {k: before[0][k] for k in ("group_id", "ranks", "base", "rule_index")}
        chunks = -(-4000 // d["chunk_bytes"])
        for r, c in enumerate(conns):
            groups = [dict(world, count_log2=5, next_op=1, next_seq=d["seq_base"] + chunks)]
            if r in (1, 2):
                groups.append(dict(pair, next_op=0, next_seq=0))
            c.request("rejoin", rank=r, world_size=4, groups=groups)
        after = Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/groups")["groups"]
        key = lambda g: (g["group_id"], g["ranks"], g["base"], g["slots"], g["rule_index"])   # noqa: E731
        assert [key(g) for g in after] == [key(g) for g in before]
        d1 = one_collective(conns, 1, 1, nbytes=4000)            # the world group goes on where it was
        assert d1["offload"] and d1["seq_base"] == d["seq_base"] + chunks
        rules = Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/rules")["rules"]
        assert [x["owner"] for x in rules] == ["group 1", f"group {pair['group_id']}"]
    finally:
        svc.close()


# (argv, needle): cais-cli arguments refused (by cais-cli itself, or by the service for field widths)
BAD_ARGS = [
    (["add-rule", "x", "--group", "1", "--contributors", "0", "--base", "0"], "'x' is not an integer"),
    (["add-rule", "-1", "--group", "1", "--contributors", "0", "--base", "0"], "must be at least 0"),
    (["add-rule", "3", "--contributors", "0", "--base", "0"], "--group"),
    (["add-rule", "3", "--group", "1/zz", "--contributors", "0", "--base", "0"], "VALUE or VALUE/MASK"),
    (["add-rule", "3", "--group", "1", "--contributors", "0,99", "--base", "0"], "port 99"),
    (["add-rule", "3", "--group", "1", "--contributors", "0", "--base", "0", "--dtype", "int64"], "--dtype"),
    (["add-rule", "3", "--group", "1", "--contributors", "0", "--base", "0", "--count-log2", "40"], "count_log2=40"),
    (["add-rule", "3", "--group", "999", "--contributors", "0", "--base", "0"], "does not fit"),
    (["del-rule"], "index"),
    (["frobnicate"], "invalid choice"),
    (["watch", "--interval", "0"], "--interval"),
    (["--timeout", "-1", "show-stats"], "--timeout"),
]


def test_catalogue_of_bad_requests_changes_nothing(switch, tmp_path):
    sock, daemon = switch
    svc = start(sock, tmp_path)
    try:
        conns = rank_clients(svc, tmp_path)
        conns[0].request("hello", rank=0, world_size=4)
        conns[1].request("hello", rank=1, world_size=4)    # (a connection silent for 10 s is closed)
        assert cli(svc, "add-rule", "7", "--group", "200", "--contributors", "2,3", "--base", "56").returncode == 0
        writes = []
        real = daemon.handle

        def spy(req):
            if req.get("op") == "write":
                writes.append(req)
            return real(req)
        daemon.handle = spy
        before = state(svc)
        # cais-cli: bad arguments, exit 2, one line, nothing sent
        for argv, needle in BAD_ARGS:
            p = cli_here(svc, *argv)
            assert p.returncode == 2 and needle in p.stderr, (argv, p.stderr)
            assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
        # refused by the service: one line each, exit 2
        for argv, status, needle in [
                (["add-rule", "0", "--group", "200", "--contributors", "0", "--base", "48"], 409, "belongs to group 1"),
                (["add-rule", "7", "--group", "201", "--contributors", "0", "--base", "48"], 409, "exists"),
                (["add-rule", "6", "--group", "202", "--contributors", "0", "--base", "10"], 409, "overlap group 1"),
                (["add-rule", "6", "--group", "1", "--contributors", "0", "--base", "48"], 409, "would take group 1"),
                (["add-rule", "6", "--group", "202", "--contributors", "0", "--base", "56"], 409, "overlap rule 7"),
                (["add-rule", "6", "--group", "202", "--contributors", "0", "--base", "63", "--count-log2", "1"], 400,
                 "beyond the switch's 64 slots"),
                (["add-rule", "99", "--group", "202", "--contributors", "0", "--base", "48"], 400, "not in 0..7"),
                (["add-rule", "6", "--group", "202", "--contributors", "5", "--base", "48"], 400, "contributors"),
                (["del-rule", "0"], 409, "goes with the group"),
                (["del-rule", "6"], 404, "no such rule"),
                (["del-rule", "99"], 400, "not in 0..7")]:
            p = cli_here(svc, *argv)
            assert p.returncode == 2 and f": {status} " in p.stderr and needle in p.stderr, (" ".join(argv), p.stderr)
            assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("cais-cli: error:"), p.stderr
        # no token, a wrong token: refused and counted
        for token in (None, "wrong"):
            p = cli_here(svc, "show-groups", token=token)
            assert p.returncode == 2 and "401 unauthorised" in p.stderr, p.stderr
        # raw HTTP: malformed, out of range, unknown, wrong method, too large
        for method, path, body, status, needle in [
                ("POST", "/v1/rules", b"{not json", 400, "not JSON"),
                ("POST", "/v1/rules", b"[]", 400, "must be"),
                ("POST", "/v1/rules", json.dumps({"index": 6}).encode(), 400, "must be"),
                ("POST", "/v1/rules", json.dumps({"index": True, "rule": {}}).encode(), 400, "must be an integer"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"colour": 1}}).encode(), 400, "unknown field"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"group": [1]}}).encode(), 400, "[value, mask]"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"base": -4}}).encode(), 400, "negative"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"dtype": "fp64"}}).encode(), 400, "rule.dtype"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"saturate": 1}}).encode(), 400, "True or False"),
                ("POST", "/v1/rules", json.dumps({"index": 6, "rule": {"group": [1, 255], "count_log2": 31}}).encode(),
                 400, "at most 16"),
                ("DELETE", "/v1/rules/abc", None, 400, "not an integer"),
                ("GET", "/v1/nothing", None, 404, "no such resource"),
                ("PUT", "/v1/rules", None, 405, "not allowed"),
                ("DELETE", "/v1/stats", None, 405, "not allowed"),
                ("POST", "/v1/rules", b"x" * 70000, 413, "at most")]:
            code, answer = http(svc, method, path, body)
            assert code == status, (method, path, code, answer)
            assert needle in json.loads(answer)["error"], (needle, answer)
        code, _ = http(svc, "GET", "/v1/rules", token=None)
        assert code == 401
        code, _ = http(svc, "GET", "/v1/rules", token=None, headers={"Authorization": "Basic eA=="})
        assert code == 401
        # the ranks' endpoint: without the token, with another, and malformed requests
        raw = connect(str(tmp_path / "ctl.sock"), name="intruder")
        for req in ({"op": "decide", "group": 1, "op_seq": 0, "nbytes": 4, "kind": kind_to_dict(CollectiveKind())},
                    {"op": "hello", "rank": 1, "world_size": 4, "token": "wrong"}):
            raw.send(req)
            ans = raw.recv()
            assert not ans["ok"] and "unauthorised" in ans["error"] and "CAIS_TOKEN" in ans["error"]
        fresh = connect(str(tmp_path / "ctl.sock"), name="rank", token=TOKEN)
        for conn, req, needle in [
                (conns[1], {"op": "decide", "group": 99, "op_seq": 0, "nbytes": 4, "kind": kind_to_dict(CollectiveKind())},
                 "no such group"),
                (conns[1], {"op": "finished", "rank": 1, "group": 1, "op_seq": 5}, "not decided"),
                (fresh, {"op": "hello", "rank": 9, "world_size": 4}, "not in 0..3"),
                (fresh, {"op": "hello", "rank": 0, "world_size": 4}, "joined twice"),
                (conns[1], {"op": "nope"}, "unknown op")]:
            with pytest.raises(EndpointError, match=needle):
                conn.request(req["op"], **{k: v for k, v in req.items() if k != "op"})
        raw.sock.sendall(b"[1, 2]\n")
        assert "JSON object" in raw.recv()["error"]
        assert state(svc) == before and writes == []            # nothing changed, nothing written
        refused = Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/stats")["refused"]
        assert refused["http:token"] == 4 and refused["ranks:token"] == 2 and refused["ranks:invalid"] == 6
        assert refused["http:bad_request"] >= 11 and refused["http:conflict"] >= 6
    finally:
        svc.close()


def test_service_down_is_one_line_exit_1(tmp_path):
    p = subprocess.run([sys.executable, "-m", "cais.cli", "--controller", "127.0.0.1:9", "show-stats"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "CAIS_TOKEN": "x"})
    assert p.returncode == 1 and p.stderr.startswith("cais-cli: error: cais-controller at http://127.0.0.1:9 "
                                                     "cannot be reached"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    with pytest.raises(ServiceError):
        Client("127.0.0.1:9", "x").request("GET", "/v1/stats")


def test_controller_refuses_to_start_without_a_token(tmp_path):
    p = subprocess.run([sys.executable, "-m", "cais.service", "--switch", str(tmp_path / "s.sock"), "--listen",
                        str(tmp_path / "c.sock"), "--http", "127.0.0.1:0", "--world-size", "2"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "a token is required" in p.stderr
    p = subprocess.run([sys.executable, "-m", "cais.service", "--switch", str(tmp_path / "s.sock"), "--listen",
                        str(tmp_path / "c.sock"), "--http", "127.0.0.1:0", "--world-size", "2", "--switch-wait", "0"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "CAIS_TOKEN": "t"})
    assert p.returncode == 2 and "cannot connect" in p.stderr, p.stderr


def test_sets_in_use_per_group_on_a_running_service(switch, tmp_path):
    """Two groups (the world group and a pair made by the ranks' rendezvous), frames put into the switch
    by hand: a half-done chunk in the pair's quota, two complete chunks and a half-done one in the world
    group's. show-groups, /v1/groups and /metrics give each group's sets in use (beside its sets
    allocated) as counted here from the model's slot state."""
    from cais import protocol as proto
    sock, daemon = switch
    svc = start(sock, tmp_path)
    loop = None
    try:
        conns = rank_clients(svc, tmp_path)
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        answers = {}
        threads = [threading.Thread(target=lambda r=r: answers.setdefault(r, conns[r].request(
            "group", rank=r, ranks=[2, 3], call=0)["group"])) for r in (2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        pair = answers[2]
        world = svc.controller.groups[1]
        # the daemon's loop stopped while the frames go in (the model is not shared between threads)
        daemon.stop()
        for t in threading.enumerate():
            if t.name == "switch-loop":
                t.join(5)
        def put(port, group_id, seq):
            hdr = proto.CaisHeader(group_id=group_id, seq_num=seq, payload_len=4)
            daemon.link.model.receive(port, proto.build_frame(hdr, bytes(4), src=0x020000000100 | port, pad=True))
        put(3, pair["group_id"], 0)                          # the pair: chunk 0 half done
        for seq in (0, 1):                                   # the world group: chunks 0, 1 complete
            for port in range(4):
                put(port, 1, seq)
        put(0, 1, 2)                                         # and chunk 2 half done
        model = daemon.link.model
        want = {}
        for gid, base, count in ((1, world.base, world.slot_count), (pair["group_id"], pair["base"], 1 << pair["count_log2"])):
            want[gid] = sum(bool(b) for slot in range(base, base + count) for b, _, _ in model.slot_state(slot))
        assert want == {1: 3, pair["group_id"]: 1}
        daemon._stop = False
        loop = threading.Thread(target=daemon.run, name="switch-loop-2", daemon=True)
        loop.start()
        groups = _until(lambda: {g["group_id"]: g for g in json.loads(cli(svc, "--json", "show-groups").stdout)["groups"]},
                        lambda groups: {g: groups[g]["sets_in_use"] for g in want} == want,
                        "an evaluation (every 20 ms) that reads the sets in use")
        assert groups[1]["sets_allocated"] == 2 * world.slot_count
        text = cli(svc, "show-groups").stdout
        assert f"{want[1]}/{2 * world.slot_count}" in text and f"{want[pair['group_id']]}/{2 << pair['count_log2']}" in text
        status, body = http(svc, "GET", "/metrics")
        metrics = body.decode()
        for gid, n in want.items():
            assert f'cais_group_sets_in_use{{group="{gid}"}} {n}.0' in metrics
        assert f"cais_sets_in_use {sum(want.values())}.0" in metrics
        assert 'cais_group_sets_aged_total{group="1"} 0.0' in metrics and "cais_sets_aged_total 0.0" in metrics
    finally:
        svc.close()             # first: its evaluation would wait for the stopped switch's answer (10 s)
        if loop is not None:
            daemon.stop()
            loop.join(5)


def _until(fetch, cond, what, deadline_s=60.0):
    """fetch() until cond(answer) holds; the answer (the deadline is a safety net: a busy machine is slow)."""
    import time
    end = time.monotonic() + deadline_s
    while True:
        ans = fetch()
        if cond(ans):
            return ans
        assert time.monotonic() < end, f"{what}: {ans}"
        time.sleep(0.02)


def _wait_for(svc, what, cond, deadline_s=30.0):
    """Poll GET /v1/jobs until cond(answer) (a rank's connection ends in a thread of the service)."""
    import time
    end = time.monotonic() + deadline_s
    while True:
        ans = Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/jobs")
        if cond(ans):
            return ans
        assert time.monotonic() < end, f"{what}: {ans}"
        time.sleep(0.02)


def test_jobs_fail_clean_up_and_join_again(switch, tmp_path):
    """Two jobs at once on hosts {0, 1} and {2, 3}: overlapping hosts, bad hosts and a second hello are
    refused; a job whose rank dies (connection ends without bye) fails, and once its last rank is gone
    its groups, rule entries and slots are freed; the same job then joins again; a job that said bye
    ends. The other job runs on untouched throughout."""
    sock, daemon = switch
    svc = start(sock, tmp_path)
    try:
        def hello(job, rank, hosts):
            c = connect(str(tmp_path / "ctl.sock"), name="rank", token=TOKEN)
            ans = c.request("hello", rank=rank, world_size=len(hosts), job=job, hosts=hosts)
            return c, ans
        a0, ans = hello("a", 0, [0, 1])
        a1, _ = hello("a", 1, [0, 1])
        assert ans["hosts"] == [0, 1] and ans["world"]["ranks"] == [0, 1] and ans["world"]["ports"] == [0, 1]
        b0, bans = hello("b", 0, [2, 3])
        b1, _ = hello("b", 1, [2, 3])
        assert bans["world"]["ranks"] == [0, 1] and bans["world"]["ports"] == [2, 3]
        ga, gb = ans["world"]["group_id"], bans["world"]["group_id"]
        for job, rank, hosts, needle in (("c", 0, [1, 2], "host(s) [1] are in use by job 'a'"),
                                         ("c", 0, [0, 9], "host(s) [9] not in 0..3"),
                                         ("c", 0, [0, 0], "distinct hosts"),
                                         ("a", 0, [0, 1], "job 'a': rank 0 joined twice"),
                                         ("a", 1, [1, 0], "runs on hosts [0, 1]")):
            with pytest.raises(EndpointError, match=re.escape(needle)):
                hello(job, rank, hosts)
        with pytest.raises(EndpointError, match="not a group of job 'a'"):
            a0.request("decide", job="a", group=gb, op_seq=0, nbytes=100, kind=kind_to_dict(CollectiveKind()))
        rules = {r["owner"] for r in Client(f"127.0.0.1:{svc.http_port}", TOKEN).request("GET", "/v1/rules")["rules"]}
        assert rules == {f"group {ga}", f"group {gb}"}

        a1.close()                                         # rank 1 of job a dies: no bye
        ans = _wait_for(svc, "job a failing", lambda j: any(x["job"] == "a" and x["state"] == "failing" for x in j["jobs"]))
        assert a0.request("ping", job="a")["dead"] == [1]
        assert b0.request("ping")["dead"] == []            # job b knows nothing of it
        a0.request("bye", rank=0)                          # the survivor gives up and leaves
        a0.close()
        ans = _wait_for(svc, "job a gone", lambda j: [x["job"] for x in j["jobs"]] == ["b"])
        assert ans["ended"][-1]["job"] == "a" and ans["ended"][-1]["state"] == "failed" and ans["ended"][-1]["dead"] == [1]
        c = Client(f"127.0.0.1:{svc.http_port}", TOKEN)
        assert [g["group_id"] for g in c.request("GET", "/v1/groups")["groups"]] == [gb]
        assert [r["owner"] for r in c.request("GET", "/v1/rules")["rules"]] == [f"group {gb}"]
        assert svc.controller.slots_allocated == svc.controller.groups[gb].slot_count > 0

        a0, ans = hello("a", 0, [0, 1])                    # the same job again: a new job, a new world group
        a1, _ = hello("a", 1, [0, 1])
        assert ans["world"]["group_id"] in svc.controller.groups and ans["world"]["rule_index"] is not None
        d = one_collective([a0, a1], ans["world"]["group_id"], 0, nbytes=1000)
        assert d["offload"]
        for conn, rank in ((a0, 0), (a1, 1), (b0, 0), (b1, 1)):
            conn.request("bye", rank=rank)
            conn.close()
        ans = _wait_for(svc, "every job gone", lambda j: j["jobs"] == [])
        ended = [(e["job"], e["state"]) for e in ans["ended"]]
        assert ended[:2] == [("default", "replaced"), ("a", "failed")]
        assert sorted(ended[2:]) == [("a", "ended"), ("b", "ended")]      # in the order their threads saw them
        assert c.request("GET", "/v1/groups")["groups"] == [] and c.request("GET", "/v1/rules")["rules"] == []
        assert svc.controller.slots_allocated == 0
        p = cli(svc, "show-jobs")
        assert p.returncode == 0 and "(no running job)" in p.stdout and "a failed (rank(s) [1] died)" in p.stdout, p
    finally:
        svc.close()


def scrape(port, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def hand_score(nbytes, ranks, bw, a, q):
    """docs/driver.md's score, written out again: T_hosts = 2(N-1)(a + D/(N BW)), T_switch = 2a + D/BW + Q."""
    t_hosts = 2 * (ranks - 1) * (a + nbytes / (ranks * bw))
    return (1 - (2 * a + nbytes / bw + q) / t_hosts) * (1 - 1 / ranks)


def test_decisions_explain_themselves_in_cli_and_metrics(switch, tmp_path):
    """offload=auto over a small job: the first collective goes to the switch (no round trip measured yet),
    then the ranks report round trips of 50..200 us, whose spread (queueing 75 us) outweighs what the
    switch saves for 1000 bytes: the next two go to the host ring. Each decision's path, score, threshold
    and reason code in cais-cli show-decisions and its JSON, the tally in /metrics by path and reason."""
    sock, _ = switch
    svc = ControllerService(sock, 4, Config(reevaluate_interval_ms=20), token=TOKEN)
    svc.serve(str(tmp_path / "ctl.sock"), "127.0.0.1:0")
    try:
        conns = rank_clients(svc, tmp_path)
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        got = [one_collective(conns, 1, op, nbytes=1000, rtt=50e-6) for op in range(3)]
        assert [d["path"] for d in got] == ["switch", "host", "host"]
        assert [d["code"] for d in got] == ["score_above_threshold", "score_below_threshold", "score_below_threshold"]
        bw = PARAMS.data_width / 8 * svc.coordinator.link.clock_hz
        a, q = 25e-6, (50e-6 + 100e-6 + 150e-6 + 200e-6) / 4 - 50e-6    # min rtt / 2; mean - min
        assert got[1]["score"] == pytest.approx(hand_score(1000, 4, bw, a, q), rel=1e-9)
        assert got[1]["score"] <= got[1]["threshold"] == 0.2 < got[0]["score"]
        # cais-cli: the JSON and the table carry the same decisions, with the job
        ans = json.loads(cli(svc, "--json", "show-decisions", "--last", "5").stdout)
        assert [(d["op_seq"], d["path"], d["code"], d["job"]) for d in ans["decisions"]] == \
            [(op, d["path"], d["code"], "default") for op, d in enumerate(got)]
        assert ans["total"] == 3 and {(t["path"], t["reason"]): t["count"] for t in ans["tally"]} == \
            {("switch", "score_above_threshold"): 1, ("host", "score_below_threshold"): 2}
        table = cli(svc, "show-decisions").stdout.splitlines()
        rows = [line.split() for line in table[2:5]]
        assert [(r[2], r[5], r[8]) for r in rows] == [(str(op), d["path"], d["code"]) for op, d in enumerate(got)]
        assert [float(r[6]) for r in rows] == [pytest.approx(d["score"], abs=5e-4) for d in got]
        assert "T_switch" in table[3] and "queueing 75.00 us" in table[3]
        # /metrics: the tally by path and reason, every code of the fixed set present, no *_created series
        status, text = scrape(svc.http_port, TOKEN)
        assert status == 200
        assert 'cais_offload_decisions_total{path="switch",reason="score_above_threshold"} 1.0' in text
        assert 'cais_offload_decisions_total{path="host",reason="score_below_threshold"} 2.0' in text
        assert 'cais_offload_decisions_total{path="host",reason="no_slots"} 0.0' in text
        assert 'cais_collectives_total{path="switch"} 1.0' in text and 'cais_collectives_total{path="host"} 2.0' in text
        assert 'cais_collective_bytes_total{path="host"} 2000.0' in text
        assert "_created" not in text and "throughput" not in text
    finally:
        svc.close()


def test_metrics_listener_serves_metrics_only_with_the_token_optional_when_asked(switch, tmp_path):
    """--metrics-listen: /metrics alone on a listener of its own; --metrics-no-token: /metrics without the
    token (on both listeners), the API still wants it."""
    sock, _ = switch
    for no_token in (False, True):
        svc = ControllerService(sock, 4, Config(), token=TOKEN, metrics_no_token=no_token)
        svc.serve(str(tmp_path / f"ctl{no_token}.sock"), "127.0.0.1:0", "127.0.0.1:0")
        try:
            assert svc.metrics_port not in (None, svc.http_port)
            status, text = scrape(svc.metrics_port, TOKEN)
            assert status == 200 and "cais_sets_in_use" in text and "_created" not in text
            assert scrape(svc.metrics_port)[0] == (200 if no_token else 401)
            assert scrape(svc.http_port)[0] == (200 if no_token else 401)
            req = urllib.request.Request(f"http://127.0.0.1:{svc.metrics_port}/v1/stats")
            req.add_header("Authorization", f"Bearer {TOKEN}")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 404 and b"/metrics only" in e.value.read()
            assert http(svc, "GET", "/v1/stats", token=None)[0] == 401          # the API: the token, always
        finally:
            svc.close()


class StallingProxy:
    """A control-socket proxy in front of cais-switch that holds the reply to one chosen request until the
    test releases it (a switch that answers late), then delivers it on the connection it came in on."""

    def __init__(self, target: str, path: str):
        import queue
        self._queue = queue.Queue
        self.target, self.match = target, None
        self.holding, self.release, self.late_sent = threading.Event(), threading.Event(), threading.Event()
        self.delivered: list[dict] = []            # requests whose reply reached the client, in order
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self._socks = [self.server]
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.target)
            self._socks += [client, up]
            pending = self._queue()
            threading.Thread(target=self._requests, args=(client, up, pending), daemon=True).start()
            threading.Thread(target=self._replies, args=(client, up, pending), daemon=True).start()

    def _requests(self, client, up, pending):
        try:
            for line in client.makefile("rb"):
                pending.put(json.loads(line))
                up.sendall(line)
            up.shutdown(socket.SHUT_WR)        # the daemon answers what it has, then closes
        except OSError:
            pass

    def _replies(self, client, up, pending):
        try:
            for line in up.makefile("rb"):
                req = pending.get()
                held = self.match is not None and self.match(req)
                if held:
                    self.match = None
                    self.holding.set()
                    self.release.wait()
                try:
                    client.sendall(line)
                    if not held:
                        self.delivered.append(req)
                except OSError:
                    pass                        # the client hung up meanwhile
                if held:
                    self.late_sent.set()
        except OSError:
            pass
        finally:
            client.close()
            up.close()

    def close(self):
        self.release.set()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass


def _wait(cond, what, deadline_s=60.0):
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {deadline_s} s"
        time.sleep(0.01)


def test_switch_link_survives_a_late_reply_and_metrics_answer_while_it_stalls(switch, tmp_path):
    """Issue 29 M1. The switch's control endpoint (through a proxy) holds one EPOCH read. While it is held,
    /metrics answers (the evaluation's switch reads are made without the service lock): the scrape returns
    while the held read has neither been answered nor timed out. Then a read is held past the link's
    timeout and answered late: the link drops that connection, so the late reply is never taken for another
    request's; no false "switch reset noticed", the evaluation loop goes on (the failure counted), and
    collectives decided before and after go on the same sequence numbers."""
    sock, _ = switch
    proxy = StallingProxy(sock, str(tmp_path / "proxy.sock"))
    svc = start(str(tmp_path / "proxy.sock"), tmp_path)
    link, ctl = svc.coordinator.link, svc.controller
    epoch = ctl.regs["EPOCH"].address()
    is_epoch_read = lambda req: req.get("op") == "read" and req.get("addr") == epoch    # noqa: E731
    try:
        conns = rank_clients(svc, tmp_path)
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        chunks = -(-1000 // 256)
        seqs = [one_collective(conns, 1, 0)["seq_base"]]
        # a stall, no timeout: /metrics answers while the read is held
        link.timeout = 600.0
        proxy.match = is_epoch_read
        _wait(proxy.holding.is_set, "held EPOCH read")
        status, body = http(svc, "GET", "/metrics")
        assert status == 200 and "cais_evaluation_errors_total 0.0" in body.decode()
        assert not proxy.late_sent.is_set() and link.failures == 0 and svc.evaluation_errors == 0
        proxy.release.set()
        _wait(proxy.late_sent.is_set, "reply to the held read")
        # a stall past the link's timeout, then the late reply
        proxy.holding.clear(), proxy.release.clear(), proxy.late_sent.clear()
        link.timeout = 0.3
        proxy.match = is_epoch_read
        _wait(proxy.holding.is_set, "held EPOCH read")
        _wait(lambda: link.failures >= 1 and svc.evaluation_errors >= 1, "timed-out evaluation")
        link.timeout = 60.0
        proxy.release.set()
        _wait(proxy.late_sent.is_set, "late reply")
        n = len(proxy.delivered)
        _wait(lambda: sum(map(is_epoch_read, proxy.delivered[n:])) >= 3, "three evaluations after the late reply")
        assert ctl.resets == 0 and not [e for _, e in ctl.events if "reset" in e], ctl.events
        assert link.reconnects >= 1
        assert any(t.name == "cais-evaluate" and t.is_alive() for t in threading.enumerate())
        for op in range(1, 4):
            d = one_collective(conns, 1, op)
            assert d["offload"] and d["path"] == "switch"
            seqs.append(d["seq_base"])
        assert seqs == [seqs[0] + i * chunks for i in range(4)]
        status, body = http(svc, "GET", "/metrics")
        assert status == 200 and f"cais_evaluation_errors_total {float(svc.evaluation_errors)}" in body.decode()
    finally:
        svc.close()
        proxy.close()


def test_metrics_and_views_answer_while_a_rule_write_and_a_group_request_wait_for_the_switch(switch, tmp_path):
    """Issue 29 part 3: the service lock is not held during switch I/O. Through a proxy, the switch holds its
    answer to one write: first a RULE_WRITE of an operator rule (POST /v1/rules), then one of the writes a
    rank's `group` request makes (its rule). While each is held, /metrics, /v1/stats, /v1/rules and
    /v1/groups answer (the held request has neither been answered nor timed out: the proxy's events say
    so), and a second rule change made meanwhile waits for the first (switch work runs one at a time: its
    writes reach the switch after the held one's). Released, both complete and the rules are in place."""
    sock, _ = switch
    proxy = StallingProxy(sock, str(tmp_path / "proxy.sock"))
    svc = start(str(tmp_path / "proxy.sock"), tmp_path)
    ctl = svc.controller
    ctl.link.timeout = 600.0                  # held, never timed out
    rule_write = ctl.regs["RULE_WRITE"].address()
    is_rule_write = lambda req: req.get("op") == "write" and req.get("addr") == rule_write   # noqa: E731
    rule = {"group": [200, 255], "contributors": 12, "base": 56, "count_log2": 2}
    second_rule = dict(rule, group=[201, 255], base=60)
    slot_clear = ctl.regs["SLOT_CLEAR"].address()

    def views_answer():
        for path in ("/metrics", "/v1/stats", "/v1/rules", "/v1/groups"):
            status, _ = http(svc, "GET", path)
            assert status == 200, path

    try:
        results = {}
        proxy.match = is_rule_write
        post = threading.Thread(target=lambda: results.__setitem__(
            "post", http(svc, "POST", "/v1/rules", json.dumps({"index": 7, "rule": rule}).encode())))
        post.start()
        _wait(proxy.holding.is_set, "held RULE_WRITE")
        views_answer()
        assert not proxy.late_sent.is_set() and ctl.link.failures == 0
        # another rule change waits for the switch work in flight
        second = threading.Thread(target=lambda: results.__setitem__(
            "second", http(svc, "POST", "/v1/rules", json.dumps({"index": 6, "rule": second_rule}).encode())))
        second.start()
        views_answer()
        n = len(proxy.delivered)
        proxy.release.set()
        post.join(60), second.join(60)
        assert results["post"][0] == 201 and results["second"][0] == 201, results
        # none of the second change's writes (its quota's SLOT_CLEARs) reached the switch before the release
        second_clears = [r for r in proxy.delivered if r.get("addr") == slot_clear and r.get("value", 0) >= 60]
        assert second_clears and all(r in proxy.delivered[n:] for r in second_clears)
        # a rank's group request: its rule's RULE_WRITE held the same way
        conns = rank_clients(svc, tmp_path)
        for r, c in enumerate(conns):
            c.request("hello", rank=r, world_size=4)
        proxy.holding.clear(), proxy.release.clear(), proxy.late_sent.clear()
        proxy.match = is_rule_write
        groups = [threading.Thread(target=lambda c=c: results.setdefault("groups", []).append(
            c.request("group", ranks=[0, 1], call=0))) for c in conns[:2]]
        for t in groups:
            t.start()
        _wait(proxy.holding.is_set, "held RULE_WRITE of the new group's rule")
        views_answer()
        assert not proxy.late_sent.is_set()
        proxy.release.set()
        for t in groups:
            t.join(60)
        assert len(results["groups"]) == 2 and results["groups"][0]["group"] == results["groups"][1]["group"]
        status, body = http(svc, "GET", "/v1/rules")
        assert {r["index"] for r in json.loads(body)["rules"]} >= {6, 7}
    finally:
        proxy.release.set()                   # a failed check must not leave the service waiting on the proxy
        svc.close()
        proxy.close()
