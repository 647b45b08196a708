"""cais-switch: a switch backend as a process whose ports are real Linux network interfaces.

::

    cais-switch --control /run/cais/switch.sock veth0 veth1 veth2 veth3     # the reference model
    cais-switch --backend verilator --control 127.0.0.1:7710 tap0 tap1      # the Verilated RTL

Switch port ``p`` is the ``p``-th interface named (an AF_PACKET raw socket on a veth end or a TAP
device, :mod:`cais.rawsock`). A frame that arrives on an interface goes into the backend's ingress of
that port; a frame that leaves an egress port is transmitted on its interface.

Backends are the links of :mod:`cais.sim.links`: ``model`` (the default; :class:`ModelLink`, numpy only)
and ``verilator`` (:class:`VerilatorLink`, the exported Verilog with its C++-driven clock; built on first
use, needs the [sim] extra). The clock is free-running in the sense that the daemon steps the backend
whenever frames are inside it (``advance_to_frame`` until BUSY reads 0) and lets it rest otherwise, so
the simulated clock advances as frames arrive and leave.

The control endpoint (``--control``: a Unix socket path or 127.0.0.1:PORT) is the AXI4-Lite port: JSON
lines, one request per line (docs/driver.md, "The switch daemon")::

    {"op": "read", "reg": "ID"}                      -> {"ok": true, "value": 1128352083}
    {"op": "read", "reg": "RX_FRAMES", "index": 2}   (per-port registers take "index")
    {"op": "read", "addr": 0}                        (a byte address of docs/registers.md)
    {"op": "write", "reg": "SWITCH_MAC_LO", "value": 1}
    {"op": "write", "reg": "RULE_SLOTS", "fields": {"base": 0, "count_log2": 5}}
    {"op": "info"}       -> params, clock_hz, backend, interfaces, cycle
    {"op": "stats"}      -> frames in and out per port, tagged frames refused per port, fault counts
    {"op": "fault", "port": 1, "drop": 0.05}   (replaces the port's faults; all rates 0 turns them off)

The endpoint is not authenticated by a token: only root and the daemon's own user may use it. A Unix socket
is created 0600 whatever the umask; a client on loopback TCP whose uid (``/proc/net/tcp``) is another user's
is refused. Every field is checked (plain integers in range); a bad request is one ``ok: false`` line and the
daemon goes on. Answers are sent without blocking: a client whose unread answers pass ``MAX_OUTPUT`` bytes,
or stay unread ``CLIENT_STALL_S``, is dropped; so is one that sends a line longer than
:data:`cais.endpoint.MAX_LINE` or nothing within :data:`cais.endpoint.AUTH_IDLE_S`. At most
:data:`cais.endpoint.MAX_CONNECTIONS` clients (fewer when ``RLIMIT_NOFILE`` leaves less than
``FD_RESERVE`` descriptors for the ports); out of descriptors, it stops accepting a moment, and frames go on
(docs/security.md).

``--fault PORT:drop=R[,duplicate=R][,reorder=R][,seed=N]`` injects seeded faults on a port's wires, both
directions (:class:`cais.sim.faults.FaultSpec`); ``--pcap DIR`` writes ``DIR/port<p>.pcap`` with every
frame the port received and transmitted, capped at ``--pcap-max-mb`` (64) per port over ``--pcap-files``
(4) rotated files, ``port<p>.pcap`` the newest, then ``port<p>.pcap.1``, ... (the oldest frames are dropped
first; :class:`cais.rawsock.PcapWriter`); DIR is made 0700 (or must be an existing folder of this user), the
files 0600, never opened through a symbolic link. Bad arguments: one line on stderr, exit status 2.

Links come and go: a port whose interface goes down, loses its carrier or is deleted is closed, counted
(``link_down`` in the ``stats`` answer) and logged; frames the switch sends to it meanwhile are dropped
and counted (``down_drops``; the ranks' retransmission or their CollectiveError deals with them), the
other ports go on. When the interface is up again (or re-created under the same name) the port opens
again (``link_up``) and carries frames as before.

One daemon per control socket and per interface: the daemon holds an exclusive lock (``fcntl.flock``)
on ``<socket>.lock`` beside a Unix control socket (``<lock dir>/control-<netns>-<host>-<port>.lock`` for
TCP) and on ``<lock dir>/iface-<netns>-<name>.lock`` per interface (``<netns>``: the network
namespace's inode, so that namespaces do not collide). The lock directory is ``$CAIS_LOCK_DIR``, else
``/run/cais``. A second daemon asking for a socket or an interface that is held is refused with one line
and exit status 2, and touches nothing of the first.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from cais import cmdline
from cais.endpoint import (AUTH_IDLE_S, MAX_CONNECTIONS, LineBuffer, accept_backoff, decode, listen, need_int,
                           parse_address, peer_uid, private_dir, trusted_uid)
from cais.link import run_sync
from cais.params import SwitchParams
from cais.rawsock import PcapWriter, RawPort, interface_error
from cais.registers import Kind, register_map
from cais.hdl.toolchain import INSTALL_SIM

__all__ = ["SwitchDaemon", "main", "parse_fault", "BACKENDS"]

BACKENDS = ("model", "verilator")
STEP_CYCLES = 4096          # one advance_to_frame call while frames are inside the Verilated switch
MODEL_STEP_CYCLES = 1 << 16   # one advance of the model while frames are inside it
DRAIN_LIMIT = 1 << 22       # cycles a drain may take before the daemon reports the switch stuck
LINK_CHECK_S = 0.1          # how often the daemon looks at its interfaces' state (down, gone, back)
PCAP_MAX_MB = 64            # default cap of one port's capture, MB, over PCAP_FILES rotated files
PCAP_FILES = 4
LOCK_DIR = "/run/cais"      # default folder of the interface (and TCP control) locks; $CAIS_LOCK_DIR
MAX_OUTPUT = 1 << 20        # answers waiting for a control client that does not read; past it, it is dropped
CLIENT_STALL_S = 10.0       # ... and so is one that leaves answers unread this long


FD_RESERVE = 16             # descriptors kept free for the ports, pcaps and link checks, whatever the clients


def _client_cap() -> int:
    """Control clients at most: MAX_CONNECTIONS, fewer when the descriptor limit leaves less room (the
    ports must never starve for descriptors because of control clients)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 64
    return max(1, min(MAX_CONNECTIONS, soft - used - FD_RESERVE))


class _Client:
    """A control connection: its partial input line, the answers it has not taken yet."""

    def __init__(self, sock: socket.socket, now: float):
        self.sock, self.seen, self.requests = sock, now, 0
        self.lines = LineBuffer()
        self.out = bytearray()
        self.events = selectors.EVENT_READ


class Busy(ValueError):
    """A control socket or interface another daemon holds (exit status 2, like a bad argument)."""


class Locks:
    """Exclusive ``flock`` locks held for the daemon's life, each a file holding the holder's PID.

    :meth:`take` raises :class:`Busy` naming the holder; :meth:`release` unlinks and unlocks every file.
    A lock file is unlinked by its holder only while locked, and a taker checks that the file it locked
    is still the one at the path (else it retries), so a lock is never held twice.
    """

    def __init__(self):
        self.held: list[tuple[Path, int]] = []

    @staticmethod
    def folder() -> Path:
        d = Path(os.environ.get("CAIS_LOCK_DIR") or LOCK_DIR)
        d.mkdir(parents=True, exist_ok=True)
        return d

    @staticmethod
    def netns() -> str:
        try:
            return str(os.stat("/proc/self/ns/net").st_ino)
        except OSError:
            return "0"

    def take(self, path: Path, what: str) -> None:
        for _ in range(10):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise Busy(f"{what} is in use by another cais-switch (pid {holder}); stop that one first "
                           f"or choose another") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.held.append((path, fd))
                return
            os.close(fd)           # the holder released (unlinked) it in between: take the new file
        raise Busy(f"{what}: could not take its lock {path}")

    def control(self, address) -> None:
        if address.family == socket.AF_UNIX:
            target = Path(address.target)
            self.take(target.with_name(target.name + ".lock"), f"control socket {address.target}")
        else:
            host, port = address.target
            self.take(self.folder() / f"control-{self.netns()}-{host}-{port}.lock", f"control endpoint {host}:{port}")

    def interface(self, name: str) -> None:
        self.take(self.folder() / f"iface-{self.netns()}-{name}.lock", f"interface {name!r}")

    def release(self) -> None:
        for path, fd in reversed(self.held):
            try:
                os.unlink(path)
            except OSError:
                pass
            os.close(fd)
        self.held.clear()


def parse_fault(text: str):
    """``PORT:drop=R,duplicate=R,reorder=R,seed=N`` -> (port, FaultSpec for that port)."""
    from .faults import FaultSpec
    port, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"{text!r}: expected PORT:drop=R[,duplicate=R][,reorder=R][,seed=N]")
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    values = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = {"loss": "drop", "dup": "duplicate"}.get(key.strip(), key.strip())
        if not eq or key not in ("drop", "duplicate", "reorder", "seed"):
            raise ValueError(f"{text!r}: {item!r} is not drop=R, duplicate=R, reorder=R or seed=N")
        try:
            values[key] = int(value) if key == "seed" else float(value)
        except ValueError:
            raise ValueError(f"{text!r}: {value!r} is not a number") from None
    try:
        return port_n, FaultSpec(ports=(port_n,), **values)
    except ValueError as e:
        raise ValueError(f"{text!r}: {e}") from None


_PAST = {"drop": "dropped", "duplicate": "duplicated", "reorder": "reordered"}


class PortFaults:
    """Seeded faults on one port's wires, applied where frames cross the interface: the decisions of
    :meth:`cais.sim.faults.FaultSpec.decide` (a pure function of the seed, direction, port, frame bytes
    and how often this exact frame was seen), so a run's faults are reproducible; a reordered frame is
    held until the next frame of its port and direction passes, or `hold_s` seconds.

    Members
    -------
    spec : FaultSpec
    stats : dict
        ``<direction>_<frames|dropped|duplicated|reordered>`` counts.
    """

    def __init__(self, spec, hold_s: float = 0.002):
        import hashlib
        self._hash = hashlib.blake2b
        self.spec, self.hold_s = spec, hold_s
        self.stats = {f"{d}_{k}": 0 for d in ("ingress", "egress")
                      for k in ("frames", "dropped", "duplicated", "reordered")}
        self._seen: dict[tuple, int] = {}
        self._held: dict[str, list[tuple[float, bytes]]] = {"ingress": [], "egress": []}

    @property
    def holding(self) -> int:
        return sum(len(h) for h in self._held.values())

    def apply(self, direction: str, port: int, frame: bytes, now: float) -> list[bytes]:
        """The frames to deliver now in place of `frame` (none, it, it twice, it and held ones)."""
        if not self.spec.active or not self.spec.applies(direction, port):
            return [frame]
        key = (direction, self._hash(frame, digest_size=16).digest())
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        action = self.spec.decide(direction, port, frame, occurrence)
        self.stats[f"{direction}_frames"] += 1
        if action != "pass":
            self.stats[f"{direction}_{_PAST[action]}"] += 1
        if action == "drop":
            return []
        if action == "reorder":
            self._held[direction].append((now + self.hold_s, frame))
            return []
        out = [frame, frame] if action == "duplicate" else [frame]
        out += [f for _, f in self._held[direction]]
        self._held[direction] = []
        return out

    def release_all(self, direction: str) -> list[bytes]:
        return self.expired(direction, float("inf"))

    def expired(self, direction: str, now: float) -> list[bytes]:
        held = self._held[direction]
        out = [f for t, f in held if t <= now]
        self._held[direction] = [(t, f) for t, f in held if t > now]
        return out


class SwitchDaemon:
    """The event loop: interfaces in and out of a backend link, plus the control endpoint.

    Members
    -------
    link :
        The backend (a :class:`cais.link.SwitchLink`), wrapped in one fault injector per faulty port.
    ports : list[RawPort]
        Port p's interface.
    frames_in, frames_out : list[int]
        Frames taken from / transmitted on each interface.
    tagged_drops : list[int]
        Frames refused on each interface for an 802.1Q/802.1ad tag (never handed to the switch).
    """

    def __init__(self, interfaces: list[str], params: SwitchParams, *, backend: str = "model",
                 control: str | None = None, faults: dict | None = None, pcap_dir: str | None = None,
                 pcap_max_bytes: int | None = None, pcap_files: int = 1):
        if len(interfaces) > params.ports:
            raise ValueError(f"{len(interfaces)} interfaces for a switch of {params.ports} ports")
        self.params, self.backend = params, backend
        self.interfaces = list(interfaces)
        self.locks = Locks()        # first of all: a refused daemon must touch nothing of the holder's
        self.control = None
        self.control_address = parse_address(control) if control else None
        try:
            if self.control_address is not None:
                self.locks.control(self.control_address)
            for name in interfaces:
                self.locks.interface(name)
        except (Busy, OSError):
            self.locks.release()
            raise
        self.regs = register_map(params)
        self._busy = self.regs["BUSY"].address()
        self.link = self._make_backend(backend, params)
        self.faults: dict[int, PortFaults] = {p: PortFaults(spec) for p, spec in (faults or {}).items()}
        n = len(interfaces)
        self.ports: list[RawPort | None] = []      # None while the port's interface is down or gone
        self.pcaps: list[PcapWriter | None] = [None] * n
        self.sel = selectors.DefaultSelector()
        self.frames_in, self.frames_out = [0] * n, [0] * n
        self.tagged_drops = [0] * n
        self.link_down, self.link_up, self.down_drops = [0] * n, [0] * n, [0] * n
        self._next_check = 0.0
        self._next_client_check = 0.0
        try:
            if pcap_dir:
                private_dir(pcap_dir)            # 0700, ours: captures hold every rank's payloads
                self.pcaps = [PcapWriter(Path(pcap_dir) / f"port{p}.pcap", pcap_max_bytes, pcap_files)
                              for p in range(n)]
            for p, name in enumerate(interfaces):
                self.ports.append(RawPort(name, self.pcaps[p]))
                self.sel.register(self.ports[p].sock, selectors.EVENT_READ, ("port", p))
        except OSError:
            self.close()
            raise
        if control:
            try:
                self.control = listen(self.control_address)
            except OSError:
                self.close()           # the interfaces, pcaps and locks taken so far
                raise
            self.control.setblocking(False)
            self.sel.register(self.control, selectors.EVENT_READ, ("listen", None))
        self._clients: dict[int, _Client] = {}
        self._accept_paused = 0.0          # while out of descriptors: when to accept again
        self._max_clients = _client_cap()
        self.control_dropped = 0           # control clients dropped (unread answers, silence, bad lines)
        self._addr_end = max(r.address(r.count - 1) for r in self.regs) + 4
        self._stop = False

    @staticmethod
    def _make_backend(backend: str, params: SwitchParams):
        if backend == "model":
            from .links.model import ModelLink
            return ModelLink(params)
        if backend == "verilator":
            try:
                from .links.verilator import VerilatorLink
            except ImportError as e:
                raise RuntimeError(f"--backend verilator needs the [sim] extra: {INSTALL_SIM} ({e})") from None
            return VerilatorLink(params)
        raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")

    # ------------------------------------------------------------------ links
    def _log(self, text: str) -> None:
        print(f"cais-switch: {text}", file=sys.stderr, flush=True)

    def _port_down(self, p: int, why: str) -> None:
        """Close port `p` (its interface went down, lost its carrier or was deleted); counted, logged."""
        port = self.ports[p]
        if port is None:
            return
        try:
            self.sel.unregister(port.sock)
        except (KeyError, ValueError):
            pass
        port.close(pcap=False)
        self.ports[p] = None
        self.link_down[p] += 1
        self._log(f"port {p} ({port.name}) down: {why}; its frames are dropped until it is back "
                  f"(link_down {self.link_down[p]})")

    def _port_fault(self, p: int) -> str:
        """Why open port `p` cannot carry frames now ("" if it can)."""
        port = self.ports[p]
        try:
            if socket.if_nametoindex(port.name) != port.ifindex:
                return "the interface was deleted and re-created"
        except OSError:
            return "the interface is gone"
        return interface_error(port.name, carrier_wait=0)

    def _check_links(self, now: float) -> None:
        """Every LINK_CHECK_S: close ports whose interface failed, open again those that came back."""
        if now < self._next_check:
            return
        self._next_check = now + LINK_CHECK_S
        for p, name in enumerate(self.interfaces):
            if self.ports[p] is not None:
                why = self._port_fault(p)
                if why:
                    self._port_down(p, why)
                continue
            if interface_error(name, carrier_wait=0):
                continue
            try:
                port = RawPort(name, self.pcaps[p], carrier_wait=0)
            except OSError:
                continue            # gone again in between: the next check tries again
            self.ports[p] = port
            self.sel.register(port.sock, selectors.EVENT_READ, ("port", p))
            self.link_up[p] += 1
            self._log(f"port {p} ({name}) up again (link_up {self.link_up[p]})")

    # ------------------------------------------------------------------ frames
    def _holding(self) -> bool:
        return any(f.holding for f in self.faults.values())

    def _busy_now(self) -> bool:
        return bool(run_sync(self.link.read(self._busy)))

    def _pump(self) -> None:
        """Step the backend while frames are inside it, transmitting what leaves."""
        start = self.link.cycle
        while True:
            self._transmit()
            if not self._busy_now():
                break
            if self.backend == "model":
                # the model's time is lazy: one long advance hands out everything decided by then, in
                # order (advance_to_frame would stop after each frame, costing a scan of its queue each)
                run_sync(self.link.advance(MODEL_STEP_CYCLES))
            else:
                run_sync(self.link.advance_to_frame(STEP_CYCLES))
            if self.link.cycle - start > DRAIN_LIMIT:
                raise RuntimeError(f"the switch stayed busy for {DRAIN_LIMIT} cycles")
        self._transmit()

    def _out(self, port: int, frames) -> None:
        for frame in frames:
            raw = self.ports[port]
            if raw is None:
                self.down_drops[port] += 1
                continue
            try:
                raw.send(frame)
            except OSError as e:        # ENETDOWN, ENXIO, ENODEV: the link failed under the send
                self._port_down(port, os.strerror(e.errno) if e.errno else str(e))
                self.down_drops[port] += 1
                continue
            self.frames_out[port] += 1

    def _in(self, port: int, frames) -> None:
        for frame in frames:
            self.link.send(port, frame)

    def _transmit(self) -> None:
        now = time.monotonic()
        for port, frame in self.link.take_received():
            if port < len(self.ports):
                faults = self.faults.get(port)
                self._out(port, faults.apply("egress", port, frame, now) if faults else [frame])

    def _release_held(self) -> None:
        now = time.monotonic()
        for port, faults in self.faults.items():
            self._in(port, faults.expired("ingress", now))
            self._out(port, faults.expired("egress", now))

    def _receive(self, p: int) -> None:
        faults = self.faults.get(p)
        now = time.monotonic()
        if self.ports[p] is None:
            return
        raw = self.ports[p]
        tagged = raw.tagged
        try:
            frames = raw.recv_all()
        except OSError as e:
            self._port_down(p, os.strerror(e.errno) if e.errno else str(e))
            return
        finally:
            self.tagged_drops[p] += raw.tagged - tagged   # the port may be opened anew: the total is kept here
        for frame in frames:
            if len(frame) < 14:
                continue
            self.frames_in[p] += 1
            self._in(p, faults.apply("ingress", p, frame, now) if faults else [frame])

    # ------------------------------------------------------------------ control
    def _register(self, req: dict):
        if "reg" in req:
            name = req["reg"]
            if not isinstance(name, str):
                raise ValueError(f"reg={str(name)[:40]!r}: must be a register name (a string)")
            reg = self.regs[name]
            index = need_int(req, "index", 0, reg.count - 1, default=0)
            return reg, reg.address(index)
        if "addr" in req:
            addr = need_int(req, "addr", 0, self._addr_end - 4)
            if addr % 4:
                raise ValueError(f"addr={addr:#x}: not a multiple of 4")
            return None, addr
        raise ValueError("a register request needs 'reg' (a name) or 'addr' (a byte address)")

    def _write_value(self, req: dict, reg) -> int:
        if "fields" not in req:
            return need_int(req, "value", 0, (1 << 32) - 1)
        if reg is None:
            raise ValueError("'fields' needs a register name ('reg')")
        fields = req["fields"]
        if not isinstance(fields, dict):
            raise ValueError("'fields' must be an object of field name -> integer")
        values = {str(k): need_int(fields, k, 0, (1 << 32) - 1) for k in fields}
        value = reg.pack(**values)
        if not 0 <= value < 1 << 32:
            raise ValueError(f"value {value:#x} does not fit 32 bits")
        return value

    def _fault(self, req: dict) -> dict:
        from .faults import FaultSpec
        port = need_int(req, "port", 0, len(self.ports) - 1)
        rates = {}
        for k in ("drop", "duplicate", "reorder"):
            if k in req:
                v = req[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                    raise ValueError(f"{k}={str(v)[:40]}: must be a probability in [0, 1]")
                rates[k] = float(v)
        if "seed" in req:
            rates["seed"] = need_int(req, "seed", 0, (1 << 63) - 1)
        spec = FaultSpec(ports=(port,), **rates)
        old = self.faults.get(port)
        if old is not None:                  # what the old faults held goes on now
            self._in(port, old.release_all("ingress"))
            self._out(port, old.release_all("egress"))
        self.faults[port] = PortFaults(spec)
        return {"ok": True}

    def handle(self, req: dict) -> dict:
        """One control request -> its answer. Every field is checked (plain integers in range); anything
        wrong is ``ok: false`` with one line, and nothing a request does stops the daemon."""
        op = req.get("op")
        try:
            if op == "read":
                _, addr = self._register(req)
                return {"ok": True, "value": run_sync(self.link.read(addr))}
            if op == "write":
                reg, addr = self._register(req)
                value = self._write_value(req, reg)
                run_sync(self.link.write(addr, value))
                return {"ok": True}
            if op == "info":
                return {"ok": True, "params": self.params.as_dict(), "clock_hz": self.link.clock_hz,
                        "backend": self.backend, "interfaces": self.interfaces, "cycle": self.link.cycle,
                        "registers": [r.name for r in self.regs]}
            if op == "stats":
                return {"ok": True, "frames_in": self.frames_in, "frames_out": self.frames_out,
                        "send_drops": [port.send_drops if port else 0 for port in self.ports],
                        "tagged_drops": self.tagged_drops,
                        "ports_up": [port is not None for port in self.ports],
                        "link_down": self.link_down, "link_up": self.link_up, "down_drops": self.down_drops,
                        "control_dropped": self.control_dropped,
                        "faults": {str(p): f.stats for p, f in self.faults.items()}}
            if op == "fault":
                return self._fault(req)
            if op == "counters":
                out = {}
                for reg in self.regs:
                    if reg.kind in (Kind.COUNTER, Kind.LEVEL):
                        vals = [run_sync(self.link.read(reg.address(i))) for i in range(reg.count)]
                        out[reg.name] = vals if reg.count > 1 else vals[0]
                return {"ok": True, "counters": out}
            raise ValueError(f"unknown op {str(op)[:40]!r} (read, write, info, stats, counters, fault)")
        except KeyError as e:
            return {"ok": False, "error": str(e.args[0])[:200] if e.args else "missing field"}
        except (ValueError, TypeError, OverflowError) as e:
            return {"ok": False, "error": str(e)[:200]}
        except RecursionError:
            return {"ok": False, "error": "request nested too deeply"}

    def _accept(self) -> None:
        got = accept_backoff(self.control, "cais-switch control")
        if got is None:                    # out of descriptors: no accepting for a moment, frames go on
            self.sel.unregister(self.control)
            self._accept_paused = time.monotonic() + 0.5
            return
        conn, _ = got
        uid = peer_uid(conn)
        if not trusted_uid(uid):
            self._log(f"control: refused a client of uid {uid} (only root and uid {os.geteuid()} may program "
                      f"the switch)")
            self._reject(conn, f"uid {uid} may not use this control endpoint (root or uid {os.geteuid()} only)")
            return
        if len(self._clients) >= self._max_clients:
            self._log(f"control: too many control clients ({self._max_clients}): refused one more")
            self._reject(conn, f"too many control clients ({self._max_clients})")
            return
        conn.setblocking(False)
        self._clients[conn.fileno()] = _Client(conn, time.monotonic())
        self.sel.register(conn, selectors.EVENT_READ, ("client", conn.fileno()))

    @staticmethod
    def _reject(conn: socket.socket, why: str) -> None:
        try:
            conn.setblocking(False)
            conn.send(json.dumps({"ok": False, "error": why}).encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1 << 16)        # what it sent already: closing over unread bytes would reset the answer
        except OSError:
            pass
        conn.close()

    def _drop_client(self, fd: int, why: str = "") -> None:
        client = self._clients.pop(fd, None)
        if client is None:
            return
        if why:
            self.control_dropped += 1
            self._log(f"control: dropped a client: {why}")
        try:
            self.sel.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()

    def _serve(self, fd: int, events: int = selectors.EVENT_READ) -> None:
        client = self._clients.get(fd)
        if client is None:
            return
        if events & selectors.EVENT_WRITE:
            self._flush(fd)
            return
        if client.out:                      # answers first: no new request from a client that does not read
            return
        try:
            data = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop_client(fd)
            return
        client.seen = time.monotonic()
        try:
            lines = client.lines.feed(data)
        except ValueError as e:
            client.out += json.dumps({"ok": False, "error": f"bad request: {e}"}).encode() + b"\n"
            self._flush(fd)
            self._drop_client(fd, str(e))
            return
        for line in lines:
            client.requests += 1
            try:
                reply = self.handle(decode(line))
            except ValueError as e:
                reply = {"ok": False, "error": f"bad request: {e}"}
            except Exception as e:          # a bug must cost one request, never the daemon  # noqa: BLE001
                self._log(f"control: a request failed: {type(e).__name__}: {e}")
                reply = {"ok": False, "error": f"internal error ({type(e).__name__})"}
            client.out += json.dumps(reply, separators=(",", ":")).encode() + b"\n"
            if len(client.out) > MAX_OUTPUT:
                self._drop_client(fd, f"it does not read its answers ({len(client.out)} bytes waiting)")
                return
        self._pump()        # a register write may have released frames (none today; cheap)
        self._flush(fd)

    def _flush(self, fd: int) -> None:
        """Send what the socket takes now; wait for it to be writable for the rest (never block)."""
        client = self._clients.get(fd)
        if client is None:
            return
        try:
            while client.out:
                sent = client.sock.send(client.out)
                del client.out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop_client(fd)
            return
        # answers pending: wait to write only (reading waits, and a readable socket must not spin the loop)
        want = selectors.EVENT_WRITE if client.out else selectors.EVENT_READ
        if want != client.events:
            client.events = want
            self.sel.modify(client.sock, want, ("client", fd))

    def _check_clients(self, now: float) -> None:
        """Close clients silent past their limit (a first request within AUTH_IDLE_S, answers read within
        CLIENT_STALL_S); resume accepting after an EMFILE pause. Every LINK_CHECK_S at most: the limits are
        seconds, and the loop wakes every half millisecond while frames are held."""
        if now < self._next_client_check:
            return
        self._next_client_check = now + LINK_CHECK_S
        for fd, client in list(self._clients.items()):
            if client.requests == 0 and now - client.seen > AUTH_IDLE_S:
                self._drop_client(fd, f"no request within {AUTH_IDLE_S:g} s")
            elif client.out and now - client.seen > CLIENT_STALL_S:
                self._drop_client(fd, f"its answers unread for {CLIENT_STALL_S:g} s")
        if self._accept_paused and now >= self._accept_paused:
            self._accept_paused = 0.0
            self.sel.register(self.control, selectors.EVENT_READ, ("listen", None))

    # ------------------------------------------------------------------ loop
    def stop(self, *_):
        self._stop = True

    def run(self) -> None:
        while not self._stop:
            for key, events in self.sel.select(timeout=0.0005 if self._holding() else 0.2):
                kind, arg = key.data
                if kind == "port":
                    self._receive(arg)
                elif kind == "listen":
                    self._accept()
                else:
                    self._serve(arg, events)
            # every interface once more (frames that came while the others were served), then drain
            for p in range(len(self.ports)):
                self._receive(p)
            self._release_held()
            self._pump()
            self._check_links(time.monotonic())
            self._check_clients(time.monotonic())

    def close(self) -> None:
        for port in getattr(self, "ports", []):
            if port is not None:
                port.close(pcap=False)
        for pcap in getattr(self, "pcaps", []):
            if pcap is not None:
                pcap.close()
        for client in getattr(self, "_clients", {}).values():
            client.sock.close()
        if getattr(self, "control", None) is not None:
            self.control.close()
            if self.control_address.family == socket.AF_UNIX:
                try:
                    os.unlink(self.control_address.target)   # ours: we hold its lock
                except OSError:
                    pass
            self.control = None
        close = getattr(getattr(self, "link", None), "close", None)
        if close:
            close()
        self.locks.release()


def build_parser():
    p = cmdline.Parser(prog="cais-switch", description="Run a CAIS switch backend on real network interfaces "
                   "(AF_PACKET; needs root). Port p is the p-th interface.")
    p.add_argument("interfaces", nargs="+", metavar="IFACE", help="one interface per switch port (veth, TAP)")
    p.add_argument("--backend", choices=BACKENDS, default="model", help="default: model (numpy only)")
    p.add_argument("--control", metavar="ADDR", default=None,
                   help="control endpoint: a Unix socket path or 127.0.0.1:PORT (JSON lines)")
    p.add_argument("--fault", action="append", default=[], metavar="PORT:drop=R,...",
                   help="faults on a port's wires: drop=R, duplicate=R, reorder=R, seed=N (repeatable)")
    p.add_argument("--pcap", metavar="DIR", default=None, help="write DIR/port<p>.pcap per port")
    p.add_argument("--pcap-max-mb", type=cmdline.number(0, 1e6, include_low=False), default=PCAP_MAX_MB,
                   metavar="N", help=f"cap each port's capture at N MB (10**6 bytes) over its files, keeping the "
                                     f"newest frames (default {PCAP_MAX_MB})")
    p.add_argument("--pcap-files", type=cmdline.integer(1), default=PCAP_FILES, metavar="K",
                   help=f"rotate each port's capture over K files: port<p>.pcap (newest), port<p>.pcap.1, ... "
                        f"(default {PCAP_FILES})")
    p.add_argument("--ready-file", metavar="PATH", default=None,
                   help="create PATH once every interface is open and the control endpoint listens")
    cmdline.add_param_arguments(p)
    cmdline.add_version(p)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "--ports" not in (argv if argv is not None else sys.argv[1:]):
        args.ports = max(2, len(args.interfaces))   # as many ports as interfaces unless told
    params = cmdline.params_from_args(parser, args)
    if len(args.interfaces) > params.ports:
        parser.error(f"{len(args.interfaces)} interfaces, but --ports {params.ports}")
    if len(set(args.interfaces)) != len(args.interfaces):
        parser.error("an interface is named twice")
    for name in args.interfaces:
        why = interface_error(name)
        if why:
            parser.error(why)
    faults = {}
    for text in args.fault:
        try:
            port, spec = parse_fault(text)
        except ValueError as e:
            parser.error(f"--fault {e}")
        if not 0 <= port < len(args.interfaces):
            parser.error(f"--fault {text!r}: port {port} is not one of 0..{len(args.interfaces) - 1}")
        if port in faults:
            parser.error(f"--fault: port {port} given twice")
        faults[port] = spec
    given = argv if argv is not None else sys.argv[1:]
    if args.pcap is None and any(a.split("=")[0] in ("--pcap-max-mb", "--pcap-files") for a in given):
        parser.error("--pcap-max-mb and --pcap-files need --pcap DIR")
    pcap_max_bytes = int(args.pcap_max_mb * 1e6)
    if args.pcap is not None and pcap_max_bytes // args.pcap_files < PcapWriter.MIN_FILE:
        parser.error(f"--pcap-max-mb {args.pcap_max_mb:g} over --pcap-files {args.pcap_files}: each file needs at "
                     f"least {PcapWriter.MIN_FILE} bytes (one frame of {PcapWriter.SNAPLEN} bytes)")
    if args.control:
        try:
            parse_address(args.control)
        except ValueError as e:
            parser.error(f"--control {e}")
    try:
        daemon = SwitchDaemon(args.interfaces, params, backend=args.backend, control=args.control,
                              faults=faults, pcap_dir=args.pcap, pcap_max_bytes=pcap_max_bytes,
                              pcap_files=args.pcap_files)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"cais-switch: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1     # Busy is a ValueError: exit status 2
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    print(f"cais-switch: {args.backend} backend, {params.ports} ports on {', '.join(args.interfaces)}"
          + (f", control {args.control}" if args.control else ""), file=sys.stderr, flush=True)
    if args.ready_file:
        Path(args.ready_file).write_text(f"{os.getpid()}\n")
    try:
        daemon.run()
    except RuntimeError as e:
        print(f"cais-switch: error: {e}", file=sys.stderr)
        return 1
    finally:
        daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
