"""Host code on a simulated UART: a pty whose slave side is a serial port like /dev/ttyUSB0 for the real host
code (:class:`cais.serial_link.SerialLink`, the controller) running in a thread, and whose master side is
pumped to and from cocotbext-uart's models on the design's pins (cocotb).

Used by tb/uart (the bridge in front of the register block) and by the board's simulation (the whole board top):
``PtyUart(dut.clk, dut.uart_rx, dut.uart_tx, baud)``, then ``await pty.run_host(fn)`` runs ``fn()`` in a thread
while the simulation runs, and returns its result; :func:`controller_session` is the host code both run.
"""

from __future__ import annotations

import faulthandler
import os
import threading

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.uart import UartSink, UartSource

__all__ = ["PtyUart", "controller_session"]


class PtyUart:
    """A pty bridged to a UART model on the design's pins.

    Every ``every`` clock cycles the bytes host code wrote to the slave side go to a UartSource driving
    ``rx`` (the design's receive pin), and the bytes a UartSink took from ``tx`` go to the host. The pty is
    raw on both sides (SerialLink sets the slave's termios).

    Members
    -------
    path : str
        The slave side's device path (give ``serial:<path>`` to the controller).
    source : UartSource
    sink : UartSink
    to_design, from_design : int
        Bytes pumped each way.
    """

    def __init__(self, clk, rx, tx, baud: int, *, every: int = 200):
        self.clk, self.every = clk, every
        # both ends stay open for the pty's life: a master whose slave nobody holds reads EIO
        self._master, self._slave = os.openpty()
        os.set_blocking(self._master, False)
        self.path = os.ttyname(self._slave)
        self.source = UartSource(rx, baud=baud)
        self.sink = UartSink(tx, baud=baud)
        self.to_design = self.from_design = 0
        self._pump = cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await ClockCycles(self.clk, self.every)
            try:
                data = os.read(self._master, 4096)
            except BlockingIOError:
                data = b""
            if data:
                self.source.write_nowait(data)
                self.to_design += len(data)
            out = bytes(self.sink.read_nowait())
            if out:
                os.write(self._master, out)
                self.from_design += len(out)

    async def run_host(self, fn, *, max_cycles: int = 50_000_000, poll: int = 1000, hang_seconds: float = 600.0):
        """Run ``fn()`` in a thread while the simulation runs (checked every ``poll`` cycles); its result, or
        its exception raised here. AssertionError if it is still running after ``max_cycles``.

        ``hang_seconds`` is a hang guard, not a timing check: if the simulation and the thread together stop
        making progress (a deadlock between them would stop the cycle count too), every thread's stack goes
        to the simulator's log and the process exits, so the run fails with a trace instead of hanging."""
        outcome = {}

        def body():
            try:
                outcome["value"] = fn()
            except BaseException as e:          # handed to the simulation's side
                outcome["error"] = e

        thread = threading.Thread(target=body, name="host-on-pty", daemon=True)
        thread.start()
        faulthandler.dump_traceback_later(hang_seconds, exit=True)
        try:
            waited = 0
            while thread.is_alive():
                assert waited < max_cycles, f"the host code did not finish within {max_cycles} cycles"
                await ClockCycles(self.clk, poll)
                waited += poll
        finally:
            faulthandler.cancel_dump_traceback_later()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def close(self):
        self._pump.cancel()
        os.close(self._master)
        os.close(self._slave)


#: The two ranks' MACs the testbenches' controller sessions program.
SESSION_MACS = [0x02CA_0000_0010, 0x02CA_0000_0011]


def controller_session(path: str, *, on_write=None):
    """The controller's bring-up over the serial line at ``path`` (a :class:`PtyUart`'s slave side), for
    :meth:`PtyUart.run_host`: :class:`~cais.serial_link.SerialLink` reads the build's parameters and clock from
    the CONST registers, the controller programs the MAC table of ranks 0 and 1 on ports 0 and 1 and a group
    of both, and reads the counters back. ``on_write(addr, value)`` sees every register write before it is
    made. Returns ``(params, clock_hz, group, counters, failures)``."""
    from cais.config import Config
    from cais.controller import Controller
    from cais.link import run_sync
    from cais.serial_link import SerialLink

    link = SerialLink(path, timeout=30.0, quiet=0.2)    # the pty's baud is nominal: the simulated line sets the rate
    try:
        if on_write is not None:
            inner = link.write

            async def spy(addr, value):
                on_write(addr, value)
                await inner(addr, value)
            link.write = spy
        ctl = Controller(link, Config(offload="always", slots_per_group=2), [0, 1], SESSION_MACS)
        run_sync(ctl.start())
        group = run_sync(ctl.create_group([0, 1]))
        return link.params, link.clock_hz, group, run_sync(ctl.read_counters()), link.failures
    finally:
        link.close()
