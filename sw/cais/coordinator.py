"""The deployment's control plane: one :class:`cais.controller.Controller` that every rank process asks.

In the co-simulation (:class:`cais.comm.World`) the controller lives in the same process as the ranks.
Deployed, each rank is its own process, so the controller runs in a coordinator that the ranks reach over
a local endpoint (:mod:`cais.endpoint`: a Unix socket path, which also reaches across network namespaces,
or 127.0.0.1:PORT). Rank 0's process starts it (``cais.init`` on rank 0, as torch's rank 0 hosts its
store); ``python -m cais.coordinator`` runs it alone. The coordinator is the only client of the switch's
control endpoint (``cais-switch --control``, the AXI4-Lite port): it programs the MAC table, the groups'
rules and slot quotas, and retypes rules, through :class:`ControlLink`.

Requests (JSON lines; every answer carries ``dead``, the ranks whose connection ended without ``bye``)::

    hello    {rank, world_size}               -> params, clock_hz, float_units, world group, config
    group    {rank, ranks, call}              -> the group, once every member asked (else an error after
                                                 the rendezvous timeout)
    decide   {group, op_seq, nbytes, kind}    -> decision or null (ask again)
    finished {rank, group, op_seq, rtt}       rtt: the first chunk's round trip, s (switch path), or null
    fallback {rank, group, op_seq, why}
    status   {group, op_seq}                  -> fell_back, all_finished
    bye      {rank}
    rejoin   {rank, world_size, groups}        after a controller restart (docs/controller.md): the groups
                                                 this rank is in, each with next_op and next_seq

With a token (:class:`cais.service.ControllerService`, ``CAIS_TOKEN``), every request must carry it as
``"token"``; one without it or with another is refused (``ok`` false) and counted in ``refused``.
"""

from __future__ import annotations

import hmac
import logging
import socket
import sys
import threading
import time

from . import cli
from . import protocol as proto
from .allreduce import CollectiveKind
from .comm import host_mac
from .config import Config
from .controller import Controller, GroupInfo
from .endpoint import EndpointError, JsonLines, connect, listen, parse_address
from .link import run_sync
from .params import SwitchParams

__all__ = ["ControlLink", "Coordinator", "group_to_dict", "group_from_dict", "kind_to_dict", "kind_from_dict"]

log = logging.getLogger("cais.coordinator")

RENDEZVOUS_S = 60.0      # new_group waits this long for every member


class ControlLink:
    """The register half of :class:`cais.link.SwitchLink` over a switch's control endpoint.

    Its coroutines never suspend (blocking socket calls), so :func:`cais.link.run_sync` runs them. ``cycle``
    is wall time in switch clock cycles: the controller's timers are real time here.

    Members
    -------
    params : SwitchParams
        As the switch reports them (``info``).
    clock_hz : float
    """

    def __init__(self, address: str, *, timeout: float = 10.0, retry_for: float = 0.0):
        self._conn = connect(address, timeout=timeout, retry_for=retry_for, name="switch control endpoint")
        info = self._conn.request("info")
        self.params = SwitchParams(**info["params"])
        self.clock_hz = float(info["clock_hz"])
        self.backend = info.get("backend", "?")
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    @property
    def cycle(self) -> int:
        return int((time.monotonic() - self._t0) * self.clock_hz)

    async def read(self, addr: int) -> int:
        with self._lock:
            return int(self._conn.request("read", addr=int(addr))["value"])

    async def write(self, addr: int, value: int) -> None:
        with self._lock:
            self._conn.request("write", addr=int(addr), value=int(value))

    def close(self) -> None:
        self._conn.close()


def kind_to_dict(kind: CollectiveKind) -> dict:
    return {"dtype": int(kind.dtype), "op": int(kind.op), "acc_fp32": kind.acc_fp32, "saturate": kind.saturate,
            "reproducible": kind.reproducible}


def kind_from_dict(d: dict) -> CollectiveKind:
    return CollectiveKind.make(proto.DType(d["dtype"]), proto.ReduceOp(d["op"]), acc_fp32=d["acc_fp32"],
                               saturate=d["saturate"], reproducible=d["reproducible"])


def group_to_dict(info: GroupInfo) -> dict:
    return {"group_id": info.group_id, "ranks": list(info.ranks), "ports": list(info.ports), "base": info.base,
            "count_log2": info.count_log2, "rule_index": info.rule_index, "why_not": info.why_not}


def group_from_dict(d: dict) -> GroupInfo:
    return GroupInfo(d["group_id"], tuple(d["ranks"]), tuple(d["ports"]), d["base"], d["count_log2"],
                     d["rule_index"], d["why_not"])


class Coordinator:
    """The controller behind a threaded JSON-lines server (module docstring).

    Members
    -------
    controller : Controller
        Driving the switch through a :class:`ControlLink`.
    world : GroupInfo
        The group of every rank (created at start).
    dead : set[int]
        Ranks whose connection ended without ``bye``.
    """

    def __init__(self, switch: str, world_size: int, config: Config, *, rank_ports: list[int] | None = None,
                 switch_retry_s: float = 0.0, token: str | None = None, recover: bool = False):
        self.link = ControlLink(switch, retry_for=switch_retry_s)
        ports = list(rank_ports) if rank_ports is not None else list(range(world_size))
        if len(ports) != world_size:
            raise ValueError(f"rank_ports: {len(ports)} ports for {world_size} ranks")
        if world_size > self.link.params.ports or max(ports) >= self.link.params.ports:
            raise ValueError(f"{world_size} ranks on ports {ports}: the switch has {self.link.params.ports} ports")
        self.world_size, self.config = world_size, config
        # Deployed, a dead rank is known from its connection ending (every peer's collective then fails:
        # docs/driver.md); cais.dist does not redo a collective without it, so the controller drops nobody.
        self.controller = Controller(self.link, config, ports, [host_mac(r) for r in range(world_size)],
                                     drop_dead=False)
        self._lock = threading.Condition()
        self._t0 = time.monotonic()
        self.token = token
        self.refused: dict[str, int] = {"token": 0, "invalid": 0}   # requests refused, by reason
        run_sync(self.controller.start())
        # after a restart the world group, like every group, comes back with the ranks' rejoin
        self.world = None if recover else run_sync(self.controller.create_group(list(range(world_size))))
        self.dead: set[int] = set()
        self._joined: set[int] = set()
        self._groups: dict[tuple, dict] = {}         # (ranks, call) -> {"arrived": set, "info": dict | None}
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._closing = False

    def now(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------------ requests
    def handle(self, req: dict, conn_state: dict) -> dict:
        op = req.get("op")
        with self._lock:
            if op == "rejoin":
                return self._rejoin(req, conn_state)
            if self.world is None:
                raise ValueError("the controller restarted and waits for the ranks to rejoin")
            if op == "hello":
                rank, size = int(req["rank"]), int(req["world_size"])
                if size != self.world_size:
                    raise ValueError(f"rank {rank} says world_size={size}; the coordinator has {self.world_size}")
                if not 0 <= rank < size:
                    raise ValueError(f"rank {rank}: not in 0..{size - 1}")
                if rank in self._joined:
                    raise ValueError(f"rank {rank} joined twice")
                self._joined.add(rank)
                conn_state["rank"] = rank
                return {"params": self.link.params.as_dict(), "clock_hz": self.link.clock_hz,
                        "float_units": self.controller.float_units, "world": group_to_dict(self.world),
                        "backend": self.link.backend}
            if op == "group":
                return self._group(int(req["rank"]), tuple(int(r) for r in req["ranks"]), int(req["call"]))
            if op == "decide":
                run_sync(self.controller.service(self.now()))
                d = self.controller.decide(int(req["group"]), int(req["op_seq"]), int(req["nbytes"]), self.now(),
                                           kind_from_dict(req["kind"]))
                if d is None:
                    return {"decision": None}
                return {"decision": {"offload": d.offload, "reason": d.reason, "seq_base": d.seq_base,
                                     "chunk_bytes": d.chunk_bytes}}
            if op == "finished":
                self.controller.tick(self.now())
                if req.get("rtt") is not None:          # the first chunk's round trip (switch path)
                    self.controller.report_rtts([float(req["rtt"])])
                self.controller.finished(int(req["rank"]), int(req["group"]), int(req["op_seq"]))
                run_sync(self.controller.service(self.now()))
                return {}
            if op == "fallback":
                self.controller.request_fallback(int(req["group"]), int(req["op_seq"]), int(req["rank"]),
                                                 self.now(), str(req.get("why", "")))
                return {}
            if op == "status":
                g, s = int(req["group"]), int(req["op_seq"])
                return {"fell_back": self.controller.fell_back(g, s), "all_finished": self.controller.all_finished(g, s)}
            if op == "bye":
                conn_state["bye"] = True
                return {}
            if op == "ping":
                return {}
        raise ValueError(f"unknown op {op!r}")

    def _rejoin(self, req: dict, conn_state: dict) -> dict:
        rank, size = int(req["rank"]), int(req["world_size"])
        if size != self.world_size or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size}: this controller serves {self.world_size} ranks")
        groups = req["groups"]
        if not isinstance(groups, list):
            raise ValueError("rejoin: groups must be a list")
        for g in groups:
            if rank not in g["ranks"]:
                raise ValueError(f"rejoin: rank {rank} is not in group {g['group_id']}")
        for g in groups:
            info = run_sync(self.controller.adopt_group(int(g["group_id"]), [int(r) for r in g["ranks"]],
                                                        g["base"], int(g["count_log2"]), g["rule_index"],
                                                        int(g["next_seq"]), int(g["next_op"])))
            if len(info.ranks) == self.world_size and self.world is None:
                self.world = info
        self._joined.add(rank)
        conn_state["rank"] = rank
        self.dead.discard(rank)
        return {"groups": sorted(int(g["group_id"]) for g in groups)}

    def authorised(self, req) -> bool:
        """The request carries the token (always, when none is configured)."""
        if self.token is None:
            return True
        given = req.get("token") if isinstance(req, dict) else None
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.token.encode())

    def _group(self, rank: int, ranks: tuple, call: int) -> dict:
        if rank not in ranks:
            raise ValueError(f"rank {rank} asked for group {list(ranks)} it is not part of")
        key = (ranks, call)
        entry = self._groups.setdefault(key, {"arrived": set(), "info": None, "error": None})
        entry["arrived"].add(rank)
        if entry["info"] is None and entry["error"] is None and entry["arrived"] >= set(ranks):
            try:
                entry["info"] = group_to_dict(run_sync(self.controller.create_group(list(ranks))))
            except (ValueError, RuntimeError) as e:
                entry["error"] = str(e)
            self._lock.notify_all()
        deadline = time.monotonic() + RENDEZVOUS_S
        while entry["info"] is None and entry["error"] is None:
            lost = (set(ranks) - entry["arrived"]) & self.dead
            if lost:
                raise ValueError(f"new_group({list(ranks)}): rank(s) {sorted(lost)} left before joining")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError(f"new_group({list(ranks)}): rank(s) {sorted(set(ranks) - entry['arrived'])} "
                                 f"did not call it within {RENDEZVOUS_S:g} s")
            self._lock.wait(min(left, 0.2))
        if entry["error"] is not None:
            raise ValueError(entry["error"])
        return {"group": entry["info"]}

    # ------------------------------------------------------------------ server
    def _answer(self, req: dict, state: dict) -> dict:
        try:
            return {"ok": True, **self.handle(req, state)}
        except (KeyError, ValueError, TypeError, RuntimeError, EndpointError) as e:
            with self._lock:
                self.refused["invalid"] += 1
            return {"ok": False, "error": str(e.args[0]) if isinstance(e, KeyError) else str(e)}

    def _serve_connection(self, sock: socket.socket) -> None:
        conn = JsonLines(sock, None, name="rank connection")
        state: dict = {}
        try:
            while True:
                try:
                    req = conn.recv()
                except (EndpointError, ValueError):
                    break
                if not isinstance(req, dict):
                    with self._lock:
                        self.refused["invalid"] += 1
                    reply = {"ok": False, "error": "a request is a JSON object"}
                elif not self.authorised(req):
                    with self._lock:
                        self.refused["token"] += 1
                    log.warning("refused a request without the controller's token (op %r)", req.get("op"))
                    reply = {"ok": False, "error": "unauthorised: missing or wrong token"}
                else:
                    reply = self._answer(req, state)
                with self._lock:
                    reply["dead"] = sorted(self.dead)
                try:
                    conn.send(reply)
                except OSError:
                    break
        finally:
            conn.close()
            rank = state.get("rank")
            if rank is not None and not state.get("bye") and not self._closing:
                with self._lock:
                    self.dead.add(rank)
                    self._lock.notify_all()
                log.warning("rank %d disconnected without saying bye", rank)

    def serve(self, address: str) -> None:
        """Listen on `address` and answer in background threads (returns at once)."""
        self._address = parse_address(address)
        self._server = listen(self._address, loopback_only=False)   # ranks may run on other hosts
        t = threading.Thread(target=self._accept_loop, name="cais-coordinator", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve_connection, args=(sock,), daemon=True)
            t.start()

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            try:
                self._server.close()
            except OSError:
                pass
            if self._address.family == socket.AF_UNIX:
                import os
                try:
                    os.unlink(self._address.target)
                except OSError:
                    pass
        self.link.close()


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m cais.coordinator", description="The ranks' controller, alone (rank 0's "
                   "cais.init starts one itself unless CAIS_COORDINATOR=external).")
    p.add_argument("--switch", required=True, metavar="ADDR", help="the switch's control endpoint")
    p.add_argument("--listen", required=True, metavar="ADDR", help="where ranks reach this coordinator")
    p.add_argument("--world-size", required=True, type=cli.integer(1))
    p.add_argument("--config", default=None, metavar="TOML")
    args = p.parse_args(argv)
    try:
        coord = Coordinator(args.switch, args.world_size, Config.load(args.config))
        coord.serve(args.listen)
    except (EndpointError, ValueError, OSError, RuntimeError) as e:
        print(f"cais-coordinator: error: {e}", file=sys.stderr)
        return 2
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        coord.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
