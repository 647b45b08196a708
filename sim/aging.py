"""Set aging on a link (docs/registers.md, AGING): a dead port's set aged within the documented bound,
reported (AGED_EVENT, AGED_PORTS, AGED_TOTAL, AGED[e]) and freed, the next chunk of the set completing
with the survivors' and the revived port's values; every counter against the reference model.

``aging_job`` is an entry point for :func:`cais.sim.backends.run_backend` (``{"seed": s, "age": units}``).
The model is fed the same frames in the same order and its clock is moved to the link's at every frame
it is given, so it ages the set when the hardware may (the earliest moment of the bound); its counters
are compared once both have aged it and drained.
"""

from __future__ import annotations

import random

import numpy as np

from cais import protocol as proto
from cais.registers import AGING_VISIT_CYCLES, AGE_UNIT_LOG2, RegisterFile, read_counters, register_map
from cais.tables import Rule, rule_writes, slot_clear_writes

from .directed import accounting_problems, counter_problems
from .links.base import wait_idle
from .refmodel import SwitchModel
from .traffic import host_mac

__all__ = ["aging_job", "VISIT_CYCLES", "DECISION_CYCLES"]

#: Cycles a scanner's visit may take after its age unit starts (the drain of the headers in flight and
#: its own read, pick, decision and write): the "+ 13" of the bound in docs/registers.md.
VISIT_CYCLES = AGING_VISIT_CYCLES
#: Cycles from a frame's last beat into the switch to its decision (ingress checks, the decision pipeline);
#: the bound is from the decision, the job measures from the last beat.
DECISION_CYCLES = 16
GROUP = 1


def _frame(port: int, seq: int, values) -> bytes:
    payload = np.asarray(values, dtype=">i4").tobytes()
    hdr = proto.CaisHeader(op_type=proto.OpType.ALL_REDUCE, group_id=GROUP, seq_num=seq, payload_len=len(payload),
                           dtype=proto.DType.INT32, red_op=proto.ReduceOp.SUM)
    return proto.build_frame(hdr, payload, src=host_mac(port), pad=True)


async def aging_job(link, job: dict) -> dict:
    """Returns {"problems": [...], "aged_after": cycles from the last contribution's last beat to the read
    that saw the set aged, "bound": (low, high)}."""
    P = link.params
    rng = random.Random(int(job.get("seed", 1)))
    age = int(job.get("age", 1))
    regs = register_map(P)
    rf = RegisterFile(link, regs)
    model = SwitchModel(P)
    problems: list[str] = []
    allp = (1 << P.ports) - 1
    dead = P.ports - 1
    entry = 1
    writes = (rule_writes(regs, entry, Rule.for_group(GROUP, allp, allp, base=0, count_log2=1))
              + slot_clear_writes(regs, 0, 2)
              + [(regs["AGING"].address(), regs["AGING"].pack(age=age, free=1))])
    for addr, value in writes:
        await link.write(addr, value)
        model.write(addr, value)
    received: list[tuple[int, bytes]] = []

    def feed(port, frame):
        link.send(port, frame)
        model.advance_to(link.cycle)
        return model.receive(port, frame)

    # Chunk 2 (slot 0, set 1): every port but the dead one contributes.
    n = 8
    values = {p: [rng.randrange(-1000, 1000) for _ in range(n)] for p in range(P.ports)}
    for p in range(P.ports):
        if p != dead:
            feed(p, _frame(p, 2, values[p]))
    await wait_idle(link, limit=link.cycle + 10_000)
    last = max(s.last for s in link.take_sent())
    received += link.take_received()
    # Poll AGED_TOTAL until it moves (no later than the bound and a margin).
    unit = 1 << AGE_UNIT_LOG2
    low, high = age * unit, (age + 2 * P.slots) * unit + VISIT_CYCLES + DECISION_CYCLES
    seen = None
    while link.cycle < last + high + 4096:
        if await rf.read("AGED_TOTAL"):
            seen = link.cycle
            break
        await link.advance(64)
    if seen is None:
        return {"problems": [f"the set did not age within {high + 4096} cycles of the last contribution"]}
    aged_after = seen - last
    if not low < aged_after <= high + 64 + 16:      # (the poll's step and the read's own cycles)
        problems.append(f"aged {aged_after} cycles after the last contribution, outside ({low}, {high}]")
    model.advance_to(link.cycle + high)             # the model ages it too (at the earliest point)
    ev = regs["AGED_EVENT"].unpack(await rf.read("AGED_EVENT"))
    ports = regs["AGED_PORTS"].unpack(await rf.read("AGED_PORTS"))
    want_ev = {"slot": 0, "rule": entry, "set": 1, "valid": 1}
    want_ports = {"ports": allp & ~(1 << dead), "queued": 1}
    if ev != want_ev or ports != want_ports:
        problems.append(f"event {ev} {ports}, expected {want_ev} {want_ports}")
    await rf.write("AGED_POP", 0)
    model.write(regs["AGED_POP"].address(), 0)
    # The survivors retransmit chunk 2 and the dead port comes back: the set starts anew and completes.
    for p in range(P.ports):
        out = feed(p, _frame(p, 2, values[p]))
    await wait_idle(link, limit=link.cycle + 10_000)
    received += link.take_received()
    want = np.sum([values[p] for p in range(P.ports)], axis=0, dtype=np.int64)
    results = [(port, f) for port, f in received if proto.parse_frame(f).cais.flags & proto.Flags.RESULT]
    got = sorted(port for port, _ in results)
    if got != list(range(P.ports)):
        problems.append(f"results on ports {got}, expected every port once")
    for port, f in results:
        vals = np.frombuffer(proto.parse_frame(f).payload[:4 * n], dtype=">i4").astype(np.int64)
        if list(vals) != list(want):
            problems.append(f"port {port}: result {list(vals)}, expected {list(want)}")
    if sorted(p for p, _ in out) != got:
        problems.append(f"the model sent its result to {sorted(p for p, _ in out)}")
    counters = await read_counters(link.read, regs)
    problems += counter_problems(counters, model.counters()) + accounting_problems(counters)
    if counters["AGED_TOTAL"] != 1 or counters["AGED"][entry] != 1 or counters["SLOTS_IN_USE"] != 1:
        problems.append(f"AGED_TOTAL {counters['AGED_TOTAL']}, AGED {counters['AGED']}, "
                        f"SLOTS_IN_USE {counters['SLOTS_IN_USE']}")
    return {"problems": problems, "aged_after": aged_after, "bound": (low, high)}
