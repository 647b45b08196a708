"""The deployment's control plane: one :class:`cais.controller.Controller` that every rank process asks.

In the co-simulation (:class:`cais.comm.World`) the controller lives in the same process as the ranks.
Deployed, each rank is its own process, so the controller runs in a coordinator that the ranks reach over
a local endpoint (:mod:`cais.endpoint`: a Unix socket path, which also reaches across network namespaces,
or 127.0.0.1:PORT). Rank 0's process starts it (``cais.init`` on rank 0, as torch's rank 0 hosts its
store); ``python -m cais.coordinator`` runs it alone. The coordinator is the only client of the switch's
control endpoint (``cais-switch --control``, the AXI4-Lite port): it programs the MAC table, the groups'
rules and slot quotas, and retypes rules, through :class:`ControlLink`.

Many jobs share one coordinator (docs/controller.md, "Jobs"). A job is a named group of ranks
(``job``, default ``"default"``) on some of the controller's hosts (``hosts``: the host, i.e. switch
port by default, of each of its ranks 0..world_size-1; default 0..world_size-1). Ranks, in every request
and answer, are the job's own; the coordinator maps them to hosts. A job starts with its first ``hello``
(its world group is created then; the default job's at start), runs, and ends when every rank that said
hello has closed its connection: then its groups go (their rules, slots and quotas are freed) and its
ranks may say hello again. It *failed* when a rank's connection ended without ``bye``. Jobs whose hosts
overlap cannot run at once.

A rank whose connection ends without ``bye`` (its process died) is dropped from every group of its job
at once (:meth:`cais.controller.Controller.drop_ranks`): the groups go on with the ranks left. A
collective it had not finished is redone by the ranks left on the host ring, each from its own input
(``epoch`` in the answers moves on); one it had finished stands (its contribution was in every chunk).
docs/reliability.md section 8, "The process world". Every request may carry ``job``; it defaults to the job of the connection's
``hello``, else ``"default"``.

Requests (JSON lines; every answer carries ``dead``, the job's ranks whose connection ended without ``bye``)::

    hello    {rank, world_size[, job, hosts]}  -> params, clock_hz, float_units, world group, hosts
    group    {rank, ranks, call}              -> the group, once every member asked (else an error after
                                                 the rendezvous timeout)
    decide   {group, op_seq, nbytes, kind}    -> decision or null (ask again), epoch, ranks, ports
    finished {rank, group, op_seq, rtt[, epoch]}  rtt: the first chunk's round trip, s (switch path), or null;
                                                 a finish of another epoch than the collective's (a run
                                                 abandoned since) is ignored
    fallback {rank, group, op_seq, why}
    status   {group, op_seq}                  -> fell_back, all_finished, epoch, ranks, ports
    bye      {rank}
    rejoin   {rank, world_size, groups[, job, hosts]}  after a controller restart (docs/controller.md): the groups
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
from dataclasses import dataclass, field

from . import cmdline
from . import protocol as proto
from .allreduce import CollectiveKind
from .comm import host_mac
from .config import Config
from .controller import Controller, GroupInfo
from .controller.switch import ControlLink
from .endpoint import EndpointError, JsonLines, connect, listen, parse_address
from .link import run_sync

__all__ = ["ControlLink", "Coordinator", "Job", "DEFAULT_JOB", "group_to_dict", "group_from_dict", "kind_to_dict",
           "kind_from_dict"]

log = logging.getLogger("cais.coordinator")

RENDEZVOUS_S = 60.0      # new_group waits this long for every member
DEFAULT_JOB = "default"  # the job of a rank that names none
JOB_HISTORY = 64         # ended jobs kept for show-jobs


@dataclass
class Job:
    """One job on the coordinator: its ranks' hosts, who joined, its groups (module docstring).

    Members
    -------
    hosts : tuple[int, ...]
        ``hosts[r]``: the controller's host (switch port by default) of the job's rank r.
    joined, live, left, dead : set[int]
        Ranks that said hello; whose hello connection is open; that said bye; whose connection ended
        without bye.
    groups : list[int]
        The controller's group ids of the job (its world group first).
    """
    name: str
    hosts: tuple
    started: float
    world: GroupInfo | None = None
    joined: set = field(default_factory=set)
    live: set = field(default_factory=set)
    left: set = field(default_factory=set)
    dead: set = field(default_factory=set)
    groups: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)     # (ranks, call) -> rendezvous entry of new_group

    def host(self, rank: int) -> int:
        if not 0 <= rank < len(self.hosts):
            raise ValueError(f"job {self.name!r}: rank {rank} not in 0..{len(self.hosts) - 1}")
        return self.hosts[rank]

    def local(self, info: GroupInfo) -> dict:
        """`info` as the job's ranks see it (their own rank numbers)."""
        return dict(group_to_dict(info), ranks=[self.hosts.index(h) for h in info.ranks])

    @property
    def state(self) -> str:
        return "failing" if self.dead else "running" if self.live else "idle"


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
    jobs : dict[str, Job]
        The jobs running (module docstring), by name; the default job's created at start.
    ended : list[dict]
        The latest jobs that ended (``ended``, ``failed`` or ``replaced``), oldest first.
    recovering : bool
        Started with ``recover`` and no job's world group rejoined yet: only ``rejoin`` is answered.
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
        # Deployed, a dead rank is known for certain from its connection ending (_drop_dead), not guessed
        # from aged sets: a Python rank stalled longer than the set age on a busy host is not dead.
        self.controller = Controller(self.link, config, ports, [host_mac(r) for r in range(world_size)],
                                     drop_dead=False)
        self._running: dict[int, tuple[int, set]] = {}   # group -> (latest collective, hosts that finished it)
        self._lock = threading.Condition()
        self._t0 = time.monotonic()
        self.token = token
        self.refused: dict[str, int] = {"token": 0, "invalid": 0}   # requests refused, by reason
        run_sync(self.controller.start())
        self.jobs: dict[str, Job] = {}
        self.ended: list[dict] = []                  # the latest JOB_HISTORY jobs that ended, oldest first
        # after a restart the world group, like every group, comes back with the ranks' rejoin
        self.recovering = recover
        if not recover:
            self._new_job(DEFAULT_JOB, tuple(range(world_size)))
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._closing = False

    def now(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------------ requests
    # ------------------------------------------------------------------ jobs
    def _job_name(self, req: dict, conn_state: dict) -> str:
        name = req.get("job", conn_state.get("job", DEFAULT_JOB))
        if not isinstance(name, str) or not name or len(name) > 64 or not name.isprintable():
            raise ValueError(f"job {name!r}: a job name is 1 to 64 printable characters")
        return name

    def _hosts(self, req: dict, name: str, size: int) -> tuple:
        hosts = req.get("hosts")
        if hosts is None:
            hosts = list(range(size))
        if not isinstance(hosts, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hosts):
            raise ValueError(f"job {name!r}: hosts must be a list of integers")
        if len(hosts) != size or len(set(hosts)) != size:
            raise ValueError(f"job {name!r}: {size} ranks need {size} distinct hosts, got {hosts}")
        bad = [h for h in hosts if not 0 <= h < self.world_size]
        if bad:
            raise ValueError(f"job {name!r}: host(s) {bad} not in 0..{self.world_size - 1} (this controller's "
                             f"--world-size is {self.world_size})")
        return tuple(hosts)

    def _job(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise ValueError(f"job {name!r}: no such job (say hello first)")
        return job

    def _new_job(self, name: str, hosts: tuple, *, world: bool = True) -> Job:
        for other in list(self.jobs.values()):
            if set(other.hosts) & set(hosts):
                if other.joined:
                    raise ValueError(f"job {name!r}: host(s) {sorted(set(other.hosts) & set(hosts))} are in use "
                                     f"by job {other.name!r}")
                self._end_job(other, "replaced")      # idle (nobody joined it): it gives way
        job = Job(name, hosts, self.now())
        self.jobs[name] = job
        if world:
            job.world = run_sync(self.controller.create_group(list(hosts)))
            job.groups.append(job.world.group_id)
        log.info("job %s started on hosts %s", name, list(hosts))
        return job

    def _end_job(self, job: Job, state: str) -> None:
        """The job is over: its groups (rules, slots, quotas) are freed, its ranks may join again (the
        controller forgets the groups even when the switch cannot be reached to invalidate their rules)."""
        self.jobs.pop(job.name, None)
        self.ended.append({"job": job.name, "hosts": list(job.hosts), "state": state, "groups": list(job.groups),
                           "dead": sorted(job.dead), "started": job.started, "ended": self.now()})
        del self.ended[:-JOB_HISTORY]
        self._lock.notify_all()
        for gid in job.groups:
            self._running.pop(gid, None)          # a group id may be given to another job's group later
            if gid in self.controller.groups:
                try:
                    run_sync(self.controller.remove_group(gid))   # forgets the group first, then writes
                except (EndpointError, OSError) as e:
                    log.error("job %s: freeing group %d on the switch: %s", job.name, gid, e)
        (log.warning if state == "failed" else log.info)("job %s %s; its groups %s freed", job.name, state, job.groups)

    def jobs_view(self) -> dict:
        """The running jobs and the latest ended ones (cais-cli show-jobs, /v1/jobs)."""
        running = []
        for job in self.jobs.values():
            groups = [self.controller.groups[g] for g in job.groups if g in self.controller.groups]
            running.append({"job": job.name, "hosts": list(job.hosts), "state": job.state,
                            "joined": sorted(job.joined), "left": sorted(job.left), "dead": sorted(job.dead),
                            "started": job.started,
                            "groups": [{"group_id": g.group_id, "ranks": [job.hosts.index(h) for h in g.ranks],
                                        "path": "switch" if g.offloadable else "host ring",
                                        "why_not": g.why_not,
                                        "host_reason": g.host_reason.value if g.host_reason else None}
                                       for g in groups]})
        return {"jobs": running, "ended": list(self.ended)}

    def _hello(self, req: dict, conn_state: dict) -> dict:
        rank, size = int(req["rank"]), int(req["world_size"])
        name = self._job_name(req, conn_state)
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank}: not in 0..{size - 1}")
        if size > self.world_size:
            raise ValueError(f"rank {rank} says world_size={size}; the coordinator has {self.world_size} hosts")
        hosts = self._hosts(req, name, size)
        job = self.jobs.get(name)
        if job is not None and job.hosts != hosts:
            if job.joined:
                raise ValueError(f"job {name!r} runs on hosts {list(job.hosts)}; rank {rank} says {list(hosts)}")
            self._end_job(job, "replaced")
            job = None
        if job is None:
            job = self._new_job(name, hosts)
        if rank in job.joined:
            raise ValueError(f"job {name!r}: rank {rank} joined twice (its first connection is still open)")
        job.joined.add(rank)
        job.live.add(rank)
        conn_state["rank"], conn_state["job"] = rank, name
        return {"params": self.link.params.as_dict(), "clock_hz": self.link.clock_hz,
                "float_units": self.controller.float_units, "world": job.local(job.world),
                "backend": self.link.backend, "job": name, "hosts": list(job.hosts)}

    def _left(self, conn_state: dict) -> None:
        """A rank's hello connection ended (with bye or without): the job ends once all are gone."""
        job = self.jobs.get(conn_state.get("job"))
        rank = conn_state.get("rank")
        if job is None or rank not in job.live:
            return
        job.live.discard(rank)
        (job.left if conn_state.get("bye") else job.dead).add(rank)
        self._lock.notify_all()
        if not conn_state.get("bye"):
            log.warning("job %s: rank %d disconnected without saying bye", job.name, rank)
            if job.live:
                self._drop_dead(job, rank)
        if not job.live:
            self._end_job(job, "failed" if job.dead else "ended")

    def _drop_dead(self, job: Job, rank: int) -> None:
        """Rank `rank` of `job` died: drop it from the job's groups. The latest collective of a group is
        redone by the ranks left unless the dead rank had finished it on the path that delivers (then
        every chunk had its contribution and the collective stands)."""
        host = job.hosts[rank]
        why = f"rank {rank}'s process ended (its connection closed without bye)"
        for gid in job.groups:
            info = self.controller.groups.get(gid)
            if info is None or host not in info.ranks:
                continue
            op_seq, done = self._running.get(gid, (None, set()))
            redo = op_seq is not None and (host not in done or self.controller.fell_back(gid, op_seq))
            self.controller.drop_ranks(gid, [host], self.now(), why, redo=redo)
        self._lock.notify_all()

    def _note(self, gid: int, op_seq: int, host: int | None = None) -> None:
        """Keep the group's latest collective and who finished it (for :meth:`_drop_dead`)."""
        latest = self._running.get(gid)
        if latest is None or latest[0] < op_seq:
            latest = self._running[gid] = (op_seq, set())
        if host is not None and latest[0] == op_seq:
            latest[1].add(host)

    def _membership(self, job: Job, gid: int, op_seq: int) -> dict:
        """The group's ranks and ports now (the job's rank numbers) and the collective's epoch."""
        local = job.local(self.controller.groups[gid])
        return {"epoch": self.controller.op_epoch(gid, op_seq), "ranks": local["ranks"], "ports": local["ports"]}

    def wait_alone(self, name: str, rank: int, timeout: float) -> bool:
        """Wait until no rank of job `name` but `rank` is connected (the others said bye or died), at most
        `timeout` s; whether they had. Rank 0's process hosts the coordinator: it must not go first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                job = self.jobs.get(name)
                if job is None or job.live <= {rank}:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 1.0))

    # ------------------------------------------------------------------ requests
    def handle(self, req: dict, conn_state: dict) -> dict:
        op = req.get("op")
        with self._lock:
            if op == "rejoin":
                return self._rejoin(req, conn_state)
            if self.recovering and op not in ("ping", "bye"):
                raise ValueError("the controller restarted and waits for the ranks to rejoin")
            if op == "hello":
                return self._hello(req, conn_state)
            if op == "group":
                job = self._job(self._job_name(req, conn_state))
                return self._group(job, int(req["rank"]), tuple(int(r) for r in req["ranks"]), int(req["call"]))
            if op in ("decide", "finished", "fallback", "status") and "group" in req:
                job = self._job(self._job_name(req, conn_state))
                if int(req["group"]) not in self.controller.groups:
                    raise ValueError(f"group {int(req['group'])}: no such group")
                if int(req["group"]) not in job.groups:
                    raise ValueError(f"group {int(req['group'])}: not a group of job {job.name!r}")
            if op == "decide":
                run_sync(self.controller.service(self.now()))
                d = self.controller.decide(int(req["group"]), int(req["op_seq"]), int(req["nbytes"]), self.now(),
                                           kind_from_dict(req["kind"]))
                if d is None:
                    return {"decision": None}
                g, s = int(req["group"]), int(req["op_seq"])
                self._note(g, s)
                return {"decision": d.as_dict(), **self._membership(job, g, s)}
            if op == "finished":
                g, s, host = int(req["group"]), int(req["op_seq"]), job.host(int(req["rank"]))
                if int(req.get("epoch", self.controller.op_epoch(g, s))) != self.controller.op_epoch(g, s):
                    return {}                            # a run abandoned since (ranks dropped): it does not count
                self.controller.tick(self.now())
                if req.get("rtt") is not None:          # the first chunk's round trip (switch path)
                    self.controller.report_rtts([float(req["rtt"])])
                self.controller.finished(host, g, s)
                self._note(g, s, host)
                run_sync(self.controller.service(self.now()))
                return {}
            if op == "fallback":
                self.controller.request_fallback(int(req["group"]), int(req["op_seq"]), job.host(int(req["rank"])),
                                                 self.now(), str(req.get("why", "")))
                return {}
            if op == "status":
                g, s = int(req["group"]), int(req["op_seq"])
                return {"fell_back": self.controller.fell_back(g, s), "all_finished": self.controller.all_finished(g, s),
                        **self._membership(job, g, s)}
            if op == "bye":
                conn_state["bye"] = True
                return {}
            if op == "ping":
                return {}
        raise ValueError(f"unknown op {op!r}")

    def _rejoin(self, req: dict, conn_state: dict) -> dict:
        rank, size = int(req["rank"]), int(req["world_size"])
        name = self._job_name(req, conn_state)
        if size > self.world_size or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size}: this controller serves {self.world_size} hosts")
        hosts = self._hosts(req, name, size)
        groups = req["groups"]
        if not isinstance(groups, list):
            raise ValueError("rejoin: groups must be a list")
        for g in groups:
            if rank not in g["ranks"] or not all(0 <= int(r) < size for r in g["ranks"]):
                raise ValueError(f"rejoin: rank {rank} is not in group {g['group_id']} of ranks 0..{size - 1}")
        job = self.jobs.get(name)
        if job is not None and job.hosts != hosts:
            raise ValueError(f"job {name!r} runs on hosts {list(job.hosts)}; rank {rank} says {list(hosts)}")
        if job is None:
            job = self._new_job(name, hosts, world=False)
        for g in groups:
            info = run_sync(self.controller.adopt_group(int(g["group_id"]), [hosts[int(r)] for r in g["ranks"]],
                                                        g["base"], int(g["count_log2"]), g["rule_index"],
                                                        int(g["next_seq"]), int(g["next_op"])))
            if info.group_id not in job.groups:
                job.groups.append(info.group_id)
            # the job's world group (it may have lost ranks that died before the restart)
            if (g.get("world") or len(info.ranks) == size) and job.world is None:
                job.world = info
                self.recovering = False
        job.joined.add(rank)
        job.live.add(rank)
        job.dead.discard(rank)
        conn_state["rank"], conn_state["job"] = rank, name
        return {"groups": sorted(int(g["group_id"]) for g in groups)}

    def authorised(self, req) -> bool:
        """The request carries the token (always, when none is configured)."""
        if self.token is None:
            return True
        given = req.get("token") if isinstance(req, dict) else None
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.token.encode())

    def _group(self, job: Job, rank: int, ranks: tuple, call: int) -> dict:
        if rank not in ranks:
            raise ValueError(f"rank {rank} asked for group {list(ranks)} it is not part of")
        for r in ranks:
            job.host(r)                       # a rank the job does not have: refused
        key = (ranks, call)
        entry = job.calls.setdefault(key, {"arrived": set(), "info": None, "error": None})
        entry["arrived"].add(rank)
        if entry["info"] is None and entry["error"] is None and entry["arrived"] >= set(ranks):
            try:
                info = run_sync(self.controller.create_group([job.hosts[r] for r in ranks]))
                job.groups.append(info.group_id)
                entry["info"] = job.local(info)
            except (ValueError, RuntimeError) as e:
                entry["error"] = str(e)
            self._lock.notify_all()
        deadline = time.monotonic() + RENDEZVOUS_S
        while entry["info"] is None and entry["error"] is None:
            if self.jobs.get(job.name) is not job:
                raise ValueError(f"new_group({list(ranks)}): job {job.name!r} ended")
            lost = (set(ranks) - entry["arrived"]) & job.dead
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
                    reply = {"ok": False, "error": "unauthorised: missing or wrong token (set CAIS_TOKEN to the "
                                                   "controller's token, the content of its --token-file)"}
                else:
                    reply = self._answer(req, state)
                with self._lock:
                    job = self.jobs.get(state.get("job") or (req.get("job") if isinstance(req, dict) else None)
                                        or DEFAULT_JOB)
                    reply["dead"] = sorted(job.dead) if job is not None else []
                try:
                    conn.send(reply)
                except OSError:
                    break
        finally:
            conn.close()
            if state.get("rank") is not None and not self._closing:
                with self._lock:
                    self._left(state)

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
    p = cmdline.Parser(prog="python -m cais.coordinator", description="The ranks' controller, alone (rank 0's "
                   "cais.init starts one itself unless CAIS_COORDINATOR=external).")
    p.add_argument("--switch", required=True, metavar="ADDR", help="the switch's control endpoint")
    p.add_argument("--listen", required=True, metavar="ADDR", help="where ranks reach this coordinator")
    p.add_argument("--world-size", required=True, type=cmdline.integer(1))
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
