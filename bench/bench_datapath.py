"""Datapath benchmark: throughput at full offered load, result latency, memory sizes.

Runs the Amaranth switch cycle-accurately (amaranth.sim: the same design that is exported to Verilog)
and prints one table. Every port offers a frame on every cycle (tvalid never drops) and every sink is
always ready; the figure is the number of ingress beats the switch accepts per cycle, summed over ports,
in the steady state after the ingress buffers have filled (the limit is 1.0: the core takes one beat
per cycle). Results are checked against numpy, so a fast wrong answer cannot pass.

    python bench/bench_datapath.py [--ports N] [--data-width W] [--chunks N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from amaranth.hdl import Shape
from amaranth.sim import Simulator

from cais import protocol as proto
from cais.hdl.slots import entry_layout
from cais.hdl.switch import Switch
from cais.hdl.tables import rule_layout
from cais.params import ParamError, SwitchParams
from cais.registers import register_map
from cais.sim.amaranth_harness import axil_write
from cais.sim.traffic import TxFrame, beats_of, host_mac
from cais.tables import Rule, rule_writes


def contribution(port: int, seq: int, values: np.ndarray) -> bytes:
    hdr = proto.CaisHeader(group_id=1, chunk_id=seq, seq_num=seq, payload_len=values.nbytes)
    return proto.build_frame(hdr, values.astype(">i4").tobytes(), src=host_mac(port))


async def program(ctx, dut, writes):
    async def tick(*signals):
        return (await ctx.tick().sample(*signals))[2:]
    for addr, value in writes:
        await axil_write(tick, ctx, dut.s_axil, addr, value)


def run_load(params: SwitchParams, chunks: int, payload: int, count_log2: int, seed: int = 1) -> dict:
    """Every port sends `chunks` contributions back to back; returns measured figures."""
    P, B = params.ports, params.beat_bytes
    dut = Switch(params)
    regs = register_map(params)
    rng = np.random.default_rng(seed)
    values = rng.integers(-2**31, 2**31, (chunks, P, payload // 4), dtype=np.int64).astype(np.int32)
    frames = [[contribution(p, c, values[c, p]) for c in range(chunks)] for p in range(P)]
    expected = {c: values[c].astype(np.int64).sum(axis=0) for c in range(chunks)}
    writes = rule_writes(regs, 0, Rule.for_group(1, contributors=(1 << P) - 1, results=(1 << P) - 1,
                                                 base=0, count_log2=count_log2))
    state = {"cycle": 0, "accepted": [], "first_out": None, "last_in": None, "rx": [[] for _ in range(P)],
             "done_sending": 0}

    core_pops = []

    async def clock_counter(ctx):
        pops = [dut.core.beat_valid[p] & dut.core.beat_ready[p] for p in range(P)]
        async for _, _, *popped in ctx.tick().sample(*pops):
            state["cycle"] += 1
            if any(popped):
                core_pops.append(state["cycle"])

    def source(p):
        async def run(ctx):
            bus = dut.s_axis[p]
            while state.get("go") is None:
                await ctx.tick()
            for frame in frames[p]:
                for tdata, tkeep, tlast in beats_of(TxFrame(frame), B):
                    ctx.set(bus.tdata, tdata)
                    ctx.set(bus.tkeep, tkeep)
                    ctx.set(bus.tlast, tlast)
                    ctx.set(bus.tvalid, 1)
                    await ctx.tick().until(bus.tready)
                    state["accepted"].append(state["cycle"])
                    if tlast:
                        state["last_in"] = state["cycle"]
            ctx.set(bus.tvalid, 0)
            state["done_sending"] += 1
        return run

    def sink(p):
        async def run(ctx):
            bus = dut.m_axis[p]
            ctx.set(bus.tready, 1)
            buf = bytearray()
            async for _, _, valid, data, keep, last in ctx.tick().sample(bus.tvalid, bus.tdata, bus.tkeep,
                                                                          bus.tlast):
                if valid:
                    if state["first_out"] is None:
                        state["first_out"] = state["cycle"]
                    buf += int(data).to_bytes(B, "little")[:bin(keep).count("1")]
                    if last:
                        state["rx"][p].append(bytes(buf))
                        buf = bytearray()
        return run

    async def main(ctx):
        await program(ctx, dut, writes)
        await ctx.tick().repeat(params.slots + 4)      # slot-state sweep after reset
        state["go"] = True
        state["start"] = state["cycle"]
        while state["done_sending"] < P:
            await ctx.tick()
        while ctx.get(dut.busy):      # BUSY, exact every cycle: until the last result beat has left
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(clock_counter)
    for p in range(P):
        sim.add_testbench(source(p), background=True)
        sim.add_testbench(sink(p), background=True)
    sim.add_testbench(main)
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0

    # Correctness: every port received every chunk's sum.
    for p in range(P):
        got = {}
        for f in state["rx"][p]:
            fr = proto.parse_frame(f)
            got[fr.cais.seq_num] = np.frombuffer(fr.payload, ">i4").astype(np.int64)
        for c in range(chunks):
            want = ((expected[c] + 2**31) % 2**32) - 2**31
            if c not in got or not np.array_equal(got[c], want):
                raise SystemExit(f"wrong or missing result for chunk {c} on port {p}")

    # The rate the core takes beats from the ingress buffers, from its first beat to its last: with
    # every port offering a frame on every cycle this is the switch's steady-state acceptance rate (the
    # ingress buffers only decouple the ports from it).
    beats_per_cycle = len(core_pops) / (core_pops[-1] - core_pops[0] + 1)
    return {
        "beats_per_cycle": beats_per_cycle,
        "cycles": state["cycle"] - state["start"],
        "beats": len(state["accepted"]),
        "wall": wall,
        "cycles_per_s": state["cycle"] / wall,
    }


def run_load_latency(params: SwitchParams) -> int:
    """Cycles from the last beat of the last contribution accepted to the first beat of the result."""
    P, B = params.ports, params.beat_bytes
    dut = Switch(params)
    regs = register_map(params)
    rng = np.random.default_rng(2)
    vals = rng.integers(-1000, 1000, (P, params.max_payload // 4)).astype(np.int32)
    writes = rule_writes(regs, 0, Rule.for_group(1, contributors=(1 << P) - 1, results=(1 << P) - 1))
    marks = {}

    async def main(ctx):
        await program(ctx, dut, writes)
        await ctx.tick().repeat(params.slots + 4)
        for p in range(P):
            ctx.set(dut.m_axis[p].tready, 1)
        cycle = 0
        # Ports 0..P-2 first, then the last contribution alone, so its timing is clean.
        for p in list(range(P - 1)) + [P - 1]:
            if p == P - 1:
                for _ in range(200):
                    await ctx.tick()
            bus = dut.s_axis[p]
            for tdata, tkeep, tlast in beats_of(TxFrame(contribution(p, 0, vals[p])), B):
                ctx.set(bus.tdata, tdata)
                ctx.set(bus.tkeep, tkeep)
                ctx.set(bus.tlast, tlast)
                ctx.set(bus.tvalid, 1)
                await ctx.tick().until(bus.tready)
            ctx.set(bus.tvalid, 0)
        # docs/interface.md's convention: cycles from the cycle in which the last beat was accepted (the one
        # that just ended) to the cycle in which the result's first beat is valid (the sink is ready).
        cycle = 1
        while not ctx.get(dut.m_axis[0].tvalid):
            await ctx.tick()
            cycle += 1
        marks["latency"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(main)
    sim.run()
    return marks["latency"]


def sizes(params: SwitchParams) -> list[tuple[str, int]]:
    P = params
    state_bits = Shape.cast(entry_layout(P.ports, P.slot_len_bits)).width * P.slots
    return [
        ("slot memory (bits)", P.slots * 2 * P.max_payload * 8),
        ("slot state (bits)", state_bits),
        ("rule table (bits)", P.rules * Shape.cast(rule_layout(P)).width),
        ("MAC table (bits)", P.mac_entries * (1 + 48 + (P.ports - 1).bit_length())),
        ("ingress buffers (bits)", P.ports * P.ingress_depth * P.data_width),
        ("egress buffers (bits)", P.ports * P.egress_depth * (P.data_width + P.beat_bytes + 1)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=SwitchParams.ports)
    ap.add_argument("--data-width", type=int, default=SwitchParams.data_width)
    ap.add_argument("--chunks", type=int, default=16, help="contributions per port per load run")
    ap.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    args = ap.parse_args(argv)
    try:
        params = SwitchParams(ports=args.ports, data_width=args.data_width)
    except ParamError as e:
        ap.error(str(e))
    if args.chunks < 4:
        ap.error("--chunks must be at least 4")

    P = params
    rows = []
    for label, payload, count_log2 in (
            ("full-size chunks, each its own set", P.max_payload, 5),
            ("full-size chunks, all to one slot (back to back)", P.max_payload, 0),
            ("one-beat payloads, all to one slot (back to back)", P.beat_bytes, 0)):
        r = run_load(P, args.chunks, payload, count_log2)
        rows.append((label, payload, r))
    lat = run_load_latency(P)
    if args.json:
        print(json.dumps({
            "params": P.as_dict(),
            "loads": [{"load": label, "payload_bytes": payload, **r} for label, payload, r in rows],
            "latency_cycles": lat,
            "memory_bits": dict(sizes(P)),
        }))
        return 0
    print(f"CAIS datapath benchmark: {P.ports} ports x {P.data_width}-bit beats, {P.slots} slots, "
          f"max payload {P.max_payload} B (amaranth.sim, cycle-accurate)")
    print()
    print(f"{'load':52} {'payload B':>9} {'beats in':>9} {'cycles':>7} {'beats/cycle':>12} {'sim cyc/s':>10}")
    print(f"{'':52} {'':>9} {'':>9} {'':>7} {'(limit 1.0)':>12}")
    for label, payload, r in rows:
        print(f"{label:52} {payload:>9} {r['beats']:>9} {r['cycles']:>7} {r['beats_per_cycle']:>12.3f} "
              f"{r['cycles_per_s']:>10.0f}")
    print()
    print(f"latency, last contribution's last beat in -> first result beat out: {lat} cycles")
    print()
    print(f"{'memory':28} {'bits':>10} {'KiB':>8}")
    for name, bits in sizes(P):
        print(f"{name:28} {bits:>10} {bits / 8192:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
