"""Build parameters: what is refused, and what a set holds (hand-derived here)."""

import pytest

from cais.params import ParamError, SwitchParams
from cais.protocol import CaisHeader, DType, build_frame
from cais.registers import register_map
from cais.sim.refmodel import SwitchModel
from cais.tables import Rule, rule_writes


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


@pytest.mark.parametrize("dtype, acc_fp32", [(DType.INT32, False), (DType.FP16, True), (DType.BF16, False)])
def test_every_kind_of_rule_takes_max_payload_and_no_more(dtype, acc_fp32):
    """A set holds max_payload bytes whatever the rule's kind (docs/numerics.md section 9: acc_fp32 costs no
    room): the reference model takes a max_payload contribution and drops one beat more as BAD_PAYLOAD_LEN."""
    params = SwitchParams(ports=2, max_payload=264)           # an odd number of 8-byte rows (33)
    model = SwitchModel(params)
    for addr, value in rule_writes(register_map(params), 0, Rule.for_group(
            1, contributors=0b11, results=0b11, base=0, count_log2=1, dtype=dtype, acc_fp32=acc_fp32)):
        model.write(addr, value)
    for seq, length in enumerate((264, 264 + 8)):
        hdr = CaisHeader(group_id=1, seq_num=seq, payload_len=length, dtype=dtype)
        model.receive(0, build_frame(hdr, bytes(length)))
    counters = model.counters()
    assert (counters["CONTRIBUTIONS"], counters["DROP_BAD_PAYLOAD_LEN"]) == (1, 1)


def test_dtypes_follow_float_units():
    assert DType.FP32 in SwitchParams().dtypes
    assert set(SwitchParams(float_units=False).dtypes) == {DType.INT32, DType.INT16, DType.INT8}


def test_slug_names_the_fields_that_differ_from_the_defaults():
    """Build folders are named by the slug: only the non-default fields, booleans as words."""
    assert SwitchParams().slug() == "default"
    assert SwitchParams(ports=2, data_width=512).slug() == "ports2_data_width512"
    assert SwitchParams(float_units=False).slug() == "no_float_units"
    assert SwitchParams(ports=8, float_units=False).slug() == "ports8_no_float_units"
