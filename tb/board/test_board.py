"""cocotb tests of the whole board (:class:`cais.hdl.board.simtop.BoardSimTop`) on its pins: Ethernet frames
from two simulated hosts on the RGMII pins, the controller's register accesses on the UART pins.

Run through :mod:`cais.tb.board.run` (``make board-sim``), which builds the model and sets ``$CAIS_BOARD_JOB``.
"""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.triggers import ClockCycles

from cais import protocol as proto
from cais import uartproto
from cais.fcs import fcs
from cais.registers import register_map

from ..common import quiet_bfms
from .link import BoardLink
from .run import JOB_ENV, sim_config

PREAMBLE = b"\x55" * 7 + b"\xd5"


def _job() -> dict:
    return json.loads(os.environ.get(JOB_ENV, "{}"))


async def _drops(link: BoardLink, regs) -> dict[str, int]:
    names = ["DROP_BAD_FCS", "DROP_OVERSIZE", "DROP_NO_ROUTE", "DROP_RUNT", "FORWARDED"]
    return {n: await link.read(regs[n].address()) for n in names}


@cocotb.test()
async def board_all_reduce(dut):
    """The driver's all-reduce, two ranks on the two RGMII ports, checked against numpy."""
    from cais.sim.workload import all_reduce_job

    job = _job()
    link = await BoardLink.start(dut, sim_config())
    quiet_bfms(dut)
    result = await all_reduce_job(link, {"ranks": 2, "elements": job.get("elements", 256),
                                         "dtype": job.get("dtype", "int32"), "seed": job.get("seed", 1)})
    dut._log.info("all-reduce: %s", {k: result[k] for k in ("correct", "cycles", "frames_sent", "paths")})
    assert result["correct"], f"all-reduce result differs from numpy: {result}"
    assert sum(result["retransmissions"]) == 0, f"frames were lost on the way: {result['retransmissions']} resent"
    assert not link.bad_received, f"frames with a bad FCS left the board: {link.bad_received[:2]}"
    regs = register_map(link.params)
    drops = {k: v for k, v in (await _drops(link, regs)).items() if k.startswith("DROP_")}
    assert drops == dict.fromkeys(drops, 0), f"the all-reduce's frames were dropped: {drops}"
    path = os.environ.get("CAIS_BOARD_RESULT")
    if path:
        with open(path, "w") as f:
            json.dump({k: v for k, v in result.items() if isinstance(v, (int, float, str, bool, list))}, f)


def _ordinary(n: int, tag: int) -> bytes:
    """An ordinary (non-CAIS) frame of n bytes without FCS to a unicast address no table holds (flooded)."""
    head = bytes.fromhex("020000000099") + bytes.fromhex("0200000000") + bytes([tag]) + b"\x08\x00"
    return head + bytes((tag + k) & 0xFF for k in range(n - len(head)))


@cocotb.test()
async def board_bad_frames(dut):
    """What each bad frame at the MAC's edge becomes (docs/board.md): a wrong FCS, a runt, a frame cut
    short and a giant are dropped and counted by the switch; every bad frame is followed by good ones at the
    minimum gap, which the switch floods to port 1 whole."""
    link = await BoardLink.start(dut, sim_config())
    quiet_bfms(dut)
    regs = register_map(link.params)
    before = await _drops(link, regs)

    good = [_ordinary(64, t) for t in range(3)]
    bad_fcs = bytearray(PREAMBLE + good[0] + fcs(good[0]))
    bad_fcs[30] ^= 0x10
    runt = _ordinary(40, 9)                                     # 44 bytes with its FCS, the FCS correct
    cut = PREAMBLE + (good[1] + fcs(good[1]))[:41]               # RX_DV falls after 41 bytes
    giant = _ordinary(proto.MAX_FRAME_BYTES + 86, 7)             # 1600 bytes, FCS correct
    sequence = [bytes(bad_fcs), PREAMBLE + runt + fcs(runt), cut, PREAMBLE + giant + fcs(giant)]
    for raw in sequence:
        link.send_raw(0, raw)
        for g in good:                                          # back to back at the 12-byte gap
            link.send_raw(0, PREAMBLE + g + fcs(g))
    while not link.sources[0].empty() or link.sources[0].active:
        await ClockCycles(dut.clk, 64)
    await ClockCycles(dut.clk, 200)
    after = await _drops(link, regs)
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"DROP_BAD_FCS": 3, "DROP_OVERSIZE": 1, "DROP_NO_ROUTE": 0, "DROP_RUNT": 0,
                     "FORWARDED": len(good) * len(sequence)}, delta
    assert link.take_received() == [(1, g) for g in good] * len(sequence)
    assert not link.bad_received


@cocotb.test()
async def board_uart_edges(dut):
    """The control link's bad input through the board: a wrong check byte, an unknown command, an unmapped
    register; the register written with a bad check byte is unchanged and a good request after each works."""
    link = await BoardLink.start(dut, sim_config())
    quiet_bfms(dut)
    regs = register_map(link.params)
    addr = regs["DROP_BAD_FCS"].address()
    raw = bytearray(uartproto.encode_request(uartproto.Command.WRITE, link.next_seq(), regs["SWITCH_MAC_LO"].address(),
                                                0x1234))
    raw[-1] ^= 0x01
    status, _ = await link.exchange(bytes(raw))
    assert status == uartproto.Status.BAD_CHECKSUM
    assert await link.read(regs["SWITCH_MAC_LO"].address()) == proto.SWITCH_MAC_DEFAULT & 0xFFFF_FFFF
    status, _ = await link.exchange(b"\x00")                 # no command: answered once the line is quiet
    assert status == uartproto.Status.UNKNOWN_COMMAND
    status, _ = await link.request(uartproto.Command.READ, 0xFFC)
    assert status == uartproto.Status.BUS_ERROR
    status, clock = await link.request(uartproto.Command.CLOCK)
    assert (status, clock) == (uartproto.Status.OK, link.config.clk_freq)
    assert await link.read(addr) == 0


@cocotb.test()
async def board_controller_over_uart(dut):
    """The real host code on the board's UART pins (a pty pumped to them, cais.sim.links.serial.PtyUart):
    SerialLink reads the build's parameters and clock, the controller (cais.controller) programs the MAC
    table and a group's rule and reads the counters back, which count the frames sent on the RGMII pins
    before: two with a wrong FCS (BAD_FCS), three good ones flooded to port 1 (FORWARDED)."""
    from cais.sim.links.serial import PtyUart, controller_session

    link = await BoardLink.start(dut, sim_config())
    quiet_bfms(dut)
    good = [_ordinary(70, t) for t in range(3)]
    for g in good[:2]:
        bad = bytearray(PREAMBLE + g + fcs(g))
        bad[-1] ^= 0x80
        link.send_raw(0, bytes(bad))
    for g in good:
        link.send_raw(0, PREAMBLE + g + fcs(g))
    while not link.sources[0].empty() or link.sources[0].active:
        await ClockCycles(dut.clk, 64)
    await ClockCycles(dut.clk, 200)
    assert link.take_received() == [(1, g) for g in good]
    pty = PtyUart(dut.clk, dut.uart_rx, dut.uart_tx, link.config.baud, every=100)

    try:
        params, clock_hz, group, counters, failures = await pty.run_host(lambda: controller_session(pty.path))
    finally:
        pty.close()
    assert params == link.params and clock_hz == link.config.clk_freq and failures == 0
    assert group.rule_index is not None
    assert counters["DROP_BAD_FCS"] == 2 and counters["FORWARDED"] == 3, counters
    assert counters["RX_FRAMES"] == [5, 0] and counters["TX_FRAMES"] == [0, 3], counters
