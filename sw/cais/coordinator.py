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

    hello    {rank, world_size[, job, hosts]}  -> params, clock_hz, float_units, world group, hosts, session
    attach   {session}                         a rank's second connection becomes that rank
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

A connection is the rank that said hello on it (or rejoined, or attached with the session its hello
answer gave): a request's ``rank`` and ``job`` must be the connection's own, and only the hello connection
says ``bye`` (which frees the rank at once). ``rejoin`` is answered only by a coordinator started with
``recover`` (cais-controller --recover), for a job that came back by rejoin, from a rank not back yet, with
groups inside the switch, ``slots_per_group`` and ``sram_usage_limit``.

There is always a token (``token``; ``--token-file`` or ``CAIS_TOKEN`` for ``python -m cais.coordinator``;
rank 0 makes one when ``CAIS_TOKEN`` is unset: :func:`make_token`): every request must carry it as
``"token"``; one without it or with another is refused (``ok`` false) and counted in ``refused``. Every
field is a checked plain integer; lines are capped (:data:`cais.endpoint.MAX_LINE`), a connection must
send its first request within :data:`cais.endpoint.AUTH_IDLE_S`, and at most
:data:`cais.endpoint.MAX_CONNECTIONS` are served at once (docs/security.md).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
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
from .controller.switch import ControlLink, open_switch_link
from .endpoint import (AUTH_IDLE_S, EndpointError, Gate, LineBuffer, accept_backoff, connect, decode, listen,
                       need_int, open_private, printable, private_dir, parse_address, read_token, trusted_uid,
                       WarningLimiter)
from .link import run_sync
from .locks import ReentrantLock

__all__ = ["ControlLink", "Coordinator", "Job", "DEFAULT_JOB", "token_file_for", "make_token", "read_made_token",
           "group_to_dict", "group_from_dict", "kind_to_dict",
           "kind_from_dict"]

log = logging.getLogger("cais.coordinator")

RENDEZVOUS_S = 60.0      # new_group waits this long for every member
DEFAULT_JOB = "default"  # the job of a rank that names none
JOB_HISTORY = 64         # ended jobs kept for show-jobs
MAX_RANKS = 1 << 16      # bound of a rank number or world size in a request
MAX_SEQ = (1 << 32) - 1  # bound of op_seq, next_seq, nbytes, call, epoch (32-bit fields)


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
    sessions: dict = field(default_factory=dict)  # rank -> the secret its second connection attaches with
    rejoined: bool = False                        # came back by rejoin after a controller restart
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


def token_file_for(address: str) -> str:
    """Where rank 0 leaves the token it made when ``CAIS_TOKEN`` is unset, for the other ranks of the same
    user on the same machine: ``<socket>.token`` beside a Unix socket, else
    ``~/.cache/cais/coordinator-<host>-<port>.token``."""
    addr = parse_address(address)
    if addr.family == socket.AF_UNIX:
        return addr.target + ".token"
    host, port = addr.target
    return os.path.join(os.path.expanduser("~"), ".cache", "cais", f"coordinator-{host}-{port}.token")


def make_token(address: str) -> str:
    """Rank 0 without ``CAIS_TOKEN``: a fresh token, written 0600 to :func:`token_file_for` and put in this
    process's environment (``CAIS_TOKEN``), so that its children and the same user's ranks find it."""
    token = secrets.token_hex(16)
    path = token_file_for(address)
    if parse_address(address).family != socket.AF_UNIX:
        private_dir(os.path.dirname(path))              # 0700, ours, not a symbolic link
    with os.fdopen(open_private(path), "w") as f:
        f.write(token + "\n")
    os.environ["CAIS_TOKEN"] = token
    return token


def read_made_token(address: str) -> str:
    """The token rank 0 made (:func:`make_token`), read once rank 0 listens; ValueError when the file is
    missing, or not private to root or this user."""
    path = token_file_for(address)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ValueError(f"no CAIS_TOKEN, and rank 0's token file {path} cannot be read ({e.strerror}): set "
                         f"CAIS_TOKEN to the same secret on every rank") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not trusted_uid(st.st_uid) or st.st_mode & 0o077:
            raise ValueError(f"{path}: owned by uid {st.st_uid} with mode {st.st_mode & 0o777:04o}: not a token "
                             f"rank 0 made (root's or this user's, 0600); set CAIS_TOKEN instead")
        token = f.read().strip()
    if not token:
        raise ValueError(f"{path}: empty")
    return token


def kind_to_dict(kind: CollectiveKind) -> dict:
    return {"dtype": int(kind.dtype), "op": int(kind.op), "acc_fp32": kind.acc_fp32, "saturate": kind.saturate,
            "reproducible": kind.reproducible}


def kind_from_dict(d: dict) -> CollectiveKind:
    if not isinstance(d, dict):
        raise ValueError("kind: an object {dtype, op, acc_fp32, saturate, reproducible}")
    flags = {k: d.get(k) for k in ("acc_fp32", "saturate", "reproducible")}
    bad = [k for k, v in flags.items() if not isinstance(v, bool)]
    if bad:
        raise ValueError(f"kind: {', '.join(bad)} must be true or false")
    return CollectiveKind.make(proto.DType(need_int(d, "dtype", 0, 255)), proto.ReduceOp(need_int(d, "op", 0, 255)),
                               **flags)


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
        Driving the switch through a :class:`ControlLink` (or a :class:`cais.serial_link.SerialLink` for a
        ``serial:`` address: a board's UART).
    jobs : dict[str, Job]
        The jobs running (module docstring), by name; the default job's created at start.
    ended : list[dict]
        The latest jobs that ended (``ended``, ``failed`` or ``replaced``), oldest first.
    recovering : bool
        Started with ``recover`` and no job's world group rejoined yet: only ``rejoin`` is answered.
    switch_lock : cais.locks.ReentrantLock
        Held around every piece of work that may talk to the switch (a rank's request but those of
        :attr:`STATE_OPS`, the periodic pass, an HTTP rule change), taken before the state lock: such work
        runs one at a time, and its register writes never interleave with another's. While it waits for the
        switch it gives the state lock up (:meth:`_io_unlocked`), so what only uses the controller's state
        (/metrics, the HTTP views, a refusal's count, the STATE_OPS) is not held up by a slow switch; it
        sees the state as it is between two accesses.
    """

    def __init__(self, switch, world_size: int, config: Config, *, rank_ports: list[int] | None = None,
                 switch_retry_s: float = 0.0, token: str | None = None, recover: bool = False):
        # a switch's address (cais-switch's control endpoint, serial:...), or a link already open (a tree's:
        # cais.controller.tree.TreeLink)
        self.link = open_switch_link(switch, retry_for=switch_retry_s) if isinstance(switch, str) else switch
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
        self._lock = ReentrantLock()           # the state lock (re-entered by _left and the like), a condition
        self.switch_lock = ReentrantLock()
        self.link.around_io = self._io_unlocked
        self._t0 = time.monotonic()
        if not token:
            raise ValueError("the coordinator needs a token (CAIS_TOKEN, --token-file): every rank sends it")
        self.token = token
        self.restarted = recover          # rejoin is accepted only after a restart (--recover)
        self.refused: dict[str, int] = {"token": 0, "invalid": 0}   # requests refused, by reason
        self._token_warnings = WarningLimiter()                       # their warnings: one per WARN_INTERVAL_S
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
        self._gate = Gate()

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
        if conn_state.get("rank") is not None:
            raise ValueError(f"hello: this connection is already rank {conn_state['rank']}")
        size = need_int(req, "world_size", 1, MAX_RANKS)
        rank = need_int(req, "rank", 0, size - 1)
        name = self._job_name(req, conn_state)
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
        if rank in job.live:
            raise ValueError(f"job {name!r}: rank {rank} joined twice (its first connection is still open)")
        if rank in job.dead:
            raise ValueError(f"job {name!r}: rank {rank} died; the job goes on without it")
        return dict(self._join(job, rank, conn_state), params=self.link.params.as_dict(),
                    clock_hz=self.link.clock_hz, float_units=self.controller.float_units, world=job.local(job.world),
                    backend=self.link.backend, job=name, hosts=list(job.hosts))

    def _join(self, job: Job, rank: int, conn_state: dict) -> dict:
        """This connection is now rank `rank` of `job` (its end without bye: the rank died); a fresh session
        secret lets the rank's second connection attach to it."""
        job.joined.add(rank)
        job.live.add(rank)
        job.left.discard(rank)
        job.sessions[rank] = secrets.token_hex(16)
        conn_state.update(rank=rank, job=job.name, owner=True)
        return {"session": job.sessions[rank]}

    def _left(self, conn_state: dict) -> None:
        """A rank's hello connection ended (with bye or without): the job ends once all are gone."""
        job = self.jobs.get(conn_state.get("job"))
        rank = conn_state.get("rank")
        if job is None or rank not in job.live or not conn_state.get("owner"):
            return
        job.live.discard(rank)
        job.sessions.pop(rank, None)
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
    def _bound(self, req: dict, conn_state: dict) -> Job:
        """The job of the rank this connection is (hello, rejoin or attach); a request's ``rank`` and
        ``job`` must be the connection's own: a rank cannot speak for another."""
        rank = conn_state.get("rank")
        if rank is None:
            raise ValueError("this connection is no rank yet: hello (or attach) first")
        name = conn_state["job"]
        if "job" in req and req["job"] != name:
            raise ValueError(f"job {str(req['job'])[:64]!r}: this connection is rank {rank} of job {name!r}")
        if "rank" in req and need_int(req, "rank", 0, MAX_RANKS) != rank:
            raise ValueError(f"rank {req['rank']}: this connection is rank {rank} of job {name!r}")
        job = self.jobs.get(name)
        if job is None or rank not in job.live:
            raise ValueError(f"job {name!r}: rank {rank} is no longer part of it")
        return job

    def _group_of(self, req: dict, job: Job) -> int:
        gid = need_int(req, "group", 0, 255)
        if gid not in self.controller.groups:
            raise ValueError(f"group {gid}: no such group")
        if gid not in job.groups:
            raise ValueError(f"group {gid}: not a group of job {job.name!r}")
        return gid

    @contextlib.contextmanager
    def _io_unlocked(self):
        """Around one switch access: the state lock given up meanwhile, when this thread holds it and the
        switch lock (work that holds the state lock alone keeps it: it may not interleave with other work)."""
        if not (self._lock.held() and self.switch_lock.held()):
            yield
            return
        depth = self._lock.release_fully()
        try:
            yield
        finally:
            self._lock.restore(depth)

    def _wait(self, timeout: float) -> None:
        """Wait on the state lock's condition inside a request: the switch lock is given up too (the other
        ranks' requests need it), then taken back before the state lock (the order every thread takes them)."""
        switch = self.switch_lock.release_fully()
        self._lock.wait(timeout)
        state = self._lock.release_fully()
        self.switch_lock.restore(switch)
        self._lock.restore(state)

    #: Rank requests that never talk to the switch: answered under the state lock alone, so a rank polling
    #: mid-collective is not held up while other work programs a slow switch (``switch_lock``). ``finished``
    #: is one too: its pending switch work is left to whoever holds the switch (:meth:`_service_if_free`).
    STATE_OPS = frozenset({"ping", "attach", "status", "fallback", "finished"})

    def handle(self, req: dict, conn_state: dict) -> dict:
        op = req.get("op")
        if op in self.STATE_OPS:
            with self._lock:
                reply = self._handle(op, req, conn_state)
            if op == "finished":
                self._service_if_free()
            return reply
        with self.switch_lock, self._lock:
            return self._handle(op, req, conn_state)

    def _service_if_free(self) -> None:
        """The controller's pending switch work (a fall back's cleanup, a due evaluation) now, unless other
        work holds the switch: then it is done by that work, by the next ``decide`` (which services first,
        holding the switch) or by the periodic pass of cais.service."""
        if not self.switch_lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                run_sync(self.controller.service(self.now()))
        finally:
            self.switch_lock.release()

    def _handle(self, op, req: dict, conn_state: dict) -> dict:
        """A request, under the state lock (and the switch lock, but for STATE_OPS)."""
        if op == "ping":
            return {}
        if op == "rejoin":
            return self._rejoin(req, conn_state)
        if op == "attach":
            return self._attach(req, conn_state)
        if op == "bye":
            self._bye(conn_state)
            return {}
        if self.recovering:
            raise ValueError("the controller restarted and waits for the ranks to rejoin")
        if op == "hello":
            return self._hello(req, conn_state)
        if op not in ("group", "decide", "finished", "fallback", "status"):
            raise ValueError(f"unknown op {str(op)[:40]!r}")
        job = self._bound(req, conn_state)
        host = job.host(conn_state["rank"])
        if op == "group":
            ranks = req.get("ranks")
            if not isinstance(ranks, list) or len(ranks) > len(job.hosts):
                raise ValueError("group: ranks must be a list of the job's ranks")
            ranks = tuple(need_int({"rank": r}, "rank", 0, len(job.hosts) - 1) for r in ranks)
            return self._group(job, conn_state["rank"], ranks, need_int(req, "call", 0, MAX_SEQ))
        g, s = self._group_of(req, job), need_int(req, "op_seq", 0, MAX_SEQ)
        if op == "decide":
            run_sync(self.controller.service(self.now()))
            d = self.controller.decide(g, s, need_int(req, "nbytes", 0, MAX_SEQ), self.now(),
                                       kind_from_dict(req.get("kind")))
            if d is None:
                return {"decision": None}
            self._note(g, s)
            return {"decision": d.as_dict(), **self._membership(job, g, s)}
        if op == "finished":
            epoch = self.controller.op_epoch(g, s)
            if need_int(req, "epoch", 0, MAX_SEQ, default=epoch) != epoch:
                return {}                            # a run abandoned since (ranks dropped): it does not count
            self.controller.tick(self.now())
            rtt = req.get("rtt")
            if rtt is not None:                      # the first chunk's round trip (switch path)
                if isinstance(rtt, bool) or not isinstance(rtt, (int, float)) or not 0 <= rtt < 3600:
                    raise ValueError(f"rtt={str(rtt)[:40]}: a round trip in seconds (0 to 3600) or null")
                self.controller.report_rtts([float(rtt)])
            self.controller.finished(host, g, s)
            self._note(g, s, host)
            return {}                                # handle() services the switch if it is free
        if op == "fallback":
            self.controller.request_fallback(g, s, host, self.now(), str(req.get("why", ""))[:200])
            return {}
        return {"fell_back": self.controller.fell_back(g, s), "all_finished": self.controller.all_finished(g, s),
                **self._membership(job, g, s)}

    def _bye(self, conn_state: dict) -> None:
        """The rank leaves now (on its hello connection): it is free to join again at once."""
        if not conn_state.get("owner"):
            raise ValueError("bye: say it on the connection that said hello")
        conn_state["bye"] = True
        self._left(conn_state)
        conn_state.clear()

    def _attach(self, req: dict, conn_state: dict) -> dict:
        """A rank's second connection (its control requests) becomes that rank: by the session its hello
        answer gave, which only that rank has."""
        if conn_state.get("rank") is not None:
            raise ValueError(f"attach: this connection is already rank {conn_state['rank']}")
        session = req.get("session")
        if isinstance(session, str):
            for job in self.jobs.values():
                for rank, secret in job.sessions.items():
                    if rank in job.live and hmac.compare_digest(secret.encode(), session.encode()):
                        conn_state["rank"], conn_state["job"] = rank, job.name
                        return {"rank": rank, "job": job.name}
        raise ValueError("attach: no rank has that session (its hello connection closed?)")

    def _rejoin(self, req: dict, conn_state: dict) -> dict:
        """A rank re-registers its groups after a controller restart (docs/controller.md). Accepted only by a
        controller started with --recover, for a job that came back by rejoin, from a rank not there yet,
        with groups inside the switch and the configured quotas (the controller checks overlaps)."""
        if not self.restarted:
            raise ValueError("rejoin: this controller did not restart (it was not started with --recover): "
                             "say hello")
        if conn_state.get("rank") is not None:
            raise ValueError(f"rejoin: this connection is already rank {conn_state['rank']}")
        size = need_int(req, "world_size", 1, self.world_size)
        rank = need_int(req, "rank", 0, size - 1)
        name = self._job_name(req, conn_state)
        hosts = self._hosts(req, name, size)
        groups = req.get("groups")
        if not isinstance(groups, list) or len(groups) > 255:
            raise ValueError("rejoin: groups must be a list (at most 255)")
        checked = [self._rejoined_group(g, rank, size) for g in groups]
        job = self.jobs.get(name)
        if job is not None:
            if not job.rejoined:
                raise ValueError(f"rejoin: job {name!r} started after the restart: its ranks say hello")
            if job.hosts != hosts:
                raise ValueError(f"job {name!r} runs on hosts {list(job.hosts)}; rank {rank} says {list(hosts)}")
            if rank in job.joined:
                raise ValueError(f"rejoin: rank {rank} of job {name!r} already rejoined (or left)")
        else:
            job = self._new_job(name, hosts, world=False)
            job.rejoined = True
        for g in checked:
            info = run_sync(self.controller.adopt_group(g["group_id"], [hosts[r] for r in g["ranks"]], g["base"],
                                                        g["count_log2"], g["rule_index"], g["next_seq"],
                                                        g["next_op"]))
            if info.group_id not in job.groups:
                job.groups.append(info.group_id)
            # the job's world group (it may have lost ranks that died before the restart)
            if (g["world"] or len(info.ranks) == size) and job.world is None:
                job.world = info
                self.recovering = False
        return dict(self._join(job, rank, conn_state), groups=sorted(g["group_id"] for g in checked))

    def _rejoined_group(self, g, rank: int, size: int) -> dict:
        """One group of a rejoin, every field checked: plain integers inside the switch and the quotas."""
        if not isinstance(g, dict):
            raise ValueError("rejoin: each group is an object")
        gid = need_int(g, "group_id", 1, 255)
        ranks = g.get("ranks")
        if not isinstance(ranks, list) or not ranks or len(ranks) > size:
            raise ValueError(f"rejoin: group {gid}: ranks must be a list of 1..{size} ranks")
        ranks = [need_int({"rank": r}, "rank", 0, size - 1) for r in ranks]
        if rank not in ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"rejoin: rank {rank} is not in group {gid} of ranks 0..{size - 1} (or a rank twice)")
        params = self.link.params
        out = {"group_id": gid, "ranks": ranks, "world": g.get("world") is True,
               "next_seq": need_int(g, "next_seq", 0, MAX_SEQ), "next_op": need_int(g, "next_op", 0, MAX_SEQ),
               "base": None, "count_log2": 0, "rule_index": None}
        if g.get("base") is not None or g.get("rule_index") is not None:
            usable = int(self.config.sram_usage_limit * params.slots)
            base = need_int(g, "base", 0, params.slots - 1)
            count_log2 = need_int(g, "count_log2", 0, 16)
            count = 1 << count_log2
            if count > self.config.slots_per_group or base + count > usable:
                raise ValueError(f"rejoin: group {gid}: slots {base}+{count} exceed the quota "
                                 f"({self.config.slots_per_group} per group, slots 0..{usable - 1} usable: "
                                 f"sram_usage_limit)")
            out.update(base=base, count_log2=count_log2, rule_index=need_int(g, "rule_index", 0, params.rules - 1))
        return out

    def authorised(self, req) -> bool:
        """The request carries the token."""
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
            self._wait(min(left, 0.2))
        if entry["error"] is not None:
            raise ValueError(entry["error"])
        return {"group": entry["info"]}

    # ------------------------------------------------------------------ server
    def _answer(self, req: dict, state: dict) -> dict:
        try:
            return {"ok": True, **self.handle(req, state)}
        except (KeyError, ValueError, TypeError, OverflowError, RuntimeError, EndpointError) as e:
            with self._lock:
                self.refused["invalid"] += 1
            return {"ok": False, "error": str(e.args[0]) if isinstance(e, KeyError) else str(e)}
        except Exception as e:     # a bug costs the request, not the rank's connection  # noqa: BLE001
            log.exception("coordinator: request %r failed", str(req.get("op"))[:40])
            return {"ok": False, "error": f"internal error ({type(e).__name__})"}

    def _reply(self, req, state: dict) -> dict:
        if not self.authorised(req):
            with self._lock:
                self.refused["token"] += 1
            quiet = self._token_warnings.allow()
            if quiet is not None:
                log.warning("refused a request without the controller's token (op %s)%s",
                            printable(repr(req.get("op")), 40),
                            f" ({quiet} more refused since the last warning)" if quiet else "")
            return {"ok": False, "error": "unauthorised: missing or wrong token (set CAIS_TOKEN to the "
                                          "controller's token, the content of its --token-file)"}
        state["authorised"] = True
        reply = self._answer(req, state)
        with self._lock:
            job = self.jobs.get(state.get("job") or DEFAULT_JOB)
            reply["dead"] = sorted(job.dead) if job is not None else []
        return reply

    def _serve_connection(self, sock: socket.socket) -> None:
        """One connection: lines capped (MAX_LINE), a first authorised request within AUTH_IDLE_S, then no
        limit (a rank's connection lives as long as the rank; its end means the rank is gone)."""
        lines, state = LineBuffer(), {}
        try:
            sock.settimeout(AUTH_IDLE_S)
            while not self._closing:
                try:
                    data = sock.recv(1 << 16)
                    chunk = lines.feed(data) if data else None
                except (OSError, ValueError):
                    break                     # silent too long before its token, a line too long, reset
                if chunk is None:
                    break
                for line in chunk:
                    try:
                        reply = self._reply(decode(line), state)
                    except ValueError as e:
                        with self._lock:
                            self.refused["invalid"] += 1
                        reply = {"ok": False, "error": f"bad request: {e}"}
                    sock.settimeout(None if state.get("authorised") else AUTH_IDLE_S)
                    try:
                        sock.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
                    except OSError:
                        return
        finally:
            sock.close()
            if state.get("rank") is not None and not self._closing:
                with self.switch_lock, self._lock:
                    self._left(state)
            self._gate.leave()

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
                got = accept_backoff(self._server, "coordinator")
            except OSError:
                return                         # closed
            if got is None:
                continue
            sock, _ = got
            if not self._gate.enter():
                log.warning("coordinator: %d connections already: refused one more", self._gate.limit)
                sock.close()
                continue
            try:
                threading.Thread(target=self._serve_connection, args=(sock,), daemon=True).start()
            except RuntimeError:
                sock.close()
                self._gate.leave()

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            try:
                self._server.close()
            except OSError:
                pass
            if self._address.family == socket.AF_UNIX:
                try:
                    os.unlink(self._address.target)
                except OSError:
                    pass
        self.link.close()


def main(argv=None) -> int:
    p = cmdline.Parser(prog="python -m cais.coordinator", description="The ranks' controller, alone (rank 0's "
                   "cais.init starts one itself unless CAIS_COORDINATOR=external).")
    p.add_argument("--switch", required=True, metavar="ADDR", help="the switch's control endpoint, or "
                   "serial:/dev/ttyUSB0[@BAUD] for a board's UART bridge")
    p.add_argument("--listen", required=True, metavar="ADDR", help="where ranks reach this coordinator")
    p.add_argument("--world-size", required=True, type=cmdline.integer(1))
    p.add_argument("--config", default=None, metavar="TOML")
    p.add_argument("--token-file", default=None, metavar="PATH", help="the ranks' shared secret (default: "
                   "$CAIS_TOKEN; one of them is required)")
    args = p.parse_args(argv)
    try:
        token = read_token(args.token_file)
    except (OSError, ValueError) as e:
        p.error(f"--token-file: {e}")
    if token is None:
        p.error("a token is required: --token-file PATH or CAIS_TOKEN (every rank sends it as CAIS_TOKEN)")
    try:
        coord = Coordinator(args.switch, args.world_size, Config.load(args.config), token=token)
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
