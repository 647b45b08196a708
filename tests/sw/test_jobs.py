"""One cais-controller serving many jobs (docs/controller.md, "Jobs"): cais-switch (the model) with six
ports in namespaces of the test's own, three jobs of two ranks at once, then three more one after
another (one of them a job name run again), every all-reduce exact against numpy; the job that finds
no slots left runs on the host ring with the reason in cais-cli show-jobs and /metrics; at the end no
job, group, rule or slot quota is left. Root only (fails without it)."""

import json
import os
import time

import numpy as np
import pytest

from cais.cluster import Cluster, contribution
from netns import require_root

RANK = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
import cais
from cais.cluster import contribution
tmp, job, seed = Path(sys.argv[1]), os.environ["CAIS_JOB"], int(sys.argv[2])
pg = cais.init(timeout=60.0)
r, N = pg.rank, pg.world_size
(tmp / f"joined-{job}-{r}").write_text("")
end = time.monotonic() + 120
while not (tmp / f"go-{job}").exists():            # the test looked at the jobs while all ran
    assert time.monotonic() < end, "never told to go"
    time.sleep(0.02)
x = contribution(r, 3000, np.int32, seed)
work = cais.all_reduce(x, async_op=True)
work.wait()
y = contribution(r, 700, np.int32, seed + 1)
cais.all_reduce(y, op="max")
print(json.dumps({"job": job, "rank": r, "path": work.path, "sum": x.tolist(), "max": y.tolist()}), flush=True)
cais.barrier()
cais.destroy_process_group()
"""

CONFIG = '[cais]\noffload = "always"\n'


def _run_jobs(cluster: Cluster, tmp, jobs: list[tuple[str, list[int], int]], look=None) -> list[dict]:
    """Start `jobs` (name, hosts, seed) at once; once every rank joined call look(), then let them run;
    the ranks' reports."""
    procs = []
    for name, hosts, seed in jobs:
        for r, h in enumerate(hosts):
            env = dict(os.environ, CAIS_RANK=str(r), CAIS_WORLD_SIZE=str(len(hosts)), CAIS_IFACE=f"{cluster.tag}h{h}",
                       CAIS_SWITCH=cluster.control, CAIS_CONTROLLER=cluster.controller, CAIS_COORDINATOR="external",
                       CAIS_TOKEN=cluster.token_file.read_text(), CAIS_JOB=name, CAIS_HOSTS=",".join(map(str, hosts)))
            log = tmp / f"{name}-{r}-{len(list(tmp.glob(f'{name}-{r}-*.log')))}.log"
            procs.append((name, r, log, cluster._spawn(cluster.rank_ns[h], ["-c", RANK, str(tmp), str(seed)], env, log)))
    end = time.monotonic() + 120
    while not all((tmp / f"joined-{name}-{r}").exists() for name, hosts, _ in jobs for r in range(len(hosts))):
        assert time.monotonic() < end and all(p.poll() is None for *_, p in procs), \
            "\n".join(log.read_text()[-1500:] for _, _, log, _ in procs)
        time.sleep(0.02)
    if look is not None:
        look()
    for name, _, _ in jobs:
        (tmp / f"go-{name}").write_text("")
    reports = []
    for name, r, log, p in procs:
        p.wait(180)
        lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
        assert p.returncode == 0 and lines, log.read_text()[-3000:]
        reports.append(json.loads(lines[-1]))
    for name, hosts, _ in jobs:
        for r in range(len(hosts)):
            (tmp / f"joined-{name}-{r}").unlink()
        (tmp / f"go-{name}").unlink()
    return reports


def _check(reports, jobs):
    seeds = {name: (len(hosts), seed) for name, hosts, seed in jobs}
    assert sorted((x["job"], x["rank"]) for x in reports) == sorted((n, r) for n, h, _ in jobs for r in range(len(h)))
    for x in reports:
        n, seed = seeds[x["job"]]
        want_sum = np.sum(np.stack([contribution(q, 3000, np.int32, seed) for q in range(n)]), axis=0).astype(np.int32)
        want_max = np.max(np.stack([contribution(q, 700, np.int32, seed + 1) for q in range(n)]), axis=0)
        assert np.array_equal(np.array(x["sum"], np.int32), want_sum), (x["job"], x["rank"])
        assert np.array_equal(np.array(x["max"], np.int32), want_max), (x["job"], x["rank"])


def _wait_jobs_gone(cluster: Cluster, names: set, deadline_s=60.0) -> dict:
    """/v1/jobs (via cais-cli --json) once none of `names` runs any more."""
    end = time.monotonic() + deadline_s
    while True:
        out = cluster.cli(["--json", "show-jobs"])
        assert out.returncode == 0, out.stderr
        ans = json.loads(out.stdout)
        if not names & {j["job"] for j in ans["jobs"]}:
            return ans
        assert time.monotonic() < end, ans
        time.sleep(0.05)


@pytest.mark.slow               # 14 rank processes in namespaces: over ten seconds
def test_three_jobs_at_once_then_three_one_after_another(tmp_path):
    require_root()
    (tmp_path / "cais.toml").write_text(CONFIG)
    cluster = Cluster(6, tmp_path)
    seen = {}
    try:
        cluster.create()
        cluster.start_switch([])
        cluster.start_controller(extra=("--config", str(tmp_path / "cais.toml")))

        def look():
            out = cluster.cli(["--json", "show-jobs"])
            assert out.returncode == 0, out.stderr
            seen["jobs"] = json.loads(out.stdout)
            seen["table"] = cluster.cli(["show-jobs"]).stdout
            seen["metrics"] = cluster.scrape()

        concurrent = [("alpha", [0, 1], 21), ("beta", [2, 3], 22), ("gamma", [4, 5], 23)]
        _check(_run_jobs(cluster, tmp_path, concurrent, look), concurrent)
        jobs = {j["job"]: j for j in seen["jobs"]["jobs"]}
        assert set(jobs) == {"alpha", "beta", "gamma"}, seen["jobs"]
        assert all(j["state"] == "running" and j["joined"] == [0, 1] for j in jobs.values()), jobs
        # 64 slots, sram_usage_limit 0.75: 48 usable, 32 for the first job's group, 16 for the second's, none
        # for the third's, which runs on the host ring and says why (cais-cli and /metrics)
        paths = sorted(g["path"] for j in jobs.values() for g in j["groups"])
        assert paths == ["host ring", "switch", "switch"], jobs
        ring_job = next(j for j in jobs.values() if j["groups"][0]["path"] == "host ring")
        why = ring_job["groups"][0]["why_not"]
        assert "sram_usage_limit" in why, why
        assert f"host ring ({why})" in seen["table"], seen["table"]
        assert ring_job["groups"][0]["host_reason"] == "no_slots"      # the label: a code, not the sentence
        assert f'cais_job_groups_host_ring{{job="{ring_job["job"]}",reason="no_slots"}} 1.0' in seen["metrics"]
        assert 'cais_jobs{state="running"} 3.0' in seen["metrics"]
        assert "cais_slots_allocated 48.0" in seen["metrics"]          # 32 + 16, the limit reached
        _wait_jobs_gone(cluster, {"alpha", "beta", "gamma"})

        sequential = [("delta", [0, 1, 2], 24), ("epsilon", [3, 4, 5], 25), ("alpha", [0, 1], 26)]
        for job in sequential:                         # each on a switch whose earlier jobs are gone
            _check(_run_jobs(cluster, tmp_path, [job]), [job])
            ans = _wait_jobs_gone(cluster, {job[0]})

        assert ans["jobs"] == []
        ended = [(e["job"], e["state"]) for e in ans["ended"]]
        assert ended[0] == ("default", "replaced")     # the idle world job gave way to the first job
        assert sorted(ended[1:4]) == [("alpha", "ended"), ("beta", "ended"), ("gamma", "ended")]
        assert ended[4:] == [("delta", "ended"), ("epsilon", "ended"), ("alpha", "ended")]
        for args, key in ((["--json", "show-groups"], "groups"), (["--json", "dump-rules"], "rules")):
            out = cluster.cli(args)
            assert out.returncode == 0 and json.loads(out.stdout)[key] == [], out.stdout   # nothing left
        metrics = cluster.scrape()
        assert "cais_rules_in_use 0.0" in metrics and "cais_slots_allocated 0.0" in metrics
        assert "cais_jobs{state=\"running\"} 0.0" in metrics
    finally:
        cluster.close()
