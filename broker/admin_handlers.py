"""Topic administration and broker status."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gms import __version__
from gms.broker.topics import TopicLimits
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.store_errors import UnknownTopic

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer


class AdminHandlers:
    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker
        self.store = broker.store

    async def create_topic(self, request: Frame) -> Response:
        queues = field(request.fields, "queues", int, self.broker.config.default_queue_count)
        limits = TopicLimits().merged(field(request.fields, "settings", dict, {}))
        self.store.create_topic(field(request.fields, "topic", str), queues, limits)
        return Response()

    async def update_topic(self, request: Frame) -> Response:
        """Grow the queue count and/or change the settings named (a standalone broker's topics)."""
        topic, settings = field(request.fields, "topic", str), field(request.fields, "settings", dict, {})
        limits = self.store.topic_limits(topic).merged(settings) if settings else None
        self.store.update_topic(topic, field(request.fields, "queues", int, None), limits)
        return Response()

    async def delete_topic(self, request: Frame) -> Response:
        topic = field(request.fields, "topic", str)
        self.store.delete_topic(topic)
        self.broker.offsets.delete_topic(topic)
        return Response()

    async def topic_list(self, request: Frame) -> Response:
        return Response({"topics": self.store.topics()})

    async def topic_stats(self, request: Frame) -> Response:
        topic = field(request.fields, "topic", str)
        count = self.store.topics().get(topic)
        if count is None:
            raise UnknownTopic(topic)
        queues = [
            {"queue_id": q, "min_offset": self.store.min_offset(topic, q),
             "max_offset": self.store.max_offset(topic, q)}
            for q in range(count)
        ]
        return Response({"queues": queues})

    async def broker_status(self, request: Frame) -> Response:
        broker, store = self.broker, self.store
        stats = store.stats()
        return Response({
            "name": broker.name,
            "address": broker.address,
            "version": __version__,
            "uptime_s": round(time.monotonic() - broker.started_monotonic, 3),
            "flush_mode": store.config.flush_mode,
            "commitlog_min_offset": stats.min_offset,
            "commitlog_max_offset": stats.max_offset,
            "flushed_offset": store.flushed_offset,
            "disk_used_bytes": stats.disk_used_bytes,
            "topics": len(store.topics()),
            "connections": broker.rpc.connection_count,
            # Groups with live members here or committed offsets here.
            "groups": sorted({*broker.groups.group_names(), *broker.offsets.groups()}),
        })
