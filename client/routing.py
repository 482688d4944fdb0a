"""Where a topic's queues live: the seam between the SDK and route discovery.

:class:`RouteProvider` is all producers and consumers know. :class:`StaticRoutes` asks a
fixed list of brokers for their topics; a nameserver-backed provider plugs in beside it.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple, Protocol

from gms.errors import GmsError, TopicNotFoundError
from gms.protocol.codes import RequestCode

from gms.client.connections import ConnectionPool

ROUTE_REFRESH_INTERVAL_MS = 30_000


class QueueRoute(NamedTuple):
    topic: str
    queue_id: int
    broker: str  # "host:port"


class RouteProvider(Protocol):
    """Routes of topics, cached; ``invalidate`` after an error that suggests they moved."""

    @property
    def brokers(self) -> list[str]: ...

    def cached(self, topic: str) -> list[QueueRoute] | None:
        """The cached routes if fresh, without I/O (None: call :meth:`routes`)."""

    async def routes(self, topic: str) -> list[QueueRoute]:
        """The queues of ``topic``; raises TopicNotFoundError if no broker has it."""

    def invalidate(self) -> None: ...


class StaticRoutes:
    """Routes from TOPIC_LIST answers of a fixed set of brokers."""

    def __init__(self, brokers: list[str], pool: ConnectionPool, *,
                 refresh_interval_ms: float = ROUTE_REFRESH_INTERVAL_MS) -> None:
        if not brokers:
            raise ValueError("at least one broker address is needed")
        self._brokers = list(brokers)
        self._pool = pool
        self._refresh_interval_s = refresh_interval_ms / 1000
        self._table: dict[str, list[QueueRoute]] = {}
        self._fetched_at = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def brokers(self) -> list[str]:
        return list(self._brokers)

    def cached(self, topic: str) -> list[QueueRoute] | None:
        if time.monotonic() - self._fetched_at > self._refresh_interval_s:
            return None
        return self._table.get(topic)

    async def routes(self, topic: str) -> list[QueueRoute]:
        found = self.cached(topic)
        if found is None:
            await self.refresh()
            found = self._table.get(topic)
        if not found:
            raise TopicNotFoundError(f"topic {topic!r} exists on none of the brokers {self._brokers}")
        return found

    def invalidate(self) -> None:
        self._fetched_at = float("-inf")

    async def refresh(self) -> None:
        """Ask every broker for its topics (one refresh at a time, shared by all callers)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        answers = await asyncio.gather(
            *(self._pool.request(b, RequestCode.TOPIC_LIST) for b in self._brokers),
            return_exceptions=True,
        )
        table: dict[str, list[QueueRoute]] = {}
        errors = []
        for broker, answer in zip(self._brokers, answers):
            if isinstance(answer, BaseException):
                errors.append(answer)
                continue
            for topic, queue_count in answer.fields["topics"].items():
                table.setdefault(topic, []).extend(QueueRoute(topic, q, broker) for q in range(queue_count))
        if len(errors) == len(self._brokers):
            first = errors[0]
            if isinstance(first, GmsError):
                raise first
            raise RuntimeError(f"no broker answered TOPIC_LIST: {first!r}") from first
        self._table = table
        self._fetched_at = time.monotonic()
