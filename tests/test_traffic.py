"""The random mix is what it claims: its only accepted contributions are its chunks, so its outcome
does not depend on how the switch interleaves ports."""

import pytest

from cais.params import SwitchParams
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import random_mix


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("params", [SwitchParams(), SwitchParams(ports=2, data_width=512, slots=16)])
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
            model.receive(port, frame.data, framing_ok=not frame.bad_keep)
            c = model.counters()
            assert c["CONTRIBUTIONS"] == 0 and c["DUPLICATES"] == 0, (port, frame.data[:40].hex())
