"""Topic administration, broker status, and the group offsets an operator sets or deletes
(``gms group reset-offsets`` / ``gms group delete``, Kafka's OffsetDelete): the gms wire adapter of
:class:`gms.broker.services.topics.TopicService` and of :class:`gms.broker.services.groups.GroupService`.

CREATE_TOPIC, CREATE_TOPICS, UPDATE_TOPIC and DELETE_TOPIC are a standalone broker's own (a broker
in a cluster refuses them: :mod:`gms.broker.services.topics`). Group offsets (RESET_OFFSETS,
DELETE_GROUP, DELETE_OFFSETS) stay broker requests in both modes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.broker.group_handlers import group_name_field
from gms.broker.services.groups import GroupService
from gms.broker.services.topics import TopicService
from gms.errors import GmsError
from gms.naming import SYSTEM_TOPIC_FIELD
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.groups import queue_offsets, queue_refs
from gms.protocol.rows import encode
from gms.protocol.topic_batch import entry_name, error_row, ok_row, topic_entries


class AdminHandlers:
    def __init__(self, service: TopicService, groups: GroupService, default_queue_count: int) -> None:
        self.service = service
        self.groups = groups
        self.default_queue_count = default_queue_count

    async def create_topic(self, request: Frame) -> Response:
        await self._create(request.fields)
        return Response()

    async def _create(self, fields: Mapping[str, Any]) -> int:
        self.service.refuse_in_cluster("create", fields.get("topic"))
        return await self.service.create_topic(
            field(fields, "topic", str), field(fields, "queues", int, self.default_queue_count),
            field(fields, "settings", dict, {}), field(fields, SYSTEM_TOPIC_FIELD, bool, False))

    async def create_topics(self, request: Frame) -> Response:
        """Each entry as its own CREATE_TOPIC would create it; a result row per entry, one
        topic's failure not failing the others (docs/protocol.md)."""
        entries = topic_entries(request.fields)
        self.service.refuse_in_cluster("create", " ".join(str(entry_name(e)) for e in entries))
        rows = []
        for entry in entries:  # a name given twice: the second finds the first created
            name = entry_name(entry)
            try:
                rows.append(ok_row(name, queues=await self._create(entry)))
            except GmsError as err:
                rows.append(error_row(name, err))
        return Response({"topics": rows})

    async def update_topic(self, request: Frame) -> Response:
        fields = request.fields
        self.service.refuse_in_cluster("update", fields.get("topic"))
        await self.service.update_topic(field(fields, "topic", str), field(fields, "queues", int, None),
                                        field(fields, "settings", dict, {}))
        return Response()

    async def delete_topic(self, request: Frame) -> Response:
        self.service.refuse_in_cluster("delete", request.fields.get("topic"))
        await self.service.delete_topic(field(request.fields, "topic", str))
        return Response()

    async def topic_list(self, request: Frame) -> Response:
        return Response({"topics": self.service.topics()})

    async def topic_stats(self, request: Frame) -> Response:
        """One topic's queue bounds (``topic``), or many topics' (``topics``: a row each, one
        unknown here failing alone): the console and ``gms group describe`` read a thousand
        topics in one request, not a thousand."""
        fields = request.fields
        if "topics" not in fields:
            return Response({"queues": self._queue_bounds(field(fields, "topic", str))})
        rows = []
        for entry in topic_entries(fields):
            try:
                rows.append(ok_row(field(entry, "topic", str), queues=self._queue_bounds(field(entry, "topic", str))))
            except GmsError as err:
                rows.append(error_row(entry_name(entry), err))
        return Response({"topics": rows})

    def _queue_bounds(self, topic: str) -> list[dict[str, int]]:
        return [{"queue_id": b.queue_id, "min_offset": b.min_offset, "max_offset": b.max_offset}
                for b in self.service.topic_stats(topic)]

    async def reset_offsets(self, request: Frame) -> Response:
        fields = request.fields
        stored = await self.groups.reset_offsets(group_name_field(fields), queue_offsets(fields, "offsets"),
                                                 field(fields, "force", bool, False))
        return Response({"offsets": [encode(entry) for entry in stored]})

    async def delete_group(self, request: Frame) -> Response:
        fields = request.fields
        queues = await self.groups.delete_group(group_name_field(fields), field(fields, "force", bool, False))
        return Response({"queues": [encode(queue) for queue in queues]})

    async def delete_offsets(self, request: Frame) -> Response:
        fields = request.fields
        queues = await self.groups.delete_offsets(group_name_field(fields), queue_refs(fields, "queues"),
                                                  field(fields, "force", bool, False))
        return Response({"queues": [encode(queue) for queue in queues]})

    async def broker_status(self, request: Frame) -> Response:
        return Response(self.service.status())
