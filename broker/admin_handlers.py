"""Topic administration, broker status, and the group offsets an operator sets or deletes
(``gms group reset-offsets`` / ``gms group delete``).

CREATE_TOPIC, CREATE_TOPICS, UPDATE_TOPIC and DELETE_TOPIC are a standalone broker's own. A broker in a
cluster (started with ``--nameserver``) refuses them: its topics follow the queue assignments
the nameservers write to etcd, and a topic created, changed or deleted on one replica alone
would disagree with the routes (a direct DELETE_TOPIC wiped a replica the nameserver kept
routing to). Group offsets (RESET_OFFSETS, DELETE_GROUP) stay broker requests in both modes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gms import __version__
from gms.broker.group_handlers import group_name_field
from gms.broker.topics import TopicLimits
from gms.errors import BadRequestError, GmsError, GroupNotEmptyError
from gms.naming import SYSTEM_TOPIC_FIELD, check_creatable
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.groups import QueueOffset, QueueRef, queue_offsets
from gms.protocol.rows import encode
from gms.protocol.topic_batch import entry_name, error_row, ok_row, topic_entries
from gms.store_errors import UnknownTopic

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer


class AdminHandlers:
    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker
        self.store = broker.store

    def _refuse_in_cluster(self, what: str, topic: object) -> None:
        nameserver = self.broker.config.nameserver
        if nameserver:
            raise BadRequestError(
                f"cannot {what} topic {topic!r} on broker {self.broker.address}: this broker is in a cluster,"
                f" whose topics are created, updated and deleted through its nameserver: `gms topic {what}"
                f" {topic} --nameserver {nameserver}` (or Admin(nameserver=...))")

    async def create_topic(self, request: Frame) -> Response:
        self._refuse_in_cluster("create", request.fields.get("topic"))
        queues = field(request.fields, "queues", int, self.broker.config.default_queue_count)
        limits = TopicLimits().merged(field(request.fields, "settings", dict, {}))
        system = field(request.fields, SYSTEM_TOPIC_FIELD, bool, False)
        topic = check_creatable(field(request.fields, "topic", str), system)
        await asyncio.wrap_future(self.store.create_topics_async({topic: (queues, limits)}))
        return Response()

    async def create_topics(self, request: Frame) -> Response:
        """Each entry as its own CREATE_TOPIC would create it; a result row per entry, one
        topic's failure not failing the others (docs/protocol.md)."""
        entries = topic_entries(request.fields)
        self._refuse_in_cluster("create", " ".join(str(entry_name(e)) for e in entries))
        rows = []
        for entry in entries:  # a name given twice: the second finds the first created
            name = entry_name(entry)
            try:
                await self.create_topic(request._replace(fields=entry))
                rows.append(ok_row(name, queues=self.store.topics()[name]))
            except GmsError as err:
                rows.append(error_row(name, err))
        return Response({"topics": rows})

    async def update_topic(self, request: Frame) -> Response:
        """Grow the queue count and/or change the settings named (a standalone broker's topics)."""
        self._refuse_in_cluster("update", request.fields.get("topic"))
        topic, settings = field(request.fields, "topic", str), field(request.fields, "settings", dict, {})
        limits = self.store.topic_limits(topic).merged(settings) if settings else None
        await asyncio.wrap_future(self.store.update_topic_async(topic, field(request.fields, "queues", int, None),
                                                                limits))
        return Response()

    async def delete_topic(self, request: Frame) -> Response:
        self._refuse_in_cluster("delete", request.fields.get("topic"))
        topic = field(request.fields, "topic", str)
        removed = self.store.delete_topics([topic])  # served no more; its files go in the background
        self.broker.offsets.delete_topic(topic)
        await asyncio.wrap_future(removed)
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

    # --- group offsets set by an operator ---------------------------------------------------------

    async def reset_offsets(self, request: Frame) -> Response:
        """Set committed offsets of a group. Unlike COMMIT_OFFSET no member has to own the
        queues, and each offset is clamped to what consumers can read: [min offset, max offset]
        (the high watermark where the queue is replicated). All or nothing: every queue is
        checked (led here, exists) before any offset changes."""
        group = group_name_field(request.fields)
        entries = queue_offsets(request.fields, "offsets")
        self._refuse_live_members(group, request.fields, [(topic, queue_id) for topic, queue_id, _ in entries])
        stored = []
        for topic, queue_id, offset in entries:
            low, high = self.broker.readable((topic, queue_id))
            stored.append(QueueOffset(topic, queue_id, min(max(offset, low), high)))
        offsets = self.broker.offsets
        for topic, queue_id, offset in stored:
            offsets.commit(group, topic, queue_id, offset)
        await offsets.persist_async()
        self.broker.offsets_changed([(topic, queue_id) for topic, queue_id, _ in stored])
        return Response({"offsets": [encode(entry) for entry in stored]})

    async def delete_group(self, request: Frame) -> Response:
        """Delete every offset the group committed here (as leader or follower); followers
        that miss this request delete them from their next REPLICA_FETCH."""
        group = group_name_field(request.fields)
        self._refuse_live_members(group, request.fields, None)
        queues = self.broker.offsets.delete_group(group)
        await self.broker.offsets.persist_async()
        self.broker.offsets_changed(queues)
        return Response({"queues": [encode(QueueRef(*key)) for key in queues]})

    def _refuse_live_members(self, group: str, fields: Mapping[str, Any],
                             queues: list[tuple[str, int]] | None) -> None:
        """Members would commit over the change: refuse while any reads ``queues`` (all of the
        group's queues when None) here, or heartbeats here if this broker coordinates the group.
        ``force`` skips this check; the Admin client asks the group's coordinator first."""
        if field(fields, "force", bool, False):
            return
        known = self.broker.groups.group(group)
        live = set(known.members) if known is not None else set()
        live |= self.broker.claims.readers(group, int(time.time() * 1000), queues)
        if live:
            raise GroupNotEmptyError(f"group {group!r} has live members: {', '.join(sorted(live))}")

    async def broker_status(self, request: Frame) -> Response:
        broker, store = self.broker, self.store
        stats = store.stats()
        return Response({
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
        })
