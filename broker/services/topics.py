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
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gms import __version__
from gms.broker.store.topic_table import TopicLimits
from gms.cluster.errors import EtcdUnavailable
from gms.cluster.model import BrokerInfo
from gms.errors import BadRequestError, NotLeaderError, TopicNotFoundError
from gms.naming import check_creatable
from gms.store_errors import UnknownTopic

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

# How often a topic on its way is looked for: the view and the broker's assignment change on
# other threads and tasks; this polling runs only for a topic etcd has and this broker does not yet.
ARRIVAL_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class QueueBounds:
    queue_id: int
    min_offset: int
    max_offset: int


class TopicService:
    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker
        self.store = broker.store

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
            if not 0 <= queue_id < (self.store.topics().get(topic) or 0):
                raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
            raise NotLeaderError(f"this broker does not lead {topic}/{queue_id}: refresh the route")

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

    def message_type(self, topic: str) -> str | None:
        """``topic``'s message type (gms.cluster.model.TOPIC_MESSAGE_TYPES; None: mixed)."""
        registration = self.broker.registration
        if registration is None:
            return self.store.topic_limits(topic).message_type
        return registration.topic(topic).settings.message_type

    async def arrival(self, topic: str, timeout_s: float, *, led_here: bool) -> None:
        """Return once the cluster's view holds ``topic`` and, with ``led_here``, this broker leads a
        queue of it wherever the view names it leader (it has applied the topic's assignment); at
        once for a topic etcd does not hold either, or a lone broker (it creates topics in place),
        and after ``timeout_s`` regardless: the caller then answers what it finds."""
        registration = self.broker.registration
        if registration is None or not self._arriving(topic, led_here):
            return
        if not registration.has_topic(topic):
            try:  # one etcd read tells a topic on its way from one that does not exist
                if not await asyncio.to_thread(registration.topic_in_etcd, topic):
                    return
            except EtcdUnavailable as err:
                log.debug("cannot ask etcd about topic %s (%s): answering from the view", topic, err)
                return
        deadline = time.monotonic() + timeout_s
        while self._arriving(topic, led_here) and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(ARRIVAL_POLL_S, left))

    def _arriving(self, topic: str, led_here: bool) -> bool:
        """Whether ``topic`` is not yet as the cluster made it: not in the view, or (``led_here``)
        routed to this broker's leadership but not led here. A send to a queue led here costs one
        look at the broker's own queues."""
        registration = self.broker.registration
        if registration is None:
            return False
        if led_here:
            try:
                if self.queues_led(topic):
                    return False
            except TopicNotFoundError:
                pass
        try:
            route = registration.route(topic)
        except TopicNotFoundError:
            return True
        return led_here and any(queue.leader_address == self.broker.address for queue in route.queues)

    def topics(self) -> dict[str, int]:
        """Topic → queue count."""
        return self.store.topics()

    def topic_stats(self, topic: str) -> list[QueueBounds]:
        count = self.store.topics().get(topic)
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
