"""Seeded traffic for the switch testbenches, and the scoreboard that checks what came out.

A :class:`Scenario` is a list of register writes that program the switch and, per port, the frames to
send in order. :func:`random_mix` builds traffic whose outcome does not depend on how the switch
interleaves its ports (each slot set is used by one chunk, ordinary frames are independent), so the
reference model can replay it in any interleaving and must produce the same frames per port and the
same counters. Directed, order-dependent cases are sent one at a time by the tests themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np

from cais import numerics
from cais import protocol as proto
from cais.allreduce import CollectiveKind
from cais.params import SwitchParams
from cais.registers import register_map
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

__all__ = ["Scenario", "TxFrame", "random_mix", "host_mac", "beats_of", "replay", "compare", "rule_kinds",
           "chunk_values"]

DT, OP = proto.DType, proto.ReduceOp


def host_mac(port: int) -> int:
    """The MAC address of the host on a port, in the test topologies."""
    return 0x02_00_00_00_01_00 | port


@dataclass(frozen=True)
class TxFrame:
    data: bytes
    bad_keep: bool = False    # send with a gap in the last beat's tkeep (BAD_FRAMING)
    bad_fcs: bool = False     # send with tuser high on the last beat: the MAC saw a bad FCS (BAD_FCS)


def beats_of(frame: TxFrame, beat_bytes: int) -> list[tuple[int, int, bool]]:
    """(tdata, tkeep, tlast) of each beat, byte 0 in the low bits of tdata.

    A frame sent with `bad_keep` keeps its byte count but moves the last beat's enables up by one
    lane, leaving a gap at lane 0: the number of bytes counted is the same either way.
    """
    data = frame.data
    out = []
    for i in range(0, len(data), beat_bytes):
        chunk = data[i:i + beat_bytes]
        last = i + beat_bytes >= len(data)
        keep = (1 << len(chunk)) - 1
        word = int.from_bytes(chunk, "little")
        if frame.bad_keep and last:
            if len(chunk) == beat_bytes:
                raise ValueError("a bad_keep frame needs a partial last beat")
            keep <<= 1
            word <<= 8
        out.append((word, keep, last))
    return out


@dataclass
class Scenario:
    params: SwitchParams
    writes: list[tuple[int, int]] = field(default_factory=list)
    frames: list[list[TxFrame]] = field(default_factory=list)   # per port, in sending order

    @property
    def total_frames(self) -> int:
        return sum(len(f) for f in self.frames)


def rule_kinds(params: SwitchParams) -> list[CollectiveKind]:
    """Every combination a switch built with ``params`` reduces (saturate only where it matters).

    Built directly, not with :meth:`CollectiveKind.make`: the switch must also honour acc_fp32 on fp16/bf16
    MAX/MIN rules, which make() drops."""
    kinds = []
    for dtype in params.dtypes:
        for op in OP:
            if dtype in (DT.INT16, DT.INT8):
                sats = (False, True) if op == OP.SUM else (False,)
                kinds += [CollectiveKind(dtype, op, saturate=sat) for sat in sats]
            elif dtype in (DT.FP16, DT.BF16):
                kinds += [CollectiveKind(dtype, op, acc_fp32=acc) for acc in (False, True)]
            else:
                kinds.append(CollectiveKind(dtype, op))
    return kinds


def _float_native(dtype: proto.DType, values: np.ndarray) -> np.ndarray:
    """float64 values exact in ``dtype`` -> its native values (bf16 as bits)."""
    if dtype == DT.BF16:
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(np.float32 if dtype == DT.FP32 else np.float16)


def chunk_values(nrng: np.random.Generator, kind: CollectiveKind, contributors: int, n: int) -> list[np.ndarray]:
    """Native values (one array of ``n`` per contributor) whose reduction does not depend on the order in
    which the contributions arrive, so any interleaving of the ports gives the same result.

    * integers, wrap: anything (the sum is modulo 2**bits); MAX/MIN: anything.
    * integers, saturate: each element's contributions share one sign, so the partial sums move one
      way and clamping once is clamping at the end.
    * floats, SUM: small integers times a power of two per element (from the smallest subnormal to near
      the largest value), so every partial sum is exact; sprinkled with +-inf, NaN, columns of -0.
    * floats, MAX/MIN: random finite values of the whole range, +-inf and NaN, but never -0 and +0 in
      the same element (their tie is resolved by the order, docs/numerics.md).
    """
    dtype, op = DT(kind.dtype), OP(kind.op)
    native = numerics.native_dtype(dtype)
    if dtype in proto.INTEGER_DTYPES:
        info = np.iinfo(native)
        v = nrng.integers(info.min, info.max + 1, (contributors, n), dtype=np.int64)
        extremes = nrng.random((contributors, n)) < 0.1
        v = np.where(extremes, nrng.choice([info.min, info.max, -1, 0, 1], (contributors, n)), v)
        if kind.saturate and op == OP.SUM:
            sign = nrng.choice([-1, 1], n)
            v = np.where(sign > 0, np.abs(v).clip(0, info.max), -np.abs(v).clip(0, -info.min))
        return [row.astype(native) for row in v]
    f = numerics.FLOAT_FORMATS[dtype]
    m, exp_mask, bits_type = f.m, f.exp_mask, f.bits_type
    sign = 1 << (f.width - 1)
    if op == OP.SUM:
        bound = max(1, (1 << (m - 1)) // contributors)
        ints = nrng.integers(-bound, bound + 1, (contributors, n)).astype(np.float64)
        exps = nrng.integers(f.etiny, f.emax - m + 1, n)
        exps = np.where(nrng.random(n) < 0.5, nrng.integers(-3, 4, n), exps)   # half of them near 1
        vals = ints * np.exp2(exps.astype(np.float64))
        special = nrng.random(n)
        col = nrng.integers(0, contributors, n)
        rows = np.arange(contributors)[:, None]
        vals = np.where((special < 0.03) & (rows == col), np.inf, vals)
        vals = np.where((special >= 0.03) & (special < 0.05) & (rows == col), -np.inf, vals)
        vals = np.where((special >= 0.05) & (special < 0.07) & (rows == col), np.nan, vals)
        vals = np.where((special >= 0.07) & (special < 0.09), -0.0, vals)
        bits = [_float_native(dtype, row).view(bits_type) for row in vals]
    else:
        raw = nrng.integers(0, 1 << f.width, (contributors, n), dtype=np.int64)
        raw = np.where(raw & exp_mask == exp_mask, raw ^ (exp_mask >> 1 & exp_mask), raw)
        special = nrng.random((contributors, n))
        raw = np.where(special < 0.03, exp_mask, raw)                                   # +inf
        raw = np.where((special >= 0.03) & (special < 0.05), exp_mask | sign, raw)      # -inf
        raw = np.where((special >= 0.05) & (special < 0.07), exp_mask | 1, raw)         # a NaN
        raw = np.where(raw & ~sign == 0, 0, raw)                                       # zeros: +0 ...
        neg_zero = nrng.random(n) < 0.05
        raw = np.where(neg_zero, sign, raw)                                            # ... or a column of -0
        bits = [row.astype(bits_type) for row in raw]
    nan = (exp_mask | sign | 1)                        # a negative signalling NaN: not the canonical one
    bits = [np.where((b & (sign - 1)) > exp_mask, nan, b).astype(bits_type) for b in bits]
    return [b.view(native) for b in bits]


def _cais(rng, hdr: proto.CaisHeader, payload: bytes, port: int, pad: bool = True) -> bytes:
    """A CAIS frame from ``port``; a short one padded to 60 bytes with random pad bytes (which the switch
    must ignore, docs/protocol.md section 4)."""
    frame = proto.build_frame(hdr, payload, dst=proto.BROADCAST_MAC, src=host_mac(port))
    if pad and len(frame) < proto.MIN_FRAME_BYTES:
        frame += bytes(rng.getrandbits(8) for _ in range(proto.MIN_FRAME_BYTES - len(frame)))
    return frame


def random_mix(params: SwitchParams, seed: int, frames_per_port: int = 12) -> Scenario:
    """Random all-reduce chunks on every port, mixed with ordinary, forwarded and malformed frames."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    P = params.ports
    regs = register_map(params)
    scen = Scenario(params, frames=[[] for _ in range(P)])
    allp = (1 << P) - 1

    # Two groups with disjoint quotas: group 1 of all ports, group 2 of the even ports (results to all).
    # Each group has k rules, one per kind (RULE_TYPE), told apart by the low two bits of layer_id.
    count_log2 = max(0, min(3, (params.slots // 4).bit_length() - 1))
    g2_ports = sum(1 << p for p in range(0, P, 2))
    k = max(1, min(3, (params.rules - 1) // 2))
    pool = rule_kinds(params)

    def capacity(kd: CollectiveKind) -> int:
        return params.max_payload              # every kind of rule's set holds max_payload bytes

    kinds = {g: [rng.choice(pool) for _ in range(k)] for g in (1, 2)}
    # one of group 2's kinds asks for reproducible results (the switch folds every rule in port order: the
    # flag must change nothing)
    kinds[2][0] = replace(rng.choice(pool), reproducible=True)
    layer_match = (0, 0x3) if k > 1 else (0, 0)
    rules = []
    for group, contributors, base in ((1, allp, 0), (2, g2_ports, 1 << count_log2)):
        for j, kd in enumerate(kinds[group]):
            rules.append(Rule(group=(group, 0xFF), layer=(j, layer_match[1]), contributors=contributors,
                              results=allp, base=base, count_log2=count_log2, **kd.rule_fields()))
    # group 3: quota outside the slot memory (BAD_SLOT); int32 SUM
    rules.append(Rule.for_group(3, contributors=allp, results=allp, base=params.slots, count_log2=0))
    for i, rule in enumerate(rules):
        scen.writes += rule_writes(regs, i, rule)
    for p in range(P):
        scen.writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    scen.writes += slot_clear_writes(regs, 0, 2 << count_log2)

    def payload_len(kd: CollectiveKind = CollectiveKind()):
        return kd.itemsize * rng.randint(1, capacity(kd) // kd.itemsize)

    def layer(j):
        return (rng.randrange(1 << 16) & ~0x3) | j if k > 1 else rng.randrange(1 << 16)

    # All-reduce chunks: each uses its own set (seq < slot count), every contributor sends once; the
    # values make the result independent of the order of arrival (chunk_values).
    for group, contributors in ((1, allp), (2, g2_ports)):
        for seq in rng.sample(range(1 << count_log2), k=min(1 << count_log2, 4)):
            j = rng.randrange(k)
            kd = kinds[group][j]
            plen = payload_len(kd)
            hdr = proto.CaisHeader(group_id=group, layer_id=layer(j), chunk_id=seq,
                                   total_chunks=1 << count_log2, seq_num=seq, payload_len=plen,
                                   dtype=kd.dtype, red_op=kd.op)
            ports = [p for p in range(P) if contributors >> p & 1]
            values = chunk_values(nrng, kd, len(ports), plen // kd.itemsize)
            for p, v in zip(ports, values):
                scen.frames[p].append(TxFrame(_cais(rng, hdr, numerics.encode(kd.dtype, v), p)))

    def ordinary(p):
        dst = rng.choice([host_mac(rng.randrange(P)), proto.BROADCAST_MAC, 0x02_00_00_00_09_99,
                          0x01_00_5E_00_00_01])
        length = rng.choice([60, 64, rng.randint(14, params.max_frame), params.max_frame])
        body = bytes(nrng.integers(0, 256, length - 14, dtype=np.uint8))
        return proto.EthHeader(dst, host_mac(p), rng.choice([0x0800, 0x86DD, 0x0806])).pack() + body

    def malformed(p):
        plen = payload_len()
        good = proto.CaisHeader(group_id=1, seq_num=rng.randrange(1 << count_log2), payload_len=plen)
        body = bytes(plen)
        kind = rng.randrange(13)
        if kind == 12:                                                                    # BAD_FCS
            return TxFrame(_cais(rng, good, body, p), bad_fcs=True)
        if kind == 0:
            frame = _cais(rng, good, body, p, pad=False)
            if len(frame) % params.beat_bytes == 0:
                frame = frame[:-4]
            return TxFrame(frame, bad_keep=True)
        if kind == 1:
            return TxFrame(bytes(rng.randint(1, 13)))                                    # RUNT
        if kind == 2:
            return TxFrame(_cais(rng, good, body, p, pad=False)[:rng.randint(14, 29)])  # RUNT (CAIS)
        if kind == 3:
            return TxFrame(ordinary(p)[:14] + bytes(params.max_frame + 1 - 14))          # OVERSIZE
        if kind == 4:
            bad = good.replace(op_type=rng.choice([3, 7, 255]))                           # BAD_CODE
            return TxFrame(_cais(rng, bad, body, p))
        if kind == 5:
            bad = good.replace(flags=int(proto.Flags.RESULT))                             # BAD_CODE
            return TxFrame(_cais(rng, bad, body, p))
        if kind == 6:
            bad = good.replace(payload_len=rng.choice([0, params.max_payload + 4, plen + 1]))
            return TxFrame(_cais(rng, bad, body, p))                                      # BAD_PAYLOAD_LEN
        if kind == 7:
            # unpadded: 34 + payload_len is never 60 for whole elements, so the frame cannot pass
            return TxFrame(_cais(rng, good, body + b"\0" * 4, p, pad=False))              # BAD_LENGTH
        if kind == 8:
            return TxFrame(_cais(rng, good.replace(group_id=9), body, p))                 # NO_RULE
        if kind >= 10:                                                                    # TYPE_MISMATCH
            j = rng.randrange(k)
            kd = kinds[1][j]
            other = rng.choice([o for o in pool if (o.dtype, o.op) != (kd.dtype, kd.op)])
            plen = payload_len(other)
            bad = good.replace(layer_id=layer(j), payload_len=plen, dtype=other.dtype, red_op=other.op)
            return TxFrame(_cais(rng, bad, bytes(plen), p))
        return TxFrame(_cais(rng, good.replace(group_id=3), body, p))                     # BAD_SLOT

    for p in range(P):
        for _ in range(frames_per_port):
            r = rng.random()
            if r < 0.45:
                scen.frames[p].append(TxFrame(ordinary(p)))
            elif r < 0.8:
                scen.frames[p].append(malformed(p))
            elif p % 2 == 1:
                hdr = proto.CaisHeader(group_id=2, seq_num=0, payload_len=8)
                scen.frames[p].append(TxFrame(_cais(rng, hdr, bytes(8), p)))               # FOREIGN_PORT
            else:
                op = rng.choice([proto.OpType.ALL_GATHER, proto.OpType.BROADCAST])
                hdr = proto.CaisHeader(op_type=op, group_id=2, seq_num=rng.randrange(1 << 16), payload_len=16,
                                       dtype=rng.choice(params.dtypes))   # no type check when forwarding
                scen.frames[p].append(TxFrame(_cais(rng, hdr, bytes(range(16)), p)))      # forwarded
        rng.shuffle(scen.frames[p])
    return scen


def replay(scen: Scenario, model=None):
    """Run a scenario through the reference model, interleaving the ports round-robin.

    Returns the model and the frames it sent per port.
    """
    from .refmodel import SwitchModel
    model = model or SwitchModel(scen.params)
    for addr, value in scen.writes:
        model.write(addr, value)
    out = [[] for _ in range(scen.params.ports)]
    queues = [list(f) for f in scen.frames]
    while any(queues):
        for p, q in enumerate(queues):
            if q:
                frame = q.pop(0)
                for port, data in model.receive(p, frame.data, framing_ok=not frame.bad_keep,
                                                fcs_ok=not frame.bad_fcs):
                    out[port].append(data)
    return model, out


def compare(expected: list[list[bytes]], got: list[list[bytes]]) -> list[str]:
    """Differences between two sets of per-port output frames, ignoring order across frames."""
    problems = []
    for port, (exp, rx) in enumerate(zip(expected, got)):
        if sorted(exp) != sorted(rx):
            missing = [f for f in exp if f not in rx]
            extra = [f for f in rx if f not in exp]
            problems.append(f"port {port}: expected {len(exp)} frames, got {len(rx)}; "
                            f"{len(missing)} missing, {len(extra)} unexpected"
                            + (f"; first unexpected: {extra[0][:40].hex()}" if extra else "")
                            + (f"; first missing: {missing[0][:40].hex()}" if missing else ""))
    return problems
