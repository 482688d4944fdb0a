"""Consumer-group requests, the gms wire adapter of :class:`gms.broker.services.groups.GroupService`:
finding the coordinator, heartbeat/membership and group description (served by the group's
coordinator), committed offsets (served by each queue's leader)."""

from __future__ import annotations

from typing import Any

from gms.broker.groups import MODE_CLUSTERING
from gms.broker.services.groups import GroupService, HeartbeatArgs, check_group_name
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.groups import queue_offsets, queue_refs
from gms.protocol.rows import encode


def group_name_field(fields: Any) -> str:
    return check_group_name(field(fields, "group", str))


class GroupHandlers:
    def __init__(self, service: GroupService) -> None:
        self.service = service

    async def find_coordinator(self, request: Frame) -> Response:
        return Response({"coordinator": self.service.coordinator(field(request.fields, "group", str))})

    async def heartbeat(self, request: Frame) -> Response:
        fields = request.fields
        group = group_name_field(fields)
        beat = self.service.heartbeat(HeartbeatArgs(
            group, field(fields, "member", str), field(fields, "subscription", dict),
            client=field(fields, "client", str, ""), mode=field(fields, "mode", str, MODE_CLUSTERING),
            held=tuple(queue_refs(fields, "held")) if "held" in fields else ()))
        return Response({"assignment": beat.assignment, "heartbeat_interval_ms": beat.heartbeat_interval_ms,
                         "member_expiry_ms": self.service.groups.member_expiry_ms})

    async def unregister(self, request: Frame) -> Response:
        self.service.leave(group_name_field(request.fields), field(request.fields, "member", str))
        return Response()

    async def commit(self, request: Frame) -> Response:
        fields = request.fields
        await self.service.commit_offsets(group_name_field(fields), queue_offsets(fields, "offsets"),
                                    field(fields, "member", str, ""),
                                    queue_refs(fields, "release") if "release" in fields else ())
        return Response()

    async def fetch(self, request: Frame) -> Response:
        fields = request.fields
        found = self.service.committed_offsets(group_name_field(fields), queue_refs(fields, "queues"),
                                               field(fields, "member", str, ""))
        return Response({"offsets": [-1 if offset is None else offset for offset in found]})

    async def describe(self, request: Frame) -> Response:
        view = self.service.describe(group_name_field(request.fields), field(request.fields, "members", bool, True))
        return Response({
            "members": [{"member": member.member_id, "client": member.client_address, "mode": member.mode,
                         "subscription": member.subscription, "last_seen_ms": member.last_seen_ms,
                         "queues": [encode(queue) for queue in queues]} for member, queues in view.members],
            "offsets": {t: {str(q): o for q, o in qs.items()} for t, qs in view.offsets.items()},
        })
