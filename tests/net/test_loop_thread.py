"""LoopThread: a synchronous facade over one event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gms.errors import RequestTimeoutError
from gms.net.client import Connection
from gms.net.loop import LoopThread
from gms.net.server import RpcServer
from gms.protocol.codes import RequestCode


def test_sync_callers_share_one_connection_from_many_threads() -> None:
    with LoopThread() as io:
        server = RpcServer()
        io.run(server.start("127.0.0.1", 0), timeout_ms=5000)
        conn = io.run(Connection.open("127.0.0.1", server.port), timeout_ms=5000)

        def ping(i: int) -> bytes:
            body = str(i).encode()
            response = io.run(conn.request(RequestCode.PING, body=body), timeout_ms=5000)
            return bytes(response.body)

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(ping, range(200))) == [str(i).encode() for i in range(200)]
        conn.close()
        io.run(server.stop(), timeout_ms=5000)


def test_timeout_cancels_the_coroutine() -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with LoopThread() as io:
        with pytest.raises(RequestTimeoutError):
            io.run(slow(), timeout_ms=50)
        assert cancelled.wait(2)


def test_errors_from_the_coroutine_propagate_unchanged() -> None:
    async def fails() -> None:
        raise TimeoutError("from inside")

    with LoopThread() as io, pytest.raises(TimeoutError, match="from inside"):
        io.run(fails(), timeout_ms=1000)


def test_run_from_the_loop_thread_is_refused() -> None:
    async def nested(io: LoopThread) -> None:
        async def inner() -> None:
            return None

        io.run(inner())

    with LoopThread() as io, pytest.raises(RuntimeError, match="deadlock"):
        io.run(nested(io), timeout_ms=1000)


def test_stop_cancels_pending_work_and_joins() -> None:
    io = LoopThread(name="gms-test-io")
    future = io.submit(asyncio.sleep(10))
    io.stop()
    assert future.cancelled()
    assert not any(t.name == "gms-test-io" for t in threading.enumerate())
    io.stop()  # idempotent
