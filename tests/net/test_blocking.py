"""BlockingConnection: one request at a time from the calling thread, same codec as the loop's."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from gms.errors import ConnectionClosedError, RequestTimeoutError, ServiceUnavailableError, TopicNotFoundError
from gms.net.blocking import BlockingConnection
from gms.net.loop import LoopThread
from gms.net.server import RpcServer
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame, Response

SLOW = 9001
MISSING = 9002
CLOSE = 9003


@pytest.fixture
def server() -> Iterator[RpcServer]:
    async def slow(request: Frame) -> Response:
        await asyncio.sleep(float(bytes(request.body)))
        return Response(body=b"late")

    async def missing(request: Frame) -> Response:
        raise TopicNotFoundError("no topic t")

    with LoopThread() as io:
        rpc = RpcServer({SLOW: slow, MISSING: missing})
        io.run(rpc.start("127.0.0.1", 0), timeout_ms=5000)
        try:
            yield rpc
        finally:
            io.run(rpc.stop(), timeout_ms=5000)


def test_round_trips_fields_and_large_bodies(server: RpcServer) -> None:
    conn = BlockingConnection.open("127.0.0.1", server.port)
    for size in (0, 100, 3 * 1024 * 1024):  # the big one takes several sends and reads
        body = bytes(range(256)) * (size // 256)
        response = conn.request(RequestCode.PING, {"n": size}, body, timeout_ms=5000)
        assert bytes(response.body) == body
    conn.close()


def test_error_status_raises_and_keeps_the_connection(server: RpcServer) -> None:
    conn = BlockingConnection.open("127.0.0.1", server.port)
    with pytest.raises(TopicNotFoundError, match="no topic t"):
        conn.request(MISSING, timeout_ms=5000)
    assert not conn.closed
    assert bytes(conn.request(RequestCode.PING, body=b"still", timeout_ms=5000).body) == b"still"
    conn.close()


def test_timeout_closes_so_a_late_answer_is_never_taken_for_the_next(server: RpcServer) -> None:
    conn = BlockingConnection.open("127.0.0.1", server.port)
    with pytest.raises(RequestTimeoutError):
        conn.request(SLOW, body=b"0.3", timeout_ms=50)
    assert conn.closed
    with pytest.raises(ConnectionClosedError):
        conn.request(RequestCode.PING, timeout_ms=5000)


def test_peer_closing_mid_request_raises_connection_closed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept_and_hang_up() -> None:
        peer, _ = listener.accept()
        peer.recv(1024)
        peer.close()

    thread = threading.Thread(target=accept_and_hang_up)
    thread.start()
    conn = BlockingConnection.open("127.0.0.1", port)
    with pytest.raises(ConnectionClosedError):
        conn.request(RequestCode.PING, body=b"x", timeout_ms=5000)
    thread.join()
    listener.close()


def test_connect_failure_is_service_unavailable() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(ServiceUnavailableError):
        BlockingConnection.open("127.0.0.1", port, timeout_ms=1000)
