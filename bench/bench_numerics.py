"""Numerics benchmark: bit-exactness, throughput, latency, SRAM and area of every element type and operator.

One row per (dtype, operator, mode); the modes are ``wire`` (the wire format's own arithmetic),
``saturate`` (integer SUM clamps), ``acc_fp32`` (fp16/bf16 accumulated in binary32, rounded once),
``reproducible`` and ``reproducible+acc_fp32`` (the driver's request for arrival-order independent results;
the switch folds every rule in ascending port order, so these rows must give the same bits as the others). Everything runs on the exported Verilog (``cais_switch``) under Verilator,
through the project's cached build and the C++-driven link (``cais.sim.backends.run_backend("verilator",
...)``, entry point :func:`sim_main`; ``--backend cocotb`` runs the same through cocotb), at the default
:class:`~cais.params.SwitchParams`. For each row:

1. **Check.** ``--elements`` random result elements (default 20000) plus an edge-case catalogue, in
   all-reduce chunks of the row's full set capacity with one contribution from every port. The random
   operands come from the generators of :mod:`cais.sim.operands` (shared with the unit tests; integer extremes,
   overflowing sums; random float bits, cancellation, subnormals, the special-value catalogue) plus, for
   floats, same-scale Gaussian contributions (ordinary gradients, rounding at every addition); the edge
   catalogue is every ordered pair of the format's special values (``catalogue``/``maxmin_catalogue``,
   its named adder pairs, the integer extremes) on ports 0 and 1, with catalogue values
   on the other ports. Each chunk's contributions go in a random port order, one frame at a time over
   the ports (the next frame starts when the previous one's last beat is taken), so the core receives
   them in that order; :class:`cais.sim.refmodel.SwitchModel`, fed the same frames in the same order,
   gives the expected result frames (the port-order fold), and every port's result frame must equal them
   byte for byte, whatever the order of arrival.
2. **Throughput.** Every port offers ``--load-chunks`` full-capacity contributions back to back
   (tvalid never drops, every sink ready), chunk c to set c of the group's quota (``LOAD_COUNT_LOG2``:
   the hosts keep the protocol's window, a set is used again long after its result left).
   beats/cycle is the ingress beats (headers included) the core consumes per cycle in the steady state:
   ``P * beats per frame`` per chunk, over the spacing of the chunks' results on port 0 from the first
   quarter of the chunks to the last (limit ``P``: every port at line rate). The results are checked too,
   against the port-order fold.
3. **Latency.** Ports 0..P-2 send one full-capacity contribution; once the switch has counted them and
   gone quiet, port P-1 sends the last. Latency is the number of clock edges from the one that takes
   its last beat to the one after which the first result beat shows on an egress port (as
   bench/bench_datapath.py counts it).

SRAM: a chunk in flight occupies one shadow set in every port's bank, ``ports * max_payload * 8`` bits,
whatever the mode; a chunk carries ``max_payload`` bytes (every kind of rule's set holds that much). Area (unless
``--no-area``): bench/bench_area.py's designs ``slot_alu``, ``switch`` and ``switch_int``, through its
functions and its cache
(a whole-switch place and route takes several minutes the first time).

    python bench/bench_numerics.py [--elements 20000] [--seed 1] [--only ROWS] [--load-chunks 24]
                                   [--jobs 2] [--no-area] [--list] [--json]

``--only`` takes row names or shell patterns (``fp16.*``, ``*.reproducible``), repeatable or
comma-separated; ``--list`` prints the row names.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import pickle
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cais import numerics
from cais import protocol as proto
from cais.cmdline import Parser, integer
from cais.params import SwitchParams
from cais.sim import operands

__all__ = ["Row", "ROWS", "build_parser", "parse_args", "select_rows", "plan_row", "sim_main", "simulate",
           "check_row", "run_rows", "sram", "numerics_table", "mode_table", "area_results", "area_table", "main"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:              # the sibling scripts: bench_area's flow and table layout
    sys.path.insert(0, str(HERE))
from bench_area import _table  # noqa: E402

D, R = proto.DType, proto.ReduceOp
GROUP = 5
SWITCH_MAC = 0x02_5A_0F_00_00_01
CHECK_COUNT_LOG2 = 3          # the check phase spreads chunks over 8 slots
LOAD_COUNT_LOG2 = 5           # the throughput run: 32 slots, chunk c in set c % 64 (the default switch has 64)


def load_count_log2(params: SwitchParams) -> int:
    """The throughput run's quota: LOAD_COUNT_LOG2, or every slot of a build with fewer (the jumbo one's 16)."""
    return min(LOAD_COUNT_LOG2, params.slots.bit_length() - 1)
DEFAULT_ELEMENTS = 20_000
DEFAULT_SEED = 1
DEFAULT_LOAD_CHUNKS = 24
DEFAULT_JOBS = 2
AREA_DESIGNS = ("slot_alu", "switch", "switch_int")
ENTRY = "bench_numerics:sim_main"


# --- rows -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    dtype: proto.DType
    op: proto.ReduceOp
    mode: str                  # wire, saturate, acc_fp32, reproducible, reproducible+acc_fp32

    @property
    def name(self) -> str:
        return f"{self.dtype.name.lower()}.{self.op.name.lower()}.{self.mode}"

    @property
    def acc_fp32(self) -> bool:
        return "acc_fp32" in self.mode

    @property
    def saturate(self) -> bool:
        return self.mode == "saturate"

    @property
    def reproducible(self) -> bool:
        return self.mode.startswith("reproducible")

    def capacity(self, params: SwitchParams) -> int:
        return params.max_payload            # every kind of rule's set holds max_payload bytes

    def elements_per_chunk(self, params: SwitchParams) -> int:
        return self.capacity(params) // proto.ELEMENT_BYTES[self.dtype]


def _rows() -> list[Row]:
    rows = []
    for dtype in proto.SUPPORTED_DTYPES:
        half = dtype in (D.FP16, D.BF16)
        for op in R:
            modes = ["wire"]
            if dtype in proto.INTEGER_DTYPES and op == R.SUM:
                modes.append("saturate")
            if half:
                modes.append("acc_fp32")
            modes.append("reproducible")
            if half:
                modes.append("reproducible+acc_fp32")
            rows += [Row(dtype, op, mode) for mode in modes]
    return rows


ROWS: dict[str, Row] = {row.name: row for row in _rows()}


# --- command line ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bench/bench_numerics.py",
                    description="Bit-exactness against the reference, beats per cycle, latency, SRAM and area "
                                "of every element type, operator and accumulation mode (Verilated switch).")
    parser.add_argument("--elements", type=integer(1), default=DEFAULT_ELEMENTS, metavar="N",
                        help=f"random result elements checked per row, besides the edge catalogue "
                             f"(default {DEFAULT_ELEMENTS})")
    parser.add_argument("--seed", type=integer(0), default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    parser.add_argument("--only", action="append", metavar="ROWS", default=None,
                        help="run only these rows: names or shell patterns (fp16.*, *.reproducible), "
                             "comma-separated or repeated; --list shows the names")
    parser.add_argument("--load-chunks", type=integer(8), default=DEFAULT_LOAD_CHUNKS, metavar="N",
                        help=f"chunks per port in the throughput run (default {DEFAULT_LOAD_CHUNKS}, at least 8)")
    parser.add_argument("--jobs", type=integer(1), default=DEFAULT_JOBS, metavar="N",
                        help=f"simulator runs (and place-and-route runs) in parallel (default {DEFAULT_JOBS})")
    parser.add_argument("--no-area", action="store_true", help="skip the yosys + nextpnr area table")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the figures, no table")
    return parser


def select_rows(patterns: list[str] | None) -> list[Row]:
    """The rows named by *patterns* (names or fnmatch patterns), in table order; ValueError if one matches
    nothing."""
    if not patterns:
        return list(ROWS.values())
    wanted: set[str] = set()
    for item in patterns:
        for pattern in filter(None, (p.strip() for p in item.split(","))):
            hits = fnmatch.filter(ROWS, pattern.lower())
            if not hits:
                raise ValueError(f"{pattern!r} matches no row (see --list)")
            wanted.update(hits)
    if not wanted:
        raise ValueError("no row named")
    return [row for name, row in ROWS.items() if name in wanted]


def parse_args(argv: list[str] | None = None):
    """Parse and check the command line; bad input exits with status 2 and a one-line message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.rows = select_rows(args.only)
    except ValueError as exc:
        parser.error(f"--only: {exc}")
    return args


# --- operands -------------------------------------------------------------------------------------------------


_INT_BITS = {D.INT32: 32, D.INT16: 16, D.INT8: 8}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}
_SINT = {8: np.int8, 16: np.int16, 32: np.int32}


def _values(dtype: proto.DType, bits: np.ndarray) -> np.ndarray:
    """Element bit patterns -> the values cais.numerics works on (bf16 stays uint16 bits)."""
    bits = np.asarray(bits, dtype=np.uint64)
    if dtype in _INT_BITS:
        w = _INT_BITS[dtype]
        return bits.astype(_UINT[w]).view(_SINT[w])
    if dtype == D.FP32:
        return bits.astype(np.uint32).view(np.float32)
    if dtype == D.FP16:
        return bits.astype(np.uint16).view(np.float16)
    return bits.astype(np.uint16)


def _bits(dtype: proto.DType, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    width = 8 * proto.ELEMENT_BYTES[dtype]
    return values.view(_UINT[width]) if values.dtype.kind != "u" else values.astype(_UINT[width])


def _pairs_to_ports(pairs, P: int) -> np.ndarray:
    """Stack generator pairs (a, b), (a, b), ... onto ports 0, 1, 2, 3, ... (P rows)."""
    rows = [x for pair in pairs for x in pair][:P]
    return np.stack(rows).astype(np.uint64)


def _same_scale(dtype: proto.DType, P: int, n: int, rng) -> np.ndarray:
    """Gaussian contributions sharing one binade per element (bits): sums that round at every step."""
    lo, hi = (-20, 12) if dtype == D.FP16 else (-120, 120)
    scale = np.exp2(rng.integers(lo, hi, n).astype(np.float64))
    x = rng.standard_normal((P, n)) * scale
    with np.errstate(over="ignore"):
        if dtype == D.FP32:
            return x.astype(np.float32).view(np.uint32).astype(np.uint64)
        if dtype == D.FP16:
            return x.astype(np.float16).view(np.uint16).astype(np.uint64)
        return numerics.f32_to_bf16(x.astype(np.float32)).astype(np.uint64)


def random_operands(row: Row, P: int, n: int, rng) -> np.ndarray:
    """(P, n) contribution bits: half edge-heavy pairs of the test generators, half (floats) same-scale."""
    if row.dtype in _INT_BITS:
        bits = _INT_BITS[row.dtype]
        return _pairs_to_ports([operands.int_pairs(bits, n, rng) for _ in range((P + 1) // 2)], P)
    fmt = operands.FLOAT_FMT[row.dtype]
    k = n // 2
    pairs = _pairs_to_ports([operands.float_pairs(fmt, k, rng) for _ in range((P + 1) // 2)], P)
    return np.concatenate([pairs, _same_scale(row.dtype, P, n - k, rng)], axis=1)


def edge_operands(row: Row, P: int, rng) -> np.ndarray:
    """(P, m) contribution bits: every ordered pair of the catalogue on ports 0 and 1 (for float SUM also the
    named adder pairs of tests/hdl/test_fpu.py), catalogue values on the other ports."""
    if row.dtype in _INT_BITS:
        w = _INT_BITS[row.dtype]
        lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
        cat = [lo, lo + 1, lo // 2 - 1, -2, -1, 0, 1, 2, hi // 2 + 1, hi - 1, hi]
        cat = [v & ((1 << w) - 1) for v in cat]
        a, b = operands.all_pairs(cat)
        a, b = np.tile(a, 8), np.tile(b, 8)          # 8 x 121 pairs, each with other partners
    else:
        fmt = operands.FLOAT_FMT[row.dtype]
        cat = operands.catalogue(fmt) if row.op == R.SUM else operands.maxmin_catalogue(fmt)
        a, b = operands.all_pairs(cat)
        if row.op == R.SUM:
            named = operands.directed_add_pairs(fmt)
            a = np.concatenate([a, np.array([x for x, _, _ in named], np.uint64)])
            b = np.concatenate([b, np.array([y for _, y, _ in named], np.uint64)])
    m = len(a)
    rest = [rng.choice(np.array(cat, np.uint64), m) for _ in range(P - 2)]
    return np.stack([a, b, *rest]).astype(np.uint64)


# --- the plan of one row --------------------------------------------------------------------------------------


def _rule_writes(params: SwitchParams, row: Row, count_log2: int) -> list[tuple[int, int]]:
    from cais.registers import register_map
    from cais.tables import Rule, rule_writes, slot_clear_writes

    regs = register_map(params)
    everyone = (1 << params.ports) - 1
    rule = Rule.for_group(GROUP, everyone, base=0, count_log2=count_log2, dtype=row.dtype, red_op=row.op,
                          acc_fp32=row.acc_fp32, saturate=row.saturate, reproducible=row.reproducible)
    return (rule_writes(regs, 0, rule) + slot_clear_writes(regs, 0, 1 << count_log2)
            + [(regs["SWITCH_MAC_LO"].address(), SWITCH_MAC & 0xFFFF_FFFF),
               (regs["SWITCH_MAC_HI"].address(), SWITCH_MAC >> 32)])


def _chunk_frames(row: Row, seq: int, count_log2: int, values: np.ndarray) -> list[bytes]:
    """The contribution frame of every port for chunk *seq*; values is (P, n) of numerics values."""
    from cais.sim.traffic import host_mac

    n = values.shape[1]
    hdr = proto.CaisHeader(group_id=GROUP, chunk_id=seq & 0xFFFF, total_chunks=1 << count_log2, seq_num=seq,
                           payload_len=n * proto.ELEMENT_BYTES[row.dtype], dtype=row.dtype, red_op=row.op)
    return [proto.build_frame(hdr, numerics.encode(row.dtype, values[p]), src=host_mac(p), pad=True)
            for p in range(values.shape[0])]


def _chunks(bits: np.ndarray, n: int, pad_rng, pad_from: np.ndarray) -> np.ndarray:
    """(P, m) bits -> (chunks, P, n), the last chunk filled up with columns of *pad_from*."""
    P, m = bits.shape
    count = max(1, -(-m // n))
    short = count * n - m
    if short:
        bits = np.concatenate([bits, pad_from[:, pad_rng.integers(0, pad_from.shape[1], short)]], axis=1)
    return bits.reshape(P, count, n).transpose(1, 0, 2)


def plan_row(params: SwitchParams, row: Row, elements: int, seed: int, load_chunks: int) -> dict:
    """Everything one row sends (frames, register writes), and what the checker needs to know."""
    P = params.ports
    n = row.elements_per_chunk(params)
    if n == 0:
        return {"name": row.name, "capacity": 0, "skip": "set capacity 0: the rule accepts no all-reduce frame"}
    rng = np.random.default_rng([seed, list(ROWS).index(row.name)])
    rand = random_operands(row, P, -(-elements // n) * n, rng)
    edge = edge_operands(row, P, rng)
    chunks = np.concatenate([_chunks(rand, n, rng, rand), _chunks(edge, n, rng, edge)])
    n_random = -(-elements // n)
    sequence, orders = [], []
    for seq, bits in enumerate(chunks):
        frames = _chunk_frames(row, seq, CHECK_COUNT_LOG2, _values(row.dtype, bits))
        order = [int(p) for p in rng.permutation(P)]
        orders.append(order)
        sequence += [(p, frames[p]) for p in order]
    load_bits = random_operands(row, P, load_chunks * n, rng)
    load = [_chunk_frames(row, c, load_count_log2(params), _values(row.dtype, load_bits[:, c * n:(c + 1) * n]))
            for c in range(load_chunks)]
    lat_frames = _chunk_frames(row, 0, 0, _values(row.dtype, random_operands(row, P, n, rng)))
    return {
        "name": row.name, "capacity": row.capacity(params), "n": n,
        "random_chunks": n_random, "edge_chunks": len(chunks) - n_random, "edge_elements": edge.shape[1],
        "check": {"writes": _rule_writes(params, row, CHECK_COUNT_LOG2), "sequence": sequence, "orders": orders},
        "load": {"writes": _rule_writes(params, row, load_count_log2(params)), "frames": [[load[c][p] for c in range(load_chunks)]
                                                                    for p in range(P)]},
        "latency": {"writes": _rule_writes(params, row, 0), "frames": lat_frames},
    }


# --- the simulator side (an entry point for cais.sim.backends.run_backend, on any link) ------------------------


async def drive(link, lanes, *, expect: int, quiet: int = 4000) -> dict:
    """Send *lanes* and collect the egress until *expect* frames came out (and 64 cycles more), or nothing
    came out for *quiet* cycles after the last beat was sent.

    A lane is a list of (port, frame), sent one frame after the other, the next frame's first beat right
    after the previous one's last; lanes run in parallel on distinct ports. Cycles are counted from 1 at
    the first edge after the call: returns per lane the cycle each frame's last beat was taken, the
    received frames as (cycle of the last beat, port, bytes), the cycle the first egress beat was taken,
    and the cycles run.
    """
    t0 = link.cycle - 1
    B = link.params.beat_bytes
    todo = [list(reversed(lane)) for lane in lanes]
    on_port: dict[int, list[int]] = {}               # port -> lanes with a frame queued there, in order
    earliest: dict[int, int] = {}                    # lane -> first cycle its frame can have been taken by
    done: list[list[int]] = [[] for _ in lanes]
    received = []

    def start(i: int) -> None:
        if todo[i]:
            port, frame = todo[i].pop()
            link.send(port, bytes(frame))
            on_port.setdefault(port, []).append(i)
            earliest[i] = link.cycle + -(-len(frame) // B)    # one beat per cycle at best

    def collect() -> int:
        got = link.take_stamped()
        received.extend(got)
        return len(got)

    for i in range(len(lanes)):
        start(i)
    while earliest:
        # no frame can have gone in before the earliest of them could: skip there, then cycle by cycle
        await link.advance(max(1, min(earliest.values()) - link.cycle))
        for sent in link.take_sent():
            i = on_port[sent.port].pop(0)
            del earliest[i]
            done[i].append(sent.last - t0)
            start(i)
        collect()
    while quiet and len(received) < expect:
        if await link.advance_to_frame(quiet) == quiet and not collect():
            break
        collect()
    if expect and len(received) >= expect:
        await link.advance(64)
        collect()
    first_out = min((r.first for r in received), default=None)
    return {"done": done, "received": [(r.last - t0, r.port, r.data) for r in received],
            "first_out": None if first_out is None else first_out - t0, "cycles": link.cycle - t0}


async def _apply(link, writes) -> None:
    for addr, value in writes:
        await link.write(addr, value)


async def _idle(link) -> bool:
    from cais.sim.backends import wait_idle
    return await wait_idle(link, limit=link.cycle + 200_000)


def _frames(run: dict) -> list[tuple[int, bytes]]:
    return [(port, data) for _, port, data in sorted(run["received"], key=lambda x: (x[0], x[1]))]


async def _run_row(link, plan: dict) -> dict:
    from cais.registers import register_map

    out = {"name": plan["name"]}
    P = link.params.ports
    t0 = time.perf_counter()
    # 1. check: one frame at a time, in the planned order
    await _apply(link, plan["check"]["writes"])
    sequence = plan["check"]["sequence"]
    run = await drive(link, [sequence], expect=len(sequence))
    out["check"], out["check_cycles"] = _frames(run), run["cycles"]
    out["check_idle"] = await _idle(link)
    t1 = time.perf_counter()
    # 2. full offered load
    await _apply(link, plan["load"]["writes"])
    frames = plan["load"]["frames"]
    lanes = [[(p, f) for f in frames[p]] for p in range(P)]
    run = await drive(link, lanes, expect=sum(map(len, lanes)))
    out["load"] = _frames(run)
    out["load_results"] = sorted(e for e, port, _ in run["received"] if port == 0)
    out["load_idle"] = await _idle(link)
    # 3. latency: all but the last port, then the last one alone
    await _apply(link, plan["latency"]["writes"])
    lat = plan["latency"]["frames"]
    contributions = register_map(link.params)["CONTRIBUTIONS"].address()
    before = await link.read(contributions)
    run = await drive(link, [[(p, lat[p])] for p in range(P - 1)], expect=0, quiet=0)
    for _ in range(10_000):
        if (await link.read(contributions) - before) & 0xFFFF_FFFF >= P - 1:
            break
    await link.advance(64)
    run = await drive(link, [[(P - 1, lat[P - 1])]], expect=P)
    out["latency"] = _frames(run)
    out["latency_in"], out["latency_out"] = run["done"][0][0], run["first_out"]
    out["latency_idle"] = await _idle(link)
    out["wall_check"], out["wall_rest"] = t1 - t0, time.perf_counter() - t1
    return out


async def sim_main(link, job: dict) -> dict:
    """Entry point (``run_backend(backend, params, "bench_numerics:sim_main", job)``): run the rows
    of the plan file ``job["plan"]`` and pickle what came back into ``job["out"]``."""
    with open(job["plan"], "rb") as handle:
        plans = pickle.load(handle)
    out = []
    for plan in plans:
        if plan.get("skip"):
            out.append({"name": plan["name"]})
            continue
        out.append(await _run_row(link, plan))
    tmp = job["out"] + ".tmp"
    with open(tmp, "wb") as handle:
        pickle.dump(out, handle)
    os.replace(tmp, job["out"])
    return {"rows": len(out), "cycles": link.cycle}


# --- checking (main process) ----------------------------------------------------------------------------------


def _payload_bits(row: Row, frame: bytes) -> np.ndarray:
    return _bits(row.dtype, numerics.decode(row.dtype, proto.parse_frame(frame).payload))


def _fold(row: Row, contributions: list[np.ndarray]) -> bytes:
    """The result payload for contributions arriving in the given order (numerics, as the model does)."""
    acc = numerics.fold(row.dtype, row.op, contributions, acc_fp32=row.acc_fp32, saturate=row.saturate)
    return numerics.encode(row.dtype, numerics.result_values(row.dtype, acc, acc_fp32=row.acc_fp32))


def _port_order_fold(row: Row, frames: list[bytes]) -> bytes:
    """The result payload of one chunk (frames[p] = port p's contribution): the port-order fold."""
    return _fold(row, [numerics.decode(row.dtype, proto.parse_frame(f).payload) for f in frames])


def _by_seq(received) -> dict[int, dict[int, list[bytes]]]:
    out: dict[int, dict[int, list[bytes]]] = {}
    for port, data in received:
        hdr = proto.parse_frame(data).cais
        seq = hdr.seq_num if hdr is not None else -1
        out.setdefault(seq, {}).setdefault(port, []).append(bytes(data))
    return out


def _hex(dtype: proto.DType, bits) -> str:
    return f"{int(bits):0{2 * proto.ELEMENT_BYTES[dtype]}x}"


def check_row(params: SwitchParams, row: Row, plan: dict, got: dict) -> dict:
    """Compare what the switch sent back (``got``, from :func:`sim_main`) with the reference."""
    from cais.sim.refmodel import SwitchModel

    P, n = params.ports, plan["n"]
    res = {"name": row.name, "capacity": plan["capacity"], "n": n, "problems": []}
    problems = res["problems"]

    # 1. check phase: the model fed the same frames in the same order
    model = SwitchModel(params)
    for addr, value in plan["check"]["writes"]:
        model.write(addr, value)
    expected: dict[int, dict[int, bytes]] = {}
    for port, frame in plan["check"]["sequence"]:
        for out_port, data in model.receive(port, frame):
            expected.setdefault(proto.parse_frame(data).cais.seq_num, {})[out_port] = data
    received = _by_seq(got["check"])
    chunks = plan["random_chunks"] + plan["edge_chunks"]
    contributions = {}
    for port, frame in plan["check"]["sequence"]:
        contributions.setdefault(proto.parse_frame(frame).cais.seq_num, {})[port] = frame
    mismatches = missing = header = 0
    random_bad = edge_bad = 0
    for seq in range(chunks):
        want = expected.get(seq, {})
        if sorted(want) != list(range(P)):
            problems.append(f"chunk {seq}: the reference model sent results to ports {sorted(want)}")
        bad = np.zeros(n, dtype=bool)
        frames_bad = False
        for p in range(P):
            frames = received.get(seq, {}).get(p, [])
            if len(frames) != 1:
                missing += 1
                bad[:] = True
                frames_bad = True
                if len(problems) < 20:
                    problems.append(f"chunk {seq}: port {p} received {len(frames)} result frames, not 1")
                continue
            frame, ref = frames[0], want.get(p)
            if ref is None or frame == ref:
                continue
            frames_bad = True
            if frame[:proto.HEADERS_BYTES] != ref[:proto.HEADERS_BYTES] or len(frame) != len(ref):
                header += 1
                bad[:] = True
                if len(problems) < 20:
                    problems.append(f"chunk {seq}: port {p}: result frame header or length differs "
                                    f"({len(frame)} B, want {len(ref)} B)")
                continue
            diff = _payload_bits(row, frame) != _payload_bits(row, ref)
            bad |= diff
        if not frames_bad:
            continue
        count = int(bad.sum())
        mismatches += count
        if seq < plan["random_chunks"]:
            random_bad += count
        else:
            edge_bad += count
        if len(problems) < 20 and count:
            order = plan["check"]["orders"][seq]
            vals = [_payload_bits(row, contributions[seq][p]) for p in order]
            ref_bits = _payload_bits(row, want[0]) if 0 in want else None
            got0 = received.get(seq, {}).get(0, [])
            got_bits = _payload_bits(row, got0[0]) if got0 else None
            for i in np.flatnonzero(bad)[:3]:
                ins = " ".join(f"p{p}:{_hex(row.dtype, v[i])}" for p, v in zip(order, vals))
                problems.append(f"chunk {seq} element {i}: in arrival order {ins} -> port 0 got "
                                f"{_hex(row.dtype, got_bits[i]) if got_bits is not None else '-'}, reference "
                                f"{_hex(row.dtype, ref_bits[i]) if ref_bits is not None else '-'}")
    unexpected = sorted(seq for seq in received if not 0 <= seq < chunks)
    if unexpected:
        problems.append(f"result frames of chunks never sent (seq_num {unexpected[:5]})")
    res.update(random_elements=plan["random_chunks"] * n, edge_elements=plan["edge_chunks"] * n,
               mismatches=mismatches, random_mismatches=random_bad, edge_mismatches=edge_bad,
               missing=missing, header=header)
    for phase in ("check", "load", "latency"):
        if not got.get(f"{phase}_idle", True):
            problems.append(f"the switch did not go idle after the {phase} run")

    # 2. load phase: every chunk's result on every port, the port-order fold
    load = plan["load"]["frames"]
    K = len(load[0])
    received = _by_seq(got["load"])
    load_bad = 0
    for c in range(K):
        allowed = {_port_order_fold(row, [load[p][c] for p in range(P)])}
        first = None
        for p in range(P):
            frames = received.get(c, {}).get(p, [])
            payload = proto.parse_frame(frames[0]).payload if len(frames) == 1 else None
            first = payload if first is None else first
            if payload is None or payload not in allowed or payload != first:
                load_bad += 1
    res["load_bad"] = load_bad
    if load_bad:
        problems.append(f"throughput run: {load_bad} of {K * P} result frames missing or wrong")
    edges = got["load_results"]
    beats = -(-len(load[0][0]) // params.beat_bytes)
    res["frame_beats"] = beats
    if len(edges) >= K and edges[K - 1] > edges[K // 4]:
        res["beats_per_cycle"] = (K - 1 - K // 4) * P * beats / (edges[K - 1] - edges[K // 4])
    else:
        res["beats_per_cycle"] = None
        problems.append(f"throughput run: only {len(edges)} of {K} results seen on port 0")

    # 3. latency
    lat = plan["latency"]["frames"]
    allowed = {_port_order_fold(row, lat)}
    rx = _by_seq(got["latency"]).get(0, {})
    if sorted(rx) != list(range(P)) or any(len(f) != 1 or proto.parse_frame(f[0]).payload not in allowed
                                          for f in rx.values()):
        problems.append("latency run: missing or wrong result")
    if got.get("latency_out") is not None:
        res["latency"] = got["latency_out"] - got["latency_in"] - 1
    else:
        res["latency"] = None
        problems.append("latency run: no result beat seen")
    res["wall_check"], res["wall_rest"] = got.get("wall_check", 0.0), got.get("wall_rest", 0.0)
    res["check_cycles"] = got.get("check_cycles", 0)
    return res


# --- running --------------------------------------------------------------------------------------------------


def simulate(params: SwitchParams, plans: list[dict], *, jobs: int, log=print,
             backend: str = "verilator") -> dict[str, dict]:
    """Run the planned rows on the Verilated switch (``jobs`` simulator runs in parallel, rows balanced by
    their simulated cycles); returns what :func:`sim_main` collected, by row name."""
    from cais.sim.backends import run_backend
    from cais.sim.build import build_native, build_switch

    if str(HERE) not in sys.path:          # a cocotb simulator process imports this module by name
        sys.path.insert(0, str(HERE))
    # once here, so parallel runs do not queue on the build lock
    build = build_switch(params) if backend == "cocotb" else build_native(params)
    log(f"Verilator build {build.build_dir} ({'cached' if build.cached else 'built'})")

    def cost(plan):
        return sum(len(f) for _, f in plan["check"]["sequence"]) if not plan.get("skip") else 0

    groups: list[list[dict]] = [[] for _ in range(max(1, min(jobs, len(plans))))]
    load = [0] * len(groups)
    for plan in sorted(plans, key=lambda pl: -cost(pl)):
        i = load.index(min(load))
        groups[i].append(plan)
        load[i] += cost(plan) + 2000
    got: dict[str, dict] = {}

    def one(group: list[dict]) -> None:
        if not group:
            return
        with tempfile.TemporaryDirectory(prefix="cais-numerics-") as tmp:
            plan_file, out_file = os.path.join(tmp, "plan.pkl"), os.path.join(tmp, "out.pkl")
            with open(plan_file, "wb") as handle:
                pickle.dump(group, handle)
            start = time.monotonic()
            try:
                run_backend(backend, params, ENTRY, {"plan": plan_file, "out": out_file})
            except Exception as exc:       # a failed run fails its rows, not the whole table
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log(f"  simulator run FAILED: {message}")
                for plan in group:
                    got[plan["name"]] = {"name": plan["name"], "error": message}
                return
            with open(out_file, "rb") as handle:
                for item in pickle.load(handle):
                    got[item["name"]] = item
            log(f"  simulated {len(group)} rows in {time.monotonic() - start:.0f} s")

    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        for future in [pool.submit(one, group) for group in groups]:
            future.result()
    return got


def run_rows(params: SwitchParams, rows: list[Row], *, elements: int, seed: int, load_chunks: int, jobs: int,
             log=print) -> list[dict]:
    """Plan, simulate and check *rows*; one result dict per row (see :func:`check_row`)."""
    plans = [plan_row(params, row, elements, seed, load_chunks) for row in rows]
    got = simulate(params, plans, jobs=jobs, log=log)
    results = []
    for row, plan in zip(rows, plans):
        if plan.get("skip"):
            results.append({"name": row.name, "capacity": 0, "skip": plan["skip"], "problems": []})
        elif "error" in got.get(row.name, {"error": "no result"}):
            results.append({"name": row.name, "capacity": plan["capacity"], "failed": True,
                            "problems": [f"simulation failed: {got.get(row.name, {}).get('error', 'no result')}"]})
        else:
            results.append(check_row(params, row, plan, got[row.name]))
    return results


def sram(params: SwitchParams, row: Row) -> tuple[int, int, float | None]:
    """(set capacity in payload bytes, SRAM bits a chunk in flight occupies, SRAM bits per payload byte)."""
    cap = row.capacity(params)
    bits = params.ports * params.rows_per_set * params.data_width
    return cap, bits, (bits / cap if cap else None)


# --- tables ---------------------------------------------------------------------------------------------------


def numerics_table(params: SwitchParams, rows: list[Row], results: list[dict]) -> str:
    body = []
    for row, r in zip(rows, results):
        cap, bits, per_byte = sram(params, row)
        if r.get("skip") or r.get("failed"):
            body.append([row.name, cap, "-", "-", "-", "FAILED" if r.get("failed") else "-", "-", "-", "-",
                         bits, "-"])
            continue
        bpc = r["beats_per_cycle"]
        body.append([row.name, cap, r["n"], r["random_elements"], r["edge_elements"], r["mismatches"],
                     r["frame_beats"], f"{bpc:.3f}" if bpc is not None else "-",
                     r["latency"] if r["latency"] is not None else "-", bits, f"{per_byte:.1f}"])
    return _table(body, ["row (dtype.op.mode)", "cap B", "elem/chunk", "random", "edge", "mismatches",
                         "beats/frame", "beats/cycle", "latency", "SRAM b/chunk", "b per B"])


def mode_table(params: SwitchParams, rows: list[Row], results: list[dict]) -> str:
    """What each mode costs, over the rows run: capacity, SRAM per payload byte, beats/cycle, latency."""
    by_mode: dict[str, list[tuple[Row, dict]]] = {}
    for row, r in zip(rows, results):
        by_mode.setdefault(row.mode, []).append((row, r))
    body = []
    for mode, items in by_mode.items():
        caps = sorted({row.capacity(params) for row, _ in items})
        per_byte = sorted({f"{sram(params, row)[2]:.1f}" for row, _ in items if sram(params, row)[2]})
        bpc = [r["beats_per_cycle"] for _, r in items if r.get("beats_per_cycle") is not None]
        lat = [r["latency"] for _, r in items if r.get("latency") is not None]
        body.append([mode, len(items), "/".join(map(str, caps)), "/".join(per_byte) or "-",
                     f"{min(bpc):.3f}-{max(bpc):.3f}" if bpc else "-", f"{min(lat)}-{max(lat)}" if lat else "-",
                     sum(r.get("mismatches", 0) for _, r in items)])
    return _table(body, ["mode", "rows", "cap B", "b per B", "beats/cycle", "latency", "mismatches"])


def area_results(jobs: int, log=print) -> tuple[dict, dict, dict]:
    """bench_area's rows for :data:`AREA_DESIGNS` (its cache; the tools run only for changed designs)."""
    import bench_area

    ok, versions = bench_area.tools_available()
    if not ok:
        return {}, {name: versions for name in AREA_DESIGNS}, {}
    opts = bench_area.FlowOptions()
    out = REPO / "build" / "area"
    results, skipped, failed = {}, {}, {}
    prepared = []
    for name in AREA_DESIGNS:
        try:
            prepared.append(bench_area.prepare(bench_area.DESIGNS[name], out))
        except bench_area.Skip as exc:
            skipped[name] = str(exc)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"

    def one(job):
        try:
            results[job["design"]] = bench_area.run_design(job, opts)
        except Exception as exc:
            failed[job["design"]] = str(exc)
        else:
            r = results[job["design"]]
            how = "cached" if r["cached"] else f"{r['wall_s']:.0f} s"
            log(f"  area {job['design']}: {how}")

    prepared.sort(key=lambda job: -job["verilog"].stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, prepared))
    return results, skipped, failed


def area_table(results: dict, skipped: dict, failed: dict) -> str:
    body = []
    for name in AREA_DESIGNS:
        if name in results:
            r = results[name]
            fmax = f"{r['fmax_mhz']:.1f}" if r["fmax_mhz"] is not None else "-"
            ff = r["ff"] - r["wrapper_ffs"]
            body.append([name, r["lut4"], ff, r["bram"], r["dsp"], fmax,
                         f"{r['wall_s']:.0f}{'*' if r['cached'] else ''}"])
        else:
            body.append([name, "-", "-", "-", "-", "-",
                         "skipped" if name in skipped else "FAILED" if name in failed else "not run"])

    def diff(label, a, b, div=1):
        if a in results and b in results:
            ra, rb = results[a], results[b]
            body.append([label, round((ra["lut4"] - rb["lut4"]) / div),
                         round(((ra["ff"] - ra["wrapper_ffs"]) - (rb["ff"] - rb["wrapper_ffs"])) / div),
                         round((ra["bram"] - rb["bram"]) / div), round((ra["dsp"] - rb["dsp"]) / div), "", ""])

    if "slot_alu" in results:
        r = results["slot_alu"]
        body.append(["slot_alu / 4 (per float lane)", round(r["lut4"] / 4), round((r["ff"] - r["wrapper_ffs"]) / 4),
                     r["bram"], r["dsp"], "", ""])
    diff("float units (switch - switch_int)", "switch", "switch_int")
    out = [_table(body, ["design", "LUT4", "FF", "BRAM", "DSP", "Fmax MHz", "time s"])]
    parts = sorted({r["part"] for r in results.values()})
    out.append(f"ECP5 {', '.join(parts) or '-'} (yosys synth_ecp5 + nextpnr-ecp5 --out-of-context, bench/bench_area.py's "
               "flow, defaults and cache; * = cached). LUT4 = TRELLIS_COMB cells (logic, carry halves, LUT RAM). "
               "FF excludes the slot_alu's register wrapper (every port registered). BRAM = DP16KD, "
               "DSP = MULT18X18D.")
    out.append("slot_alu = SlotALU(data_width=64): one 64-bit beat = 4 float32 lanes (FloatAdder + FloatMaxMin + "
               "widen/narrow) plus the 64-bit integer ALU and the muxes; the per-lane row divides it all by 4.")
    for name in AREA_DESIGNS:
        cp = results.get(name, {}).get("critical_path")
        if cp:
            out.append(f"{name}: critical path {cp['from']} -> {cp['to']}: {cp['logic_levels']} logic steps, "
                       f"{cp['logic_ns']} ns logic + {cp['routing_ns']} ns routing")
        if name in skipped:
            out.append(f"{name}: skipped: {skipped[name]}")
        if name in failed:
            out.append(f"{name}: FAILED: {failed[name]}")
    return "\n".join(out)


# --- main -----------------------------------------------------------------------------------------------------


def _failed(r: dict) -> bool:
    return bool(r.get("mismatches") or r.get("missing") or r.get("header") or r.get("load_bad")
                or r.get("problems") or r.get("failed"))


def print_json(params: SwitchParams, args) -> int:
    """``--json``: the rows' figures (and the area table's) as one JSON object; exit 1 if a row failed."""
    import json

    results = run_rows(params, args.rows, elements=args.elements, seed=args.seed, load_chunks=args.load_chunks,
                       jobs=args.jobs, log=lambda _: None)
    out = {"params": params.as_dict(), "elements": args.elements, "seed": args.seed, "rows": results}
    bad = any(_failed(r) for r in results)
    if not args.no_area:
        res, skipped, failed = area_results(args.jobs, log=lambda _: None)
        out["area"] = {"results": res, "skipped": skipped, "failed": failed}
        bad |= bool(failed)
    print(json.dumps(out, default=str))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = SwitchParams()
    if args.list:
        for row in ROWS.values():
            print(f"{row.name:34} capacity {row.capacity(params):3} B")
        return 0
    if args.json:
        return print_json(params, args)
    start = time.monotonic()
    print(f"CAIS numerics benchmark: {params.ports} ports x {params.data_width}-bit beats, max_payload "
          f"{params.max_payload} B, float_units={params.float_units}; "
          f"{len(args.rows)} rows, {args.elements} random elements per row, seed {args.seed}, "
          f"{args.jobs} parallel run(s)", flush=True)
    results = run_rows(params, args.rows, elements=args.elements, seed=args.seed, load_chunks=args.load_chunks,
                       jobs=args.jobs, log=lambda s: print(s, flush=True))
    sim_s = time.monotonic() - start
    print()
    print(numerics_table(params, args.rows, results))
    print()
    print(f"random / edge: result elements checked (each the reduction of {params.ports} contributions, on every "
          f"port); mismatches: elements whose bits differ from cais.sim.refmodel.SwitchModel fed the same frames "
          f"in the same order.")
    print("beats/cycle: ingress beats (headers included) the switch consumes per cycle at full offered load "
          f"({args.load_chunks} chunks per port, each to its own set; limit {params.ports}: every port at line rate).")
    print("latency: clock edges from the one taking the last contribution's last beat to the one after which the "
          "first result beat is on an egress port (full-capacity chunk).")
    print("cap B: set capacity (payload bytes per chunk); SRAM b/chunk: bank bits one chunk in flight occupies "
          f"(one shadow set in each of the {params.ports} ports' banks); b per B: SRAM bits per payload byte.")
    print()
    print(mode_table(params, args.rows, results))
    bad = False
    notes = []
    for r in results:
        if r.get("skip"):
            notes.append(f"  {r['name']}: {r['skip']}")
        for key, what in (("missing", "result frames missing or duplicated"),
                          ("header", "result frames with a wrong header or length")):
            if r.get(key):
                notes.append(f"  {r['name']}: {r[key]} {what}")
        for problem in r.get("problems", []):
            notes.append(f"  {r['name']}: {problem}")
        if _failed(r):
            bad = True
    if notes:
        print()
        print("notes:")
        print("\n".join(notes))
    print(f"\nsimulation and checks: {sim_s:.0f} s wall")
    if not args.no_area:
        print(flush=True)
        t0 = time.monotonic()
        res, skipped, failed = area_results(args.jobs, log=lambda s: print(s, flush=True))
        print()
        print(area_table(res, skipped, failed))
        print(f"\narea: {time.monotonic() - t0:.0f} s wall")
        bad |= bool(failed)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
