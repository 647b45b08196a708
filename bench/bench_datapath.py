"""Datapath benchmark: throughput at full offered load, result latency, memory sizes.

Runs the exported switch cycle-accurately on the C++-driven Verilator link (``--backend amaranth``: the
Amaranth design under amaranth.sim) and prints one table. Every port offers a frame on every cycle (tvalid
never drops) and every sink is always ready; the figure is the number of ingress beats the switch accepts
per cycle, summed over ports, in the steady state after the ingress buffers have filled (the limit is the
number of ports: every port at line rate), from the links' ingress stamps. A second table loads every port at
once with each load of ``LOADS`` (all-reduce contributions, forwarded frames, and both interleaved: every
port contributing to chunks that complete, with results to every port, between unicast frames to the next
port of the contribution's length, of ``max_frame`` bytes and of 60 bytes) and gives each port's ingress
beats per cycle (line rate: 1.0 per port) beside the bound the decision's one header per cycle sets, and
the results and forwarded frames that left in the measured window (a load whose window holds none of a
kind it sends is refused). Every result is checked against numpy on every port, every forwarded frame
byte for byte, so a fast wrong answer cannot pass. ``--json`` prints one JSON object instead
(``per_port_beats_per_cycle``, ``core_beats_per_cycle``, ``decision_bound_per_port`` and ``in_window``
keyed by load).

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
from cais.hdl.sram.slots import state_entry_layout
from cais.cmdline import Parser, integer
from cais.hdl.control.tables import rule_layout
from cais.params import JUMBO, ParamError, SwitchParams
from cais.registers import register_map
from cais.sim.backends import run_backend, wait_idle
from cais.sim.timing import documented_latency, frame_beats, measure_latency
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


#: The loads that load every port at once: (every port contributes to every chunk, the ordinary frames each
#: port sends per chunk to the next port). Contributions are full-size (``payload`` bytes), every port
#: contributes and gets every result; the ordinary frames go to the next port (a permutation: every egress
#: port gets one forwarded stream): "same" one as long as a contribution, "max_frame" two of ``max_frame``
#: bytes on every other chunk (chunks c with c + port even: the ports' frames keep changing phase against
#: each other), a number two of that many bytes on every other chunk, "random" one of 60 to ``max_frame``
#: bytes (uniform, seeded).
LOADS = {
    "allreduce": (True, None),
    "forward": (False, "same"),
    "mix": (True, "same"),
    "results_and_forwarding": (True, "max_frame"),
    "results_and_forwarding_short": (True, proto.MIN_FRAME_BYTES),
    "results_and_forwarding_random": (True, "random"),
}


def chunk_frames(params: SwitchParams, scenario: str, payload: int, chunk: int, port: int,
                 rng: np.random.Generator) -> list[tuple[bool, int]]:
    """(is a contribution, frame bytes) of each frame port ``port`` sends for chunk ``chunk``."""
    contributes, fwd = LOADS[scenario]
    contrib = max(proto.HEADERS_BYTES + payload, proto.MIN_FRAME_BYTES)
    out = [(True, contrib)] if contributes else []
    if fwd == "same":
        out.append((False, contrib))
    elif fwd == "random":
        out.append((False, int(rng.integers(proto.MIN_FRAME_BYTES, params.max_frame + 1))))
    elif fwd is not None:
        n = params.max_frame if fwd == "max_frame" else fwd
        out += [(False, n)] * (2 * ((chunk + port) % 2 == 0))
    return out


def mean_chunk(params: SwitchParams, scenario: str, payload: int) -> tuple[float, float]:
    """(frames, beats) a port sends per chunk, on average (over two chunks; the mean for "random")."""
    contributes, fwd = LOADS[scenario]
    beats = lambda n: -(-n // params.beat_bytes)                         # noqa: E731
    contrib = max(proto.HEADERS_BYTES + payload, proto.MIN_FRAME_BYTES)
    frames, total = (1, beats(contrib)) if contributes else (0, 0)
    if fwd == "same":
        frames, total = frames + 1, total + beats(contrib)
    elif fwd == "random":
        lengths = range(proto.MIN_FRAME_BYTES, params.max_frame + 1)
        frames, total = frames + 1, total + sum(map(beats, lengths)) / len(lengths)
    elif fwd is not None:
        frames, total = frames + 1, total + beats(params.max_frame if fwd == "max_frame" else fwd)
    return frames, total


def stagger_frames(params: SwitchParams, scenario: str, payload: int, port: int) -> list[int]:
    """Bytes of the forwarded frames port ``port`` sends before its first chunk under a load that carries
    results and forwarded frames: ``port / ports`` of a chunk's beats, so that the ports' frames do not
    line up at the start (in lockstep every result would find all its ports ending a frame in the same
    cycle). Frames of 60 to ``max_frame`` bytes; none for port 0."""
    contributes, fwd = LOADS[scenario]
    if not contributes or fwd is None:
        return []
    B = params.beat_bytes
    left = int(port * mean_chunk(params, scenario, payload)[1]) // params.ports * B
    out = []
    while left >= proto.MIN_FRAME_BYTES:
        n = min(left, params.max_frame // B * B)
        if 0 < left - n < proto.MIN_FRAME_BYTES:
            n = left - proto.MIN_FRAME_BYTES
        out.append(n)
        left -= n
    return out


def decision_bound(params: SwitchParams, scenario: str, payload: int) -> float:
    """The ingress beats per cycle per port a load can reach when every port sends it at line rate: the
    decision pipeline takes one header per cycle from all ports, so with ``k`` frames of ``b`` beats in all
    per port and chunk (on average), every port at rate ``x`` asks for ``ports x k / b`` headers per cycle,
    which must not exceed 1: ``x <= b / (ports x k)``, and ``x <= 1`` (line rate)."""
    frames, beats = mean_chunk(params, scenario, payload)
    return min(1.0, beats / (params.ports * frames))


async def load_job(link, job: dict) -> dict:
    """Every port sends ``job["chunks"]`` rounds of ``LOADS[job["scenario"]]`` back to back, after its
    :func:`stagger_frames` (the link queues
    them all at once, so tvalid never drops); every sink is always ready. Checks that the load did what its
    name says: every chunk's result arrived on every port, bit-exact (numpy), in chunk order; every
    forwarded frame arrived byte-exact, in order, on the next port; nothing else arrived. Returns the
    ingress stamps per frame ([last beat cycle, port, beats, first beat cycle]), the egress stamps of
    results and forwarded frames ([first beat cycle, is a result]) and the cycles."""
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
    has_results = LOADS[scenario][0]
    sent_frames: dict[int, list[bytes]] = {p: [] for p in range(P)}     # forwarded frames, per egress port
    beats_sent: dict[int, list[int]] = {p: [] for p in range(P)}        # beats of each frame, per ingress port
    for p in range(P):
        for nbytes in stagger_frames(params, scenario, payload, p):
            frame = forwarded(p, P, nbytes)
            sent_frames[(p + 1) % P].append(frame)
            beats_sent[p].append(-(-len(frame) // params.beat_bytes))
            link.send(p, frame)
    for c in range(chunks):
        for p in range(P):
            for is_contribution, nbytes in chunk_frames(params, scenario, payload, c, p, rng):
                if is_contribution:
                    frame = contribution(p, c, values[c, p])
                else:
                    frame = forwarded(p, P, nbytes)
                    sent_frames[(p + 1) % P].append(frame)
                beats_sent[p].append(-(-len(frame) // params.beat_bytes))
                link.send(p, frame)
    start = link.cycle
    wall = time.perf_counter()
    if not await wait_idle(link, limit=link.cycle + 100 * chunks * P * params.max_frame_beats):
        raise SystemExit("the switch did not drain")
    wall = time.perf_counter() - wall
    cycles = link.cycle - start
    results: dict[int, list[int]] = {p: [] for p in range(P)}
    fwd_got: dict[int, list[bytes]] = {p: [] for p in range(P)}
    egress = []
    for r in link.take_stamped():
        frame = proto.parse_frame(r.data)
        if frame.cais is None:
            fwd_got[r.port].append(r.data)
            egress.append((r.first, False))
            continue
        c = frame.cais.seq_num
        if not (frame.cais.flags & proto.Flags.RESULT) or c >= chunks:
            raise SystemExit(f"port {r.port}: an unexpected CAIS frame (seq {c}, flags {frame.cais.flags})")
        want = values[c].astype(np.int64).sum(axis=0)
        want = ((want + 2**31) % 2**32) - 2**31
        if not np.array_equal(np.frombuffer(frame.payload, ">i4"), want):
            raise SystemExit(f"wrong result for chunk {c} on port {r.port}")
        results[r.port].append(c)
        egress.append((r.first, True))
    want_results = list(range(chunks)) if has_results else []
    for p in range(P):
        if results[p] != want_results:
            raise SystemExit(f"port {p}: results of chunks {results[p][:8]}..., expected each of "
                             f"{len(want_results)} chunks once, in order")
        if fwd_got[p] != sent_frames[p]:
            raise SystemExit(f"port {p}: forwarded frames lost, duplicated, reordered or corrupted")
    stamps = sorted(link.take_sent(), key=lambda s: s.first)
    sent = []
    k = {p: 0 for p in range(P)}
    for s in stamps:
        sent.append((s.last, s.port, beats_sent[s.port][k[s.port]], s.first))
        k[s.port] += 1
    return {"sent": sorted(sent), "egress": sorted(egress), "cycles": cycles, "wall": wall}


def steady_window(params: SwitchParams, sent: list[tuple[int, int, int, int]]) -> tuple[int, int]:
    """(t0, t1], the steady state: from the frame after which more beats than the ingress buffers hold were
    accepted, to the first port's last frame (every port still offers a beat on every cycle there)."""
    fill = params.ports * params.ingress_depth
    total, t0 = 0, None
    for last, _, beats, _ in sent:
        total += beats
        if total > fill:
            t0 = last
            break
    t1 = min(max(s[0] for s in sent if s[1] == p) for p in range(params.ports))
    if t0 is None or t1 <= t0:
        raise SystemExit("too few chunks to reach the steady state: raise --chunks")
    return t0, t1


def steady_rates(params: SwitchParams, sent: list[tuple[int, int, int, int]]) -> tuple[float, list[float]]:
    """Ingress beats accepted per cycle, summed over ports and per port, in the steady state
    (:func:`steady_window`). A frame's beats count in proportion to the part of its span (first to last
    beat) inside the window: exact when its beats came one per cycle."""
    t0, t1 = steady_window(params, sent)
    per_port = [0.0] * params.ports
    for last, port, beats, first in sent:
        inside = min(last, t1) - max(first - 1, t0)
        if inside > 0:
            per_port[port] += beats * inside / (last - first + 1)
    per_port = [b / (t1 - t0) for b in per_port]
    return sum(per_port), per_port


def run_load(params: SwitchParams, chunks: int, payload: int, count_log2: int, backend: str,
             scenario: str = "allreduce", age: int = 0) -> dict:
    r = run_backend(backend, params, "bench_datapath:load_job",
                    {"chunks": chunks, "payload": payload, "count_log2": count_log2, "scenario": scenario,
                     "age": age})
    sent = [tuple(x) for x in r["sent"]]
    core, per_port = steady_rates(params, sent)
    t0, t1 = steady_window(params, sent)
    in_window = [is_result for first, is_result in r["egress"] if t0 < first <= t1]
    n_results, n_forwarded = sum(in_window), len(in_window) - sum(in_window)
    contributes, fwd = LOADS[scenario]
    if contributes and not n_results or fwd is not None and not n_forwarded:
        raise SystemExit(f"{scenario}: the measured window ({t0}, {t1}] holds {n_results} results and "
                         f"{n_forwarded} forwarded frames: it measured no mix, raise --chunks")
    return {"beats_per_cycle": core, "per_port_beats_per_cycle": per_port, "cycles": r["cycles"],
            "beats": sum(s[2] for s in sent), "wall": r["wall"], "cycles_per_s": r["cycles"] / r["wall"],
            "window": [t0, t1], "results_in_window": n_results, "forwarded_in_window": n_forwarded,
            "decision_bound": decision_bound(params, scenario, payload)}


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
        ("result queues (bits)", P.ports * P.result_queue_depth * (P.data_width + P.beat_bytes + 1)),
    ]


# --- the summary table (--summary): one table of what the builds deliver ---------------------------------------

#: The builds of the summary: bench_area's design (its Fmax) -> the parameters.
SUMMARY_BUILDS = {"switch": SwitchParams(), "switch_int": SwitchParams(float_units=False),
                  "switch_jumbo": SwitchParams(**JUMBO)}
#: SwitchML on Tofino, 100 GbE ports (docs/core-design.md; /work/shared/REFERENCES.md): aggregated int32
#: elements per second per job, flat from 4 to 16 workers.
SWITCHML_ELEMENTS_PER_S = 2.8e9
SWITCHML_HARDWARE = ("Tofino ASIC (6.5 Tb/s, 100 GbE ports, 32-bit adds in its match-action stages); CAIS is "
                     "an ECP5 FPGA design out of context, ports of data_width bits at its Fmax")


def area_fmax(designs: list[str], seeds: int, log=print, area_json: Path | None = None) -> dict[str, dict]:
    """bench_area's rows for ``designs``: those in ``area_json`` (what ``bench_area.py --json`` printed)
    from there, the others through its functions and its cache (the tools run only for designs not placed
    yet, a whole switch taking tens of minutes), with ``seeds`` placement seeds from 1."""
    import bench_area

    out = {}
    if area_json is not None:
        try:
            rows = json.loads(Path(area_json).read_text().strip().splitlines()[-1])["results"]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise SystemExit(f"--area-json {area_json}: not the output of bench_area.py --json ({exc})")
        out = {name: rows[name] for name in designs if name in rows}
        for name in out:
            log(f"  area {name}: from {area_json}")
    missing = [name for name in designs if name not in out]
    ok, versions = bench_area.tools_available()
    if missing and not ok:
        raise SystemExit(f"bench_area: {versions}")
    opts = bench_area.FlowOptions(runs=seeds)
    for name in missing:
        job = bench_area.prepare(bench_area.DESIGNS[name], Path(__file__).resolve().parent.parent / "build" / "area")
        out[name] = bench_area.run_design(job, opts)
        log(f"  area {name}: {'cached' if out[name]['cached'] else 'placed and routed'}")
    return out


def fp32_beats_per_cycle(params: SwitchParams) -> float | None:
    """fp32 SUM's ingress beats per cycle per port on a float build, from bench_numerics' throughput run
    (full-capacity contributions from every port back to back, results checked)."""
    if not params.float_units:
        return None
    import bench_numerics

    row = bench_numerics.ROWS["fp32.sum.wire"]
    result = bench_numerics.run_rows(params, [row], elements=2000, seed=1, load_chunks=24, jobs=1,
                                     log=lambda *a: None)[0]
    if result.get("problems"):
        raise SystemExit(f"fp32 on {params.slug()}: " + "; ".join(result["problems"][:3]))
    return result["beats_per_cycle"] / params.ports


def build_figures(P: SwitchParams, fmax: float | None, per_port: float, fp32_per_port: float | None) -> dict:
    """One build's row from its Fmax (MHz) and the measured ingress beats per cycle per port of int32 (and
    fp32) all-reduce loads of full-size contributions: a port's line rate (data_width x Fmax), and the
    result elements per second of one job: per_port / (beats of a full frame) chunks per cycle, each of
    max_payload / 4 elements."""
    beats = frame_beats(P, P.max_payload)

    def per_s(bpc):
        return bpc * (P.max_payload // 4) / beats * fmax * 1e6 if bpc is not None and fmax else None

    row = {"params": P.as_dict(), "fmax_mhz": fmax, "port_gbps": P.data_width * fmax / 1e3 if fmax else None,
           "frame_beats": beats, "allreduce_beats_per_cycle_per_port": per_port,
           "fp32_beats_per_cycle_per_port": fp32_per_port,
           "int32_elements_per_s": per_s(per_port), "fp32_elements_per_s": per_s(fp32_per_port)}
    for kind in ("int32", "fp32"):
        value = row[f"{kind}_elements_per_s"]
        row[f"{kind}_vs_switchml"] = value / SWITCHML_ELEMENTS_PER_S if value else None
    return row


def summary(seeds: int, ring_elements: int, ranks: list[int], chunks: int, log=print,
            area_json: Path | None = None) -> dict:
    """The figures of the summary table; see :func:`summary_table`."""
    import bench_cosim

    areas = area_fmax(list(SUMMARY_BUILDS), seeds, log, area_json)
    builds = {}
    for name, P in SUMMARY_BUILDS.items():
        count_log2 = min(5, P.slots.bit_length() - 1)
        load = run_load(P, chunks, P.max_payload, count_log2, "verilator")
        per_port = min(load["per_port_beats_per_cycle"])
        row = build_figures(P, areas[name]["fmax_mhz"], per_port, fp32_beats_per_cycle(P))
        builds[name] = {**row, "fmax_seeds": areas[name].get("seeds"), "bram": areas[name].get("bram"),
                        "lut4": areas[name].get("lut4")}
        log(f"  {name}: {per_port:.3f} beats/cycle per port")
    ring = {}
    for name in ("switch", "switch_jumbo"):
        extra = {k: v for k, v in SUMMARY_BUILDS[name].as_dict().items() if v != getattr(SwitchParams(), k)}
        ring[name] = bench_cosim.switch_vs_ring(ranks, ring_elements, extra=extra)
        log(f"  switch against ring, {name}: done")
    return {"builds": builds, "switch_vs_ring": ring, "ring_elements": ring_elements, "seeds": seeds,
            "switchml_elements_per_s": SWITCHML_ELEMENTS_PER_S, "switchml_hardware": SWITCHML_HARDWARE}


def summary_table(s: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    lines = [f"{'build':13} {'payload':>7} {'Fmax MHz':>8} {'BRAM':>5} {'port Gb/s':>9} {'beats/cyc':>9} "
             f"{'int32 el/s':>10} {'/SwitchML':>9} {'fp32 el/s':>10} {'/SwitchML':>9}"]
    for name, r in s["builds"].items():
        lines.append(f"{name:13} {r['params']['max_payload']:>7} {f(r['fmax_mhz'], '.1f'):>8} {f(r['bram'], 'd'):>5} "
                     f"{f(r['port_gbps'], '.2f'):>9} {r['allreduce_beats_per_cycle_per_port']:>9.3f} "
                     f"{f(r['int32_elements_per_s'], '.3g'):>10} {f(r['int32_vs_switchml'], '.3f'):>9} "
                     f"{f(r['fp32_elements_per_s'], '.3g'):>10} {f(r['fp32_vs_switchml'], '.3f'):>9}")
    lines += ["", f"switch (INA) against the host ring on the same switch, {s['ring_elements']} int32 elements per "
              "rank (bench_cosim.switch_vs_ring):",
              f"{'build':13} {'N':>3} {'INA B/rank':>10} {'ring B/rank':>11} {'INA/ring':>8} {'limit':>6} "
              f"{'INA cycles':>10} {'ring cycles':>11}"]
    for name, rows in s["switch_vs_ring"].items():
        by_n = {}
        for r in rows:
            by_n.setdefault(r["ranks"], {})[r["path"]] = r
        for n, pair in by_n.items():
            sw, ring = pair["switch"], pair["ring"]
            lines.append(f"{name:13} {n:>3} {sw['bytes_per_rank']:>10.0f} {ring['bytes_per_rank']:>11.0f} "
                         f"{sw['ratio']:>8.3f} {sw['limit']:>6.3f} {sw['cycles']:>10} {ring['cycles']:>11}")
    lines += ["", "port Gb/s: data_width x Fmax (bench_area, median of the seeds' Fmax); beats/cyc: the all-reduce "
              "load's ingress beats per cycle on the slowest port (every port sending full-size contributions "
              "back to back, results checked; line rate 1.0); el/s: result elements per second per job at Fmax "
              "(beats/cyc x elements per frame / beats per frame x Fmax; fp32 from bench_numerics' fp32.sum "
              "run, float builds only).",
              f"SwitchML: {s['switchml_elements_per_s']:.2g} int32 elements/s per job on a {s['switchml_hardware']}.",
              "INA/ring: a rank's bytes on the switch over its bytes on the host ring (acknowledgements "
              "included); limit N/(2(N-1))."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = Parser(prog="bench/bench_datapath.py", description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=integer(), default=SwitchParams.ports)
    ap.add_argument("--data-width", type=integer(), default=SwitchParams.data_width)
    ap.add_argument("--chunks", type=integer(8), default=128, help="frames per port per load run (>= 8)")
    ap.add_argument("--backend", choices=["verilator", "amaranth"], default="verilator")
    ap.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    ap.add_argument("--age", type=integer(0), default=0,
                    help="AGING.age during the load runs, in AGE_UNIT cycles (0: aging off, the default)")
    ap.add_argument("--summary", action="store_true",
                    help="the summary table instead: per build (default, integer-only, jumbo) Fmax and per-port "
                         "Gb/s (bench_area), int32/fp32 result elements per second against SwitchML's, and the "
                         "switch against the host ring at --ranks (bench_cosim)")
    ap.add_argument("--seeds", type=integer(1), default=3,
                    help="--summary: bench_area placement seeds per build (the median Fmax; default 3)")
    ap.add_argument("--ranks", default="2,4,8", help="--summary: comma-separated rank counts (2..16)")
    ap.add_argument("--ring-elements", type=integer(1), default=16384,
                    help="--summary: int32 elements per rank for the switch against the ring")
    ap.add_argument("--area-json", type=Path,
                    help="--summary: the Fmax and BRAM of the builds from this file (bench_area.py --json's output) "
                         "instead of bench_area's cache")
    args = ap.parse_args(argv)
    if args.summary:
        try:
            ranks = [int(r) for r in args.ranks.split(",")]
        except ValueError:
            ap.error(f"--ranks {args.ranks!r}: a comma-separated list of integers")
        if any(not 2 <= n <= 16 for n in ranks):
            ap.error(f"--ranks {args.ranks}: every count must be between 2 and 16")
        s = summary(args.seeds, args.ring_elements, ranks, args.chunks,
                    log=(lambda *a: print(*a, file=sys.stderr, flush=True)), area_json=args.area_json)
        print(json.dumps(s) if args.json else summary_table(s))
        return 0
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
                 for name in LOADS}
    short = line_rate_payload(P)
    scenarios["short"] = run_load(P, args.chunks, short, 5, args.backend, "allreduce", age=args.age)
    lat = run_load_latency(P, args.backend)
    if args.json:
        print(json.dumps({
            "params": P.as_dict(),
            "loads": [{"load": label, "payload_bytes": payload, **r} for label, payload, r in rows],
            "per_port_beats_per_cycle": {name: r["per_port_beats_per_cycle"] for name, r in scenarios.items()},
            "core_beats_per_cycle": {name: r["beats_per_cycle"] for name, r in scenarios.items()},
            "decision_bound_per_port": {name: r["decision_bound"] for name, r in scenarios.items()},
            "in_window": {name: {"results": r["results_in_window"], "forwarded": r["forwarded_in_window"],
                                 "cycles": r["window"][1] - r["window"][0]} for name, r in scenarios.items()},
            "baseline_per_port_beats_per_cycle": baseline_per_port(P),
            "baseline_latency_cycles": BASELINE_LATENCY_4X64 if P == SwitchParams() else None,
            "latency_cycles": lat,
            "documented_latency_cycles": documented_latency(P, P.max_payload),
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
    print("every port sending back to back; ingress beats per cycle per port (line rate 1.0; bound: what the "
          "decision's one header per cycle allows)")
    print(f"{'scenario':29} {'core':>6} {'min port':>9} {'max port':>9} {'bound':>6} {'baseline':>9} "
          f"{'results':>8} {'fwd':>6}  per port")
    for name, r in scenarios.items():
        per = r["per_port_beats_per_cycle"]
        print(f"{name:29} {r['beats_per_cycle']:>6.3f} {min(per):>9.3f} {max(per):>9.3f} "
              f"{r['decision_bound']:>6.3f} {baseline_per_port(P):>9.3f} {r['results_in_window']:>8} "
              f"{r['forwarded_in_window']:>6}  {' '.join(f'{x:.3f}' for x in per)}")
    print("(per chunk every port sends: allreduce a contribution (every port contributes, results to every "
          "port); forward an ordinary frame as long to the next port; mix both; results_and_forwarding a "
          f"contribution, and two {P.max_frame}-byte (max_frame) frames to the next port every other chunk "
          f"(port by port out of step); ..._short the same with {proto.MIN_FRAME_BYTES}-byte frames; "
          f"..._random a contribution and a frame of {proto.MIN_FRAME_BYTES}-{P.max_frame} bytes. bound: "
          "min(1, beats / (ports x frames)) per chunk, the decision's one header per cycle. results / fwd: "
          "frames of each kind that left in the measured window. baseline: one shared core before the "
          "line-rate core, 1/ports)")
    print(f"(short: contributions of {short} bytes, {frame_beats(P, short)}-beat "
          f"frames, the shortest every port can send at line rate: the lanes' decisions hide the decision "
          f"pipeline's latency)")
    print()
    before = (f" (before the line-rate core: {BASELINE_LATENCY_4X64})"
              if P == SwitchParams() else "")
    print(f"latency, last contribution's last beat in -> first result beat out: {lat} cycles{before}; "
          f"documented (the blocks' latencies, cais.hdl.latency): {documented_latency(P, P.max_payload)}")
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
