"""Direct handlers (plain functions): answered in the reader's pass when they can, run as a task
when they return an awaitable; errors, crashes and oneway requests as for ``async def`` handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest
from net_helpers import Runner, serving

from gms.errors import NotLeaderError, ServerError
from gms.net.client import Connection
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame, Response

SEND, PULL = RequestCode.SEND, RequestCode.PULL


async def _later(request: Frame) -> Response:
    await asyncio.sleep(request.fields["delay_ms"] / 1000)
    return Response(fields={"waited": True}, body=bytes(request.body))


def direct(request: Frame) -> Response | Awaitable[Response] | None:
    """Answers at once, waits (``delay_ms``), refuses (``refuse``) or crashes (``crash``)."""
    if request.fields.get("refuse"):
        raise NotLeaderError("not the leader here")
    if request.fields.get("crash"):
        raise ValueError("a handler bug")
    if "delay_ms" in request.fields:
        return _later(request)
    if request.fields.get("none"):
        return None
    return Response(fields={"waited": False}, body=bytes(request.body))


def test_direct_handler_answers_at_once_or_after_waiting(arun: Runner) -> None:
    async def scenario() -> None:
        async with serving({SEND: direct}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            at_once = await conn.request(SEND, {}, b"a")
            assert at_once.fields == {"waited": False} and bytes(at_once.body) == b"a"
            # Pipelined: the waiting one does not hold up the ones answered at once.
            slow = asyncio.ensure_future(conn.request(SEND, {"delay_ms": 50}, b"slow"))
            fast = [await conn.request(SEND, {}, str(i).encode()) for i in range(3)]
            assert not slow.done() and [bytes(r.body) for r in fast] == [b"0", b"1", b"2"]
            answer = await slow
            assert answer.fields == {"waited": True} and bytes(answer.body) == b"slow"
            assert (await conn.request(SEND, {"none": True})).fields == {}
            conn.close()

    arun(scenario())


def test_direct_handler_errors_and_crashes_are_answered(arun: Runner, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serving({SEND: direct}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            with pytest.raises(NotLeaderError, match="not the leader"):
                await conn.request(SEND, {"refuse": True})
            with pytest.raises(ServerError, match="ValueError: a handler bug"):
                await conn.request(SEND, {"crash": True})
            assert bytes((await conn.request(SEND, {}, b"still")).body) == b"still"  # the connection lives
            conn.close()

    caplog.set_level("ERROR")
    arun(scenario())
    assert "handler for request code" in caplog.text


def test_oneway_direct_requests_get_no_answer(arun: Runner) -> None:
    seen: list[bytes] = []

    def record(request: Frame) -> None:
        seen.append(bytes(request.body))

    async def scenario() -> None:
        async with serving({PULL: record, SEND: direct}) as server:
            conn = await Connection.open("127.0.0.1", server.port)
            await conn.oneway(PULL, {}, b"one")
            # The next request's answer comes back alone: the oneway one was not answered.
            assert bytes((await conn.request(SEND, {}, b"two")).body) == b"two"
            assert seen == [b"one"] and conn.pending_count == 0
            conn.close()

    arun(scenario())
