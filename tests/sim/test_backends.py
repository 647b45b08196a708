"""The SwitchLink backends (model, amaranth.sim, cocotb + Verilator, the C++-driven Verilator link) behave
the same for a driver, and FaultyLink injects the same faults whatever the timing."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cais.link import run_sync
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.backends import ModelLink, load_entry, run_backend, run_model
from cais.sim.faults import FaultSpec, FaultyLink

PARAMS = SwitchParams()
SELFTEST = "cais.sim.backends:selftest_main"
JOB = {"seed": 7, "payload_len": 64}


# ------------------------------------------------------------------------------------------ helpers


def per_port(received):
    """[[port, hex], ...] -> per-port multisets of frames."""
    out = [Counter() for _ in range(PARAMS.ports)]
    for port, data in received:
        out[port][data] += 1
    return out


def assert_same(result, reference):
    assert per_port(result["received"]) == per_port(reference["received"])
    assert result["counters"] == reference["counters"]
    assert result["fault_stats"] == reference["fault_stats"]


async def steps_entry(link, job):
    """Several self-tests in one simulator run, each from a reset, with its own wire patterns. Defined in
    this test module: run_cocotb must make it importable in the simulator process."""
    out = []
    for step in job["steps"]:
        await link.reset()
        link.set_patterns(step.get("idle", 0.0), step.get("backpressure", 0.0))
        out.append(await load_entry(SELFTEST)(link, step["job"]))
    return out


_cache: dict = {}


def cached(kind, job, entry=SELFTEST, **kw):
    key = (kind, entry, repr(sorted(job.items())), repr(sorted(kw.items())))
    if key not in _cache:
        _cache[key] = run_backend(kind, PARAMS, entry, job, **kw)
    return _cache[key]


ROUGH_WIRES = {"idle": 0.3, "backpressure": 0.3, "seed": 2}     # idle sources, back-pressured sinks


@pytest.fixture(scope="module")
def fault_job():
    """Egress faults whose seed makes at least one result frame dropped, one duplicated, one reordered."""
    for seed in range(500):
        job = dict(JOB, faults={"drop": 0.25, "duplicate": 0.25, "reorder": 0.25, "seed": seed,
                                "ingress": False, "max_hold_cycles": 300})
        stats = cached("model", job)["fault_stats"]
        if stats["egress_dropped"] and stats["egress_duplicated"] and stats["egress_reordered"]:
            return job
    pytest.fail("no seed gives every kind of egress fault")


# ------------------------------------------------------------------------------------------ backends


def test_model_selftest():
    result = cached("model", JOB)
    assert result["correct"]
    assert sorted(p for p, _ in result["received"]) == list(range(PARAMS.ports))
    c = result["counters"]
    assert c["CONTRIBUTIONS"] == PARAMS.ports and c["COMPLETED"] == 1
    assert c["RX_FRAMES"] == [1] * PARAMS.ports and c["TX_FRAMES"] == [1] * PARAMS.ports


@pytest.mark.slow
def test_amaranth_matches_model():
    result = cached("amaranth", JOB)
    assert result["correct"]
    assert_same(result, cached("model", JOB))


@pytest.mark.verilator
def test_verilator_matches_model():
    result = cached("verilator", JOB)
    assert result["correct"]
    assert_same(result, cached("model", JOB))


@pytest.mark.verilator
def test_verilator_rough_wires_match_model():
    result = cached("verilator", JOB, **ROUGH_WIRES)
    assert result["correct"]
    assert_same(result, cached("model", JOB))


@pytest.mark.slow
def test_amaranth_rough_wires_match_model():
    result = cached("amaranth", JOB, **ROUGH_WIRES)
    assert result["correct"]
    assert_same(result, cached("model", JOB, **ROUGH_WIRES))      # the model ignores the wire options


@pytest.mark.slow
def test_faulty_egress_amaranth_matches_model(fault_job):
    reference = cached("model", fault_job)
    assert not reference["correct"]          # a result was dropped
    assert_same(cached("amaranth", fault_job), reference)


@pytest.mark.verilator
def test_cocotb_matches_model(fault_job):
    """One cocotb launch: plain, under idle and back-pressure (the pause patterns of the link's seed), and
    with egress faults; each as the model says."""
    steps = [{"job": JOB}, {"job": JOB, "idle": ROUGH_WIRES["idle"], "backpressure": ROUGH_WIRES["backpressure"]},
             {"job": fault_job}]
    plain, rough, faulty = run_backend("cocotb", PARAMS, f"{__name__}:steps_entry", {"steps": steps},
                                       seed=ROUGH_WIRES["seed"])
    assert plain["correct"] and rough["correct"]
    assert_same(plain, cached("model", JOB))
    assert_same(rough, cached("model", JOB))
    assert_same(faulty, cached("model", fault_job))
    # the same stimulus on the C++-driven link: the same frames in the same order, the same counters
    assert rough["received"] == cached("verilator", JOB, **ROUGH_WIRES)["received"]
    assert rough["counters"] == cached("verilator", JOB, **ROUGH_WIRES)["counters"]


@pytest.mark.verilator
def test_faulty_egress_verilator_matches_model(fault_job):
    assert_same(cached("verilator", fault_job), cached("model", fault_job))


def test_run_backend_rejects_bad_arguments():
    with pytest.raises(ValueError):
        run_backend("fpga", PARAMS, SELFTEST, JOB)
    with pytest.raises(ValueError):
        load_entry("cais.sim.backends.selftest_main")


def test_model_link_time_model():
    busy = register_map(PARAMS)["BUSY"].address()
    frame = bytes(range(14)) + bytes(50)              # an ordinary frame, flooded: 64 bytes = 8 beats

    async def main(link):
        link.send(0, frame)
        link.send(0, frame)                           # queued behind the first on the same wire
        assert await link.read(busy) == 1
        seen = []
        while len(seen) < 6:
            await link.advance(1)
            seen += [(link.cycle, port) for port, _ in link.take_received()]
        assert await link.read(busy) == 0
        return seen

    seen = run_model(PARAMS, main)
    # wire 8 beats, then the lane starts it: first beat out FORWARD_LATENCY later, last beat 8 later; the
    # second frame follows on the wire, in the lane and on each egress port 8 cycles behind the first
    first = 8 + ModelLink.FORWARD_LATENCY + 8
    assert seen == [(first, 1), (first, 2), (first, 3), (first + 8, 1), (first + 8, 2), (first + 8, 3)]


def test_model_link_outcome_independent_of_advance_steps():
    frames = [(p, bytes([p, i]) * 40) for i in range(5) for p in range(PARAMS.ports)]

    def run(step):
        async def main(link):
            for port, frame in frames:
                link.send(port, frame)
            got = []
            while link.cycle < 2000:
                await link.advance(step)
                got += [(link.cycle // 100, port, f) for port, f in link.take_received()]
            return [(p, f) for _, p, f in got]
        return run_model(PARAMS, main)

    assert run(1) == run(7) == run(100)


# ------------------------------------------------------------------------------------------ FaultyLink


class Loopback:
    """A stand-in switch: every frame sent on a port comes straight back out of the same port."""

    def __init__(self):
        self.params = PARAMS
        self.clock_hz = 1e8
        self.cycle = 0
        self.sent: list[tuple[int, int, bytes]] = []
        self._out: list[tuple[int, bytes]] = []

    def send(self, port, frame):
        self.sent.append((self.cycle, port, frame))
        self._out.append((port, frame))

    def take_received(self):
        out, self._out = self._out, []
        return out

    async def advance(self, cycles):
        self.cycle += cycles

    async def read(self, addr):
        self.cycle += 4
        return 0

    async def write(self, addr, value):
        self.cycle += 4


def drive(link, frames, rng=None):
    """Send `frames` [(port, bytes)], advancing randomly between them when `rng` is given."""
    received = []

    async def main(link):
        for port, frame in frames:
            link.send(port, frame)
            if rng is not None and rng.random() < 0.5:
                await link.advance(rng.randrange(0, 50))
                received.extend(link.take_received())
        await link.advance(10_000)
        received.extend(link.take_received())
    run_sync(main(link))
    return received


def some_frames(n, repeats=True, seed=0):
    rng = random.Random(seed)
    frames = [(rng.randrange(PARAMS.ports), rng.randbytes(rng.randrange(20, 90))) for _ in range(n)]
    if repeats:                                      # the same bytes again: retransmissions
        frames += [frames[i] for i in range(0, n, 3)]
    return frames


def test_decide_is_a_pure_function():
    spec = FaultSpec(drop=0.3, duplicate=0.3, reorder=0.3, seed=5)
    for port, frame in some_frames(50, repeats=False):
        for k in range(3):
            assert spec.decide("ingress", port, frame, k) == spec.decide("ingress", port, frame, k)
    draws = {spec.draw("egress", 0, b"abc", k) for k in range(20)}
    assert len(draws) == 20
    assert spec.draw("egress", 0, b"abc", 0) != FaultSpec(seed=6).draw("egress", 0, b"abc", 0)
    assert spec.draw("egress", 0, b"abc", 0) != spec.draw("ingress", 0, b"abc", 0)


def test_same_faults_regardless_of_timing():
    spec = FaultSpec(drop=0.2, duplicate=0.2, reorder=0.2, seed=11, max_hold_cycles=30)
    frames = some_frames(300)
    a, b = FaultyLink(Loopback(), spec), FaultyLink(Loopback(), spec)
    got_a = drive(a, frames)
    got_b = drive(b, frames, rng=random.Random(3))
    ingress = [e for e in a.events if e[0] == "ingress"]
    assert ingress == [e for e in b.events if e[0] == "ingress"]
    assert Counter(a.events) == Counter(b.events)               # egress decided in another order
    assert Counter((p, f) for _, p, f in a.inner.sent) == Counter((p, f) for _, p, f in b.inner.sent)
    assert Counter(got_a) == Counter(got_b)
    for key in ("dropped", "duplicated", "reordered"):
        assert a.stats[f"ingress_{key}"] == b.stats[f"ingress_{key}"] > 0
        assert a.stats[f"egress_{key}"] == b.stats[f"egress_{key}"] > 0
    # retransmissions were decided afresh: their occurrence index is 1
    assert any(e[2] == 1 for e in a.events)


def test_fault_rates():
    n = 6000
    spec = FaultSpec(drop=0.2, duplicate=0.1, reorder=0.05, seed=1, egress=False)
    link = FaultyLink(Loopback(), spec)
    drive(link, some_frames(n, repeats=False, seed=2))
    s = link.stats
    assert s["ingress_frames"] == n and s["egress_frames"] == 0
    for key, p in (("dropped", 0.2), ("duplicated", 0.1), ("reordered", 0.05)):
        sigma = (p * (1 - p) / n) ** 0.5
        assert abs(s[f"ingress_{key}"] / n - p) < 4 * sigma, (key, s)
    assert len(link.inner.sent) == n - s["ingress_dropped"] + s["ingress_duplicated"]


def find(spec, action, direction="ingress", port=0, start=0):
    for i in range(start, start + 10_000):
        frame = i.to_bytes(4, "big") * 16
        if spec.decide(direction, port, frame) == action:
            return frame
    raise AssertionError(f"no frame gets {action}")


def test_duplicate_is_back_to_back():
    spec = FaultSpec(duplicate=1.0)
    link = FaultyLink(Loopback(), spec)
    frames = [(0, b"a" * 60), (1, b"b" * 60), (0, b"c" * 60)]
    got = drive(link, frames)
    assert [(p, f) for _, p, f in link.inner.sent] == [x for x in frames for _ in (0, 1)]
    # and again on the way out: each of the two copies comes out twice
    assert got == [x for x in frames for _ in range(4)]


def test_reorder_follows_next_delivered_frame():
    spec = FaultSpec(drop=0.25, duplicate=0.25, reorder=0.25, seed=9, egress=False)
    held1, held2 = find(spec, "reorder"), find(spec, "reorder", start=5000)
    dropped, dup, plain = find(spec, "drop"), find(spec, "duplicate"), find(spec, "pass")
    other = find(spec, "pass", port=1)
    link = FaultyLink(Loopback(), spec)
    drive(link, [(0, held1), (0, held2), (1, other), (0, dropped), (0, dup), (0, plain)])
    assert [(p, f) for _, p, f in link.inner.sent] == [
        (1, other),                  # another port does not release port 0's held frames
        (0, dup), (0, dup),          # the next delivered frame of port 0 (a dropped one does not count)
        (0, held1), (0, held2),      # then the held frames, in the order they were held
        (0, plain)]
    assert link.stats["ingress_reordered"] == 2 and link.stats["ingress_released_by_timeout"] == 0


def test_reorder_released_after_max_hold():
    spec = FaultSpec(reorder=1.0, max_hold_cycles=100)
    link = FaultyLink(Loopback(), spec)

    async def main():
        link.send(2, b"x" * 60)
        await link.advance(99)
        assert link.inner.sent == [] and link.holding == 1
        await link.advance(5)
        assert link.inner.sent == [(100, 2, b"x" * 60)]      # sent at the deadline, inside advance()
        assert link.take_received() == []                   # held again on the way out
        await link.advance(99)
        assert link.take_received() == []
        await link.advance(1)
        assert link.take_received() == [(2, b"x" * 60)]
        assert link.holding == 0
    run_sync(main())
    assert link.stats["ingress_released_by_timeout"] == link.stats["egress_released_by_timeout"] == 1


def test_ports_and_directions():
    spec = FaultSpec(drop=1.0, ports=[1], ingress=True, egress=False)
    link = FaultyLink(Loopback(), spec)
    got = drive(link, [(0, b"a" * 60), (1, b"b" * 60), (2, b"c" * 60)])
    assert got == [(0, b"a" * 60), (2, b"c" * 60)]
    assert link.stats["ingress_frames"] == 1 and link.stats["egress_frames"] == 0


def test_spec_validation():
    with pytest.raises(ValueError):
        FaultSpec(drop=0.6, duplicate=0.6)
    with pytest.raises(ValueError):
        FaultSpec(reorder=-0.1)
    with pytest.raises(ValueError):
        FaultSpec(drop=0.1).decide("sideways", 0, b"")
