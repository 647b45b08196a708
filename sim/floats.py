"""Float all-reduce on the switch, bit for bit, on any link (entry point :func:`float_job`).

Run on the C++-driven Verilator link by ``tests/sim/test_switch_verilator.py``. Every port contributes to every chunk; payloads mix ordinary
values over a wide range of magnitudes with the edge cases (signed zeros, infinities, NaN, subnormals, the
largest finite values), so sums overflow, cancel and round.

* ``any_order``: fp32, fp16 and bf16 (wire-format and fp32 accumulation) SUM, MAX and MIN.
  Each chunk's contributions are sent one at a time in a random port order, the next only once the switch
  has counted the previous one; the results must equal, bit for bit, the reference model's. Then chunks
  are sent from every port at once: each result must be the fold in ascending port order (numpy), on
  every port (the switch folds every rule in port order, whatever the order of arrival).
* ``reproducible``: rules that ask for reproducible results, of every float type; the same contributions
  are sent in several shuffled orders (one at a time, and all at once). Every result must be bit-identical
  to the others and to the reference fold in ascending port order.
"""

from __future__ import annotations

import random

import numpy as np

from cais import numerics
from cais import protocol as proto
from cais.registers import register_map
from cais.tables import Rule, rule_writes, slot_clear_writes

from .refmodel import SwitchModel
from .suite import LinkHarness
from .traffic import TxFrame, host_mac

__all__ = ["float_job", "float_values", "KINDS"]

D, R = proto.DType, proto.ReduceOp
GROUP = 9
SWITCH_MAC = 0x02_5A_0F_00_00_01

# (dtype, acc_fp32, ops) of every float rule kind.
KINDS = [
    (D.FP32, False, (R.SUM, R.MAX, R.MIN)),
    (D.FP16, False, (R.SUM, R.MAX, R.MIN)),
    (D.FP16, True, (R.SUM, R.MAX)),
    (D.BF16, False, (R.SUM, R.MIN)),
    (D.BF16, True, (R.SUM, R.MAX, R.MIN)),
]

_EDGES = {
    D.FP32: [0x0000_0000, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0001, 0xFFA0_0000, 0x0000_0001,
             0x8000_0003, 0x007F_FFFF, 0x7F7F_FFFF, 0xFF7F_FFFF, 0x3F80_0000, 0x3380_0000, 0x0080_0000],
    D.FP16: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFD00, 0x0001, 0x8003, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00,
             0x1400, 0x0400],
    D.BF16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFA0, 0x0001, 0x8003, 0x007F, 0x7F7F, 0xFF7F, 0x3F80,
             0x3380, 0x0080],
}


def float_values(rng: np.random.Generator, dtype: D, n: int, special: float = 0.08) -> np.ndarray:
    """n wire values of `dtype` (bf16 as uint16 bits): scaled normals, some edge cases."""
    top = {D.FP32: 60, D.FP16: 14, D.BF16: 60}[dtype]
    x = rng.standard_normal(n) * np.exp2(rng.integers(-top, top, n).astype(np.float64))
    with np.errstate(over="ignore"):
        if dtype == D.FP32:
            vals = x.astype(np.float32)
        elif dtype == D.FP16:
            vals = x.astype(np.float16)
        else:
            vals = numerics.f32_to_bf16(x.astype(np.float32))
    bits = vals.view(np.uint32 if dtype == D.FP32 else np.uint16)
    edge = rng.random(n) < special
    bits[edge] = rng.choice(np.array(_EDGES[dtype], dtype=bits.dtype), int(edge.sum()))
    return vals


class Bench:
    """A link's harness plus a reference model that sees the same register writes and frames."""

    def __init__(self, link, seed: int):
        self.tb = LinkHarness(link)
        self.link, self.params = link, link.params
        self.regs = register_map(link.params)
        self.model = SwitchModel(link.params)
        self.P = link.params.ports
        self.allp = (1 << self.P) - 1
        self.seq = 0
        self.seed = seed
        self.rng = np.random.default_rng(self.seed)
        self.prng = random.Random(self.seed)
        self.count_log2 = min(3, link.params.slots.bit_length() - 1)   # the group's quota

    @classmethod
    async def start(cls, link, seed: int) -> "Bench":
        await link.reset()
        return cls(link, seed)

    async def counter_problems(self) -> list[str]:
        """Every counter against the model's, and the accounting invariant."""
        return (await self.tb.check_counters(self.model))[1]

    async def program(self, dtype: D, op: R, acc_fp32: bool, reproducible: bool, count_log2: int) -> None:
        rule = Rule.for_group(GROUP, self.allp, base=0, count_log2=count_log2, dtype=dtype, red_op=op,
                              acc_fp32=acc_fp32, reproducible=reproducible)
        writes = rule_writes(self.regs, 0, rule) + slot_clear_writes(self.regs, 0, 1 << count_log2)
        writes += [(self.regs["SWITCH_MAC_LO"].address(), SWITCH_MAC & 0xFFFF_FFFF),
                   (self.regs["SWITCH_MAC_HI"].address(), SWITCH_MAC >> 32)]
        for addr, value in writes:
            self.model.write(addr, value)
        await self.tb.apply(writes)

    def frames(self, dtype: D, op: R, values: list[np.ndarray], count_log2: int) -> list[TxFrame]:
        """One chunk: the contribution of every port (values[p])."""
        payload_len = len(values[0]) * proto.ELEMENT_BYTES[dtype]
        hdr = proto.CaisHeader(group_id=GROUP, chunk_id=self.seq & 0xFFFF, total_chunks=1 << count_log2,
                               seq_num=self.seq, payload_len=payload_len, dtype=dtype, red_op=op)
        self.seq += 1
        return [TxFrame(proto.build_frame(hdr, numerics.encode(dtype, v), src=host_mac(p), pad=True))
                for p, v in enumerate(values)]

    async def contributions(self) -> int:
        return await self.link.read(self.regs["CONTRIBUTIONS"].address())

    async def send_in_order(self, frames: list[TxFrame], order: list[int]) -> list[tuple[int, bytes]]:
        """Send frames[p] for p in `order`, each once the switch has counted the one before; the model
        receives them in the same order. Returns the model's output."""
        out = []
        for p in order:
            before = await self.contributions()
            self.tb.send(p, frames[p])
            for _ in range(2000):
                if await self.contributions() != before:
                    break
            else:
                raise AssertionError(f"port {p}'s contribution was never counted")
            out += self.model.receive(p, frames[p].data)
        return out

    async def collect(self, before: list[int]) -> list[list[bytes]]:
        await self.tb.drain()
        return [rx[n:] for rx, n in zip(self.tb.rx, before)]


def port_order_result(dtype: D, op: R, values: list, acc_fp32: bool) -> bytes:
    """The reference result payload: ``values[p]`` (port p's contribution) folded in ascending port order."""
    acc = numerics.fold(dtype, op, values, acc_fp32=acc_fp32)
    return numerics.encode(dtype, numerics.result_values(dtype, acc, acc_fp32=acc_fp32))


def result_payload(frame: bytes) -> bytes:
    return proto.parse_frame(frame).payload


async def any_order(link, seed: int) -> list[str]:
    """Float SUM/MAX/MIN from every port, bit-exact against the model and the port-order fold."""
    bench = await Bench.start(link, seed)
    tb, P, params, rng, prng = bench.tb, bench.P, bench.params, bench.rng, bench.prng
    count_log2 = bench.count_log2
    problems: list[str] = []
    checked = 0
    for dtype, acc_fp32, ops in KINDS:
        esize = proto.ELEMENT_BYTES[dtype]
        n_max = params.max_payload // esize
        for op in ops:
            await bench.program(dtype, op, acc_fp32, False, count_log2)
            label = f"{dtype.name}{' acc_fp32' if acc_fp32 else ''} {op.name}"
            # Known order: one contribution at a time.
            for _ in range(2):
                n = prng.choice([n_max, prng.randint(1, n_max)])
                values = [float_values(rng, dtype, n) for _ in range(P)]
                frames = bench.frames(dtype, op, values, count_log2)
                order = list(range(P))
                prng.shuffle(order)
                before = [len(rx) for rx in tb.rx]
                expected = await bench.send_in_order(frames, order)
                got = await bench.collect(before)
                for port, frame in expected:
                    if frame not in got[port]:
                        problems.append(f"{label}, order {order}: port {port} did not get the model's result")
                    checked += 1
            # Every port at once: the result is the port-order fold.
            n = n_max
            values = [float_values(rng, dtype, n) for _ in range(P)]
            frames = bench.frames(dtype, op, values, count_log2)
            before = [len(rx) for rx in tb.rx]
            for p in range(P):
                tb.send(p, frames[p])
            got = await bench.collect(before)
            want = port_order_result(dtype, op, values, acc_fp32)
            if [[result_payload(f) for f in rx] for rx in got] != [[want]] * P:
                problems.append(f"{label}, all at once: not the port-order fold on every port")
            for p in range(P):         # keep the model in step (same slot state and counters)
                bench.model.receive(p, frames[p].data)
            checked += P
    problems += await bench.counter_problems()
    if checked == 0:
        problems.append("no float result was checked")
    return problems


async def reproducible(link, seed: int) -> list[str]:
    """Reproducible float rules: the same result bits whatever the arrival order."""
    bench = await Bench.start(link, seed)
    tb, P, params, rng, prng = bench.tb, bench.P, bench.params, bench.rng, bench.prng
    count_log2 = bench.count_log2
    problems: list[str] = []
    checked = 0
    for dtype, acc_fp32, ops in KINDS:
        esize = proto.ELEMENT_BYTES[dtype]
        capacity = params.max_payload
        for op in ops:
            label = f"{dtype.name}{' acc_fp32' if acc_fp32 else ''} {op.name} reproducible"
            await bench.program(dtype, op, acc_fp32, True, count_log2)
            n = capacity // esize
            values = [float_values(rng, dtype, n) for _ in range(P)]
            want = port_order_result(dtype, op, values, acc_fp32)
            orders = [list(range(P)), list(reversed(range(P)))] + [prng.sample(range(P), P) for _ in range(2)]
            for order in orders:
                frames = bench.frames(dtype, op, values, count_log2)
                before = [len(rx) for rx in tb.rx]
                expected = await bench.send_in_order(frames, order)
                got = await bench.collect(before)
                for port, frame in expected:
                    if result_payload(frame) != want:
                        problems.append(f"{label}, order {order}: the model's result is not the port-order fold")
                    if [result_payload(f) for f in got[port]] != [want]:
                        problems.append(f"{label}, order {order}: port {port} got a different result")
                checked += 1
            frames = bench.frames(dtype, op, values, count_log2)     # every port at once
            before = [len(rx) for rx in tb.rx]
            for p in range(P):
                tb.send(p, frames[p])
            got = await bench.collect(before)
            if [[result_payload(f) for f in rx] for rx in got] != [[want]] * P:
                problems.append(f"{label}, all at once: not the port-order fold on every port")
            for p in range(P):
                bench.model.receive(p, frames[p].data)
            checked += 1
    problems += await bench.counter_problems()
    if checked == 0:
        problems.append("no reproducible chunk was checked")
    return problems


async def float_job(link, job: dict) -> dict:
    """Entry point: ``job["tests"]`` (default both) of ``any_order`` and ``reproducible``, seeded by
    ``job["seed"]``; returns the problems found per test."""
    tests = {"any_order": any_order, "reproducible": reproducible}
    names = job.get("tests", list(tests))
    return {name: await tests[name](link, int(job.get("seed", 0)) + i) for i, name in enumerate(names)}
