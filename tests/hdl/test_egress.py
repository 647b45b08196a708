"""EgressCrossbar under amaranth.sim, against the rules of docs/interface.md written out here.

Random sources offer whole frames with random port masks and lengths as the lanes and the result generator
do: a source asks (``req``) once its current frame's last beat is at most one cycle away, holds the request
until its grant is shown and then sends the frame's beats back to back from the next cycle on; the egress
FIFOs are drained at random (``freed``). Checked from the outside: every frame reaches exactly the ports of
its mask, whole, in order and without another frame's beats in between; a frame is granted only when each
of its ports has room for all of it besides the frames granted there and not yet written, and no FIFO
overflows; nothing is lost or duplicated; every request is granted within a bound (a multicast frame is not
starved by unicast ones); two sources that do not share a port are served in the same cycles; and a port
wanted by two sources takes a beat in every cycle, frame after frame.
"""

import random

import pytest

from cais.hdl.egress.ports import EgressCrossbar

from blocksim import run
from tiers import sweep

W = 64
#: docs/interface.md: a frame shown granted in cycle g has its first beat on the crossbar's output in g + 3
#: (its source's beat in g + 1, the input register, the output register): restated here
CROSSBAR_FIRST_BEAT = 3


def frames_for(rng, sources, ports, count, multicast):
    out = []
    for s in range(sources):
        frames = []
        for k in range(count):
            if multicast and rng.random() < 0.4:
                mask = rng.randrange(1, 1 << ports)
            else:
                mask = 1 << rng.randrange(ports)
            beats = rng.choice([1, 2, 5, rng.randint(1, 12)])
            frames.append((mask, [(s << 48) | (k << 16) | b for b in range(beats)]))
        out.append(frames)
    return out


def simulate(sources, ports, depth, frames, *, seed=0, drain_rate=0.7, idle=0.0):
    """Run the crossbar; return the beats each port received, in order, with their cycles, and the grant
    cycles. A source waits a random cycle before asking with probability ``idle``."""
    rng = random.Random(seed)
    dut = EgressCrossbar(sources, ports, W, max_beats=16, depth=depth)
    got = [[] for _ in range(ports)]
    grants = []
    problems = []

    async def tb(ctx):
        level = [0] * ports                    # the egress FIFOs, drained at random
        owed = [0] * ports                     # beats granted to each port and not yet written
        nxt = [0] * sources                    # next frame of each source
        sending = [None] * sources             # (frame index, beat index) once started
        asking = [False] * sources
        waited = [0] * sources
        for cycle in range(4000):
            for s in range(sources):
                if sending[s] is not None:
                    k, b = sending[s]
                    data = frames[s][k][1]
                    ctx.set(dut.sources[s].valid, 1)
                    ctx.set(dut.sources[s].data, data[b])
                    ctx.set(dut.sources[s].last, b == len(data) - 1)
                    ctx.set(dut.sources[s].keep, 0xFF)
                else:
                    ctx.set(dut.sources[s].valid, 0)
                # a source asks for its next frame once its current one's last beat is at most one cycle
                # away (so it can start two cycles on), and holds the request until its grant is shown
                left = 0 if sending[s] is None else len(frames[s][sending[s][0]][1]) - sending[s][1]
                if not asking[s] and nxt[s] < len(frames[s]) and left <= 2 and rng.random() >= idle:
                    asking[s] = True
                mask, beats = frames[s][nxt[s]] if asking[s] else (rng.getrandbits(ports), [0] * rng.randint(1, 16))
                ctx.set(dut.sources[s].req, asking[s])
                ctx.set(dut.sources[s].mask, mask)
                ctx.set(dut.sources[s].beats, len(beats))
            drains = [level[p] > 0 and rng.random() < drain_rate for p in range(ports)]
            for p in range(ports):
                ctx.set(dut.freed[p], drains[p])
            await ctx.delay(1e-9)
            grant = sum(ctx.get(dut.sources[s].grant) << s for s in range(sources))
            w_en = [ctx.get(dut.egress[p].valid) for p in range(ports)]
            w_data = [ctx.get(dut.egress[p].payload.data) for p in range(ports)]
            for p in range(ports):
                if w_en[p]:
                    got[p].append((cycle, w_data[p]))
                    owed[p] -= 1
                level[p] += w_en[p] - drains[p]
                if level[p] > depth:
                    problems.append(f"cycle {cycle}: egress {p} overflowed")
            for s in range(sources):
                if grant >> s & 1:
                    if not asking[s]:
                        problems.append(f"cycle {cycle}: source {s} granted without a request")
                        return
                    mask, beats = frames[s][nxt[s]]
                    for p in range(ports):
                        if mask >> p & 1:
                            if depth - level[p] - owed[p] < len(beats):
                                problems.append(f"cycle {cycle}: source {s} granted port {p} without room")
                            owed[p] += len(beats)
                    grants.append((cycle, s, mask))
                    waited[s] = 0
            for s in range(sources):
                if sending[s] is not None:
                    k, b = sending[s]
                    sending[s] = None if b == len(frames[s][k][1]) - 1 else (k, b + 1)
                if grant >> s & 1:
                    if sending[s] is not None:
                        problems.append(f"cycle {cycle}: source {s} granted before its frame ends")
                    sending[s] = (nxt[s], 0)
                    nxt[s] += 1
                    asking[s] = False
                elif nxt[s] < len(frames[s]):
                    waited[s] += 1
                    if waited[s] > 400:
                        problems.append(f"source {s} starved at cycle {cycle}")
                        return
            await ctx.tick()
            if all(n == len(f) for n, f in zip(nxt, frames)) and all(x is None for x in sending) \
                    and not ctx.get(dut.busy):
                break

    run(dut, tb)
    return got, grants, problems


@pytest.mark.slow
@pytest.mark.parametrize("sources, ports, multicast", [(5, 4, True), (3, 2, True), (9, 8, False), (9, 8, True)])
def test_frames_arrive_whole_on_their_ports(sources, ports, multicast):
    rng = random.Random(sources * 10 + ports + multicast)
    frames = frames_for(rng, sources, ports, 25, multicast)
    got, grants, problems = simulate(sources, ports, 16, frames, seed=sources + ports, idle=0.3)
    assert not problems, problems[:5]
    for p in range(ports):
        # the frames of port p, in the order they were granted, each whole
        expected = []
        done = [0] * sources
        for _, s, mask in grants:
            k = done[s]
            done[s] += 1
            if mask >> p & 1:
                expected += frames[s][k][1]
        assert [d for _, d in got[p]] == expected, f"port {p}"
    assert sorted(s for _, s, _ in grants) == sorted(s for s in range(sources) for _ in frames[s])


def test_disjoint_sources_share_cycles():
    """Four unicast streams to four different ports: every port takes one beat per cycle, all at once,
    frame after frame without a gap (the next frame is granted during the previous one)."""
    frames = [[(1 << ((s + 1) % 4), list(range(8))) for _ in range(10)] for s in range(4)]
    got, grants, problems = simulate(4, 4, 64, frames, drain_rate=1.0)
    assert not problems
    assert all(len(got[p]) == 80 for p in range(4))
    for s in range(4):
        cycles = [c for c, t, _ in grants if t == s]
        assert cycles == [cycles[0] + 8 * k for k in range(10)], (s, cycles)
    first = grants[0][0]
    for p in range(4):
        assert [c for c, _ in got[p]] == list(range(first + CROSSBAR_FIRST_BEAT, first + CROSSBAR_FIRST_BEAT + 80)), \
            f"port {p}: a gap"
    assert EgressCrossbar.latency == CROSSBAR_FIRST_BEAT + 1       # counted from the request, a cycle before g


@pytest.mark.parametrize("beats", [2, 3, 7])
def test_one_port_two_sources_back_to_back(beats):
    """Two sources (and an idle third) always asking for the same port: it takes a beat in every cycle
    from the first to the last, the sources alternating frame by frame (a waiting request keeps the
    head of the order), and a multicast source gets its turn too."""
    frames = [[(0b01, [(s << 48) | (k << 16) | b for b in range(beats)]) for k in range(12)] for s in range(2)]
    frames.append([(0b11, [(2 << 48) | b for b in range(beats)])])
    got, grants, problems = simulate(3, 2, 64, frames, drain_rate=1.0)
    assert not problems
    cycles = [c for c, _ in got[0]]
    assert cycles == list(range(cycles[0], cycles[0] + 25 * beats)), "port 0: a gap between frames"
    order = [s for _, s, _ in grants]
    assert 2 in order[:4], f"multicast frame granted late: {order}"


def test_first_request_counts_a_short_frame_granted_just_before():
    """Hand-derived: an egress FIFO of 18 beats, max_beats 16, nothing drained. Source 0 asks for 1 beat,
    source 1 for 2 from the cycle source 0's grant is shown, source 2 for 16 from the cycle after source 1's
    grant is shown, when the port is free again (source 1's frame has 2 beats) and source 2's request is in
    its first cycle (the registered credit check's room for a longest frame, counting the 2 beats shown
    granted in the cycle before). 1 + 2 + 16 = 19 > 18: source 2 is not granted until a beat is freed,
    then it is."""
    dut = EgressCrossbar(3, 1, W, max_beats=16, depth=18)
    shown = {}

    async def tb(ctx):
        asks = {0: 0, 1: None, 2: None}          # the cycle each source starts asking
        for cycle in range(40):
            for s, beats in ((0, 1), (1, 2), (2, 16)):
                asking = asks[s] is not None and asks[s] <= cycle and s not in shown
                ctx.set(dut.sources[s].req, asking)
                ctx.set(dut.sources[s].mask, 1)
                ctx.set(dut.sources[s].beats, beats)
            ctx.set(dut.freed[0], cycle == 30)
            await ctx.delay(1e-9)
            for s in range(3):
                if ctx.get(dut.sources[s].grant) and s not in shown:
                    shown[s] = cycle
                    if s == 0:
                        asks[1] = cycle
                    elif s == 1:
                        asks[2] = cycle + 1
            await ctx.tick()

    run(dut, tb)
    assert set(shown) == {0, 1, 2} and shown[0] < shown[1] < shown[2], shown
    assert shown[2] > 30, f"source 2 granted in cycle {shown[2]}, before the beat freed in cycle 30: {shown}"


def test_one_beat_frames():
    """One-beat frames of one source to one port: one cycle between them (the only bubble of the
    schedule, the port's next grant waits one cycle for its credit)."""
    frames = [[(0b1, [k]) for k in range(10)]]
    got, grants, problems = simulate(1, 1, 64, frames, drain_rate=1.0)
    assert not problems
    cycles = [c for c, _ in got[0]]
    assert cycles == list(range(cycles[0], cycles[0] + 20, 2))


# ----------------------------------------------------------------------------- result fanout
# docs/core-design.md section 5: a result frame is granted when every result queue of its mask has room for
# all of it (credits: the queue's depth, less the beats granted, plus the beats read out), and its beats are
# written into all those queues at once, back to back, through one register.

from amaranth.hdl import Module, Elaboratable                                     # noqa: E402

from cais.hdl.egress.ports import EgressMerge, ResultFanout                             # noqa: E402
from cais.hdl.common.frame_fifo import FrameFifo                                         # noqa: E402


def simulate_fanout(ports, depth, frames, *, seed=0, drain=None, cycles=6000):
    """Run a ResultFanout fed by one source that behaves as the result generator does (asks once its current
    frame's last beat is at most one cycle away, holds the request until its grant is shown, then sends
    back to back); the queues are drained with probability ``drain[p]`` per cycle. Returns the beats each
    queue received with their cycles, the grant cycles and the problems seen."""
    rng = random.Random(seed)
    drain = drain or [0.6] * ports
    dut = ResultFanout(ports, W, max_beats=16, depth=depth)
    got = [[] for _ in range(ports)]
    grants, problems = [], []

    async def tb(ctx):
        src = dut.source
        level, owed = [0] * ports, [0] * ports
        nxt, sending, asking = 0, None, False
        for cycle in range(cycles):
            if sending is not None:
                k, b = sending
                ctx.set(src.valid, 1)
                ctx.set(src.data, frames[k][1][b])
                ctx.set(src.last, b == len(frames[k][1]) - 1)
                ctx.set(src.keep, 0xFF)
            else:
                ctx.set(src.valid, 0)
            left = 0 if sending is None else len(frames[sending[0]][1]) - sending[1]
            if not asking and nxt < len(frames) and left <= 2:
                asking = True
            mask, beats = frames[nxt] if asking else (rng.getrandbits(ports), [0] * rng.randint(1, 16))
            ctx.set(src.req, asking)
            ctx.set(src.mask, mask)
            ctx.set(src.beats, len(beats))
            drains = [level[p] > 0 and rng.random() < drain[p] for p in range(ports)]
            for p in range(ports):
                ctx.set(dut.freed[p], drains[p])
            await ctx.delay(1e-9)
            grant = ctx.get(src.grant)
            for p in range(ports):
                if ctx.get(dut.queues[p].valid):
                    got[p].append((cycle, ctx.get(dut.queues[p].payload.data), ctx.get(dut.queues[p].payload.last)))
                    owed[p] -= 1
                    level[p] += 1
                level[p] -= drains[p]
                if level[p] > depth:
                    problems.append(f"cycle {cycle}: queue {p} overflowed")
            if grant:
                if not asking:
                    problems.append(f"cycle {cycle}: granted without a request")
                    return
                mask, beats = frames[nxt]
                for p in range(ports):
                    if mask >> p & 1:
                        if depth - level[p] - owed[p] < len(beats):
                            problems.append(f"cycle {cycle}: granted port {p} without room")
                        owed[p] += len(beats)
                grants.append(cycle)
            if sending is not None:
                k, b = sending
                sending = None if b == len(frames[k][1]) - 1 else (k, b + 1)
            if grant:
                if sending is not None:
                    problems.append(f"cycle {cycle}: granted before the frame ends")
                sending, nxt, asking = (nxt, 0), nxt + 1, False
            await ctx.tick()
            if nxt == len(frames) and sending is None and not ctx.get(dut.busy):
                return
        problems.append("did not finish")

    run(dut, tb)
    return got, grants, problems


def check_fanout(ports, frames, got):
    """Each queue got exactly the frames of its mask, in the source's order, each whole and back to back
    (one beat per cycle: the merge relies on it)."""
    for p in range(ports):
        want = [beats for mask, beats in frames if mask >> p & 1]
        seen, cur = [], []
        for i, (cycle, data, last) in enumerate(got[p]):
            if cur and cycle != got[p][i - 1][0] + 1:
                raise AssertionError(f"queue {p}: a gap inside a frame at cycle {cycle}")
            cur.append(data)
            if last:
                seen.append(cur)
                cur = []
        assert not cur, f"queue {p}: a frame without its last beat"
        assert seen == want, f"queue {p}: frames lost, reordered or mixed"


@pytest.mark.parametrize("ports, seed", [(4, 1), (2, 2), (8, 3)])
def test_fanout_writes_each_result_whole_into_its_queues(ports, seed):
    rng = random.Random(seed)
    frames = []
    for k in range(40):
        mask = rng.randrange(1, 1 << ports) if rng.random() < 0.5 else (1 << ports) - 1
        frames.append((mask, [(k << 16) | b for b in range(rng.choice([1, 2, 5, rng.randint(1, 16)]))]))
    # one slow queue (a sink that stalls most cycles), the others at random
    drain = [0.15] + [rng.uniform(0.4, 1.0) for _ in range(ports - 1)]
    got, grants, problems = simulate_fanout(ports, 32, frames, seed=seed, drain=drain, cycles=20000)
    assert not problems, problems[:5]
    assert len(grants) == len(frames)
    check_fanout(ports, frames, got)


def test_fanout_does_not_wait_for_a_free_port():
    """Queues that always drain, whole-mask frames of 8 beats: each is granted so that it follows the one
    before without a bubble (the crossbar's port-free rule does not apply: only room counts)."""
    frames = [(0b1111, [(k << 16) | b for b in range(8)]) for k in range(10)]
    got, grants, problems = simulate_fanout(4, 32, frames, drain=[1.0] * 4)
    assert not problems
    assert grants == [grants[0] + 8 * k for k in range(10)]
    for p in range(4):
        assert [c for c, _, _ in got[p]] == list(range(grants[0] + 2, grants[0] + 82)), f"queue {p}"


def test_fanout_held_queue_blocks_only_when_full():
    """Queue 0 never drains (depth 32): four 8-beat frames for all ports are granted, then none: the fifth
    waits for room in queue 0 (the source sends in order), and the other queues hold exactly the four."""
    frames = [(0b111, [(k << 16) | b for b in range(8)]) for k in range(6)]
    got, grants, problems = simulate_fanout(3, 32, frames, drain=[0.0, 1.0, 1.0], cycles=400)
    assert problems == ["did not finish"]
    assert len(grants) == 4
    assert len(got[0]) == 32 and len(got[1]) == 32 and len(got[2]) == 32


# ----------------------------------------------------------------------------- per-port merge
# docs/core-design.md section 5: per egress port, whole frames from the forwarded-frame FIFO and the result
# queue, round-robin at frame boundaries, never a gap inside a frame, the offer held while the sink stalls.


class MergeBench(Elaboratable):
    """An EgressMerge behind two FrameFifos with registered outputs, as in the switch."""

    def __init__(self, depth):
        width = W + W // 8 + 1
        self.fifos = [FrameFifo(width, depth, registered_output=True) for _ in range(2)]
        self.merge = EgressMerge(W)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fwd, m.submodules.res = self.fifos
        m.submodules.merge = mg = self.merge
        for fifo, inp, valid_next, last in zip(self.fifos, (mg.fwd, mg.res), (mg.fwd_valid_next, mg.res_valid_next),
                                               (mg.fwd_last, mg.res_last)):
            m.d.comb += [inp.payload.eq(fifo.r_data), inp.valid.eq(fifo.r_valid), fifo.r_ready.eq(inp.ready),
                         fifo.commit.eq(fifo.w_en), valid_next.eq(fifo.r_valid_next), last.eq(fifo.r_last)]
        return m


def simulate_merge(frames, *, seed=0, ready=1.0, gap=0.3, depth=32, cycles=8000):
    """``frames[i]``: the frames written into FIFO i (0 forwarded, 1 results), each back to back once the
    FIFO has room for all of it (as the crossbar's and the fanout's credits do), after a random pause with
    probability ``gap`` (or ``gap[i]``); the sink takes a beat with probability ``ready``. Returns the output's beats
    (cycle, data, last, valid, ready) of every cycle, and the problems seen."""
    rng = random.Random(seed)
    gaps = gap if isinstance(gap, tuple) else (gap, gap)
    dut = MergeBench(depth)
    trace, problems = [], []

    async def tb(ctx):
        o = dut.merge.o
        level = [0, 0]                    # beats written and not read, per FIFO (the writer's credit)
        nxt, pos = [0, 0], [None, None]
        for cycle in range(cycles):
            for i, fifo in enumerate(dut.fifos):
                if pos[i] is None and nxt[i] < len(frames[i]) and level[i] + len(frames[i][nxt[i]]) <= depth \
                        and rng.random() >= gaps[i]:
                    pos[i] = 0
                if pos[i] is not None:
                    beat = frames[i][nxt[i]][pos[i]]
                    ctx.set(fifo.w_data, beat | (0xFF << W) | (int(pos[i] == len(frames[i][nxt[i]]) - 1) << (W + 8)))
                    ctx.set(fifo.w_en, 1)
                else:
                    ctx.set(fifo.w_en, 0)
            rdy = rng.random() < ready
            ctx.set(o.ready, rdy)
            await ctx.delay(1e-9)
            valid, data, last = ctx.get(o.valid), ctx.get(o.payload.data), ctx.get(o.payload.last)
            reads = [ctx.get(f.r_valid) and ctx.get(f.r_ready) for f in dut.fifos]
            trace.append((cycle, data, last, valid, rdy))
            for i in range(2):
                level[i] -= reads[i]
                if pos[i] is not None:
                    level[i] += 1
                    pos[i] += 1
                    if pos[i] == len(frames[i][nxt[i]]):
                        pos[i], nxt[i] = None, nxt[i] + 1
            await ctx.tick()
            if nxt == [len(f) for f in frames] and not any(ctx.get(f.held) for f in dut.fifos):
                return
        problems.append("did not finish")

    run(dut, tb)
    return trace, problems


def merged_frames(trace):
    """The frames taken from the output (beats taken: valid and ready), checking the AXI4-Stream rule (an
    offer not taken stays the same in the next cycle) and that no cycle inside a frame with the sink ready
    lacks a beat."""
    frames, cur = [], []
    for i, (cycle, data, last, valid, rdy) in enumerate(trace):
        if i and trace[i - 1][3] and not trace[i - 1][4]:
            assert valid and (data, last) == trace[i - 1][1:3], f"cycle {cycle}: the offer changed under a stall"
        if cur and rdy and not valid:
            raise AssertionError(f"cycle {cycle}: a gap inside a frame")
        if valid and rdy:
            cur.append(data)
            if last:
                frames.append(cur)
                cur = []
    assert not cur, "a frame without its last beat"
    return frames


def make_frames(rng, source, count, lengths):
    return [[(source << 48) | (k << 16) | b for b in range(rng.choice(lengths))] for k in range(count)]


# make test-fast: an always-ready sink and a mostly stalled one
@pytest.mark.parametrize("seed, ready, gap", sweep(
    [(1, 1.0, 0.3), (2, 0.5, 0.3), (3, 0.8, 0.0), (4, 0.3, 0.6), (5, 0.7, (0.95, 0.05)), (6, 1.0, (0.05, 0.95)),
     (7, 0.5, (0.9, 0.2))], fast=lambda seed, ready, gap: seed in (1, 4)))
def test_merge_sends_whole_frames_in_order_per_source(seed, ready, gap):
    """Random frames into both FIFOs (one source bursty, the other rare, or both), a sink that stalls."""
    rng = random.Random(seed)
    frames = [make_frames(rng, 0, 60, [1, 2, 3, 7, 16]), make_frames(rng, 1, 60, [1, 5, 9])]
    trace, problems = simulate_merge(frames, seed=seed, ready=ready, gap=gap, cycles=20000)
    assert not problems
    out = merged_frames(trace)
    for src in range(2):
        assert [f for f in out if f[0] >> 48 == src] == frames[src], f"source {src}: lost or reordered"
    assert len(out) == 120


def test_merge_keeps_line_rate_and_alternates():
    """Both FIFOs always hold frames and the sink is always ready: a beat leaves in every cycle from the
    first to the last, frames alternating between the two sources (round-robin at frame boundaries)."""
    rng = random.Random(5)
    frames = [make_frames(rng, 0, 12, [1, 4, 9]), make_frames(rng, 1, 12, [1, 3, 6])]
    trace, problems = simulate_merge(frames, gap=0.0, depth=64)
    assert not problems
    out = merged_frames(trace)
    cycles = [c for c, _, _, valid, rdy in trace if valid and rdy]
    assert cycles == list(range(cycles[0], cycles[0] + sum(map(len, out)))), "a bubble between frames"
    sources = [f[0] >> 48 for f in out]
    assert sources == [0, 1] * 12 or sources == [1, 0] * 12, sources


def test_merge_adds_no_cycle_when_idle():
    """One frame into the result queue of an idle port leaves as soon as it is at the FIFO's head: the
    cycle the FIFO's registered output shows it (written in cycle t, committed: out in t + 4, the fetch,
    the RAM's read, its output register, the skid)."""
    trace, problems = simulate_merge([[], [[7, 8, 9]]], gap=0.0)
    assert not problems
    out = [(c, d) for c, d, _, valid, rdy in trace if valid and rdy]
    assert out == [(4, 7), (5, 8), (6, 9)]
