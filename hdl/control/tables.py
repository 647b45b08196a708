"""The rule table and the MAC table: small match tables the control plane writes over AXI4-Lite."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from cais.params import SwitchParams
from cais.registers import Kind, RegisterMap

from ..common.enums import DType, ReduceOp

__all__ = ["RuleTable", "MacTable", "rule_layout", "TableProgramSignature", "TABLE_REGISTERS", "or_tree", "lowest_one",
           "field_bits", "MATCH_PARTS", "hits_of_parts"]

#: Parts of each entry's compare in ``parts``: a pipeline registers them and ANDs them a stage later, so
#: neither stage holds a whole 40- or 48-bit compare tree.
MATCH_PARTS = 4

#: The registers that program the tables and the slot memory, as the register bank presents them.
TABLE_REGISTERS = ("RULE_GROUP", "RULE_LAYER", "RULE_CHUNK", "RULE_PORTS", "RULE_SLOTS", "RULE_TYPE", "RULE_WRITE",
                   "MAC_ADDR_LO", "MAC_ADDR_HI", "MAC_WRITE", "MAC_POLICY", "SLOT_CLEAR", "AGING", "AGED_POP")


class TableProgramSignature(wiring.Signature):
    """Table programming, from the register bank's side: the members :class:`cais.hdl.control.csr.RegisterBank`
    has for :data:`TABLE_REGISTERS`, named as it names them (``rule_group`` : Out(32) for a CONFIG
    register; ``rule_write_stb`` : Out(1) and ``rule_write_data`` : Out(32) for a COMMAND register).
    Derived from the register map, so the bank, the core and the tables agree by construction."""

    def __init__(self, regmap: RegisterMap):
        members = {}
        for name in TABLE_REGISTERS:
            reg, base = regmap[name], name.lower()
            if reg.kind is Kind.COMMAND:
                members[f"{base}_stb"], members[f"{base}_data"] = Out(1), Out(32)
            else:
                members[base] = Out(32, init=reg.reset)
        super().__init__(members)


def field_bits(word, field):
    """The bits of register field `field` in the register word `word`."""
    return word[field.lsb:field.lsb + field.width]


def or_tree(values):
    """The OR of ``values`` as a balanced tree (a chain of ORs would stay a chain of LUTs)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def lowest_one(x, n):
    """The lowest set bit of the ``n``-bit value ``x``, one-hot, without a carry chain."""
    return Cat(*(x[i] & ~x[:i].any() if i else x[0] for i in range(n)))


def split(value, parts):
    """``value``'s bits in ``parts`` slices as equal as can be (the low bits first)."""
    n = len(value)
    cuts = [n * k // parts for k in range(parts + 1)]
    return [value[cuts[k]:cuts[k + 1]] for k in range(parts)]


def hits_of_parts(parts, entries: int):
    """The match bits of ``entries`` entries from their ``parts`` bits (entry i's are
    ``parts[i * MATCH_PARTS:(i + 1) * MATCH_PARTS]``): an entry matches when all its parts do."""
    return Cat(*(parts[i * MATCH_PARTS:(i + 1) * MATCH_PARTS].all() for i in range(entries)))


def rule_layout(params: SwitchParams) -> data.StructLayout:
    fields = {
        "valid": 1,
        "group_value": 8, "group_mask": 8,
        "layer_value": 16, "layer_mask": 16,
        "chunk_value": 16, "chunk_mask": 16,
        "contributors": params.ports, "results": params.ports,
        "base": 16, "count_log2": 5,
        "dtype": DType, "red_op": ReduceOp, "acc_fp32": 1, "saturate": 1, "reproducible": 1,
    }
    if params.uplink:   # RULE_TYPE.uplink: the uplink action (docs/protocol.md section 13)
        fields["uplink"] = 1
    return data.StructLayout(fields)


class RuleTable(wiring.Component):
    """Ternary match on (group_id, layer_id, chunk_id); the lowest-index valid match wins.

    Entries are registers. A lookup has two halves, so a pipeline can register between them: the match
    gives the matching entries (``hits``) and the winner as a one-hot ``first``; ``pick`` (that winner,
    registered or not) reads its fields. The match is made for ``keys`` keys at once (one per port, say),
    the pick for one. An entry is written whole from the staging registers when RULE_WRITE is written
    (``write_stb``), so a lookup never sees a half-written rule.

    Members
    -------
    program : In(TableProgramSignature)
        The RULE_WRITE strobe and data and the staging registers, as words of the register map (the MAC
        and slot members are not used here).
    key[k] : In(key_layout)
        The keys to look up: ``group_id`` (8 bits), ``layer_id`` (16), ``chunk_id`` (16).
    hits[k] : Out(rules); first[k] : Out(rules)
        The valid entries that match key k, and the winner among them, one-hot (0: no entry matches).
    parts[k] : Out(rules * MATCH_PARTS)
        The same match in :data:`MATCH_PARTS` parts per entry (the valid bit and slices of the masked
        compare): :func:`hits_of_parts` of them is ``hits[k]``.
    pick : In(rules); picked : Out(rule_layout); picked_quota : Out(32)
        The entry in the one-hot ``pick`` (an AND-OR mux), and its ``quota``.
    entry[i] : Out(rule_layout); quota[i] : Out(32)
        The entries as written, and each one's slot offset mask ``2**count_log2 - 1``, a register written
        with the entry (so a lookup adds no decoder before the slot add).
    """

    key_layout = data.StructLayout({"group_id": 8, "layer_id": 16, "chunk_id": 16})

    def __init__(self, params: SwitchParams, regmap: RegisterMap, keys: int = 1):
        self.params, self.regmap = params, regmap
        self.layout = rule_layout(params)
        super().__init__({
            "program": In(TableProgramSignature(regmap)),
            "key": In(self.key_layout).array(keys),
            "hits": Out(params.rules).array(keys), "first": Out(params.rules).array(keys),
            "parts": Out(params.rules * MATCH_PARTS).array(keys),
            "pick": In(params.rules), "picked": Out(self.layout),
            "picked_quota": Out(32),
            "entry": Out(self.layout).array(params.rules), "quota": Out(32).array(params.rules),
        })

    def elaborate(self, platform):
        m = Module()
        R = self.regmap
        P = self.params.ports
        entries = [Signal(self.layout, name=f"rule{i}") for i in range(self.params.rules)]
        quotas = [Signal(32, name=f"quota{i}") for i in range(self.params.rules)]

        new = Signal(self.layout)
        prog = self.program
        f = lambda reg, name: field_bits(getattr(prog, reg.lower()), R[reg].field(name))  # noqa: E731
        m.d.comb += [
            new.valid.eq(field_bits(prog.rule_write_data, R["RULE_WRITE"].field("valid"))),
            new.group_value.eq(f("RULE_GROUP", "value")), new.group_mask.eq(f("RULE_GROUP", "mask")),
            new.layer_value.eq(f("RULE_LAYER", "value")), new.layer_mask.eq(f("RULE_LAYER", "mask")),
            new.chunk_value.eq(f("RULE_CHUNK", "value")), new.chunk_mask.eq(f("RULE_CHUNK", "mask")),
            new.contributors.eq(f("RULE_PORTS", "contributors")[:P]),
            new.results.eq(f("RULE_PORTS", "results")[:P]),
            new.base.eq(f("RULE_SLOTS", "base")), new.count_log2.eq(f("RULE_SLOTS", "count_log2")),
            new.dtype.eq(f("RULE_TYPE", "dtype")), new.red_op.eq(f("RULE_TYPE", "red_op")),
            new.acc_fp32.eq(f("RULE_TYPE", "acc_fp32")), new.saturate.eq(f("RULE_TYPE", "saturate")),
            new.reproducible.eq(f("RULE_TYPE", "reproducible")),
        ]
        if self.params.uplink:
            m.d.comb += new.uplink.eq(f("RULE_TYPE", "uplink"))
        index = field_bits(prog.rule_write_data, R["RULE_WRITE"].field("index"))
        # the quota 2**count_log2 - 1 as its ones, bit j set for j < count_log2: a compare per bit, not a
        # 32-bit shift and subtract (the integer switch measured the RULE_SLOTS register -> 2.82 ns of
        # routing -> the subtract's 16 carry steps, 114.69 MHz)
        top = (1 << len(new.count_log2)) - 1      # count_log2's largest value: no bit j >= top is set
        new_quota = Cat(*(new.count_log2 > j if j < top else Const(0, 1) for j in range(32)))
        for i, (e, q) in enumerate(zip(entries, quotas)):
            with m.If(prog.rule_write_stb & (index == i)):
                m.d.sync += [e.eq(new), q.eq(new_quota)]
            m.d.comb += [self.entry[i].eq(e), self.quota[i].eq(q)]

        def match_parts(key, e):
            # the bits that differ where the mask cares, in parts; the valid bit joins the first part
            differ = Cat((key.group_id ^ e.group_value) & e.group_mask, (key.layer_id ^ e.layer_value) & e.layer_mask,
                         (key.chunk_id ^ e.chunk_value) & e.chunk_mask)
            return Cat(*((part == 0) & (e.valid if k == 0 else 1) for k, part in enumerate(split(differ, MATCH_PARTS))))

        for key, hits, first, parts in zip(self.key, self.hits, self.first, self.parts):
            m.d.comb += [parts.eq(Cat(*(match_parts(key, e) for e in entries))),
                         hits.eq(hits_of_parts(parts, len(entries))),
                         first.eq(lowest_one(hits, len(entries)))]     # the lowest index has priority
        m.d.comb += [
            self.picked.eq(or_tree(Mux(self.pick[i], e.as_value(), 0) for i, e in enumerate(entries))),
            self.picked_quota.eq(or_tree(Mux(self.pick[i], q, 0) for i, q in enumerate(quotas))),
        ]
        return m


class MacTable(wiring.Component):
    """Exact match of a MAC address to its port; the lowest-index valid match wins.

    The same entries route ordinary frames by their destination and bind source addresses to ports
    (SPOOFED_SOURCE): a key is any address to look up.

    A lookup has two halves, so a pipeline can register between them: the compares give ``hits`` and the
    winner, one-hot, ``first`` (for ``keys`` addresses at once); ``pick`` (a winner, registered or not)
    gives its port.

    Members
    -------
    program : In(TableProgramSignature)
        MAC_WRITE strobe and data, and the staged address registers (the rule and slot members are not
        used here).
    mac[k] : In(48); hits[k] : Out(mac_entries); first[k] : Out(mac_entries)
        The addresses to look up; the valid entries that hold each, and the lowest of them, one-hot.
    parts[k] : Out(mac_entries * MATCH_PARTS)
        The same compare in :data:`MATCH_PARTS` parts per entry: :func:`hits_of_parts` of them is
        ``hits[k]``.
    pick : In(mac_entries); hit : Out(1); port : Out(range(ports)); port_mask : Out(ports)
        The entry in the one-hot ``pick``: whether there is one, its port, and that port one-hot (each
        entry's port is also kept one-hot, written with the entry).
    port_masks[i] : Out(ports)
        Entry i's port, one-hot (registers).
    """

    def __init__(self, params: SwitchParams, regmap: RegisterMap, keys: int = 1):
        self.params, self.regmap = params, regmap
        E = params.mac_entries
        super().__init__({
            "program": In(TableProgramSignature(regmap)),
            "mac": In(48).array(keys), "hits": Out(E).array(keys), "first": Out(E).array(keys),
            "parts": Out(E * MATCH_PARTS).array(keys),
            "pick": In(E), "hit": Out(1), "port": Out(range(params.ports)), "port_mask": Out(params.ports),
            "port_masks": Out(params.ports).array(E),
        })

    def elaborate(self, platform):
        m = Module()
        R = self.regmap
        P = self.params.ports
        layout = data.StructLayout({"valid": 1, "mac": 48, "port": range(P), "port_mask": P})
        entries = [Signal(layout, name=f"mac{i}") for i in range(self.params.mac_entries)]
        prog, cmd = self.program, R["MAC_WRITE"]
        index = field_bits(prog.mac_write_data, cmd.field("index"))
        port = field_bits(prog.mac_write_data, cmd.field("port"))
        for i, e in enumerate(entries):
            with m.If(prog.mac_write_stb & (index == i)):
                m.d.sync += [
                    e.valid.eq(field_bits(prog.mac_write_data, cmd.field("valid")) & (port < P)),
                    e.mac.eq(Cat(field_bits(prog.mac_addr_lo, R["MAC_ADDR_LO"].field("mac")),
                                 field_bits(prog.mac_addr_hi, R["MAC_ADDR_HI"].field("mac")))),
                    e.port.eq(port), e.port_mask.eq(1 << port),
                ]
        def match_parts(mac, e):
            return Cat(*((a == b) & (e.valid if k == 0 else 1)
                         for k, (a, b) in enumerate(zip(split(mac, MATCH_PARTS), split(e.mac, MATCH_PARTS)))))

        for mac, hits, first, parts in zip(self.mac, self.hits, self.first, self.parts):
            m.d.comb += [parts.eq(Cat(*(match_parts(mac, e) for e in entries))),
                         hits.eq(hits_of_parts(parts, len(entries))),
                         first.eq(lowest_one(hits, len(entries)))]     # the lowest index has priority
        first = self.pick
        m.d.comb += [
            *(self.port_masks[i].eq(e.port_mask) for i, e in enumerate(entries)),
            self.hit.eq(self.pick.any()),
            self.port.eq(or_tree(Mux(first[i], e.port, 0) for i, e in enumerate(entries))),
            self.port_mask.eq(or_tree(Mux(first[i], e.port_mask, 0) for i, e in enumerate(entries))),
        ]
        return m
