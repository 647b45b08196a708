"""Control/status registers: an AXI4-Lite subordinate, a small internal register bus and the register bank.

The register bank is generated from :func:`cais.registers.register_map`, the one description of the
register map; nothing here knows an offset or a register name. The path from the outside world is::

    AXI4-Lite manager --(AXI4LiteSignature)--> AXI4LiteToCSR --(CSRBusSignature)--> RegisterBank --> switch

Facts every part relies on:

- Registers are 32 bits wide and addressed by byte; the CSR bus carries the same byte addresses as the
  register map (bits 1:0 are always zero on it).
- One access at a time: the bridge handles one AXI4-Lite transaction, read or write, until its response
  has been accepted.
- Responses: ``OKAY`` for every access to an address of the map (reads of write-only registers return 0,
  writes to read-only registers are ignored); ``DECERR`` for an address that is not in the map (reads
  return 0, writes do nothing); ``SLVERR`` for a write whose ``wstrb`` is not ``0b1111``: registers are
  only written whole, and such a write is dropped without touching any register.
- Latency, counting the cycle in which the address (for writes: the later of AW and W) is accepted as
  cycle 0: the CSR strobe is in cycle 1, a written value or a command strobe appears at the register
  bank's outputs in cycle 2, ``bvalid`` rises in cycle 3. A read samples the register in cycle 1 and
  ``rvalid`` rises in cycle ``2 + CSR_READ_LATENCY`` (4).
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from cais.registers import Access, Kind, RegisterMap

from .tables import or_tree

__all__ = ["CSRBusSignature", "AXI4LiteSignature", "AXI4LiteToCSR", "RegisterBank", "AxiResp", "csr_addr_width",
           "CSR_READ_LATENCY"]

#: Cycles from a read strobe on the CSR bus to its data: the register bank's read multiplexers in two
#: registered steps (:class:`RegisterBank`), so that no read path runs from the address across the die to
#: every register in one cycle.
CSR_READ_LATENCY = 2     # AXI4LiteToCSR's READ_WAIT state and RegisterBank's two read steps are built for it


class AxiResp:
    """Encodings of AXI ``bresp``/``rresp``."""
    OKAY = 0b00
    EXOKAY = 0b01
    SLVERR = 0b10
    DECERR = 0b11


def csr_addr_width(regmap: RegisterMap) -> int:
    """Byte-address bits needed to reach every register of ``regmap``."""
    return (regmap.size - 1).bit_length()


class CSRBusSignature(wiring.Signature):
    """The internal register bus, seen from its initiator (the AXI4-Lite bridge).

    A read: the initiator holds ``addr`` and raises ``r_stb`` for one cycle; :data:`CSR_READ_LATENCY` (2)
    cycles later the subordinate presents the register in ``r_data`` (its value in the strobe's cycle). A
    write: the initiator holds ``addr`` and ``w_data`` and raises ``w_stb`` for one cycle. From the cycle
    after either strobe until the next strobe, ``err`` tells whether the address existed. ``r_stb`` and
    ``w_stb`` are never high together. ``r_data`` is only guaranteed in that one cycle.

    Parameters
    ----------
    addr_width : int
        Width of the byte address.

    Members
    -------
    addr : Out(addr_width)
        Byte address of the register, a multiple of 4.
    r_stb : Out(1)
        Read strobe, one cycle per read. Reads have no side effects.
    r_data : In(32)
        Read data, valid :data:`CSR_READ_LATENCY` cycles after ``r_stb``.
    w_stb : Out(1)
        Write strobe, one cycle per write.
    w_data : Out(32)
        Write data, valid with ``w_stb``.
    err : In(1)
        From the cycle after ``r_stb`` or ``w_stb`` to the next strobe: 1 if ``addr`` is not the address of
        any register.
    """

    def __init__(self, addr_width: int):
        if not isinstance(addr_width, int) or addr_width < 2:
            raise TypeError(f"addr_width must be an integer of at least 2, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({
            "addr": Out(addr_width),
            "r_stb": Out(1),
            "r_data": In(32),
            "w_stb": Out(1),
            "w_data": Out(32),
            "err": In(1),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def __eq__(self, other):
        return type(other) is CSRBusSignature and other.addr_width == self.addr_width

    def __hash__(self):
        return hash((CSRBusSignature, self._addr_width))

    def __repr__(self):
        return f"CSRBusSignature({self._addr_width})"


class AXI4LiteSignature(wiring.Signature):
    """An AXI4-Lite interface with 32-bit data, seen from the manager.

    The directions are the manager's: ``Out`` members are driven by the manager (addresses, data,
    valid of AW/W/AR, ready of B/R), ``In`` members by the subordinate. A subordinate therefore has
    an ``In(AXI4LiteSignature(...))`` member (as :class:`AXI4LiteToCSR` does), and a top-level module
    that exposes the switch's control port to an outside manager declares it the same way, e.g.
    ``"s_axil": In(AXI4LiteSignature(aw))``, which exports ``s_axil__awaddr`` as an input and
    ``s_axil__awready`` as an output.

    Parameters
    ----------
    addr_width : int
        Width of ``awaddr`` and ``araddr`` (byte addresses).

    Members
    -------
    awaddr : Out(addr_width)
    awprot : Out(3)
        Ignored by :class:`AXI4LiteToCSR`.
    awvalid : Out(1)
    awready : In(1)
    wdata : Out(32)
    wstrb : Out(4)
    wvalid : Out(1)
    wready : In(1)
    bresp : In(2)
    bvalid : In(1)
    bready : Out(1)
    araddr : Out(addr_width)
    arprot : Out(3)
        Ignored by :class:`AXI4LiteToCSR`.
    arvalid : Out(1)
    arready : In(1)
    rdata : In(32)
    rresp : In(2)
    rvalid : In(1)
    rready : Out(1)
    """

    def __init__(self, addr_width: int):
        if not isinstance(addr_width, int) or addr_width < 2:
            raise TypeError(f"addr_width must be an integer of at least 2, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({
            "awaddr": Out(addr_width),
            "awprot": Out(3),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata": Out(32),
            "wstrb": Out(4),
            "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2),
            "bvalid": In(1),
            "bready": Out(1),
            "araddr": Out(addr_width),
            "arprot": Out(3),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata": In(32),
            "rresp": In(2),
            "rvalid": In(1),
            "rready": Out(1),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def __eq__(self, other):
        return type(other) is AXI4LiteSignature and other.addr_width == self.addr_width

    def __hash__(self):
        return hash((AXI4LiteSignature, self._addr_width))

    def __repr__(self):
        return f"AXI4LiteSignature({self._addr_width})"


class AXI4LiteToCSR(wiring.Component):
    """AXI4-Lite subordinate that performs each transaction as one access on the CSR bus.

    One transaction is in flight at a time. AW and W are accepted independently, in either order or in
    the same cycle; the write is performed once both have arrived. While no half of a write has been
    accepted, a pending read and a pending write are served alternately (a read first after reset),
    so neither can starve the other and both arriving together cannot deadlock. A write of which one
    half has been accepted is completed before any read is accepted (the manager must deliver the other
    half regardless of AR).

    ``awready``, ``wready`` and ``arready`` are high only while the bridge is idle, and may depend
    combinationally on the valid signals (that is how the arbitration picks one). ``rvalid``,
    ``bvalid`` and the response payloads are decoded from registers only. ``awprot``/``arprot`` are ignored and
    bits 1:0 of the addresses are ignored (each access is the whole aligned word).

    Responses: ``OKAY``; ``DECERR`` when the CSR bus reports that no register lives at the address
    (reads return 0); ``SLVERR`` for a write with ``wstrb != 0b1111``, which is dropped: no partial
    writes, since registers such as the rule and MAC staging registers and the commands only make
    sense written whole.

    ``w_hold`` holds writes back: while it is high neither AW nor W is accepted (a pending read is served
    meanwhile), so a write waits for room rather than being lost. The switch raises it while the
    SLOT_CLEAR queue is full (:class:`cais.hdl.decision.Maintenance`); it must rise no later than the
    cycle after a write's command strobe (cycle 3 below) for the next write to see it.

    Latency: the CSR strobe is issued one cycle after the address (for a write: the later of AW and
    W) is accepted; ``bvalid`` rises three cycles after the write is accepted, ``rvalid``
    ``CSR_READ_LATENCY + 2`` (four) cycles after the read's address.

    Parameters
    ----------
    addr_width : int
        Byte-address width of both buses.

    Members
    -------
    axil : In(AXI4LiteSignature(addr_width))
        The AXI4-Lite subordinate port.
    csr : Out(CSRBusSignature(addr_width))
        The CSR bus, initiator side.
    w_hold : In(1)
        Accept no write (AW or W) in this cycle.
    """

    def __init__(self, addr_width: int):
        self._addr_width = addr_width
        super().__init__({
            "axil": In(AXI4LiteSignature(addr_width)),
            "csr": Out(CSRBusSignature(addr_width)),
            "w_hold": In(1),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def elaborate(self, platform):
        m = Module()
        axil, csr = self.axil, self.csr

        addr = Signal(self._addr_width)   # the word being accessed, bits 1:0 zero
        wdata = Signal(32)
        wstrb = Signal(4)
        aw_got = Signal()                 # AW of the pending write accepted
        w_got = Signal()                  # W of the pending write accepted
        prefer_write = Signal()           # round-robin: who wins when both are pending
        rdata = Signal(32)
        rresp = Signal(2)
        bresp = Signal(2)
        is_write = Signal()               # the access in progress is a write
        whole = Signal()                  # the pending write has wstrb == 0b1111
        word = ~Const(3, self._addr_width)
        m.d.comb += whole.eq(wstrb == 0b1111)

        m.d.comb += [
            csr.addr.eq(addr),
            csr.w_data.eq(wdata),
            axil.rdata.eq(rdata),
            axil.rresp.eq(rresp),
            axil.bresp.eq(bresp),
        ]

        # `is_write` tells which access STROBE, LATCH and RESP serve (READ_WAIT only reads).
        with m.FSM(name="axil_fsm"):
            with m.State("IDLE"):
                write_pending = aw_got | w_got | axil.awvalid | axil.wvalid
                take_read = Signal()
                m.d.comb += take_read.eq(axil.arvalid & ~aw_got & ~w_got &
                                         ~(prefer_write & (axil.awvalid | axil.wvalid) & ~self.w_hold))
                m.d.comb += [
                    axil.arready.eq(take_read),
                    axil.awready.eq(~aw_got & ~take_read & ~self.w_hold),
                    axil.wready.eq(~w_got & ~take_read & ~self.w_hold),
                ]
                aw_hs = axil.awvalid & axil.awready
                w_hs = axil.wvalid & axil.wready
                with m.If(take_read):
                    m.d.sync += [
                        addr.eq(axil.araddr & word),
                        is_write.eq(0),
                        prefer_write.eq(write_pending),
                    ]
                    m.next = "STROBE"
                with m.Else():
                    with m.If(aw_hs):
                        m.d.sync += [addr.eq(axil.awaddr & word), aw_got.eq(1)]
                    with m.If(w_hs):
                        m.d.sync += [wdata.eq(axil.wdata), wstrb.eq(axil.wstrb), w_got.eq(1)]
                    with m.If((aw_got | aw_hs) & (w_got | w_hs)):
                        m.d.sync += [aw_got.eq(0), w_got.eq(0), is_write.eq(1), prefer_write.eq(0)]
                        m.next = "STROBE"

            with m.State("STROBE"):
                m.d.comb += [
                    csr.r_stb.eq(~is_write),
                    csr.w_stb.eq(is_write & whole),
                ]
                with m.If(is_write):
                    m.next = "LATCH"
                with m.Else():
                    m.next = "READ_WAIT"

            with m.State("READ_WAIT"):
                # a read's r_data comes CSR_READ_LATENCY cycles after its strobe (a write needs only err)
                m.next = "LATCH"

            with m.State("LATCH"):
                with m.If(is_write):
                    with m.If(~whole):
                        m.d.sync += bresp.eq(AxiResp.SLVERR)
                    with m.Elif(csr.err):
                        m.d.sync += bresp.eq(AxiResp.DECERR)
                    with m.Else():
                        m.d.sync += bresp.eq(AxiResp.OKAY)
                with m.Else():
                    m.d.sync += [
                        rdata.eq(Mux(csr.err, 0, csr.r_data)),
                        rresp.eq(Mux(csr.err, AxiResp.DECERR, AxiResp.OKAY)),
                    ]
                m.next = "RESP"

            with m.State("RESP"):
                m.d.comb += [
                    axil.rvalid.eq(~is_write),
                    axil.bvalid.eq(is_write),
                ]
                with m.If(Mux(is_write, axil.bready, axil.rready)):
                    m.next = "IDLE"

        return m


READ_QUAD = 4     # words per first-step read multiplexer of RegisterBank (a power of two)
READ_GROUP = 16   # words per second-step read multiplexer (a power of two, a multiple of READ_QUAD)


def _mux_tree(values, sel):
    """``values[sel]`` as a tree of 2:1 multiplexers on the bits of ``sel`` (len(values) == 2**len(sel));
    constant leaves fold away."""
    for bit in range(len(sel)):
        values = [Mux(sel[bit], values[i + 1], values[i]) for i in range(0, len(values), 2)]
    return values[0]


def _field_mask(reg) -> int:
    """Bits of a register that hold state: the union of its fields, or all 32 bits if it has none."""
    if not reg.fields:
        return 0xFFFF_FFFF
    mask = 0
    for f in reg.fields:
        mask |= f.mask
    return mask & 0xFFFF_FFFF


class RegisterBank(wiring.Component):
    """The switch's registers, generated from a :class:`~cais.registers.RegisterMap`.

    The signature depends on the map. Each register contributes members named after it in lower case;
    a register array (``count > 1``) contributes arrays of ``count`` members, element ``i`` belonging
    to the register at ``offset + i * stride``:

    - ``CONFIG``: ``<name>`` is ``Out(32)``, reset to the register's ``reset`` value, updated by writes.
    - ``COMMAND``: ``<name>_stb`` is ``Out(1)``, high for exactly one cycle per write, and
      ``<name>_data`` is ``Out(32)``, the written word, valid with the strobe and held until the next
      write.
    - ``COUNTER``: ``<name>_inc`` is ``In(counter_inc_width)``; the counter adds it every cycle and
      wraps modulo 2**32, one cycle late: the increment is registered before the adder, so an increment
      presented in cycle ``t`` is in the counter from cycle ``t + 2``. Counters reset to the register's
      ``reset`` value (0) and cannot be written.
    - ``LEVEL``: ``<name>_value`` is ``In(32)``; a read returns its value in the cycle of the read strobe.
    - ``CONST``: no member; a read returns the register's ``reset`` value.

    Bus behaviour: reads of write-only registers return 0; writes to read-only registers are ignored;
    both answer without error. An address that holds no register sets ``err`` (the bridge turns it
    into ``DECERR``). Bits outside a register's fields are reserved: writes to them are ignored and
    they read 0 (a register without fields uses all 32 bits). Decoding uses bits ``addr_width-1:2``
    of the address; the outputs are registered (a value written by the strobe in cycle ``t`` appears in
    cycle ``t + 1``). A read samples the registers in the cycle of ``r_stb`` and answers
    :data:`CSR_READ_LATENCY` cycles later, in steps, so that no path runs from the address to every
    register of the map in one cycle (the registers sit beside the blocks they drive, across the die): in
    the strobe's cycle each run of :data:`READ_QUAD` consecutive words registers the addressed one of them
    (by the address's low bits); in the next, each group of :data:`READ_GROUP` words registers its
    addressed run's word if the address is in the group (0 if not); a ``LEVEL`` input is registered as it
    is, with a flag telling whether it is the word read, and then once more, ANDed with its flag;
    ``r_data`` is the OR of the second step's registers (a combinational output, 2-3 LUT levels from
    registers).

    Parameters
    ----------
    regmap : RegisterMap
        The register map.
    counter_inc_width : int
        Width of each counter increment input.
    addr_width : int or None
        Byte-address width of the CSR bus; at least (and by default) what the map needs,
        :func:`csr_addr_width`.

    Members
    -------
    csr : In(CSRBusSignature(addr_width))
        The CSR bus, subordinate side.
    <name> : Out(32)
        One per ``CONFIG`` register (e.g. ``switch_mac_lo``, ``rule_group``).
    <name>_stb : Out(1), <name>_data : Out(32)
        One pair per ``COMMAND`` register (e.g. ``rule_write_stb``, ``rule_write_data``).
    <name>_inc : In(counter_inc_width)
        One per ``COUNTER`` register (e.g. ``drop_runt_inc``); an array for register arrays
        (``rx_bytes_inc[p]``).
    <name>_value : In(32)
        One per ``LEVEL`` register (e.g. ``slots_in_use_value``); ``In(n)`` for a register named in
        ``level_any``.

    ``level_any`` maps a one-element ``LEVEL`` register's name to ``n``: its value is the OR of ``n`` bits
    (``BUSY``: whether any block of the switch holds a frame), registered as they are and ORed after the
    register, so that no OR across the die is in front of a flip-flop; a read still returns the OR of the
    strobe's cycle.
    """

    def __init__(self, regmap: RegisterMap, counter_inc_width: int = 8, addr_width: int | None = None,
                 level_any: dict[str, int] | None = None):
        if not isinstance(counter_inc_width, int) or not 1 <= counter_inc_width <= 32:
            raise ValueError(f"counter_inc_width must be between 1 and 32, not {counter_inc_width!r}")
        need = csr_addr_width(regmap)
        if addr_width is None:
            addr_width = need
        if addr_width < need:
            raise ValueError(f"addr_width={addr_width} cannot reach the map's {regmap.size} bytes")
        self._regmap = regmap
        self._level_any = dict(level_any or {})
        for name, n in self._level_any.items():
            reg = regmap[name]
            if reg.kind is not Kind.LEVEL or reg.count != 1 or not isinstance(n, int) or n < 1:
                raise ValueError(f"level_any: {name} must be a one-element LEVEL register with n >= 1 bits, "
                                 f"not {reg.kind.name} x {reg.count} with {n!r}")
        self._counter_inc_width = counter_inc_width
        self._addr_width = addr_width

        # word address -> (register, element index); rejects overlapping or misaligned registers
        self._decode = {}
        for reg in regmap:
            if reg.stride % 4 or reg.stride <= 0:
                raise ValueError(f"register {reg.name}: stride {reg.stride} is not a positive multiple of 4")
            for i in range(reg.count):
                address = reg.address(i)
                if address % 4:
                    raise ValueError(f"register {reg.name}[{i}] at {address:#x} is not 32-bit aligned")
                if address >> 2 in self._decode:
                    other, j = self._decode[address >> 2]
                    raise ValueError(f"register {reg.name}[{i}] overlaps {other.name}[{j}] at {address:#x}")
                self._decode[address >> 2] = (reg, i)
            if reg.reset & ~_field_mask(reg):
                raise ValueError(f"register {reg.name}: reset {reg.reset:#x} sets bits outside its fields")

        members = {"csr": In(CSRBusSignature(addr_width))}

        def add(name, member, count):
            if name in members:
                raise ValueError(f"member name {name!r} is used twice")
            members[name] = member.array(count) if count > 1 else member

        for reg in regmap:
            base = reg.name.lower()
            if reg.kind is Kind.CONFIG:
                add(base, Out(32, init=reg.reset), reg.count)
            elif reg.kind is Kind.COMMAND:
                add(f"{base}_stb", Out(1), reg.count)
                add(f"{base}_data", Out(32), reg.count)
            elif reg.kind is Kind.COUNTER:
                add(f"{base}_inc", In(counter_inc_width), reg.count)
            elif reg.kind is Kind.LEVEL:
                add(f"{base}_value", In(self._level_any.get(reg.name, 32)), reg.count)
            elif reg.kind is Kind.CONST:
                pass
            else:  # pragma: no cover
                raise ValueError(f"register {reg.name}: unknown kind {reg.kind!r}")
        super().__init__(members)

    @property
    def regmap(self) -> RegisterMap:
        return self._regmap

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def counter_inc_width(self) -> int:
        return self._counter_inc_width

    def _element(self, name, index, count):
        member = getattr(self, name)
        return member[index] if count > 1 else member

    def elaborate(self, platform):
        m = Module()
        csr = self.csr
        word_addr = csr.addr[2:]

        # Storage and the value a read returns, per (register, element).
        read_value = {}
        counters = []
        for reg in self._regmap:
            base = reg.name.lower()
            for i in range(reg.count):
                mask = _field_mask(reg)
                if reg.kind is Kind.CONST:
                    value = Const(reg.reset & 0xFFFF_FFFF, 32)
                elif reg.kind is Kind.CONFIG:
                    value = self._element(base, i, reg.count)
                elif reg.kind is Kind.COMMAND:
                    value = self._element(f"{base}_data", i, reg.count)
                elif reg.kind is Kind.COUNTER:
                    value = Signal(32, init=reg.reset & 0xFFFF_FFFF,
                                   name=f"{base}_count" if reg.count == 1 else f"{base}_count_{i}")
                    counters.append((value, self._element(f"{base}_inc", i, reg.count)))
                else:  # LEVEL
                    value = self._element(f"{base}_value", i, reg.count)
                if reg.access is not Access.WO:
                    # (a level_any register's parts are kept whole: the read ORs them after the register)
                    whole = mask == 0xFFFF_FFFF or reg.name in self._level_any
                    read_value[(reg.name, i)] = value if whole else value & mask

        for count, inc in counters:
            # the increment registered first: whatever sums the events feeding it ends at a flip-flop
            inc_reg = Signal.like(inc, name=f"{count.name}_inc")
            m.d.sync += [inc_reg.eq(inc), count.eq(count + inc_reg)]   # truncated to 32 bits: wraps modulo 2**32

        # Command strobes are single-cycle pulses.
        for reg in self._regmap:
            if reg.kind is Kind.COMMAND:
                for i in range(reg.count):
                    m.d.sync += self._element(f"{reg.name.lower()}_stb", i, reg.count).eq(0)

        with m.If(csr.r_stb | csr.w_stb):
            m.d.sync += csr.err.eq(0)

        with m.If(csr.r_stb):
            with m.Switch(word_addr):
                for word in sorted(self._decode):
                    with m.Case(word):
                        pass
                with m.Default():
                    m.d.sync += csr.err.eq(1)

        # Reads in steps (CSR_READ_LATENCY): a register per run of READ_QUAD words, loaded every cycle
        # with the addressed word of the run; then one per group of READ_GROUP words, loaded with the
        # addressed run's word if the address is in the group (else 0), from the address registered beside
        # it; then the OR of the groups. LEVEL inputs skip the multiplexers: each is registered as it is
        # (its value of the strobe's cycle) with a flag saying it is the word being read, so nothing but a
        # flip-flop follows the input.
        qbits, gbits = (READ_QUAD - 1).bit_length(), (READ_GROUP - 1).bit_length()
        addr_d = Signal.like(word_addr, name="read_addr")       # the address of the first step's cycle
        m.d.sync += addr_d.eq(word_addr)
        groups = {}
        partials = []
        for word, (reg, i) in sorted(self._decode.items()):
            value = read_value.get((reg.name, i), 0)
            if reg.kind is Kind.LEVEL and reg.access is not Access.WO:
                sample = Signal(len(value), name=f"read_{reg.name.lower()}_{i}")
                hit = Signal(name=f"read_{reg.name.lower()}_{i}_hit")
                m.d.sync += [sample.eq(value), hit.eq(word_addr == word)]
                picked = Signal(len(value), name=f"read_{reg.name.lower()}_{i}_picked")
                m.d.sync += picked.eq(Mux(hit, sample, 0))
                partials.append(picked.any() if reg.name in self._level_any else picked)
            else:
                groups.setdefault(word >> gbits, {})[word & (READ_GROUP - 1)] = value
        for g, words in sorted(groups.items()):
            runs = []
            for q in range(READ_GROUP // READ_QUAD):
                leaves = [words.get(q * READ_QUAD + w, Const(0, 32)) for w in range(READ_QUAD)]
                if all(isinstance(leaf, Const) and leaf.value == 0 for leaf in leaves):
                    runs.append(Const(0, 32))
                    continue
                run = Signal(32, name=f"read_run_{g}_{q}")
                m.d.sync += run.eq(_mux_tree(leaves, word_addr[:qbits]))
                runs.append(run)
            partial = Signal(32, name=f"read_group_{g}")
            m.d.sync += partial.eq(Mux(addr_d[gbits:] == g, _mux_tree(runs, addr_d[qbits:gbits]), 0))
            partials.append(partial)
        m.d.comb += csr.r_data.eq(or_tree(partials))

        with m.If(csr.w_stb):
            with m.Switch(word_addr):
                for word, (reg, i) in sorted(self._decode.items()):
                    with m.Case(word):
                        if reg.access is Access.RO:
                            continue
                        base = reg.name.lower()
                        data = csr.w_data & _field_mask(reg)
                        if reg.kind is Kind.CONFIG:
                            m.d.sync += self._element(base, i, reg.count).eq(data)
                        elif reg.kind is Kind.COMMAND:
                            m.d.sync += [
                                self._element(f"{base}_stb", i, reg.count).eq(1),
                                self._element(f"{base}_data", i, reg.count).eq(data),
                            ]
                        # other kinds hold no writable state: the write is ignored
                with m.Default():
                    m.d.sync += csr.err.eq(1)

        return m
