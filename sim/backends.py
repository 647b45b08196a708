"""Run a backend-independent entry point on any link: the model, amaranth.sim, cocotb or the C++-driven
Verilator harness (one module each in :mod:`cais.sim.links`).

:func:`run_backend` runs ``async def main(link, job)``, named by a ``"module:function"`` string, on
backend ``kind``, so callers use them identically::

    result = run_backend("verilator", SwitchParams(), "cais.sim.backends:selftest_main", {"seed": 1})

The cocotb backend runs inside a simulator process (:func:`cais.sim.links.cocotb.run_cocotb`). The
contract every link keeps is in :mod:`cais.sim.links.base`.
"""

from __future__ import annotations

import json

from cais.params import SwitchParams
from cais.registers import register_map

from .entry import load_entry
from .links.base import read_counters, wait_idle
from .links.model import ModelLink, run_model

__all__ = ["ModelLink", "run_model", "run_backend", "load_entry", "BACKENDS", "selftest_main", "read_counters",
           "wait_idle"]

#: The backends :func:`run_backend` knows: the link each runs on is in cais.sim.links.<kind>.
BACKENDS = ("model", "amaranth", "cocotb", "verilator")


def run_backend(kind: str, params: SwitchParams, entry: str, job: dict, **kw):
    """Run ``await main(link, job)`` (``entry`` = ``"module:function"``) on backend ``kind``.

    ``kind`` is one of :data:`BACKENDS`; ``kw`` go to :func:`run_model` (ModelLink options),
    :func:`cais.sim.links.amaranth.run_amaranth`, :func:`cais.sim.links.cocotb.run_cocotb` or
    :func:`cais.sim.links.verilator.run_verilator` (the simulator links take ``seed``, ``idle``,
    ``backpressure``, ``waves``). The result is returned as it comes back from
    JSON on every backend (tuples become lists, dict keys strings), so results compare across backends.
    """
    if kind == "cocotb":
        from .links.cocotb import run_cocotb
        return run_cocotb(params, entry, job, **kw)
    if kind not in BACKENDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(BACKENDS)}")
    main = load_entry(entry)
    if kind == "verilator":
        from .links.verilator import run_verilator as run
    elif kind == "amaranth":
        from .links.amaranth import run_amaranth as run
    else:
        run = run_model
    result = run(params, lambda link: main(link, job), **kw)
    return json.loads(json.dumps(result))


# ====================================================================================== a self-test


async def selftest_main(link, job: dict) -> dict:
    """One all-reduce chunk: program a rule, send one contribution per port, collect, check with numpy.

    ``job``: ``seed`` (0), ``payload_len`` bytes (64), ``group`` (1), ``red_op`` name ("SUM"), ``limit``
    cycles to wait for the results (20000), ``faults`` (FaultSpec fields; wraps the link in a
    :class:`cais.sim.faults.FaultyLink`). Returns ``correct`` (every port got exactly the numpy result),
    ``received`` (sorted [port, frame hex]), ``counters``, ``cycles`` and ``fault_stats``.
    """
    import numpy as np

    from cais import protocol as proto
    from cais.tables import Rule, rule_writes, slot_clear_writes

    from .traffic import host_mac

    if job.get("faults") is not None:
        from .faults import FaultSpec, FaultyLink
        link = FaultyLink(link, FaultSpec(**job["faults"]))
    P = link.params
    regmap = register_map(P)
    group, plen = int(job.get("group", 1)), int(job.get("payload_len", 64))
    op = proto.ReduceOp[str(job.get("red_op", "SUM")).upper()]
    everyone = (1 << P.ports) - 1
    writes = slot_clear_writes(regmap, 0, 1)
    writes += rule_writes(regmap, 0, Rule.for_group(group, everyone, everyone, base=0, count_log2=0, red_op=op))
    for addr, value in writes:
        await link.write(addr, value)

    rng = np.random.default_rng(int(job.get("seed", 0)))
    values = rng.integers(-2**31, 2**31, (P.ports, plen // 4), dtype=np.int64)
    hdr = proto.CaisHeader(group_id=group, layer_id=3, chunk_id=0, total_chunks=1, seq_num=0,
                           payload_len=plen, red_op=op)
    for p in range(P.ports):
        link.send(p, proto.build_frame(hdr, values[p].astype(">i4").tobytes(), src=host_mac(p), pad=True))

    reduce = {proto.ReduceOp.SUM: np.sum, proto.ReduceOp.MAX: np.max, proto.ReduceOp.MIN: np.min}[op]
    expected = ((reduce(values, axis=0) + 2**31) % 2**32 - 2**31).astype(np.int32)
    received: list[tuple[int, bytes]] = []
    limit = int(job.get("limit", 20000))
    # Wait for a result on every port, or until the switch is idle and no fault injector holds a frame.
    while link.cycle < limit:
        await link.advance(32)
        received += link.take_received()
        if len({p for p, _ in received}) == P.ports:
            break
        if not getattr(link, "holding", 0) and await wait_idle(link, limit=0):
            break
    await wait_idle(link, limit=limit)
    received += link.take_received()

    correct = sorted(p for p, _ in received) == list(range(P.ports))
    for _, data in received:
        frame = proto.parse_frame(data)
        correct &= (frame.cais is not None and frame.cais.flags == proto.Flags.RESULT
                    and np.array_equal(np.frombuffer(frame.payload, ">i4"), expected))
    return {
        "correct": bool(correct),
        "received": sorted([p, data.hex()] for p, data in received),
        "counters": await read_counters(link),
        "cycles": link.cycle,
        "fault_stats": dict(getattr(link, "stats", {})),
    }
