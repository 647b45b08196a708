"""cais.hdl.alu.fold.FoldChain against numerics.accumulate in ascending port order (docs/numerics.md section 11):
random rows of every element type and operator, random contributor masks, one set of rows per cycle."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cais import numerics
from cais.hdl.alu.fold import FoldChain
from cais.protocol import DType, ReduceOp
from cais.sim.operands import INT_BITS, random_row

from blocksim import run as simulate


def reference(rows: list[int], mask: int, dtype, op, acc_fp32, saturate, W) -> tuple[int, int]:
    """(expected word, bits that matter): the port-order fold of numerics."""
    acc = None
    for p, row in enumerate(rows):
        if mask >> p & 1:
            acc = numerics.accumulate(dtype, op, acc, numerics.decode(dtype, row.to_bytes(W // 8, "little")),
                                      acc_fp32=acc_fp32, saturate=saturate)
    wide = numerics.widens(dtype, acc_fp32)
    data = numerics.encode(DType.FP32 if wide else dtype, np.asarray(acc))
    return int.from_bytes(data, "little"), (1 << (2 * W if wide else W)) - 1


def cases(rng: random.Random, ports: int, W: int, n: int, dtypes) -> list[dict]:
    out = []
    for _ in range(n):
        dtype = rng.choice(dtypes)
        op = rng.choice(list(ReduceOp))
        half = dtype in (DType.FP16, DType.BF16)
        out.append({
            "rows": [random_row(rng, dtype, W) for _ in range(ports)],
            "mask": rng.randrange(1, 1 << ports), "dtype": dtype, "op": op,
            "acc_fp32": half and rng.random() < 0.5,
            "saturate": dtype in INT_BITS and op == ReduceOp.SUM and rng.random() < 0.5,
        })
    return out


def run(dut: FoldChain, items: list[dict], gaps: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    got = []

    async def tb(ctx):
        queue = list(items)
        cycles = 0
        while len(got) < len(items):
            cycles += 1
            assert cycles < 10 * len(items) + 100, "the chain lost rows"
            offer = bool(queue) and rng.random() >= gaps
            ctx.set(dut.i_valid, offer)
            if offer:
                item = queue.pop(0)
                for p, row in enumerate(item["rows"]):
                    ctx.set(dut.rows[p], row)
                ctx.set(dut.mask, item["mask"])
                ctx.set(dut.dtype, item["dtype"])
                ctx.set(dut.op, item["op"])
                ctx.set(dut.acc_fp32, item["acc_fp32"])
                ctx.set(dut.saturate, item["saturate"])
            _, _, valid, result = await ctx.tick().sample(dut.o_valid, dut.result)
            if valid:
                got.append(result)

    simulate(dut, tb)
    return got


@pytest.mark.parametrize("ports, float_units", [(2, True), (4, True), (3, False)],
                         ids=["p2", "p4", "p3_int"])
@pytest.mark.slow
def test_fold_in_port_order(ports, float_units):
    W = 64
    dut = FoldChain(ports, W, float_units=float_units)
    dtypes = list(DType) if float_units else [DType.INT32, DType.INT16, DType.INT8]
    rng = random.Random(ports * 10 + float_units)
    items = cases(rng, ports, W, 150, dtypes)
    got = run(dut, items, gaps=0.2, seed=ports)
    bad = []
    for i, (item, word) in enumerate(zip(items, got)):
        want, care = reference(item["rows"], item["mask"], item["dtype"], item["op"], item["acc_fp32"],
                               item["saturate"], W)
        if word & care != want:
            bad.append(f"item {i} {item['dtype'].name} {item['op'].name} mask {item['mask']:#b} "
                       f"acc_fp32={item['acc_fp32']}: got {word & care:#x}, want {want:#x}")
    assert not bad, "\n".join(bad[:5])


@pytest.mark.slow
def test_latency_and_one_row_per_cycle():
    """Rows entered back to back leave back to back, ``latency`` edges after they entered."""
    dut = FoldChain(4, 64)
    assert dut.latency == 4 * dut.stage_latency + 1
    out_cycles = []

    async def tb(ctx):
        ctx.set(dut.mask, 0b1111)
        for cycle in range(dut.latency + 40):
            ctx.set(dut.i_valid, cycle < 20)              # rows enter in cycles 0..19
            _, _, valid = await ctx.tick().sample(dut.o_valid)
            if valid:
                out_cycles.append(cycle)

    simulate(dut, tb)
    # a row entering before edge c is out after edge c + latency - 1, sampled before edge c + latency
    assert out_cycles == list(range(dut.latency, dut.latency + 20))
