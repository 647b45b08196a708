# amaranth: UnusedElaboratable=no
"""RuleTable and MacTable against Python references of docs/protocol.md sections 5, 6 and 9.

Rules: a valid entry matches when ``(field & mask) == (value & mask)`` for group, layer and chunk; the
lowest index wins; RULE_WRITE copies the staging registers (RULE_GROUP .. RULE_SLOTS) into entry
``index`` with its valid bit; an index at or above the table size is ignored; port bits at or above the
number of ports are ignored. MAC table: exact match, lowest valid index wins, an entry naming a port the
switch does not have is written invalid.

Register words are packed with the register map's field definitions (the one description of the map).
"""

import random

import pytest

from cais.hdl.control.tables import MacTable, RuleTable
from cais.params import SwitchParams
from cais.registers import register_map

from blocksim import run

RULE_FIELDS = ("valid", "group_value", "group_mask", "layer_value", "layer_mask", "chunk_value", "chunk_mask",
               "contributors", "results", "base", "count_log2")


# ----------------------------------------------------------------------------- rule table
class RuleRef:
    def __init__(self, params):
        self.params = params
        self.entries = [None] * params.rules        # None = never written (invalid)

    def write(self, index, valid, stage):
        if index >= self.params.rules:
            return
        pm = (1 << self.params.ports) - 1
        self.entries[index] = dict(
            valid=int(valid), group_value=stage["group"][0], group_mask=stage["group"][1],
            layer_value=stage["layer"][0], layer_mask=stage["layer"][1],
            chunk_value=stage["chunk"][0], chunk_mask=stage["chunk"][1],
            contributors=stage["contributors"] & pm, results=stage["results"] & pm,
            base=stage["base"], count_log2=stage["count_log2"])

    def matches(self, e, g, l_, c):
        return bool(e and e["valid"] and (g & e["group_mask"]) == (e["group_value"] & e["group_mask"])
                    and (l_ & e["layer_mask"]) == (e["layer_value"] & e["layer_mask"])
                    and (c & e["chunk_mask"]) == (e["chunk_value"] & e["chunk_mask"]))

    def hits(self, g, l_, c):
        return sum(1 << i for i, e in enumerate(self.entries) if self.matches(e, g, l_, c))

    def lookup(self, g, l_, c):
        return next((e for e in self.entries if self.matches(e, g, l_, c)), None)


def rule_hit(ctx, dut) -> bool:
    """Whether the lookup found a rule; the winner must be one entry (one-hot) or none."""
    first = ctx.get(dut.first[0])
    assert first & (first - 1) == 0, f"first = {first:#b} is not one-hot"
    return first != 0


def looked_up(ctx, dut):
    """The winning rule's fields: ``pick`` fed the one-hot ``first`` (the two halves of a lookup)."""
    ctx.set(dut.pick, ctx.get(dut.first[0]))
    return ctx.get(dut.picked)


class RuleBench:
    def __init__(self, ctx, dut, params):
        self.ctx, self.dut, self.params = ctx, dut, params
        self.rm = register_map(params)
        self.ref = RuleRef(params)
        self.lookups = self.hits = 0

    def stage(self, stage):
        ctx, dut, rm = self.ctx, self.dut, self.rm
        ctx.set(dut.program.rule_group, rm["RULE_GROUP"].pack(value=stage["group"][0], mask=stage["group"][1]))
        ctx.set(dut.program.rule_layer, rm["RULE_LAYER"].pack(value=stage["layer"][0], mask=stage["layer"][1]))
        ctx.set(dut.program.rule_chunk, rm["RULE_CHUNK"].pack(value=stage["chunk"][0], mask=stage["chunk"][1]))
        ctx.set(dut.program.rule_ports, rm["RULE_PORTS"].pack(contributors=stage["contributors"],
                                                       results=stage["results"]))
        ctx.set(dut.program.rule_slots, rm["RULE_SLOTS"].pack(base=stage["base"], count_log2=stage["count_log2"]))

    async def write(self, index, valid, stage):
        ctx, dut = self.ctx, self.dut
        self.stage(stage)
        ctx.set(dut.program.rule_write_data, self.rm["RULE_WRITE"].pack(index=index, valid=valid))
        ctx.set(dut.program.rule_write_stb, 1)
        await ctx.tick()
        ctx.set(dut.program.rule_write_stb, 0)
        self.ref.write(index, valid, stage)

    def check(self, g, l_, c):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.key[0], {"group_id": g, "layer_id": l_, "chunk_id": c})
        # a second key, the same key with one bit flipped: its hits are its own
        g2, l2, c2 = g ^ (1 << (self.lookups % 8)), l_, c
        ctx.set(dut.key[1], {"group_id": g2, "layer_id": l2, "chunk_id": c2})
        assert ctx.get(dut.hits[1]) == self.ref.hits(g2, l2, c2), "second key"
        assert ctx.get(dut.hits[0]) == self.ref.hits(g, l_, c), "first key"
        want = self.ref.lookup(g, l_, c)
        self.lookups += 1
        key = f"key=({g:#x}, {l_:#x}, {c:#x})"
        assert rule_hit(ctx, dut) == (want is not None), f"{key}: hit, table={self.ref.entries}"
        if want is not None:
            self.hits += 1
            rule = looked_up(ctx, dut)
            got = {f: getattr(rule, f) for f in RULE_FIELDS}
            assert got == want, f"{key}: rule {got} != {want}"
            quota = (1 << want["count_log2"]) - 1
            assert ctx.get(dut.picked_quota) == quota, f"{key}: quota {ctx.get(dut.picked_quota):#x} != {quota:#x}"
        for i, e in enumerate(self.ref.entries):       # the entries and their quotas as written
            if e:
                assert ctx.get(dut.entry[i].valid) == e["valid"] and ctx.get(dut.entry[i].base) == e["base"], i
                assert ctx.get(dut.quota[i]) == (1 << e["count_log2"]) - 1, i


def random_stage(rng, params):
    def match(bits):
        mask = rng.choice([0, (1 << bits) - 1, rng.getrandbits(bits), rng.getrandbits(bits) & rng.getrandbits(bits)])
        return rng.getrandbits(bits), mask
    return dict(group=match(8), layer=match(16), chunk=match(16),
                contributors=rng.getrandbits(16), results=rng.getrandbits(16),   # bits >= ports included
                base=rng.getrandbits(16), count_log2=rng.getrandbits(5))


def rule_test(params, body):
    dut = RuleTable(params, register_map(params), keys=2)

    async def tb(ctx):
        await body(RuleBench(ctx, dut, params))

    run(dut, tb)


P_DEFAULT = SwitchParams()
P_BIG = SwitchParams(ports=16, rules=16)


@pytest.mark.parametrize("params", [P_DEFAULT, P_BIG], ids=["default", "ports16_rules16"])
def test_rule_directed(params):
    async def body(b):
        ctx, dut = b.ctx, b.dut
        full = dict(group=(3, 0xFF), layer=(0, 0), chunk=(0, 0), contributors=0xFFFF, results=0x0005,
                    base=12, count_log2=2)
        # empty table: no hit
        b.check(3, 0, 0)
        # staging registers alone do nothing
        b.stage(full)
        await ctx.tick()
        b.check(3, 0, 0)
        assert not rule_hit(ctx, dut)
        # write entry 5; ports above the switch's are ignored
        await b.write(5, 1, full)
        b.check(3, 0, 0)
        assert rule_hit(ctx, dut)
        assert looked_up(ctx, dut).contributors == (1 << params.ports) - 1
        b.check(3, 0x1234, 0xFFFF)
        b.check(4, 0, 0)
        # changing the staging registers afterwards does not change the entry
        b.stage(dict(full, group=(9, 0xFF), base=99))
        await ctx.tick()
        b.check(3, 7, 7)
        assert looked_up(ctx, dut).base == 12
        # a lower index with an overlapping match wins; ternary: value bits outside the mask are ignored
        wide = dict(group=(0x02, 0xFE), layer=(0xFF00, 0x0F00), chunk=(0, 0), contributors=1, results=2,
                    base=1, count_log2=0)
        await b.write(1, 1, wide)
        for g in (2, 3, 4):
            for layer in (0x0F00, 0x0E00, 0xFF00, 0x0FFF, 0x1F00):
                b.check(g, layer, 0)
        ctx.set(dut.key[0].group_id, 3)
        ctx.set(dut.key[0].layer_id, 0x0F00)
        assert looked_up(ctx, dut).base == 1            # entry 1 beats entry 5
        ctx.set(dut.key[0].layer_id, 0x0E00)
        assert looked_up(ctx, dut).base == 12           # entry 1 misses on layer: entry 5
        # invalidate entry 1: entry 5 matches again; the stored fields of an invalid entry never leak
        await b.write(1, 0, wide)
        b.check(3, 0x0F00, 0)
        assert looked_up(ctx, dut).base == 12
        # an index at or above the table size is ignored (RULE_WRITE index is 8 bits)
        for idx in (params.rules, 0xFF):
            await b.write(idx, 1, dict(full, group=(0, 0), base=77))
            b.check(0x55, 0, 0)
            assert not rule_hit(ctx, dut)
        # the last entry works and has the lowest priority
        last = params.rules - 1
        await b.write(last, 1, dict(full, group=(0, 0), base=42))
        b.check(0x55, 1, 2)
        assert looked_up(ctx, dut).base == 42
        b.check(3, 1, 2)
        assert looked_up(ctx, dut).base == 12
        # entry 0 with all wildcards takes everything
        await b.write(0, 1, dict(group=(0, 0), layer=(0, 0), chunk=(0, 0), contributors=3, results=3, base=0,
                                 count_log2=31))
        for key in ((3, 0, 0), (0x55, 1, 2), (0xFF, 0xFFFF, 0xFFFF)):
            b.check(*key)
            assert looked_up(ctx, dut).count_log2 == 31
    rule_test(params, body)


@pytest.mark.slow
@pytest.mark.parametrize("params,seed", [(P_DEFAULT, 21), (P_BIG, 22)], ids=["default", "ports16_rules16"])
def test_rule_random(params, seed):
    rng = random.Random(seed)

    async def body(b):
        for _ in range(100):
            index = rng.randrange(params.rules) if rng.random() < 0.95 else rng.randrange(params.rules, 256)
            await b.write(index, int(rng.random() < 0.8), random_stage(rng, params))
            for _ in range(10):
                valid = [e for e in b.ref.entries if e]
                if valid and rng.random() < 0.7:
                    # a key near a stored rule: its value with some bits flipped (inside or outside the mask)
                    e = rng.choice(valid)
                    key = [e["group_value"] ^ (rng.getrandbits(8) & rng.getrandbits(8)),
                           e["layer_value"] ^ (rng.getrandbits(16) & rng.getrandbits(16) & rng.getrandbits(16)),
                           e["chunk_value"] ^ (rng.getrandbits(16) & rng.getrandbits(16) & rng.getrandbits(16))]
                    if rng.random() < 0.5:
                        key = [e["group_value"], e["layer_value"], e["chunk_value"]]
                else:
                    key = [rng.getrandbits(8), rng.getrandbits(16), rng.getrandbits(16)]
                b.check(*key)
        assert b.hits > 300 and b.lookups - b.hits > 100, (b.hits, b.lookups)
    rule_test(params, body)


# ----------------------------------------------------------------------------- MAC table
class MacBench:
    def __init__(self, ctx, dut, params):
        self.ctx, self.dut, self.params = ctx, dut, params
        self.rm = register_map(params)
        self.entries = [(False, 0, 0)] * params.mac_entries
        self.hits = self.lookups = 0

    async def write(self, index, mac, port, valid):
        ctx, dut, rm = self.ctx, self.dut, self.rm
        ctx.set(dut.program.mac_addr_lo, rm["MAC_ADDR_LO"].pack(mac=mac & 0xFFFF_FFFF))
        ctx.set(dut.program.mac_addr_hi, rm["MAC_ADDR_HI"].pack(mac=mac >> 32))
        ctx.set(dut.program.mac_write_data, rm["MAC_WRITE"].pack(index=index, port=port, valid=valid))
        ctx.set(dut.program.mac_write_stb, 1)
        await ctx.tick()
        ctx.set(dut.program.mac_write_stb, 0)
        if index < self.params.mac_entries:
            self.entries[index] = (bool(valid) and port < self.params.ports, mac, port)

    def check(self, mac):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.mac[0], mac)
        ctx.set(dut.mac[1], mac ^ 1)                  # a second address, looked up at once
        first = ctx.get(dut.first[0])
        assert first & (first - 1) == 0, f"first = {first:#b} is not one-hot"
        ctx.set(dut.pick, first)                      # the two halves of a lookup
        for k, a in enumerate((mac, mac ^ 1)):
            hits = sum(1 << i for i, (v, m, p) in enumerate(self.entries) if v and m == a)
            assert ctx.get(dut.hits[k]) == hits, f"mac={a:012x} hits {ctx.get(dut.hits[k]):#x} table={self.entries}"
        want = next((p for v, m, p in self.entries if v and m == mac), None)
        self.lookups += 1
        assert ctx.get(dut.hit) == (want is not None), f"mac={mac:012x} table={self.entries}"
        if want is not None:
            self.hits += 1
            assert ctx.get(dut.port) == want, f"mac={mac:012x} table={self.entries}"
            assert ctx.get(dut.port_mask) == 1 << want, f"mac={mac:012x} table={self.entries}"


def mac_test(params, body):
    dut = MacTable(params, register_map(params), keys=2)

    async def tb(ctx):
        await body(MacBench(ctx, dut, params))

    run(dut, tb)


P_MAC16 = SwitchParams(ports=16, mac_entries=32)
P_MAC3 = SwitchParams(ports=3, mac_entries=4)


@pytest.mark.parametrize("params", [P_DEFAULT, P_MAC16, P_MAC3], ids=["default", "ports16", "ports3"])
def test_mac_directed(params):
    async def body(b):
        ctx, dut = b.ctx, b.dut
        A, B_ = 0x02_00_00_00_01_00, 0x0A_0B_0C_0D_0E_0F
        b.check(A)
        b.check(0)                               # an unwritten entry (mac 0) never matches
        await b.write(2, A, 1, 1)
        b.check(A)
        b.check(A ^ 1)
        b.check(A ^ (1 << 47))                   # the high word is compared
        b.check(A ^ (1 << 32))
        # staging changes alone do nothing
        ctx.set(dut.program.mac_addr_lo, 0x1234)
        await ctx.tick()
        b.check(A)
        b.check(0x1234)
        # lower index wins for the same address
        await b.write(0, A, 2, 1)
        b.check(A)
        assert ctx.get(dut.port) == 2
        # invalidating entry 0: entry 2 answers again
        await b.write(0, A, 2, 0)
        b.check(A)
        assert ctx.get(dut.port) == 1
        # an entry naming a port the switch does not have is invalid, and does not hide a later entry
        if params.ports < 16:
            await b.write(0, A, params.ports, 1)
            b.check(A)
            assert ctx.get(dut.hit) and ctx.get(dut.port) == 1
            await b.write(1, B_, 15, 1)
            b.check(B_)
            assert not ctx.get(dut.hit)
        # the highest port is a port
        await b.write(params.mac_entries - 1, B_, params.ports - 1, 1)
        b.check(B_)
        assert ctx.get(dut.hit) and ctx.get(dut.port) == params.ports - 1
        # index at or above the table size is ignored
        await b.write(params.mac_entries, 0xFFFF_FFFF_FFFF, 0, 1)
        b.check(0xFFFF_FFFF_FFFF)
        await b.write(255, 0x1111_2222_3333, 0, 1)
        b.check(0x1111_2222_3333)
        assert not ctx.get(dut.hit)
    mac_test(params, body)


@pytest.mark.parametrize("params,seed", [(P_DEFAULT, 31), (P_MAC16, 32), (P_MAC3, 33)],
                         ids=["default", "ports16", "ports3"])
@pytest.mark.slow
def test_mac_random(params, seed):
    rng = random.Random(seed)
    pool = [rng.getrandbits(48) for _ in range(params.mac_entries // 2 + 2)]   # reused: duplicates happen

    async def body(b):
        for _ in range(200):
            idx = rng.randrange(params.mac_entries) if rng.random() < 0.95 else rng.randrange(params.mac_entries, 256)
            port = rng.randrange(params.ports) if rng.random() < 0.8 else rng.randrange(16)   # 4-bit field
            await b.write(idx, rng.choice(pool), port, int(rng.random() < 0.85))
            for _ in range(10):
                r = rng.random()
                mac = rng.choice(pool) if r < 0.7 else rng.choice(pool) ^ (1 << rng.randrange(48)) if r < 0.85 \
                    else rng.getrandbits(48)
                b.check(mac)
        assert b.hits > 300 and b.lookups - b.hits > 200, (b.hits, b.lookups)
    mac_test(params, body)


def test_table_program_signature_is_the_register_banks():
    """The core and the tables take their programming by the register bank's own member names and shapes,
    so the switch connects them by name (hdl/switch.py) and nothing is copied by hand."""
    from cais.hdl.control.csr import RegisterBank
    from cais.hdl.control.tables import TABLE_REGISTERS, TableProgramSignature

    rm = register_map(SwitchParams())
    program = TableProgramSignature(rm).members
    bank = RegisterBank(rm).signature.members
    assert program and all(bank[name] == member for name, member in program.items())
    assert {"rule_write_stb", "rule_write_data", "rule_group", "mac_addr_hi", "slot_clear_stb"} <= set(program)
    assert len(program) == len(TABLE_REGISTERS) + sum(rm[n].kind.name == "COMMAND" for n in TABLE_REGISTERS)
