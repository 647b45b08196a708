"""The directed protocol cases, as data, shared by the amaranth.sim and the cocotb testbenches.

A case programs the switch and then sends batches of frames; every frame of a batch is sent at once
(on its port), and the batch drains before the next starts. Within a batch the outcome must not depend
on how the switch interleaves ports, so the reference model can replay it in order and the frames out
of each port are compared as multisets, batch by batch, and the counters at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

from .refmodel import SwitchModel
from .traffic import TxFrame, compare, host_mac

__all__ = ["Case", "directed_cases", "score_case", "accounting_problems", "counter_problems"]


@dataclass
class Case:
    name: str
    writes: list[tuple[int, int]] = field(default_factory=list)
    batches: list[list[tuple[int, TxFrame]]] = field(default_factory=list)
    writes_before: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # batch index -> writes


def directed_cases(params: SwitchParams, seed: int = 0) -> list[Case]:
    P = params.ports
    regs = register_map(params)
    rng = np.random.default_rng(seed)
    allp = (1 << P) - 1
    COUNT_LOG2 = 1           # two slots per group: seq 0,1 -> set 0; seq 2,3 -> set 1
    g2 = 0b11 if P > 2 else 0b01

    def setup():
        w = rule_writes(regs, 0, Rule.for_group(1, contributors=allp, results=allp, base=0, count_log2=COUNT_LOG2))
        # group 2: ports 0 and 1 contribute (port 0 alone on a 2-port switch), everyone gets the result;
        # the last port is never a contributor
        w += rule_writes(regs, 1, Rule.for_group(2, contributors=g2, results=allp, base=2, count_log2=0))
        for p in range(P):
            w += mac_writes(regs, p, MacEntry(host_mac(p), p))
        return w + slot_clear_writes(regs, 0, 3)

    def contribution(port, seq, values, group=1, op=proto.ReduceOp.SUM, flags=0):
        values = np.asarray(values, dtype=">i4")
        hdr = proto.CaisHeader(group_id=group, chunk_id=seq, seq_num=seq, total_chunks=4,
                               payload_len=values.nbytes, red_op=op, flags=flags)
        return TxFrame(proto.build_frame(hdr, values.tobytes(), src=host_mac(port), pad=True))

    def rand(n):
        return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)

    n_full = params.max_payload // 4
    cases = []

    def case(name, *batches):
        cases.append(Case(name, setup(), [list(b) for b in batches]))

    # basic reduction, one operator each, full-size payloads from every port at once
    for op in proto.ReduceOp:
        case(f"basic_{op.name.lower()}", [(p, contribution(p, 0, rand(n_full), op=op)) for p in range(P)])
    # wrap-around of the int32 sum, hand-built: INT32_MAX + 1 + ... wraps to INT32_MIN + ...
    case("sum_wraps", [(p, contribution(p, 1, [2**31 - 1 if p == 0 else 1, -2**31, 7])) for p in range(P)])
    # back-to-back single-beat payloads from every port to the same set (read-modify-write hazard)
    case("back_to_back_same_set", [(p, contribution(p, 0, rand(2))) for p in range(P)],
         [(p, contribution(p, 2, rand(2))) for p in range(P)])
    # a repeated contribution to an incomplete set adds nothing
    vals = [rand(16) for _ in range(P)]
    case("repeat_ignored",
         [(0, contribution(0, 0, vals[0]))],
         [(0, contribution(0, 0, vals[0], flags=int(proto.Flags.RETRANSMIT)))],
         [(p, contribution(p, 0, vals[p])) for p in range(1, P)])
    # a late repeat after completion is answered to that port only
    case("late_repeat_answered",
         [(p, contribution(p, 0, vals[p])) for p in range(P)],
         [(1, contribution(1, 0, vals[1], flags=int(proto.Flags.RETRANSMIT)))])
    # both shadow sets of a slot in flight at once (seq 0 -> set 0, seq 2 -> set 1)
    case("both_sets_in_flight",
         [(0, contribution(0, 0, vals[0])), (1, contribution(1, 2, vals[1]))],
         [(p, contribution(p, 0, vals[p])) for p in range(1, P)]
         + [(p, contribution(p, 2, vals[p])) for p in range(P) if p != 1])
    # slot reuse: seq 0 (set 0), then seq 2 (set 1) acknowledges it, then seq 4 reuses set 0
    case("slot_reuse",
         [(p, contribution(p, 0, vals[p])) for p in range(P)],
         [(p, contribution(p, 2, vals[p])) for p in range(P)],
         [(p, contribution(p, 4, vals[(p + 1) % P])) for p in range(P)])
    # slot reuse with a late repeat for the acknowledged chunk: the repeat finds another tag
    case("reuse_then_stale_repeat",
         [(p, contribution(p, 0, vals[p])) for p in range(P)],
         [(p, contribution(p, 2, vals[p])) for p in range(P)],
         [(p, contribution(p, 4, vals[p])) for p in range(P - 1)],
         [(P - 1, contribution(P - 1, 0, vals[P - 1]))],
         [(P - 1, contribution(P - 1, 4, vals[P - 1]))])
    # foreign port: the last port is not a contributor of group 2
    case("foreign_port_rejected",
         [(P - 1, contribution(P - 1, 0, vals[0], group=2))],
         [(p, contribution(p, 0, vals[p], group=2)) for p in range(P) if g2 >> p & 1])
    # tag mismatch: set 0 of slot 0 busy with seq 0; seq 4 maps to the same set
    case("tag_mismatch_rejected",
         [(0, contribution(0, 0, vals[0]))],
         [(1, contribution(1, 4, vals[1]))],
         [(p, contribution(p, 0, vals[p])) for p in range(1, P)])
    # one-worker group completes on its own contribution
    one = Case("one_worker_group", rule_writes(regs, 0, Rule.for_group(5, contributors=1, results=1, base=0)),
               [[(0, contribution(0, 0, vals[0], group=5))]])
    cases.append(one)
    # ordinary frames forwarded unchanged: known unicast, unknown unicast, broadcast, to itself
    def eth(port, dst, length):
        return TxFrame(proto.EthHeader(dst, host_mac(port), 0x0800).pack()
                       + bytes(rng.integers(0, 256, length - 14, dtype=np.uint8)))
    case("ordinary_forwarded",
         [(0, eth(0, host_mac(1 % P), 60)), (1, eth(1, 0x02_00_00_00_77_77, 200)),
          (P - 1, eth(P - 1, proto.BROADCAST_MAC, params.max_frame)), (0, eth(0, host_mac(0), 64))])
    # the malformed-frame catalogue, each followed by a good frame that must pass
    good = lambda p, seq: contribution(p, seq, vals[p][:4])
    hdr = proto.CaisHeader(group_id=1, seq_num=1, payload_len=16)
    body = bytes(16)
    bad = {
        "bad_framing": TxFrame(proto.build_frame(hdr, body)[:-1], bad_keep=True),
        "oversize": TxFrame(proto.EthHeader(0xFFFFFFFFFFFF, 1, 0x0800).pack() + bytes(params.max_frame - 13)),
        "runt": TxFrame(bytes(13)),
        "runt_cais": TxFrame(proto.build_frame(hdr, body)[:29]),
        "bad_op": TxFrame(proto.build_frame(hdr.replace(op_type=proto.OpType.REDUCE_SCATTER), body)),
        "bad_dtype": TxFrame(proto.build_frame(hdr.replace(dtype=15), body)),
        "bad_red_op": TxFrame(proto.build_frame(hdr.replace(red_op=9), body)),
        "bad_flags": TxFrame(proto.build_frame(hdr.replace(flags=0x80), body)),
        "zero_payload": TxFrame(proto.build_frame(hdr.replace(payload_len=0), b"", pad=True)),
        "payload_over_max": TxFrame(proto.build_frame(hdr.replace(payload_len=params.max_payload + 4),
                                                      bytes(params.max_payload + 4))),
        "partial_element": TxFrame(proto.build_frame(hdr.replace(payload_len=15), bytes(15))),
        "truncated": TxFrame(proto.build_frame(hdr, body)[:-4]),
        "too_long": TxFrame(proto.build_frame(hdr, body + bytes(4))),
        "no_rule": TxFrame(proto.build_frame(hdr.replace(group_id=77), body)),
    }
    for name, frame in bad.items():
        case(f"malformed_{name}", [(0, frame)], [(0, good(0, 1))],
             [(p, good(p, 1)) for p in range(1, P)])
    bad_slot = Case("malformed_bad_slot",
                    rule_writes(regs, 0, Rule.for_group(1, contributors=allp, results=allp,
                                                       base=params.slots - 1, count_log2=1)),
                    [[(0, contribution(0, 1, vals[0]))], [(0, contribution(0, 0, vals[0]))]])
    cases.append(bad_slot)
    # all-gather and broadcast: forwarded to the result ports except the sender
    ag = proto.CaisHeader(op_type=proto.OpType.ALL_GATHER, group_id=1, seq_num=9, payload_len=32)
    bc = proto.CaisHeader(op_type=proto.OpType.BROADCAST, group_id=1, seq_num=10, payload_len=64)
    case("allgather_broadcast_forwarded",
         [(0, TxFrame(proto.build_frame(ag, bytes(range(32)), src=host_mac(0)))),
          (1, TxFrame(proto.build_frame(bc, bytes(range(64)), src=host_mac(1))))])
    # SLOT_CLEAR empties a half-filled set: the next contribution starts it afresh
    cases.append(Case("slot_clear", setup(), [
        [(0, contribution(0, 0, vals[0]))],
        [(p, contribution(p, 0, vals[p])) for p in range(P)],
    ], writes_before={1: slot_clear_writes(regs, 0, 1)}))
    return cases


def accounting_problems(counters: dict) -> list[str]:
    """The accounting invariant of docs/protocol.md section 8 (no frame in flight)."""
    rx = sum(counters["RX_FRAMES"]) & 0xFFFF_FFFF
    dropped = sum(v for k, v in counters.items() if k.startswith("DROP_"))
    decided = (counters["FORWARDED"] + counters["CONTRIBUTIONS"] + counters["DUPLICATES"] + dropped) & 0xFFFF_FFFF
    if rx != decided:
        return [f"accounting: sum RX_FRAMES {rx} != FORWARDED + CONTRIBUTIONS + DUPLICATES + DROP_* {decided}"]
    return []


def counter_problems(got: dict, want: dict) -> list[str]:
    return [f"counter {name}: switch {got.get(name)}, model {value}"
            for name, value in want.items() if got.get(name) != value]


async def score_case(harness, params: SwitchParams, case: Case) -> list[str]:
    """Run a directed case on a harness and score it against the reference model, batch by batch.

    The harness (the amaranth.sim ``SwitchSim`` or the cocotb ``TB``) offers async ``apply(writes)``,
    ``write(addr, value)``, ``send(port, frame)`` (sync is accepted too), ``drain()`` and ``counters()``,
    and ``rx``: the frames received per port so far; optionally ``context(expected, got)`` lines that
    explain a mismatch. Returns the problems found (empty: the case passed).
    """
    model = SwitchModel(params)
    problems: list[str] = []
    await harness.apply(case.writes)
    for addr, value in case.writes:
        model.write(addr, value)
    for i, batch in enumerate(case.batches):
        for addr, value in case.writes_before.get(i, []):
            await harness.write(addr, value)
            model.write(addr, value)
        expected: list[list[bytes]] = [[] for _ in range(params.ports)]
        before = [len(rx) for rx in harness.rx]
        for port, frame in batch:
            sent = harness.send(port, frame)
            if hasattr(sent, "__await__"):
                await sent
            for out_port, data in model.receive(port, frame.data, framing_ok=not frame.bad_keep):
                expected[out_port].append(data)
        await harness.drain()
        got = [rx[n:] for rx, n in zip(harness.rx, before)]
        batch_problems = compare(expected, got)
        if batch_problems and hasattr(harness, "context"):
            batch_problems += harness.context(expected, got)
        problems += [f"batch {i}: {p}" for p in batch_problems]
    counters = await harness.counters()
    problems += counter_problems(counters, model.counters())
    problems += accounting_problems(counters)
    return problems
