"""What every part of the admin client stands on: its runtime (a nameserver's routes or a fixed
list of brokers), asking the nameserver or every broker at once, and the routes and broker
status the other parts read."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Self

from gms.client.routing import NameserverRoutes
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.protocol.codes import RequestCode
from gms.security.client import ClientSecurity


class AdminBase:
    """The admin client's plumbing (see :class:`~gms.client.admin.AsyncAdmin`)."""

    def __init__(self, brokers: Sequence[str] | str | None = None, *,
                 nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, security: ClientSecurity | None = None) -> None:
        """``security``: TLS and user (None: from ``GMS_TLS_*``, ``GMS_USER``, ``GMS_PASSWORD``)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("create AsyncAdmin inside a coroutine: it runs on the caller's event loop") from None
        self._attach(ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                   name="gms-admin", security=security, loop=loop))

    @classmethod

    def _driven(cls, runtime: ClientRuntime) -> Self:
        """The core of a synchronous :class:`Admin` on ``runtime`` (its loop thread)."""
        admin = cls.__new__(cls)
        admin._attach(runtime)
        return admin

    def _attach(self, runtime: ClientRuntime) -> None:
        self._runtime = runtime
        routes = runtime.routes
        self._nameserver = routes if isinstance(routes, NameserverRoutes) else None

    async def brokers(self) -> list[str]:
        """Addresses of the live brokers (registered with the nameservers, or the given list)."""
        return await self._runtime.routes.live_brokers()

    async def _ask_nameserver(self, code: int, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self._nameserver is None:
            raise ValueError("this needs a nameserver; this Admin was given brokers")
        return dict((await self._nameserver.request(code, fields)).fields)

    async def _ask(self, brokers: Sequence[str], code: int, fields: Mapping[str, Any] | None = None,
                   *, errors: bool = False) -> list[Any]:
        """``code`` on every broker at once: answers' fields (or, with ``errors``, the exceptions)."""
        async def ask() -> list[Any]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, code, fields) for b in brokers), return_exceptions=errors))
        return [a if isinstance(a, BaseException) else dict(a.fields) for a in await ask()]

    async def route(self, topic: str, *, settings: bool = False) -> dict[str, Any]:
        """The nameserver's route of ``topic``: queues with leader, replicas and leader epoch;
        with ``settings`` also ``replication_factor`` and ``settings``."""
        if self._nameserver is None:
            raise ValueError("routes come from a nameserver; this Admin was given brokers")
        return await self._ask_nameserver(RequestCode.GET_ROUTE, {"topic": topic, "settings": settings})

    async def broker_status(self) -> list[dict[str, Any]]:
        """BROKER_STATUS of every live broker; an unreachable one is ``{"address", "error"}``."""
        brokers = await self.brokers()
        return [{"address": b, "error": str(a)} if isinstance(a, BaseException) else a
                for b, a in zip(brokers, await self._ask(brokers, RequestCode.BROKER_STATUS, errors=True), strict=True)]

    async def aclose(self) -> None:
        await self._runtime.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
