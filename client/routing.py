"""Where a topic's queues live: the seam between the SDK and route discovery.

:class:`RouteProvider` is all producers and consumers know. :class:`StaticRoutes` asks a
fixed list of brokers for their topics; :class:`NameserverRoutes` asks nameservers (GET_ROUTE),
fails over between them and keeps serving its cached routes while none answers.
:class:`BackgroundRefresh` serves a producer routes that aged out while it fetches them again.
:class:`BrokerFaults` is the producer's short memory of brokers that just failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from gms.client.connections import ConnectionPool, parse_address
from gms.errors import (
    ConnectionClosedError,
    GmsError,
    RequestTimeoutError,
    ServiceUnavailableError,
    TopicNotFoundError,
    UnknownCodeError,
)
from gms.log_throttle import Outage
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Body, Frame

log = logging.getLogger(__name__)

ROUTE_REFRESH_INTERVAL_MS = 30_000
# While no nameserver answers, cached routes are reused and a new attempt is made at most this often.
NAMESERVER_RETRY_MS = 1000
NAMESERVER_REQUEST_TIMEOUT_MS = 3000
# A broker that failed a send is skipped by queue selection this long (RocketMQ's
# notAvailableDuration for a failed send is 30 s; routes already drop a dead broker within the
# lease TTL, so a few seconds are enough to avoid it in the meantime).
FAULT_PENALTY_MS = 5000
# Failures that say "this broker is unreachable" rather than "this request is wrong".
UNREACHABLE_ERRORS = (ServiceUnavailableError, ConnectionClosedError, RequestTimeoutError)
# A request to a replicated queue's leader that has waited this long has the routes checked (again
# at this interval, one GET_ROUTE per topic for all its waiting requests): a paused or cut-off
# leader answers nothing, and once another broker leads the queue the request is abandoned.
LEADER_CHECK_INTERVAL_MS = 250
# The same for long polls (PULL, POP), which wait on a healthy leader too: less often.
LONG_POLL_LEADER_CHECK_INTERVAL_MS = 1000


class QueueRoute(NamedTuple):
    topic: str
    queue_id: int
    broker: str  # "host:port"
    replicated: bool = False  # the queue has followers: a new leader takes over if its broker dies


class RouteProvider(Protocol):
    """Routes of topics, cached; ``invalidate`` after an error that suggests they moved."""

    @property
    def brokers(self) -> list[str]:
        """The brokers known without I/O (for best-effort work such as leaving a group)."""

    def cached(self, topic: str) -> list[QueueRoute] | None:
        """The cached routes if fresh, without I/O (None: call :meth:`routes`)."""

    def last_known(self, topic: str) -> list[QueueRoute] | None:
        """The routes last fetched, however old, unless invalidated since (an error suggested they
        moved): what a producer keeps sending on while it refreshes them in the background, as
        Kafka's does, instead of stopping its sends for a lookup whenever they age out."""

    async def routes(self, topic: str) -> list[QueueRoute]:
        """The queues of ``topic``; raises TopicNotFoundError if no broker has it."""

    async def live_brokers(self) -> list[str]:
        """Every broker address that currently serves (asks the source of routes)."""

    def unknown_topic_route(self, topic: str, queue: int | None) -> QueueRoute | None:
        """Where to send to a topic no route names (None: the topic does not exist)."""

    async def new_leader(self, topic: str, queue_id: int | None, broker: str, max_age_s: float) -> str | None:
        """The broker leading ``topic``'s queue ``queue_id`` (None: any of its queues) in routes at
        most ``max_age_s`` old, if ``broker`` no longer leads it; None while it does, or if unknown."""

    def invalidate(self) -> None: ...


class LeaderMovedError(RequestTimeoutError):
    """A request abandoned unanswered because another broker leads its queue now (its broker lost
    its lease: paused, cut off). Like a timeout, it may have taken effect there; retry at
    ``leader``, where an idempotent producer's retry is recognised if it did."""

    def __init__(self, topic: str, queue_id: int | None, broker: str, leader: str) -> None:
        where = f"{topic}/{queue_id}" if queue_id is not None else f"any queue of {topic}"
        super().__init__(f"{broker} did not answer and no longer leads {where} ({leader} does): request abandoned")
        self.leader = leader


class NameserversUnavailableError(ServiceUnavailableError):
    """No nameserver of the list answered; ``nameservers`` names them."""

    def __init__(self, message: str, nameservers: Sequence[str], failures: Sequence[str]) -> None:
        super().__init__(message)
        self.nameservers = list(nameservers)
        self.failures = list(failures)  # "address: why" for each nameserver tried


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

    async def live_brokers(self) -> list[str]:
        return list(self._brokers)

    def cached(self, topic: str) -> list[QueueRoute] | None:
        if time.monotonic() - self._fetched_at > self._refresh_interval_s:
            return None
        return self._table.get(topic)

    def last_known(self, topic: str) -> list[QueueRoute] | None:
        return None if self._fetched_at == float("-inf") else self._table.get(topic)

    async def routes(self, topic: str) -> list[QueueRoute]:
        found = self.cached(topic)
        if found is None:
            await self.refresh()
            found = self._table.get(topic)
        if not found:
            raise TopicNotFoundError(f"topic {topic!r} exists on none of the brokers {self._brokers}")
        return found

    def unknown_topic_route(self, topic: str, queue: int | None) -> QueueRoute | None:
        # Let the broker decide: it may auto-create the topic, or say it is unknown.
        self.invalidate()
        return QueueRoute(topic, queue or 0, self._brokers[0])

    def invalidate(self) -> None:
        self._fetched_at = float("-inf")

    async def new_leader(self, topic: str, queue_id: int | None, broker: str, max_age_s: float) -> str | None:
        return None  # unreplicated brokers: a queue never moves to another one

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
        for broker, answer in zip(self._brokers, answers, strict=True):
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


def split_addresses(addresses: str | Sequence[str]) -> list[str]:
    """``"h:p,h2:p"`` or a list of them → checked ``host:port`` strings (ValueError if bad)."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    found = [a.strip() for a in items if a.strip()]
    if not found:
        raise ValueError("at least one nameserver address is needed")
    for address in found:
        try:
            parse_address(address)
        except ValueError as err:
            raise ValueError(f"address {address!r} is not host:port") from err
    return found


class _CachedRoute(NamedTuple):
    routes: list[QueueRoute]  # queues with a live leader, by queue id
    fetched_at: float  # monotonic seconds; -inf once invalidated


class NameserverRoutes:
    """Routes from GET_ROUTE answers of a list of nameservers, cached per topic.

    A topic's route is refetched when older than ``refresh_interval_ms`` or after
    :meth:`invalidate` (which clients call on routing errors). Nameservers are tried in order,
    starting with the one that answered last. When none answers, the last routes keep being
    used (logged once per outage) and a nameserver is asked again at most every
    ``NAMESERVER_RETRY_MS``. Queues whose leader is not registered are left out.
    """

    def __init__(self, nameservers: str | Sequence[str], pool: ConnectionPool, *,
                 refresh_interval_ms: float = ROUTE_REFRESH_INTERVAL_MS,
                 request_timeout_ms: float = NAMESERVER_REQUEST_TIMEOUT_MS) -> None:
        self.nameservers = split_addresses(nameservers)
        self._pool = pool
        self._refresh_interval_s = refresh_interval_ms / 1000
        self._request_timeout_ms = request_timeout_ms
        self._table: dict[str, _CachedRoute] = {}
        self._fetching: dict[str, asyncio.Task[list[QueueRoute]]] = {}
        self._preferred = 0  # index of the nameserver that answered last
        self._outage = Outage(log, f"route lookup on nameservers {','.join(self.nameservers)}")
        self._known_brokers: list[str] = []

    @property
    def brokers(self) -> list[str]:
        seen = dict.fromkeys(self._known_brokers)
        for entry in list(self._table.values()):
            seen.update(dict.fromkeys(r.broker for r in entry.routes))
        return list(seen)

    def cached(self, topic: str) -> list[QueueRoute] | None:
        entry = self._table.get(topic)
        if entry is None or time.monotonic() - entry.fetched_at > self._refresh_interval_s:
            return None
        return entry.routes

    def last_known(self, topic: str) -> list[QueueRoute] | None:
        entry = self._table.get(topic)
        return None if entry is None or entry.fetched_at == float("-inf") else entry.routes

    async def routes(self, topic: str) -> list[QueueRoute]:
        return await self._routes(topic, self._refresh_interval_s)

    async def _routes(self, topic: str, max_age_s: float) -> list[QueueRoute]:
        entry = self._table.get(topic)
        if entry is not None and time.monotonic() - entry.fetched_at <= max_age_s:
            return entry.routes
        task = self._fetching.get(topic)
        if task is None or task.done():  # one fetch per topic at a time, shared by all callers
            task = self._fetching[topic] = asyncio.ensure_future(self._fetch(topic))
        return await asyncio.shield(task)

    async def new_leader(self, topic: str, queue_id: int | None, broker: str, max_age_s: float) -> str | None:
        try:
            routes = await self._routes(topic, max_age_s)
        except GmsError:
            return None  # no answer now: the request waits on
        leaders = {r.broker for r in routes if queue_id is None or r.queue_id == queue_id}
        if not leaders or broker in leaders:
            return None  # a queue whose leader is not registered is left out: no successor yet
        return min(leaders)

    def unknown_topic_route(self, topic: str, queue: int | None) -> QueueRoute | None:
        return None  # the nameservers are the authority: an unknown topic does not exist

    def invalidate(self) -> None:
        for topic, entry in list(self._table.items()):
            self._table[topic] = entry._replace(fetched_at=float("-inf"))

    async def live_brokers(self) -> list[str]:
        frame = await self.request(RequestCode.GET_BROKER_LIST)
        self._known_brokers = [b["address"] for b in frame.fields["brokers"]]
        return list(self._known_brokers)

    async def request(self, code: int, fields: Mapping[str, Any] | None = None) -> Frame:
        """``code`` on the first nameserver that answers (the last good one first).

        Error responses of a nameserver (TOPIC_NOT_FOUND, INVALID_TOPIC...) are raised as they
        are; only unreachable nameservers are skipped. :class:`NameserversUnavailableError` when
        none answers."""
        count = len(self.nameservers)
        failures: list[str] = []
        for step in range(count):
            index = (self._preferred + step) % count
            address = self.nameservers[index]
            try:
                frame = await self._pool.request(address, code, fields, timeout_ms=self._request_timeout_ms)
            except UNREACHABLE_ERRORS as err:
                failures.append(f"{address}: {err}")
                continue
            except UnknownCodeError as err:  # a broker's port, most likely: brokers answer this
                asked = next((c.name for c in RequestCode if c == code), code)
                raise UnknownCodeError(
                    f"{address} is not a nameserver (it does not know {asked}): is it a broker's port?"
                    " Give the nameserver's address (--nameserver / GMS_NAMESERVER, the SDK's nameserver=);"
                    " `gms standalone` prints it") from err
            if index != self._preferred:
                log.info("nameserver %s answers; using it instead of %s", address,
                         self.nameservers[self._preferred])
                self._preferred = index
            self._outage.recovered()
            return frame
        raise NameserversUnavailableError(
            f"no nameserver at {','.join(self.nameservers)} answered ({'; '.join(failures)})",
            self.nameservers, failures)

    async def _fetch(self, topic: str) -> list[QueueRoute]:
        try:
            frame = await self.request(RequestCode.GET_ROUTE, {"topic": topic})
        except TopicNotFoundError:
            self._table.pop(topic, None)
            raise
        except NameserversUnavailableError as err:
            entry = self._table.get(topic)
            if entry is None:
                raise
            self._outage.failed(f"{err}; working on cached routes until one is back")
            # Serve the old routes; ask again after NAMESERVER_RETRY_MS, not on every call.
            retry_at = time.monotonic() - self._refresh_interval_s + NAMESERVER_RETRY_MS / 1000
            self._table[topic] = entry._replace(fetched_at=retry_at)
            return entry.routes
        routes = [QueueRoute(topic, q["queue_id"], q["leader"], len(q.get("replicas", ())) > 1)
                  for q in frame.fields["queues"] if q["leader"]]
        routes.sort(key=lambda r: r.queue_id)
        if not routes:
            raise ServiceUnavailableError(
                f"no queue of topic {topic!r} has a live broker now; retry when a broker is back")
        self._table[topic] = _CachedRoute(routes, time.monotonic())
        return routes

class BackgroundRefresh:
    """A producer's routes from ``provider``: the cached ones, or once they aged out the last known
    ones while a fetch on ``loop`` refreshes them, one at a time per topic (Kafka's producer does
    so: ``metadata.max.age.ms``). Routes an error invalidated are not served. Called from any
    thread: a lookup on the sending thread for each topic whose routes aged out stopped a producer
    over a thousand topics for a thousand round trips every refresh interval."""

    def __init__(self, provider: RouteProvider, loop: asyncio.AbstractEventLoop) -> None:
        self._provider = provider
        self._loop = loop
        self._refreshing: set[str] = set()  # topics whose routes are being fetched again

    def routes(self, topic: str) -> list[QueueRoute] | None:
        """Routes to send on without I/O (None: they are to be looked up)."""
        found = self._provider.cached(topic)
        if found is None:
            found = self._provider.last_known(topic)
            if found is not None and topic not in self._refreshing:
                self._refreshing.add(topic)
                try:
                    self._loop.call_soon_threadsafe(self._refresh, topic)
                except RuntimeError:  # the loop is closed (the client too): the send says so
                    self._refreshing.discard(topic)
        return found

    def _refresh(self, topic: str) -> None:
        """Fetch ``topic``'s routes again (on the loop); a failure leaves them to the next send's lookup."""
        def done(task: asyncio.Task[list[QueueRoute]]) -> None:
            self._refreshing.discard(topic)
            if not task.cancelled() and task.exception() is not None:
                log.debug("background route refresh of %s failed: %s", topic, task.exception())

        asyncio.ensure_future(self._provider.routes(topic)).add_done_callback(done)


async def abandon_when(request: Awaitable[Frame], check: Callable[[], Awaitable[GmsError | None]],
                       check_interval_ms: float) -> Frame:
    """``request``'s answer. While it waits, ``check()`` is asked every ``check_interval_ms``: an
    error it returns gives the request up (a late answer is dropped) and is raised."""
    task = asyncio.ensure_future(request)
    try:
        while True:
            done, _ = await asyncio.wait((task,), timeout=check_interval_ms / 1000)
            if done:
                return task.result()
            error = await check()
            if error is not None and not task.done():
                raise error
    finally:
        task.cancel()  # a no-op once done


async def leader_moved(routes: RouteProvider, topic: str, queue_id: int | None, broker: str,
                       max_age_s: float) -> LeaderMovedError | None:
    """The error to give a request to ``broker`` up with if routes at most ``max_age_s`` old name
    another leader of ``topic``'s queue ``queue_id`` (None: ``broker`` leads none of the topic's)."""
    leader = await routes.new_leader(topic, queue_id, broker, max_age_s)
    return None if leader is None else LeaderMovedError(topic, queue_id, broker, leader)


async def leader_request(routes: RouteProvider, pool: ConnectionPool, topic: str, queue_id: int | None,
                         broker: str, code: int, fields: Mapping[str, Any] | None = None, body: Body = b"", *,
                         timeout_ms: float | None = None,
                         check_interval_ms: float = LEADER_CHECK_INTERVAL_MS) -> Frame:
    """``code`` to ``broker``, the leader of ``topic``'s queue ``queue_id`` (None: of some queue of
    ``topic``) when the routes were read, given up with :class:`LeaderMovedError` as soon as the
    routes (checked every ``check_interval_ms`` while it waits) name another leader, instead of
    waiting out ``timeout_ms`` on a broker that lost its lease (a paused process keeps its
    connections open and answers nothing)."""
    max_age_s = check_interval_ms / 1000
    return await abandon_when(pool.request(broker, code, fields, body, timeout_ms=timeout_ms),
                              lambda: leader_moved(routes, topic, queue_id, broker, max_age_s), check_interval_ms)


class BrokerFaults:
    """Brokers that just failed, avoided by queue selection for ``penalty_ms``.

    RocketMQ's latency fault tolerance in its simplest form: a broker that could not be reached
    is skipped while it has other choices; if every broker of a topic is penalised, the
    selection falls back to the plain round robin. Thread-safe enough: one dict, atomic ops.
    """

    def __init__(self, penalty_ms: float = FAULT_PENALTY_MS) -> None:
        self._penalty_s = penalty_ms / 1000
        self._until: dict[str, float] = {}

    def failed(self, broker: str) -> None:
        self._until[broker] = time.monotonic() + self._penalty_s

    def available(self, broker: str) -> bool:
        until = self._until.get(broker)
        if until is None:
            return True
        if time.monotonic() >= until:
            self._until.pop(broker, None)
            return True
        return False

    def pick(self, routes: Sequence[QueueRoute], counter: int) -> QueueRoute:
        """The ``counter``-th queue in round robin, skipping queues of penalised brokers."""
        count = len(routes)
        if not self._until:
            return routes[counter % count]
        for step in range(count):
            route = routes[(counter + step) % count]
            if self.available(route.broker):
                return route
        return routes[counter % count]
