"""The README's deployment quick start, run as written (root).

The block after ``<!-- quickstart`` runs verbatim in bash, in this repository's folder, with the .venv
on PATH (what the README's ``. .venv/bin/activate`` does) and ``CAIS_QUICKSTART`` set to a prefix of
this test's own (the block names every namespace, interface and file after it), so that it cannot meet
another run. What it must show: every rank's collectives CORRECT, cais-cli answering from the switch's
namespace (loopback up), the capture the tshark line reads written, with no IPv6 frame in it (IPv6 off
in every namespace), the token file readable by root only, and every namespace it made gone.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from netns import namespaces_with, require_root

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]
MARK = "<!-- quickstart"


def blocks(text: str) -> tuple[str, str]:
    """(the marked shell block, the tshark line) of the README."""
    marked = re.search(re.escape(MARK) + r"[^\n]*-->\n```sh\n(.*?)```", text, re.S)
    assert marked, f"README.md: no ```sh block after a {MARK} ... --> line"
    tshark = re.search(r"^tshark .*$", text[marked.end():], re.M)
    assert tshark, "README.md: no tshark line after the quick start"
    return marked.group(1), tshark.group(0)


def test_readme_quick_start_runs_verbatim():
    require_root()
    script, tshark = blocks((REPO / "README.md").read_text())
    tag = f"q{os.getpid()}"
    folder = Path("/tmp") / tag                  # the block's $d for this prefix
    pcap = shlex.split(tshark)[shlex.split(tshark).index("-r") + 1]
    # after the block, in the same shell: where the tshark line reads, and the token file's mode
    check = f'\necho "PCAP=$(ls {pcap})"\necho "TOKEN_MODE=$(stat -c %a $d/token)"\n'
    env = dict(os.environ, CAIS_QUICKSTART=tag, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    shell = subprocess.Popen(["bash", "-c", script + check], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = shell.communicate(timeout=120)          # a safety net: the block takes ~10 s
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)    # the block's own processes, if any is left
        except ProcessLookupError:
            pass
        shell.wait()
        for ns in namespaces_with(tag):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        captured = sorted(p.name for p in (folder / "pcap").glob("*.pcap")) if folder.exists() else []
        frames = _frames(folder / "pcap" / "port0.pcap")
        shutil.rmtree(folder, ignore_errors=True)
    # four processes share the output: each line is one write
    assert sorted(re.findall(r"rank (\d): all_reduce 10, broadcast, all_gather: CORRECT", out)) == \
        ["0", "1", "2", "3"], out
    assert "WRONG" not in out and "Traceback" not in out, out
    assert "ended: default ended" in out, out      # cais-cli show-jobs: the job ended, every rank said bye
    assert f"PCAP=/tmp/{tag}/pcap/port0.pcap" in out, out             # the file the tshark line reads
    assert captured == [f"port{p}.pcap" for p in range(4)], captured
    assert "TOKEN_MODE=600" in out, out
    assert frames and not [f for f in frames if f[12:14] == b"\x86\xdd"], "IPv6 frames crossed the switch"
    assert not namespaces_with(tag)


def _frames(path: Path):
    if not path.exists():
        return []
    from scapy.utils import rdpcap
    return [bytes(f) for f in rdpcap(str(path))]
