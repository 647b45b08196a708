"""The switch's documented cycle figures and the scenarios that check them, shared by the amaranth.sim
tests (tests/test_switch_timing.py) and the cocotb tests (cais.tb.test_timing).

The figures are docs/interface.md's, written here once: result latency ``beats + 9 + L`` cycles from the
completing contribution's last beat to the result's first beat, plus ``rows + (n - 1) * max(rows, L)`` for
a reproducible rule's fold.
"""

from __future__ import annotations

import numpy as np

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import register_map
from cais.tables import Rule, rule_writes, slot_clear_writes

from .traffic import Scenario, TxFrame, host_mac, replay

__all__ = ["alu_latency", "frame_beats", "documented_latency", "contribution", "broadcast", "group_writes",
           "held_port_scenario"]


def alu_latency(params: SwitchParams) -> int:
    """L of docs/interface.md: the slot ALU's pipeline, 4 with float units, 0 without."""
    return 4 if params.float_units else 0


def frame_beats(params: SwitchParams, payload_len: int) -> int:
    """Beats of a CAIS frame with ``payload_len`` bytes of payload, padded to 60 bytes if shorter."""
    length = max(proto.HEADERS_BYTES + payload_len, proto.MIN_FRAME_BYTES)
    return -(-length // params.beat_bytes)


def documented_latency(params: SwitchParams, payload_len: int, reproducible: bool = False) -> int:
    """Cycles from the completing contribution's last beat to the result's first beat (docs/interface.md),
    for a rule whose contributors are every port."""
    L = alu_latency(params)
    latency = frame_beats(params, payload_len) + 9 + L
    if reproducible:
        rows = -(-payload_len // params.beat_bytes)
        latency += rows + (params.ports - 1) * max(rows, L)
    return latency


def contribution(port: int, seq: int, payload: bytes, group: int = 1,
                 dtype: proto.DType = proto.DType.INT32) -> TxFrame:
    """An all-reduce frame (SUM) from the host on ``port``, padded to 60 bytes if shorter."""
    hdr = proto.CaisHeader(op_type=proto.OpType.ALL_REDUCE, group_id=group, seq_num=seq,
                           payload_len=len(payload), dtype=dtype)
    return TxFrame(proto.build_frame(hdr, payload, src=host_mac(port), pad=True))


def broadcast(port: int, body: bytes) -> TxFrame:
    """An ordinary (non-CAIS) frame to the broadcast MAC from the host on ``port``."""
    return TxFrame(proto.EthHeader(proto.BROADCAST_MAC, host_mac(port), 0x0800).pack() + body)


def group_writes(params: SwitchParams, contributors: int, results: int, *, group: int = 1, entry: int = 0,
                 base: int = 0, count_log2: int = 0, **kind) -> list[tuple[int, int]]:
    """Rule ``entry`` for ``group`` (``kind``: RULE_TYPE fields) and SLOT_CLEAR of its quota."""
    regs = register_map(params)
    rule = Rule.for_group(group, contributors=contributors, results=results, base=base, count_log2=count_log2,
                          **kind)
    return rule_writes(regs, entry, rule) + slot_clear_writes(regs, base, 1 << count_log2)


def held_port_scenario(params: SwitchParams, seed: int):
    """Frames that go to port 0 and to others while port 0's sink is held: four longest broadcast frames
    from port 1, and the results of four chunks (each in its own slot) of a group whose contributors are
    every port but 0 and whose results go to every port. Returns the :class:`Scenario`, and the reference
    model after it with the frames it sends per port (:func:`cais.sim.traffic.replay`; the outcome does not
    depend on how the ports interleave)."""
    P = params.ports
    allp = (1 << P) - 1
    rng = np.random.default_rng(seed)
    scen = Scenario(params, group_writes(params, allp & ~1, allp, count_log2=2), [[] for _ in range(P)])
    for k in range(4):
        scen.frames[1].append(broadcast(1, rng.integers(0, 256, params.max_frame - 14, dtype=np.uint8).tobytes()))
        for p in range(1, P):
            scen.frames[p].append(contribution(p, k, rng.integers(0, 256, 64, dtype=np.uint8).tobytes()))
    model, expected = replay(scen)
    return scen, model, expected
