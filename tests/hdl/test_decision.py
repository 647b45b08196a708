"""The decision pipeline (cais.hdl.decision.Decision) under amaranth.sim against the reference model.

Good frames (all-reduce chunks of several rules with repeats, tag and length mismatches, resends,
all-gathers, ordinary frames to known and unknown MACs) are offered on their ports, each held until taken
(one port at a time, every port with random gaps and ``hold``, or every port at once); the reference model
``cais.sim.refmodel.SwitchModel`` is fed the same frames in the order the block takes them, and a
SLOT_CLEAR written in mid-traffic after the stateful frames granted before it. The block must grant in
every cycle it has a grantable request (one header per cycle at full load: back-to-back headers to the
same slot exercise the state forwarding), and its count of non-empty sets must be the model's. For every frame the block's one-cycle events must equal the model's counter changes (the drop
reason, forwarded, contribution, duplicate, completed, resent), a forwarded frame's port mask the ports the
model sends it to, and a result job's mask the ports the model sends the result to; the decision goes to
the lane of the frame's port, and exactly when the decision says "aggregate and write" did the model take
the payload. Events and decision come DECISION_LATENCY cycles after the take. The per-rule-entry sets in
use add up to the count of non-empty sets in every cycle and equal the model's at the end (group 4 shares
a slot with group 1, so sets move between entries).
"""

import random

import pytest

from cais import protocol as proto
from cais.hdl.decision import DECISION_LATENCY, Decision
from cais.hdl.common.enums import Action
from cais.params import SwitchParams
from cais.registers import Kind, register_map
from cais.sim.refmodel import SwitchModel
from cais.sim.traffic import host_mac
from cais.tables import MacEntry, Rule, mac_writes, rule_writes, slot_clear_writes

from blocksim import header_meta, run, with_state_memory
from tiers import sweep

PARAMS = SwitchParams(ports=4, slots=8)
EVENTS = {"FORWARDED": "ev_forwarded", "CONTRIBUTIONS": "ev_contribution", "DUPLICATES": "ev_duplicate",
          "COMPLETED": "ev_completed", "RESULTS_RESENT": "ev_resent"}


def setup_writes(regs):
    P = PARAMS.ports
    allp = (1 << P) - 1
    writes = rule_writes(regs, 0, Rule.for_group(1, allp, allp, base=0, count_log2=1))
    writes += rule_writes(regs, 1, Rule.for_group(2, 0b0011, 0b1100, base=2, count_log2=0,
                                                  dtype=proto.DType.INT16, red_op=proto.ReduceOp.MAX))
    writes += rule_writes(regs, 2, Rule.for_group(3, allp, allp, base=PARAMS.slots))      # BAD_SLOT
    # group 4 shares slot 1 with group 1: the slot's sets move between the entries' SETS_IN_USE
    writes += rule_writes(regs, 3, Rule.for_group(4, allp, allp, base=1, count_log2=0))
    for p in range(P - 1):                                                                   # port 3 unknown
        writes += mac_writes(regs, p, MacEntry(host_mac(p), p))
    writes.append((regs["MAC_POLICY"].address(), regs["MAC_POLICY"].pack(host_strict=1)))  # host frames: no flood
    return writes + slot_clear_writes(regs, 0, PARAMS.slots)


def random_frames(rng, chunks):
    """Group 1's chunks in order, two at a time with their contributions shuffled (a window of two), some
    repeated (before and after completion) or with another length; group 2's int16 MAX chunks; and noise:
    other types, all-gathers, BAD_SLOT and NO_RULE groups, ordinary and host frames, frames that claim
    another port's host (SPOOFED_SOURCE; port 3's host is in no entry, so bound to nothing)."""
    P = PARAMS.ports

    def cais(port, group, seq, plen=8, dtype=proto.DType.INT32, op=proto.ReduceOp.SUM,
             op_type=proto.OpType.ALL_REDUCE):
        hdr = proto.CaisHeader(op_type=op_type, group_id=group, seq_num=seq, payload_len=plen, dtype=dtype,
                               red_op=op)
        return port, proto.build_frame(hdr, bytes(plen), src=host_mac(port), pad=True)

    frames = []
    for t in range(0, chunks, 2):
        window = [cais(p, 1, t + k) for k in range(2) for p in range(P)]
        window += [cais(p, 2, t // 2, dtype=proto.DType.INT16, op=proto.ReduceOp.MAX) for p in (0, 1)]
        for _ in range(rng.randint(1, 4)):
            port = rng.randrange(P)
            kind = rng.randrange(7)
            if kind == 0:
                dst = rng.choice([host_mac(rng.randrange(P)), proto.BROADCAST_MAC, 0x02_00_00_00_09_99])
                src = host_mac(rng.choice([port, rng.randrange(P)]))
                etype = rng.choice([0x0800, proto.HOST_ETHERTYPE])
                window.append((port, proto.EthHeader(dst, src, etype).pack() + bytes(60)))
            elif kind == 1:
                window.append(cais(port, 1, t + rng.randrange(2), plen=12))               # LENGTH_MISMATCH
            elif kind == 2:
                window.append(cais(port, 1, t, op_type=proto.OpType.ALL_GATHER))
            elif kind == 3:
                window.append(cais(port, rng.choice([3, 9]), t))                            # BAD_SLOT, NO_RULE
            elif kind == 4:
                window.append(cais(port, 1, t + rng.randrange(2), dtype=proto.DType.INT16))  # TYPE_MISMATCH
            elif kind == 5 and rng.random() < 0.5:
                window.append(cais(port, 4, rng.randrange(2)))                              # slot 1, entry 3
            elif kind == 5:
                p, f = cais(port, 1, t + rng.randrange(2))                                  # SPOOFED_SOURCE
                window.append((p, f[:6] + host_mac((port + 1) % P).to_bytes(6, "big") + f[12:]))
            else:
                window.append(cais(port, 1, max(0, t - rng.randrange(3))))                 # repeats
        rng.shuffle(window)
        frames += window
    return frames


def program(ctx, dut, regs, writes):
    """Drive the table-programming members as the register bank would, one write per call (a write waits
    while the SLOT_CLEAR queue is full, ``clear_full``, as the switch's AXI4-Lite bridge holds it back)."""
    async def apply():
        for addr, value in writes:
            reg = next(r for r in regs if r.address() == addr)
            name = reg.name.lower()
            while ctx.get(dut.clear_full):
                await ctx.tick()
            if reg.kind is Kind.COMMAND:
                ctx.set(getattr(dut.program, f"{name}_data"), value)
                ctx.set(getattr(dut.program, f"{name}_stb"), 1)
                await ctx.tick()
                ctx.set(getattr(dut.program, f"{name}_stb"), 0)
            else:
                ctx.set(getattr(dut.program, name), value)
                await ctx.tick()
    return apply()


MODES = {"single": 1, "gaps": 2, "full": 3}


# make test-fast: one header at a time, and headers back to back
@pytest.mark.parametrize("seed,mode", sweep([(1, "single"), (2, "gaps"), (3, "full"), (4, "gaps")],
                                            fast=lambda seed, mode: mode != "gaps"))
def test_decisions_match_the_reference_model(seed, mode):
    rng = random.Random(seed)
    regs = register_map(PARAMS)
    dut = Decision(PARAMS, regs)
    P, B = PARAMS.ports, PARAMS.beat_bytes
    frames = random_frames(rng, 40)
    queues = [[f for q, f in frames if q == p] for p in range(P)]
    model = SwitchModel(PARAMS)
    writes = setup_writes(regs)
    for addr, value in writes:
        model.write(addr, value)
    problems, seen, final = [], {"jobs": 0, "forwards": 0, "writes": 0, "drops": 0}, {}
    clear_reg = regs["SLOT_CLEAR"]
    # One SLOT_CLEAR in mid-traffic (gaps): a slot of group 1 while its sets fill.
    clear = {"at": len(frames) // 2 if mode == "gaps" else None, "slot": 1, "model_at": None, "quiet_until": -1}

    async def tb(ctx):
        await program(ctx, dut, regs, writes)
        for _ in range(PARAMS.slots + 4):                       # the slot-state sweep after reset
            await ctx.tick()
        while ctx.get(dut.maintenance.blocked):                 # ... and the SLOT_CLEARs still queued
            await ctx.tick()
        expected = {}                                           # cycle the outputs are due -> what
        offer = [None] * P                                      # the frame each port offers, held until taken
        taken = cycle = 0
        grantable = False                                       # a request the block could grant last cycle
        while taken < len(frames) or expected:
            order = [p for p in range(P) if queues[p]]
            if mode == "single":                                # the frames in their global order, one at a time
                if not any(o is not None for o in offer) and taken < len(frames):
                    port = frames[taken][0]
                    offer[port] = queues[port].pop(0)
            else:
                for p in order:
                    if offer[p] is None and (mode == "full" or rng.random() < 0.5):
                        offer[p] = queues[p].pop(0)
            for p in range(P):
                if offer[p] is not None:
                    f = offer[p]
                    ctx.set(dut.headers[p].payload, header_meta(f, B))
            request = sum(1 << p for p in range(P) if offer[p] is not None)
            hold = mode == "gaps" and rng.random() < 0.1
            for p in range(P):
                ctx.set(dut.headers[p].valid, request >> p & 1)
            ctx.set(dut.hold, hold)
            clear_now = clear["at"] is not None and taken >= clear["at"]
            if clear_now:
                ctx.set(dut.program.slot_clear_data, clear_reg.pack(slot=clear["slot"]))
                ctx.set(dut.program.slot_clear_stb, 1)
                # the model clears after the takes granted up to this cycle; the block grants no stateful
                # header until the pipeline has drained of them and the clear is done (DECISION_LATENCY + 4)
                clear.update(at=None, model_at=cycle + 1, quiet_until=cycle + DECISION_LATENCY + 6)
            await ctx.delay(1e-9)
            ev = {k: ctx.get(getattr(dut, v)) for k, v in EVENTS.items()}
            ev_drop, reason = ctx.get(dut.ev_drop), ctx.get(dut.ev_drop_reason)
            push = sum(ctx.get(lane.valid) << p for p, lane in enumerate(dut.lanes))
            dec, job_valid, job = ctx.get(dut.lanes[0].payload), ctx.get(dut.jobs.valid), ctx.get(dut.jobs.payload)
            if len({ctx.get(lane.payload.as_value()) for lane in dut.lanes}) != 1:
                problems.append(f"cycle {cycle}: the lanes see different decisions")
            per_rule = [ctx.get(dut.sets_in_use[e]) for e in range(PARAMS.rules)]
            in_use = ctx.get(dut.slots_in_use)
            if sum(per_rule) != in_use:       # (both two cycles after the write: registers.md)
                problems.append(f"cycle {cycle}: sets_in_use {per_rule} do not add up to slots_in_use {in_use}")
            final["both"] = final.get("both", 0) + (per_rule[3] > 0 and per_rule[0] > 0)
            due = expected.pop(cycle, None)
            if due is not None:
                port, outs, counts = due
                want_drop = next((r for r in proto.DropReason if counts.get(f"DROP_{r.name}")), None)
                if bool(ev_drop) != (want_drop is not None) or (want_drop is not None and reason != want_drop):
                    problems.append(f"cycle {cycle}: drop {ev_drop}/{reason}, model {want_drop}")
                for k in EVENTS:
                    if ev[k] != counts.get(k, 0):
                        problems.append(f"cycle {cycle}: {k} {ev[k]}, model {counts.get(k, 0)}")
                if push != 1 << port:
                    problems.append(f"cycle {cycle}: decision pushed to {push:#x}, frame of port {port}")
                action = dec["action"]
                if counts.get("FORWARDED"):
                    seen["forwards"] += 1
                    if action != Action.FORWARD or dec["mask"] != sum(1 << p for p, _ in outs):
                        problems.append(f"cycle {cycle}: forward {action}/{dec['mask']:#x}, model {outs}")
                elif any(k.startswith("DROP_") for k in counts):
                    seen["drops"] += 1
                    if action != Action.DROP:
                        problems.append(f"cycle {cycle}: action {action}, model drops")
                else:
                    if action != Action.AGGREGATE or dec["write"] != bool(counts.get("CONTRIBUTIONS")):
                        problems.append(f"cycle {cycle}: {action} write {dec['write']}, model {counts}")
                    seen["writes"] += dec["write"]
                result_ports = sum(1 << p for p, _ in outs) if counts.get("COMPLETED") or counts.get("RESULTS_RESENT") else 0
                if job_valid != bool(result_ports) or (job_valid and job["mask"] != result_ports):
                    problems.append(f"cycle {cycle}: job {job_valid}/{job['mask']:#x}, model to {result_ports:#x}")
                seen["jobs"] += job_valid
            elif push or job_valid or any(ev.values()) or ev_drop:
                problems.append(f"cycle {cycle}: a decision or events with no frame")
            take = sum(ctx.get(h.ready) << p for p, h in enumerate(dut.headers))
            if take & (take - 1) or take & ~request:
                problems.append(f"cycle {cycle}: take {take:#x} with requests {request:#x}")
            if grantable != bool(take) and not (cycle <= clear["quiet_until"] and not take):
                problems.append(f"cycle {cycle}: take {take:#x}, a grantable request in the cycle before: {grantable}")
            grantable = bool(request & ~take) and not hold
            for p in range(P):
                if take >> p & 1 and offer[p] is not None:
                    before = model.counters()
                    outs = model.receive(p, offer[p])
                    after = model.counters()
                    counts = {k: after[k] - before[k] for k in after
                              if not isinstance(after[k], list) and after[k] != before[k]}
                    expected[cycle + DECISION_LATENCY] = (p, outs, counts)
                    offer[p] = None
                    taken += 1
            if clear["model_at"] == cycle:
                model.write(clear_reg.address(), clear_reg.pack(slot=clear["slot"]))
            await ctx.tick()
            if clear_now:
                ctx.set(dut.program.slot_clear_stb, 0)
            cycle += 1
            if cycle > 20 * len(frames):
                problems.append("the block stopped taking headers")
                return
        await ctx.tick().repeat(2)
        in_use = model.read(regs["SLOTS_IN_USE"].address())
        if ctx.get(dut.slots_in_use) != in_use:
            problems.append(f"slots_in_use {ctx.get(dut.slots_in_use)}, model {in_use}")
        final["in_use"] = in_use
        per_rule = [ctx.get(dut.sets_in_use[e]) for e in range(PARAMS.rules)]
        if per_rule != model.counters()["SETS_IN_USE"]:
            problems.append(f"sets_in_use {per_rule}, model {model.counters()['SETS_IN_USE']}")
        final["entries"] = sum(1 for n in per_rule if n)

    run(with_state_memory(dut), tb)
    assert not problems, problems[:8]
    assert min(seen.values()) > 5, seen                     # every kind of outcome happened
    assert final["in_use"] > 0, final                       # (a count that can be wrong)
    assert final["entries"] >= 2 and final.get("both"), final    # sets held for more than one entry
