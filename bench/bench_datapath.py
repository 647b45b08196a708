"""Datapath benchmark: throughput at full offered load, result latency, memory sizes.

Runs the exported switch cycle-accurately on the C++-driven Verilator link (``--backend amaranth``: the
Amaranth design under amaranth.sim) and prints one table. Every port offers a frame on every cycle (tvalid
never drops) and every sink is always ready; the figure is the number of ingress beats the switch accepts
per cycle, summed over ports, in the steady state after the ingress buffers have filled (the limit is 1.0:
the core takes one beat per cycle), from the links' ingress stamps. Results are checked against numpy, so
a fast wrong answer cannot pass.

    python bench/bench_datapath.py [--ports N] [--data-width W] [--chunks N] [--backend verilator|amaranth]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pathlib import Path

import numpy as np
from amaranth.hdl import Shape

from cais import protocol as proto
from cais.hdl.slots import entry_layout
from cais.hdl.tables import rule_layout
from cais.params import ParamError, SwitchParams
from cais.registers import register_map
from cais.sim.backends import run_backend, wait_idle
from cais.sim.timing import measure_latency
from cais.sim.traffic import host_mac
from cais.tables import Rule, rule_writes

if str(Path(__file__).resolve().parent) not in sys.path:     # entry points are named "bench_datapath:..."
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def contribution(port: int, seq: int, values: np.ndarray) -> bytes:
    hdr = proto.CaisHeader(group_id=1, chunk_id=seq, seq_num=seq, payload_len=values.nbytes)
    return proto.build_frame(hdr, values.astype(">i4").tobytes(), src=host_mac(port))


async def load_job(link, job: dict) -> dict:
    """Every port sends ``job["chunks"]`` contributions back to back (the link queues them all at once, so
    tvalid never drops); every sink is always ready. Returns the frames' ingress stamps, the results and the
    cycles, after checking every result against numpy."""
    params = link.params
    P = params.ports
    regs = register_map(params)
    chunks, payload = int(job["chunks"]), int(job["payload"])
    rng = np.random.default_rng(int(job.get("seed", 1)))
    values = rng.integers(-2**31, 2**31, (chunks, P, payload // 4), dtype=np.int64).astype(np.int32)
    everyone = (1 << P) - 1
    for addr, value in rule_writes(regs, 0, Rule.for_group(1, contributors=everyone, results=everyone, base=0,
                                                           count_log2=int(job["count_log2"]))):
        await link.write(addr, value)
    link.take_sent()
    start = link.cycle
    for c in range(chunks):
        for p in range(P):
            link.send(p, contribution(p, c, values[c, p]))
    wall = time.perf_counter()
    if not await wait_idle(link, limit=link.cycle + 100 * chunks * P * params.max_frame_beats):
        raise SystemExit("the switch did not drain")
    wall = time.perf_counter() - wall
    cycles = link.cycle - start
    got = set()
    for r in link.take_stamped():
        frame = proto.parse_frame(r.data)
        c = frame.cais.seq_num
        want = values[c].astype(np.int64).sum(axis=0)
        want = ((want + 2**31) % 2**32) - 2**31
        if not np.array_equal(np.frombuffer(frame.payload, ">i4"), want):
            raise SystemExit(f"wrong result for chunk {c} on port {r.port}")
        got.add((c, r.port))
    if len(got) != chunks * P:
        raise SystemExit(f"{chunks * P - len(got)} results missing")
    beats = -(-len(contribution(0, 0, values[0, 0])) // params.beat_bytes)     # every frame is as long
    sent = sorted((s.last, beats) for s in link.take_sent())
    return {"sent": sent, "cycles": cycles, "wall": wall}


def steady_rate(params: SwitchParams, sent: list[tuple[int, int]]) -> float:
    """Ingress beats accepted per cycle, summed over ports, once the ingress buffers are full: from the
    frame after which more beats than the buffers hold were accepted, to the last frame (with every port
    offering a beat on every cycle, the buffers then admit exactly what the core takes)."""
    fill = params.ports * params.ingress_depth
    total, k0 = 0, None
    for k, (_, beats) in enumerate(sent):
        total += beats
        if total > fill:
            k0 = k
            break
    if k0 is None or k0 == len(sent) - 1:
        raise SystemExit("too few chunks to reach the steady state: raise --chunks")
    return sum(b for _, b in sent[k0 + 1:]) / (sent[-1][0] - sent[k0][0])


def run_load(params: SwitchParams, chunks: int, payload: int, count_log2: int, backend: str) -> dict:
    r = run_backend(backend, params, "bench_datapath:load_job",
                    {"chunks": chunks, "payload": payload, "count_log2": count_log2})
    beats = sum(b for _, b in r["sent"])
    return {"beats_per_cycle": steady_rate(params, r["sent"]), "cycles": r["cycles"], "beats": beats,
            "wall": r["wall"], "cycles_per_s": r["cycles"] / r["wall"]}


async def latency_job(link, job: dict) -> dict:
    return await measure_latency(link, link.params.max_payload)


def run_load_latency(params: SwitchParams, backend: str) -> int:
    """Cycles from the cycle the last contribution's last beat is accepted to the cycle the result's first
    beat is (docs/interface.md's convention; cais.sim.timing.measure_latency)."""
    got = run_backend(backend, params, "bench_datapath:latency_job", {})
    if got["problems"]:
        raise SystemExit("latency run: " + "; ".join(got["problems"]))
    return got["latency"]


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
    ap.add_argument("--chunks", type=int, default=128, help="contributions per port per load run")
    ap.add_argument("--backend", choices=["verilator", "amaranth"], default="verilator")
    ap.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    args = ap.parse_args(argv)
    try:
        params = SwitchParams(ports=args.ports, data_width=args.data_width)
    except ParamError as e:
        ap.error(str(e))
    if args.chunks < 8:
        ap.error("--chunks must be at least 8")

    P = params
    rows = []
    for label, payload, count_log2 in (
            ("full-size chunks, each its own set", P.max_payload, 5),
            ("full-size chunks, all to one slot (back to back)", P.max_payload, 0),
            ("one-beat payloads, all to one slot (back to back)", P.beat_bytes, 0)):
        r = run_load(P, args.chunks, payload, count_log2, args.backend)
        rows.append((label, payload, r))
    lat = run_load_latency(P, args.backend)
    if args.json:
        print(json.dumps({
            "params": P.as_dict(),
            "loads": [{"load": label, "payload_bytes": payload, **r} for label, payload, r in rows],
            "latency_cycles": lat,
            "memory_bits": dict(sizes(P)),
        }))
        return 0
    print(f"CAIS datapath benchmark: {P.ports} ports x {P.data_width}-bit beats, {P.slots} slots, "
          f"max payload {P.max_payload} B ({args.backend}, cycle-accurate)")
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
