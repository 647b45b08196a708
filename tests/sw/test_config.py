"""Configuration: defaults, TOML, keyword overrides, and refusal of bad values with a named key."""

import pytest

from cais.config import Config, ConfigError


def test_defaults_of_the_design():
    c = Config()
    assert (c.offload_threshold, c.sram_usage_limit, c.reevaluate_interval_ms) == (0.2, 0.75, 100.0)
    assert c.offload == "auto" and c.chunk_size == 256 and c.timeout_s == pytest.approx(1e-4)


def test_toml_then_keywords(tmp_path):
    path = tmp_path / "cais.toml"
    path.write_text('[cais]\nchunk_size = 128\ntimeout_ms = 0.5\noffload = "always"\n')
    c = Config.load(path, timeout_ms=2.0)
    assert (c.chunk_size, c.timeout_ms, c.offload) == (128, 2.0, "always")


@pytest.mark.parametrize("kw,needle", [
    ({"chunk_size": 6}, "chunk_size=6"),
    ({"chunk_size": "big"}, "chunk_size='big'"),
    ({"offload_threshold": 1.5}, "offload_threshold=1.5"),
    ({"timeout_ms": 0}, "timeout_ms=0"),
    ({"retry_limit": -1}, "retry_limit=-1"),
    ({"sram_usage_limit": 0}, "sram_usage_limit=0"),
    ({"slots_per_group": 12}, "slots_per_group=12"),
    ({"controller_port": 70000}, "controller_port=70000"),
    ({"offload": "sometimes"}, "offload='sometimes'"),
    ({"max_pending_chunks": True}, "max_pending_chunks=True"),
    ({"ring_window": 0}, "ring_window=0: must be at least 1"),
    ({"ring_window": 2.5}, "ring_window=2.5: must be an integer"),
    ({"float_mode": "fast"}, "float_mode='fast': must be \"native\" or \"quantize\""),
    ({"float_mode": 1}, "float_mode=1: must be a string"),
    ({"accumulate": "fp64"}, "accumulate='fp64': must be \"fp32\" or \"wire\""),
    ({"reproducible": 1}, "reproducible=1: must be true or false"),
    ({"reproducible": "yes"}, "reproducible='yes'"),
    ({"saturate": 0}, "saturate=0: must be true or false"),
    ({"set_age_ms": -1}, "set_age_ms=-1: must be 0"),
    ({"set_age_ms": "long"}, "set_age_ms='long': must be a finite number"),
])
def test_bad_values_named(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        Config.load(**kw)


def test_unknown_key_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="unknown configuration key.*chunksize"):
        Config.load(chunksize=4)
    bad = tmp_path / "bad.toml"
    bad.write_text("[cais\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        Config.load(tmp_path / "missing.toml")


def test_numeric_keys(tmp_path):
    c = Config()
    assert (c.float_mode, c.accumulate, c.reproducible, c.saturate) == ("native", "fp32", False, False)
    path = tmp_path / "cais.toml"
    path.write_text('[cais]\nfloat_mode = "quantize"\naccumulate = "wire"\nreproducible = true\n')
    c = Config.load(path, saturate=True)
    assert (c.float_mode, c.accumulate, c.reproducible, c.saturate) == ("quantize", "wire", True, True)
