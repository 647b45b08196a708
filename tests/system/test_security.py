"""Issue 29, parts 5 and 6: endpoint ownership (M3, M7, L5), files and configuration (M6, L1, L2).

The hostile control clients of cais-switch are in test_security_switch.py, those of the coordinator and the
HTTP service in test_security_coordinator.py; docs/security.md is the threat model they check.
"""

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from cais.config import Config, ConfigError
from cais.endpoint import EndpointError, connect, listen, parse_address, read_token
from cais.rawsock import PcapWriter, read_pcap
from netns import namespace, python_in, stop, veth
from nonroot import nonroot_uid

THIEF = r"""
import socket, sys
family, where = sys.argv[1], sys.argv[2]
if family == "unix":
    s = socket.socket(socket.AF_UNIX)
    s.bind(where)
else:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(where)))
s.listen(1)
s.settimeout(3)
print("listening", flush=True)
got = b""
try:
    conn, _ = s.accept()
    conn.settimeout(5)
    while True:
        data = conn.recv(4096)
        if not data:
            break
        got += data
except OSError:
    pass
print(got.hex(), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("family", ["unix", "tcp"])
def test_token_never_goes_to_a_server_of_another_user(family):
    """M3: a non-root user listening first where the ranks connect received the token. Now the client checks
    the server's uid (SO_PEERCRED, the loopback listener's owner) before it sends a byte."""
    uid = nonroot_uid()
    folder = tempfile.mkdtemp(prefix="cais-thief-", dir="/tmp")
    os.chmod(folder, 0o1777)
    try:
        where = os.path.join(folder, "controller.sock") if family == "unix" else str(_free_port())
        thief = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                                  "-c", THIEF, family, where], stdout=subprocess.PIPE, text=True)
        try:
            assert thief.stdout.readline().strip() == "listening"
            address = where if family == "unix" else f"127.0.0.1:{where}"
            with pytest.raises(EndpointError) as e:
                connect(address, token="the-secret", name="coordinator")
            msg = str(e.value)
            assert f"uid {uid}" in msg and f"uid {os.geteuid()}" in msg and address in msg and "token" in msg, msg
            got = bytes.fromhex(thief.communicate(timeout=30)[0].strip() or "")
            assert b"the-secret" not in got and got == b""
        finally:
            if thief.poll() is None:
                thief.kill()
                thief.wait()
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def test_cais_cli_sends_no_token_to_another_users_http_listener():
    """M3 for cais-cli: a non-root user listening first on the service's HTTP port got the Bearer token."""
    uid = nonroot_uid()
    port = _free_port()
    thief = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                              "-c", THIEF, "tcp", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert thief.stdout.readline().strip() == "listening"
        out = subprocess.run([sys.executable, "-m", "cais.cli", "--controller", f"127.0.0.1:{port}", "show-groups"],
                             capture_output=True, text=True, timeout=60,
                             env={"PATH": os.environ["PATH"], "CAIS_TOKEN": "the-secret"})
        assert out.returncode != 0 and f"uid {uid}" in out.stderr and "not sending it the token" in out.stderr, \
            out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        got = bytes.fromhex(thief.communicate(timeout=30)[0].strip() or "")
        assert b"the-secret" not in got
    finally:
        if thief.poll() is None:
            thief.kill()
            thief.wait()


def test_token_goes_to_a_server_of_the_same_user(tmp_path):
    server = listen(parse_address(str(tmp_path / "s.sock")))
    try:
        c = connect(str(tmp_path / "s.sock"), token="t")
        conn, _ = server.accept()
        c.send({"op": "ping"})
        assert b"ping" in conn.recv(4096)
        conn.close()
        c.close()
    finally:
        server.close()


def test_unix_socket_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        server = listen(parse_address(str(tmp_path / "s.sock")))
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "s.sock").st_mode) == 0o600
    finally:
        server.close()


def test_listen_never_replaces_what_is_not_a_socket(tmp_path):
    """L5: listen() deleted whatever file was at the socket path."""
    precious = tmp_path / "data.txt"
    precious.write_text("keep me")
    with pytest.raises(OSError, match="not a socket"):
        listen(parse_address(str(precious)))
    assert precious.read_text() == "keep me"
    # a socket somebody serves on is not taken over either; a stale one is replaced
    live = listen(parse_address(str(tmp_path / "live.sock")))
    try:
        with pytest.raises(OSError, match="another program listens there"):
            listen(parse_address(str(tmp_path / "live.sock")))
    finally:
        live.close()
    listen(parse_address(str(tmp_path / "live.sock"))).close()     # its server gone: stale, replaced


def test_world_readable_token_file_is_warned_about(tmp_path, capsys):
    """L1: a token file every user can read was accepted silently."""
    path = tmp_path / "token"
    path.write_text("abc\n")
    os.chmod(path, 0o644)
    assert read_token(str(path)) == "abc"
    err = capsys.readouterr().err
    assert "readable by other users" in err and "0644" in err and "chmod 600" in err
    os.chmod(path, 0o600)
    assert read_token(str(path)) == "abc" and capsys.readouterr().err == ""


def test_capture_files_0600_never_through_a_symbolic_link(tmp_path):
    """M6: captures were 0644 and opened through symbolic links (a root-owned file was truncated)."""
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    os.chmod(victim, 0o600)
    link = tmp_path / "port0.pcap"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        PcapWriter(link)
    assert victim.read_text() == "root's file"
    old = os.umask(0)
    try:
        w = PcapWriter(tmp_path / "port1.pcap")
    finally:
        os.umask(old)
    w.write(b"\x01" * 60, when=1.0)
    w.close()
    assert stat.S_IMODE(os.stat(tmp_path / "port1.pcap").st_mode) == 0o600
    assert read_pcap(tmp_path / "port1.pcap") == [(1.0, b"\x01" * 60)]
    hard = tmp_path / "hard.pcap"
    os.link(tmp_path / "port1.pcap", hard)                  # two names: not a private file
    with pytest.raises(OSError, match="links"):
        PcapWriter(hard)


def _run_switch(ns, tmp_path, pcap):
    ready = tmp_path / "ready"
    p = python_in(ns, ["-m", "cais.sim.daemon", "--pcap", str(pcap), "--ready-file", str(ready), "s0", "s1"],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and p.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return p


def test_pcap_folder_of_another_user_is_refused_ours_is_0700(tmp_path):
    """M6: --pcap accepted an existing folder owned by another user."""
    uid = nonroot_uid()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, uid, uid)
    with namespace() as ns:
        for i in range(2):
            veth(ns, f"s{i}", f"h{i}")
        p = _run_switch(ns, tmp_path, theirs)
        try:
            _, err = p.communicate(timeout=60)
        finally:
            stop(p)
        assert p.returncode != 0 and f"owned by uid {uid}" in err and len(err.strip().splitlines()) == 1, err
        assert os.listdir(theirs) == []
        link = tmp_path / "link"
        link.symlink_to(theirs)
        p = _run_switch(ns, tmp_path, link)
        try:
            _, err = p.communicate(timeout=60)
        finally:
            stop(p)
        assert p.returncode != 0 and "not a folder" in err, err
        ours = tmp_path / "ours"
        old = os.umask(0)
        try:
            p = _run_switch(ns, tmp_path, ours)
        finally:
            os.umask(old)
        try:
            assert p.poll() is None
            assert stat.S_IMODE(os.stat(ours).st_mode) == 0o700
            assert sorted(os.listdir(ours)) == ["port0.pcap", "port1.pcap"]
            assert all(stat.S_IMODE(os.stat(ours / f).st_mode) == 0o600 for f in os.listdir(ours))
        finally:
            stop(p)


@pytest.mark.parametrize("key", ["reevaluate_interval_ms", "timeout_ms", "offload_threshold", "set_age_ms",
                                 "sram_usage_limit"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_config_refuses_inf_and_nan(key, value):
    """L2: reevaluate_interval_ms = inf passed validation and killed the evaluate thread."""
    with pytest.raises(ConfigError, match=f"{key}=.*finite"):
        Config(**{key: value})


@pytest.mark.parametrize("text, needle", [
    ("cais = 5\n", "must be a table"),
    ('cais = "x"\n', "must be a table"),
    ("x = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ("[cais]\ntimeout_ms = inf\n", "finite"),
    ("[cais]\nreevaluate_interval_ms = nan\n", "finite"),
    ("[cais]\nchunk_size = [1]\n", "must be an integer"),
])
def test_config_file_errors_are_one_line(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        Config.load(path)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    out = subprocess.run([sys.executable, "-m", "cais.service", "--switch", "/nonexistent", "--http", "127.0.0.1:1",
                          "--world-size", "1", "--config", str(path)], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "CAIS_TOKEN": "t"})
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
        out.stderr


def test_rank0_without_cais_token_makes_a_private_one(tmp_path, monkeypatch):
    """M2: rank 0's coordinator checked no token when CAIS_TOKEN was unset. Now it makes one, 0600, beside
    the socket (for the same user's ranks) and in its environment (for its children)."""
    from cais.coordinator import make_token, read_made_token, token_file_for
    monkeypatch.delenv("CAIS_TOKEN", raising=False)
    address = str(tmp_path / "controller.sock")
    token = make_token(address)
    path = token_file_for(address)
    assert path == address + ".token" and os.environ["CAIS_TOKEN"] == token and len(token) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_made_token(address) == token
    os.chmod(path, 0o644)                          # not private: not trusted
    with pytest.raises(ValueError, match="0644"):
        read_made_token(address)
    assert json.dumps(token)                       # a plain string
