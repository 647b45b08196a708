"""Network namespaces and veth pairs for the tests that put frames on real interfaces (root only).

These tests must fail, not skip, where they cannot run: CI runs as root on this machine kind
(GUIDE.md, section 4), and a skipped end-to-end test would hide a broken deployment. Every name carries
the test process's PID; every namespace is deleted in a finally (its veth ends go with it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys

import pytest

_count = itertools.count()


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it creates network namespaces and veth pairs (ip netns, AF_PACKET)")


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@contextlib.contextmanager
def namespace():
    """A fresh namespace with IPv6 off (the kernel then sends nothing on its interfaces)."""
    require_root()
    name = f"t{os.getpid()}n{next(_count)}"
    ip("netns", "add", name)
    try:
        for key in ("all", "default"):
            subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"],
                           check=True, capture_output=True)
        yield name
    finally:
        ip("netns", "del", name, check=False)


def veth(ns: str, a: str, b: str) -> None:
    """A veth pair a <-> b inside `ns`, both ends up."""
    ip("-n", ns, "link", "add", a, "type", "veth", "peer", "name", b)
    ip("-n", ns, "link", "set", a, "up")
    ip("-n", ns, "link", "set", b, "up")


def python_in(ns: str, args: list[str], **kw) -> subprocess.Popen:
    """This interpreter, in `ns`, in a session of its own (so that it can be stopped with its children)."""
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], start_new_session=True, **kw)


@contextlib.contextmanager
def switch_daemon(ns: str, tmp_path, interfaces: list[str], extra: tuple = ()):
    """cais-switch (the model) in `ns` on `interfaces` (and `extra` options), its control socket and a pcap
    folder in `tmp_path`, up until its ready file appears (20 s at most); yields ``(daemon, sock, pcap)``,
    stopped on exit."""
    import time
    sock, ready, pcap = tmp_path / "sw.sock", tmp_path / "ready", tmp_path / "pcap"
    log = open(tmp_path / "switch.log", "wb")
    daemon = python_in(ns, ["-m", "cais.sim.daemon", "--control", str(sock), "--pcap", str(pcap),
                            "--ready-file", str(ready), *extra, *interfaces], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, (tmp_path / "switch.log").read_text()
            time.sleep(0.05)
        yield daemon, sock, pcap
    finally:
        stop(daemon)


def run_probe(ns: str, probe: str, *args) -> str:
    """Run the Python source `probe` in `ns` with `args`; its standard output (it must exit 0)."""
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe, *map(str, args)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, 9)
            proc.wait(5)


def namespaces_with(prefix: str) -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.startswith(prefix)]


def rank_outputs(folder, ranks: int) -> list[dict]:
    """The last JSON line each rank script wrote to ``folder/rank<i>.log``; a rank that wrote none fails the
    test with its log's tail."""
    import json
    outs = []
    for i in range(ranks):
        text = (folder / f"rank{i}.log").read_text()
        lines = [line for line in text.splitlines() if line.startswith("{")]
        assert lines, f"rank {i} reported nothing:\n{text[-3000:]}"
        outs.append(json.loads(lines[-1]))
    return outs
