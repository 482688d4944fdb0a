"""Topics and the broker's status: a standalone broker's topic administration (create, update,
delete), the topic list and a topic's queue offsets, and what BROKER_STATUS reports.

Creating, updating and deleting topics are a standalone broker's own. A broker in a cluster
(started with ``--nameserver``) refuses them: its topics follow the queue assignments the
nameservers write to etcd, and a topic created, changed or deleted on one replica alone would
disagree with the routes (a direct DELETE_TOPIC wiped a replica the nameserver kept routing to).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gms import __version__
from gms.broker.topics import TopicLimits
from gms.errors import BadRequestError
from gms.naming import check_creatable
from gms.store_errors import UnknownTopic

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer


@dataclass(frozen=True, slots=True)
class QueueBounds:
    queue_id: int
    min_offset: int
    max_offset: int


class AdminService:
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
