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

from cais.hdl.egress import EgressCrossbar

from blocksim import run

W = 64


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
        assert [c for c, _ in got[p]] == list(range(first + 2, first + 82)), f"port {p}: a gap"


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


def test_one_beat_frames():
    """One-beat frames of one source to one port: one cycle between them (the only bubble of the
    schedule, the port's next grant waits one cycle for its credit)."""
    frames = [[(0b1, [k]) for k in range(10)]]
    got, grants, problems = simulate(1, 1, 64, frames, drain_rate=1.0)
    assert not problems
    cycles = [c for c, _ in got[0]]
    assert cycles == list(range(cycles[0], cycles[0] + 20, 2))
