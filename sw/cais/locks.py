"""A re-entrant lock whose holder can give it up wholly and take it back at the same depth, and wait on it.

The coordinator holds two locks, the switch lock and the state lock, and must give both up around a wait
and the state lock alone around a slow switch access, whatever depth its thread holds them at.
``threading.RLock`` and ``threading.Condition`` do that only through private methods
(``_release_save``, ``_acquire_restore``, ``_is_owned``); :class:`ReentrantLock` offers it in the open.
"""

from __future__ import annotations

import threading

__all__ = ["ReentrantLock"]


class ReentrantLock:
    """A lock a thread may take again while it holds it (released when every take is released), with:

    - :meth:`held`: whether the calling thread holds it;
    - :meth:`release_fully` and :meth:`restore`: give it up at any depth, and take it back at that depth;
    - :meth:`wait` and :meth:`notify_all`: a condition on the lock (the holder waits, the lock given up
      meanwhile, until another holder notifies or the time runs out).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None      # the holding thread's ident (written only by its holder)
        self._depth = 0
        # wait/notify: a generation moved on by every notify, under a lock of its own, taken only while
        # the waiter's hold on this lock is given up or by a holder (no lock-order cycle)
        self._cond = threading.Condition(threading.Lock())
        self._generation = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("release of a lock the calling thread does not hold")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def __enter__(self) -> ReentrantLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def held(self) -> bool:
        """The calling thread holds the lock (another thread's hold never reads as this one's)."""
        return self._owner == threading.get_ident()

    def release_fully(self) -> int:
        """Give the lock up whatever the depth the calling thread holds it at; that depth, for :meth:`restore`."""
        if not self.held():
            raise RuntimeError("release of a lock the calling thread does not hold")
        depth, self._depth, self._owner = self._depth, 0, None
        self._lock.release()
        return depth

    def restore(self, depth: int) -> None:
        """Take the lock back at ``depth`` (from :meth:`release_fully`), waiting for it."""
        self._lock.acquire()
        self._owner, self._depth = threading.get_ident(), depth

    def wait(self, timeout: float) -> bool:
        """Give the lock up until :meth:`notify_all` or ``timeout`` s, then take it back at the same depth;
        whether a notify came. The caller must hold the lock."""
        with self._cond:
            generation = self._generation
            depth = self.release_fully()      # after taking _cond: a notify in between is not missed
            notified = self._cond.wait_for(lambda: self._generation != generation, timeout)
        self.restore(depth)
        return notified

    def notify_all(self) -> None:
        """Wake every thread in :meth:`wait`. The caller must hold the lock."""
        if not self.held():
            raise RuntimeError("notify of a lock the calling thread does not hold")
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
