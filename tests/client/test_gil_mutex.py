"""GilMutex, the accumulator's lock: threading.Lock's behaviour, with its state guarded by the GIL."""

from __future__ import annotations

import threading
import time

import pytest

from gms.client._append import GilMutex


def test_it_behaves_as_a_lock():
    mutex = GilMutex()
    assert not mutex.locked()
    assert mutex.acquire()
    assert mutex.locked()
    assert not mutex.acquire(False)
    started = time.monotonic()
    assert not mutex.acquire(timeout=0.05)
    assert time.monotonic() - started >= 0.05
    mutex.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        mutex.release()
    with pytest.raises(ValueError):
        mutex.acquire(False, 1.0)
    with pytest.raises(ValueError):
        mutex.acquire(timeout=-2)
    with pytest.raises(OverflowError):  # as threading.Lock: past threading.TIMEOUT_MAX
        mutex.acquire(timeout=threading.TIMEOUT_MAX * 2)
    with mutex:
        assert mutex.locked()
    assert not mutex.locked()


def test_threads_that_give_up_the_gil_inside_still_exclude_each_other():
    """Critical sections that let other threads run (sleeps) never overlap, and no thread that
    waits is forgotten (each ends)."""
    mutex = GilMutex()
    inside, overlaps, done = [0], [0], [0]

    def work() -> None:
        for _ in range(200):
            with mutex:
                inside[0] += 1
                if inside[0] > 1:
                    overlaps[0] += 1
                time.sleep(0)  # the GIL goes to another thread, which finds the mutex held
                inside[0] -= 1
                done[0] += 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert overlaps[0] == 0
    assert done[0] == 6 * 200


def test_a_waiter_wakes_when_it_is_released():
    mutex = GilMutex()
    mutex.acquire()
    got = threading.Event()

    def wait() -> None:
        with mutex:
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not got.wait(0.1)
    mutex.release()
    assert got.wait(5)
    thread.join(5)
    assert not mutex.locked()


def test_a_condition_waits_and_is_notified_on_it():
    mutex = GilMutex()
    condition = threading.Condition(mutex)  # type: ignore[arg-type]
    ready: list[int] = []

    def produce() -> None:
        time.sleep(0.05)
        with condition:
            ready.append(1)
            condition.notify_all()

    thread = threading.Thread(target=produce)
    thread.start()
    with condition:
        assert condition.wait_for(lambda: ready, timeout=5)
        assert mutex.locked()
    thread.join(5)
    assert not mutex.locked()
