"""FrameFifo against a Python model of the queue: committed beats are visible, uncommitted ones are not.

Model (from the docstring of FrameFifo): the writer appends to a pending list when ``w_en & w_rdy``;
``commit`` moves pending beats (including one written in that cycle) to the committed queue; ``rollback``
forgets them (including one written in that cycle). ``w_rdy`` is "fewer than depth beats held, committed
or pending". The reader sees the oldest committed beat (first-word fall-through) and pops it with
``r_ready``. Commit and rollback are never asserted together (the ingress never does).

With ``registered_output`` the model's committed beats carry their commit cycle: the head is visible
(``r_valid``, ``r_data``) exactly when it was committed at least ``REGISTERED_LATENCY`` cycles ago, so the
read side keeps one beat per cycle; ``w_rdy`` counts only the beats in the RAM, so it may be high while
the model holds ``depth`` beats (up to SKID_DEPTH are past the RAM) but never low while the model has room. It
is a register: after each edge it is low exactly when the RAM's beats before the edge (``level``), plus
the beat written or less the pending beats a rollback forgot, reach ``depth`` (the reads of that cycle
count from the next edge on).
"""

import random
from collections import deque

import pytest

from cais.hdl.common.frame_fifo import FrameFifo

from blocksim import run
from tiers import sweep


REGISTERED_LATENCY = 4     # commit in cycle t: the beat can be at the head in cycle t + 4 (hand-derived:
#                            # the fetch, the RAM read, its output register, the skid)


class QueueModel:
    def __init__(self, depth, registered=False):
        self.depth = depth
        self.registered = registered
        self.committed = deque()     # (beat, cycle of its commit)
        self.pending = []
        self.cycle = 0

    @property
    def w_rdy(self):
        return len(self.committed) + len(self.pending) < self.depth

    @property
    def head(self):
        """The beat the reader sees, or None."""
        if not self.committed:
            return None
        beat, at = self.committed[0]
        return beat if not self.registered or self.cycle >= at + REGISTERED_LATENCY else None

    def step(self, w_en, w_data, commit, rollback, r_ready, w_rdy=None):
        """One clock edge; returns (wrote, popped beat or None). ``w_rdy``: the FIFO's, where the model
        does not define it exactly (registered output)."""
        wrote = w_en and (self.w_rdy if w_rdy is None else w_rdy)
        head = self.head
        popped = self.committed.popleft()[0] if (r_ready and head is not None) else None
        if wrote:
            self.pending.append(w_data)
        if rollback:
            self.pending = []
        elif commit:
            self.committed.extend((beat, self.cycle) for beat in self.pending)
            self.pending = []
        self.cycle += 1
        return wrote, popped


class Driver:
    """Drives the FIFO one cycle at a time and checks it against QueueModel every cycle."""

    def __init__(self, ctx, dut, depth):
        self.ctx, self.dut = ctx, dut
        self.model = QueueModel(depth, dut.registered_output)
        self.cycle = 0
        self.popped = []
        self.expect_w_rdy = True         # registered output: w_rdy after the last edge (empty at reset)

    def check(self):
        ctx, dut, m = self.ctx, self.dut, self.model
        where = f"cycle {self.cycle}"
        if m.registered:
            assert ctx.get(dut.w_rdy) or not m.w_rdy, f"{where}: w_rdy low while the model has room"
            assert ctx.get(dut.w_rdy) == self.expect_w_rdy, f"{where}: w_rdy"
        else:
            assert ctx.get(dut.w_rdy) == m.w_rdy, f"{where}: w_rdy"
        assert ctx.get(dut.held) == bool(m.committed or m.pending), f"{where}: held"
        head = m.head
        assert ctx.get(dut.r_valid) == (head is not None), f"{where}: r_valid"
        if head is not None:
            assert ctx.get(dut.r_data) == head, f"{where}: r_data"

    async def step(self, w_en=0, w_data=0, commit=0, rollback=0, r_ready=0):
        ctx, dut = self.ctx, self.dut
        self.check()
        ctx.set(dut.w_en, w_en)
        ctx.set(dut.w_data, w_data)
        ctx.set(dut.commit, commit)
        ctx.set(dut.rollback, rollback)
        ctx.set(dut.r_ready, r_ready)
        self.check()                 # outputs do not depend combinationally on the inputs
        w_rdy = ctx.get(dut.w_rdy) if self.model.registered else None
        level, pending = ctx.get(dut.level), len(self.model.pending)
        await ctx.tick()
        wrote, popped = self.model.step(w_en, w_data, commit, rollback, r_ready, w_rdy)
        self.expect_w_rdy = (level - pending if rollback else level + wrote) != self.model.depth
        if popped is not None:
            self.popped.append(popped)
        self.cycle += 1
        self.check()
        return wrote, popped


def fifo_test(width, depth, body, registered=False):
    dut = FrameFifo(width, depth, registered_output=registered)

    async def tb(ctx):
        await body(Driver(ctx, dut, depth))

    run(dut, tb)


# ----------------------------------------------------------------------------- directed
def test_commit_makes_frame_visible_and_reads_have_no_bubble():
    async def body(d):
        ctx, dut = d.ctx, d.dut
        for v in (0x11, 0x22):
            await d.step(w_en=1, w_data=v, r_ready=1)
            assert not ctx.get(dut.r_valid)
        await d.step(w_en=1, w_data=0x33, commit=1, r_ready=1)    # commit with a beat in the same cycle
        # the whole frame is visible at once and leaves at one beat per cycle
        got = []
        for _ in range(3):
            assert ctx.get(dut.r_valid)
            got.append(ctx.get(dut.r_data))
            await d.step(r_ready=1)
        assert got == [0x11, 0x22, 0x33]
        assert not ctx.get(dut.r_valid)
    fifo_test(16, 8, body)


def test_commit_of_single_beat_then_immediate_read():
    async def body(d):
        ctx, dut = d.ctx, d.dut
        await d.step(w_en=1, w_data=0xAB, commit=1)
        assert ctx.get(dut.r_valid) and ctx.get(dut.r_data) == 0xAB
        await d.step(r_ready=1)
        assert not ctx.get(dut.r_valid)
    fifo_test(8, 4, body)


def test_rollback_discards_uncommitted_including_same_cycle_beat():
    async def body(d):
        ctx, dut = d.ctx, d.dut
        await d.step(w_en=1, w_data=0xA0)
        await d.step(w_en=1, w_data=0xA1, commit=1)                  # frame A: A0 A1
        await d.step(w_en=1, w_data=0xB0)
        await d.step(w_en=1, w_data=0xB1)
        await d.step(w_en=1, w_data=0xB2, rollback=1)                # frame B taken back, B2 included
        await d.step(w_en=1, w_data=0xC0, rollback=1)                # a one-beat frame taken back
        assert ctx.get(dut.w_rdy)
        await d.step(w_en=1, w_data=0xD0)
        await d.step(w_en=1, w_data=0xD1, commit=1)                  # frame D
        for want in (0xA0, 0xA1, 0xD0, 0xD1):
            assert ctx.get(dut.r_valid) and ctx.get(dut.r_data) == want
            await d.step(r_ready=1)
        assert not ctx.get(dut.r_valid)
        # rollback with nothing pending and no write is harmless
        await d.step(rollback=1)
        assert not ctx.get(dut.r_valid) and ctx.get(dut.w_rdy)
    fifo_test(8, 8, body)


@pytest.mark.parametrize("depth", [2, 4, 16])
def test_w_rdy_when_full(depth):
    async def body(d):
        ctx, dut = d.ctx, d.dut
        # uncommitted beats count against the room too
        for i in range(depth):
            assert ctx.get(dut.w_rdy)
            await d.step(w_en=1, w_data=i + 1)
        assert not ctx.get(dut.w_rdy)
        wrote, _ = await d.step(w_en=1, w_data=0xEE)                 # refused: not stored
        assert not wrote and not ctx.get(dut.r_valid)
        await d.step(rollback=1)
        assert ctx.get(dut.w_rdy) and not ctx.get(dut.r_valid)
        # fill with committed beats
        for i in range(depth):
            await d.step(w_en=1, w_data=0x40 + i, commit=1)
        assert not ctx.get(dut.w_rdy)
        await d.step(w_en=1, w_data=0xEE, commit=1)                  # refused even with commit
        # one pop frees one beat of room, and a write in the same cycle as a pop is refused while full
        wrote, popped = await d.step(w_en=1, w_data=0xEF, r_ready=1)
        assert not wrote and popped == 0x40
        assert ctx.get(dut.w_rdy)
        await d.step(w_en=1, w_data=0x50, commit=1)
        assert not ctx.get(dut.w_rdy)
        while ctx.get(dut.r_valid):
            await d.step(r_ready=1)
        assert d.popped == [0x40 + i for i in range(depth)] + [0x50]
    fifo_test(8, depth, body)


def test_streaming_commits_read_back_to_back():
    """One-beat frames committed every cycle while the reader pops every cycle: one beat per cycle out."""
    async def body(d):
        ctx, dut = d.ctx, d.dut
        valid_seen = []
        for i in range(40):
            valid_seen.append(ctx.get(dut.r_valid))
            await d.step(w_en=1, w_data=i, commit=1, r_ready=1)
        assert valid_seen[0] == 0 and all(valid_seen[1:])
        assert d.popped == list(range(39))
        # two-beat frames: the reader never starves once the first frame is committed
        d.popped.clear()
        for i in range(40):
            await d.step(w_en=1, w_data=100 + i, commit=i % 2, r_ready=1)
        while ctx.get(dut.r_valid):
            await d.step(r_ready=1)
        assert d.popped == [39] + [100 + i for i in range(40)]
    fifo_test(8, 4, body)


def test_long_committed_burst_no_bubble_after_wrap():
    async def body(d):
        ctx, dut = d.ctx, d.dut
        for rnd in range(3):                     # pointers wrap around the memory several times
            for i in range(8):
                await d.step(w_en=1, w_data=16 * rnd + i, commit=int(i == 7))
            for i in range(8):
                assert ctx.get(dut.r_valid)
                await d.step(r_ready=1)
            assert not ctx.get(dut.r_valid)
        assert d.popped == [16 * r + i for r in range(3) for i in range(8)]
    fifo_test(8, 8, body)


# ----------------------------------------------------------------------------- random
# make test-fast: the shallowest and the deepest FIFO, each output kind once
@pytest.mark.parametrize("width,depth,seed,registered", sweep(
    [(w, d, s, r) for r in (False, True) for w, d, s in [(8, 2, 4), (8, 4, 1), (32, 16, 2), (64, 8, 3)]],
    fast=lambda w, d, s, r: (d, r) in ((2, True), (16, False)),
    ids=lambda w, d, s, r: f"{w}-{d}-{s}-{'reg_out' if r else 'ram_out'}"))
def test_random_against_model(width, depth, seed, registered):
    rng = random.Random(seed)
    cycles = 4000

    async def body(d):
        # phases with different write/read/commit/rollback mixes, so the FIFO is often full and often empty
        stats = {"full": 0, "empty": 0, "rollback_with_write": 0, "commit_with_write": 0}
        phase = None
        for c in range(cycles):
            if c % 200 == 0:
                phase = (rng.uniform(0.2, 1.0), rng.uniform(0.0, 1.0), rng.uniform(0.05, 0.5),
                         rng.uniform(0.0, 0.3))
            pw, pr, pc, prb = phase
            w_en = int(rng.random() < pw)
            r_ready = int(rng.random() < pr)
            x = rng.random()
            commit, rollback = (1, 0) if x < pc else (0, 1) if x < pc + prb else (0, 0)
            stats["full"] += not d.model.w_rdy
            stats["empty"] += not d.model.committed
            stats["rollback_with_write"] += bool(rollback and w_en and d.model.w_rdy)
            stats["commit_with_write"] += bool(commit and w_en and d.model.w_rdy)
            await d.step(w_en=w_en, w_data=rng.getrandbits(width), commit=commit, rollback=rollback,
                         r_ready=r_ready)
        assert min(stats.values()) > 20, stats       # the random mix covered the interesting states
    fifo_test(width, depth, body, registered)


# ----------------------------------------------------------------------------- registered output
def test_registered_output_streams_one_beat_per_cycle():
    """Committed frames leave at one beat per cycle once the first is out, through reader stalls, and the
    RAM is read only at committed addresses (a beat written and committed in the cycle its address is
    read ahead would come out stale)."""
    async def body(d):
        ctx, dut = d.ctx, d.dut
        valid_seen = []
        for i in range(40):                      # one-beat frames, written and committed every cycle
            valid_seen.append(ctx.get(dut.r_valid))
            await d.step(w_en=1, w_data=i, commit=1, r_ready=1)
        assert valid_seen[:REGISTERED_LATENCY] == [0] * REGISTERED_LATENCY and all(valid_seen[REGISTERED_LATENCY:])
        for i in range(6):                       # the reader stalls, then takes back to back
            await d.step(r_ready=0)
        gaps = 0
        while ctx.get(dut.r_valid) or d.model.committed:
            gaps += not ctx.get(dut.r_valid)
            await d.step(r_ready=1)
        assert gaps == 0
        assert d.popped == list(range(40))
        assert not ctx.get(dut.held)
    fifo_test(8, 8, body, registered=True)
