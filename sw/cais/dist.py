"""The deployed driver: one OS process per rank, the collectives over raw Ethernet, a torch-style API.

::

    import numpy as np, cais
    cais.init()                      # from CAIS_RANK, CAIS_WORLD_SIZE, CAIS_IFACE, CAIS_SWITCH, CAIS_CONTROLLER
    grads = np.ones(1 << 16, np.float32)
    cais.all_reduce(grads, op=cais.ReduceOp.AVG)        # in place
    work = cais.broadcast(params, src=0, async_op=True); work.wait()
    cais.barrier(); cais.destroy_process_group()

Each rank's process holds an AF_PACKET socket on its interface (:mod:`cais.rawsock`) and a progress
thread that drives the same sans-IO engines as the co-simulation: :class:`cais.allreduce.SwitchAllReduce`
(all-reduce in the switch's slots), :class:`cais.ring.RingAllReduce` (the host ring, also reduce-scatter)
and :class:`cais.forward.ForwardGather` (broadcast and all-gather forwarded by the switch's rules). The
decisions (switch or host, the chunk sequence numbers, the fall back) come from one controller in a
coordinator (:mod:`cais.coordinator`) that rank 0 starts; it alone programs the switch through its control
endpoint. The in-process :class:`cais.comm.World` stays the deterministic co-simulation; the element types,
quantization and dtype rules are :class:`cais.comm.Communicator`'s, shared.

Never a hang: every collective has a deadline (``timeout``, default 60 s). A peer whose process ends
(its coordinator connection closes without ``bye``) is dropped from its groups: an all-reduce it had not
finished is redone by the ranks left on the host ring, each from its own input, so every survivor gets
the reduction of the survivors' inputs (:attr:`Work.ranks` names whose inputs a result holds); the
group's next collectives run without it (docs/reliability.md section 8). Broadcast, all-gather and
reduce-scatter are not redone: a dead peer fails them at once with :class:`CollectiveError` naming it.
An error fails the collective and every later one on this rank (the group's state is no longer
consistent), never a partial result without an error.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import select
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from . import numerics
from . import protocol as proto
from .allreduce import CollectiveKind, SwitchAllReduce, chunk_count
from .comm import CollectiveError, Communicator, Group, Work as _CommWork, host_mac, ring_op_id
from .config import Config
from .controller import GroupInfo, decision_line
from .coordinator import (DEFAULT_JOB, Coordinator, group_from_dict, group_to_dict, kind_to_dict, make_token,
                          read_made_token, token_file_for)
from .endpoint import EndpointError, RefusedError, connect
from .forward import ForwardGather
from .numerics import native_dtype
from .params import SwitchParams
from .rawsock import RawPort
from .ring import DEFAULT_MAX_PAYLOAD, RingAllReduce
from .seal import SEAL_BYTES, FrameSeal

__all__ = ["init", "init_process_group", "is_initialized", "destroy_process_group", "new_group", "get_rank",
           "get_world_size", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "synchronize",
           "reduce", "gather", "scatter", "all_to_all", "send", "recv",
           "ReduceOp", "Work", "ProcessGroup", "CollectiveError", "ENV", "TORCH_ENV", "DEPLOY_DEFAULTS", "interface_for"]

log = logging.getLogger("cais.dist")

#: environment variables :func:`init` reads for the arguments it is not given
ENV = {"rank": "CAIS_RANK", "world_size": "CAIS_WORLD_SIZE", "interface": "CAIS_IFACE",
       "switch": "CAIS_SWITCH", "controller": "CAIS_CONTROLLER", "config": "CAIS_CONFIG",
       "timeout": "CAIS_TIMEOUT", "token": "CAIS_TOKEN", "job": "CAIS_JOB", "hosts": "CAIS_HOSTS",
       "connect_timeout": "CAIS_CONNECT_TIMEOUT"}
#: torch's (torchrun's) variables, read when the CAIS_* one is absent: rank, world size, and the host of
#: rank 0, whose process hosts the coordinator (at MASTER_ADDR:``Config.controller_port``)
TORCH_ENV = {"rank": "RANK", "world_size": "WORLD_SIZE", "controller": "MASTER_ADDR"}
#: configuration for real time: Python ranks answer in about a millisecond, not in switch cycles
DEPLOY_DEFAULTS = {"timeout_ms": 50.0, "reevaluate_interval_ms": 1000.0}
DEFAULT_TIMEOUT_S = 60.0     # a collective that has not completed by then fails
CONNECT_S = 30.0             # how long a rank waits for the coordinator (rank 0 may start last)
POLL_S = 0.001               # asking the coordinator again (decision pending, peers settling)
STATUS_S = 0.05              # asking whether a peer gave up, or left, while frames move
STASH_FRAMES = 4096         # frames no engine claimed, offered to the next engines started
STASH_S = 2.0               # ... if not older than this
LINGER_S = 1.0               # a finished engine still answers repeats this long (its last ACK may be lost)


class ReduceOp(str, enum.Enum):
    """SUM, MAX, MIN (the switch's), AVG (SUM, then divided); PRODUCT and the bitwise BAND, BOR, BXOR by an
    all-gather and a local fold (:func:`cais.hostops.fold_all_reduce`)."""
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    AVG = "avg"
    PRODUCT = "product"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


#: the ops the switch (and the host ring) reduce; the rest of :class:`ReduceOp`: hostops.fold_all_reduce
SWITCH_OPS = ("sum", "max", "min", "avg")


# ---------------------------------------------------------------------- the progress engine
@dataclass
class _Op:
    kind: str                        # "all_reduce", "gather", "reduce_scatter"
    work: _CommWork
    group: GroupInfo
    seq: int                         # the frames' op_seq: every collective of the group counts
    data: np.ndarray | None = None
    ckind: CollectiveKind | None = None
    shape: tuple = ()
    convert: object = None
    ar_seq: int | None = None        # the controller's op_seq (all-reduces only)
    sizes: list = field(default_factory=list)   # gather: bytes per ring index
    senders: tuple = ()
    op_type: proto.OpType = proto.OpType.ALL_GATHER
    state: str = "new"
    engine: object = None
    deadline: float = 0.0
    next_poll: float = 0.0
    started: float = 0.0
    reported: bool = False           # the coordinator was told this rank finished (all-reduces)
    epoch: int = 0                   # the controller's op_epoch this rank runs it at (a redo: higher)
    on_ring: bool = False            # its engine is a host ring (started, fallen back or redone)
    contributors: tuple = ()         # the ranks whose inputs the running engine reduces


class ProcessGroup:
    """This process's rank: the socket, the coordinator connections and the progress thread.

    It offers what :class:`cais.comm.Communicator` needs of a world (``config``, ``ranks``,
    ``controller.float_units``, ``_submit``, ``_new_group``, ``_block_until``), so all-reduce's element
    types and host-side quantization are the co-simulation's.

    Members
    -------
    rank, world_size : int
    params : SwitchParams
        The switch's, as its control endpoint reports them.
    comm : Communicator
    coordinator : Coordinator | None
        Rank 0's (it hosts the controller), else None.
    """

    _primitives = None       # its DistPrimitives, made on first use (:func:`primitives`)

    def __init__(self, interface: str, rank: int, world_size: int, switch: str | None, controller: str,
                 config: Config, timeout: float = DEFAULT_TIMEOUT_S, connect_timeout: float = CONNECT_S):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}: not in 0..{world_size - 1}")
        self.rank, self.world_size, self.ranks = rank, world_size, world_size
        self.config, self.timeout = config, float(timeout)
        self.mac = host_mac(rank)
        self.coordinator = None
        # the coordinator's shared secret; without CAIS_TOKEN rank 0 makes one (docs/security.md)
        token = os.environ.get(ENV["token"]) or None
        self._made_token = None
        self.job, self.hosts = _job_from_env(world_size)
        self.port = RawPort(interface)         # OSError naming the interface when it is not there
        try:
            if rank == 0 and os.environ.get("CAIS_COORDINATOR") != "external":
                if not switch:
                    raise ValueError("rank 0 starts the coordinator: it needs the switch's control endpoint "
                                     f"(switch=... or {ENV['switch']})")
                if token is None:
                    token, self._made_token = make_token(controller), token_file_for(controller)
                self.coordinator = Coordinator(switch, world_size, config, switch_retry_s=connect_timeout,
                                               token=token)
                self.coordinator.serve(controller)
            # "" (no token yet) still checks the server's owner; rank 0 wrote its file before listening
            self._user = connect(controller, timeout=max(self.timeout, 70.0), retry_for=connect_timeout,
                                 name="coordinator", token=token or "")
            if token is None:
                token = self._user.token = read_made_token(controller)
            hello = self._user.request("hello", rank=rank, world_size=world_size, job=self.job,
                                       **({"hosts": self.hosts} if self.hosts is not None else {}))
            self.hosts = [int(h) for h in hello.get("hosts", range(world_size))]
            self.mac = self._mac_of(rank)     # the switch knows a host by its host's MAC
            self._ctl = connect(controller, timeout=10.0, name="coordinator", token=token)
            self._ctl.request("attach", session=hello["session"])   # this rank's second connection
        except BaseException:
            self.port.close()
            self._close_coordinator()
            raise
        self._controller_address, self._token, self._connect_timeout = controller, token, connect_timeout
        # a controller of its own (cais-controller) may restart and be rejoined; rank 0's ends with rank 0
        self._rejoinable = os.environ.get("CAIS_COORDINATOR") == "external"
        self._next_op: dict[int, int] = {}     # group -> op_seq after the last decision this rank got
        # group -> the retransmission timer of its last all-reduce through the switch: the next one starts
        # from its round trips (cais.rto), not from timeout_ms again
        self._switch_timers: dict = {}
        self.rejoins = 0                        # controller restarts this rank went through
        self.params = SwitchParams(**hello["params"])
        # where frames may come from (_admit): the controller leaves SWITCH_MAC at its reset value
        self.switch_mac = proto.SWITCH_MAC_DEFAULT
        self._job_macs = frozenset(self._mac_of(r) for r in range(world_size))
        self._refused: collections.Counter = collections.Counter(dict.fromkeys(
            ("result_source", "cais_source", "ring_source"), 0))
        # host frames sealed under the job's key when the ranks share the token (cais.seal)
        self._seal = FrameSeal.for_job(token, self.job) if token else None
        self._seal_bytes = SEAL_BYTES if token else 0
        self._warned: set[str] = set()
        self.controller = _ControllerView(bool(hello["float_units"]))
        self._world_group = group_from_dict(hello["world"])
        self.controller.groups[self._world_group.group_id] = self._world_group
        self._lock = threading.Lock()
        self._queue: collections.deque[_Op] = collections.deque()
        self._seq: dict[int, int] = {}          # group -> next frame op_seq
        self._ar_seq: dict[int, int] = {}       # group -> next controller op_seq
        self._group_calls: dict[tuple, int] = {}
        self._broken: BaseException | None = None
        self._dead: set[int] = set()
        self._background: list[tuple[object, float]] = []    # (engine, drop after)
        self._stash: collections.deque = collections.deque(maxlen=STASH_FRAMES)   # (time, unclaimed frame)
        self._stop = False
        self._wakeup_r, self._wakeup_w = os.pipe()
        self.comm = Communicator(self, rank)
        self.outstanding: list = []
        self.history: list[dict] = []          # per collective: kind, path, seconds (for reports)
        self._thread = threading.Thread(target=self._run, name=f"cais-rank{rank}", daemon=True)
        self._thread.start()

    def _close_coordinator(self) -> None:
        if self.coordinator is not None:
            self.coordinator.close()
        if self._made_token:                      # the token rank 0 made goes with its coordinator
            try:
                os.unlink(self._made_token)
            except OSError:
                pass

    # ------------------------------------------------------------------ what Communicator uses
    def _block_until(self, rank: int, event: threading.Event) -> None:
        while not event.wait(0.2):
            if not self._thread.is_alive():
                raise CollectiveError(f"rank {self.rank}: the progress thread ended"
                                      + (f": {self._broken}" if self._broken else ""))

    def _new_group(self, rank: int, ranks: list[int]) -> Group | None:
        ranks = [int(r) for r in ranks]
        if rank not in ranks:
            return None
        # the n-th group of these ranks (the same rule as World's)
        call = self._group_calls.get(tuple(ranks), 0)
        self._group_calls[tuple(ranks)] = call + 1
        try:
            try:
                reply = self._user.request("group", rank=rank, ranks=ranks, call=call)
            except RefusedError:
                raise
            except EndpointError:
                if not self._rejoinable:
                    raise
                self._rejoin()                  # the controller restarted: tell it our groups, ask again
                reply = self._user.request("group", rank=rank, ranks=ranks, call=call)
            info = group_from_dict(reply["group"])
        except EndpointError as e:
            raise CollectiveError(f"rank {self.rank}: new_group({ranks}): {e}") from None
        with self._lock:
            self.controller.groups[info.group_id] = info
        return Group(info.group_id, info.ranks)

    def _group_info(self, group: Group | None) -> GroupInfo:
        info = self._world_group if group is None else self.controller.groups[group.group_id]
        if self.rank not in info.ranks:
            raise ValueError(f"rank {self.rank} is not in group {info.group_id} {list(info.ranks)}")
        return info

    def _enqueue(self, op: _Op) -> _CommWork:
        with self._lock:
            if self._broken is not None:
                op.work.error = CollectiveError(f"rank {self.rank}: an earlier collective failed: {self._broken}")
                op.work._done.set()
                return op.work
            self._queue.append(op)
        os.write(self._wakeup_w, b"x")
        return op.work

    def _next_seq(self, info: GroupInfo, all_reduce: bool) -> tuple[int, int | None]:
        with self._lock:
            seq = self._seq.get(info.group_id, 0)
            self._seq[info.group_id] = seq + 1
            ar = None
            if all_reduce:
                ar = self._ar_seq.get(info.group_id, 0)
                self._ar_seq[info.group_id] = ar + 1
        return seq, ar

    def _submit(self, rank: int, values: np.ndarray, kind: CollectiveKind, group: Group | None,
                shape: tuple | None = None, convert=None) -> _CommWork:
        info = self._group_info(group)
        seq, ar = self._next_seq(info, True)
        flat = np.ascontiguousarray(values.reshape(-1)).astype(native_dtype(kind.dtype), copy=True)
        return self._enqueue(_Op("all_reduce", _CommWork(self, rank), info, seq, flat, kind,
                                 values.shape if shape is None else shape, convert, ar_seq=ar))

    def submit_gather(self, own: bytes, sizes: list[int], senders, group: Group | None,
                      op_type: proto.OpType) -> _CommWork:
        info = self._group_info(group)
        seq, _ = self._next_seq(info, False)
        return self._enqueue(_Op("gather", _CommWork(self, self.rank), info, seq,
                                 np.frombuffer(own, np.uint8).copy(), sizes=sizes, senders=tuple(senders),
                                 op_type=op_type))

    def submit_reduce_scatter(self, values: np.ndarray, kind: CollectiveKind, group: Group | None) -> _CommWork:
        info = self._group_info(group)
        seq, _ = self._next_seq(info, False)
        return self._enqueue(_Op("reduce_scatter", _CommWork(self, self.rank), info, seq,
                                 np.ascontiguousarray(values), kind))

    # ------------------------------------------------------------------ the progress thread
    def _run(self) -> None:
        current: _Op | None = None
        next_status = 0.0
        try:
            while not self._stop:
                now = time.monotonic()
                if current is None:
                    with self._lock:
                        current = self._queue.popleft() if self._queue else None
                    if current is not None:
                        self._start(current, now)
                if current is not None:
                    try:
                        if now >= next_status and current.kind != "all_reduce":
                            next_status = now + STATUS_S
                            self._check_peers(current)
                        if self._step(current, time.monotonic()):    # after _check_peers' request
                            current = None
                            continue
                    except (CollectiveError, EndpointError, ValueError) as e:
                        self._fail(current, e)
                        current = None
                        continue
                now = time.monotonic()          # after the step's requests to the coordinator
                self._send(self._poll_background(now))
                self._wait(current, now)
        except BaseException as e:   # noqa: BLE001 - reported to every waiter
            self._broken = self._broken or e
            if current is not None:
                self._fail(current, e)
        finally:
            with self._lock:
                pending, self._queue = list(self._queue), collections.deque()
            for op in pending:
                self._fail(op, CollectiveError(f"rank {self.rank}: the process group was shut down"))

    def _fail(self, op: _Op, error: BaseException) -> None:
        if isinstance(error, EndpointError):
            error = CollectiveError(f"rank {self.rank}: {op.kind} of group {op.group.group_id}: lost the "
                                    f"coordinator (rank 0's process hosts it; did it end?): {error}")
        elif not isinstance(error, CollectiveError):
            error = CollectiveError(f"rank {self.rank}: {op.kind} of group {op.group.group_id}: {error}")
        with self._lock:
            self._broken = self._broken or error
        op.work.error = error
        op.work._done.set()

    def _check_peers(self, op: _Op, ask: bool = True) -> None:
        """Broadcast, all-gather and reduce-scatter are not redone among survivors: a dead member fails them."""
        if ask:
            self._rpc("ping")                   # updates self._dead
        lost = (self._dead & set(op.group.ranks)) | set(op.group.dropped)
        if lost:
            raise CollectiveError(f"rank {self.rank}: {op.kind} of group {op.group.group_id} ranks "
                                  f"{sorted(set(op.group.ranks) | set(op.group.dropped))}: rank(s) {sorted(lost)} "
                                  "left (their process ended); only all-reduce is redone among the ranks left")

    def _follow(self, op: _Op, reply: dict) -> bool:
        """The coordinator's view of the op's group (its ranks left, the collective's epoch) into this rank's;
        True when the collective must be redone on the ring among the ranks left (the epoch moved on)."""
        info = op.group
        ranks = tuple(int(r) for r in reply.get("ranks", info.ranks))
        if ranks != info.ranks:
            with self._lock:
                for r in set(info.ranks) - set(ranks):
                    info.dropped[r] = "its process ended"
                info.ranks, info.ports = ranks, tuple(int(p) for p in reply["ports"])
        if self.rank not in info.ranks:
            raise CollectiveError(f"rank {self.rank} was dropped from group {info.group_id}: its coordinator "
                                  "connection ended")
        epoch = int(reply.get("epoch", 0))
        if epoch == op.epoch:
            return False
        op.epoch, op.reported = epoch, False     # the controller forgot who finished the abandoned run
        return True

    def _start(self, op: _Op, now: float) -> None:
        op.deadline = now + self.timeout
        op.started = now
        if op.kind != "all_reduce":
            self._check_peers(op, ask=False)     # a member already dropped: fail before sending anything
        index = op.group.ranks.index(self.rank)
        macs = [self._mac_of(r) for r in op.group.ranks]
        if op.kind == "all_reduce":
            op.state = "decide"
        elif op.kind == "reduce_scatter":
            k = op.ckind
            op.engine = RingAllReduce(index, macs, op.group.group_id, op.seq, op.data, k.op, self.mac,
                                      self.config.timeout_s, now=now, dtype=k.dtype, saturate=k.saturate,
                                      reduce_scatter=True, max_payload=DEFAULT_MAX_PAYLOAD - self._seal_bytes,
                                      window=self.config.ring_window)
            op.state, op.work.path = "ring", "ring"
            self._replay(op.engine, now)
        else:
            via_switch = op.group.offloadable and self.config.offload != "never"
            chunk = self.params.max_payload if via_switch else proto.MAX_FRAME_BYTES - proto.ETH_HEADER_BYTES \
                - proto.HOST_HEADER_BYTES - self._seal_bytes
            op.engine = ForwardGather(index, macs, op.group.group_id, op.seq, op.sizes, op.senders,
                                      op.data.tobytes(), chunk_bytes=chunk, timeout_s=self.config.timeout_s,
                                      retry_limit=max(self.config.retry_limit, 12), via_switch=via_switch,
                                      op_type=op.op_type, now=now)
            op.state, op.work.path = "forward", "switch" if via_switch else "ring"
            self._replay(op.engine, now)

    def _start_ring(self, op: _Op, now: float) -> None:
        """All-reduce on the host ring among the group's ranks now (a redo's frames carry its epoch)."""
        k = op.ckind
        if op.engine is not None:              # an abandoned engine stops serving its (gone) ring
            self._background = [(e, t) for e, t in self._background if e is not op.engine]
        order = sorted(range(len(op.group.ranks)), key=lambda i: op.group.ports[i])
        op.contributors = tuple(op.group.ranks)
        op.engine = RingAllReduce(op.group.ranks.index(self.rank), [self._mac_of(r) for r in op.group.ranks],
                                  op.group.group_id, ring_op_id(op.seq, op.epoch), op.data, k.op, self.mac,
                                  self.config.timeout_s, now=now, dtype=k.dtype, saturate=k.saturate,
                                  reproducible=k.reproducible, acc_fp32=k.acc_fp32, fold_order=order,
                                  max_payload=DEFAULT_MAX_PAYLOAD - self._seal_bytes, window=self.config.ring_window)
        op.state, op.work.path, op.on_ring, op.next_poll = "ring", "ring", True, now + STATUS_S
        self._replay(op.engine, now)

    def _replay(self, engine, now: float) -> None:
        """Offer the new engine the frames that came before it existed (a faster peer's first ones)."""
        keep = collections.deque(maxlen=STASH_FRAMES)
        for t, frame in self._stash:
            if now - t <= STASH_S and not engine.receive(frame, now):
                keep.append((t, frame))
        self._stash = keep

    def _admit(self, frame: bytes) -> bytes | None:
        """A received frame as the engines may see it, or None (docs/protocol.md, "Threat model"): a CAIS
        result only from the switch's MAC, any other CAIS frame (host-path broadcast through the switch)
        and a host frame only from a host of this job, a host frame sealed under the job's key when the
        ranks have the token (:mod:`cais.seal`; the tag is taken off here). The engines then check the
        exact peer (the ring takes DATA only from its predecessor, ACKs only from its successor). Tagged
        frames never get here (:class:`~cais.rawsock.RawPort`). Refusals are counted (``frames_refused``)."""
        if len(frame) < proto.ETH_HEADER_BYTES:
            return None
        ethertype, src = int.from_bytes(frame[12:14], "big"), int.from_bytes(frame[6:12], "big")
        why = None
        if ethertype == proto.ETHERTYPE:
            result = len(frame) >= proto.HEADERS_BYTES and proto.CaisHeader.unpack(
                frame[proto.ETH_HEADER_BYTES:]).flags & proto.Flags.RESULT
            if src != self.switch_mac if result else src not in self._job_macs:
                why = "result_source" if result else "cais_source"
        elif ethertype == proto.HOST_ETHERTYPE:
            if src not in self._job_macs:
                why = "ring_source"
            elif self._seal is not None:
                opened = self._seal.open(frame)
                if opened is None:
                    self._warn_refused("ring_seal", src)
                return opened
        if why is None:
            return frame
        self._refused[why] += 1
        self._warn_refused(why, src)
        return None

    def _warn_refused(self, why: str, src: int) -> None:
        """Log the first refusal of each kind (the counters count them all)."""
        if why not in self._warned:
            self._warned.add(why)
            log.warning("rank %d: refused a frame from %s (%s); further ones are counted, not logged",
                        self.rank, proto.mac_to_str(src), why)

    @property
    def frames_refused(self) -> dict[str, int]:
        """Frames this rank refused, by reason: ``tagged`` (an 802.1Q/802.1ad tag), ``result_source`` (a
        CAIS result not from the switch's MAC), ``cais_source`` (another CAIS frame from no host of the job),
        ``ring_source`` (a host frame from no host of the job), ``ring_seal`` (a host frame whose seal is
        missing or wrong)."""
        return {"tagged": self.port.tagged, **self._refused,
                "ring_seal": self._seal.refused if self._seal is not None else 0}

    def _mac_of(self, rank: int) -> int:
        """The MAC address of this job's rank `rank`: its host's (job ranks and hosts differ when many
        jobs share the switch)."""
        return host_mac(self.hosts[rank])

    def _rpc(self, name: str, **fields) -> dict:
        fields["job"] = self.job
        try:
            reply = self._ctl.request(name, **fields)
        except RefusedError:
            raise                               # an answer: the connection is fine
        except EndpointError:
            if not self._rejoinable:
                raise
            self._rejoin()                      # the connection is lost: a controller restart?
            reply = self._ctl.request(name, **fields)
        self._dead = set(reply.get("dead", ()))
        return reply

    def _rejoin(self) -> None:
        """After a controller restart (cais-controller --recover): connect again and re-register this
        rank's groups, each with the next collective and sequence number (docs/controller.md)."""
        for conn in (self._user, self._ctl):
            conn.close()
        addr, token = self._controller_address, self._token
        self._user = connect(addr, timeout=max(self.timeout, 70.0), retry_for=self._connect_timeout,
                             name="coordinator", token=token)
        self._ctl = connect(addr, timeout=10.0, retry_for=self._connect_timeout, name="coordinator", token=token)
        with self._lock:
            groups = [dict(group_to_dict(info), next_op=self._next_op.get(g, 0), next_seq=info.next_seq,
                           world=g == self._world_group.group_id)
                      for g, info in sorted(self.controller.groups.items())]
        # on the connection that said hello: the one whose end without bye means this rank is gone
        reply = self._user.request("rejoin", rank=self.rank, world_size=self.world_size, groups=groups,
                                   job=self.job, hosts=self.hosts)
        self._ctl.request("attach", session=reply["session"])
        self.rejoins += 1

    def _step(self, op: _Op, now: float) -> bool:
        """Advance `op`; True when it is over (delivered)."""
        if now > op.deadline:
            missing = getattr(op.engine, "missing", None)
            raise CollectiveError(f"rank {self.rank}: {op.kind} of group {op.group.group_id} did not complete "
                                  f"within {self.timeout:g} s ({op.state}"
                                  + (f"; no answer from ring indices {missing}" if missing else "") + ")")
        g, ar = op.group.group_id, op.ar_seq
        if op.state == "decide":
            if now < op.next_poll:
                return False
            reply = self._rpc("decide", group=g, op_seq=ar, nbytes=int(op.data.nbytes), kind=kind_to_dict(op.ckind))
            # a request can take seconds (a controller programming slow switches, other ranks' requests
            # first): an engine started with the time from before it would stamp its first frames that much
            # in the past, and repeat the whole window the moment it is sent. After every request: now.
            now = time.monotonic()
            d = reply["decision"]
            if d is None:
                op.next_poll = now + POLL_S
                return False
            log.info(decision_line(self.rank, g, ar, d))
            self._next_op[g] = ar + 1
            if self._follow(op, reply):
                self._start_ring(op, now)       # redone before this rank started it: the ring at once
            elif d["offload"]:
                # what a restarted controller must go on from (rejoin)
                op.group.next_seq = d["seq_base"] + chunk_count(op.data.size, op.ckind.itemsize, d["chunk_bytes"])
                op.engine = SwitchAllReduce(
                    data=op.data, op=op.ckind.op, group_id=g, seq_base=d["seq_base"], slot_count=op.group.slot_count,
                    window=self.config.max_pending_chunks, chunk_size=d["chunk_bytes"], timeout_s=self.config.timeout_s,
                    retry_limit=self.config.retry_limit, mac=self.mac, layer_id=op.seq, now=now, dtype=op.ckind.dtype,
                    history=self._switch_timers.get(g))
                op.state, op.work.path, op.contributors = "switch", "switch", tuple(op.group.ranks)
            else:
                self._start_ring(op, now)
        if op.state == "switch":
            e = op.engine
            if e.failed:
                self._rpc("fallback", rank=self.rank, group=g, op_seq=ar,
                          why=f"a chunk ran out of {self.config.retry_limit} retries")
                now = time.monotonic()
                self._start_ring(op, now)
            elif e.done:
                self._switch_timers[g] = e.timer
                self._rpc("finished", rank=self.rank, group=g, op_seq=ar, rtt=e.first_rtt, epoch=op.epoch)
                now = time.monotonic()
                op.reported, op.state, op.next_poll = True, "settle", now
            elif now >= op.next_poll:
                op.next_poll = now + STATUS_S
                status = self._rpc("status", group=g, op_seq=ar)
                now = time.monotonic()
                if self._follow(op, status) or status["fell_back"]:
                    self._start_ring(op, now)
        if op.state == "settle":
            # the result is handed out once no peer can fall back, or die unfinished, any more (then every
            # rank has the same bits); if one does, this rank joins the ring (among the ranks left) with its input
            if now < op.next_poll:
                return False
            status = self._rpc("status", group=g, op_seq=ar)
            now = time.monotonic()
            if self._follow(op, status) or (status["fell_back"] and not op.on_ring):
                self._start_ring(op, now)
            elif status["all_finished"]:
                self._deliver(op, op.engine.result)
                return True
            else:
                op.next_poll = now + POLL_S
                return False
        if op.state == "ring" and op.kind == "all_reduce":
            if op.engine.result_ready:
                if not op.reported:
                    self._rpc("finished", rank=self.rank, group=g, op_seq=ar, epoch=op.epoch)
                    op.reported = True
                self._background.append((op.engine, float("inf")))
                op.state, op.next_poll = "settle", now       # held until every rank left has it
                return False
            if now >= op.next_poll:                          # a peer that died stalls the ring: redo
                op.next_poll = now + STATUS_S
                status = self._rpc("status", group=g, op_seq=ar)
                now = time.monotonic()
                if self._follow(op, status):
                    self._start_ring(op, now)
        elif op.state == "ring":
            if op.engine.result_ready:
                self._background.append((op.engine, float("inf")))
                e = op.engine
                lo, hi = e._bounds[e.owned_block]
                self._deliver(op, e.result[lo:hi])
                return True
        if op.state == "forward":
            e = op.engine
            if e.failed:
                idx = e.missing
                raise CollectiveError(f"rank {self.rank}: {op.op_type.name.lower()} of group {g}: ranks "
                                      f"{[op.group.ranks[i] for i in idx]} never acknowledged "
                                      f"({e.retry_limit} rounds of repeats without an answer, "
                                      f"{e.retransmissions} repeats in {now - op.started:.2f} s)")
            if e.result_ready:
                self._background.append((e, float("inf")))
                self._deliver(op, e)
                return True
        self._send(op.engine.poll(now) if op.engine is not None else [])
        return False

    def _deliver(self, op: _Op, result) -> None:
        if op.kind == "all_reduce":
            out = np.array(result, dtype=native_dtype(op.ckind.dtype))
            if op.convert is not None:
                out = op.convert(out)
            out = out.reshape(op.shape)
            op.work.contributors = op.contributors
        elif op.kind == "reduce_scatter":
            out = np.array(result)
        else:
            out = result
        self.history.append({"kind": op.kind, "path": op.work.path, "seconds": time.monotonic() - op.started})
        op.work.result = out
        op.work._done.set()

    def _poll_background(self, now: float) -> list[bytes]:
        out, keep = [], []
        for engine, drop_at in self._background:
            if engine.done and drop_at == float("inf"):
                drop_at = now + LINGER_S
            if now < drop_at:
                out += engine.poll(now)
                keep.append((engine, drop_at))
        self._background = keep
        return out

    def _send(self, frames) -> None:
        for frame in frames:
            self.port.send(self._seal.seal(frame) if self._seal is not None else frame)

    def _wait(self, op: _Op | None, now: float) -> None:
        deadlines = [now + (POLL_S if op is not None and op.state in ("decide", "settle") else STATUS_S)]
        engines = ([op.engine] if op is not None and op.engine is not None else []) + [e for e, _ in self._background]
        for e in engines:
            d = e.next_deadline()
            if d is not None:
                deadlines.append(d)
        timeout = max(0.0, min(deadlines) - now)
        if op is None and not self._background:
            timeout = 0.5
        ready, _, _ = select.select([self.port.sock, self._wakeup_r], [], [], timeout)
        if self._wakeup_r in ready:
            os.read(self._wakeup_r, 4096)
        if self.port.sock in ready:
            now = time.monotonic()
            for frame in self.port.recv_all():
                frame = self._admit(frame)
                if frame is None:
                    continue
                if not any(e.receive(frame, now) for e in engines):
                    # a peer may already send a collective this rank has not started: kept for a moment
                    self._stash.append((now, frame))
            if op is not None and op.engine is not None:
                self._send(op.engine.poll(now))      # ACKs owed, windows opened

    # ------------------------------------------------------------------ shutdown
    def close(self, linger: float = 2.0) -> None:
        """Let finished engines answer their peers for a moment, say bye, stop."""
        end = time.monotonic() + linger
        while time.monotonic() < end and (self._queue or any(not e.done for e, _ in self._background)):
            time.sleep(0.01)
        self._stop = True
        os.write(self._wakeup_w, b"x")
        self._thread.join(5.0)
        try:
            self._user.request("bye", rank=self.rank)
        except EndpointError:
            pass
        self._user.close()
        self._ctl.close()
        self.port.close()
        if self.coordinator is not None:
            # the others may still be settling their last collective with it: the endpoint goes once every
            # other rank said bye or died (the collective timeout bounds the wait)
            if not self.coordinator.wait_alone(self.job, self.rank, self.timeout):
                log.warning("rank %d: closing the coordinator while ranks of job %s are still connected",
                            self.rank, self.job)
        self._close_coordinator()
        os.close(self._wakeup_r)
        os.close(self._wakeup_w)


def _job_from_env(world_size: int) -> tuple[str, list[int] | None]:
    """(job name, hosts or None) from CAIS_JOB and CAIS_HOSTS (a comma-separated host per rank)."""
    job = os.environ.get(ENV["job"]) or DEFAULT_JOB
    text = os.environ.get(ENV["hosts"])
    if not text:
        return job, None
    try:
        hosts = [int(h) for h in text.split(",")]
    except ValueError:
        raise ValueError(f"{ENV['hosts']}={text!r}: expected a comma-separated host number per rank") from None
    if len(hosts) != world_size:
        raise ValueError(f"{ENV['hosts']}={text!r}: {len(hosts)} hosts for world_size={world_size}")
    return job, hosts


class _ControllerView:
    """What Communicator reads of the controller in a rank process."""

    def __init__(self, float_units: bool):
        self.float_units = float_units
        self.groups: dict[int, GroupInfo] = {}


# ---------------------------------------------------------------------- the API
_pg: ProcessGroup | None = None


class Work:
    """An outstanding collective (``async_op=True``). ``wait()`` blocks until it completed (raising its
    error, :class:`CollectiveError`, if it failed) and has written the result into the caller's array;
    it returns that array. ``is_completed()`` does not block."""

    def __init__(self, inner: _CommWork, finish):
        self._inner, self._finish, self._finished = inner, finish, False
        self.raised = False
        self._result = None

    @property
    def path(self) -> str | None:
        return self._inner.path

    @property
    def ranks(self) -> list[int] | None:
        """All-reduce: the ranks whose inputs the result holds (the group's, less the ranks that died
        before finishing it); None before it completed or for the other collectives."""
        got = getattr(self._inner, "contributors", None)
        return list(got) if got else None

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def wait(self, timeout: float | None = None):
        if not self._finished:
            if timeout is not None and not self._inner._done.wait(timeout):
                raise TimeoutError(f"Work.wait: not completed within {timeout} s")
            try:
                result = self._inner.wait()
            except CollectiveError:
                self.raised = True            # the caller has it: synchronize() does not raise it again
                raise
            self._result = self._finish(result)
            self._finished = True
        return self._result


def _env(name: str, value, cast=str):
    """`value`, else the CAIS_* variable, else torch's (:data:`TORCH_ENV`: RANK, WORLD_SIZE)."""
    if value is not None:
        return value
    var = ENV[name]
    text = os.environ.get(var)
    if (text is None or text == "") and name in ("rank", "world_size"):
        var = TORCH_ENV[name]
        text = os.environ.get(var)
    if text is None or text == "":
        return None
    try:
        return cast(text)
    except ValueError:
        raise ValueError(f"{var}={text!r}: not a valid {name}") from None


def interface_for(interface: str | None, rank: int | None) -> str | None:
    """``CAIS_IFACE`` may name each rank's interface with ``{rank}`` or ``{local_rank}`` (LOCAL_RANK, as
    torchrun sets it), so one value serves every process of a node (``CAIS_IFACE='h{local_rank}'``)."""
    if interface is None or "{" not in interface:
        return interface
    local = os.environ.get("LOCAL_RANK", rank)
    try:
        return interface.format(rank=rank, local_rank=local)
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"{ENV['interface']}={interface!r}: only {{rank}} and {{local_rank}} may be "
                         "filled in") from None


def init(interface: str | None = None, rank: int | None = None, world_size: int | None = None, *,
         switch: str | None = None, controller: str | None = None, config: Config | str | None = None,
         timeout: float | None = None, connect_timeout: float | None = None, master_addr: str | None = None,
         **overrides) -> ProcessGroup:
    """Join the cluster as `rank` of `world_size` on network interface `interface` (wired to switch port
    `rank`). Arguments not given come from the environment (:data:`ENV`: ``CAIS_IFACE``, ``CAIS_RANK``,
    ``CAIS_WORLD_SIZE``, ``CAIS_SWITCH``, ``CAIS_CONTROLLER``, ``CAIS_CONFIG``, ``CAIS_TIMEOUT``); where a
    CAIS_* variable is absent, torch's (:data:`TORCH_ENV`): ``RANK``, ``WORLD_SIZE``, and ``MASTER_ADDR``
    for the coordinator (``MASTER_ADDR:controller_port``; `master_addr` instead of ``MASTER_ADDR``: the
    torch backend passes the host of torch's TCP store, so that ``tcp://HOST:PORT`` serves as ``env://``
    does). ``CAIS_IFACE`` may hold ``{local_rank}``.

    `switch` is the switch's control endpoint (only rank 0 uses it: its process hosts the coordinator);
    `controller` the coordinator's endpoint (a Unix socket path, or HOST:PORT), default
    ``Config.controller_address:controller_port``. `config` is a :class:`Config` or a TOML path; keyword
    `overrides` replace its keys; :data:`DEPLOY_DEFAULTS` apply where neither says otherwise. `timeout`
    (seconds, default 60) bounds every collective. Errors: ValueError for missing or bad arguments,
    OSError for an interface that is not there, :class:`cais.endpoint.EndpointError` when the
    coordinator or the switch cannot be reached within `connect_timeout` seconds (``CAIS_CONNECT_TIMEOUT``,
    default 30: rank 0 may start last).
    """
    global _pg
    if _pg is not None:
        raise RuntimeError("cais.init: already initialized (cais.destroy_process_group() first)")
    rank = _env("rank", rank, int)
    interface = interface_for(_env("interface", interface), rank)
    world_size = _env("world_size", world_size, int)
    switch = _env("switch", switch)
    timeout = _env("timeout", timeout, float)
    connect_timeout = _env("connect_timeout", connect_timeout, float)
    if connect_timeout is None:
        connect_timeout = CONNECT_S
    if not 0 < connect_timeout < 1e6:
        raise ValueError(f"cais.init: connect_timeout={connect_timeout!r} ({ENV['connect_timeout']}): must be a "
                         "number of seconds > 0")
    missing = [ENV[k] for k, v in (("interface", interface), ("rank", rank), ("world_size", world_size))
               if v is None]
    if missing:
        raise ValueError(f"cais.init: give interface, rank and world_size (or set {', '.join(missing)})")
    cfg_path = _env("config", config if isinstance(config, str) else None)
    base = config if isinstance(config, Config) else Config.load(cfg_path)
    given = {k for k, v in base.as_dict().items() if v != getattr(Config(), k)}
    cfg = base.replace(**{k: v for k, v in DEPLOY_DEFAULTS.items() if k not in given}, **overrides)
    master = master_addr or os.environ.get(TORCH_ENV["controller"])
    controller = (_env("controller", controller) or (f"{master}:{cfg.controller_port}" if master else None)
                  or f"{cfg.controller_address}:{cfg.controller_port}")
    _pg = ProcessGroup(interface, int(rank), int(world_size), switch, controller, cfg,
                       DEFAULT_TIMEOUT_S if timeout is None else timeout, connect_timeout)
    return _pg


def init_process_group(backend: str = "cais", init_method: str | None = None, world_size: int | None = None,
                       rank: int | None = None, **kwargs) -> ProcessGroup:
    """torch's name for :func:`init`: `backend` must be "cais"; `init_method` "env://" (or None) reads the
    environment as :func:`init` does (CAIS_*, else RANK, WORLD_SIZE and MASTER_ADDR); the other keyword
    arguments are :func:`init`'s."""
    if backend != "cais":
        raise ValueError(f"init_process_group: backend={backend!r}: this is the cais driver (torch's own "
                         "backends: torch.distributed.init_process_group; 'cais' in torch: import cais.torch)")
    if init_method not in (None, "env://"):
        raise ValueError(f"init_process_group: init_method={init_method!r}: only env:// here (tcp:// and "
                         "file:// through torch.distributed with import cais.torch)")
    return init(rank=rank, world_size=world_size, **kwargs)


def is_initialized() -> bool:
    return _pg is not None


def _get() -> ProcessGroup:
    if _pg is None:
        raise RuntimeError("cais: call cais.init() first")
    return _pg


def get_rank() -> int:
    return _get().rank


def get_world_size() -> int:
    return _get().world_size


def destroy_process_group() -> None:
    """Wait for outstanding collectives, then leave (every rank calls it)."""
    global _pg
    if _pg is None:
        return
    pg, _pg = _pg, None
    try:
        _synchronize(pg)
    finally:
        pg.close()


def new_group(ranks) -> Group:
    """A group of `ranks`: every member calls it with the same list (the n-th call with a list makes the
    n-th group of those ranks); non-members may call it too, as in torch, and get None."""
    return _get().comm.new_group([int(r) for r in ranks])


def _as_array(obj) -> np.ndarray:
    """A writable numpy view of any buffer-protocol object (numpy arrays as they are)."""
    arr = obj if isinstance(obj, np.ndarray) else np.asarray(memoryview(obj))
    if not arr.flags.writeable:
        raise ValueError("the collective writes its result in place: the array must be writable")
    return arr


def _group_size(pg: ProcessGroup, group) -> int:
    return pg.world_size if group is None else len(group.ranks)


def _track(pg: ProcessGroup, work: Work, async_op: bool):
    if async_op:
        pg.outstanding.append(work)
        return work
    work.wait()
    return None


def _avg(total: np.ndarray, n: int, dtype) -> np.ndarray:
    """The mean from the sum: floats divided in float32/float64 and rounded once to their type (bf16 to
    bf16); integers (int64 too, exactly) truncated toward zero (as NCCL's integer average)."""
    if dtype is not None and str(dtype).lower() in ("bf16", "bfloat16") or dtype == proto.DType.BF16:
        as_f32 = numerics.bf16_to_f32(total) if total.dtype == np.uint16 else total.astype(np.float32)
        bits = numerics.f32_to_bf16(as_f32 / np.float32(n))
        return bits if total.dtype == np.uint16 else numerics.bf16_to_f32(bits)
    if total.dtype.kind == "f":
        wide = np.float64 if total.dtype == np.float64 else np.float32
        return (total.astype(wide) / wide(n)).astype(total.dtype)
    # in integers (no float64 in between: int64 sums beyond 2**53 stay exact); floor, then toward zero
    floor = total // n
    return (floor + ((total % n != 0) & (total < 0))).astype(total.dtype)


def _op_name(op) -> str:
    name = op.value if isinstance(op, ReduceOp) else str(getattr(op, "name", op)).lower()
    if name not in {o.value for o in ReduceOp}:
        raise ValueError(f"op={op!r}: expected one of {', '.join(o.name for o in ReduceOp)}")
    return name


def all_reduce(array, op=ReduceOp.SUM, group: Group | None = None, async_op: bool = False, dtype=None):
    """Reduce `array` over the group in place (:class:`ReduceOp`); element types as
    :meth:`cais.comm.Communicator.all_reduce` (int32/16/8, float32/16, bf16 with ``dtype="bf16"``, float64
    quantized). In the switch's slots when the controller offloads it, else on the host ring. int64 goes
    through the switch's int32 lanes exactly (:func:`cais.hostops.int64_all_reduce`); PRODUCT and the
    bitwise ops by an all-gather and a local fold (:func:`cais.hostops.fold_all_reduce`), those two at
    once (their Work is complete). Returns None, or a :class:`Work` with `async_op`."""
    pg = _get()
    arr = _as_array(array)
    name = _op_name(op)
    if name not in SWITCH_OPS or (arr.dtype == np.int64 and dtype is None):
        from . import hostops
        buf = np.ascontiguousarray(arr).copy()
        if name not in SWITCH_OPS:
            hostops.fold_all_reduce(primitives(pg), buf, name, group)
        else:
            hostops.int64_all_reduce(primitives(pg), buf, name, group)
        arr[...] = buf
        return _completed(pg, array, async_op)
    n = _group_size(pg, group)
    inner = pg.comm.all_reduce(arr, op="sum" if name == "avg" else name, group=group, async_op=True, dtype=dtype)
    pg.comm._outstanding.clear()      # this module tracks its own outstanding works

    def finish(result):
        # the mean over the ranks whose inputs are in the sum (fewer when a peer died during it)
        out = _avg(result, len(getattr(inner, "contributors", ()) or range(n)), dtype) if name == "avg" else result
        arr[...] = out.reshape(arr.shape)
        return array
    return _track(pg, Work(inner, finish), async_op)


def _completed(pg: ProcessGroup, value, async_op: bool):
    """A collective run at once: None, or (`async_op`) a complete :class:`Work` returning `value`."""
    if not async_op:
        return None
    inner = _CommWork(pg, pg.rank)
    inner._done.set()
    return Work(inner, lambda _result: value)


def broadcast(array, src: int, group: Group | None = None, async_op: bool = False):
    """Copy rank `src`'s `array` into every rank's `array` (same shape and dtype everywhere), in place.
    Through the switch's forwarding (one frame per chunk reaches every rank) when the group has a rule."""
    pg = _get()
    arr = _as_array(array)
    ranks = list(range(pg.world_size)) if group is None else list(group.ranks)
    if src not in ranks:
        raise ValueError(f"broadcast: src={src} is not in the group {ranks}")
    root = ranks.index(src)
    nbytes = arr.nbytes
    sizes = [nbytes if i == root else 0 for i in range(len(ranks))]
    own = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes() if pg.rank == src else b""
    inner = pg.submit_gather(own, sizes, [root], group, proto.OpType.BROADCAST)

    def finish(engine):
        arr[...] = engine.block(root, arr.dtype).reshape(arr.shape)
        return array
    return _track(pg, Work(inner, finish), async_op)


def all_gather(output, array, group: Group | None = None, async_op: bool = False):
    """Gather every rank's `array` (same shape and dtype everywhere) into `output`: a list of one array
    per rank (filled in place, torch's ``all_gather``) or one array of shape ``(ranks, *array.shape)``
    (``all_gather_into_tensor``). Through the switch's forwarding when the group has a rule."""
    pg = _get()
    arr = np.asarray(memoryview(array)) if not isinstance(array, np.ndarray) else array
    ranks = list(range(pg.world_size)) if group is None else list(group.ranks)
    n = len(ranks)
    if isinstance(output, (list, tuple)):
        if len(output) != n:
            raise ValueError(f"all_gather: output has {len(output)} arrays for {n} ranks")
        outs = [_as_array(o) for o in output]
        if any(o.shape != arr.shape or o.dtype != arr.dtype for o in outs):
            raise ValueError("all_gather: every output array must have the input's shape and dtype")
    else:
        big = _as_array(output)
        if big.shape != (n,) + arr.shape and big.size != n * arr.size:
            raise ValueError(f"all_gather: output shape {big.shape}, expected {(n,) + arr.shape}")
        outs = None
    own = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
    inner = pg.submit_gather(own, [arr.nbytes] * n, range(n), group, proto.OpType.ALL_GATHER)

    def finish(engine):
        blocks = [engine.block(i, arr.dtype).reshape(arr.shape) for i in range(n)]
        if outs is not None:
            for o, b in zip(outs, blocks):
                o[...] = b
        else:
            big.reshape((n,) + arr.shape)[...] = np.stack(blocks)
        return output
    return _track(pg, Work(inner, finish), async_op)


def reduce_scatter(output, input, op=ReduceOp.SUM, group: Group | None = None, async_op: bool = False):
    """Reduce `input` (``ranks x output.size`` elements, or a list of one array per rank) over the group
    and leave rank i's share (block i) in `output`, in place. SUM, MAX, MIN or AVG, integer and float
    types (the wire types of the switch), on the host ring (its reduce-scatter half)."""
    pg = _get()
    out = _as_array(output)
    ranks = list(range(pg.world_size)) if group is None else list(group.ranks)
    n = len(ranks)
    full = np.concatenate([np.asarray(x).reshape(-1) for x in input]) if isinstance(input, (list, tuple)) \
        else np.asarray(input).reshape(-1)
    if full.size != n * out.size:
        raise ValueError(f"reduce_scatter: input has {full.size} elements, expected {n} x {out.size}")
    if full.dtype != out.dtype:
        raise ValueError(f"reduce_scatter: input {full.dtype}, output {out.dtype}: must be the same")
    name = _op_name(op)
    if name not in SWITCH_OPS:
        raise ValueError(f"reduce_scatter: op={op!r}: expected one of {', '.join(o.upper() for o in SWITCH_OPS)}")
    wire = numerics.wire_dtype(full.dtype)
    if wire is None:
        raise TypeError(f"reduce_scatter: cannot reduce {full.dtype} (int32, int16, int8, float32, float16)")
    kind = CollectiveKind.make(wire, proto.ReduceOp["SUM" if name == "avg" else name.upper()])
    m = out.size
    # the ring leaves rank i with block i + 1: rotate the input by one block so that it is block i
    rotated = np.roll(full, m)
    inner = pg.submit_reduce_scatter(rotated.astype(native_dtype(wire)), kind, group)

    def finish(block):
        block = np.asarray(block, dtype=out.dtype)
        if block.size != m:
            raise CollectiveError(f"rank {pg.rank}: reduce_scatter: got {block.size} elements, expected {m}")
        out[...] = (_avg(block, n, None) if name == "avg" else block).reshape(out.shape)
        return output
    return _track(pg, Work(inner, finish), async_op)


def barrier(group: Group | None = None) -> None:
    """Return once every rank of the group has entered it (an all-reduce of one int32 through the data
    path: the switch or the ring, whichever the controller picks)."""
    pg = _get()
    token = np.ones(1, np.int32)
    work = all_reduce(token, group=group, async_op=True)
    pg.outstanding.remove(work)
    work.wait()
    if int(token[0]) != len(work.ranks):            # the group's ranks left (a dead one is dropped)
        raise CollectiveError(f"rank {pg.rank}: barrier counted {int(token[0])} ranks, expected "
                              f"{len(work.ranks)} ({work.ranks})")


def _synchronize(pg: ProcessGroup) -> None:
    works, pg.outstanding = pg.outstanding, []
    errors = []
    for w in works:
        if w.raised:
            continue                          # its wait() raised this error to the caller already
        try:
            w.wait()
        except CollectiveError as e:
            errors.append(e)
    if errors:
        raise errors[0]


def synchronize() -> None:
    """Wait for every collective started with ``async_op=True`` on this rank (raising the first error)."""
    _synchronize(_get())


# ---------------------------------------------------------------------- host-path collectives
class DistPrimitives:
    """This process's collectives as :mod:`cais.hostops` composes them (blocking, in place)."""

    def __init__(self, pg: ProcessGroup):
        self.pg, self.rank, self.world_size = pg, pg.rank, pg.world_size

    def group_ranks(self, group) -> list[int]:
        return list(range(self.world_size)) if group is None else list(group.ranks)

    def new_group(self, ranks):
        return new_group(ranks)

    def all_reduce(self, arr, op, group=None, dtype=None) -> str | None:
        work = all_reduce(arr, op, group, async_op=True, dtype=dtype)
        if work in self.pg.outstanding:
            self.pg.outstanding.remove(work)
        work.wait()
        ranks = self.group_ranks(group)
        if work.ranks is not None and len(work.ranks) < len(ranks):
            raise CollectiveError(f"rank {self.rank}: all_reduce: rank(s) {sorted(set(ranks) - set(work.ranks))} "
                                  "died during it; a composed collective cannot go on without them")
        return work.path

    def broadcast(self, arr, src, group=None):
        broadcast(arr, src, group)

    def all_gather(self, out, arr, group=None):
        all_gather(out, arr, group)


def primitives(pg: ProcessGroup | None = None) -> DistPrimitives:
    """The one :class:`DistPrimitives` of `pg` (default: this process's): what hostops keeps in it (the
    send/recv pairs' groups, each a switch rule) is made once, not per call."""
    pg = _get() if pg is None else pg
    if pg._primitives is None:
        pg._primitives = DistPrimitives(pg)
    return pg._primitives


def _host(name, *args, async_op: bool = False, result=None):
    """Run hostops.`name` on this process's primitives at once (the returned Work, if any, is complete)."""
    from . import hostops
    pg = _get()
    getattr(hostops, name)(primitives(pg), *args)
    return _completed(pg, result, async_op)


def reduce(array, dst: int, op=ReduceOp.SUM, group: Group | None = None, async_op: bool = False):
    """Reduce every rank's `array` into rank `dst`'s, in place (an all-reduce through the switch; the other
    ranks' arrays keep their input). Runs at once."""
    pg = _get()
    arr = _as_array(array)
    name = _op_name(op)
    buf = np.ascontiguousarray(arr).copy()
    out = _host("reduce", buf, dst, name, group, async_op=async_op, result=array)
    if pg.rank == dst:
        arr[...] = buf
    return out


def gather(array, gather_list=None, dst: int = 0, group: Group | None = None, async_op: bool = False):
    """Rank `dst` gets every rank's `array` in `gather_list` (a list of one array per rank, or one array of
    shape ``(ranks, *array.shape)``); the others pass None. An all-gather forwarded by the switch."""
    pg = _get()
    arr = np.asarray(array)
    stacked = None
    if pg.rank == dst:
        if gather_list is None:
            raise ValueError(f"gather: rank {dst} (dst) needs a gather_list")
        stacked = np.empty((_group_size(pg, group),) + arr.shape, arr.dtype)
    out = _host("gather", arr, stacked, dst, group, async_op=async_op, result=gather_list)
    if stacked is not None:
        _fill(gather_list, stacked, "gather")
    return out


def scatter(array, scatter_list=None, src: int = 0, group: Group | None = None, async_op: bool = False):
    """Rank i of the group gets block i of rank `src`'s `scatter_list` (a list of one array per rank, or one
    array of shape ``(ranks, *array.shape)``) in `array`, in place. A broadcast of every block."""
    pg = _get()
    arr = _as_array(array)
    blocks = None
    if pg.rank == src:
        if scatter_list is None:
            raise ValueError(f"scatter: rank {src} (src) needs a scatter_list")
        blocks = _stack(scatter_list)
    buf = np.empty(arr.shape, arr.dtype)
    out = _host("scatter", buf, blocks, src, group, async_op=async_op, result=array)
    arr[...] = buf
    return out


def all_to_all(output, input, group: Group | None = None, async_op: bool = False):
    """Rank i's block j of `input` ends as block i of rank j's `output` (lists of one array per rank, or
    arrays whose first dimension is the group size; equal blocks). An all-gather and a local selection."""
    blocks = _stack(input)
    out = np.empty_like(blocks)
    done = _host("all_to_all", out, blocks, group, async_op=async_op, result=output)
    _fill(output, out, "all_to_all")
    return done


def send(array, dst: int) -> None:
    """Send `array` to rank `dst`, which calls :func:`recv` with an array of the same size and type
    (through the switch's forwarding, in a group of the two made on their first exchange)."""
    _host("send", np.asarray(array), dst)


def recv(array, src: int) -> None:
    """Receive into `array` (in place) what rank `src` sends."""
    arr = _as_array(array)
    buf = np.empty(arr.shape, arr.dtype)
    _host("recv", buf, src)
    arr[...] = buf


def _stack(blocks) -> np.ndarray:
    if isinstance(blocks, (list, tuple)):
        arrs = [np.asarray(b) for b in blocks]
        if len({(a.shape, a.dtype) for a in arrs}) > 1:
            raise ValueError("every block must have the same shape and type")
        return np.stack(arrs)
    return np.ascontiguousarray(blocks)


def _fill(dest, stacked: np.ndarray, what: str) -> None:
    if isinstance(dest, (list, tuple)):
        if len(dest) != len(stacked):
            raise ValueError(f"{what}: {len(dest)} output arrays for {len(stacked)} ranks")
        for d, b in zip(dest, stacked):
            _as_array(d)[...] = b.reshape(np.shape(d))
    else:
        _as_array(dest)[...] = stacked.reshape(np.shape(dest))
