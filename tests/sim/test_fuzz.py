"""The fuzz on the fast Verilator link against the reference model (a short run; make fuzz: 100,000
frames): every batch's frames and every counter equal the model's, the run covers every outcome, and a
seed reproduces its run exactly."""

import pytest

from cais.registers import COUNTER_EVENTS
from cais.sim.fuzz import QUICK_FRAMES, run_fuzz

pytestmark = pytest.mark.verilator


def test_quick_fuzz_matches_the_model_and_covers_every_outcome():
    res = run_fuzz(QUICK_FRAMES, seed=0)
    assert res.ok, "\n".join(res.problems[:20])
    assert res.frames >= QUICK_FRAMES
    # Not vacuous: every counter of the core moved (each drop reason, forwarded, contributions, repeats,
    # completions, resends), and results came back.
    never = [name for name, _ in COUNTER_EVENTS
             if not res.outcomes.get(name) and name != "DROP_PAYLOAD_TOO_LONG"]   # (never counted, protocol.py)
    assert never == [], f"the fuzz never produced {never}"
    assert res.outcomes["RX_TOTAL"] > 0
    assert res.aging_batches > 0          # the aging scanner ran during traffic (and aged nothing)


def test_a_seed_reproduces_its_run():
    a, b = run_fuzz(600, seed=5), run_fuzz(600, seed=5)
    assert a.ok and b.ok
    assert (a.frames, a.batches, a.cycles, a.outcomes) == (b.frames, b.batches, b.cycles, b.outcomes)
    c = run_fuzz(600, seed=6)
    assert (c.cycles, c.outcomes) != (a.cycles, a.outcomes)


def test_the_fuzz_sees_a_switch_that_differs_from_the_model(monkeypatch):
    """The same run scored against a model with one bug each (a result's last byte, a repeat not counted):
    the switch now differs from it, and the fuzz must say where."""
    import cais.sim.fuzz as fuzz_mod
    from cais.sim.refmodel import SwitchModel

    class WrongResult(SwitchModel):
        def _result_frame(self, *args):
            frame = super()._result_frame(*args)
            return frame[:-1] + bytes([frame[-1] ^ 1])

    class UncountedRepeat(SwitchModel):
        def _count(self, name, index=0, amount=1):
            if name != "DUPLICATES":
                super()._count(name, index, amount)

    for model, needle in ((WrongResult, "missing"), (UncountedRepeat, "counter DUPLICATES")):
        monkeypatch.setattr(fuzz_mod, "SwitchModel", model)
        res = run_fuzz(600, seed=2)
        assert not res.ok and any(needle in p for p in res.problems), res.problems[:5]
