"""The links of cais.sim.links: their shared pause patterns and contract, and the C++-driven link."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cais import protocol as proto
from cais.link import run_sync
from cais.params import SwitchParams
from cais.registers import register_map
from cais.sim.links.base import LinkError, check_frame, keep_bytes
from cais.sim.links.model import ModelLink
from cais.sim.links.wires import pause_key, paused, splitmix64, threshold
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import host_mac
from cais.tables import Rule, rule_writes, slot_clear_writes

PARAMS = SwitchParams()
REPO = Path(__file__).resolve().parents[2]


def test_splitmix64_matches_the_published_sequence():
    # SplitMix64 from state 0 (Steele, Lea, Flood 2014; the reference generator of xoshiro's authors):
    # the first two outputs are 0xe220a8397b1dcdaf and 0x6e789e6aa1b965f4.
    gamma = 0x9E3779B97F4A7C15
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(gamma) == 0x6E789E6AA1B965F4


def test_pause_rate_follows_the_probability():
    key = pause_key(7, 0, 3)
    for p in (0.0, 0.1, 0.5, 0.9, 1.0):
        limit = threshold(p)
        rate = np.mean([paused(key, limit, c) for c in range(20000)])
        assert abs(rate - p) < 0.015, (p, rate)
    # different ports and streams draw different patterns
    a = [paused(pause_key(7, 0, 0), threshold(0.5), c) for c in range(256)]
    b = [paused(pause_key(7, 0, 1), threshold(0.5), c) for c in range(256)]
    c = [paused(pause_key(7, 1, 0), threshold(0.5), c) for c in range(256)]
    assert a != b and a != c


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="between 0 and 1"):
        threshold(1.5)
    with pytest.raises(ValueError, match="empty frame"):
        check_frame(b"")
    with pytest.raises(ValueError, match="partial last beat"):
        check_frame(bytes(16), 8, bad_keep=True)
    link = ModelLink(PARAMS)
    with pytest.raises(ValueError, match="out of range"):
        link.send(PARAMS.ports, b"x" * 64)
    with pytest.raises(LinkError, match="bad tkeep 0x5"):
        keep_bytes(0b101, 8, True, 2)
    with pytest.raises(LinkError, match="middle beat"):
        keep_bytes(0x7F, 8, False, 0)


def test_driver_and_model_import_without_amaranth_and_cocotb():
    """`pip install .` gives numpy only: the driver, the model and the model link must not need more."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("amaranth", "cocotb", "cocotbext", "cocotb_tools", "find_libpython"):
                    raise ImportError(f"{name} is blocked in this test")
        sys.meta_path.insert(0, Block())
        import cais.comm, cais.controller, cais.allreduce, cais.ring, cais.config, cais.link, cais.registers
        import cais.sim.refmodel, cais.sim.links.model, cais.sim.links.base, cais.sim.workload, cais.sim.faults
        import cais.sim.backends
        from cais.link import run_sync
        from cais.comm import World
        from cais.sim.links.model import ModelLink
        import numpy as np
        def train(comm):
            return comm.all_reduce(np.full(1000, comm.rank + 1, dtype=np.int32))
        results = run_sync(World(ModelLink(), ranks=4).run(train))
        assert all((r == 10).all() for r in results), results
        bad = [m for m in sys.modules if m.split(".")[0] in ("amaranth", "cocotb", "cocotbext")]
        assert not bad, bad
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ------------------------------------------------------------------------------------ the C++-driven link


def _chunk_frames(params, values, group=1, seq=0):
    hdr = proto.CaisHeader(group_id=group, layer_id=3, chunk_id=0, total_chunks=1, seq_num=seq,
                           payload_len=values.shape[1] * 4, red_op=proto.ReduceOp.SUM)
    return [proto.build_frame(hdr, values[p].astype(">i4").tobytes(), src=host_mac(p), pad=True)
            for p in range(params.ports)]


@pytest.mark.verilator
def test_verilator_link_all_reduce_stamps_and_reset():
    from cais.sim.links.verilator import VerilatorLink

    params = PARAMS
    regs = register_map(params)
    everyone = (1 << params.ports) - 1
    writes = slot_clear_writes(regs, 0, 1) + rule_writes(
        regs, 0, Rule.for_group(1, everyone, everyone, base=0, count_log2=0, red_op=proto.ReduceOp.SUM))
    rng = np.random.default_rng(4)
    link = VerilatorLink(params, seed=1)

    async def one_chunk():
        for addr, value in writes:
            await link.write(addr, value)
        values = rng.integers(-2**20, 2**20, (params.ports, 64))
        start = link.cycle
        for p, frame in enumerate(_chunk_frames(params, values)):
            link.send(p, frame)
        assert link.pending
        while await link.read(regs["BUSY"].address()):
            await link.advance(16)
        got = link.take_stamped()
        return start, values, got

    start, values, got = run_sync(one_chunk())
    assert sorted(r.port for r in got) == list(range(params.ports))
    expected = values.sum(axis=0).astype(">i4").tobytes()
    beats = -(-len(got[0].data) // params.beat_bytes)
    for r in got:
        frame = proto.parse_frame(r.data)
        assert frame.cais.flags == proto.Flags.RESULT and frame.payload == expected
        assert r.last - r.first == beats - 1 and r.first > start       # back to back, after the sends
    assert [(r.last, r.port) for r in got] == sorted((r.last, r.port) for r in got)

    # a reset forgets the programmed rule: the same chunk is then dropped, not reduced
    run_sync(link.reset())
    assert link.cycle == 0

    async def unprogrammed():
        for p, frame in enumerate(_chunk_frames(params, values)):
            link.send(p, frame)
        while await link.read(regs["BUSY"].address()):
            await link.advance(16)
        return (link.take_received(), await link.read(regs["RX_FRAMES"].address()),
                await link.read(regs["COMPLETED"].address()))

    received, rx0, completed = run_sync(unprogrammed())
    assert rx0 == 1 and completed == 0 and received == []   # counted from 0 again, nothing reduced
    link.close()


async def _reset_mid_frame(link):
    """A flooded frame held at the egress of port 0 (its sink not ready), then a reset while the switch
    shows the frame's first beat there, the sink ready again: the frames received after the reset."""
    busy = register_map(link.params)["BUSY"].address()

    def flooded(fill):
        return proto.EthHeader(proto.BROADCAST_MAC, host_mac(1), 0x0800).pack() + bytes([fill]) * 100

    link.set_hold(0)
    link.send(1, flooded(0xAA))
    await link.advance(200)                     # long enough for its first beat to wait at port 0
    assert await link.read(busy)                # port 0's copy is still inside
    assert all(r.port != 0 for r in link.take_stamped())
    link.set_hold(0, False)                     # ready in the first cycle of the reset
    await link.reset()
    link.send(1, flooded(0xBB))
    while await link.read(busy):
        await link.advance(16)
    return flooded(0xBB), [(r.port, r.data) for r in link.take_stamped()]


def _check_reset_mid_frame(params, frame, got):
    # the reference model floods the frame to every port but port 1, each copy whole
    expected = sorted(SwitchModel(params).receive(1, frame))
    assert sorted(got) == expected, [(p, len(d)) for p, d in got]


def test_reset_forgets_the_beat_a_sink_took_during_reset_amaranth():
    """The egress shows a beat in the cycle reset rises; a ready sink takes it, the head of a frame the
    reset cuts short. The link forgets it: it does not lead the port's next frame (before, a result frame
    of the regression's payload part gained the mix part's stranded beat).

    The same case again on the simulator the first run left behind (run_amaranth keeps it), after a run
    that ends with a frame held inside and counted: the reused simulator starts from the initial state,
    so the second run is the first, cycle for cycle. A run that fails gives its simulator up."""
    from cais.link import DEFAULT_CLOCK_HZ
    from cais.sim.links import amaranth

    params = SwitchParams(ports=2, data_width=512, slots=16, float_units=False)   # the cheapest to simulate
    rx_frames = register_map(params)["RX_FRAMES"].address(1)                # port 1's

    async def counted(link):
        frame, got = await _reset_mid_frame(link)
        return frame, got, await link.read(rx_frames), link.cycle

    async def leave_a_frame_inside(link):
        link.set_hold(0)
        link.send(1, proto.EthHeader(proto.BROADCAST_MAC, host_mac(1), 0x0800).pack() + bytes(100))
        await link.advance(200)
        return await link.read(rx_frames)

    async def fail(link):
        await link.advance(10)
        raise ZeroDivisionError("the job's own error")

    key = (params, DEFAULT_CLOCK_HZ)
    amaranth._benches.pop(key, None)
    first = amaranth.run_amaranth(params, counted)
    frame, got, rx, _ = first
    _check_reset_mid_frame(params, frame, got)
    assert rx == 1                               # the frame sent after the reset, counted from 0
    bench = amaranth._benches[key]
    assert amaranth.run_amaranth(params, leave_a_frame_inside) == 1
    assert amaranth.run_amaranth(params, counted) == first
    assert amaranth._benches[key] is bench
    with pytest.raises(ZeroDivisionError, match="own error"):
        amaranth.run_amaranth(params, fail)
    assert key not in amaranth._benches


@pytest.mark.verilator
def test_reset_forgets_the_beat_a_sink_took_during_reset_verilator():
    from cais.sim.links.verilator import run_verilator

    frame, got = run_verilator(PARAMS, _reset_mid_frame)
    _check_reset_mid_frame(PARAMS, frame, got)


@pytest.mark.verilator
def test_verilator_link_hands_frames_over_in_batches_and_each_once():
    """Frames sent go to the harness with the next call that runs the clock: until then they are pending,
    and a reset drops them; frames out and ingress stamps are read in place, each exactly once, however
    many advances they waited through."""
    from cais.sim.links.verilator import VerilatorLink

    busy = register_map(PARAMS)["BUSY"].address()
    frame = proto.EthHeader(proto.BROADCAST_MAC, host_mac(1), 0x0800).pack() + bytes(range(100))
    beats = -(-len(frame) // PARAMS.beat_bytes)
    link = VerilatorLink(PARAMS, seed=3)

    async def main():
        link.send(1, frame)
        assert link.pending
        await link.reset()                       # before any advance: the batch is forgotten
        assert not link.pending and link.cycle == 0
        await link.advance(300)
        assert link.take_received() == [] and link.take_sent() == []
        start = link.cycle
        link.send(1, frame)
        link.send(1, frame)
        while await link.read(busy):
            await link.advance(3)                # many calls, nothing taken in between
        return start, link.take_stamped(), link.take_stamped(), link.take_sent(), link.take_sent()

    try:
        start, got, again, sent, sent_again = run_sync(main())
    finally:
        link.close()
    assert again == [] and sent_again == []
    expected = sorted(SwitchModel(PARAMS).receive(1, frame)) * 2          # flooded to every other port, twice
    assert sorted((r.port, r.data) for r in got) == sorted(expected)
    assert all(r.last - r.first == beats - 1 and r.first > start for r in got)
    assert [s.port for s in sent] == [1, 1]
    assert sent[0].first == start and sent[0].last - sent[0].first == beats - 1   # taken at once, back to back
    assert sent[1].first == sent[0].last + 1


def _imports(path):
    """The absolute module names a source file imports (relative imports resolved against its package)."""
    import ast

    roots = {"sw/cais": "cais", "hdl": "cais.hdl", "sim": "cais.sim"}
    rel = path.parent.relative_to(REPO)
    root = next(r for r in roots if rel == Path(r) or Path(r) in rel.parents)
    here = ".".join([roots[root], *rel.relative_to(root).parts])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[:len(here.split(".")) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module)
    return out


@pytest.mark.parametrize("folder, forbidden", [
    ("sw/cais", ("cais.hdl", "cais.sim", "amaranth", "cocotb")),   # the driver: numpy only
    ("hdl", ("cais.sim", "cocotb")),                                # the RTL never reaches into simulation
    ("sim/links", ("cais.tests", "bench")),
])
def test_imports_go_one_way(folder, forbidden):
    bad = [f"{path.relative_to(REPO)} imports {name}"
           for path in sorted((REPO / folder).rglob("*.py")) for name in _imports(path)
           if any(name == f or name.startswith(f + ".") for f in forbidden)]
    assert not bad, bad


class _PlainLink:
    """A SwitchLink with only the original methods (no advance_to_frame), over the model."""

    def __init__(self, inner):
        self.inner, self.params, self.clock_hz = inner, inner.params, inner.clock_hz
        self.advances = 0

    @property
    def cycle(self):
        return self.inner.cycle

    def send(self, port, frame):
        self.inner.send(port, frame)

    def take_received(self):
        return self.inner.take_received()

    async def advance(self, cycles):
        self.advances += 1
        await self.inner.advance(cycles)

    async def read(self, addr):
        return await self.inner.read(addr)

    async def write(self, addr, value):
        await self.inner.write(addr, value)


@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_world_runs_on_a_link_without_advance_to_frame(loss):
    """The world (and a FaultyLink around the link) fall back to advance() in fixed steps."""
    from cais.comm import World
    from cais.config import Config
    from cais.sim.faults import FaultSpec, FaultyLink

    plain = _PlainLink(ModelLink(PARAMS))
    link = FaultyLink(plain, FaultSpec(drop=loss, seed=3)) if loss else plain

    def train(comm):
        return comm.all_reduce(np.arange(3000, dtype=np.int32) * (comm.rank + 1))

    results = run_sync(World(link, ranks=4, config=Config(timeout_ms=0.05, offload="always")).run(train))
    assert all(np.array_equal(r, np.arange(3000, dtype=np.int32) * 10) for r in results)
    assert plain.advances > 0
