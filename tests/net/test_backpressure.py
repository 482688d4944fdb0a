"""Backpressure: neither a flood of requests nor a client that never reads grows the server."""

from __future__ import annotations

import asyncio
import socket

from net_helpers import Runner, serving

from gms.net.client import Connection
from gms.net.server import ServerConfig
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame, Response, encode_frame

PING_64K = b"".join(bytes(p) for p in encode_frame(RequestCode.PING, 1, body=b"x" * 65536))
FLOOD_BYTES = 256 * 1024 * 1024
# In flight (1 MiB) + their responses + the write high-water mark + one read burst.
SERVER_BUFFER_BOUND_BYTES = 4 * 1024 * 1024


def flood(port: int) -> int:
    """Write PING frames without ever reading; return the bytes written before blocking."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(0.5)
        try:
            while sent < FLOOD_BYTES:
                sent += sock.send(PING_64K)
        except TimeoutError:
            pass
    return sent


def test_client_that_never_reads_does_not_grow_server_memory(arun: Runner) -> None:
    async def scenario() -> None:
        config = ServerConfig(
            write_buffer_high_bytes=256 * 1024,
            write_buffer_low_bytes=64 * 1024,
            in_flight_bytes_max=1024 * 1024,
        )
        async with serving(config=config) as server:
            sender = asyncio.ensure_future(asyncio.to_thread(flood, server.port))
            peak_bytes = 0
            while not sender.done():
                peak_bytes = max(peak_bytes, server.buffered_bytes())
                await asyncio.sleep(0.005)
            sent = await sender
            assert sent < FLOOD_BYTES, "the server kept reading from a client that never reads"
            assert 0 < peak_bytes < SERVER_BUFFER_BOUND_BYTES, peak_bytes
            # Other clients are unaffected.
            conn = await Connection.open("127.0.0.1", server.port)
            assert (await conn.request(RequestCode.PING, body=b"hi")).body == b"hi"
            conn.close()

    arun(scenario())


def test_in_flight_requests_are_bounded_and_reading_resumes(arun: Runner) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        running = 0
        running_peak = 0

        async def hold(request: Frame) -> Response:
            nonlocal running, running_peak
            running += 1
            running_peak = max(running_peak, running)
            await release.wait()
            running -= 1
            return Response(body=request.body)

        config = ServerConfig(in_flight_requests_max=8)
        async with serving({RequestCode.PULL: hold}, config) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            calls = [
                asyncio.ensure_future(conn.request(RequestCode.PULL, body=str(i).encode()))
                for i in range(100)
            ]
            await asyncio.sleep(0.1)
            assert running == 8
            release.set()
            responses = await asyncio.gather(*calls)
            assert [bytes(r.body) for r in responses] == [str(i).encode() for i in range(100)]
            assert running_peak == 8
            conn.close()

    arun(scenario())


def test_client_waits_while_the_server_does_not_read(arun: Runner) -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def hold(request: Frame) -> Response:
            await release.wait()
            return Response()

        config = ServerConfig(in_flight_requests_max=1)
        async with serving({RequestCode.PULL: hold}, config) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            first = asyncio.ensure_future(conn.request(RequestCode.PULL))
            await asyncio.sleep(0.05)
            body = b"y" * (1024 * 1024)
            writers = [asyncio.ensure_future(conn.oneway(RequestCode.PULL, body=body))
                       for _ in range(64)]
            await asyncio.sleep(0.3)
            assert not all(w.done() for w in writers), "the client buffered 64 MiB unboundedly"
            release.set()
            await asyncio.gather(first, *writers)
            conn.close()

    arun(scenario())
