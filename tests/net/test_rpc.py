"""The RPC server and client connection over real loopback sockets."""

from __future__ import annotations

import asyncio
import logging

import msgpack
import pytest
from net_helpers import Runner, read_frames_until_eof, serving

from gms.errors import (
    ConnectionClosedError,
    FrameTooLargeError,
    NotLeaderError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailableError,
    UnknownCodeError,
)
from gms.net.client import Connection
from gms.net.server import CONNECTION_ERROR_ID, ServerConfig
from gms.protocol.codes import Flag, RequestCode, Status
from gms.protocol.frame import PREFIX, Frame, Response, encode_frame

SEND, PULL = RequestCode.SEND, RequestCode.PULL


async def sleepy(request: Frame) -> Response:
    """Answers after ``delay_ms``, echoing its fields and body."""
    await asyncio.sleep(request.fields.get("delay_ms", 0) / 1000)
    return Response(fields=dict(request.fields), body=bytes(request.body))


def raw(code: int, request_id: int, **kwargs: object) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(code, request_id, **kwargs))  # type: ignore[arg-type]


def test_round_trip_of_fields_and_multi_part_body(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving({SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            parts = [memoryview(b"ab"), b"cd", bytearray(b"ef")]
            response = await conn.request(SEND, {"topic": "t", "queue_id": 3}, parts)
            assert response.fields == {"topic": "t", "queue_id": 3}
            assert bytes(response.body) == b"abcdef"
            assert response.is_response and response.code == SEND and response.status == 0
            conn.close()

    arun(scenario())


def test_pipelined_requests_are_answered_in_completion_order(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving({SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            finished: list[int] = []

            async def call(delay_ms: int) -> None:
                response = await conn.request(SEND, {"delay_ms": delay_ms}, str(delay_ms).encode())
                assert bytes(response.body) == str(delay_ms).encode()
                finished.append(delay_ms)

            await asyncio.gather(*(call(d) for d in (300, 150, 0)))
            assert finished == [0, 150, 300]
            conn.close()

    arun(scenario())


def test_slow_handler_does_not_block_a_fast_one(arun: Runner) -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def long_poll(request: Frame) -> Response:
            await release.wait()
            return Response(fields={"woken": True})

        async with serving({PULL: long_poll, SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            pull = asyncio.ensure_future(conn.request(PULL))
            async with asyncio.timeout(1):
                for i in range(20):
                    assert (await conn.request(SEND, {"i": i})).fields == {"i": i}
            assert not pull.done()
            release.set()
            assert (await pull).fields == {"woken": True}
            conn.close()

    arun(scenario())


def test_unknown_code_and_handler_errors(arun: Runner, caplog: pytest.LogCaptureFixture) -> None:
    async def not_leader(request: Frame) -> Response:
        raise NotLeaderError("queue 3 moved", fields={"leader": "10.0.0.2:10911"})

    async def buggy(request: Frame) -> Response:
        raise ValueError("boom")

    async def scenario() -> None:
        async with serving({SEND: not_leader, PULL: buggy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            with pytest.raises(UnknownCodeError, match="unknown request code 999"):
                await conn.request(999)
            with pytest.raises(NotLeaderError, match="queue 3 moved") as info:
                await conn.request(SEND)
            assert info.value.retriable and info.value.fields == {"leader": "10.0.0.2:10911"}
            with caplog.at_level(logging.ERROR, logger="gms.net.server"), \
                    pytest.raises(ServerError, match="ValueError: boom"):
                await conn.request(PULL)
            assert "boom" in caplog.text
            assert (await conn.request(RequestCode.PING, body=b"still")).body == b"still"
            conn.close()

    arun(scenario())


def test_unencodable_response_becomes_system_error(arun: Runner) -> None:
    async def bad(request: Frame) -> Response:
        return Response(fields={"when": object()})

    async def scenario() -> None:
        async with serving({SEND: bad}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            with pytest.raises(ServerError, match="bad response"):
                await conn.request(SEND)
            conn.close()

    arun(scenario())


def test_garbage_gets_an_error_then_a_clean_close(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving() as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"\xff" * 64)  # frame length 4 GiB
            frames = await read_frames_until_eof(reader)
            assert [(f.request_id, f.status) for f in frames] == [
                (CONNECTION_ERROR_ID, Status.FRAME_TOO_LARGE)
            ]
            writer.close()
            conn = await Connection.open("127.0.0.1", server.port)  # still serving
            assert (await conn.request(RequestCode.PING, body=b"ok")).body == b"ok"
            conn.close()

    arun(scenario())


def test_malformed_header_is_answered_and_the_connection_goes_on(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving() as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            header = msgpack.packb({"code": "ping", "id": 7})
            writer.write(PREFIX.pack(4 + len(header), len(header)) + header)
            writer.write(raw(RequestCode.PING, 8, body=b"after"))
            writer.write(raw(RequestCode.PING, 9, flags=Flag.RESPONSE))
            writer.write_eof()
            frames = await read_frames_until_eof(reader)
            assert sorted((f.request_id, f.status) for f in frames) == [
                (7, Status.MALFORMED_FRAME),
                (8, Status.SUCCESS),
                (9, Status.BAD_REQUEST),
            ]
            assert [bytes(f.body) for f in frames if f.request_id == 8] == [b"after"]
            writer.close()

    arun(scenario())


def test_oneway_gets_no_response_and_half_close_still_answers(arun: Runner) -> None:
    async def scenario() -> None:
        seen: list[bytes] = []

        async def record(request: Frame) -> Response:
            seen.append(bytes(request.body))
            return Response(body=b"never sent")

        async with serving({SEND: record, PULL: sleepy}) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(raw(SEND, 1, flags=Flag.ONEWAY, body=b"fire"))
            writer.write(raw(PULL, 2, fields={"delay_ms": 100}))
            writer.write_eof()  # the server must still answer request 2, then close
            frames = await read_frames_until_eof(reader)
            assert [f.request_id for f in frames] == [2]
            assert seen == [b"fire"]
            writer.close()
            conn = await Connection.open("127.0.0.1", server.port)
            await conn.oneway(SEND, body=b"again")
            await conn.request(RequestCode.PING)
            assert seen[-1] == b"again"
            conn.close()

    arun(scenario())


def test_client_close_fails_pending_requests(arun: Runner) -> None:
    async def scenario() -> None:
        never = asyncio.Event()

        async def hang(request: Frame) -> Response:
            await never.wait()
            return Response()

        async with serving({PULL: hang}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            pending = [asyncio.ensure_future(conn.request(PULL)) for _ in range(5)]
            await asyncio.sleep(0.05)
            assert conn.pending_count == 5
            conn.close()
            for future in pending:
                with pytest.raises(ConnectionClosedError, match="closed by the client") as info:
                    await future
                assert info.value.retriable
            with pytest.raises(ConnectionClosedError):
                await conn.request(RequestCode.PING)
            await conn.wait_closed()

    arun(scenario())


def test_server_stop_fails_pending_requests_after_grace(arun: Runner) -> None:
    async def scenario() -> None:
        never = asyncio.Event()

        async def hang(request: Frame) -> Response:
            await never.wait()
            return Response()

        async with serving({PULL: hang}, ServerConfig(stop_grace_ms=50)) as server:
            port = server.port
            conn = await Connection.open("127.0.0.1", port)
            pending = asyncio.ensure_future(conn.request(PULL))
            await asyncio.sleep(0.05)
            await server.stop()
            with pytest.raises(ConnectionClosedError):
                await pending
            with pytest.raises(ServiceUnavailableError):
                await Connection.open("127.0.0.1", port, timeout_ms=500)

    arun(scenario())


def test_timeout_abandons_the_request_but_not_the_connection(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving({SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            with pytest.raises(RequestTimeoutError) as info:
                await conn.request(SEND, {"delay_ms": 200}, timeout_ms=20)
            assert isinstance(info.value, TimeoutError) and info.value.retriable
            assert conn.pending_count == 0
            await asyncio.sleep(0.25)  # the late response arrives and is dropped
            assert (await conn.request(SEND, {"x": 1})).fields == {"x": 1}
            conn.close()

    arun(scenario())


def test_requests_of_the_connections_own_timeout_expire_in_turn_never_early(arun: Runner) -> None:
    """They share one timer (at the oldest one's deadline): an answered one leaves the line, the
    others expire each past its own deadline, in the order sent, and the connection goes on."""
    async def scenario() -> None:
        async with serving({SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port, request_timeout_ms=300)
            loop = asyncio.get_running_loop()
            outcomes: list[tuple[str, str, float]] = []

            async def call(name: str, delay_ms: int) -> None:
                began = loop.time()
                try:
                    await conn.request(SEND, {"delay_ms": delay_ms})
                    outcomes.append((name, "answered", loop.time() - began))
                except RequestTimeoutError:
                    outcomes.append((name, "expired", loop.time() - began))

            calls = [asyncio.ensure_future(call("answered", 50)), asyncio.ensure_future(call("first", 5000))]
            await asyncio.sleep(0.15)
            calls.append(asyncio.ensure_future(call("second", 5000)))
            await asyncio.gather(*calls)
            assert [(name, outcome) for name, outcome, _ in outcomes] == [
                ("answered", "answered"), ("first", "expired"), ("second", "expired")]
            assert all(took >= 0.3 - 0.002 for name, _, took in outcomes if name != "answered")
            assert conn.pending_count == 0 and conn._sweeper is None
            assert (await conn.request(SEND, {"x": 1})).fields == {"x": 1}
            conn.close()

    arun(scenario())


def test_oversized_frames(arun: Runner) -> None:
    async def scenario() -> None:
        config = ServerConfig(frame_size_max_bytes=1024)
        async with serving({SEND: sleepy}, config) as server:
            small = await Connection.open("127.0.0.1", server.port, frame_size_max_bytes=1024)
            with pytest.raises(FrameTooLargeError):  # refused before sending anything
                await small.request(SEND, body=b"x" * 2000)
            assert (await small.request(SEND, body=b"fits")).body == b"fits"
            big = await Connection.open("127.0.0.1", server.port)
            with pytest.raises(ConnectionClosedError) as info:
                await big.request(SEND, body=b"x" * 2000)
            assert isinstance(info.value.__cause__, FrameTooLargeError)
            assert (await small.request(SEND, body=b"other")).body == b"other"
            small.close()

    arun(scenario())


def test_large_responses_arrive_whole_and_in_order(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving({SEND: sleepy}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            bodies = [bytes([i]) * (3_000_000 + i) for i in range(4)] + [b"small"]
            responses = await asyncio.gather(*(conn.request(SEND, {"i": i}, body) for i, body in enumerate(bodies)))
            assert [(r.fields["i"], bytes(r.body)) for r in responses] == list(enumerate(bodies))
            conn.close()

    arun(scenario())


async def raw_server(send: bytes, *, pause_after: int) -> tuple[asyncio.Server, int]:
    """A server that, for the first request, writes ``send`` in two parts (a pause between) and closes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(send[:pause_after])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(send[pause_after:])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_response_in_pieces_then_a_close_mid_frame(arun: Runner) -> None:
    async def scenario() -> None:
        first = raw(SEND, 1, flags=Flag.RESPONSE, body=b"a" * 100_000)
        second = raw(SEND, 2, flags=Flag.RESPONSE, body=b"b" * 100_000)
        server, port = await raw_server(first + second[:-10], pause_after=50_000)
        async with server:
            conn = await Connection.open("127.0.0.1", port)
            one, two = asyncio.ensure_future(conn.request(SEND)), asyncio.ensure_future(conn.request(SEND))
            assert bytes((await one).body) == b"a" * 100_000  # split across reads: whole
            with pytest.raises(ConnectionClosedError, match="ended inside a frame"):
                await two
            assert conn.closed
            await conn.wait_closed()

    arun(scenario())
