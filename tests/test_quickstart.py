"""The README's deployment quick start, run as written (root): the names made unique per run, `make
setup` left out (the suite runs in the set-up .venv). Four processes print the all-reduced value."""

import os
import re
import subprocess
from pathlib import Path

from netns import namespaces_with, require_root

REPO = Path(__file__).resolve().parents[1]


def test_readme_quick_start_runs(tmp_path):
    require_root()
    text = (REPO / "README.md").read_text()
    script = re.search(r"## Deployment quick start.*?By hand.*?```sh\n(.*?)```", text, re.S).group(1)
    assert script.startswith("make setup\n")
    tag = f"q{os.getpid()}"
    script = script.replace("make setup\n", "", 1).replace("/tmp/", f"{tmp_path}/")
    script = re.sub(r"cais-(sw|r|s|h)(?=[\s$0-9])", lambda m: f"{tag}-{m.group(1)}", script)   # namespaces, veths
    try:
        p = subprocess.run(["bash", "-e", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180)
    finally:
        for ns in namespaces_with(tag):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # four processes share the output: their lines may interleave, each line's text is one write
    assert sorted(re.findall(r"rank (\d): \[10 10 10\]", p.stdout)) == ["0", "1", "2", "3"], p.stdout + p.stderr
    assert not namespaces_with(tag)
