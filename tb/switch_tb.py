"""cocotb testbench for the exported switch (``cais_switch``, docs/interface.md), Forencich style.

A :class:`TB` owns the clock, the reset and the bus functional models of one switch instance:

* per port an ``AxiStreamSource`` on ``s_axis_p<p>`` and an ``AxiStreamSink`` on ``m_axis_p<p>``
  (cocotbext-axi; the ports use single underscores, so the default separator works),
* an ``AxiLiteMaster`` on ``s_axil`` for the registers (:meth:`TB.read`, :meth:`TB.write`, :meth:`TB.apply`).

Frames go in with :meth:`TB.send` (a :class:`cais.sim.traffic.TxFrame`; a ``bad_keep`` frame is sent with
exactly the beats of :func:`cais.sim.traffic.beats_of`), :meth:`TB.drain` waits until the switch has
decided every frame sent since the last reset and its egress has gone quiet, and collects what came out
into ``TB.rx[port]`` (bytes per frame, after checking each frame's tkeep framing). :meth:`TB.stamps`
starts a :class:`Stamps` monitor that stamps every handshake with its clock cycle (for timing tests).

The parameters of the build come from the environment: ``CAIS_PARAMS`` (JSON of
``SwitchParams.as_dict()``, passed by the pytest wrappers), else the ``cais_switch.params.json`` the
export writes next to the Verilog in the build folder (found from the run folder upwards). :meth:`TB.start`
checks them against the constant registers.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import warnings
from pathlib import Path
from typing import Callable, Iterable, Iterator

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import convert
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiResp, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                           AxiStreamSource)

from cais.params import SwitchParams
from cais.registers import MAGIC, read_counters, register_map
from cais.sim.traffic import TxFrame, beats_of

__all__ = ["TB", "Stamps", "load_params", "cycle_pattern", "random_pattern", "PARAMS_ENV"]

# cocotbext-axi 0.1.28 still uses APIs cocotb 2.x deprecates; the warnings say nothing about the switch.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.")

PARAMS_ENV = "CAIS_PARAMS"
PARAMS_FILE = "cais_switch.params.json"


def load_params() -> SwitchParams:
    """The build's parameters: ``$CAIS_PARAMS`` (JSON), else the build folder's params file."""
    text = os.environ.get(PARAMS_ENV)
    if text:
        data = json.loads(text)
        return SwitchParams(**data.get("params", data))
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        path = folder / PARAMS_FILE
        if path.is_file():
            return SwitchParams(**json.loads(path.read_text())["params"])
    raise RuntimeError(f"no build parameters: set {PARAMS_ENV} or run inside a build folder holding {PARAMS_FILE}")


def cycle_pattern(pattern: Iterable[int] = (1, 1, 1, 0)) -> Callable[[int], Iterator[int]]:
    """A generator factory for pause patterns (1 = pause this cycle), as the verilog-axis testbenches use."""
    pattern = list(pattern)
    return lambda _port: itertools.cycle(pattern)


def random_pattern(probability: float, seed: int) -> Callable[[int], Iterator[int]]:
    """A generator factory: pause with *probability* each cycle, seeded per port."""
    def make(port: int) -> Iterator[int]:
        rng = random.Random(seed * 1009 + port)
        while True:
            yield int(rng.random() < probability)
    return make


class Stamps:
    """Cycle stamps of the switch's handshakes, kept by one free-running monitor coroutine.

    Start it with :meth:`TB.stamps`. Cycle n is the clock period that begins at the n-th rising edge after
    the monitor started (``cycle`` is the current one); a handshake is stamped with the cycle in which its
    valid and ready were both high, i.e. the edge ending that cycle transfers it (the convention of
    ``cais.sim.amaranth_harness.SwitchSim``). The monitor samples in the ReadOnly phase after every rising
    edge, when the BFMs have driven and the design has settled: the values the next edge will take.

    * ``ingress[p]`` / ``egress[p]``: (first, last) beat cycles of every frame on ``s_axis_p<p>`` /
      ``m_axis_p<p>``, in order;
    * ``gaps[p]``: the cycles in which ``m_axis_p<p>`` was ready inside a frame (after its first beat,
      before its last) but tvalid was low;
    * ``ar``: the cycle each AXI4-Lite read address was accepted (arvalid and arready).
    """

    def __init__(self, dut, ports: int):
        self.ports = ports
        self.cycle = -1
        self.ingress: list[list[tuple[int, int]]] = [[] for _ in range(ports)]
        self.egress: list[list[tuple[int, int]]] = [[] for _ in range(ports)]
        self.gaps: list[list[int]] = [[] for _ in range(ports)]
        self.ar: list[int] = []
        self._clk = dut.clk
        self._s = [tuple(getattr(dut, f"s_axis_p{p}_{n}") for n in ("tvalid", "tready", "tlast"))
                   for p in range(ports)]
        self._m = [tuple(getattr(dut, f"m_axis_p{p}_{n}") for n in ("tvalid", "tready", "tlast"))
                   for p in range(ports)]
        self._ar = (dut.s_axil_arvalid, dut.s_axil_arready)
        self._task = cocotb.start_soon(self._run())

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        s_first: list[int | None] = [None] * self.ports
        m_first: list[int | None] = [None] * self.ports
        edge = RisingEdge(self._clk)
        while True:
            await edge
            await ReadOnly()
            self.cycle += 1
            n = self.cycle
            for p, (valid, ready, last) in enumerate(self._s):
                if valid.value and ready.value:
                    if s_first[p] is None:
                        s_first[p] = n
                    if last.value:
                        self.ingress[p].append((s_first[p], n))
                        s_first[p] = None
            for p, (valid, ready, last) in enumerate(self._m):
                if ready.value:
                    if valid.value:
                        if m_first[p] is None:
                            m_first[p] = n
                        if last.value:
                            self.egress[p].append((m_first[p], n))
                            m_first[p] = None
                    elif m_first[p] is not None:
                        self.gaps[p].append(n)
            if self._ar[0].value and self._ar[1].value:
                self.ar.append(n)


class TB:
    """Clock, reset and BFMs of one ``cais_switch``; see the module docstring."""

    def __init__(self, dut, params: SwitchParams | None = None, *, period_ns: int = 10):
        self.dut = dut
        self.params = params or load_params()
        self.regmap = register_map(self.params)
        self.log = logging.getLogger("cocotb.tb")
        self.log.setLevel(logging.INFO)
        P = self.params
        self.beat_bytes = P.beat_bytes

        # The ports must be the ones the parameters promise before any BFM attaches to them.
        width = len(dut.s_axis_p0_tdata)
        assert width == P.data_width, f"s_axis_p0_tdata is {width} bits, params say data_width={P.data_width}"
        assert hasattr(dut, f"s_axis_p{P.ports - 1}_tdata"), f"no s_axis_p{P.ports - 1}: not a {P.ports}-port build"
        assert not hasattr(dut, f"s_axis_p{P.ports}_tdata"), f"s_axis_p{P.ports} exists: more than {P.ports} ports"

        self._clock = Clock(dut.clk, period_ns, unit="ns")
        self._clock.start()
        dut.rst.value = 0

        # The BFMs log their configuration, every frame and every access at INFO: far too much.
        logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)
        self.source = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_p{p}"), dut.clk, dut.rst)
                       for p in range(P.ports)]
        self.sink = [AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_p{p}"), dut.clk, dut.rst)
                     for p in range(P.ports)]
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)

        self._m_tvalid = [getattr(dut, f"m_axis_p{p}_tvalid") for p in range(P.ports)]
        self.sent = [0] * P.ports          # frames handed to each source since the last reset
        self.sent_beats = 0                # their beats, for the drain time limit
        self.rx: list[list[bytes]] = [[] for _ in range(P.ports)]   # frames received since the last reset
        self.rx_time: list[list[float]] = [[] for _ in range(P.ports)]   # when each began to arrive, ns
        self.tx_log: list[dict] = []       # every frame sent since the last reset, for diagnostics
        self.cycles_drained = 0
        self._has_busy = any(reg.name == "BUSY" for reg in self.regmap)

    # ------------------------------------------------------------------ clock and reset
    def stamps(self) -> Stamps:
        """Start a :class:`Stamps` monitor of every port's handshakes and the read address channel."""
        return Stamps(self.dut, self.params.ports)

    async def cycles(self, n: int) -> None:
        await ClockCycles(self.dut.clk, n)

    async def reset(self, cycles: int = 4) -> None:
        """Synchronous active-high reset for *cycles* clocks; forgets sent and received frames."""
        await RisingEdge(self.dut.clk)
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, cycles)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)
        for bfm in (*self.source, *self.sink):
            bfm.clear()
        self.sent = [0] * self.params.ports
        self.sent_beats = 0
        self.rx = [[] for _ in range(self.params.ports)]
        self.rx_time = [[] for _ in range(self.params.ports)]
        self.tx_log = []

    async def start(self) -> None:
        """Reset, then check the constant registers against the parameters."""
        await self.reset()
        await self.check_params()

    async def check_params(self) -> None:
        P = self.params
        expect = {"ID": MAGIC, "NUM_PORTS": P.ports, "DATA_WIDTH": P.data_width, "NUM_SLOTS": P.slots,
                  "MAX_PAYLOAD": P.max_payload, "NUM_RULES": P.rules, "NUM_MACS": P.mac_entries}
        got = {name: await self.read(self.regmap[name].address()) for name in expect}
        assert got == expect, f"constant registers {got} do not match the build parameters {expect}"

    # ------------------------------------------------------------------ flow control
    def set_idle_generator(self, make: Callable[[int], Iterator[int]] | None = None) -> None:
        """Idle insertion on every source: ``make(port)`` returns that port's pause generator (or None)."""
        for p, source in enumerate(self.source):
            self._set_pause(source, make(p) if make else None)

    def set_backpressure_generator(self, make: Callable[[int], Iterator[int]] | None = None) -> None:
        """Back-pressure on every sink: ``make(port)`` returns that port's pause generator (or None)."""
        for p, sink in enumerate(self.sink):
            self._set_pause(sink, make(p) if make else None)

    @staticmethod
    def _set_pause(bfm, generator: Iterator[int] | None) -> None:
        bfm.set_pause_generator(generator)
        if generator is None:
            bfm.pause = False   # removing a generator leaves its last value in place: un-pause explicitly

    # ------------------------------------------------------------------ registers
    async def write(self, addr: int, value: int) -> None:
        resp = await self.axil.write(addr, int(value).to_bytes(4, "little"))
        assert resp.resp == AxiResp.OKAY, f"write {addr:#05x} <- {value:#x}: response {resp.resp!r}"

    async def read(self, addr: int) -> int:
        resp = await self.axil.read(addr, 4)
        assert resp.resp == AxiResp.OKAY, f"read {addr:#05x}: response {resp.resp!r}"
        return int.from_bytes(resp.data, "little")

    async def apply(self, writes: Iterable[tuple[int, int]]) -> None:
        for addr, value in writes:
            await self.write(addr, value)

    async def read_named(self, name: str, element: int = 0) -> int:
        return await self.read(self.regmap[name].address(element))

    async def counters(self) -> dict[str, int | list[int]]:
        """Every COUNTER and LEVEL register, shaped like ``SwitchModel.counters()``."""
        return await read_counters(self.read, self.regmap)

    async def _decided(self) -> tuple[int, int]:
        """(sum of RX_FRAMES, frames decided = FORWARDED + CONTRIBUTIONS + DUPLICATES + sum DROP_*)."""
        rx = 0
        for p in range(self.params.ports):
            rx += await self.read_named("RX_FRAMES", p)
        decided = 0
        for reg in self.regmap:
            if reg.name.startswith("DROP_") or reg.name in ("FORWARDED", "CONTRIBUTIONS", "DUPLICATES"):
                decided += await self.read(reg.address())
        return rx & 0xFFFF_FFFF, decided & 0xFFFF_FFFF

    # ------------------------------------------------------------------ frames
    def axis_frame(self, frame: TxFrame) -> AxiStreamFrame:
        """The cocotbext-axi frame whose beats are exactly ``beats_of(frame, beat_bytes)``.

        cocotbext packs bytes into lanes in order, one tkeep bit per byte, and ends the frame with the
        last byte. A ``bad_keep`` frame therefore carries one extra byte with tkeep 0 in front of the
        last beat's bytes: lane 0 of the last beat is the gap, the bytes follow in lanes 1 and up.
        """
        data, B = bytes(frame.data), self.beat_bytes
        if not frame.bad_keep:
            return AxiStreamFrame(data)
        if not data or len(data) % B == 0:
            raise ValueError("a bad_keep frame needs a partial last beat")
        head = len(data) - len(data) % B
        tdata = data[:head] + b"\0" + data[head:]
        tkeep = [1] * head + [0] + [1] * (len(data) - head)
        axis = AxiStreamFrame(tdata, tkeep=tkeep)
        assert self._beats(tdata, tkeep) == beats_of(frame, B), "bad_keep frame does not match beats_of"
        return axis

    def _beats(self, tdata: bytes, tkeep: list[int]) -> list[tuple[int, int, bool]]:
        """The (tdata, tkeep, tlast) beats cocotbext-axi's source drives for these byte lists."""
        B, out = self.beat_bytes, []
        for i in range(0, len(tdata), B):
            chunk, keep = tdata[i:i + B], tkeep[i:i + B]
            out.append((int.from_bytes(chunk, "little"), sum(k << n for n, k in enumerate(keep)),
                        i + B >= len(tdata)))
        return out

    async def send(self, port: int, frame: TxFrame | bytes) -> None:
        """Queue a frame on ingress *port* (returns at once; the source sends in the background)."""
        if not isinstance(frame, TxFrame):
            frame = TxFrame(bytes(frame))
        entry = {"port": port, "index": self.sent[port], "frame": frame, "start": None, "end": None}

        def done(sent: AxiStreamFrame) -> None:   # the source's copy, when its last beat is driven
            entry["start"] = convert(sent.sim_time_start, "step", to="ns")
            entry["end"] = convert(sent.sim_time_end, "step", to="ns")

        axis = self.axis_frame(frame)
        axis.tx_complete = done
        self.tx_log.append(entry)
        await self.source[port].send(axis)
        self.sent[port] += 1
        self.sent_beats += max(1, -(-len(frame.data) // self.beat_bytes))

    def _collect(self) -> None:
        """Move every frame the sinks hold into ``rx``, checking the egress framing rule."""
        B = self.beat_bytes
        for p, sink in enumerate(self.sink):
            while not sink.empty():
                f = sink.recv_nowait(compact=False)
                keep, data = list(f.tkeep), bytes(f.tdata)
                beats = [keep[i:i + B] for i in range(0, len(keep), B)]
                where = f"egress port {p}, frame {len(self.rx[p])} ({len(beats)} beats)"
                assert beats, f"{where}: empty frame"
                for n, beat in enumerate(beats[:-1]):
                    assert all(beat), f"{where}: beat {n} of {len(beats)} has tkeep {beat}, not all ones"
                last = beats[-1]
                ones = sum(last)
                assert ones and last == [1] * ones + [0] * (B - ones), \
                    f"{where}: last beat tkeep {last} is not a run of ones from lane 0"
                self.rx[p].append(data[:len(data) - B + ones])
                self.rx_time[p].append(convert(f.sim_time_start, "step", to="ns"))

    def context(self, expected: list[list[bytes]], got: list[list[bytes]]) -> list[str]:
        """For each port's first unexpected frame, when it came out and what went in just before."""
        out = []
        for port, (exp, rx) in enumerate(zip(expected, got)):
            extra = [f for f in rx if f not in exp]
            if extra:
                out.append(self.history(port, extra[0]))
        return out

    def history(self, port: int, data: bytes, count: int = 6) -> str:
        """Where an egress frame came from: when it arrived and the last ingress frames before it."""
        try:
            k = self.rx[port].index(data)
        except ValueError:
            return f"port {port}: frame not received"
        t = self.rx_time[port][k]
        recent = sorted((e for e in self.tx_log if e["end"] is not None and e["end"] <= t),
                        key=lambda e: e["end"])[-count:]
        lines = [f"egress port {port} frame {k} started at {t:.0f} ns (it may have waited in the egress FIFO); "
                 f"the last ingress frames driven before it:"]
        for e in recent:
            f = e["frame"]
            lines.append(f"  port {e['port']} #{e['index']} {len(f.data)} B{' bad_keep' if f.bad_keep else ''}"
                         f" {e['start']:.0f}..{e['end']:.0f} ns: {f.data[:32].hex()}")
        return "\n".join(lines)

    def egress_busy(self) -> bool:
        return any(int(v.value) for v in self._m_tvalid) or any(s.active for s in self.sink)

    async def drain(self, *, poll: int = 64, quiet: int | None = None, limit: int | None = None) -> None:
        """Wait until every frame sent since the reset is decided and the egress has been quiet.

        1. every source is idle (its last beat was accepted);
        2. sum(RX_FRAMES) equals the frames sent and equals FORWARDED + CONTRIBUTIONS + DUPLICATES +
           sum(DROP_*) (every received frame decided);
        3. the BUSY register reads 0, if the register map has it;
        4. no egress port shows tvalid and no sink is inside a frame for *quiet* cycles
           (default 2 * max_frame_beats + 50), sampled every 8 cycles.

        Then the received frames are collected into ``rx``. Raises AssertionError after *limit* cycles.
        """
        P = self.params
        quiet = 2 * P.max_frame_beats + 50 if quiet is None else quiet
        total = sum(self.sent)
        # Generous: every beat sent, at a quarter of the egress rate, plus slack.
        limit = limit if limit is not None else 20_000 + 16 * self.sent_beats + 4 * quiet
        spent = 0

        async def step(n):
            nonlocal spent
            await ClockCycles(self.dut.clk, n)
            spent += n
            if spent > limit:
                counters = await self.counters()
                raise AssertionError(
                    f"switch did not drain within {limit} cycles: sent {self.sent}, "
                    f"sources idle {[s.idle() for s in self.source]}, counters {counters}")

        while not all(s.idle() for s in self.source):
            await step(8)
        while True:
            rx, decided = await self._decided()
            if rx == total and decided == rx:
                break
            await step(poll)
        if self._has_busy:      # the switch's own "a frame is inside" gauge, where the build has it
            while await self.read_named("BUSY"):
                await step(poll)
        still = 0
        seen = sum(s.count() for s in self.sink)
        while still < quiet:
            await step(8)
            now = sum(s.count() for s in self.sink)
            if self.egress_busy() or now != seen:
                still = 0
                seen = now
            else:
                still += 8
        self.cycles_drained += spent
        self._collect()
