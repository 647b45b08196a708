"""A simple dual-port block RAM whose read data is registered inside the RAM block.

On ECP5 the block RAM (``DP16KD``) has an output register (``REGMODE = "OUTREG"``) that takes the array's
slow clock-to-output (5.6-5.8 ns in nextpnr's model) off the path into the logic behind it; yosys' memory
inference never sets it (its ECP5 map writes ``REGMODE = "NOREG"``), so a RAM that wants it is an instance
of the primitive. :class:`OutputRegisteredRAM` is that RAM: elaborated for an ECP5 target
(:func:`ecp5_target`: a platform whose ``family`` is ``"ecp5"``, as Amaranth's Lattice platforms and
:data:`ECP5_SYNTHESIS` say) it is a tiling of ``DP16KD`` blocks with the output register on; elaborated for
anything else (amaranth.sim, the Verilog every Verilator build uses) it is an ``amaranth.lib.memory.Memory``
with its synchronous read port followed by one register, which behaves the same cycle for cycle.

A RAM built with ``registered_write`` also registers its write port beside the RAM: on ECP5 each DP16KD has
its own copy of the write's address, enable and data bits (``TRELLIS_FF`` instances, which yosys does not
merge back into one), so the logic that decides a write drives one net to the copies, placed next to their
blocks, instead of every block's pins across the die in the same cycle.
"""

from __future__ import annotations

from amaranth.hdl import ClockSignal, Const, Instance, Module, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..latency import BANK_READ
from .pipeline import delay_line, register_copy

__all__ = ["OutputRegisteredRAM", "ECP5Synthesis", "ECP5_SYNTHESIS", "ecp5_target", "DP16KD_MODES", "dp16kd_mode"]

#: The DP16KD's aspect ratios, as (data bits, rows) of one block (Lattice TN1264; yosys' brams_16kd.txt).
DP16KD_MODES = ((18, 1024), (9, 2048), (4, 4096), (2, 8192), (1, 16384))
#: Address pins of a DP16KD port (ADx13..ADx0): a mode of 2**k rows takes its address on the top k pins.
DP16KD_ADDR_PINS = 14


def ecp5_target(platform) -> bool:
    """Whether *platform* (the ``platform`` an ``elaborate`` receives) is an ECP5 synthesis target."""
    return getattr(platform, "family", None) == "ecp5"


class ECP5Synthesis:
    """The platform for an ECP5 synthesis outside any board (bench/bench_area.py's flow): it only names the
    family, so that blocks which instantiate ECP5 primitives (:class:`OutputRegisteredRAM`) do."""

    family = "ecp5"

    def __repr__(self):
        return "ECP5Synthesis()"


#: The one instance of :class:`ECP5Synthesis` (it has no state).
ECP5_SYNTHESIS = ECP5Synthesis()


def dp16kd_mode(width: int, depth: int) -> tuple[int, int]:
    """The DP16KD mode ``(data bits, rows)`` a ``width`` x ``depth`` RAM is tiled with: the widest whose rows
    hold ``depth`` (the fewest blocks: ``ceil(width / bits)``). A RAM deeper than one block's 16,384 rows
    would need blocks cascaded in depth, which :class:`OutputRegisteredRAM` does not build."""
    if width < 1 or depth < 1:
        raise ValueError(f"a RAM of {width} bits x {depth} rows is empty")
    for bits, rows in DP16KD_MODES:
        if rows >= depth:
            return bits, rows
    raise ValueError(f"{depth} rows is deeper than one DP16KD ({DP16KD_MODES[-1][1]} rows): cascading in "
                     f"depth is not built")


class OutputRegisteredRAM(wiring.Component):
    """``depth`` rows of ``shape`` (a width in bits, or any shape-castable, e.g. a struct layout: ``width``
    is its bits); one write port, one read port, one clock (``sync``).

    A write (``wr_en``) in cycle ``t`` is visible to a read issued in cycle ``t +`` :attr:`write_latency`
    or later: ``t + 1``, or ``t + 2`` with ``registered_write`` (the write reaches the RAM a cycle later); a
    read of the row being written in the same cycle has no defined result on the FPGA (the DP16KD's two
    ports collide), so a user must not issue one (the simulation model returns the old row). A read (``rd_en``)
    in cycle ``t`` shows the row on ``rd_data`` from cycle ``t + 2`` (:attr:`read_latency`: the
    synchronous read, then the output register) and holds it until the data of the next enabled read
    replaces it. The rows and ``rd_data`` have no reset value.

    Members
    -------
    wr_addr : In(range(depth)); wr_data : In(width); wr_en : In(1)
    rd_addr : In(range(depth)); rd_en : In(1)
    rd_data : Out(width)
        The read row (the output register: in a DP16KD, the block's own).

    ``mode`` is the DP16KD mode (data bits, rows) and ``blocks`` the DP16KD count on ECP5; a RAM deeper
    than one DP16KD (16,384 rows: no cascade is built) has neither and is the memory and a fabric register
    on ECP5 too (the same behaviour, without the block's output register). ``mem`` is the
    ``amaranth.lib.memory.Memory`` of the simulation form (rows of ``shape``): tests and the formal harness
    read it or add read ports to it; it is not part of the ECP5 form.
    """

    read_latency = BANK_READ        # the synchronous read, then the output register (cais.hdl.latency)

    @property
    def write_latency(self) -> int:
        """Cycles from a write to the first read that sees it: 1, one more with ``registered_write``."""
        return 1 + self.registered_write

    def __init__(self, shape, depth: int, *, registered_write: bool = False):
        width = Shape.cast(shape).width
        if width < 1 or depth < 1:
            raise ValueError(f"a RAM of {width} bits x {depth} rows is empty")
        self.shape, self.width, self.depth = shape, width, depth
        self.registered_write = registered_write
        # (data bits, rows) of the DP16KD tiling; None when deeper than one block (no cascade is built:
        # such a RAM is the memory and a fabric register on ECP5 too, as in simulation)
        self.mode = dp16kd_mode(width, depth) if depth <= DP16KD_MODES[-1][1] else None
        self.blocks = -(-width // self.mode[0]) if self.mode else None
        abits = max(ceil_log2(depth), 1)
        super().__init__({
            "wr_addr": In(abits), "wr_data": In(width), "wr_en": In(1),
            "rd_addr": In(abits), "rd_en": In(1),
            "rd_data": Out(width),
        })
        self._mem = None

    @property
    def mem(self) -> Memory:
        """The simulation form's memory, made on first use (an ECP5 form never makes it)."""
        if self._mem is None:
            self._mem = Memory(shape=self.shape, depth=self.depth, init=[])
        return self._mem

    def elaborate(self, platform):
        m = Module()
        if ecp5_target(platform) and self.mode is not None:
            self._dp16kd(m, platform)
        else:
            m.submodules.mem = mem = self.mem
            wr, rd = mem.write_port(), mem.read_port()
            out = Signal(self.width, reset_less=True, name="out_reg")
            write = [delay_line(m, sig, self.write_latency - 1, name)
                     for sig, name in ((self.wr_addr, "wr_addr"), (self.wr_data, "wr_data"), (self.wr_en, "wr_en"))]
            m.d.comb += [wr.addr.eq(write[0]), wr.data.eq(write[1]), wr.en.eq(write[2]),
                         rd.addr.eq(self.rd_addr), rd.en.eq(self.rd_en), self.rd_data.eq(out)]
            m.d.sync += out.eq(rd.data)
        return m

    def _block_write(self, m, platform, k, lo, hi):
        """Block ``k``'s write address, enable and data bits ``lo:hi``: the ports themselves, or with
        ``registered_write`` its own flip-flops (:func:`~cais.hdl.common.pipeline.register_copy`)."""
        if not self.registered_write:
            return self.wr_addr, self.wr_en, self.wr_data[lo:hi]
        return tuple(register_copy(m, sig, f"block{k}_{name}", platform)
                     for sig, name in ((self.wr_addr, "wr_addr"), (self.wr_en, "wr_en"),
                                       (self.wr_data[lo:hi], "wr_data")))

    def _dp16kd(self, m, platform):
        """Port A writes, port B reads; block ``k`` holds bits ``k * bits ...`` of every row."""
        bits, rows = self.mode
        k_rows = ceil_log2(rows)
        low = DP16KD_ADDR_PINS - k_rows          # address pins below the mode's address: 0, except in the
        # 18-bit mode, where AD1..0 are the write's byte enables (both with the write, as yosys' map has them)

        def addr_pins(side, addr, byte_enables):
            pins = {}
            for i in range(DP16KD_ADDR_PINS):
                if i >= low:
                    value = addr[i - low] if i - low < len(addr) else Const(0, 1)
                elif bits == 18 and i < 2:
                    value = byte_enables
                else:
                    value = Const(0, 1)
                pins[f"i_AD{side}{i}"] = value
            return pins

        for k in range(self.blocks):
            lo, hi = k * bits, min((k + 1) * bits, self.width)
            wr_addr, wr_en, data_in = self._block_write(m, platform, k, lo, hi)
            data_out = Signal(bits, name=f"block{k}_do")
            pins = {
                "p_DATA_WIDTH_A": bits, "p_DATA_WIDTH_B": bits,
                "p_REGMODE_A": "NOREG", "p_REGMODE_B": "OUTREG",
                "p_RESETMODE": "SYNC", "p_ASYNC_RESET_RELEASE": "SYNC",
                "p_CSDECODE_A": "0b000", "p_CSDECODE_B": "0b000",
                "p_WRITEMODE_A": "NORMAL", "p_WRITEMODE_B": "NORMAL",
                "p_GSR": "DISABLED",
                "i_CLKA": ClockSignal(), "i_CEA": Const(1, 1), "i_OCEA": Const(1, 1), "i_WEA": wr_en,
                "i_RSTA": Const(0, 1),
                "i_CLKB": ClockSignal(), "i_CEB": self.rd_en, "i_OCEB": Const(1, 1), "i_WEB": Const(0, 1),
                "i_RSTB": Const(0, 1),
                **{f"i_CS{side}{i}": Const(0, 1) for side in "AB" for i in range(3)},
                **addr_pins("A", wr_addr, wr_en), **addr_pins("B", self.rd_addr, Const(0, 1)),
                **{f"i_DIA{i}": (data_in[i] if i < len(data_in) else Const(0, 1)) for i in range(18)},
                **{f"i_DIB{i}": Const(0, 1) for i in range(18)},
                **{f"o_DOB{i}": data_out[i] for i in range(bits)},
            }
            m.submodules[f"block{k}"] = Instance("DP16KD", **pins)
            m.d.comb += self.rd_data[lo:hi].eq(data_out[:hi - lo])
