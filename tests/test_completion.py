"""JobQueue under amaranth.sim against a model written here: a job leaves, in order, only once every frame
decided before it has finished (docs/core-design.md, section 5).

The model keeps, per port, the decision numbers of the frames still open; a job records the newest
decision of each port at the time it was queued, and is ready when none of those frames is open. The
block sees only counts (``open_after``) and the per-cycle number of finished frames.
"""

import random

import pytest

from cais.hdl.completion import JobQueue
from cais.params import SwitchParams

from blocksim import run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_jobs_wait_for_the_frames_decided_before_them(seed):
    rng = random.Random(seed)
    params = SwitchParams(ports=3)
    P = params.ports
    dut = JobQueue(params)
    problems = []
    released = []

    async def tb(ctx):
        open_frames = [[] for _ in range(P)]     # per port: decision numbers of open frames, oldest first
        jobs = []                                 # queued: (job id, {port: newest decision number})
        decision = job_id = 0
        clear_before = None
        for cycle in range(3000):
            # frames finish in order per port, up to 2 in a cycle (a flushed one and a one-beat one)
            finished = [min(len(open_frames[p]), rng.choice([0, 0, 0, 1, 1, 2])) for p in range(P)]
            for p in range(P):
                del open_frames[p][:finished[p]]
                ctx.set(dut.finished[p], finished[p])
            # a decision for a random port now and then; some queue a job
            push = False
            if rng.random() < 0.5 and all(len(o) < 5 for o in open_frames):
                p = rng.randrange(P)
                open_frames[p].append(decision)
                decision += 1
                if rng.random() < 0.4 and len(jobs) < dut.depth:
                    push = True
                    jobs.append((job_id, {q: (open_frames[q][-1] if open_frames[q] else None) for q in range(P)}))
            ctx.set(dut.push, push)
            ctx.set(dut.job, {"row_base": job_id % 128, "mask": job_id % 8} if push else {"row_base": 0})
            for q in range(P):
                ctx.set(dut.open_after[q], len(open_frames[q]))
            if push:
                job_id += 1
            pop = rng.random() < 0.7
            ctx.set(dut.pop, pop)
            await ctx.delay(1e-9)
            ready, head = ctx.get(dut.head_ready), ctx.get(dut.head)
            if ctx.get(dut.level) != len(jobs) - push:      # the jobs queued before this cycle
                problems.append(f"cycle {cycle}: level {ctx.get(dut.level)}, expected {len(jobs) - push}")
            if ready and pop:
                jid, newest = jobs[0]
                # the model: every frame the job waited for is finished (not open any more)
                still_open = [q for q, d in newest.items() if d is not None and d in open_frames[q]]
                if still_open:
                    problems.append(f"cycle {cycle}: job {jid} left while ports {still_open} had frames open")
                if head["row_base"] != jid % 128:
                    problems.append(f"cycle {cycle}: head is job {head['row_base']}, expected {jid % 128}")
                released.append(jid)
                jobs.pop(0)
            elif jobs and not ready and clear_before == jobs[0][0]:
                problems.append(f"cycle {cycle}: job {jobs[0][0]} not released though its frames finished")
            # the head whose frames are all finished now must be ready from the next cycle on
            clear_before = None
            if jobs and not any(d is not None and d in open_frames[q] for q, d in jobs[0][1].items()):
                clear_before = jobs[0][0]
            await ctx.tick()

    run(dut, tb)
    assert not problems, problems[:5]
    assert len(released) > 50 and released == sorted(released)
