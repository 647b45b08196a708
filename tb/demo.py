"""The `make sim` workload on the Verilated switch: every port all-reduces one int32 tensor.

Each port plays a worker: it cuts its tensor into chunks of max_payload bytes, keeps at most `window`
chunks outstanding (the group's slot quota, so a slot set is reused only after its result arrived,
SwitchML's self-clocking), and reassembles the results. The job description comes in the environment
variable CAIS_DEMO (JSON, written by ``cais.sim.demo``), and the figures go back as JSON to its `out` file.
"""

from __future__ import annotations

import json
import os
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import Event, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from cais import protocol as proto
from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.sim.traffic import host_mac
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

CLOCK_NS = 10


@cocotb.test()
async def all_reduce_demo(dut):
    job = json.loads(os.environ["CAIS_DEMO"])
    params = SwitchParams(**job["params"])
    P, B = params.ports, params.beat_bytes
    regs = register_map(params)
    op = proto.ReduceOp[job["op"].upper()]
    rng = np.random.default_rng(job["seed"])
    tensors = rng.integers(-2**31, 2**31, (P, job["elements"]), dtype=np.int64).astype(np.int32)
    per_chunk = params.max_payload // 4
    nchunks = -(-job["elements"] // per_chunk)
    window = job["window"]

    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
    sources = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_p{p}"), dut.clk, dut.rst) for p in range(P)]
    sinks = [AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_p{p}"), dut.clk, dut.rst) for p in range(P)]
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    for _ in range(params.slots + 2):
        await RisingEdge(dut.clk)

    count_log2 = (window - 1).bit_length()
    writes = rule_writes(regs, 0, Rule.for_group(1, contributors=(1 << P) - 1, results=(1 << P) - 1,
                                                 base=0, count_log2=count_log2))
    writes += slot_clear_writes(regs, 0, 1 << count_log2)
    for p in range(P):
        writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    for addr, value in writes:
        await axil.write_dword(addr, value)

    results = np.zeros((P, nchunks * per_chunk), dtype=np.int64)
    received = [set() for _ in range(P)]
    progress = [Event() for _ in range(P)]
    stats = {"duplicate_results": 0}

    async def worker(p):
        for c in range(nchunks):
            while c - len(received[p]) >= window:
                progress[p].clear()
                await progress[p].wait()
            values = tensors[p, c * per_chunk:(c + 1) * per_chunk].astype(">i4")
            hdr = proto.CaisHeader(group_id=1, layer_id=0, chunk_id=c % (1 << 16), total_chunks=min(nchunks, 0xFFFF),
                                   seq_num=c, payload_len=values.nbytes, red_op=op)
            await sources[p].send(AxiStreamFrame(proto.build_frame(hdr, values.tobytes(), src=host_mac(p), pad=True)))

    async def receiver(p):
        while len(received[p]) < nchunks:
            frame = proto.parse_frame(bytes((await sinks[p].recv()).tdata))
            seq = frame.cais.seq_num
            if seq in received[p]:
                stats["duplicate_results"] += 1
                continue
            got = np.frombuffer(frame.payload, ">i4")
            results[p, seq * per_chunk:seq * per_chunk + len(got)] = got
            received[p].add(seq)
            progress[p].set()

    start_ns = get_sim_time("ns")
    wall0 = time.perf_counter()
    tasks = [cocotb.start_soon(worker(p)) for p in range(P)] + [cocotb.start_soon(receiver(p)) for p in range(P)]
    for t in tasks:
        await t
    cycles = int((get_sim_time("ns") - start_ns) // CLOCK_NS)
    wall = time.perf_counter() - wall0

    acc = tensors.astype(np.int64)
    reference = {proto.ReduceOp.SUM: acc.sum(axis=0), proto.ReduceOp.MAX: acc.max(axis=0),
                 proto.ReduceOp.MIN: acc.min(axis=0)}[op]
    reference = (reference + 2**31) % 2**32 - 2**31
    correct = all(np.array_equal(results[p, :job["elements"]], reference) for p in range(P))

    counters = {}
    for reg in regs:
        if reg.kind in (Kind.COUNTER, Kind.LEVEL):
            values = [(await axil.read_dword(reg.address(i))) for i in range(reg.count)]
            counters[reg.name] = values if reg.count > 1 else values[0]
    summary = {"cycles": cycles, "wall_s": wall, "chunks": nchunks, "correct": correct,
               "counters": counters, **stats}
    with open(job["out"], "w") as f:
        json.dump(summary, f)
    assert correct, "all-reduce result differs from numpy"
