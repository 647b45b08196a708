"""The test tiers: which tests ``make test-fast``, ``make test`` and ``make test-extended`` run.

- A sweep (every stage count, every lane type and operator, every seed) keeps a few cases in ``make
  test-fast`` and ``make test``, chosen to cover each axis once, and gives the others the ``extended`` mark.
- The extended tier (those sweep cases, :data:`EXTENDED`, :data:`buildsets.EXTENDED_BUILDS`, the ``pnr``
  mark) holds what costs minutes of build, proof or repetition for a size, a case or a tool ``make test``
  already covers in a cheaper form: the switch builds beyond the default one (16 ports, wide jumbo beats, the
  tree's uplink leaf, the board top), the induction proofs, place and route, the sweeps' further cases.
  ``make test`` leaves it out to stay under ten minutes on two cores; CI runs ``make test`` and then ``make
  test-extended`` (.ci/run), so every test still runs on every change.
"""

from __future__ import annotations

from typing import Callable, Iterable

import pytest

__all__ = ["sweep", "EXTENDED", "is_extended", "stale_prefixes"]


def sweep(cases: Iterable, fast: Callable[..., bool], ids: Callable | None = None) -> list:
    """``cases`` (tuples of a parametrize's arguments, or single values) as ``pytest.param``s, each marked
    extended unless ``fast(*case)``; ``ids(*case)`` names a case (default: pytest's own ids)."""
    params = []
    for case in cases:
        args = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param(*args, marks=() if fast(*args) else (pytest.mark.extended,),
                                   id=ids(*args) if ids else None))
    return params


#: Node id prefixes of the extended tier, each with what ``make test`` runs in its place.
EXTENDED = {
    # make formal; make test checks the decision it proves against the reference model (tests/hdl/test_decision*.py)
    "tests/hdl/test_formal.py": "the induction proofs and their broken variants",
    # the tree on the model and the RTL spine on the default build stay (tests/sim/test_tree.py)
    "tests/sim/test_tree_rtl.py": "the uplink leaf's build (SwitchParams(uplink=True))",
    "tests/system/test_cluster.py::test_leaf_spine_cluster_on_the_verilated_rtl": "the uplink leaf's build",
    # the board's MAC, CDC and UART bridge stay under amaranth.sim and in tb/uart
    "tests/sim/test_board_sim.py": "the board top's build (RGMII, the MAC, the UART bridge around the switch)",
    # the whole switch under amaranth.sim at 4 x 64 stays (and the wide beats on the model, tests/sim/test_traffic.py)
    "tests/sim/test_switch_sim.py::test_directed_float_units[p2_w512-": "the 2 x 512 switch (16 fp32 lanes a beat)",
    "tests/sim/test_switch_sim.py::test_random_mix_with_idle_and_backpressure[p2_w512": "the 2 x 512 switch",
    # test_faults_on_every_hop_short stays
    "tests/sim/test_tree.py::test_faults_on_every_hop_1000_chunks": "the tree's fault run at 1,000 chunks",
    # the cycle identity of the two links on a lossy all-reduce stays (tests/sim/test_cosim.py), and the cocotb
    # link against the model under idle and back-pressure (tests/sim/test_backends.py)
    "tests/sim/test_link_identity.py": "every directed case and a mix on the cocotb link (a minute of cocotb)",
    # the float ALU testbench at 64 bits stays
    "tests/sim/test_tb.py::test_testbench[alu-int_p4_w128]": "a second ALU build (integer, 128-bit beats)",
}


def is_extended(item, extended_builds: dict) -> bool:
    """Whether a collected test belongs to the extended tier: its node id is under :data:`EXTENDED`, it places
    and routes (``pnr``), or a parameter of its case names one of ``extended_builds`` (build name ->
    SwitchParams; the build sets' tests parametrize with the names)."""
    if item.nodeid.startswith(tuple(EXTENDED)) or item.get_closest_marker("pnr"):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(isinstance(v, str) and v in extended_builds
                                        for v in callspec.params.values())


def stale_prefixes(items) -> list[str]:
    """The prefixes of :data:`EXTENDED` that match no test of a file that was collected: a renamed test or case
    would otherwise leave the extended tier silently and put its minutes back into ``make test``."""
    files = {item.nodeid.split("::")[0] for item in items}
    return [prefix for prefix in EXTENDED if prefix.split("::")[0] in files
            and not any(item.nodeid.startswith(prefix) for item in items)]
