"""Build parameters: what is refused, and the set capacities derived from them (hand-derived here)."""

import pytest

from cais.params import ParamError, SwitchParams
from cais.protocol import DType


@pytest.mark.parametrize("kw, words", [
    ({"ports": 1}, "ports=1: must be between 2 and 16"),
    ({"data_width": 96}, "data_width=96: must be 64, 128, 256 or 512"),
    ({"max_payload": 260}, "max_payload=260: must be a multiple of the beat width (8 bytes)"),
    # 264 bytes = 33 rows of 8 bytes: an odd set would start in the middle of a two-row word
    ({"max_payload": 264}, "max_payload=264: must be a multiple of twice the beat width (16 bytes)"),
    ({"float_units": 1}, "float_units=1: must be True or False"),
    ({"reproducible": "yes"}, "reproducible='yes': must be True or False"),
])
def test_refused_with_the_reason(kw, words):
    with pytest.raises(ParamError) as err:
        SwitchParams(**kw)
    assert str(err.value) == words


def test_set_capacity_hand_derived():
    p = SwitchParams()                        # 4 ports, 8-byte rows, 256-byte sets = 32 rows
    assert p.set_capacity() == 256
    assert p.set_capacity(acc_fp32=True) == 128                       # 16 rows of fp32 accumulators
    assert p.set_capacity(reproducible=True) == 48                    # 32 // (4 areas + acc) = 6 rows
    assert p.set_capacity(acc_fp32=True, reproducible=True) == 40     # 32 // (4 + 2) = 5 rows
    assert SwitchParams(reproducible=False).set_capacity(reproducible=True) == 0
    # 16 ports at 128 bits: 16 rows per set, fewer than the 17 areas
    assert SwitchParams(ports=16, data_width=128).set_capacity(reproducible=True) == 0
    assert SwitchParams(ports=16).set_capacity(reproducible=True) == 8   # 32 // 17 = 1 row


def test_dtypes_follow_float_units():
    assert DType.FP32 in SwitchParams().dtypes
    assert set(SwitchParams(float_units=False).dtypes) == {DType.INT32, DType.INT16, DType.INT8}
