"""Build parameters: what is refused, and the set capacities derived from them (hand-derived here)."""

import pytest

from cais.params import ParamError, SwitchParams
from cais.protocol import DType


@pytest.mark.parametrize("kw, words", [
    ({"ports": 1}, "ports=1: must be between 2 and 16"),
    ({"data_width": 96}, "data_width=96: must be 64, 128, 256 or 512"),
    ({"max_payload": 260}, "max_payload=260: must be a multiple of the beat width (8 bytes)"),
    ({"float_units": 1}, "float_units=1: must be True or False"),
])
def test_refused_with_the_reason(kw, words):
    with pytest.raises(ParamError) as err:
        SwitchParams(**kw)
    assert str(err.value) == words


def test_set_capacity_is_max_payload_for_every_kind():
    """Each port's contribution has a bank of max_payload bytes: no kind of rule holds less."""
    for params in (SwitchParams(), SwitchParams(ports=16, data_width=128), SwitchParams(max_payload=264)):
        for acc_fp32 in (False, True):
            for reproducible in (False, True):
                assert params.set_capacity(acc_fp32, reproducible) == params.max_payload
    assert SwitchParams(max_payload=264).rows_per_set == 33        # an odd number of rows is fine


def test_dtypes_follow_float_units():
    assert DType.FP32 in SwitchParams().dtypes
    assert set(SwitchParams(float_units=False).dtypes) == {DType.INT32, DType.INT16, DType.INT8}


def test_slug_names_the_fields_that_differ_from_the_defaults():
    """Build folders are named by the slug: only the non-default fields, booleans as words."""
    assert SwitchParams().slug() == "default"
    assert SwitchParams(ports=2, data_width=512).slug() == "ports2_data_width512"
    assert SwitchParams(float_units=False).slug() == "no_float_units"
    assert SwitchParams(ports=8, float_units=False).slug() == "ports8_no_float_units"
