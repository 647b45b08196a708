"""The jumbo build (``cais.params.JUMBO``, ``make sim ARGS="--jumbo"``): 1,024-byte payloads.

Its reason: at the default 256-byte payload a rank sends 1.095 times the all-reduce limit N/(2(N-1)) of
a ring's bytes (30 header bytes on every 256); with 1,024-byte chunks it must be within 3% of it. The
byte counts are derived here by hand (frames of 30 + 1024 bytes; the ring's 2(N-1) blocks in frames of
at most 1484 payload bytes), not taken from the code under test. The model runs are cheap; the RTL one
runs on the wide regression's build, a jumbo switch (tests/buildsets.py ``WIDE_JUMBO``), whose directed
cases, all-port random payloads and timing checks the regression runs (tests/sim/test_switch_verilator.py).
"""

from __future__ import annotations

import pytest

from cais.params import JUMBO, SwitchParams
from cais.sim.backends import run_backend

from buildsets import WIDE_JUMBO

ENTRY = "cais.sim.workload:all_reduce_job"
HEADERS = 30            # Ethernet 14 + CAIS 16 bytes, docs/protocol.md
RING_MTU_PAYLOAD = 1484  # the ring's frames: 1514 bytes with its 30 header bytes


def ring_bytes(nbytes: int, ranks: int) -> int:
    block = -(-nbytes // ranks)
    return 2 * (ranks - 1) * (block + -(-block // RING_MTU_PAYLOAD) * HEADERS)


def test_the_jumbo_build():
    p, default = SwitchParams(**JUMBO), SwitchParams()
    assert p.max_payload >= 1024 and HEADERS + p.max_payload <= p.max_frame
    assert p.slots * 2 * p.max_payload == default.slots * 2 * default.max_payload   # the banks' bytes
    assert p.rows_per_set == 1024 // 8
    assert p.result_frame_beats == -(-(HEADERS + 1024) // 8)
    assert p.result_queue_depth >= 2 * p.result_frame_beats
    assert p.slot_len_bits >= (1024).bit_length()
    assert SwitchParams() == default == SwitchParams(max_payload=256, slots=64)   # the default is unchanged


def test_make_sim_jumbo_arguments(tmp_path, capsys):
    from cais.sim.cosim import parse_args

    _, params, config = parse_args(["--jumbo"])
    assert params == SwitchParams(ports=4, max_payload=1024, slots=16) and config.chunk_size == 1024
    _, params, config = parse_args(["--jumbo", "--ranks", "8"])
    assert params.ports == 8 and params.max_payload == 1024
    _, params, config = parse_args([])
    assert params == SwitchParams() and config.chunk_size == 256
    toml = tmp_path / "cais.toml"
    toml.write_text("[cais]\nchunk_size = 512\n")
    assert parse_args(["--jumbo", "--config", str(toml)])[2].chunk_size == 512
    toml.write_text("[cais]\nchunk_size = 2048\n")
    with pytest.raises(SystemExit) as e:
        parse_args(["--jumbo", "--config", str(toml)])
    assert e.value.code == 2 and "chunk_size=2048 exceeds the switch's max payload 1024" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        parse_args(["--jumbo", "--topology", "leaf-spine"])
    assert e.value.code == 2 and "--jumbo" in capsys.readouterr().err


def _all_reduce(kind: str, params: SwitchParams, ranks: int, elements: int, chunk: int) -> dict:
    return run_backend(kind, params, ENTRY, {"ranks": ranks, "elements": elements, "op": "sum", "seed": 2,
                                             "config": {"chunk_size": chunk, "offload": "always"}})


@pytest.mark.parametrize("ranks", [4, 8])
def test_jumbo_all_reduce_within_three_percent_of_the_limit(ranks):
    elements = 16384                      # 64 KiB per rank
    limit = ranks / (2 * (ranks - 1))
    ring = ring_bytes(4 * elements, ranks)
    s = _all_reduce("model", SwitchParams(ports=ranks, **JUMBO), ranks, elements, 1024)
    assert s["correct"] and s["paths"] == ["switch"]
    assert s["ring_bytes_per_rank"] == ring
    assert s["bytes_sent"] == [4 * elements // 1024 * (HEADERS + 1024)] * ranks    # 64 frames, none resent
    assert max(s["bytes_sent"]) / ring <= 1.03 * limit
    # the default payload does not meet the bound: the test can tell the builds apart
    d = _all_reduce("model", SwitchParams(ports=ranks), ranks, elements, 256)
    assert d["correct"] and d["bytes_sent"] == [4 * elements // 256 * (HEADERS + 256)] * ranks
    assert max(d["bytes_sent"]) / ring > 1.08 * limit


def test_make_sim_jumbo_on_the_model(capsys):
    from cais.sim.cosim import main

    assert main(["--jumbo", "--backend", "model", "--elements", "20000", "--offload", "always"]) == 0
    out = capsys.readouterr().out
    assert "result: CORRECT" in out and "max_payload 1024 bytes" in out
    # 80,000 bytes: 78 chunks of 1024 and one of 128 bytes
    assert f"{78 * (HEADERS + 1024) + HEADERS + 128:>11}" in out


@pytest.mark.verilator
@pytest.mark.extended                      # the wide jumbo build (buildsets.EXTENDED_BUILDS)
def test_jumbo_rtl():
    """The Verilated jumbo switch (the wide regression's build, tests/buildsets.py; the regression runs its
    directed cases and all-port random payloads up to 1,024 bytes, and its timing job the result latency
    and BUSY): an all-reduce on the byte bound."""
    assert WIDE_JUMBO.max_payload == 1024 and WIDE_JUMBO.ports == 2
    s = _all_reduce("verilator", WIDE_JUMBO, 2, 16384, 1024)
    assert s["correct"] and s["bytes_sent"] == [64 * (HEADERS + 1024)] * 2
    assert max(s["bytes_sent"]) / s["ring_bytes_per_rank"] <= 1.03 * 1.0
