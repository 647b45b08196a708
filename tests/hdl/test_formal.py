"""make formal in the test suite: the decision pipeline's slot-discipline properties proved by induction
(yosys-smtbmc, Yices), and each property failing, from reset, on its deliberately broken variant."""

import pytest

from cais.formal.decision import MUTANTS, PROPERTIES, UPLINK_PROPERTIES
from cais.formal.prove import prove, refute

pytestmark = pytest.mark.formal


def test_every_property_is_proved_by_induction():
    result = prove()
    assert result.ok, f"{result.detail}\n{result.log.read_text()[-3000:]}"
    assert "induction" in result.detail


def test_every_property_has_a_mutant():
    assert sorted(prop for prop, _ in MUTANTS.values()) == sorted(set(PROPERTIES) | set(UPLINK_PROPERTIES))


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_broken_variant_fails_its_property(mutant):
    result = refute(mutant)
    assert result.ok, f"mutant {mutant} ({MUTANTS[mutant][1]}): {result.detail}"
