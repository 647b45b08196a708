"""The switch's regression on any link: directed cases and random mixes, scored against the reference model.

Each entry point is ``async def main(link, job)`` for :func:`cais.sim.backends.run_backend`, so the same
regression runs on amaranth.sim, cocotb and the C++-driven Verilator link. Every part returns, besides
its problems, the log of what left the switch (port, frame, first and last beat's cycle): the links run
the same per-cycle rules (:mod:`cais.sim.links.wires`), so two simulator links must return identical
logs for the same job (``tests/test_link_identity.py``).

``suite_job`` runs a list of parts; a part is ``{"kind": "directed" | "mix", "idle": p, "backpressure":
p or [p per port], "seed": s, "cases": [names] (directed), "frames_per_port": n (mix)}``.
"""

from __future__ import annotations

from cais.registers import read_counters, register_map

from .directed import accounting_problems, counter_problems, directed_cases, score_case
from .links.base import Received, Sent, wait_idle
from .traffic import TxFrame, compare, random_mix, replay

__all__ = ["LinkHarness", "suite_job", "mix_backpressure", "DRAIN_LIMIT"]

#: Cycles a drain may take before the harness reports the switch stuck.
DRAIN_LIMIT = 400_000


def mix_backpressure(ports: int) -> list[float]:
    """Back-pressure that differs per port: one sink mostly stalled, one always ready, the others 25%."""
    return [0.8, 0.0] + [0.25] * (ports - 2)


class LinkHarness:
    """What :func:`cais.sim.directed.score_case` drives, on a link: registers, frames, drain, counters.

    ``rx[port]`` holds the frames received so far; ``log`` every one with its stamps."""

    def __init__(self, link):
        self.link = link
        self.params = link.params
        self.rx: list[list[bytes]] = [[] for _ in range(link.params.ports)]
        self.log: list[Received] = []
        self.sent: list[Sent] = []
        self._regs = register_map(link.params)

    async def write(self, addr: int, value: int) -> None:
        await self.link.write(addr, value)

    async def apply(self, writes) -> None:
        for addr, value in writes:
            await self.link.write(addr, value)

    def send(self, port: int, frame: TxFrame | bytes) -> None:
        if isinstance(frame, TxFrame):
            self.link.send(port, frame.data, bad_keep=frame.bad_keep)
        else:
            self.link.send(port, frame)

    async def drain(self, limit: int = DRAIN_LIMIT) -> None:
        """Wait until everything sent has been decided and has left (BUSY reads 0); collect the frames."""
        idle = await wait_idle(self.link, limit=self.link.cycle + limit)
        self._collect()
        if not idle:
            raise AssertionError(f"the switch did not drain within {limit} cycles")

    async def counters(self) -> dict:
        return await read_counters(self.link.read, self._regs)

    def _collect(self) -> None:
        for got in self.link.take_stamped():
            self.rx[got.port].append(got.data)
            self.log.append(got)
        self.sent += self.link.take_sent()

    def log_json(self) -> list[list]:
        """Every frame out (port, hex, first, last) and then every frame in (port, first, last)."""
        return ([[r.port, r.data.hex(), r.first, r.last] for r in self.log]
                + [["in", s.port, s.first, s.last] for s in self.sent])


async def _directed(link, part: dict) -> list[dict]:
    cases = directed_cases(link.params, seed=int(part.get("seed", 0)))
    names = part.get("cases")
    if names is not None:
        unknown = set(names) - {c.name for c in cases}
        if unknown:
            raise ValueError(f"unknown directed cases: {sorted(unknown)}")
        cases = [c for c in cases if c.name in names]
    results = []
    for case in cases:
        await link.reset()
        harness = LinkHarness(link)
        try:
            problems = await score_case(harness, link.params, case)
        except AssertionError as exc:          # a drain that never ends: report it, go on
            problems = [f"aborted: {exc}"]
        results.append({"name": case.name, "problems": problems, "log": harness.log_json(), "cycles": link.cycle})
    return results


async def _mix(link, part: dict) -> list[dict]:
    params = link.params
    seed = int(part.get("seed", 0))
    scen = random_mix(params, seed, frames_per_port=int(part.get("frames_per_port", 12)))
    await link.reset()
    harness = LinkHarness(link)
    await harness.apply(scen.writes)
    for port, frames in enumerate(scen.frames):
        for frame in frames:
            harness.send(port, frame)
    problems = []
    try:
        await harness.drain()
    except AssertionError as exc:
        problems.append(str(exc))
    model, expected = replay(scen)
    if not any(expected):
        problems.append("the mix produced no output at all: it checks nothing")
    problems += compare(expected, harness.rx)
    counters = await harness.counters()
    problems += counter_problems(counters, model.counters())
    problems += accounting_problems(counters)
    return [{"name": f"random_mix(seed={seed}, frames/port={scen.total_frames // params.ports})",
             "problems": problems, "log": harness.log_json(), "cycles": link.cycle}]


async def suite_job(link, job: dict) -> list[dict]:
    """Run ``job["parts"]`` in order; return one record per case: name, problems, log, cycles, patterns."""
    out = []
    for part in job["parts"]:
        idle, backpressure = part.get("idle", 0.0), part.get("backpressure", 0.0)
        if backpressure == "mix":
            backpressure = mix_backpressure(link.params.ports)
        link.set_patterns(idle, backpressure)
        run = {"directed": _directed, "mix": _mix}[part["kind"]]
        for record in await run(link, part):
            record["patterns"] = {"idle": idle, "backpressure": backpressure}
            out.append(record)
    return out
