"""What every SDK object runs on: an event loop, its connections and its routes.

The SDK is one asyncio core. The synchronous classes own a loop thread and hand each call to it
(``runtime.run(coro)``); the asyncio classes (gms.client.aio) attach the same core to the
caller's running loop and await it, with no thread of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from gms.client.connections import ConnectionPool
from gms.client.routing import NameserverRoutes, RouteProvider, StaticRoutes
from gms.net import LoopThread
from gms.security.client import ClientSecurity

T = TypeVar("T")

REQUEST_TIMEOUT_MS = 30_000
CLOSE_TIMEOUT_MS = 5000


class AwaitRequired(RuntimeError):
    """A client on the caller's loop was asked to wait for I/O synchronously: the caller awaits it
    instead (an asyncio producer looks a topic's routes up, then queues the message)."""


class ClientRuntime:
    def __init__(self, brokers: Sequence[str] | str | None, *, nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, name: str = "gms-client",
                 security: ClientSecurity | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Routes come from ``nameserver`` ("host:port[,host:port]") or a fixed ``brokers`` list;
        ``security`` (TLS, user) applies to every connection (None: from ``GMS_TLS_*``,
        ``GMS_USER`` and ``GMS_PASSWORD``, plaintext when none is set). ``loop``: the caller's
        running loop, for an asyncio client (its calls are awaited there, :meth:`run` refuses);
        None: a loop thread of its own."""
        if (brokers is None) == (nameserver is None):
            raise ValueError("give either brokers=[...] or nameserver='host:port[,...]', not both")
        if isinstance(brokers, str):
            brokers = [b for b in brokers.split(",") if b]
        self.request_timeout_ms = request_timeout_ms
        self.security = ClientSecurity.from_env() if security is None else security
        self.pool = ConnectionPool(request_timeout_ms=request_timeout_ms, security=self.security)
        self.routes: RouteProvider = (
            NameserverRoutes(nameserver, self.pool) if nameserver is not None
            else StaticRoutes(list(brokers or ()), self.pool))
        self.loop_thread: LoopThread | None = None
        if loop is None:
            self.loop_thread = LoopThread(name=name)
            loop = self.loop_thread.loop
        self.loop: asyncio.AbstractEventLoop = loop
        self.closed = False

    @property
    def attached(self) -> bool:
        """Whether this runs on the caller's loop (an asyncio client) rather than a thread of its own."""
        return self.loop_thread is None

    def run(self, coro: Coroutine[Any, Any, T], timeout_ms: float | None = None) -> T:
        """Run ``coro`` on the I/O loop and wait for it (from any thread but the loop's)."""
        if self.closed:
            coro.close()
            raise RuntimeError("the client is closed")
        if self.loop_thread is None:
            coro.close()
            raise AwaitRequired("this client runs on the caller's event loop: await its calls instead")
        return self.loop_thread.run(coro, timeout_ms)

    def close(self) -> None:
        if self.closed:
            return
        if self.loop_thread is None:
            raise RuntimeError("this client runs on the caller's event loop: await aclose() instead")
        try:
            self.loop_thread.run(self.pool.close(), CLOSE_TIMEOUT_MS)
        finally:
            self.closed = True
            self.loop_thread.stop()

    async def aclose(self) -> None:
        """:meth:`close` of an asyncio client (on its loop). Idempotent."""
        if self.closed:
            return
        self.closed = True
        await self.pool.close()
