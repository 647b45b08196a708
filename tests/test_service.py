"""cais-controller and cais-cli without namespaces: cais-switch's event loop (the model, no interfaces) on a
Unix socket in a thread, the service in this process, rank clients over the JSON-lines endpoint, cais-cli
as a subprocess. The token, the HTTP API, the metrics, a restart that loses no group, and a catalogue of
bad requests and arguments that are refused and change nothing."""

import json
import re
import subprocess
import sys
import threading
import urllib.request

import pytest

from cais.admin import Client, ServiceError
from cais.config import Config
from cais.coordinator import kind_to_dict
from cais.allreduce import CollectiveKind
from cais.endpoint import EndpointError, connect
from cais.params import SwitchParams
from cais.service import ControllerService
from cais.sim.daemon import SwitchDaemon

TOKEN = "s3cret-token"
PARAMS = SwitchParams(ports=4)


@pytest.fixture
def switch(tmp_path):
    sock = str(tmp_path / "switch.sock")
    daemon = SwitchDaemon([], PARAMS, control=sock)
    t = threading.Thread(target=daemon.run, daemon=True, name="switch-loop")
    t.start()
    yield sock, daemon
    daemon.stop()
    t.join(5)
    daemon.close()


def start(switch_sock, tmp_path, recover=False, name="ctl"):
    svc = ControllerService(switch_sock, 4, Config(offload="always", reevaluate_interval_ms=20), token=TOKEN,
                            recover=recover)
    svc.serve(str(tmp_path / f"{name}.sock"), "127.0.0.1:0")
    return svc


def cli(svc, *args, token=TOKEN):
    env = {"PATH": "/usr/bin:/bin", "CAIS_TOKEN": token} if token else {"PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "cais.admin", "--controller", f"127.0.0.1:{svc.http_port}", *args],
                          capture_output=True, text=True, timeout=60, env=env)


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
        assert "P50 50 us  P99 150 us" in text and "3000 bytes reduced" in text
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
        assert 'cais_bytes_reduced_total 3000.0' in text
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
            p = cli(svc, *argv)
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
            p = cli(svc, *argv)
            assert p.returncode == 2 and f": {status} " in p.stderr and needle in p.stderr, (" ".join(argv), p.stderr)
            assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("cais-cli: error:"), p.stderr
        # no token, a wrong token: refused and counted
        for token in (None, "wrong"):
            p = cli(svc, "show-groups", token=token)
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
    p = subprocess.run([sys.executable, "-m", "cais.admin", "--controller", "127.0.0.1:9", "show-stats"],
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
        if loop is not None:
            daemon.stop()
            loop.join(5)
        svc.close()


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
