"""Topics and the broker's status: a standalone broker's topic administration (create, update,
delete), the topic list and a topic's queue offsets, the queues led here, a topic's route in
the cluster and its settings, and what BROKER_STATUS reports.

A topic is used the moment its creation returns, but the cluster's view hears of it through
etcd's watch and the broker takes its queues on its event loop a moment later (seconds after a
burst of creations on a busy host): :meth:`TopicService.arrival` waits for it, so that a
protocol's client does not find it missing.

Creating, updating and deleting topics are a standalone broker's own. A broker in a cluster
(started with ``--nameserver``) refuses them: its topics follow the queue assignments the
nameservers write to etcd, and a topic created, changed or deleted on one replica alone would
disagree with the routes (a direct DELETE_TOPIC wiped a replica the nameserver kept routing to).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Collection, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gms import __version__
from gms.address import split_address
from gms.broker.store.topic_table import TopicLimits
from gms.cluster.errors import EtcdUnavailable
from gms.cluster.model import BrokerInfo
from gms.errors import BadRequestError, GmsError, NotLeaderError, ServiceUnavailableError, TopicNotFoundError
from gms.naming import check_creatable
from gms.net import Connection
from gms.protocol.codes import RequestCode
from gms.security.users import Principal
from gms.store_errors import UnknownTopic

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

# How often a topic on its way is looked for while no assignment is applied here (the view changes
# on the etcd watch thread); an applied assignment wakes every waiter at once. Runs only for a
# topic etcd has and this broker does not serve yet.
ARRIVAL_POLL_S = 0.05
REQUEST_TIMEOUT_MS = 10_000  # a request to a nameserver
# The user a topic change at the nameservers is made for: an adapter that authenticated its client
# (the Kafka API) sets it around the call, and the nameservers hold the change to that user's
# rights rather than the broker credential's (nameserver/access.py; docs/security.md).
ACTING_FOR: ContextVar[Principal | None] = ContextVar("gms_acting_for", default=None)


@dataclass(frozen=True, slots=True)
class QueuePlacement:
    """Who holds a queue in the cluster: its leader (None while down), every registered replica
    (``assigned``, preferred leader first) and those in sync, with the leader's epoch;
    ``preferred``: the address of its preferred leader, registered or not."""

    queue_id: int
    leader: BrokerInfo | None
    assigned: tuple[BrokerInfo, ...]
    isr: tuple[BrokerInfo, ...]
    leader_epoch: int
    preferred: str = ""


@dataclass(frozen=True, slots=True)
class QueueBounds:
    queue_id: int
    min_offset: int
    max_offset: int


class TopicService:
    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker
        self.store = broker.store
        self._applied = asyncio.Event()  # set (and replaced) each time an assignment is applied here

    def refuse_in_cluster(self, what: str, topic: object) -> None:
        """BadRequestError for a topic change on a broker in a cluster (see the module docstring)."""
        nameserver = self.broker.config.nameserver
        if nameserver:
            raise BadRequestError(
                f"cannot {what} topic {topic!r} on broker {self.broker.address}: this broker is in a cluster,"
                f" whose topics are created, updated and deleted through its nameserver: `gms topic {what}"
                f" {topic} --nameserver {nameserver}` (or Admin(nameserver=...))")

    async def create_topic(self, topic: str, queues: int, settings: dict[str, Any], system: bool = False) -> int:
        """Create ``topic`` (a system topic's name only with ``system``); its queue count."""
        self.refuse_in_cluster("create", topic)
        limits = TopicLimits().merged(settings)
        topic = check_creatable(topic, system)
        await asyncio.wrap_future(self.store.create_topics_async({topic: (queues, limits)}))
        return self.store.topics()[topic]

    async def update_topic(self, topic: str, queues: int | None, settings: dict[str, Any]) -> None:
        """Grow the queue count and/or change the settings named."""
        self.refuse_in_cluster("update", topic)
        limits = self.store.topic_limits(topic).merged(settings) if settings else None
        await asyncio.wrap_future(self.store.update_topic_async(topic, queues, limits))

    async def delete_topic(self, topic: str) -> None:
        self.refuse_in_cluster("delete", topic)
        removed = self.store.delete_topics([topic])  # served no more; its files go in the background
        self.broker.offsets.delete_topic(topic)
        await asyncio.wrap_future(removed)

    def queues_led(self, topic: str) -> list[int]:
        """The queues of ``topic`` this broker leads now (TopicNotFoundError: no such topic here)."""
        return self.broker.queues_led(topic)

    def check_led(self, topic: str, queue_id: int) -> None:
        """BadRequestError if ``topic`` has no such queue, NotLeaderError if another broker leads it."""
        if queue_id not in self.queues_led(topic):
            if not 0 <= queue_id < (self.store.queue_count(topic) or 0):
                raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
            raise NotLeaderError(f"this broker does not lead {topic}/{queue_id}: refresh the route")

    async def delete_records(self, topic: str, queue_id: int, offset: int) -> int:
        """Kafka's DeleteRecords: the queue (led here) serves no records below ``offset`` any more
        (nor below the high watermark where it is replicated: retention's limit); its followers
        move their first offset to it with their next fetch. The queue's first offset.
        BadRequestError for a queue of a compacted topic: its compacted records below stay."""
        self.check_led(topic, queue_id)
        if self.store.topic_limits(topic).compacted:
            raise BadRequestError(f"topic {topic!r} is compacted: its records are deleted by key, not by offset")
        return await asyncio.to_thread(self.store.delete_records, topic, queue_id, offset)

    def message_size_max(self, topic: str) -> int:
        """The largest body a message of ``topic`` may have (its setting, else the broker's)."""
        return self.store.topic_limits(topic).message_size_bytes_max or self.store.config.body_size_max_bytes

    # -- the cluster's route -----------------------------------------------------------------------

    def leaders(self, topic: str) -> list[tuple[int, BrokerInfo]] | None:
        """``topic``'s queues by id with their leader, as the nameservers route them (the etcd-fed
        view, no I/O; a queue whose leader is down is left out); None on a broker without
        nameservers, which serves its own queues (:meth:`queues_led`). TopicNotFoundError: no
        such topic."""
        registration = self.broker.registration
        if registration is None:
            return None
        live = {info.address: info for info in registration.live_brokers()}
        return [(queue.queue_id, live[queue.leader_address]) for queue in registration.route(topic).queues
                if queue.leader_address in live]

    def live_brokers(self) -> list[BrokerInfo] | None:
        """The cluster's registered brokers (sorted by id); None on a broker without nameservers."""
        registration = self.broker.registration
        return None if registration is None else registration.live_brokers()

    def queue_counts(self) -> dict[str, int]:
        """Every topic with its queue count: the cluster's (as the nameservers route them), or a
        broker without nameservers its own."""
        registration = self.broker.registration
        return self.store.topics() if registration is None else registration.topic_queue_counts()

    def placement(self, topic: str) -> list[QueuePlacement] | None:
        """:meth:`leaders` with each queue's replicas and ISR, every queue (one whose leader is down
        with none); None on a broker without nameservers. TopicNotFoundError: no such topic."""
        registration = self.broker.registration
        if registration is None:
            return None
        live = {info.address: info for info in registration.live_brokers()}

        def known(addresses: tuple[str, ...]) -> tuple[BrokerInfo, ...]:
            return tuple(live[address] for address in addresses if address in live)
        return [QueuePlacement(queue.queue_id, live.get(queue.leader_address or ""), known(queue.replica_addresses),
                              known(queue.isr_addresses), queue.leader_epoch, next(iter(queue.replica_addresses), ""))
                for queue in registration.route(topic).queues]

    async def create_in_cluster(self, topic: str, queues: int, replicas: int, timeout_s: float,
                                settings: dict[str, Any] | None = None) -> None:
        """Create ``topic`` with ``settings``: on this broker when it has no nameservers, else
        through them, and wait (up to ``timeout_s``) until this broker's view holds it."""
        if not self.broker.config.nameserver:
            await self.create_topic(topic, queues, settings or {})
            return
        await self.nameserver_request(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": queues,
                                                                 "replicas": replicas, "settings": settings or {}})
        await self.arrival(topic, timeout_s, led_here=False)

    async def update_in_cluster(self, topic: str, queues: int | None, settings: dict[str, Any],
                                timeout_s: float) -> None:
        """Grow ``topic`` to ``queues`` and/or change the ``settings`` named (None: back to the
        default): on this broker when it has no nameservers, else through them, and wait (up to
        ``timeout_s``) until this broker's view has the change."""
        registration = self.broker.registration
        if not self.broker.config.nameserver or registration is None:
            await self.update_topic(topic, queues, settings)
            return
        before = registration.topic(topic)
        fields: dict[str, object] = {"topic": topic, "settings": settings}
        if queues is not None:
            fields["queues"] = queues
        await self.nameserver_request(RequestCode.UPDATE_TOPIC, fields)
        deadline = time.monotonic() + timeout_s
        while registration.topic(topic) is before and time.monotonic() < deadline:
            await asyncio.sleep(ARRIVAL_POLL_S)

    def topic_settings(self, topic: str) -> dict[str, Any]:
        """``topic``'s settings by name (TopicSettings' fields; None: the broker's default): the
        cluster's, or a broker without nameservers its own. TopicNotFoundError: no such topic."""
        registration = self.broker.registration
        if registration is None:
            if self.store.queue_count(topic) is None:
                raise TopicNotFoundError(f"topic {topic} does not exist")
            return asdict(self.store.topic_limits(topic))
        return asdict(registration.topic(topic).settings)

    def default_retention_ms(self) -> int:
        """How long this broker keeps records of topics without a retention of their own."""
        return self.store.config.retention_ms

    async def delete_in_cluster(self, topic: str) -> None:
        """Delete ``topic``: on this broker when it has no nameservers, else through them."""
        if not self.broker.config.nameserver:
            await self.delete_topic(topic)
            return
        await self.nameserver_request(RequestCode.DELETE_TOPIC, {"topic": topic})

    async def new_producer_id(self) -> int:
        """An id for a new idempotent producer: from the nameservers' counter, as gms's producers
        get theirs; a broker without nameservers draws a random 63-bit one (as the SDK does)."""
        if not self.broker.config.nameserver:
            return secrets.randbits(63) or 1
        return int((await self.nameserver_request(RequestCode.INIT_PRODUCER_ID, {}))["producer_id"])

    async def nameserver_request(self, code: RequestCode, fields: dict[str, object]) -> Mapping[str, Any]:
        """One request to the first nameserver that answers: its answer's fields (its error if it
        refuses). Made for :data:`ACTING_FOR`'s user when an adapter set it."""
        acting = ACTING_FOR.get()
        if acting is not None:
            fields = {**fields, "acting_for": [acting.name, acting.role]}
        registration = self.broker.registration
        if registration is None:
            raise ServiceUnavailableError("the broker is not registered with the cluster yet: retry")
        failed: GmsError | None = None
        for address in registration.nameservers:
            try:
                host, port = split_address(address, "nameserver address")
                connection = await Connection.open(host, port, REQUEST_TIMEOUT_MS,
                                                   request_timeout_ms=REQUEST_TIMEOUT_MS,
                                                   security=self.broker.config.security.outgoing())
            except ServiceUnavailableError as err:
                failed = err
                continue
            try:
                return (await connection.request(code, fields)).fields
            finally:
                connection.close()
        raise failed or ServiceUnavailableError("no nameserver to ask")

    def message_type(self, topic: str) -> str | None:
        """``topic``'s message type (gms.cluster.model.TOPIC_MESSAGE_TYPES; None: mixed)."""
        registration = self.broker.registration
        if registration is None:
            return self.store.topic_limits(topic).message_type
        return registration.topic(topic).settings.message_type

    def arriving_here(self, topic: str) -> bool:
        """Whether ``topic`` is in etcd's view but this broker has not yet taken the queues of it
        the view has it lead (it applies a new topic a moment after its creation returns)."""
        registration = self.broker.registration
        return registration is not None and registration.has_topic(topic) and self._arriving(topic, True, None)

    async def arrival(self, topic: str, timeout_s: float, *, led_here: bool,
                      queues: Collection[int] | None = None) -> None:
        """:meth:`arrivals` of one topic."""
        await self.arrivals({topic: queues}, timeout_s, led_here=led_here)

    async def arrivals(self, topics: Mapping[str, Collection[int] | None], timeout_s: float, *,
                       led_here: bool) -> None:
        """Return once the cluster's view holds each of ``topics`` and, with ``led_here``, this
        broker leads a queue of it (each of its queues given) wherever the view names it leader (it
        has applied the topic's assignment); at once for topics etcd does not hold either, or on
        a lone broker (it creates topics in place), and after ``timeout_s`` regardless: the caller
        then answers what it finds. One waiter for them all, woken by each applied assignment."""
        registration = self.broker.registration
        if registration is None:
            return
        waiting = {t: q for t, q in topics.items() if self._arriving(t, led_here, q)}
        unknown = [t for t in waiting if not registration.has_topic(t)]
        if unknown:
            try:  # one etcd read tells a topic on its way from one that does not exist
                held = await asyncio.to_thread(lambda: [t for t in unknown if registration.topic_in_etcd(t)])
            except EtcdUnavailable as err:
                log.debug("cannot ask etcd about topics %s (%s): answering from the view", unknown[:3], err)
                return
            for topic in set(unknown) - set(held):
                del waiting[topic]
        deadline = time.monotonic() + timeout_s
        while waiting and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied.wait(), min(ARRIVAL_POLL_S, left))
            waiting = {t: q for t, q in waiting.items() if self._arriving(t, led_here, q)}

    def assignments_applied(self) -> None:
        """Wake the :meth:`arrivals` waiting: this broker has just applied an assignment."""
        self._applied.set()
        self._applied = asyncio.Event()

    def _arriving(self, topic: str, led_here: bool, queues: Collection[int] | None) -> bool:
        """Whether ``topic`` is not yet as the cluster made it: not in the view, or (``led_here``)
        a queue of it (of ``queues``) routed to this broker's leadership is not led here yet.
        A send to queues led here costs one look at the broker's own queues."""
        registration = self.broker.registration
        if registration is None:
            return False
        led: Collection[int] = ()
        if led_here:
            try:
                led = set(self.queues_led(topic))
            except TopicNotFoundError:
                pass
            if led and (queues is None or all(queue_id in led for queue_id in queues)):
                return False
        try:
            route = registration.route(topic)
        except TopicNotFoundError:
            return True
        return led_here and any(
            queue.leader_address == self.broker.address and queue.queue_id not in led
            and (queues is None or queue.queue_id in queues) for queue in route.queues)

    def topics(self) -> dict[str, int]:
        """Topic → queue count."""
        return self.store.topics()

    def topic_stats(self, topic: str) -> list[QueueBounds]:
        count = self.store.queue_count(topic)
        if count is None:
            raise UnknownTopic(topic)
        return [QueueBounds(q, self.store.min_offset(topic, q), self.store.max_offset(topic, q)) for q in range(count)]

    def status(self) -> dict[str, Any]:
        """The broker's name, version, uptime, store and connection figures, and its groups."""
        broker, store = self.broker, self.store
        stats = store.stats()
        return {
            "name": broker.name,
            "address": broker.address,
            "version": __version__,
            "uptime_s": round(time.monotonic() - broker.started_monotonic, 3),
            "flush_mode": store.config.flush_mode,
            "store_health": store.health.value,  # writable, read_only (a flush failed) or disk_full
            "commitlog_min_offset": stats.min_offset,
            "commitlog_max_offset": stats.max_offset,
            "flushed_offset": store.flushed_offset,
            "disk_used_bytes": stats.disk_used_bytes,
            "topics": len(store.topics()),
            "connections": broker.rpc.connection_count,
            # Groups with live members here or committed offsets here.
            "groups": sorted({*broker.groups.group_names(), *broker.offsets.groups()}),
        }
