"""Datapath benchmark: throughput at full offered load, result latency, memory sizes.

Runs the exported switch cycle-accurately on the C++-driven Verilator link (``--backend amaranth``: the
Amaranth design under amaranth.sim) and prints one table. Every port offers a frame on every cycle (tvalid
never drops) and every sink is always ready; the figure is the number of ingress beats the switch accepts
per cycle, summed over ports, in the steady state after the ingress buffers have filled (the limit is the
number of ports: every port at line rate), from the links' ingress stamps. A second table loads every port at
once with full-size all-reduce contributions, forwarded frames, or a mix, and gives each port's ingress
beats per cycle (line rate: 1.0 per port). Results and forwarded frames are checked (numpy), so a fast
wrong answer cannot pass. ``--json`` prints one JSON object instead (``per_port_beats_per_cycle`` and
``core_beats_per_cycle`` keyed by scenario).

    python bench/bench_datapath.py [--ports N] [--data-width W] [--chunks N] [--backend verilator|amaranth]
"""

from __future__ import annotations

import json
import sys
import time

from pathlib import Path

import numpy as np
from amaranth.hdl import Shape

from cais import protocol as proto
from cais.hdl.slots import state_entry_layout
from cais.cli import Parser, integer
from cais.hdl.tables import rule_layout
from cais.params import ParamError, SwitchParams
from cais.registers import register_map
from cais.sim.backends import run_backend, wait_idle
from cais.sim.timing import frame_beats, measure_latency
from cais.sim.traffic import host_mac
from cais.tables import MacEntry, Rule, mac_writes, rule_writes

if str(Path(__file__).resolve().parent) not in sys.path:     # entry points are named "bench_datapath:..."
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def contribution(port: int, seq: int, values: np.ndarray) -> bytes:
    hdr = proto.CaisHeader(group_id=1, chunk_id=seq, seq_num=seq, payload_len=values.nbytes)
    return proto.build_frame(hdr, values.astype(">i4").tobytes(), src=host_mac(port), pad=True)


#: Result latency of a full-size (256-byte) contribution at 4 x 64 bits with float units, before the
#: line-rate core (beats + 9 + L = 36 + 9 + 4).
BASELINE_LATENCY_4X64 = 49


def baseline_per_port(params: SwitchParams) -> float:
    """Per-port ingress beats per cycle before the line-rate core (measured: one shared core takes one
    beat per cycle for all ports together, so every port gets 1/ports of its line rate)."""
    return 1.0 / params.ports


def forwarded(port: int, ports: int, length: int) -> bytes:
    """An ordinary frame from the host on ``port`` to the host on the next port (a permutation: every
    egress gets one stream), ``length`` bytes."""
    eth = proto.EthHeader(host_mac((port + 1) % ports), host_mac(port), 0x0800).pack()
    return eth + bytes((port + i) & 0xFF for i in range(length - len(eth)))


async def load_job(link, job: dict) -> dict:
    """Every port sends ``job["chunks"]`` frames back to back (the link queues them all at once, so tvalid
    never drops); every sink is always ready. ``job["scenario"]``: ``allreduce`` (contributions of
    ``payload`` bytes), ``forward`` (ordinary frames as long, to the next port) or ``mix`` (alternating).
    Checks every result against numpy and every forwarded frame; returns the ingress stamps per frame
    ([port, last beat cycle, beats]) and the cycles."""
    params = link.params
    P = params.ports
    regs = register_map(params)
    chunks, payload, scenario = int(job["chunks"]), int(job["payload"]), job.get("scenario", "allreduce")
    rng = np.random.default_rng(int(job.get("seed", 1)))
    values = rng.integers(-2**31, 2**31, (chunks, P, payload // 4), dtype=np.int64).astype(np.int32)
    everyone = (1 << P) - 1
    writes = rule_writes(regs, 0, Rule.for_group(1, contributors=everyone, results=everyone, base=0,
                                                 count_log2=int(job["count_log2"])))
    for p in range(P):
        writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    # set aging on for the run (its scanner's visits hold back all-reduce headers), or off
    writes.append((regs["AGING"].address(), regs["AGING"].pack(age=int(job.get("age", 0)))))
    for addr, value in writes:
        await link.write(addr, value)
    link.take_sent()
    length = len(contribution(0, 0, values[0, 0]))
    sent_frames: dict[int, list[bytes]] = {p: [] for p in range(P)}
    for c in range(chunks):
        for p in range(P):
            fwd = scenario == "forward" or (scenario == "mix" and (c + p) % 2 == 1)
            if fwd:
                frame = forwarded(p, P, length)
                sent_frames[(p + 1) % P].append(frame)
            else:
                frame = contribution(p, c, values[c, p])
            link.send(p, frame)
    start = link.cycle
    wall = time.perf_counter()
    if not await wait_idle(link, limit=link.cycle + 100 * chunks * P * params.max_frame_beats):
        raise SystemExit("the switch did not drain")
    wall = time.perf_counter() - wall
    cycles = link.cycle - start
    got, fwd_got = set(), {p: [] for p in range(P)}
    for r in link.take_stamped():
        frame = proto.parse_frame(r.data)
        if frame.cais is None:
            fwd_got[r.port].append(r.data)
            continue
        c = frame.cais.seq_num
        want = values[c].astype(np.int64).sum(axis=0)
        want = ((want + 2**31) % 2**32) - 2**31
        if not np.array_equal(np.frombuffer(frame.payload, ">i4"), want):
            raise SystemExit(f"wrong result for chunk {c} on port {r.port}")
        got.add((c, r.port))
    if scenario == "allreduce" and len(got) != chunks * P:
        raise SystemExit(f"{chunks * P - len(got)} results missing")
    if any(sorted(fwd_got[p]) != sorted(sent_frames[p]) for p in range(P)):
        raise SystemExit("forwarded frames lost, duplicated or corrupted")
    beats = -(-length // params.beat_bytes)                 # every frame is as long
    sent = sorted((s.last, s.port, beats) for s in link.take_sent())
    return {"sent": sent, "cycles": cycles, "wall": wall}


def steady_rates(params: SwitchParams, sent: list[tuple[int, int, int]]) -> tuple[float, list[float]]:
    """Ingress beats accepted per cycle, summed over ports and per port, in the steady state: from the frame
    after which more beats than the ingress buffers hold were accepted, to the first port's last frame
    (every port still offers a beat on every cycle there)."""
    fill = params.ports * params.ingress_depth
    total, t0 = 0, None
    for last, _, beats in sent:
        total += beats
        if total > fill:
            t0 = last
            break
    t1 = min(max(last for last, port, _ in sent if port == p) for p in range(params.ports))
    if t0 is None or t1 <= t0:
        raise SystemExit("too few chunks to reach the steady state: raise --chunks")
    per_port = [sum(b for last, port, b in sent if port == p and t0 < last <= t1) / (t1 - t0)
                for p in range(params.ports)]
    return sum(per_port), per_port


def run_load(params: SwitchParams, chunks: int, payload: int, count_log2: int, backend: str,
             scenario: str = "allreduce", age: int = 0) -> dict:
    r = run_backend(backend, params, "bench_datapath:load_job",
                    {"chunks": chunks, "payload": payload, "count_log2": count_log2, "scenario": scenario,
                     "age": age})
    core, per_port = steady_rates(params, [tuple(x) for x in r["sent"]])
    return {"beats_per_cycle": core, "per_port_beats_per_cycle": per_port, "cycles": r["cycles"],
            "beats": sum(b for *_, b in r["sent"]), "wall": r["wall"], "cycles_per_s": r["cycles"] / r["wall"]}


async def latency_job(link, job: dict) -> dict:
    return await measure_latency(link, link.params.max_payload)


def run_load_latency(params: SwitchParams, backend: str) -> int:
    """Cycles from the cycle the last contribution's last beat is accepted to the cycle the result's first
    beat is (docs/interface.md's convention; cais.sim.timing.measure_latency)."""
    got = run_backend(backend, params, "bench_datapath:latency_job", {})
    if got["problems"]:
        raise SystemExit("latency run: " + "; ".join(got["problems"]))
    return got["latency"]


def decision_oversubscription(params: SwitchParams, frame_bytes: int) -> float:
    """Headers per cycle every port at line rate asks of the decision pipeline (which takes one per cycle),
    for frames of ``frame_bytes``: above 1.0 the ports share it and get 1/ratio of line rate each."""
    return params.ports / -(-frame_bytes // params.beat_bytes)


def line_rate_payload(params: SwitchParams) -> int:
    """The shortest all-reduce payload (a multiple of 4 bytes) whose frames every port can still take at
    line rate: frames of ``max(2, ports)`` beats (the decision takes one header per cycle, and a port's at
    most every other cycle), padded to 60 bytes if shorter."""
    beats = max(2, params.ports)
    return max(4, (beats * params.beat_bytes - proto.HEADERS_BYTES) // 4 * 4)


def sizes(params: SwitchParams) -> list[tuple[str, int]]:
    P = params
    state_bits = Shape.cast(state_entry_layout(P)).width * P.slots
    return [
        ("contribution banks (bits)", P.ports * P.slots * 2 * P.rows_per_set * P.data_width),
        ("slot state (bits)", state_bits),
        ("rule table (bits)", P.rules * Shape.cast(rule_layout(P)).width),
        ("MAC table (bits)", P.mac_entries * (1 + 48 + (P.ports - 1).bit_length())),
        ("ingress buffers (bits)", P.ports * P.ingress_depth * P.data_width),
        ("egress buffers (bits)", P.ports * P.egress_depth * (P.data_width + P.beat_bytes + 1)),
    ]


def main(argv=None) -> int:
    ap = Parser(prog="bench/bench_datapath.py", description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=integer(), default=SwitchParams.ports)
    ap.add_argument("--data-width", type=integer(), default=SwitchParams.data_width)
    ap.add_argument("--chunks", type=integer(8), default=128, help="frames per port per load run (>= 8)")
    ap.add_argument("--backend", choices=["verilator", "amaranth"], default="verilator")
    ap.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    ap.add_argument("--age", type=integer(0), default=0,
                    help="AGING.age during the load runs, in AGE_UNIT cycles (0: aging off, the default)")
    args = ap.parse_args(argv)
    try:
        params = SwitchParams(ports=args.ports, data_width=args.data_width)
    except ParamError as e:
        ap.error(str(e))

    P = params
    rows = []
    # Chunk c uses set c % 64 (32 slots): hosts keep the protocol's window, the result of a chunk leaves
    # long before its set is used again. (A host that reused a set before its result left would have its
    # contribution overwrite one the fold has still to read: the switch relies on the window rule, as
    # SwitchML's does.)
    for label, payload, count_log2 in (
            ("full-size chunks, each its own set", P.max_payload, 5),
            ("one-beat payloads (60-byte frames), each its own set", P.beat_bytes, 5)):
        r = run_load(P, args.chunks, payload, count_log2, args.backend, age=args.age)
        rows.append((label, payload, r))
    # every port loaded at once: line rate would be 1.0 beat per cycle on every port
    scenarios = {name: run_load(P, args.chunks, P.max_payload, 5, args.backend, name, age=args.age)
                 for name in ("allreduce", "forward", "mix")}
    short = line_rate_payload(P)
    scenarios["short"] = run_load(P, args.chunks, short, 5, args.backend, "allreduce", age=args.age)
    lat = run_load_latency(P, args.backend)
    if args.json:
        print(json.dumps({
            "params": P.as_dict(),
            "loads": [{"load": label, "payload_bytes": payload, **r} for label, payload, r in rows],
            "per_port_beats_per_cycle": {name: r["per_port_beats_per_cycle"] for name, r in scenarios.items()},
            "core_beats_per_cycle": {name: r["beats_per_cycle"] for name, r in scenarios.items()},
            "baseline_per_port_beats_per_cycle": baseline_per_port(P),
            "baseline_latency_cycles": BASELINE_LATENCY_4X64 if P == SwitchParams() else None,
            "latency_cycles": lat,
            "decision_oversubscription": {
                "min_frames": decision_oversubscription(P, proto.MIN_FRAME_BYTES),
                "max_payload_frames": decision_oversubscription(P, proto.HEADERS_BYTES + P.max_payload)},
            "memory_bits": dict(sizes(P)),
        }))
        return 0
    print(f"CAIS datapath benchmark: {P.ports} ports x {P.data_width}-bit beats, {P.slots} slots, "
          f"max payload {P.max_payload} B ({args.backend}, cycle-accurate)"
          + (f", set aging on (AGING.age {args.age})" if args.age else ""))
    print()
    print(f"{'load':52} {'payload B':>9} {'beats in':>9} {'cycles':>7} {'beats/cycle':>12} {'sim cyc/s':>10}")
    print(f"{'':52} {'':>9} {'':>9} {'':>7} {f'(limit {P.ports})':>12}")
    for label, payload, r in rows:
        print(f"{label:52} {payload:>9} {r['beats']:>9} {r['cycles']:>7} {r['beats_per_cycle']:>12.3f} "
              f"{r['cycles_per_s']:>10.0f}")
    print()
    print("every port sending full-size frames back to back; ingress beats per cycle per port (line rate 1.0)")
    print(f"{'scenario':10} {'core':>6} {'min port':>9} {'max port':>9} {'baseline':>9}  per port")
    for name, r in scenarios.items():
        per = r["per_port_beats_per_cycle"]
        print(f"{name:10} {r['beats_per_cycle']:>6.3f} {min(per):>9.3f} {max(per):>9.3f} "
              f"{baseline_per_port(P):>9.3f}  {' '.join(f'{x:.3f}' for x in per)}")
    print("(allreduce: contributions, each chunk its own set; forward: ordinary frames to the next port; mix: "
          "alternating; baseline: one shared core before the line-rate core, 1/ports)")
    print(f"(short: contributions of {short} bytes, {frame_beats(P, short)}-beat "
          f"frames, the shortest every port can send at line rate: the lanes' decisions hide the decision "
          f"pipeline's latency)")
    print()
    before = (f" (before the line-rate core: {BASELINE_LATENCY_4X64})"
              if P == SwitchParams() else "")
    print(f"latency, last contribution's last beat in -> first result beat out: {lat} cycles{before}")
    print(f"decision pipeline (one header per cycle) asked for, every port at line rate: "
          f"{decision_oversubscription(P, proto.MIN_FRAME_BYTES):.2f} headers/cycle with 60-byte frames, "
          f"{decision_oversubscription(P, proto.HEADERS_BYTES + P.max_payload):.2f} with full-size "
          f"contributions (above 1.00 the ports share it: oversubscribed by that ratio)")
    print()
    print(f"{'memory':28} {'bits':>10} {'KiB':>8}")
    for name, bits in sizes(P):
        print(f"{name:28} {bits:>10} {bits / 8192:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
