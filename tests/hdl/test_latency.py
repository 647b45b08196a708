"""The documented latencies against the blocks' (cais.hdl.latency): every figure docs/interface.md and
docs/core-design.md quote as current (the result formula's constant, the worked examples, the forwarding
latency, the tables of the final tree) is parsed from the text and compared with the composition of the
blocks' latencies. The RTL is measured against the same composition by tests/sim/test_switch_timing.py
(amaranth.sim) and tests/sim/test_switch_verilator.py (the exported Verilog), through cais.sim.timing; the
decision's parts by tests/hdl/test_decision_parts.py."""

import re
from pathlib import Path

import pytest

from cais.hdl import latency
from cais.params import SwitchParams

from buildsets import DEFAULT as P4, WIDE as P2_W512

REPO = Path(__file__).resolve().parents[2]
INTERFACE = (REPO / "docs/interface.md").read_text()
CORE = (REPO / "docs/core-design.md").read_text()

P4_INT = SwitchParams(float_units=False)


def flat(text: str) -> str:
    return " ".join(text.split())


def found(pattern: str, text: str) -> list[tuple[int, ...]]:
    """Every match of ``pattern`` in ``text`` (whitespace folded), its groups as ints; at least one."""
    got = [tuple(int(g) for g in m.groups()) for m in re.finditer(pattern, flat(text))]
    assert got, f"the docs no longer say {pattern!r}: update this test with them"
    return got


def test_hand_derived_sums():
    """The two paths term by term, summed by hand from the registers named in docs/interface.md: forward
    5 (ingress: 3 to the verdict, then 2 for the header queue) + 1 (take) + 3 + 5 (decision) + 1 (lane
    request) + 4 (crossbar: its input register) + 5 (egress port: its input register; the FIFO's write, the
    RAM's read, its output register, the skid) = 24; result 5 + 1 + 8 + 2 (lane start) + 1 (finished) + 2 (job queue: its
    input register, o.valid) + 1 (the credit slice) + 1 (reader start) + 3 (bank read) + 3 (row queue) + 1
    (request) + 3 (fanout) + 5 (the port's input register and result queue), less the first beat and the
    first row (counted in beats and rows) = 34; and the worked examples."""
    assert latency.FORWARD_LATENCY == 24
    assert latency.RESULT_OVERHEAD == 34
    assert latency.result_latency(P4, 256) == 36 + 32 + (4 * 13 + 4) + 34 == 158
    assert latency.result_latency(P4_INT, 256) == 36 + 32 + (4 * 4 + 1) + 34 == 119
    assert latency.result_latency(P2_W512, 4) == 1 + 1 + (2 * 13 + 4) + 34 + 1 == 67


def test_interface_md_quotes_the_derived_figures():
    assert found(r"`beats \+ rows \+ F \+ (\d+)`", INTERFACE) == [(latency.RESULT_OVERHEAD,)]
    assert found(r"`RESULT_OVERHEAD` = (\d+)", INTERFACE) == [(latency.RESULT_OVERHEAD,)]
    assert found(r"(\d+) / (\d+) cycles for a 256-byte payload at 4 x 64 bits", INTERFACE) == \
        [(latency.result_latency(P4, 256), latency.result_latency(P4_INT, 256))]
    assert found(r"(\d+) for a 4-byte payload at 2 x 512 bits", INTERFACE) == [(latency.result_latency(P2_W512, 4),)]
    assert found(r"first beat leaves on each of its ports (\d+) cycles after its last beat", INTERFACE) == \
        [(latency.FORWARD_LATENCY,)]


@pytest.mark.parametrize("pattern, want", [
    # the final tree's figures (the history of the passes quotes older ones: not checked)
    (r"\(`RESULT_OVERHEAD` (\d+), `FORWARD_LATENCY` (\d+)\)", (latency.RESULT_OVERHEAD, latency.FORWARD_LATENCY)),
    (r"result latency (\d+) cycles for a 256-byte payload at 4 x 64 \((\d+) at 8 x 64\)",
     (latency.result_latency(P4, 256), latency.result_latency(SwitchParams(ports=8), 256))),
    (r"\| result latency, 256-byte payload \(unchanged\) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|",
     tuple(latency.result_latency(p, 256) for p in (P4, SwitchParams(ports=8), SwitchParams(ports=3, data_width=128),
                                                     SwitchParams(ports=8, data_width=256)))),
    (r"\| result latency, 256-byte payload, 4 x 64 with float units / integer-only \| [^|]* \| (\d+) / (\d+)",
     (latency.result_latency(P4, 256), latency.result_latency(P4_INT, 256))),
    (r"\| forwarding latency, last beat in to first beat out \| [^|]* \| (\d+)", (latency.FORWARD_LATENCY,)),
])
def test_core_design_md_quotes_the_derived_figures(pattern, want):
    assert set(found(pattern, CORE)) == {want}


def test_core_design_md_latest_pass():
    """The last "Latency after this pass" (the newest pass) states today's figures."""
    last = found(r"Latency after this pass: `RESULT_OVERHEAD` (\d+) \(was \d+\), `FORWARD_LATENCY` (\d+) \(was \d+\): "
                 r"(\d+) / (\d+) cycles for a 256-byte payload at 4 x 64 with / without float units, (\d+) for a "
                 r"4-byte payload at 2 x 512", CORE)[-1]
    assert last == (latency.RESULT_OVERHEAD, latency.FORWARD_LATENCY, latency.result_latency(P4, 256),
                    latency.result_latency(P4_INT, 256), latency.result_latency(P2_W512, 4))
