"""Faults at scale (8 ranks, 1,000 chunks, 10% loss + 5% duplication + 5% reordering on every port) and a
switch reset in the middle of a collective; make faults runs both on the Verilated switch."""

import pytest

from cais.controller import Controller
from cais.params import SwitchParams
from cais.sim.backends import run_backend
from cais.sim.scale import check_reset, check_scale

SCALE = {"ranks": 8, "chunks": 1000, "loss": 0.10, "duplicate": 0.05, "reorder": 0.05, "seed": 7}
RESET = {"ranks": 4, "chunks": 120, "at": 0.5, "seed": 3}


@pytest.mark.slow
def test_faults_at_scale_exact_and_no_double_count_on_the_model():
    s = run_backend("model", SwitchParams(ports=8), "cais.sim.scale:scale_job", SCALE)
    assert check_scale(s) == [], s
    assert s["counters"]["DUPLICATES"] > 1000 and s["faults"]["ingress_dropped"] > 1000


@pytest.mark.parametrize("backend", ["model", pytest.param("verilator", marks=pytest.mark.verilator)])
def test_a_reset_mid_collective_is_repaired_by_the_controller(backend):
    s = run_backend(backend, SwitchParams(ports=4), "cais.sim.scale:reset_job", RESET)
    assert check_reset(s) == [], s
    assert 0 < s["reset_at"] < s["cycles"]
    assert any("reset noticed" in e for e in s["events"])


def test_without_the_epoch_check_the_reset_is_not_repaired(monkeypatch):
    """The same run with the controller blind to the reset: the rules are gone, the chunks after the reset
    are dropped (NO_RULE) and the ranks fall back to the host ring; check_reset says so."""
    async def blind(self, now, epoch=None):
        return False
    monkeypatch.setattr(Controller, "check_reset", blind)
    s = run_backend("model", SwitchParams(ports=4), "cais.sim.scale:reset_job", dict(RESET, retry_limit=4))
    assert s["exact"]                      # the host ring still gets it right ...
    problems = check_reset(s)
    assert any("paths" in p for p in problems) and any("noticed 0" in p for p in problems), problems
