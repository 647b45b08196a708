"""The directed protocol cases, as data, shared by the amaranth.sim and the cocotb testbenches.

A case programs the switch and then sends batches of frames; every frame of a batch is sent at once
(on its port), and the batch drains before the next starts. Within a batch the outcome must not depend
on how the switch interleaves ports, so the reference model can replay it in order and the frames out
of each port are compared as multisets, batch by batch, and the counters at the end.

Reductions whose result depends on the order of the contributions (float sums, saturating integer sums,
float MAX/MIN of -0 and +0) send one contribution per batch, so the order is fixed; such a case usually
sends a second chunk with the same contributions in the opposite port order. Every case exists for every
parameter set (the tests pick cases by name): on a switch without float units its float frames are
simply dropped as BAD_CODE, which the model predicts as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cais import numerics
from cais import protocol as proto
from cais.allreduce import CollectiveKind
from cais.numerics import FLOAT_FORMATS
from cais.params import SwitchParams
from cais.registers import register_map
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

from .refmodel import SwitchModel
from .traffic import TxFrame, chunk_values, compare, host_mac

__all__ = ["Case", "directed_cases", "score_case", "accounting_problems", "counter_problems", "float_bits"]

DT, OP = proto.DType, proto.ReduceOp

# Per float format, two non-canonical NaNs (a negative signalling NaN and a positive one with a payload)
# that the switch must turn into its canonical quiet NaN.
_ODD_NANS = {DT.FP32: (0xFF80_0001, 0x7FA1_2345), DT.FP16: (0xFC01, 0x7E55), DT.BF16: (0xFF81, 0x7FC5)}


def float_bits(dtype: proto.DType, values) -> np.ndarray:
    """Python floats, each exactly representable in ``dtype``, as the format's bit patterns."""
    v = np.asarray(values, dtype=np.float64)
    if dtype == DT.FP32:
        out = v.astype(np.float32)
        bits = out.view(np.uint32)
    elif dtype == DT.FP16:
        out = v.astype(np.float16)
        bits = out.view(np.uint16)
    else:
        out = v.astype(np.float32)
        wide = out.view(np.uint32)
        assert not (wide & 0xFFFF).any(), "not a bfloat16 value"
        bits = (wide >> 16).astype(np.uint16)
    back = out.astype(np.float64)
    assert np.array_equal(back[~np.isnan(v)], v[~np.isnan(v)]), "value not exact in the format"
    return bits


def _wire(dtype: proto.DType, bits: np.ndarray) -> bytes:
    bits_type = FLOAT_FORMATS[dtype].bits_type
    return np.asarray(bits, dtype=bits_type).astype(bits_type.newbyteorder(">")).tobytes()


def _columns(cols, ports: int) -> list[list]:
    """Per-element contribution lists ``(values, pad)`` -> one list of values per port (padded/cut)."""
    return [[vals[p] if p < len(vals) else pad for vals, pad in cols] for p in range(ports)]


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

    def setup(**kind):
        """Group 1 (every port; ``kind``: its dtype, red_op, acc_fp32, saturate) and group 2 (int32 SUM)."""
        w = rule_writes(regs, 0, Rule.for_group(1, contributors=allp, results=allp, base=0, count_log2=COUNT_LOG2,
                                                **kind))
        # group 2: ports 0 and 1 contribute (port 0 alone on a 2-port switch), everyone gets the result;
        # the last port is never a contributor
        w += rule_writes(regs, 1, Rule.for_group(2, contributors=g2, results=allp, base=2, count_log2=0))
        for p in range(P):
            w += mac_writes(regs, p, MacEntry(host_mac(p), p))
        return w + slot_clear_writes(regs, 0, 3)

    def contribution(port, seq, values=None, group=1, op=OP.SUM, flags=0, dtype=DT.INT32, payload=None,
                     op_type=proto.OpType.ALL_REDUCE):
        """A frame from ``port``: ``values`` (native values of ``dtype``) or raw ``payload`` bytes."""
        if payload is None:
            payload = numerics.encode(dtype, np.asarray(values))
        hdr = proto.CaisHeader(op_type=op_type, group_id=group, chunk_id=seq & 0xFFFF, seq_num=seq, total_chunks=4,
                               payload_len=len(payload), dtype=dtype, red_op=op, flags=flags)
        return TxFrame(proto.build_frame(hdr, payload, src=host_mac(port), pad=True))

    def rand(n):
        return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)

    n_full = params.max_payload // 4
    cases = []

    def case(name, *batches):
        cases.append(Case(name, setup(), [list(b) for b in batches]))

    # basic reduction, one operator each, full-size payloads from every port at once
    for op in proto.ReduceOp:
        cases.append(Case(f"basic_{op.name.lower()}", setup(red_op=op),
                          [[(p, contribution(p, 0, rand(n_full), op=op)) for p in range(P)]]))
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
         # set 0 completes before the rest of set 1 arrives: were set 1 to complete first, its
         # completion would acknowledge seq 0 for everyone and retire set 0 without a result
         [(p, contribution(p, 0, vals[p])) for p in range(1, P)],
         [(p, contribution(p, 2, vals[p])) for p in range(P) if p != 1])
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
    # a copy of port 0's seq 0 that the network kept back arrives after port 0 moved on to seq 2 (the
    # other set of the slot): it gets the stored result, but acknowledges nothing, so port 0's seq 2
    # still counts and the set completes with the others' seq 2 (no repeat of port 0 needed)
    case("stale_copy_after_next_chunk",
         [(p, contribution(p, 0, vals[p])) for p in range(P)],
         [(0, contribution(0, 2, vals[1]))],
         [(0, contribution(0, 0, vals[0]))],
         [(p, contribution(p, 2, vals[(p + 1) % P])) for p in range(1, P)])
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
        # a frame that would aggregate (and an ordinary one that would be forwarded), but the MAC saw its
        # FCS fail: dropped, and the good contribution after it is still the chunk's first
        "bad_fcs": TxFrame(good(0, 1).data, bad_fcs=True),
        "bad_fcs_ordinary": TxFrame(eth(0, proto.BROADCAST_MAC, 100).data, bad_fcs=True),
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
    cases += _binding_cases(params, regs, setup, contribution, eth, vals)
    cases += _docs_cases(params, regs, rng, setup, contribution, eth)
    cases += _typed_cases(params, regs, rng, setup, contribution)
    return cases


def _binding_cases(params: SwitchParams, regs, setup, contribution, eth, vals) -> list[Case]:
    """Source MACs bound to their MAC-table port (SPOOFED_SOURCE), and host frames never flooded under
    MAC_POLICY.host_strict (NO_ROUTE), docs/protocol.md sections 4 and 5."""
    P = params.ports
    last = P - 1

    def spoof(frame: TxFrame, src: int) -> TxFrame:
        return TxFrame(frame.data[:6] + src.to_bytes(6, "big") + frame.data[12:])

    def host(port, dst, src=None):
        hdr = proto.HostHeader(kind=proto.HostKind.DATA, group_id=1, op_seq=3, step=0, frag=0, frags=1, length=8)
        return TxFrame(proto.build_host_frame(hdr, bytes(range(8)), dst=dst, src=host_mac(port) if src is None else src))

    unknown = 0x02_00_00_00_77_77
    strict = [(regs["MAC_POLICY"].address(), regs["MAC_POLICY"].pack(host_strict=1))]
    return [
        # From port 1 (a contributor of group 1) a contribution, a host frame and an ordinary frame that
        # claim port 0's host; from the last port an all-gather frame that does: each dropped as
        # SPOOFED_SOURCE (before NO_RULE, FOREIGN_PORT, routing). Port 0's own address from port 0 and an
        # address in no entry pass. Then the real contributions: the sum has nothing of the forgery.
        Case("spoofed_source_dropped", setup(), [
            [(1, spoof(contribution(1, 0, vals[0]), host_mac(0))),
             (1, host(1, host_mac(last), src=host_mac(0))),
             (1, spoof(eth(1, host_mac(last), 64), host_mac(0))),
             (last, spoof(TxFrame(proto.build_frame(
                 proto.CaisHeader(op_type=proto.OpType.ALL_GATHER, group_id=1, seq_num=9, payload_len=32),
                 bytes(32))), host_mac(0))),
             (0, host(0, host_mac(1))),
             (last, spoof(eth(last, host_mac(0), 80), unknown))],
            [(p, contribution(p, 0, vals[p])) for p in range(P)],
        ]),
        # Host frames under host_strict: to an address in no entry and to broadcast dropped (NO_ROUTE), to
        # a known host forwarded; an ordinary frame to an unknown address is still flooded.
        Case("host_frames_not_flooded", setup() + strict, [
            [(0, host(0, unknown)), (1, host(1, proto.BROADCAST_MAC)), (last, host(last, host_mac(0))),
             (0, eth(0, unknown, 70))],
        ]),
        # ... and without it (the reset value) host frames are flooded like any ordinary frame.
        Case("host_frames_flooded_after_reset", setup(), [
            [(0, host(0, unknown)), (1, host(1, proto.BROADCAST_MAC))],
        ]),
    ]


def _docs_cases(params: SwitchParams, regs, rng, setup, contribution, eth) -> list[Case]:
    """Cases written from docs/protocol.md for the disagreements a docs-only testbench found (issue 8):
    frames forwarded right after a reproducible fold go out unchanged; a quota of up to 2**31 slots maps
    seq_num at full width (BAD_SLOT past the slot memory, never a wrapped slot); Ethernet pad bytes never
    reach a result, and a chunk's contributions must share its payload_len (LENGTH_MISMATCH)."""
    P = params.ports
    allp = (1 << P) - 1
    cases: list[Case] = []
    vals = [rand32(rng, 4) for _ in range(P)]

    # ---------------------------------------------------------------- forwarding beside a fold
    # Every port completes a set and then sends a broadcast, an all-gather and an ordinary frame: they are
    # forwarded while the completed set's rows are read and folded.
    def ag(port, seq, n, op_type=proto.OpType.ALL_GATHER):
        return contribution(port, seq, payload=bytes(rng.integers(0, 256, n, dtype=np.uint8)), op_type=op_type)
    repro = [rand32(rng, params.max_payload // 4) for _ in range(P)]
    follow = lambda p, seq: [(p, ag(p, seq, 4, proto.OpType.BROADCAST)), (p, ag(p, seq + 1, 64)),  # noqa: E731
                             (p, eth(p, proto.BROADCAST_MAC, 60)), (p, eth(p, host_mac((p + 1) % P), 200))]
    cases.append(Case("reproducible_fold_then_forward", setup(reproducible=True), [
        [(p, contribution(p, 0, repro[p])) for p in range(P)]
        + [f for p in range(P) for f in follow(p, 20)],
        [(p, contribution(p, 1, repro[(p + 1) % P][:1])) for p in range(P)]
        + [f for p in range(P) for f in follow(p, 30)],
    ]))

    # ---------------------------------------------------------------- quotas of 2**17 .. 2**31 slots
    # Rule 0: group 1, count_log2 17; rule 1: group 2 (int32 SUM, ports 0 and 1) in slot 3; rule 2: group 3,
    # count_log2 31. seq 65539 = 2**16 + 3 (group 1) and 2**30 + 3 (group 3) map to slots 65539 and 2**30 + 3:
    # BAD_SLOT, and group 2's set in slot 3 must not notice (it would, were the offset cut to 16 bits).
    # Group 3's seq 5 is slot 5, set 0, and seq 2**31 + 5 is slot 5 again, set 1.
    g2 = 0b11 if P > 2 else 0b01
    w = rule_writes(regs, 0, Rule.for_group(1, contributors=allp, results=allp, base=0, count_log2=17))
    w += rule_writes(regs, 1, Rule.for_group(2, contributors=g2, results=allp, base=3, count_log2=0))
    w += rule_writes(regs, 2, Rule.for_group(3, contributors=allp, results=allp, base=0, count_log2=31))
    w += slot_clear_writes(regs, 0, min(params.slots, 6))
    if params.slots > 5 and params.rules >= 3:
        cases.append(Case("quota_offsets_full_width", w, [
            [(0, contribution(0, 0, vals[0], group=2))],
            [(p, contribution(p, 65539, vals[p])) for p in range(P)]
            + [(p, contribution(p, (1 << 30) + 3, vals[p], group=3)) for p in range(P)]
            + [(p, contribution(p, (1 << 20) + 6, vals[p], group=3)) for p in range(P)],
            [(p, contribution(p, 0, vals[p], group=2)) for p in range(1, P) if g2 >> p & 1]
            + [(p, contribution(p, 5, vals[p], group=3)) for p in range(P)],
            [(p, contribution(p, (1 << 31) + 5, vals[(p + 1) % P], group=3)) for p in range(P)],
        ]))

    # ---------------------------------------------------------------- padding and payload lengths
    # One-element contributions padded to 60 bytes with non-zero pad bytes (a different pattern per port):
    # the result is the sum of the elements alone. Then the chunk's payload_len is fixed by its first
    # contribution: a longer or shorter frame of the chunk, before or after completion, is LENGTH_MISMATCH.
    def padded(port, seq, values, pad):
        frame = contribution(port, seq, values).data
        body = frame[:proto.HEADERS_BYTES + 4 * len(values)]
        return TxFrame(body + bytes([pad]) * (proto.MIN_FRAME_BYTES - len(body)))
    cases.append(Case("padding_and_lengths", setup(), [
        [(p, padded(p, 0, [p + 1], 0xAB + p)) for p in range(P)],
        [(0, padded(0, 1, [7], 0xAB))],
        [(1 % P, contribution(1 % P, 1, [7, 7, 7]))],                  # longer: LENGTH_MISMATCH
        [(p, padded(p, 1, [-p], 0xFF)) for p in range(1, P)],
        [(0, contribution(0, 1, [7, 7, 7, 7, 7, 7, 7, 7]))],           # a longer repeat: no resend
        [(0, padded(0, 1, [7], 0x00))],                                 # the repeat: resent to port 0
        [(0, contribution(0, 2, vals[0]))],
        [(1 % P, padded(1 % P, 2, [1], 0xAB))],                         # shorter: LENGTH_MISMATCH
        [(p, contribution(p, 2, vals[p])) for p in range(1, P)],
    ]))
    return cases


def _typed_cases(params: SwitchParams, regs, rng, setup, contribution) -> list[Case]:
    """The cases of the element types: rule types (TYPE_MISMATCH, full-size sets for every kind), float sums with
    special values, narrow integer sums (wrap and saturate), float MAX/MIN of signed zeros."""
    P = params.ports
    allp = (1 << P) - 1
    g2 = 0b11 if P > 2 else 0b01
    cases: list[Case] = []

    def ordered(seq, groups_values, order=None):
        """One batch per port (``order``: the ports in sending order): port p's frames for each group."""
        order = range(P) if order is None else order
        return [[(p, contribution(p, seq, group=g, **kw_of(p))) for g, kw_of in groups_values] for p in order]

    def int_rand(dtype, n):
        info = np.iinfo(numerics.native_dtype(dtype))
        return rng.integers(info.min, info.max + 1, n, dtype=np.int64)

    def float_rand(dtype, n):
        """Random finite values of the format: random signs, exponents over the whole range."""
        f = FLOAT_FORMATS[dtype]
        bits = rng.integers(0, 1 << f.width, n, dtype=np.int64)
        bits = np.where(bits & f.exp_mask == f.exp_mask, bits ^ (f.exp_mask >> 1 & f.exp_mask), bits)
        return bits.astype(f.bits_type)

    # ---------------------------------------------------------------- TYPE_MISMATCH
    # The dtype of an all-reduce frame differs from its rule's (int32 SUM). It changes nothing: port 1's
    # mismatched frame for seq 0 does not acknowledge seq 2 (set 1 keeps port 1's bit: SLOTS_IN_USE is 2 at
    # the end); it is checked after FOREIGN_PORT and before TAG_MISMATCH and BAD_SLOT; all-gather frames are
    # not type-checked.
    i16 = dict(dtype=DT.INT16, values=np.arange(8, dtype=np.int16))
    bad_slot_rule = (rule_writes(regs, 2, Rule.for_group(3, contributors=allp, results=allp, base=params.slots))
                     if params.rules > 2 else [])
    cases.append(Case("type_mismatch_dtype", setup() + bad_slot_rule, [
        [(p, contribution(p, 2, rand32(rng, 4))) for p in range(P)],
        [(1, contribution(1, 0, **i16))],
        [(p, contribution(p, 0, rand32(rng, 4))) for p in range(P) if p != 1],
        [(0, contribution(0, 4, dtype=DT.INT8, values=np.arange(16, dtype=np.int8))),   # else TAG_MISMATCH
         (0, contribution(0, 0, group=3, **i16)),                                      # else BAD_SLOT
         (1, contribution(1, 0, rand32(rng, 4), group=3)),                             # BAD_SLOT
         (P - 1, contribution(P - 1, 0, group=2, **i16)),                              # FOREIGN_PORT first
         (0, contribution(0, 9, op_type=proto.OpType.ALL_GATHER, **i16)),               # forwarded
         (1, contribution(1, 0, dtype=DT.FP32, values=np.ones(4, np.float32)))],        # BAD_CODE w/o floats
    ]))
    # The red_op differs from the rule's (int32 MAX): before the duplicate check and the re-sent result.
    vals = [rand32(rng, 8) for _ in range(P)]
    cases.append(Case("type_mismatch_red_op", setup(red_op=OP.MAX), [
        [(0, contribution(0, 0, vals[0], op=OP.MAX))],
        [(1, contribution(1, 0, vals[1], op=OP.SUM)), (0, contribution(0, 0, vals[0], op=OP.MIN))],
        [(p, contribution(p, 0, vals[p], op=OP.MAX)) for p in range(1, P)],
        [(1, contribution(1, 0, vals[1], op=OP.MIN, flags=int(proto.Flags.RETRANSMIT))),
         (0, contribution(0, 0, vals[0], op=OP.MAX, flags=int(proto.Flags.RETRANSMIT)))],   # resent
    ]))

    # ---------------------------------------------------------------- capacities
    # Every kind of rule takes max_payload bytes (fp16/bf16 accumulated in fp32 included: the binary32
    # accumulators live in the fold chain, the banks hold the wire format).
    half, full = params.max_payload // 2, params.max_payload
    def fp16(nbytes):
        return dict(dtype=DT.FP16, payload=_wire(DT.FP16, float_rand(DT.FP16, nbytes // 2)))
    def bf16(nbytes):
        return dict(dtype=DT.BF16, payload=_wire(DT.BF16, float_rand(DT.BF16, nbytes // 2)))
    rules = [Rule.for_group(1, allp, allp, base=0, count_log2=1, dtype=DT.FP16, acc_fp32=True),
             Rule.for_group(2, g2, allp, base=2, dtype=DT.BF16, acc_fp32=True),
             Rule.for_group(3, allp, allp, base=3, dtype=DT.FP16),                    # wire: no limit
             Rule.for_group(4, allp, allp, base=4, dtype=DT.FP32, acc_fp32=True),     # acc_fp32: no effect
             Rule.for_group(5, allp, allp, base=params.slots, dtype=DT.FP16, acc_fp32=True)]
    w = [wr for i, r in enumerate(rules[:params.rules]) for wr in rule_writes(regs, i, r)]  # (NO_RULE beyond)
    w += slot_clear_writes(regs, 0, 5)
    # the accepted chunks come from every port at once: values whose sums do not depend on the order
    def exact(dtype, nbytes, acc=False):
        vals = chunk_values(np.random.default_rng(int(rng.integers(1 << 32))), CollectiveKind(dtype, OP.SUM, acc), P,
                            nbytes // ELEM[dtype])
        return [dict(dtype=dtype, payload=numerics.encode(dtype, v)) for v in vals]
    fp32_full = [d["payload"] for d in exact(DT.FP32, full)]
    fp16_full = exact(DT.FP16, full)
    fp16_half = exact(DT.FP16, half, True)
    cases.append(Case("payload_too_long", w, [
        [(0, contribution(0, 0, **fp16(half + 2))),
         (0, contribution(0, 0, group=2, **bf16(full))),
         (1, contribution(1, 0, dtype=DT.INT16, payload=bytes(full))),            # TYPE_MISMATCH first
         (P - 1, contribution(P - 1, 0, group=2, **bf16(half + 2))),              # FOREIGN_PORT first
         (1, contribution(1, 0, group=5, **fp16(half + 2))),                      # before BAD_SLOT
         (1, contribution(1, 1, group=5, **fp16(half)))],                         # BAD_SLOT
        [(p, contribution(p, 0, **fp16_half[p])) for p in range(P)]
        + [(p, contribution(p, 0, group=3, **fp16_full[p])) for p in range(P)]
        + [(p, contribution(p, 0, group=4, dtype=DT.FP32, payload=fp32_full[p])) for p in range(P)]
        + [(0, contribution(0, 0, group=2, **bf16(half)))],
        [(0, contribution(0, 4, **fp16(half + 2)))],                              # before TAG_MISMATCH
        [(0, contribution(0, 4, **fp16(half)))],                                  # TAG_MISMATCH
    ]))

    # ---------------------------------------------------------------- float sums
    for dtype, acc in ((DT.FP32, False), (DT.FP16, False), (DT.FP16, True), (DT.BF16, False), (DT.BF16, True)):
        f = FLOAT_FORMATS[dtype]
        m, tiny, mn, mx = f.m, f.tiny, f.min_normal, f.max
        inf, nan = float("inf"), float("nan")
        big = 2.0 ** m                      # 2**m + 1 is a tie (ulp 2 there)
        cols = [                             # (contributions in port order, value of the further ports)
            ([inf, 1.0], 1.0), ([inf, -inf], 1.0), ([-inf, -mx], -1.0),
            ([nan, 1.0], 1.0), ([1.0, nan], 0.0), ([nan, nan], nan),
            ([-0.0, -0.0], -0.0), ([-0.0, 0.0], -0.0), ([0.0, -0.0], -0.0), ([1.5, -1.5], 0.0),
            ([tiny, tiny], tiny), ([-tiny, tiny], -0.0), ([mn - tiny, tiny], 0.0), ([mn, -tiny], 0.0),
            ([mx, mx], 0.0), ([-mx, -mx], 0.0), ([mx, 2.0 ** (f.emax - m)], 0.0),     # overflow, tie to inf
            ([big, 1.0], 1.0), ([big + 2, 1.0], 0.0), ([1.0, big], 1.0),                 # ties to even
            ([big, 1.0, -big, 1.0], 0.0), ([1.0 + 2.0 ** (1 - m), -1.0], 0.0), ([1.0, tiny], tiny),
            ([2.0 ** f.emax, tiny, -2.0 ** f.emax, tiny], 0.0),     # order-dependent in fp32 too
        ]
        per_port = _columns(cols, P)
        nan_slots = [(i, p) for i, (vals, pad) in enumerate(cols) for p in range(P)
                     if np.isnan(vals[p] if p < len(vals) else pad)]
        n = (half if acc else full) // ELEM[dtype]
        payloads = []
        for p in range(P):
            bits = float_bits(dtype, per_port[p])
            for k, (i, q) in enumerate(nan_slots):
                if q == p:
                    bits[i] = _ODD_NANS[dtype][k % 2]          # non-canonical NaNs in
            bits = np.concatenate([bits, float_rand(dtype, n - len(bits))])
            payloads.append(_wire(dtype, bits))
        name = f"float_sum_{dtype.name.lower()}" + ("_acc32" if acc else "")
        kw = lambda p: dict(dtype=dtype, payload=payloads[p])
        cases.append(Case(name, setup(dtype=dtype, acc_fp32=acc),
                          ordered(0, [(1, kw)]) + ordered(1, [(1, kw)], order=range(P - 1, -1, -1))))

    # ---------------------------------------------------------------- narrow integer sums
    # docs/numerics.md: the 4-bit sequence 7 - 5 + 5 + 5 - 3 - 7 scaled to the type overflows after its
    # fourth term; wrap gets the true sum back, saturate does not. Group 1 wraps, group 3 saturates; the
    # same contributions in port order (seq 0) and in the opposite order (seq 1).
    seq4 = [([7, -5, 5, 5, -3, -7], 0), ([7, 5, -5, -7], 0), ([-8, -1, 1], 0), ([7, 1, -1], 0),
            ([-8, -8, 7, 7], 0), ([7, 7], 7), ([-8, -8], -8), ([-1, 1], 0)]
    for dtype in (DT.INT16, DT.INT8):
        bits = 8 * ELEM[dtype]
        scale = 1 << (bits - 4)
        n = full // ELEM[dtype]
        per_port = [np.concatenate([np.array(v, dtype=np.int64) * scale, int_rand(dtype, n - len(v))])
                    for v in _columns(seq4, P)]
        w = rule_writes(regs, 0, Rule.for_group(1, allp, allp, base=0, count_log2=1, dtype=dtype))
        w += rule_writes(regs, 1, Rule.for_group(3, allp, allp, base=2, count_log2=1, dtype=dtype, saturate=True))
        w += slot_clear_writes(regs, 0, 4)
        kw = lambda p, dtype=dtype, per_port=per_port: dict(dtype=dtype, values=per_port[p])
        cases.append(Case(f"{dtype.name.lower()}_sum_wrap_saturate", w,
                          ordered(0, [(1, kw), (3, kw)])
                          + ordered(1, [(1, kw), (3, kw)], order=range(P - 1, -1, -1))))
    # int16 and int8 MAX and MIN (signed), full payloads with the extremes, every port at once
    w, batch = [], []
    for i, (dtype, op) in enumerate((d, o) for d in (DT.INT16, DT.INT8) for o in (OP.MAX, OP.MIN)):
        if i < params.rules:                    # (a switch with fewer rules: NO_RULE for the others)
            w += rule_writes(regs, i, Rule.for_group(10 + i, allp, allp, base=i, dtype=dtype, red_op=op))
        info = np.iinfo(np.int16 if dtype == DT.INT16 else np.int8)
        for p in range(P):
            v = int_rand(dtype, full // ELEM[dtype])
            v[:4] = [info.min, info.max, -1, 0][p % 4:] + [info.min, info.max, -1, 0][:p % 4]
            batch.append((p, contribution(p, 0, v, group=10 + i, op=op, dtype=dtype)))
    cases.append(Case("narrow_int_max_min", w + slot_clear_writes(regs, 0, 4), [batch]))

    # ---------------------------------------------------------------- reproducible rules
    # Every rule folds the contributions in ascending port order when the set completes, so two chunks with
    # the same contributions arriving in different orders give the same bits (here with reproducible=True,
    # the driver's request for it, which must change nothing).
    scrambled = [list(range(P))[::-1], [p for p in range(P) if p % 2] + [p for p in range(P) if not p % 2]]
    kinds = [(DT.FP32, False, False), (DT.FP16, True, False), (DT.INT8, False, True)][:params.rules]
    w, per_group = [], []
    for i, (dtype, acc, sat) in enumerate(kinds):
        w += rule_writes(regs, i, Rule.for_group(30 + i, allp, allp, base=i, count_log2=0, dtype=dtype,
                                                 acc_fp32=acc, saturate=sat, reproducible=True))
        # elements per frame: a set holds max_payload bytes for every kind of rule
        cap = params.max_payload // ELEM[dtype]
        n = max(cap, 1)
        if dtype == DT.INT8:     # the 4-bit sequence of docs/numerics.md, x16, then random values
            seq4 = _columns([([7, -5, 5, 5, -3, -7], 0), ([7, 5, -5, -7], 0), ([-8, -1, 1], 0)], P)
            vals = [np.concatenate([np.array(v) * 16, int_rand(dtype, max(0, n - len(v)))]).astype(np.int8)
                    for v in seq4]
        else:
            f = FLOAT_FORMATS[dtype]
            big = 2.0 ** f.m
            cols = _columns([([1.0, big, 1.0, -big], 1.0), ([big, 1.0, -big, 1.0], 0.0),
                             ([-0.0, 0.0], -0.0), ([2.0 ** f.emax, f.tiny, -2.0 ** f.emax], 0.0)], P)
            vals = [np.concatenate([float_bits(dtype, c), float_rand(dtype, max(0, n - len(c)))]) for c in cols]
            vals = [v.view(numerics.native_dtype(dtype)) for v in vals]
        per_group.append((30 + i, dtype, [v[:n] for v in vals], cap))
    batches = []
    for seq, order in enumerate(scrambled):
        for p in order:
            batches.append([(p, contribution(p, seq, vals[p], group=g, dtype=dtype))
                            for g, dtype, vals, _ in per_group])
    too_long = [(0, contribution(0, 2, np.zeros(cap + 1, dtype=numerics.native_dtype(dtype)), group=g, dtype=dtype))
                for g, dtype, _, cap in per_group]
    cases.append(Case("reproducible_fold", w + slot_clear_writes(regs, 0, len(kinds)), batches + [too_long]))

    # ---------------------------------------------------------------- float MAX / MIN and signed zeros
    # numpy's tie rule for -0 / +0 (docs/numerics.md section 4): float32 (and bf16, and fp16 in fp32)
    # return the incoming value, float16 the stored one; so the order of arrival decides the sign.
    variants = [(DT.FP32, False), (DT.FP16, False), (DT.FP16, True), (DT.BF16, False), (DT.BF16, True)]
    variants = variants[:params.rules]
    for op in (OP.MAX, OP.MIN):
        w, groups = [], []
        for i, (dtype, acc) in enumerate(variants):
            w += rule_writes(regs, i, Rule.for_group(20 + i, allp, allp, base=i, dtype=dtype, red_op=op,
                                                     acc_fp32=acc))
            f = FLOAT_FORMATS[dtype]
            inf, nan = float("inf"), float("nan")
            cols = [([-0.0, 0.0], 0.0), ([0.0, -0.0], -0.0), ([-0.0, -0.0], -0.0), ([0.0, 0.0], 0.0),
                    ([-0.0, 0.0, -0.0, 0.0], -0.0), ([nan, 1.0], 1.0), ([1.0, nan], 1.0), ([-inf, inf], 0.0),
                    ([f.tiny, -f.tiny], 0.0), ([f.max, inf], 0.0), ([-f.max, -inf], 0.0),
                    ([1.0, 2.0], -1.0)]
            n = len(cols) + 20
            payloads = []
            for p, vals in enumerate(_columns(cols, P)):
                bits = float_bits(dtype, vals)
                bits[np.isnan(vals)] = _ODD_NANS[dtype][p % 2]
                payloads.append(_wire(dtype, np.concatenate([bits, float_rand(dtype, n - len(bits))])))
            groups.append((20 + i, lambda p, dtype=dtype, payloads=payloads, op=op:
                           dict(dtype=dtype, payload=payloads[p], op=op)))
        w += slot_clear_writes(regs, 0, len(variants))
        cases.append(Case(f"float_{op.name.lower()}_zero_ties", w,
                          ordered(0, groups) + ordered(1, groups, order=range(P - 1, -1, -1))))
    return cases


ELEM = proto.ELEMENT_BYTES


def rand32(rng, n):
    return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)


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

    The harness (:class:`cais.sim.suite.LinkHarness` on any link) offers async ``apply(writes)``,
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
            for out_port, data in model.receive(port, frame.data, framing_ok=not frame.bad_keep,
                                                fcs_ok=not frame.bad_fcs):
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
