"""The switch's regression on any link: directed cases and random mixes, scored against the reference model.

Each entry point is ``async def main(link, job)`` for :func:`cais.sim.backends.run_backend`, so the same
regression runs on amaranth.sim, cocotb and the C++-driven Verilator link. Every part returns, besides
its problems, the log of what left the switch (port, frame, first and last beat's cycle): the links run
the same per-cycle rules (:mod:`cais.sim.links.wires`), so two simulator links must return identical
logs for the same job (``tests/sim/test_link_identity.py``).

``suite_job`` runs a list of parts; a part is ``{"kind": "directed" | "mix" | "payloads", "idle": p,
"backpressure": p or [p per port] or "mix", "seed": s, "cases": [names] (directed), "frames_per_port": n
(mix)}``.
"""

from __future__ import annotations

import math
import random

import numpy as np

from cais import protocol as proto
from cais.registers import read_counters, register_map
from cais.tables import Rule, rule_writes, slot_clear_writes

from .directed import accounting_problems, counter_problems, directed_cases, score_case
from .links.base import Received, Sent, wait_idle
from .links.wires import per_port
from .refmodel import SwitchModel
from .traffic import TxFrame, compare, host_mac, random_mix, replay
from .workload import reference_reduce

__all__ = ["LinkHarness", "suite_job", "mix_backpressure", "part_backpressure", "sink_cycles", "DRAIN_LIMIT"]

#: Cycles a drain may take before the harness reports the switch stuck; a part that expects many frames
#: adds the cycles its sinks need to take them (:func:`sink_cycles`).
DRAIN_LIMIT = 400_000


def mix_backpressure(ports: int) -> list[float]:
    """Back-pressure that differs per port: one sink mostly stalled, one always ready, the others 25%."""
    return [0.8, 0.0] + [0.25] * (ports - 2)


def part_backpressure(part: dict, ports: int) -> float | list[float]:
    """A part's ``backpressure`` (default 0), with ``"mix"`` spelled out (:func:`mix_backpressure`)."""
    backpressure = part.get("backpressure", 0.0)
    return mix_backpressure(ports) if backpressure == "mix" else backpressure


def sink_cycles(params, expected: list[list[bytes]], backpressure: float | list[float]) -> int:
    """The fewest cycles in which the sinks can take the frames ``expected`` on each port: a sink takes a
    beat only in a cycle it is ready, a fraction ``1 - backpressure`` of the cycles, so the slowest
    port's beats over that fraction. (A mix of 16 ports x 64 bits sends one port some 82k beats: at 20%
    ready that is 408k cycles however fast the switch.) A port that is never ready is left out."""
    rates = [1.0 - b for b in per_port(backpressure, params.ports, "backpressure")]
    beats = [sum(-(-len(frame) // params.beat_bytes) for frame in frames) for frames in expected]
    # rounded first: 1 - 0.8 is a hair under 0.2, and 16 / it a hair over 80
    return max((math.ceil(round(n / rate, 6)) for n, rate in zip(beats, rates) if rate > 0), default=0)


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
            self.link.send(port, frame.data, bad_keep=frame.bad_keep, bad_fcs=frame.bad_fcs)
        else:
            self.link.send(port, frame)

    async def drain(self, limit: int = DRAIN_LIMIT) -> None:
        """Wait until everything sent has been decided and has left (BUSY reads 0); collect the frames."""
        idle = await wait_idle(self.link, limit=self.link.cycle + limit)
        self.collect()
        if not idle:
            raise AssertionError(f"the switch did not drain within {limit} cycles")

    async def counters(self) -> dict:
        return await read_counters(self.link.read, self._regs)

    async def check_counters(self, model) -> tuple[dict, list[str]]:
        """The switch's counters, and the problems: every counter against ``model``'s (the reference model
        fed the same frames), and the accounting invariant."""
        counters = await self.counters()
        return counters, counter_problems(counters, model.counters()) + accounting_problems(counters)

    def collect(self) -> list[Received]:
        """Take what left the switch (and the ingress stamps) into ``rx``, ``log`` and ``sent``; return the
        frames taken."""
        got = self.link.take_stamped()
        for frame in got:
            self.rx[frame.port].append(frame.data)
        self.log += got
        self.sent += self.link.take_sent()
        return got

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
    model, expected = replay(scen)
    problems = []
    try:
        await harness.drain(DRAIN_LIMIT + sink_cycles(params, expected, part_backpressure(part, params.ports)))
    except AssertionError as exc:
        problems.append(str(exc))
    if not any(expected):
        problems.append("the mix produced no output at all: it checks nothing")
    problems += compare(expected, harness.rx)
    problems += (await harness.check_counters(model))[1]
    return [{"name": f"random_mix(seed={seed}, frames/port={scen.total_frames // params.ports})",
             "problems": problems, "log": harness.log_json(), "cycles": link.cycle}]


async def _payloads(link, part: dict) -> list[dict]:
    """All-reduce chunks from every port at once: random ops, full and partial payloads, numpy results.

    Three rules cover every port, one per operator (a chunk's layer_id names its operator's rule); they
    share a quota of ``count`` slots (up to 64). Round r sends the chunks r*count .. r*count+count-1, one
    per slot, all in set r % 2; even rounds at full speed, odd rounds under idle and back-pressure
    (``part["idle"]``, ``part["backpressure"]``, default 0.3); at least 128 chunks over at least two rounds.
    Within a round each port sends its contributions in its own random order, and the round drains before
    the next starts (the driver's window rule). Each port must receive exactly one result per chunk, equal
    to the reduction numpy computes, from the programmed switch MAC.
    """
    params = link.params
    P, regs = params.ports, register_map(params)
    seed = int(part.get("seed", 0))
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    allp, group = (1 << P) - 1, 7
    count_log2 = min(params.slots.bit_length() - 1, 6)
    count = 1 << count_log2
    rounds = max(2, min(8, -(-128 // count)))
    switch_mac = 0x02_5A_00_00_00_00 | int(rng.integers(0, 1 << 32))
    writes = []
    for op in proto.ReduceOp:
        writes += rule_writes(regs, int(op), Rule(group=(group, 0xFF), layer=(int(op), 0x3), contributors=allp,
                                                  results=allp, base=0, count_log2=count_log2, red_op=op))
    writes += slot_clear_writes(regs, 0, count)
    writes += [(regs["SWITCH_MAC_LO"].address(), switch_mac & 0xFFFF_FFFF),
               (regs["SWITCH_MAC_HI"].address(), switch_mac >> 32)]
    await link.reset()
    harness = LinkHarness(link)
    model = SwitchModel(params)
    for addr, value in writes:
        model.write(addr, value)
    await harness.apply(writes)
    n_max = params.max_payload // 4
    problems: list[str] = []
    for rnd in range(rounds):
        rough = rnd % 2 == 1
        link.set_patterns(part.get("idle", 0.3) if rough else 0.0, part.get("backpressure", 0.3) if rough else 0.0)
        per_port: list[list[bytes]] = [[] for _ in range(P)]
        expected: list[list[bytes]] = [[] for _ in range(P)]
        for i in range(count):
            seq = rnd * count + i
            op = proto.ReduceOp(prng.choice(list(proto.ReduceOp)))
            n = prng.choice([n_max, n_max, 1, n_max - 1, params.beat_bytes // 4, prng.randint(1, n_max)])
            n = max(1, min(n_max, n))
            if prng.random() < 0.25:   # extremes: the sum wraps, MAX/MIN meet the int32 limits
                values = rng.choice(np.array([-2**31, 2**31 - 1, -1, 0, 1], dtype=np.int64), (P, n))
            else:
                values = rng.integers(-2**31, 2**31, (P, n), dtype=np.int64)
            layer = int(rng.integers(0, 1 << 16)) & ~0x3 | int(op)     # selects the rule of op
            hdr = proto.CaisHeader(group_id=group, layer_id=layer, chunk_id=i,
                                   total_chunks=count, seq_num=seq, payload_len=4 * n, red_op=op)
            for p in range(P):
                per_port[p].append(proto.build_frame(hdr, values[p].astype(">i4").tobytes(), src=host_mac(p),
                                                     pad=True))
            result = (proto.mac_to_bytes(proto.result_mac(group)) + proto.mac_to_bytes(switch_mac)
                      + proto.ETHERTYPE.to_bytes(2, "big") + hdr.replace(flags=int(proto.Flags.RESULT)).pack()
                      + reference_reduce(list(values.astype(np.int32)), op).astype(">i4").tobytes())
            for p in range(P):
                expected[p].append(result)
        for p in range(P):
            prng.shuffle(per_port[p])
        before = [len(rx) for rx in harness.rx]
        for k in range(count):
            for p in range(P):
                harness.send(p, per_port[p][k])
                model.receive(p, per_port[p][k])
        try:
            await harness.drain()
        except AssertionError as exc:
            problems.append(f"round {rnd}: {exc}")
        got = [rx[n:] for rx, n in zip(harness.rx, before)]
        problems += [f"round {rnd}: {p}" for p in compare(expected, got)]
    link.set_patterns(0.0, 0.0)
    counters, counter_issues = await harness.check_counters(model)
    problems += counter_issues
    if counters["COMPLETED"] != rounds * count:
        problems.append(f"COMPLETED {counters['COMPLETED']}, expected {rounds * count}")
    return [{"name": f"all_ports_random_payloads(seed={seed}, {rounds}x{count} chunks)", "problems": problems,
             "log": harness.log_json(), "cycles": link.cycle}]


async def suite_job(link, job: dict) -> list[dict]:
    """Run ``job["parts"]`` in order; return one record per case: name, problems, log, cycles, patterns."""
    out = []
    for part in job["parts"]:
        idle, backpressure = part.get("idle", 0.0), part_backpressure(part, link.params.ports)
        link.set_patterns(idle, backpressure)
        run = {"directed": _directed, "mix": _mix, "payloads": _payloads}[part["kind"]]
        for record in await run(link, part):
            record["patterns"] = {"idle": idle, "backpressure": backpressure}
            out.append(record)
    return out
