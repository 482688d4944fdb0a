"""What every SDK object runs on: an event loop thread, its connections and its routes.

The SDK is one asyncio core; the public classes are synchronous facades that hand each call
to this loop (``runtime.run(coro)``), so sync callers and the I/O never share code paths twice.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from gms.client.connections import ConnectionPool
from gms.client.routing import NameserverRoutes, RouteProvider, StaticRoutes
from gms.net import LoopThread
from gms.security.client import ClientSecurity

T = TypeVar("T")

REQUEST_TIMEOUT_MS = 30_000
CLOSE_TIMEOUT_MS = 5000


class ClientRuntime:
    def __init__(self, brokers: Sequence[str] | str | None, *, nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, name: str = "gms-client",
                 security: ClientSecurity | None = None) -> None:
        """Routes come from ``nameserver`` ("host:port[,host:port]") or a fixed ``brokers`` list;
        ``security`` (TLS, user) applies to every connection (None: from ``GMS_TLS_*``,
        ``GMS_USER`` and ``GMS_PASSWORD``, plaintext when none is set)."""
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
        self.loop_thread = LoopThread(name=name)
        self.loop = self.loop_thread.loop
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, T], timeout_ms: float | None = None) -> T:
        """Run ``coro`` on the I/O loop and wait for it (from any thread but the loop's)."""
        if self.closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return self.loop_thread.run(coro, timeout_ms)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.loop_thread.run(self.pool.close(), CLOSE_TIMEOUT_MS)
        finally:
            self.closed = True
            self.loop_thread.stop()
