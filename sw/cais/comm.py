"""The collective API, and the world that runs every rank against one switch.

Each rank runs the caller's function in its own thread with its own :class:`Communicator`, exactly as
separate processes would::

    def train(comm):
        grads = np.arange(1000, dtype=np.int32) * (comm.rank + 1)
        return comm.all_reduce(grads)                   # blocks; async_op=True returns a Work

    results = run_sync(World(link, ranks=4).run(train))    # on the reference model; see cais.sim.backends

The world advances the switch only when every rank thread is blocked in a collective (or finished), so
a seeded scenario gives the same frames whatever the threads' timing: the co-simulation is
deterministic. Per collective the controller decides switch or host ring (and types the group's rule for
the collective's element type and operator); the protocol engines (:class:`cais.allreduce.SwitchAllReduce`,
:class:`cais.ring.RingAllReduce`) make the frames.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import numerics
from . import protocol as proto
from . import quantize
from .allreduce import CollectiveKind, SwitchAllReduce
from .config import Config
from .controller import Controller, GroupInfo, decision_line
from .link import SwitchLink
from .numerics import native_dtype, wire_dtype
from .registers import register_map

__all__ = ["World", "Communicator", "Work", "Group", "host_mac", "CollectiveError", "RankKilled", "ring_op_id"]

log = logging.getLogger("cais.comm")

ACTIVE_STEP = 32        # cycles per world step while the controller has register work waiting
IDLE_CHECK = 256        # cycles of silence before the world may jump ahead to the next timer; also the
                        # longest step while waiting for a frame to come out


def host_mac(rank: int) -> int:
    """The MAC address of rank `rank`'s NIC (locally administered)."""
    return 0x02_00_00_00_01_00 | rank


class CollectiveError(RuntimeError):
    """A collective could not complete (a rank failed, or every path was exhausted)."""


class RankKilled(CollectiveError):
    """Raised in the thread of a rank :meth:`World.kill` killed: it ends there, and its result is None."""


RING_EPOCH_SHIFT = 24       # a redone collective's ring frames carry its epoch above bit 24 of op_seq


def ring_op_id(op_seq: int, epoch: int) -> int:
    """The op_seq field of a collective's host-ring frames: the collective's op_seq at epoch 0; a redo
    after ranks were dropped (epoch e > 0) puts e in the top byte, so no frame of the abandoned ring,
    still in flight, is taken by the new one (whose ranks, hence blocks, differ)."""
    if epoch == 0:
        return op_seq
    if not 0 < epoch < 1 << (32 - RING_EPOCH_SHIFT):
        raise ValueError(f"epoch {epoch}: must be in 0..{(1 << (32 - RING_EPOCH_SHIFT)) - 1}")
    return (op_seq & ((1 << RING_EPOCH_SHIFT) - 1)) | epoch << RING_EPOCH_SHIFT


@dataclass(frozen=True)
class Group:
    """A group of ranks, as returned by :meth:`Communicator.new_group`."""
    group_id: int
    ranks: tuple[int, ...]


class Work:
    """An outstanding collective. ``wait()`` blocks until it completed and returns its result."""

    def __init__(self, world: "World", rank: int):
        self._world, self._rank = world, rank
        self._done = threading.Event()
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None
        self.path: str | None = None      # "switch" or "ring", once decided
        self.numerics: str = "native"     # "native": reduced in the wire type; "quantized": floats via int32
        self.dtype: proto.DType | None = None   # the wire type ("quantized": the input's, before quantization)

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> np.ndarray:
        self._world._block_until(self._rank, self._done)
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Collective:
    work: Work
    group: GroupInfo
    op_seq: int
    data: np.ndarray                 # 1-D values of the wire type (bf16: uint16 bits)
    kind: CollectiveKind
    shape: tuple
    convert: Callable[[np.ndarray], np.ndarray] | None = None   # wire values -> what the caller gets
    engine: Any = None
    path: str | None = None
    held: bool = False               # finished here, result withheld until every rank of the group has it
    delivered: bool = False
    epoch: int = 0                   # the controller's op_epoch this rank runs it at (a redo: higher)
    reported: bool = False           # finished told to the controller at this epoch

    @property
    def op(self) -> proto.ReduceOp:
        return self.kind.op

    @property
    def order_sensitive(self) -> bool:
        """The switch's and the ring's answers may differ in their bits (float rounding, saturation):
        a rank's switch result is only handed out once no peer can fall back to the ring."""
        return (self.kind.is_float or self.kind.saturate) and not self.kind.reproducible


@dataclass
class _RankState:
    rank: int
    port: int
    mac: int
    queue: list = field(default_factory=list)          # collectives not started, in call order
    current: _Collective | None = None
    background: list = field(default_factory=list)     # ring engines still owed to peers, finished ops
    lingering: list = field(default_factory=list)      # switch ops done here, not yet by every rank
    op_seq: dict = field(default_factory=dict)         # group id -> next op_seq
    group_calls: dict = field(default_factory=dict)    # ranks -> new_group calls with them so far
    dead: bool = False                                 # killed (World.kill): sends and takes nothing


class Communicator:
    """One rank's handle on the world: the collective API."""

    def __init__(self, world: "World", rank: int):
        self._world = world
        self.rank = rank
        self._outstanding: list[Work] = []

    @property
    def world_size(self) -> int:
        return self._world.ranks

    def wait_all(self) -> list[np.ndarray]:
        """Wait for every collective this rank started with `async_op` and not waited for yet; returns
        their results in the order they were started."""
        works, self._outstanding = self._outstanding, []
        return [w.wait() for w in works]

    def new_group(self, ranks) -> Group | None:
        """Create a group: every member calls it with the same ranks (the n-th call with a list of ranks
        makes the n-th group of those ranks); non-members may call it too (as in torch) and get None."""
        return self._world._new_group(self.rank, list(ranks))

    def all_reduce(self, array, op=proto.ReduceOp.SUM, group: Group | None = None, async_op: bool = False,
                   dtype=None):
        """All-reduce `array` (any shape) over the group (default: every rank); `op` is "sum", "max" or
        "min" (or a :class:`~cais.protocol.ReduceOp`).

        Returns the reduced array (same shape and dtype as `array`), or a :class:`Work` when `async_op`.

        * int32, int16, int8: reduced in their own type by the switch (or the host ring). SUM wraps modulo
          2**bits, exact whenever the final sum fits; with ``Config.saturate`` int16/int8 sums clamp to the
          type's range at every addition instead (order dependent unless ``Config.reproducible``).
        * float32, float16: with ``Config.float_mode = "native"`` (the default) and a switch with float
          units (its FEATURES register), reduced as fp32/fp16 in the switch (IEEE round to nearest even at
          every addition, NaN canonical: :mod:`cais.numerics`; fp16 SUM accumulated in fp32 and rounded
          once when ``Config.accumulate = "fp32"``, the default). NaN and inf are allowed there. Otherwise
          (``float_mode = "quantize"`` or no float units) by host-side quantization to int32
          (:mod:`cais.quantize`: SUM within a documented bound, MAX/MIN exact; NaN, and inf for SUM,
          raise ValueError).
        * bfloat16: numpy has no such type; pass ``dtype="bf16"`` (or :attr:`DType.BF16`) with either a
          float32 array (rounded once to bf16 here, :func:`cais.numerics.f32_to_bf16`; the result comes
          back as float32 holding bf16 values) or a uint16 array of bf16 bit patterns (the result is
          uint16 bits). Reduced like fp16 (native or quantized, by the same rules).
        * float64: always host-side quantization.
        * ``Config.reproducible``: float results (and saturating sums) do not depend on the order in
          which contributions arrive: the switch folds them in ascending port order, and the host fallback
          gives the same bits (docs/driver.md).

        `dtype` (a DType or its name: "int32", "int16", "int8", "fp32"/"float32", "fp16"/"float16",
        "bf16"/"bfloat16") names the wire type; it must be the array's own type except for bf16 as above.
        Other dtypes raise TypeError naming the dtype. A native collective is asynchronous with
        `async_op`; a quantized one runs its steps at once, so its Work is already complete.
        ``Work.path`` is "switch" or "ring", ``Work.numerics`` "native" or "quantized".
        """
        array = np.asarray(array)
        op = proto.ReduceOp[op.upper()] if isinstance(op, str) else proto.ReduceOp(op)
        wire, values, convert = self._wire_values(array, dtype)
        config = self._world.config
        native = wire is not None and (
            wire not in proto.FLOAT_DTYPES
            or (config.float_mode == "native" and self._world.controller.float_units))
        if native:
            kind = CollectiveKind.make(wire, op, acc_fp32=config.accumulate == "fp32", saturate=config.saturate,
                                       reproducible=config.reproducible)
            work = self._world._submit(self.rank, values, kind, group, shape=array.shape, convert=convert)
            work.dtype = wire
            if async_op:
                self._outstanding.append(work)
                return work
            return work.wait()
        work = Work(self._world, self.rank)
        work.numerics, work.dtype = "quantized", wire
        if wire == proto.DType.BF16:
            # quantize the bf16 values as float32 (exact), round the float32 result to bf16 once
            out = self._float_all_reduce(numerics.bf16_to_f32(values), op, group, work)
            out = numerics.f32_to_bf16(out)
        else:
            out = self._float_all_reduce(array.reshape(-1) if wire is None else values, op, group, work)
        work.result = (convert(out) if convert else out).reshape(array.shape)
        work._done.set()
        if async_op:
            self._outstanding.append(work)
            return work
        return work.result

    def _wire_values(self, array: np.ndarray, dtype):
        """(wire type or None for float64, 1-D wire values, conversion of the result back to the caller's
        type or None)."""
        if dtype is not None:
            want = _parse_dtype(dtype)
            if want == proto.DType.BF16:
                if array.dtype == np.float32:
                    return want, numerics.f32_to_bf16(array.reshape(-1)), numerics.bf16_to_f32
                if array.dtype == np.uint16:
                    return want, array.reshape(-1).astype(np.uint16), None
                raise TypeError(f"all_reduce(dtype=bf16): the array must be float32 (rounded to bf16) or uint16 "
                                f"(bf16 bit patterns), not {array.dtype}")
            if wire_dtype(array.dtype) != want:
                raise TypeError(f"all_reduce(dtype={want.name.lower()}): the array is {array.dtype}; only bf16 "
                                f"may differ from the array's own type")
        if array.dtype == np.float64:
            return None, array.reshape(-1), None
        wire = wire_dtype(array.dtype)
        if wire is None:
            raise TypeError(f"all_reduce: cannot reduce {array.dtype} arrays (int32, int16, int8, float16, "
                            f"float32, float64; bf16 with dtype='bf16')")
        return wire, array.reshape(-1).astype(native_dtype(wire)), None

    def _float_all_reduce(self, flat: np.ndarray, op: proto.ReduceOp, group: Group | None, work: Work):
        """The int32 collectives of a quantized float all-reduce, one after the other (docs/driver.md);
        returns the 1-D result in `flat`'s dtype."""
        def int32_all_reduce(ints, int_op):
            step = self._world._submit(self.rank, ints, CollectiveKind.make(proto.DType.INT32, int_op), group)
            out = step.wait()
            work.path = step.path
            return out

        if op == proto.ReduceOp.SUM:
            n = len(group.ranks) if group is not None else self._world.ranks
            per_chunk = self._world.config.chunk_size // 4      # the driver's chunks: a scale per chunk
            e_max = int32_all_reduce(quantize.chunk_exponents(flat, per_chunk), proto.ReduceOp.MAX)
            total = int32_all_reduce(quantize.quantize(flat, e_max, n, per_chunk), proto.ReduceOp.SUM)
            return quantize.dequantize(total, e_max, n, per_chunk, flat.dtype)
        if flat.dtype == np.float64:
            hi, lo = quantize.order_keys64(flat)
            hi_red = int32_all_reduce(hi, op)
            lo_red = int32_all_reduce(quantize.tied_low_keys(hi, lo, hi_red, op == proto.ReduceOp.MAX), op)
            return quantize.from_order_keys64(hi_red, lo_red)
        return quantize.from_order_keys(int32_all_reduce(quantize.order_keys(flat), op), flat.dtype)


_DTYPE_NAMES = {"int32": proto.DType.INT32, "int16": proto.DType.INT16, "int8": proto.DType.INT8,
                "fp32": proto.DType.FP32, "float32": proto.DType.FP32, "fp16": proto.DType.FP16,
                "float16": proto.DType.FP16, "bf16": proto.DType.BF16, "bfloat16": proto.DType.BF16}


def _parse_dtype(dtype) -> proto.DType:
    if isinstance(dtype, proto.DType):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise TypeError(f"dtype={dtype!r}: expected a cais.protocol.DType or one of {', '.join(_DTYPE_NAMES)}")


class World:
    """All ranks, the controller and the switch link; :meth:`run` is the co-simulation loop."""

    def __init__(self, link: SwitchLink, ranks: int | None = None, config: Config | None = None,
                 rank_ports: list[int] | None = None):
        self.link = link
        self.params = link.params
        self.config = config or Config()
        self.ranks = ranks if ranks is not None else self.params.ports
        if not 1 <= self.ranks <= self.params.ports:
            raise ValueError(f"ranks={self.ranks}: the switch has {self.params.ports} ports")
        if self.config.chunk_size > self.params.max_payload:
            raise ValueError(f"chunk_size={self.config.chunk_size} exceeds the switch's max payload "
                             f"{self.params.max_payload}")
        ports = rank_ports or list(range(self.ranks))
        self._states = [_RankState(r, ports[r], host_mac(r)) for r in range(self.ranks)]
        self._by_port = {s.port: s for s in self._states}
        self.controller = Controller(link, self.config, ports, [s.mac for s in self._states])
        self.regs = register_map(self.params)
        self._cv = threading.Condition()
        self._runnable = 0
        self._waiting: dict[int, threading.Event] = {}   # rank -> the event its thread is blocked on
        self._group_requests: list[tuple[int, list[int], threading.Event, list]] = []
        self._groups_by_key: dict = {}
        self._world_group: GroupInfo | None = None
        self._errors: list[BaseException] = []
        self._ring_done: dict[tuple[int, int], set[int]] = {}
        self.progress_hook: Callable[["World"], None] | None = None   # called now and then by run()
        self.frames_sent = [0] * self.ranks
        self.bytes_sent = [0] * self.ranks
        self.retransmissions = [0] * self.ranks
        self.collectives: list[dict] = []
        self.killed: dict[int, float] = {}        # rank -> when World.kill killed it (seconds of switch time)

    def progress(self) -> tuple[int, int]:
        """(chunks done, chunks) of the collectives the ranks are running now."""
        done = total = 0
        for s in self._states:
            c = s.current
            if c is not None and c.path == "switch":
                total += c.engine.nchunks
                done += c.engine.chunks_done
        return done, total

    @property
    def now(self) -> float:
        return self.link.cycle / self.link.clock_hz

    # ---------------------------------------------------------------- called from rank threads
    def _block_until(self, rank: int, event: threading.Event) -> None:
        with self._cv:
            if not event.is_set():
                self._waiting[rank] = event
                self._runnable -= 1
                self._cv.notify_all()
                while not event.is_set():
                    self._cv.wait()
            if self._states[rank].dead:
                raise RankKilled(f"rank {rank} was killed")

    def kill(self, rank: int) -> None:
        """Kill a rank as SIGKILL kills a process (call it from the world's thread, e.g. from a link the
        world advances): from now on it sends nothing and takes no frame, its collectives are gone, and
        its thread ends with :class:`RankKilled` (its result is None). Nothing tells the controller: it
        learns of the death from the switch (a set that ages without the rank's contribution) or from the
        rank never finishing a collective its peers finished (docs/reliability.md, "Dead ranks")."""
        s = self._states[rank]
        if s.dead:
            return
        s.dead = True
        self.killed[rank] = self.now
        works = [c.work for c in s.queue + s.background + s.lingering + ([s.current] if s.current else [])]
        s.queue, s.background, s.lingering, s.current = [], [], [], None
        with self._cv:
            for w in works:
                if not w._done.is_set():
                    w.error = RankKilled(f"rank {rank} was killed")
                    self._wake(w._done)
            waited = self._waiting.get(rank)
            if waited is not None:      # blocked elsewhere (new_group): _block_until raises when it wakes
                self._wake(waited)

    def _wake(self, event: threading.Event) -> None:
        """Set an event (world thread, under the lock). The rank becomes runnable again only if it is
        blocked on this very event: a collective finishing while its rank waits for another one (two
        async calls, then the second's wait) must not count that rank as running."""
        if event.is_set():
            return
        event.set()
        for rank, waited in self._waiting.items():
            if waited is event:
                del self._waiting[rank]
                self._runnable += 1
                break
        self._cv.notify_all()

    def _new_group(self, rank: int, ranks: list[int]) -> Group | None:
        if rank not in ranks:
            return None      # torch style: every rank may call it; the others get no group
        state = self._states[rank]
        # the n-th group of these ranks: members match up whether or not non-members call too
        key = (tuple(ranks), state.group_calls.get(tuple(ranks), 0))
        state.group_calls[tuple(ranks)] = key[1] + 1
        done, box = threading.Event(), []
        with self._cv:
            self._group_requests.append((rank, key, done, box))
        self._block_until(rank, done)
        info = box[0]
        return Group(info.group_id, info.ranks)

    def _submit(self, rank: int, values: np.ndarray, kind: CollectiveKind, group: Group | None,
                shape: tuple | None = None, convert=None) -> Work:
        """Queue a collective of wire values `values` (their type: ``native_dtype(kind.dtype)``)."""
        work = Work(self, rank)
        with self._cv:
            info = self.controller.groups[group.group_id] if group else self._world_group
            if rank not in info.ranks:
                raise ValueError(f"rank {rank} is not in group {info.group_id} {list(info.ranks)}")
            state = self._states[rank]
            op_seq = state.op_seq.get(info.group_id, 0)
            flat = np.ascontiguousarray(values.reshape(-1)).astype(native_dtype(kind.dtype), copy=True)
            state.op_seq[info.group_id] = op_seq + 1
            state.queue.append(_Collective(work, info, op_seq, flat, kind,
                                           values.shape if shape is None else shape, convert))
        return work

    # ---------------------------------------------------------------- the loop
    async def run(self, fn: Callable[[Communicator], Any]) -> list[Any]:
        """Run `fn(comm)` on every rank concurrently; returns each rank's return value."""
        await self.controller.start()
        self._world_group = await self.controller.create_group(list(range(self.ranks)))
        results: list[Any] = [None] * self.ranks
        finished = [False] * self.ranks

        def body(rank):
            try:
                results[rank] = fn(Communicator(self, rank))
            except BaseException as e:   # reported by the world thread (a killed rank's end is not an error)
                if not (isinstance(e, RankKilled) and self._states[rank].dead):
                    self._errors.append(e)
            finally:
                with self._cv:
                    finished[rank] = True
                    self._runnable -= 1
                    self._cv.notify_all()

        threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(self.ranks)]
        with self._cv:
            self._runnable = self.ranks
        for t in threads:
            t.start()
        quiet = steps = 0
        last_state = None
        to_frames = hasattr(self.link, "advance_to_frame")
        while True:
            steps += 1
            if self.progress_hook is not None and steps % 256 == 0:
                self.progress_hook(self)
            with self._cv:
                while self._runnable > 0:
                    self._cv.wait()
                if self._errors:
                    raise self._errors[0]
                all_done = all(finished)
                requests = bool(self._group_requests)      # every rank thread is blocked: none comes later
            if all_done and not any(s.background or s.current or s.queue
                                    or any(c.held and not c.delivered for c in s.lingering)
                                    for s in self._states):
                break
            if requests:
                await self._serve_groups()
            sent = self._step_engines()
            await self.controller.service(self.now)
            if not sent:     # (a step that sends frames ends with quiet 0 whatever the state did)
                state = self._progress_state()
                if state != last_state:          # a collective moved on without a frame: not quiet
                    quiet, last_state = 0, state
            step, to_frame = ACTIVE_STEP, False
            if (not sent and quiet >= IDLE_CHECK and self._nothing_in_flight()
                    and await self.link.read(self.regs["BUSY"].address()) == 0):
                # Nothing moves: jump to the next retransmission timer, or report a hang.
                deadline = self._next_deadline()
                if deadline is not None:
                    step = max(ACTIVE_STEP, int((deadline - self.now) * self.link.clock_hz) + 1)
                elif await self._stuck():
                    raise CollectiveError(self._stuck_report())
            elif not self.controller.pending and to_frames:
                # Frames are moving: nothing changes for the driver until one comes out or a timer fires.
                step, to_frame = self._cycles_to_timer(IDLE_CHECK), True
            if to_frame:
                step = await self.link.advance_to_frame(step)
            else:
                await self.link.advance(step)
            received = self.link.take_received()
            quiet = 0 if (received or sent) else quiet + step
            self._deliver(received)
        for t in threads:
            t.join()
        return results

    async def _serve_groups(self) -> None:
        with self._cv:
            requests, self._group_requests = self._group_requests, []
        for rank, key, done, box in sorted(requests, key=lambda r: r[0]):
            if key not in self._groups_by_key:
                self._groups_by_key[key] = await self.controller.create_group(list(key[0]))
            box.append(self._groups_by_key[key])
            with self._cv:
                self._wake(done)

    def _nothing_in_flight(self) -> bool:
        idle = getattr(self.link, "idle", None)
        return idle() if idle else True

    def _progress_state(self) -> tuple:
        """What changes when a collective moves on (queued, decided, started, finished, fallen back, a rank
        dropped)."""
        return (self.controller.decision_count, len(self.controller.dropped)) + tuple(
            (len(s.queue), len(s.background), len(s.lingering),
             None if s.current is None else (id(s.current), s.current.path, s.current.engine is None))
            for s in self._states)

    def _cycles_to_timer(self, limit: int) -> int:
        """Cycles until the next engine timer or controller evaluation is due (1 to ``limit``)."""
        earliest = self.controller.next_evaluation
        deadline = self._next_deadline()
        if deadline is not None and deadline < earliest:
            earliest = deadline
        cycles = int((earliest - self.now) * self.link.clock_hz) + 1
        return limit if cycles > limit else cycles if cycles > 1 else 1      # (min and max cost more, per step)

    def _next_deadline(self) -> float | None:
        deadlines = []
        for s in self._states:
            c = s.current
            if c is not None and c.path == "switch" and c.engine.failed:
                return self.now          # moves to the ring at the next step
            if c is not None and c.engine is not None:
                d = c.engine.next_deadline()
                if d is not None:
                    deadlines.append(d)
            for b in s.background:
                d = b.engine.next_deadline()
                if d is not None:
                    deadlines.append(d)
        timer = self.controller.next_timer()     # dead-rank checks while a collective waits
        if timer is not None:
            deadlines.append(timer if timer > self.now else self.now)
        return min(deadlines) if deadlines else None

    async def _stuck(self) -> bool:
        """Whether collectives wait for nothing that can come; called when no frame moves, no timer is
        pending and the switch reads idle."""
        if self.controller.pending:
            # Decisions wait for register work that waits for an idle switch: it is, so do the work now.
            # Work still pending with the switch idle (not merely a frame held on a wire) never gets done.
            await self.controller.service(self.now)
            return self.controller.pending and await self.controller.switch_idle()
        return any(s.current or s.queue for s in self._states)

    def _stuck_report(self) -> str:
        lines = ["the co-simulation is stuck: no frame moves and no timer is pending"]
        for s in self._states:
            if s.current:
                c = s.current
                lines.append(f"rank {s.rank}: collective {c.op_seq} of group {c.group.group_id} "
                             f"({c.path or 'undecided'})")
        return "; ".join(lines + self.controller.pending_work())

    # ---------------------------------------------------------------- per step
    def _start_ring(self, state: _RankState, c: _Collective) -> None:
        from .ring import RingAllReduce
        ring_macs = [host_mac(r) for r in c.group.ranks]
        k = c.kind
        # a reproducible fold follows the ports' order, as the switch's does
        order = sorted(range(len(c.group.ranks)), key=lambda i: c.group.ports[i])
        c.epoch = self.controller.op_epoch(c.group.group_id, c.op_seq)
        c.engine = RingAllReduce(c.group.ranks.index(state.rank), ring_macs, c.group.group_id,
                                 ring_op_id(c.op_seq, c.epoch), c.data,
                                 c.op, state.mac, self.config.timeout_s, now=self.now, dtype=k.dtype,
                                 saturate=k.saturate, reproducible=k.reproducible, acc_fp32=k.acc_fp32,
                                 fold_order=order, window=self.config.ring_window)
        c.path = "ring"

    def _step_engines(self) -> int:
        """Decide, start, poll and finish collectives on every rank; returns frames sent."""
        now, ctl, sent, send = self.now, self.controller, 0, self.link.send
        ctl_fell_back = ctl.fell_back
        for s in self._states:
            if s.dead:
                continue
            if ctl.dropped:
                self._follow_drops(s)
            # Collectives this rank finished on the switch that a peer moved to the ring: join the ring.
            # A withheld switch result is handed out once every rank finished on the switch; if a peer fell
            # back instead, this rank takes the ring's result, so every rank gets the same bits.
            for c in list(s.lingering) if s.lingering else ():
                if ctl_fell_back(c.group.group_id, c.op_seq):
                    s.lingering.remove(c)
                    self._start_ring(s, c)
                    s.background.append(c)
                elif ctl.all_finished(c.group.group_id, c.op_seq):
                    s.lingering.remove(c)
                    if c.held:
                        self._deliver_result(s, c)
            if s.current is None and s.queue:
                s.current = s.queue.pop(0)
            c = s.current
            if c is not None and c.engine is None:
                decision = ctl.decide(c.group.group_id, c.op_seq, c.data.nbytes, now, c.kind)
                if decision is not None:
                    log.info(decision_line(s.rank, c.group.group_id, c.op_seq, decision.as_dict()))
                    if decision.offload:
                        c.engine = SwitchAllReduce(
                            data=c.data, op=c.op, group_id=c.group.group_id, seq_base=decision.seq_base,
                            slot_count=c.group.slot_count, window=self.config.max_pending_chunks,
                            chunk_size=decision.chunk_bytes, timeout_s=self.config.timeout_s,
                            retry_limit=self.config.retry_limit, mac=s.mac, layer_id=c.op_seq, now=now,
                            dtype=c.kind.dtype)
                        c.path = "switch"
                    else:
                        self._start_ring(s, c)
                    c.work.path = c.path
            if c is not None and c.path == "switch":
                fell_back = ctl_fell_back(c.group.group_id, c.op_seq)
                if c.engine.failed and not fell_back:
                    ctl.request_fallback(c.group.group_id, c.op_seq, s.rank, now,
                                         f"a chunk ran out of {self.config.retry_limit} retries")
                    fell_back = ctl_fell_back(c.group.group_id, c.op_seq)
                if fell_back:
                    self._account(s, c.engine)
                    self._start_ring(s, c)
                    c.work.path = "ring"
            # the rank's engines: its current collective's, then the background ones (no list built per step)
            if c is not None and c.engine is not None:
                frames = c.engine.poll(now)
                for frame in frames:
                    send(s.port, frame)
                sent += len(frames)
            for b in s.background:
                frames = b.engine.poll(now)
                for frame in frames:
                    send(s.port, frame)
                sent += len(frames)
            if c is not None and c.engine is not None:
                ready = c.engine.done if c.path == "switch" else c.engine.result_ready
                if ready:
                    self._finish(s, c)
            for b in list(s.background) if s.background else ():
                if not b.reported and b.engine.result_ready:      # a redo this rank ran in the background
                    ctl.finished(s.rank, b.group.group_id, b.op_seq)
                    b.reported = True
                if (b.held and not b.delivered and b.engine.result_ready
                        and ctl.all_finished(b.group.group_id, b.op_seq)):
                    self._deliver_result(s, b)
                if b.engine.done:
                    key = (b.group.group_id, b.op_seq, b.epoch)
                    self._ring_done.setdefault(key, set()).add(s.rank)
        # A finished ring engine keeps answering its predecessor (whose last acknowledgement may have been
        # lost) until every rank's engine of that collective is done.
        for s in self._states:
            for b in list(s.background) if s.background else ():
                if self._ring_done.get((b.group.group_id, b.op_seq, b.epoch), set()) >= set(b.group.ranks):
                    s.background.remove(b)
                    self._account(s, b.engine)
        return sent

    def _follow_drops(self, s: _RankState) -> None:
        """The controller dropped ranks from a collective this rank has not handed out yet (its op_epoch
        moved on): a rank dropped itself fails it; a rank left redoes it on the host ring among the ranks
        left, from its own input, and its result is held until every one of them has finished."""
        ctl = self.controller
        if not ctl.dropped:      # no rank was ever dropped: every group is whole, every collective at epoch 0
            return
        running = ([s.current] if s.current is not None else []) + s.lingering + [
            b for b in s.background if not b.delivered]
        for c in running:
            g = c.group.group_id
            if s.rank not in c.group.ranks:
                for where in (s.lingering, s.background):
                    if c in where:
                        where.remove(c)
                if s.current is c:
                    s.current = None
                why = c.group.dropped.get(s.rank, "not a member any more")
                with self._cv:
                    c.work.error = CollectiveError(f"rank {s.rank} was dropped from group {g}: {why}")
                    self._wake(c.work._done)
                continue
            if c.engine is None or c.epoch == ctl.op_epoch(g, c.op_seq):
                continue
            if c not in s.lingering:            # a lingering switch engine is accounted already
                self._account(s, c.engine)
            self._start_ring(s, c)
            c.work.path, c.reported = "ring", False
            if c is not s.current:
                if c in s.lingering:
                    s.lingering.remove(c)
                    s.background.append(c)
                c.held = True

    def _account(self, s: _RankState, engine) -> None:
        self.frames_sent[s.rank] += engine.frames_sent
        self.bytes_sent[s.rank] += engine.bytes_sent
        self.retransmissions[s.rank] += engine.retransmissions

    def _finish(self, s: _RankState, c: _Collective) -> None:
        self.controller.finished(s.rank, c.group.group_id, c.op_seq)
        c.reported = True
        if c.path == "switch":
            if c.engine.first_rtt is not None:
                self.controller.report_rtts([c.engine.first_rtt])
            self._account(s, c.engine)
            s.lingering.append(c)
            c.held = c.order_sensitive and not self.controller.all_finished(c.group.group_id, c.op_seq)
        else:
            s.background.append(c)   # keeps serving its peers until every frame of it is acknowledged
            # held until every rank has it: a dead peer found meanwhile makes the ranks left redo it
            c.held = not self.controller.all_finished(c.group.group_id, c.op_seq)
        s.current = None
        if not c.held:
            self._deliver_result(s, c)

    def _deliver_result(self, s: _RankState, c: _Collective) -> None:
        """Hand the engine's result to the rank's Work (in the caller's type and shape)."""
        result = np.array(c.engine.result, dtype=native_dtype(c.kind.dtype))   # a copy: the ring keeps its own
        if c.convert is not None:
            result = c.convert(result)
        result = result.reshape(c.shape)
        c.delivered = True
        self.collectives.append({"rank": s.rank, "group": c.group.group_id, "op_seq": c.op_seq, "path": c.path,
                                 "kind": str(c.kind), "elements": int(c.data.size), "time_s": self.now})
        with self._cv:
            c.work.result = result
            c.work.path = c.path
            self._wake(c.work._done)

    def _deliver(self, received) -> None:
        now = self.now
        for port, frame in received:
            s = self._by_port.get(port)
            if s is None or s.dead:
                continue
            # the rank's engines, its current collective's first, then the background ones (no list per frame)
            c = s.current
            if c is not None and c.engine is not None and c.engine.receive(frame, now):
                continue
            for b in s.background:
                if b.engine.receive(frame, now):
                    break
