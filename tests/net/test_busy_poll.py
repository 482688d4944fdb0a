"""Busy polling: a client polls its socket for a while before blocking; a server's loop keeps
polling after I/O instead of sleeping, and stops when the window has passed, or at once when
another task wants the CPU."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from gms.broker.config import BrokerConfig
from gms.broker.store_config import StoreConfig
from gms.client import Producer
from gms.net import busy_poll
from gms.net.blocking import BlockingConnection
from gms.net.busy_poll import LoopBusyPoll, recv_polling
from gms.net.loop import LoopThread
from gms.net.server import RpcServer, ServerConfig
from gms.protocol.codes import RequestCode

YIELD_LOST_US = busy_poll.YIELD_LOST_US


@pytest.fixture(autouse=True)
def uncontended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling as on an idle machine: a loaded test host must not pause it (the contention
    tests below turn the pause back on)."""
    monkeypatch.setattr(busy_poll, "YIELD_LOST_US", 10**12)
    monkeypatch.setattr(busy_poll._Pause, "until_ns", 0)


def test_one_lost_yield_ends_a_poll_but_only_lost_yields_in_a_row_pause_polling(monkeypatch: pytest.MonkeyPatch):
    """A quiet machine loses a yield now and then (another thread runs a while): pausing at each
    halved W3's polling. Polling pauses once yields keep losing the CPU."""
    monkeypatch.setattr(busy_poll, "YIELD_LOST_US", 0)  # every yield counts as lost
    monkeypatch.setattr(busy_poll._Pause, "lost", busy_poll.deque(maxlen=busy_poll.LOST_YIELDS_TO_PAUSE))
    paused = []
    for _ in range(busy_poll.LOST_YIELDS_TO_PAUSE):
        assert not busy_poll._yield_cpu()  # the poll at hand ends
        paused.append(busy_poll._Pause.until_ns > time.monotonic_ns())
    assert paused == [False] * (busy_poll.LOST_YIELDS_TO_PAUSE - 1) + [True]


@pytest.fixture
def cpu_hog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This thread and a process that never sleeps share one CPU; polling pauses as it would."""
    monkeypatch.setattr(busy_poll, "YIELD_LOST_US", YIELD_LOST_US)
    monkeypatch.setattr(busy_poll, "CONTENDED_PAUSE_S", 600.0)  # paused for the whole test
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # 0: this thread
        yield
    finally:
        os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_recv_polling_takes_what_arrives_within_the_window(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    sender = threading.Timer(0.02, b.sendall, (b"answer",))
    sender.start()
    buffer = bytearray(64)
    assert recv_polling(a, buffer, 5_000_000) == 6  # polls (without blocking) until it comes
    assert buffer[:6] == b"answer"
    sender.join()


def test_recv_polling_gives_up_after_the_window(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    start = time.monotonic()
    assert recv_polling(a, bytearray(64), 30_000) is None
    assert 0.03 <= time.monotonic() - start < 5
    a.settimeout(0.01)  # the socket is still usable, and still empty
    with pytest.raises(TimeoutError):
        a.recv(1)


def test_recv_polling_sees_end_of_stream(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    assert recv_polling(a, bytearray(64), 1_000_000) == 0


def _loop_cpu_s(window_us: int, touch: bool, wall_s: float) -> float:
    """CPU seconds the loop's thread spends during ``wall_s`` of waiting after an optional touch."""
    loop = asyncio.new_event_loop()
    try:
        poll = LoopBusyPoll(loop, window_us)

        async def wait() -> float:
            start = time.thread_time()
            if touch:
                poll.touch()
            await asyncio.sleep(wall_s)
            return time.thread_time() - start

        return loop.run_until_complete(wait())
    finally:
        loop.close()


def test_loop_polls_through_the_window_then_sleeps() -> None:
    # Polling: the thread runs while the loop waits (it yields to other threads each turn, so
    # a loaded machine gives it less than the whole window).
    assert _loop_cpu_s(200_000, True, 0.2) > 0.02
    # After the window the loop sleeps: a 50 ms window costs nothing in the 250 ms after it.
    loop = asyncio.new_event_loop()
    try:
        poll = LoopBusyPoll(loop, 50_000)

        async def after_window() -> float:
            poll.touch()
            await asyncio.sleep(0.1)
            start = time.thread_time()
            await asyncio.sleep(0.25)
            return time.thread_time() - start

        assert loop.run_until_complete(after_window()) < 0.02
    finally:
        loop.close()


def test_a_zero_window_never_polls() -> None:
    assert _loop_cpu_s(0, True, 0.2) < 0.02


@pytest.mark.parametrize("busy_poll_us", [0, 150, 1_000_000])
def test_requests_round_trip_with_any_window(busy_poll_us: int) -> None:
    with LoopThread() as io:
        rpc = RpcServer(config=ServerConfig(busy_poll_us=busy_poll_us))
        io.run(rpc.start("127.0.0.1", 0), timeout_ms=5000)
        try:
            conn = BlockingConnection.open("127.0.0.1", rpc.port, busy_poll_us=busy_poll_us)
            for size in (0, 100, 3 * 1024 * 1024):  # the big answer arrives in many pieces
                body = bytes(range(256)) * (size // 256)
                assert bytes(conn.request(RequestCode.PING, body=body, timeout_ms=5000).body) == body
            conn.close()
        finally:
            io.run(rpc.stop(), timeout_ms=5000)


def test_negative_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="busy_poll_us"):
        ServerConfig(busy_poll_us=-1)
    loop = asyncio.new_event_loop()
    with pytest.raises(ValueError, match="busy-poll window"):
        LoopBusyPoll(loop, -1)
    loop.close()
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match="busy_poll_us"):
        BlockingConnection(a, ("127.0.0.1", 0), busy_poll_us=-5)
    a.close()
    b.close()
    with pytest.raises(ValueError, match="busy_poll_us"):
        Producer(brokers="127.0.0.1:1", busy_poll_us=-1)


def test_broker_setting_reaches_its_server() -> None:
    assert BrokerConfig(busy_poll_us=0).server_config.busy_poll_us == 0
    assert BrokerConfig().server_config.busy_poll_us == ServerConfig().busy_poll_us > 0
    # With sync flush a send waits for its fsync anyway: no polling unless asked for.
    assert BrokerConfig(store=StoreConfig(flush_mode="sync")).server_config.busy_poll_us == 0
    assert BrokerConfig(busy_poll_us=20, store=StoreConfig(flush_mode="sync")).server_config.busy_poll_us == 20


def test_one_thread_polls_at_a_time(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    polling = threading.Thread(target=recv_polling, args=(a, bytearray(64), 300_000))
    polling.start()
    time.sleep(0.05)
    c, d = socket.socketpair()
    start = time.monotonic()
    assert recv_polling(c, bytearray(64), 5_000_000) is None  # another thread polls: block instead
    assert time.monotonic() - start < 0.2
    polling.join()
    c.close()
    d.close()


def test_recv_polling_pauses_when_another_task_wants_the_cpu(pair: tuple[socket.socket, socket.socket],
                                                             cpu_hog: None) -> None:
    # Its first yield hands the CPU to the hog for a time slice: polling would only lose more.
    a, _ = pair
    start = time.monotonic()
    assert recv_polling(a, bytearray(64), 20_000_000) is None
    assert time.monotonic() - start < 10  # not the 20 s window
    start = time.monotonic()
    assert recv_polling(a, bytearray(64), 20_000_000) is None  # paused: no polling at all
    assert time.monotonic() - start < 10


def _loop_switches(window_us: int, wall_s: float) -> int:
    """How often the loop's thread lost its CPU while runnable (a yield counts) during ``wall_s``
    of waiting after a touch."""
    loop = asyncio.new_event_loop()
    try:
        poll = LoopBusyPoll(loop, window_us)

        async def wait() -> int:
            start = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
            poll.touch()
            await asyncio.sleep(wall_s)
            return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - start

        return loop.run_until_complete(wait())
    finally:
        loop.close()


def test_loop_stops_polling_when_another_task_wants_the_cpu(cpu_hog: None) -> None:
    # A 20 s window, 2 s of it waited: polling, every turn's yield would give the hog a time slice
    # (hundreds); paused, the loop sleeps until its timer.
    assert _loop_switches(20_000_000, 2) < 50
    assert _loop_switches(20_000_000, 2) < 50  # paused: a touch starts no polling
