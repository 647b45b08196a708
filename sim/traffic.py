"""Seeded traffic for the switch testbenches, and the scoreboard that checks what came out.

A :class:`Scenario` is a list of register writes that program the switch and, per port, the frames to
send in order. :func:`random_mix` builds traffic whose outcome does not depend on how the switch
interleaves its ports (each slot set is used by one chunk, ordinary frames are independent), so the
reference model can replay it in any interleaving and must produce the same frames per port and the
same counters. Directed, order-dependent cases are sent one at a time by the tests themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

__all__ = ["Scenario", "TxFrame", "random_mix", "host_mac", "beats_of", "replay", "compare"]


def host_mac(port: int) -> int:
    """The MAC address of the host on a port, in the test topologies."""
    return 0x02_00_00_00_01_00 | port


@dataclass(frozen=True)
class TxFrame:
    data: bytes
    bad_keep: bool = False    # send with a gap in the last beat's tkeep (BAD_FRAMING)


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


def _cais(rng, hdr: proto.CaisHeader, payload: bytes, port: int, pad: bool = True) -> bytes:
    return proto.build_frame(hdr, payload, dst=proto.BROADCAST_MAC, src=host_mac(port), pad=pad)


def random_mix(params: SwitchParams, seed: int, frames_per_port: int = 12) -> Scenario:
    """Random all-reduce chunks on every port, mixed with ordinary, forwarded and malformed frames."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    P = params.ports
    regs = register_map(params)
    scen = Scenario(params, frames=[[] for _ in range(P)])
    allp = (1 << P) - 1

    # Two groups with disjoint quotas: group 1 of all ports, group 2 of the even ports (results to all).
    count_log2 = max(0, min(3, (params.slots // 4).bit_length() - 1))
    g2_ports = sum(1 << p for p in range(0, P, 2))
    rules = [
        Rule.for_group(1, contributors=allp, results=allp, base=0, count_log2=count_log2),
        Rule.for_group(2, contributors=g2_ports, results=allp, base=1 << count_log2, count_log2=count_log2),
        # group 3: quota outside the slot memory (BAD_SLOT)
        Rule.for_group(3, contributors=allp, results=allp, base=params.slots, count_log2=0),
    ]
    for i, rule in enumerate(rules):
        scen.writes += rule_writes(regs, i, rule)
    for p in range(P):
        scen.writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    scen.writes += slot_clear_writes(regs, 0, 2 << count_log2)

    def payload_len():
        return 4 * rng.randint(1, params.max_payload // 4)

    # All-reduce chunks: each uses its own set (seq < slot count), every contributor sends once.
    for group, contributors in ((1, allp), (2, g2_ports)):
        for seq in rng.sample(range(1 << count_log2), k=min(1 << count_log2, 4)):
            plen = payload_len()
            op = rng.choice(list(proto.ReduceOp))
            hdr = proto.CaisHeader(group_id=group, layer_id=rng.randrange(1 << 16), chunk_id=seq,
                                   total_chunks=1 << count_log2, seq_num=seq, payload_len=plen, red_op=op)
            for p in range(P):
                if contributors >> p & 1:
                    values = nrng.integers(-2**31, 2**31, plen // 4, dtype=np.int64).astype(">i4")
                    scen.frames[p].append(TxFrame(_cais(rng, hdr, values.tobytes(), p)))

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
        kind = rng.randrange(10)
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
                hdr = proto.CaisHeader(op_type=op, group_id=2, seq_num=rng.randrange(1 << 16), payload_len=16)
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
                for port, data in model.receive(p, frame.data, framing_ok=not frame.bad_keep):
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
