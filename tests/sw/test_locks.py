"""cais.locks.ReentrantLock: re-entry, giving up and taking back at a depth, and its condition; threads are
ordered by Events, never by sleeps (each wait is bounded by SAFETY_S only so a failure cannot hang)."""

import threading

import pytest

from cais.locks import ReentrantLock

SAFETY_S = 30.0


def in_thread(fn):
    done, out = threading.Event(), {}

    def run():
        try:
            out["value"] = fn()
        finally:
            done.set()
    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_reentry_counts_and_ownership_is_per_thread():
    lock = ReentrantLock()
    with lock:
        with lock:
            assert lock.held()
            done, out = in_thread(lambda: (lock.held(), lock.acquire(blocking=False)))
            assert done.wait(SAFETY_S) and out["value"] == (False, False)
        assert lock.held()                    # one release of two takes: still held
    assert not lock.held()
    done, out = in_thread(lambda: lock.acquire(blocking=False))
    assert done.wait(SAFETY_S) and out["value"] is True      # free now (that thread keeps it)


def test_release_by_a_thread_that_does_not_hold_it_is_refused():
    lock = ReentrantLock()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release_fully()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.notify_all()


def test_release_fully_frees_every_depth_and_restore_takes_it_back_at_that_depth():
    lock = ReentrantLock()
    lock.acquire()
    lock.acquire()
    lock.acquire()
    depth = lock.release_fully()
    assert depth == 3 and not lock.held()
    done, out = in_thread(lambda: lock.acquire(blocking=False) and (lock.release() or True))
    assert done.wait(SAFETY_S) and out["value"] is True       # another thread could take it meanwhile
    lock.restore(depth)
    for _ in range(3):
        assert lock.held()
        lock.release()
    assert not lock.held()


def test_wait_gives_the_lock_up_until_a_notify_and_comes_back_at_its_depth():
    lock = ReentrantLock()
    waiting = threading.Event()
    state = {"ready": False}

    def waiter():
        with lock, lock:                      # depth 2
            waiting.set()
            while not state["ready"]:
                assert lock.wait(SAFETY_S), "no notify came"
            held, depth = lock.held(), lock.release_fully()
            lock.restore(depth)
            return held, depth

    done, out = in_thread(waiter)
    assert waiting.wait(SAFETY_S)
    with lock:                                # only possible while the waiter has given it up
        state["ready"] = True
        lock.notify_all()
    assert done.wait(SAFETY_S) and out["value"] == (True, 2)


def test_wait_without_a_notify_times_out_holding_the_lock():
    lock = ReentrantLock()
    with lock:
        assert lock.wait(0.01) is False
        assert lock.held()
