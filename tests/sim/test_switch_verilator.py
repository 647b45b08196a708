"""The exported switch on the C++-driven Verilator link: the whole regression of cais.sim.suite per
parameter set, scored against the reference model (frames out of every port and every counter).

* every directed case of cais.sim.directed, plain and under seeded idle insertion on the sources and
  back-pressure on the sinks;
* a long random mix (all-reduce, ordinary, forwarded and malformed frames) under idle and per-port
  back-pressure (one sink mostly stalled, one always ready);
* all-reduce chunks of random operators and lengths from every port at once, every round's results
  checked against numpy;
* float all-reduce of every float rule kind, bit for bit against the model for the arrival order, and
  reproducible rules giving the port-order fold whatever the order (cais.sim.floats).

tests/sim/test_link_identity.py shows this link cycle-identical to the cocotb link on the same Verilog.
``CAIS_SEED`` (default 1) seeds the traffic and the pause patterns.
"""

from __future__ import annotations

import os

import pytest

from cais import protocol as proto
from cais.params import SwitchParams

from buildsets import REGRESSION_SETS
from cais.sim.backends import run_backend

PARAM_SETS = REGRESSION_SETS
FLOAT_SETS = [name for name, params in PARAM_SETS.items() if params.float_units]
SEED = int(os.environ.get("CAIS_SEED", "1"))


def mix_frames_per_port(params: SwitchParams) -> int:
    """Thousands of frames in all: 1500 per port on 2 ports, 750 on 4, 200 on 16."""
    return max(200, 3000 // params.ports)


@pytest.mark.verilator
@pytest.mark.parametrize("pname", PARAM_SETS)
def test_regression(pname):
    params = PARAM_SETS[pname]
    job = {"parts": [
        {"kind": "directed", "seed": SEED},
        {"kind": "directed", "seed": SEED + 1, "idle": 0.25, "backpressure": 0.25},
        {"kind": "mix", "seed": SEED, "idle": 0.25, "backpressure": "mix",
         "frames_per_port": mix_frames_per_port(params)},
        {"kind": "payloads", "seed": SEED},
    ]}
    records = run_backend("verilator", params, "cais.sim.suite:suite_job", job, seed=SEED)
    failed = [f"{r['name']} {r['patterns']}: " + "; ".join(r["problems"]) for r in records if r["problems"]]
    assert not failed, f"seed {SEED}:\n" + "\n".join(failed)
    names = [r["name"] for r in records]
    assert any(n.startswith("random_mix") for n in names) and any(n.startswith("all_ports") for n in names)
    frames_out = sum(1 for r in records for entry in r["log"] if entry[0] != "in")
    assert frames_out > 1000, frames_out
    # the all-port payloads reached the build's largest payload and a partial one (1,024 bytes on the jumbo set)
    payload_lens = {proto.CaisHeader.unpack(bytes.fromhex(entry[1])[14:30]).payload_len
                    for r in records if r["name"].startswith("all_ports") for entry in r["log"]
                    if entry[0] != "in" and len(entry[1]) >= 60}   # hex: 30 header bytes
    assert max(payload_lens) == params.max_payload and min(payload_lens) < params.max_payload, sorted(payload_lens)


@pytest.mark.verilator
@pytest.mark.parametrize("pname", FLOAT_SETS)
def test_floats(pname):
    """Float SUM/MAX/MIN bit-exact with the port-order fold whatever the arrival order, for every rule
    (cais.sim.floats)."""
    got = run_backend("verilator", PARAM_SETS[pname], "cais.sim.floats:float_job", {"seed": SEED}, seed=SEED)
    assert set(got) == {"any_order", "reproducible"}
    failed = [f"{test}: {problem}" for test, problems in got.items() for problem in problems]
    assert not failed, f"seed {SEED}:\n" + "\n".join(failed[:20])


@pytest.mark.verilator
@pytest.mark.parametrize("pname", PARAM_SETS)
def test_timing(pname):
    """docs/interface.md's cycle figures on the exported Verilog: result latency (beats + rows + F +
    RESULT_OVERHEAD), a held port never stalls the others mid-frame, BUSY read back to back against
    stamped frame intervals, the forwarding latency during the reset sweep, a SLOT_CLEAR and aging visits
    (cais.sim.timing)."""
    got = run_backend("verilator", PARAM_SETS[pname], "cais.sim.timing:timing_job", {"seed": SEED}, seed=SEED)
    assert set(got) == {"result_latency", "held_port", "busy_register", "forward_states"}
    failed = [f"{test}: {problem}" for test, problems in got.items() for problem in problems]
    assert not failed, f"seed {SEED}:\n" + "\n".join(failed[:20])
