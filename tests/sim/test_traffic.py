"""The random mix is what it claims: its only accepted contributions are its chunks, so its outcome
does not depend on how the switch interleaves ports."""

import pytest

from cais.params import SwitchParams
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import random_mix, replay

from tiers import sweep


# make test-fast: two seeds of each build
@pytest.mark.parametrize("params,seed", sweep(
    [(params, seed) for params in (SwitchParams(), SwitchParams(ports=2, data_width=512, slots=16)) for seed in range(6)],
    fast=lambda params, seed: seed < 2, ids=lambda params, seed: f"{params.slug()}-{seed}"))
def test_only_the_chunks_are_contributions(seed, params):
    real = {f.data for frames in random_mix(params, seed, frames_per_port=0).frames for f in frames}
    scen = random_mix(params, seed, frames_per_port=120)
    for port, frames in enumerate(scen.frames):
        for frame in frames:
            if frame.data in real:
                continue
            model = SwitchModel(params)
            for addr, value in scen.writes:
                model.write(addr, value)
            model.receive(port, frame.data, framing_ok=not frame.bad_keep, fcs_ok=not frame.bad_fcs)
            c = model.counters()
            assert c["CONTRIBUTIONS"] == 0 and c["DUPLICATES"] == 0, (port, frame.data[:40].hex())


def _interleaved(scen, rng, model=None):
    """Like replay, but the ports take turns in a random order (each port's own order kept)."""
    from cais.sim.refmodel import SwitchModel
    model = SwitchModel(scen.params)
    for addr, value in scen.writes:
        model.write(addr, value)
    out = [[] for _ in range(scen.params.ports)]
    queues = [list(f) for f in scen.frames]
    while any(queues):
        p = rng.choice([i for i, q in enumerate(queues) if q])
        frame = queues[p].pop(0)
        for port, data in model.receive(p, frame.data, framing_ok=not frame.bad_keep, fcs_ok=not frame.bad_fcs):
            out[port].append(data)
    return model, out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("params", [SwitchParams(), SwitchParams(ports=2, data_width=512, slots=16),
                                    SwitchParams(ports=16, data_width=128, slots=32),
                                    SwitchParams(float_units=False), SwitchParams(rules=3)],
                         ids=["p4", "p2_w512", "p16", "no_float", "rules3"])
def test_outcome_does_not_depend_on_interleaving(seed, params):
    """Float sums, saturating sums and float MAX/MIN depend on the order of arrival in general; the mix's
    values are chosen so that they do not (cais.sim.traffic.chunk_values)."""
    import random
    scen = random_mix(params, seed, frames_per_port=40)
    model, expected = replay(scen)
    c = model.counters()
    assert c["COMPLETED"] > 0
    for k in range(3):
        other, got = _interleaved(scen, random.Random(seed * 10 + k))
        assert [sorted(e) for e in expected] == [sorted(g) for g in got]
        assert other.counters() == c


def test_mix_covers_the_element_types():
    """Over a few seeds the mix's chunks use every dtype, and its drops include TYPE_MISMATCH."""
    dtypes, reasons = set(), {}
    for seed in range(12):
        scen = random_mix(SwitchParams(), seed, frames_per_port=60)
        for frames in scen.frames:
            for f in frames:
                if len(f.data) >= 30 and f.data[12:14] == b"\x88\xb5" and f.data[14] == 0:
                    dtypes.add(f.data[28] >> 4)
        model, _ = replay(scen)
        for name, value in model.counters().items():
            if name.startswith("DROP_"):
                reasons[name] = reasons.get(name, 0) + value
    assert set(range(6)) <= dtypes
    assert reasons["DROP_TYPE_MISMATCH"] > 0


def test_sink_cycles_is_the_slowest_ports_beats_over_its_ready_rate():
    from cais.sim.suite import part_backpressure, sink_cycles

    params = SwitchParams()                          # 8-byte beats
    expected = [[bytes(60), bytes(64)], [bytes(9)], [bytes(8)] * 3, []]
    # port 0: 8 + 8 beats, ready 1 cycle in 5: 80 cycles; port 1: 2 beats in half the cycles: 4; port 2: 3;
    # port 3 is never ready and expects nothing
    assert sink_cycles(params, expected, [0.8, 0.5, 0.0, 1.0]) == 80
    assert sink_cycles(params, expected, 0.25) == 22             # 16 beats / 0.75 = 21.3
    assert sink_cycles(params, [[], [], [], []], 0.8) == 0
    assert part_backpressure({"backpressure": "mix"}, 4) == [0.8, 0.0, 0.25, 0.25]
    assert part_backpressure({}, 4) == 0.0


def test_the_16_port_64_bit_mix_needs_more_than_the_fixed_drain_limit():
    """Why the regression's mix adds sink_cycles to its drain limit: on 16 ports of 64 bits one port's sink,
    ready one cycle in five, takes some 82k beats of the regression's mix (every port floods to it), more
    than DRAIN_LIMIT cycles however fast the switch (the RTL kept that sink busy in every ready cycle)."""
    from buildsets import MANY_PORTS
    from cais.sim.suite import DRAIN_LIMIT, mix_backpressure, sink_cycles

    params = MANY_PORTS                              # the regression's 16-port build
    _, expected = replay(random_mix(params, 1, frames_per_port=200))
    need = sink_cycles(params, expected, mix_backpressure(params.ports))
    port0_beats = sum(-(-len(f) // params.beat_bytes) for f in expected[0])
    assert need == 5 * port0_beats > DRAIN_LIMIT, (need, port0_beats)
