"""The SDK in its two flavours behind one (asyncio) interface, for scenarios written once and run
against both: ``async`` is gms.client.aio itself; ``sync`` is the synchronous classes, each call
made (blocking, on their own loop threads) when awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from gms.client import Admin, Consumer, Producer, SimpleConsumer
from gms.client.aio import AsyncAdmin, AsyncConsumer, AsyncProducer, AsyncSimpleConsumer

FLAVOURS = ("sync", "async")

# Calls that are plain (not awaited) in both flavours (send_nowait is send_async: a SendFuture,
# awaitable from any loop).
_PLAIN = frozenset({"assignment", "paused", "position", "member", "damaged_count", "group", "producer_id",
                    "tx_id", "state", "queues", "send_async", "held"})
_SYNC_NAMES = {"aclose": "close", "drain": "flush", "send_nowait": "send_async", "ack_nowait": "ack_async"}


class _Blocking:
    """A synchronous client seen through the asyncio interface."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        if name == "begin_transaction":
            return lambda: _Blocking(self._target.begin_transaction())
        name = _SYNC_NAMES.get(name, name)
        value = getattr(self._target, name)
        if name == "ack_async":  # a concurrent.futures.Future: awaited through the test's loop
            return lambda *args: asyncio.wrap_future(value(*args))
        if name in _PLAIN or not callable(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            kwargs = {k: v._target if isinstance(v, _Blocking) else v for k, v in kwargs.items()}
            return value(*args, **kwargs)
        return call

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            for message in self._target.poll(200):
                yield message

    async def __aenter__(self) -> _Blocking:
        self._target.__enter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._target.__exit__(*exc_info)  # a client closes, a transaction commits or rolls back


class Sdk:
    """Makes the clients of one flavour (``async with sdk.producer(...) as producer``)."""

    def __init__(self, flavour: str) -> None:
        self.flavour = flavour
        self.is_async = flavour == "async"

    def _make(self, sync: Callable[..., Any], asynchronous: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.is_async:
            return asynchronous(*args, **kwargs)  # type: ignore[no-any-return]

        @contextlib.asynccontextmanager
        async def blocking() -> AsyncIterator[Any]:
            async with _Blocking(sync(*args, **kwargs)) as client:
                yield client
        return blocking()

    def producer(self, *args: Any, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._make(Producer, AsyncProducer, args, kwargs)

    def consumer(self, *args: Any, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._make(Consumer, AsyncConsumer, args, kwargs)

    def simple_consumer(self, *args: Any, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._make(SimpleConsumer, AsyncSimpleConsumer, args, kwargs)

    def admin(self, *args: Any, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._make(Admin, AsyncAdmin, args, kwargs)


async def consume(consumer: Any, count: int, timeout_s: float = 10.0) -> list[Any]:
    """Poll until ``count`` messages arrived (or the deadline passed)."""
    got: list[Any] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        got += await consumer.poll(200)
    return got
