"""Seeded fuzzing of the switch on the fast Verilator link against the reference model.

``python -m cais.sim.fuzz --seed S --frames N`` (``make fuzz``: 100,000 frames) sends N frames in batches:
valid all-reduce chunks (some contributions lost, then retransmitted), repeats, resends, tag and length
mismatches, CAIS headers with random bytes mutated, lengths, tkeep gaps (BAD_FRAMING), tuser (BAD_FCS),
runts, oversize and ordinary frames, under random idle and per-port back-pressure, with register writes
in between (staging registers, read-only and unmapped addresses, commands naming slots or entries the
switch does not have: accepted or ignored, as documented; AGING switched on and off with the largest age,
so the aging scanner's visits hold back the stateful headers during traffic but no set ages within a run
and the model, which has no clock here, follows exactly; AGED_POP of the empty queue).
After each batch the switch drains and every port's frames are compared with the model's, frame by
frame, and every counter and gauge with the model's, counter by counter.

Within a batch the switch interleaves the ports as it likes, so a batch only holds frames whose outcome
does not depend on that order: each slot gets one phase per batch (contribute to one set; or repeats,
mismatches to an incomplete set; or resends, mismatches to a completed one), and a mutated header that
would reach the slot state (checked on a probe model with the same tables) is not sent. The order of
one port's frames is kept by the switch, and the model is fed in that order.

A failing run prints its seed and batch; ``--seed S --frames N`` reproduces it exactly (the link's
pause patterns come from the same seed).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import AGE_UNIT_LOG2, Access, Kind, read_counters, register_map
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

from .directed import accounting_problems, counter_problems
from .links.base import wait_idle
from .refmodel import SwitchModel
from .traffic import compare, host_mac

__all__ = ["FuzzResult", "fuzz", "run_fuzz", "main", "FULL_FRAMES", "QUICK_FRAMES"]

#: Frames of the documented full run (make fuzz) and of the run in make test.
FULL_FRAMES = 100_000
QUICK_FRAMES = 6_000   # every outcome at least 17 times at 4,000 (seed 0)
#: Frames per batch, roughly (a batch drains before the next).
BATCH = 120
#: log2 of each group's quota; group 1 (every port) at slot 0, group 2 (even ports) right after it.
QUOTA_LOG2 = 3
#: Cycles a batch may take to drain before the run reports the switch stuck.
DRAIN_LIMIT = 2_000_000

_STATEFUL = ("CONTRIBUTIONS", "DUPLICATES", "DROP_TAG_MISMATCH", "DROP_LENGTH_MISMATCH")


@dataclass
class FuzzResult:
    seed: int
    frames: int = 0
    batches: int = 0
    cycles: int = 0
    problems: list[str] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)   # the model's counters at the end
    aging_batches: int = 0      # batches that ended with AGING on (the scanner visiting during traffic)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Groups:
    """The fuzz's tables: group 1 = every port (int32 SUM), group 2 = the even ports (int32 MAX), group 3 a
    quota outside the slot memory (BAD_SLOT); a MAC entry per host, host frames never flooded
    (MAC_POLICY.host_strict)."""

    def __init__(self, params: SwitchParams):
        P = params.ports
        self.Q = 1 << QUOTA_LOG2
        allp = (1 << P) - 1
        even = sum(1 << p for p in range(0, P, 2))
        self.groups = {1: (allp, 0, proto.ReduceOp.SUM), 2: (even, self.Q, proto.ReduceOp.MAX)}
        regs = register_map(params)
        self.writes = []
        for i, (g, (contrib, base, op)) in enumerate(self.groups.items()):
            self.writes += rule_writes(regs, i, Rule.for_group(g, contributors=contrib, results=allp, base=base,
                                                               count_log2=QUOTA_LOG2, red_op=op))
        self.writes += rule_writes(regs, 2, Rule.for_group(3, contributors=allp, results=allp,
                                                           base=params.slots, count_log2=0))
        for p in range(P):
            self.writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
        self.writes.append((regs["MAC_POLICY"].address(), regs["MAC_POLICY"].pack(host_strict=1)))
        self.writes += slot_clear_writes(regs, 0, 2 * self.Q)


def _reg_noise(rng: random.Random, params: SwitchParams) -> tuple[int, int]:
    """A register write that must not change the traffic's outcome: a staging register (no RULE_WRITE or
    MAC_WRITE follows), a read-only register, an unmapped address, one with bits 1:0 set, a SLOT_CLEAR /
    RULE_WRITE / MAC_WRITE naming a slot or entry at or above the switch's count (ignored), or AGING on
    with the largest age (0xFFFF units: 67M cycles, longer than a run) or off, or AGED_POP."""
    regs = register_map(params)
    staging = [r for r in regs if r.kind is Kind.CONFIG and r.name.startswith(("RULE_", "MAC_ADDR"))]
    ro = [r for r in regs if r.access is Access.RO]
    k = rng.randrange(6)
    value = rng.getrandbits(32)
    if k == 5:                       # aging on (the largest age: nothing ages in a run) or off; a pop
        aging = regs["AGING"]
        age = (1 << aging.field("age").width) - 1
        return rng.choice([(aging.address(), aging.pack(age=age, free=rng.randrange(2))), (aging.address(), 0),
                           (regs["AGED_POP"].address(), value)])
    if k == 4:                       # a command naming a slot or table entry the switch does not have
        name, fld, size = rng.choice([("SLOT_CLEAR", "slot", params.slots), ("RULE_WRITE", "index", params.rules),
                                      ("MAC_WRITE", "index", params.mac_entries)])
        reg = regs[name]
        top = 1 << reg.field(fld).width
        if size >= top:
            return regs.size, value
        f = reg.field(fld)
        return reg.address(), (value & ~f.mask) | (rng.randrange(size, top) << f.lsb)
    if k == 0:
        return rng.choice(staging).address(), value
    if k == 1:
        reg = rng.choice(ro)
        return reg.address(rng.randrange(reg.count)), value
    if k == 2:
        return regs.size + 4 * rng.randrange(64), value
    return rng.choice(staging).address() | rng.randrange(1, 4), value


class _Batcher:
    """Builds the frames of one batch from the model's slot state at its start."""

    def __init__(self, params: SwitchParams, seed: int, probe: SwitchModel, groups: _Groups):
        self.params, self.probe, self.g = params, probe, groups
        self.rng = random.Random(seed)
        self.nrng = np.random.default_rng(seed)
        self.uses: dict[tuple[int, int, int], int] = {}      # (group, j, set) -> next generation
        self.plen: dict[tuple[int, int], int] = {}           # (slot, tag) -> payload_len

    def _frame(self, port, hdr, payload=None) -> bytes:
        if payload is None:
            payload = self.nrng.integers(-2**31, 2**31, hdr.payload_len // 4, dtype=np.int64).astype(">i4").tobytes()
        return proto.build_frame(hdr, payload, src=host_mac(port), pad=True)

    def _hdr(self, group, seq, plen, **kw) -> proto.CaisHeader:
        op = self.g.groups[group][2]
        # Every frame of a chunk carries the same header: the result takes the completing frame's.
        return proto.CaisHeader(group_id=group, layer_id=(seq * 40503 >> 7) & 0xFFFF, chunk_id=seq & 0xFFFF,
                                total_chunks=self.g.Q, seq_num=seq, payload_len=plen, red_op=op, **kw)

    def _plen(self) -> int:
        r = self.rng.random()
        n = self.params.max_payload // 4
        return 4 * (n if r < 0.3 else 1 if r < 0.4 else self.rng.randint(1, n))

    def stateful(self, model: SwitchModel, out: list[list[tuple]]):
        """Frames to the groups' slots, one phase per slot: contribute / repeat / resend / nothing."""
        rng, Q = self.rng, self.g.Q
        for group, (contrib, base, _op) in self.g.groups.items():
            ports = [p for p in range(self.params.ports) if contrib >> p & 1]
            for j in range(Q):
                slot = base + j
                sets = model.slot_state(slot)
                k = rng.randrange(2)
                bitmap, tag, done = sets[k]
                phase = rng.random()
                if phase < 0.55:                                    # contribute to set k
                    if bitmap == 0:                                 # free: a new chunk
                        gen = self.uses.get((group, j, k), 0) + 1
                        self.uses[(group, j, k)] = gen
                        tag = (j + k * Q + 2 * Q * gen) & 0xFFFF_FFFF
                        self.plen[(slot, tag)] = self._plen()
                        missing = ports
                    elif done:
                        continue
                    else:                                           # the missing contributors
                        missing = [p for p in ports if not bitmap >> p & 1]
                    plen = self.plen[(slot, tag)]
                    for p in missing:
                        if rng.random() < 0.85:                     # else: this contribution is lost
                            out[p].append((self._frame(p, self._hdr(group, tag, plen)), False, False))
                elif bitmap != 0 or done:                           # repeats / resends / mismatches
                    plen = self.plen.get((slot, tag), 4)
                    senders = [p for p in ports if bitmap >> p & 1] if not done else ports
                    retransmit = int(proto.Flags.RETRANSMIT) if rng.random() < 0.5 else 0
                    for p in rng.sample(senders, k=min(len(senders), rng.randint(1, 3))):
                        out[p].append((self._frame(p, self._hdr(group, tag, plen, flags=retransmit)), False, False))
                    for _ in range(rng.randint(0, 2)):
                        p = rng.choice(ports)
                        other_len = plen + 4 if plen + 4 <= self.params.max_payload else plen - 4
                        if other_len > 0:                            # LENGTH_MISMATCH
                            out[p].append((self._frame(p, self._hdr(group, tag, other_len)), False, False))
                        if bitmap != 0:                              # TAG_MISMATCH (the set is occupied)
                            other = (tag + 2 * Q * rng.randint(1, 1000)) & 0xFFFF_FFFF
                            out[p].append((self._frame(p, self._hdr(group, other, plen)), False, False))

    def stateless(self, n: int, out: list[list[tuple]]):
        """``n`` frames decided without the slot state: malformed, mutated, ordinary, BAD_SLOT, forwarded."""
        rng, prm = self.rng, self.params
        P = prm.ports
        for _ in range(n):
            p = rng.randrange(P)
            group = rng.choice((1, 2))
            plen = self._plen()
            seq = rng.randrange(1 << 32)
            good = self._frame(p, self._hdr(group, seq, plen))
            kind = rng.randrange(12)
            bad_keep = bad_fcs = False
            if kind == 0:            # ordinary (MAC table or flood; a host frame: NO_ROUTE), at times spoofed
                dst = rng.choice([host_mac(rng.randrange(P)), proto.BROADCAST_MAC, 0x02_00_00_00_09_99])
                length = rng.choice([60, 64, rng.randint(14, prm.max_frame), prm.max_frame])
                src = host_mac(p if rng.random() < 0.75 else rng.randrange(P))
                frame = (proto.EthHeader(dst, src, rng.choice([0x0800, 0x86DD, proto.HOST_ETHERTYPE])).pack()
                         + bytes(rng.getrandbits(8) for _ in range(min(length - 14, 64)))
                         + bytes(max(0, length - 14 - 64)))
            elif kind == 1:                                          # tuser: the MAC saw a bad FCS
                frame, bad_fcs = good, True
            elif kind == 2:                                          # a gap in the last beat's tkeep
                frame = good if len(good) % prm.beat_bytes else good[:-1]
                bad_keep = True
            elif kind == 3:                                          # RUNT (Ethernet or CAIS)
                frame = good[:rng.randint(1, proto.HEADERS_BYTES - 1)]
            elif kind == 4:                                          # OVERSIZE
                frame = good[:14] + bytes(prm.max_frame + 1 + rng.randrange(64) - 14)
            elif kind == 5:                                          # truncated or extended: BAD_LENGTH
                cut = rng.choice([-4, -1, 1, 4])
                frame = good[:cut] if cut < 0 else good + bytes(cut)
            elif kind == 6:                                          # BAD_SLOT
                frame = self._frame(p, self._hdr(1, seq, plen).replace(group_id=3))
            elif kind == 7:                                          # FOREIGN_PORT / NO_RULE / forwarded
                op = rng.choice([proto.OpType.ALL_REDUCE, proto.OpType.ALL_GATHER, proto.OpType.BROADCAST])
                frame = self._frame(p, self._hdr(2, seq, plen).replace(op_type=op, group_id=rng.choice([2, 9])))
            elif kind == 8 and P > 1:                                # another port's host: SPOOFED_SOURCE
                frame = good[:6] + host_mac((p + rng.randrange(1, P)) % P).to_bytes(6, "big") + good[12:]
            else:                                                    # random bytes of the CAIS header mutated
                b = bytearray(good)
                for _ in range(rng.randint(1, 4)):
                    i = 14 + rng.randrange(proto.CAIS_HEADER_BYTES)
                    b[i] = rng.getrandbits(8) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
                frame = bytes(b)
            # Keep it only if the slot state does not decide it (the probe has the same tables).
            before = [self.probe.counters()[c] for c in _STATEFUL]
            self.probe.receive(p, frame, framing_ok=not bad_keep, fcs_ok=not bad_fcs)
            if [self.probe.counters()[c] for c in _STATEFUL] != before:
                continue
            out[p].append((frame, bad_keep, bad_fcs))


async def fuzz(link, frames: int, seed: int, *, log=None) -> FuzzResult:
    """Run ``frames`` fuzz frames on ``link`` (reset first); stop at the first batch with a problem."""
    params = link.params
    regs = register_map(params)
    res = FuzzResult(seed)
    groups = _Groups(params)
    model, probe = SwitchModel(params), SwitchModel(params)
    await link.reset()
    for addr, value in groups.writes:
        model.write(addr, value)
        probe.write(addr, value)
        await link.write(addr, value)
    batcher = _Batcher(params, seed, probe, groups)
    rng = random.Random(seed ^ 0x5EED)
    rx_total = [0] * params.ports
    while res.frames < frames and not res.problems:
        out: list[list[tuple]] = [[] for _ in range(params.ports)]
        batcher.stateful(model, out)
        batcher.stateless(max(0, min(BATCH, frames - res.frames) - sum(map(len, out))), out)
        idle = rng.choice([0.0, 0.0, 0.2, 0.5])
        bp = [rng.choice([0.0, 0.0, 0.3, 0.8]) for _ in range(params.ports)]
        link.set_patterns(idle, bp)
        expected: list[list[bytes]] = [[] for _ in range(params.ports)]
        # The model in round-robin port order (a port's own order kept); the link gets each port's queue,
        # with a register write between some of them.
        queues = [list(q) for q in out]
        while any(queues):
            for p, q in enumerate(queues):
                if q:
                    frame, bad_keep, bad_fcs = q.pop(0)
                    for port, data in model.receive(p, frame, framing_ok=not bad_keep, fcs_ok=not bad_fcs):
                        expected[port].append(data)
                    link.send(p, frame, bad_keep=bad_keep, bad_fcs=bad_fcs)
                    res.frames += 1
            if rng.random() < 0.05:
                addr, value = _reg_noise(rng, params)
                model.write(addr, value)
                await link.write(addr, value)
        limit = link.cycle + DRAIN_LIMIT
        while link.pending and link.cycle < limit:          # frames the link has not started yet
            await link.advance(64)
        idle_ok = await wait_idle(link, limit=limit)
        link.set_patterns(0.0, 0.0)
        got = [[] for _ in range(params.ports)]
        for r in link.take_stamped():
            got[r.port].append(r.data)
        link.take_sent()
        if not idle_ok:
            res.problems.append(f"batch {res.batches}: the switch did not drain within {DRAIN_LIMIT} cycles")
        res.problems += [f"batch {res.batches}: {p}" for p in compare(expected, got)]
        counters = await read_counters(link.read, regs)
        res.problems += [f"batch {res.batches}: {p}" for p in counter_problems(counters, model.counters())
                         + accounting_problems(counters)]
        for reg in regs:                                     # what the noise wrote reads back as the model's
            if reg.kind is Kind.CONFIG:
                got_v, want_v = await link.read(reg.address()), model.read(reg.address())
                if got_v != want_v:
                    res.problems.append(f"batch {res.batches}: {reg.name} reads {got_v:#x}, model {want_v:#x}")
        for p in range(params.ports):
            rx_total[p] += len(got[p])
        res.aging_batches += bool(model.read(regs["AGING"].address()))
        res.batches += 1
        if log and res.batches % 50 == 0:
            log(f"  {res.frames} frames, {res.batches} batches, cycle {link.cycle}")
    res.cycles = link.cycle
    if res.cycles > (1 << regs["AGING"].field("age").width) - 1 << AGE_UNIT_LOG2:
        res.problems.append(f"the run ({res.cycles} cycles) outlasted the largest age: the model cannot follow")
    res.outcomes = {k: v for k, v in model.counters().items() if not isinstance(v, list)}
    res.outcomes["RX_TOTAL"] = sum(rx_total)
    return res


def run_fuzz(frames: int = QUICK_FRAMES, seed: int = 0, params: SwitchParams = SwitchParams(), log=None) -> FuzzResult:
    """:func:`fuzz` on a fresh Verilator link whose pause patterns come from ``seed``."""
    from .links.verilator import run_verilator

    async def main(link):
        return await fuzz(link, frames, seed, log=log)
    return run_verilator(params, main, seed=seed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cais.sim.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frames", type=int, default=FULL_FRAMES)
    ap.add_argument("--seeds", type=int, default=1, help="run seeds seed .. seed+n-1")
    args = ap.parse_args(argv)
    if args.frames < 1 or args.seeds < 1:
        ap.error(f"--frames {args.frames} --seeds {args.seeds}: both must be at least 1")
    bad = 0
    for seed in range(args.seed, args.seed + args.seeds):
        t0 = time.monotonic()
        res = run_fuzz(args.frames, seed, log=print)
        secs = time.monotonic() - t0
        print(f"seed {seed}: {res.frames} frames in {res.batches} batches, {res.cycles} cycles, {secs:.1f} s: "
              + ("ok" if res.ok else "FAILED"))
        print("  model counters: " + ", ".join(f"{k}={v}" for k, v in res.outcomes.items() if v))
        for p in res.problems[:20]:
            print("  " + p)
        if not res.ok:
            bad += 1
            print(f"  reproduce: python -m cais.sim.fuzz --seed {seed} --frames {args.frames}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
