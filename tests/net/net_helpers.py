"""Helpers for the net tests: a real server on port 0, raw-socket reading."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from gms.net.server import Handler, RpcServer, ServerConfig
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import Frame

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]


@contextlib.asynccontextmanager
async def serving(
    handlers: Mapping[int, Handler] | None = None, config: ServerConfig | None = None
) -> AsyncIterator[RpcServer]:
    server = RpcServer(handlers, config=config)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop()


async def read_frames_until_eof(reader: asyncio.StreamReader, timeout_s: float = 5) -> list[Frame]:
    """Everything a raw socket receives until the server closes it."""
    decoder = FrameDecoder()
    async with asyncio.timeout(timeout_s):
        data = await reader.read()
    decoder.feed(data)
    frames = []
    while isinstance(item := decoder.next_frame(), Frame):
        frames.append(item)
    assert item is Event.NEED_DATA
    return frames
