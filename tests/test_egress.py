"""EgressCrossbar under amaranth.sim, against the rules of docs/interface.md written out here.

Random sources offer whole frames with random port masks and lengths, each holding its request until it is
granted and then sending its beats back to back (as the lanes and the result generator do); random egress
room. Checked from the outside: every frame reaches exactly the ports of its mask, whole, in order and
without another frame's beats in between; a frame starts only when each of its ports had room for all of
it; nothing is lost or duplicated; every request is granted within a bound (a multicast frame is not
starved by unicast ones); and two sources that do not share a port are served in the same cycles.
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


def simulate(sources, ports, depth, frames, *, room_rate=0.8, seed=0, drain_rate=0.7):
    """Run the crossbar; return the beats each port received, in order, and the grant cycles."""
    rng = random.Random(seed)
    dut = EgressCrossbar(sources, ports, W, max_beats=16, depth=depth)
    got = [[] for _ in range(ports)]
    grants = []
    problems = []

    async def tb(ctx):
        level = [0] * ports                    # the egress FIFOs, drained at random
        nxt = [0] * sources                    # next frame of each source
        sending = [None] * sources             # (frame index, beat index) once granted
        waited = [0] * sources
        for cycle in range(4000):
            for s in range(sources):
                # a source asks for its next frame while its current one's last beat leaves
                ending = sending[s] is not None and sending[s][1] == len(frames[s][sending[s][0]][1]) - 1
                asking = (sending[s] is None or ending) and nxt[s] < len(frames[s])
                mask, beats = frames[s][nxt[s]] if asking else (0, [0])
                ctx.set(dut.sources[s].req, asking)
                ctx.set(dut.sources[s].mask, mask)
                ctx.set(dut.sources[s].beats, len(beats))
                if sending[s] is not None:
                    k, b = sending[s]
                    data = frames[s][k][1]
                    ctx.set(dut.sources[s].valid, 1)
                    ctx.set(dut.sources[s].data, data[b])
                    ctx.set(dut.sources[s].last, b == len(data) - 1)
                    ctx.set(dut.sources[s].keep, 0xFF)
                else:
                    ctx.set(dut.sources[s].valid, 0)
            drains = [level[p] > 0 and rng.random() < drain_rate for p in range(ports)]
            room = [depth - level[p] for p in range(ports)]
            for p in range(ports):
                ctx.set(dut.room[p], room[p])
            await ctx.delay(1e-9)
            grant = sum(ctx.get(dut.sources[s].grant) << s for s in range(sources))
            w_en = [ctx.get(dut.w_en[p]) for p in range(ports)]
            w_data = [ctx.get(dut.w_data[p]) for p in range(ports)]
            for s in range(sources):
                if grant >> s & 1:
                    mask, beats = frames[s][nxt[s]]
                    for p in range(ports):
                        if mask >> p & 1 and room[p] - w_en[p] < len(beats):
                            problems.append(f"cycle {cycle}: source {s} granted port {p} without room")
                    grants.append((cycle, s, mask))
                    waited[s] = 0
            for p in range(ports):
                if w_en[p]:
                    got[p].append(w_data[p])
                level[p] += w_en[p] - drains[p]
                if level[p] > depth:
                    problems.append(f"cycle {cycle}: egress {p} overflowed")
            for s in range(sources):
                if sending[s] is not None:
                    k, b = sending[s]
                    sending[s] = None if b == len(frames[s][k][1]) - 1 else (k, b + 1)
                if grant >> s & 1:
                    sending[s] = (nxt[s], 0)
                    nxt[s] += 1
                elif nxt[s] < len(frames[s]):
                    waited[s] += 1
                    if waited[s] > 400:
                        problems.append(f"source {s} starved at cycle {cycle}")
                        return
            await ctx.tick()
            if all(n == len(f) for n, f in zip(nxt, frames)) and all(x is None for x in sending):
                break

    run(dut, tb)
    return got, grants, problems


@pytest.mark.parametrize("sources, ports, multicast", [(5, 4, True), (3, 2, True), (9, 8, False), (9, 8, True)])
def test_frames_arrive_whole_on_their_ports(sources, ports, multicast):
    rng = random.Random(sources * 10 + ports + multicast)
    frames = frames_for(rng, sources, ports, 25, multicast)
    got, grants, problems = simulate(sources, ports, 16, frames, seed=sources + ports)
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
        assert got[p] == expected, f"port {p}"
    assert sorted(s for _, s, _ in grants) == sorted(s for s in range(sources) for _ in frames[s])


def test_disjoint_sources_share_cycles():
    """Four unicast streams to four different ports: every port takes one beat per cycle, all at once,
    frame after frame without a gap (the next frame is granted during the previous one's last beat)."""
    frames = [[(1 << ((s + 1) % 4), list(range(8))) for _ in range(10)] for s in range(4)]
    got, grants, problems = simulate(4, 4, 64, frames, drain_rate=1.0)
    assert not problems
    assert all(len(got[p]) == 80 for p in range(4))
    for s in range(4):
        cycles = [c for c, t, _ in grants if t == s]
        assert cycles == [cycles[0] + 8 * k for k in range(10)], (s, cycles)
