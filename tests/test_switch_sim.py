"""The whole switch under amaranth.sim: the directed protocol cases and a random mix, each scored
against the numpy reference model (frames out of every port, and every counter)."""

import pytest

from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.sim.amaranth_harness import SwitchSim
from cais.sim.directed import directed_cases
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import compare, random_mix, replay

PARAM_SETS = {
    "p4_w64": SwitchParams(),
    "p2_w512": SwitchParams(ports=2, data_width=512, slots=16),
}


async def read_counters(sim, regmap):
    out = {}
    for reg in regmap:
        if reg.kind in (Kind.COUNTER, Kind.LEVEL):
            values = [await sim.read(reg.address(i)) for i in range(reg.count)]
            out[reg.name] = values if reg.count > 1 else values[0]
    return out


def check_accounting(counters):
    consumed = counters["CONTRIBUTIONS"] + counters["DUPLICATES"]
    dropped = sum(v for k, v in counters.items() if k.startswith("DROP_"))
    assert sum(counters["RX_FRAMES"]) == counters["FORWARDED"] + consumed + dropped, counters


def run_case(params, case, **sim_kw):
    regmap = register_map(params)
    model = SwitchModel(params)
    sim = SwitchSim(params, **sim_kw)
    problems = []
    result = {}

    async def scenario(s):
        await s.apply(case.writes)
        for addr, value in case.writes:
            model.write(addr, value)
        for i, batch in enumerate(case.batches):
            for addr, value in case.writes_before.get(i, []):
                await s.write(addr, value)
                model.write(addr, value)
            expected = [[] for _ in range(params.ports)]
            for port, frame in batch:
                s.send(port, frame)
                for out_port, data in model.receive(port, frame.data, framing_ok=not frame.bad_keep):
                    expected[out_port].append(data)
            before = [len(rx) for rx in s.rx]
            await s.drain()
            got = [rx[n:] for rx, n in zip(s.rx, before)]
            problems.extend(f"batch {i}: {p}" for p in compare(expected, got))
        result["counters"] = await read_counters(s, regmap)

    sim.run(scenario)
    assert not problems, f"{case.name}: " + "; ".join(problems)
    assert result["counters"] == model.counters(), case.name
    check_accounting(result["counters"])


@pytest.mark.parametrize("pname", PARAM_SETS)
@pytest.mark.parametrize("name", [case.name for case in directed_cases(SwitchParams())])
def test_directed(pname, name):
    params = PARAM_SETS[pname]
    case = next(c for c in directed_cases(params) if c.name == name)
    run_case(params, case)


@pytest.mark.parametrize("pname", PARAM_SETS)
def test_random_mix_with_idle_and_backpressure(pname):
    params = PARAM_SETS[pname]
    scen = random_mix(params, seed=7, frames_per_port=8)
    sim = SwitchSim(params, idle=0.25, backpressure=0.25, seed=11)
    result = {}

    async def scenario(s):
        await s.apply(scen.writes)
        for port, frames in enumerate(scen.frames):
            for frame in frames:
                s.send(port, frame)
        await s.drain()
        result["counters"] = await read_counters(s, register_map(params))

    sim.run(scenario)
    model, expected = replay(scen)
    assert not compare(expected, sim.rx)
    assert result["counters"] == model.counters()
    check_accounting(result["counters"])
