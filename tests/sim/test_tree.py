"""Aggregation trees across reference-model switches: the topology, the controller's translation
(cais.controller.tree), the fabric (cais.sim.links.fabric) and the leaf-spine job (cais.sim.tree).

Expected rules are derived by hand from docs/protocol.md section 13; results are checked by the workload
against numpy (integers) or against the tree's fold written with plain numpy (floats).
"""

import numpy as np
import pytest

from cais import protocol as proto
from cais.controller.tree import TreeBus, TreeError, TreeTopology
from cais.link import run_sync
from cais.params import SwitchParams
from cais.sim.links.fabric import FabricLink
from cais.sim.tree import conservation, run_tree
from cais.tables import MacEntry, Rule, mac_writes, rule_writes

T = TreeTopology(2, 4)


@pytest.mark.parametrize("leaves, per_leaf, message", [
    (1, 4, "leaves=1: a tree has 2 to 16 leaves"),
    (2, 16, "ranks_per_leaf=16: 1 to 15"),
    (3, 6, "3 leaves x 6 ranks = 18 ranks"),
    (2, "4", "ranks_per_leaf='4': must be an integer"),
])
def test_a_tree_that_cannot_be_built_says_why(leaves, per_leaf, message):
    with pytest.raises(TreeError, match=message):
        TreeTopology(leaves, per_leaf)


def test_the_topology():
    assert (T.ranks, T.switches, T.spine, T.uplink_port) == (8, 3, 2, 4)
    assert T.leaf_params == SwitchParams(ports=5, uplink=True) and T.spine_params == SwitchParams(ports=2)
    assert [T.locate(r) for r in (0, 3, 4, 7)] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    assert T.links() == [((0, 4), (2, 0)), ((1, 4), (2, 1))]
    assert T.logical_params.ports == 8 and not T.logical_params.uplink
    # the port towards rank 5 (leaf 1, port 1) from each switch: leaf 0's uplink, leaf 1's port 1, spine port 1
    assert [T.port_towards(i, 5) for i in range(3)] == [4, 1, 1]


@pytest.mark.parametrize("ranks, want", [
    # every rank: both leaves with the uplink action, the spine over both leaves
    (0xFF, [(0b1111, True), (0b1111, True), (0b11, False)]),
    # ranks 1, 2: leaf 0 alone, an ordinary rule there, nothing elsewhere
    (0b0000_0110, [(0b0110, False), None, None]),
    # ranks 3 and 4 straddle the leaves
    (0b0001_1000, [(0b1000, True), (0b0001, True), (0b11, False)]),
    # ranks on leaf 1 only
    (0b1010_0000, [None, (0b1010, False), None]),
])
def test_the_rule_of_each_switch(ranks, want):
    rule = Rule.for_group(9, ranks, base=8, count_log2=2, dtype=proto.DType.FP16, acc_fp32=True)
    got = T.rules_for(rule)
    for r, w in zip(got, want):
        if w is None:
            assert r is None
            continue
        assert (r.contributors, r.results, r.uplink) == (w[0], w[0], w[1])
        assert (r.group, r.base, r.count_log2, r.dtype, r.acc_fp32) == ((9, 0xFF), 8, 2, proto.DType.FP16, True)


def program(fabric, writes):
    async def go():
        for addr, value in writes:
            await fabric.write(addr, value)
    run_sync(go())


def test_the_bus_programs_every_switch():
    fabric = FabricLink(T)
    regs = fabric.bus.regs
    program(fabric, rule_writes(regs, 1, Rule.for_group(9, 0b0001_1000, base=4, count_log2=1)))
    program(fabric, mac_writes(regs, 3, MacEntry(0x02_00_00_00_01_05, 5)))
    program(fabric, [(regs["EPOCH"].address(), 1)])
    leaf0, leaf1, spine = (link.model for link in fabric.links)
    for m, port in ((leaf0, 4), (leaf1, 1), (spine, 1)):
        assert m._macs[3] == (True, 0x02_00_00_00_01_05, port)
        assert m._rules[1].valid and m._rules[1].base == 4 and m._rules[1].count_log2 == 1
    assert (leaf0._rules[1].contributors, leaf0._rules[1].uplink) == (0b1000, True)
    assert (leaf1._rules[1].contributors, leaf1._rules[1].uplink) == (0b0001, True)
    assert (spine._rules[1].contributors, spine._rules[1].uplink) == (0b11, False)
    assert leaf0.uplink_port() == 4 and leaf1.uplink_port() == 4
    # invalidated everywhere
    program(fabric, rule_writes(regs, 1, None, valid=False))
    assert not any(link.model._rules[1].valid for link in fabric.links)


def test_reads_answer_as_one_switch():
    fabric = FabricLink(T)
    regs = fabric.bus.regs

    async def go():
        return {name: await fabric.read(regs[name].address()) for name in ("ID", "NUM_PORTS", "FEATURES", "EPOCH")}
    got = run_sync(go())
    assert got["ID"] == 0x43414953 and got["NUM_PORTS"] == 8 and got["EPOCH"] == 0
    assert regs["FEATURES"].unpack(got["FEATURES"]) == {"float_units": 1, "reproducible": 1, "uplink": 0}
    # a host frame from rank 0 to rank 6 crosses the tree; rank 6's RX and rank 0's TX... counters are its leaf port's
    program(fabric, mac_writes(regs, 0, MacEntry(0x02_00_00_00_01_06, 6)))
    frame = bytes.fromhex("020000000106" "020000000100" "0800") + bytes(50)
    fabric.send(0, frame)
    run_sync(fabric.advance(400))
    assert fabric.take_received() == [(6, frame)]

    async def counters():
        return ([await fabric.read(regs["RX_FRAMES"].address(p)) for p in range(8)],
                [await fabric.read(regs["TX_FRAMES"].address(p)) for p in range(8)],
                await fabric.read(regs["FORWARDED"].address()))
    rx, tx, forwarded = run_sync(counters())
    assert rx == [1, 0, 0, 0, 0, 0, 0, 0] and tx == [0, 0, 0, 0, 0, 0, 1, 0]
    assert forwarded == 3          # once on each switch it crossed
    # EPOCH: the value written while every switch keeps it; 0 once any switch was reset
    program(fabric, [(regs["EPOCH"].address(), 5)])

    async def epoch():
        return await fabric.read(regs["EPOCH"].address())
    assert run_sync(epoch()) == 5
    fabric.links[1].model.write(register_map_of(fabric, 1)["EPOCH"].address(), 0)     # leaf 1 "reset"
    assert run_sync(epoch()) == 0


def test_a_tree_without_the_uplink_action_is_not_used():
    from dataclasses import replace
    t = TreeTopology(2, 2, leaf_params=replace(T.leaf_params, ports=3, uplink=False))
    assert run_sync(TreeBus(t, [_Bus(SwitchParams(ports=3)), _Bus(SwitchParams(ports=3)),
                                _Bus(SwitchParams(ports=2))]).check()) == "leaf 0 has no uplink action (FEATURES.uplink = 0)"
    s = run_tree({"leaves": 2, "ranks_per_leaf": 2, "elements": 300, "seed": 2, "leaf_uplink": False})
    assert s["correct"] and s["routes"] == ["ring"] and not s["tree"]["built"]


def register_map_of(fabric, switch):
    from cais.registers import register_map
    return register_map(fabric.topology.params(switch))


class _Bus:
    def __init__(self, params):
        from cais.sim.refmodel import SwitchModel
        self.model = SwitchModel(params)

    async def read(self, addr):
        return self.model.read(addr)

    async def write(self, addr, value):
        self.model.write(addr, value)


def test_conservation_names_the_switch():
    good = {"CONTRIBUTIONS": 50, "COMPLETED": 10, "PARTIALS_SENT": 10}
    spine = {"CONTRIBUTIONS": 20, "COMPLETED": 10}
    assert conservation(T, [good, good, spine], 10) == []
    assert conservation(T, [good, dict(good, PARTIALS_SENT=11), dict(spine, CONTRIBUTIONS=21)], 10) == [
        "leaf 1: PARTIALS_SENT 11 != 10", "spine: CONTRIBUTIONS 21 != 20"]


FAULTS = {"loss": 0.10, "duplicate": 0.05, "reorder": 0.05}


def fault_run(chunks, seed, **kw):
    s = run_tree({"leaves": 2, "ranks_per_leaf": 4, "elements": 64 * chunks, "seed": seed, **FAULTS, **kw})
    t = s["tree"]
    assert s["routes"] == ["switch native"] and t["built"]
    assert t["chunks"] == chunks and t["conservation"] == [] and t["unwired"] == 0
    assert all(t["hop_faults"][k] for k in ("dropped", "duplicated", "reordered"))
    assert s["correct"]
    return s


def test_faults_on_every_hop_short():
    """8 ranks, 2 leaves, 10% loss + 5% duplication + 5% reordering on every hop: exact, conserved."""
    fault_run(100, seed=4)


@pytest.mark.slow
def test_faults_on_every_hop_1000_chunks():
    s = fault_run(1000, seed=11)
    assert s["faults"]["ingress_dropped"] and s["faults"]["egress_dropped"]


def test_floats_are_the_tree_fold_under_faults():
    """float32 through the tree under faults: bit for bit the fold of each leaf's ranks, then of the leaves
    (the workload's reference, plain numpy); not the flat fold of the 8 ranks."""
    fault_run(40, seed=6, dtype="float32")


def test_leaf_spine_make_sim(capsys):
    from cais.sim.cosim import main
    assert main(["--topology", "leaf-spine", "--leaves", "2", "--ranks-per-leaf", "3", "--elements", "700"]) == 0
    out = capsys.readouterr().out
    assert "result: CORRECT" in out and "holds at every switch" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("leaf-spine ", "one switch", "host ring"))}
    assert len(rows) == 3 and all("CORRECT" in row for row in rows.values())


def test_leaf_spine_runs_on_the_model_or_verilator(capsys):
    from cais.sim.cosim import main, parse_args
    with pytest.raises(SystemExit) as e:
        main(["--topology", "leaf-spine", "--backend", "cocotb"])
    assert e.value.code == 2
    assert "runs on the model or verilator" in capsys.readouterr().err
    args = parse_args(["--topology", "leaf-spine", "--backend", "verilator", "--spine-backend", "model"])[0]
    assert (args.leaf_backend, args.spine_backend) == ("verilator", "model")
    args = parse_args(["--topology", "leaf-spine", "--leaf-backend", "verilator"])[0]
    assert (args.leaf_backend, args.spine_backend) == ("verilator", "model")


def test_an_odd_tree_is_refused_on_the_command_line(capsys):
    from cais.sim.cosim import main
    with pytest.raises(SystemExit):
        main(["--topology", "leaf-spine", "--leaves", "4", "--ranks-per-leaf", "5"])
    assert "4 leaves x 5 ranks = 20 ranks" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--switch", "/tmp/a.sock", "--switch", "/tmp/b.sock"], "--switch given more than once: only with --tree"),
    (["--switch", "/tmp/a.sock", "--tree", "2x4"], "--tree 2x4: needs 3 --switch endpoints"),
    (["--switch", "/tmp/a.sock", "--tree", "two"], "--tree 'two': expected LEAVESxRANKS"),
])
def test_the_controller_service_refuses_a_bad_tree(argv, message, capsys, tmp_path):
    from cais.service import main
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef")
    token.chmod(0o600)
    with pytest.raises(SystemExit) as e:
        main([*argv, "--http", "127.0.0.1:0", "--world-size", "8", "--token-file", str(token)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.verilator
def test_the_rtl_spine_under_faults_on_every_hop():
    """The spine on the Verilated RTL (the default build, buildsets.DEFAULT: a spine needs no uplink
    action), the leaves on the model: the leaves' partials are ordinary contributions to it and its
    results their parents'. 8 ranks, 100 chunks, 10% loss + 5% duplication + 5% reordering on every hop:
    exact, and the RTL's own counters conserved."""
    from buildsets import DEFAULT
    s = fault_run(100, seed=4, spine_backend="verilator")
    assert s["tree"]["spine_backend"] == "verilator"
    spine = s["tree"]["switch_counters"][-1]
    assert spine["DUPLICATES"] and spine["RESULTS_RESENT"]          # the RTL re-served repeated partials
    from cais.sim.tree import topology_of
    assert topology_of({"leaves": 2, "ranks_per_leaf": 4, "spine_backend": "verilator"}).spine_params == DEFAULT


def test_a_rank_cut_off_behind_a_leaf_is_found_by_the_leafs_aging():
    """Rank 5 (leaf 1, port 1) sends nothing for 10 ms, longer than the set age (2 ms): leaf 1 ages its
    sets without it, the tree's queue names rank 5 alone (leaf 0's ranks count present), the controller
    drops it and redoes the all-reduce through the tree without it: the others get the sum of their own
    inputs, rank 5 an error naming the drop."""
    from cais.comm import CollectiveError, World
    from cais.config import Config
    from cais.sim.workload import reference_reduce

    from cais.sim.faults import PortBlackout

    data = [np.arange(64 * 64, dtype=np.int32) * (r + 1) for r in range(8)]
    fabric = FabricLink(T)
    world = World(PortBlackout(fabric, 5, 0.01), config=Config(offload="always", set_age_ms=2.0))

    def fn(comm):
        try:
            return comm.all_reduce(data[comm.rank])
        except CollectiveError as e:
            return str(e)

    results = run_sync(world.run(fn))
    assert "rank 5 was dropped from group 1" in results[5] and "aged sets" in results[5]
    alive = [r for r in range(8) if r != 5]
    for r in alive:
        assert np.array_equal(results[r], reference_reduce([data[i] for i in alive], proto.ReduceOp.SUM))
    assert [d[2] for d in world.controller.dropped] == [5]
    assert all(a["missing"] == [5] for a in world.controller.aged)
    leaf0, leaf1, spine = (link.model.counters() for link in fabric.links)
    assert leaf1["AGED_TOTAL"] >= 1 and spine["AGED_TOTAL"] == 0
