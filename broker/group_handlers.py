"""Consumer-group requests: heartbeat/membership, committed offsets, group description."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gms.broker.groups import MODE_CLUSTERING, GroupCoordinator
from gms.broker.offsets import OffsetStore
from gms.errors import BadRequestError, BadTagExpressionError, GroupNotFoundError, TopicNotFoundError
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.tags import BadTagExpression, parse_tag_expression

GROUP_NAME_BYTES_MAX = 255


def _now_ms() -> int:
    return int(time.time() * 1000)


def _group_name(fields: Any) -> str:
    group = field(fields, "group", str)
    if not group or len(group.encode()) > GROUP_NAME_BYTES_MAX:
        raise BadRequestError(f"group name must be 1..{GROUP_NAME_BYTES_MAX} bytes")
    return group


def _queue_pairs(fields: Any, name: str, width: int) -> list[tuple]:
    pairs = field(fields, name, list)
    for item in pairs:
        if (not isinstance(item, list) or len(item) != width or not isinstance(item[0], str)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])):
            raise BadRequestError(
                f"request field {name!r} must be a list of [topic, queue_id{', offset' if width == 3 else ''}]"
            )
    return [tuple(item) for item in pairs]


class GroupHandlers:
    def __init__(
        self,
        groups: GroupCoordinator,
        offsets: OffsetStore,
        topic_exists: Callable[[str], bool],
        on_commit: Callable[[list[tuple[str, int]]], None] = lambda queues: None,
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.topic_exists = topic_exists
        self.on_commit = on_commit  # the queues whose commits changed (replicated to followers)

    async def heartbeat(self, request: Frame) -> Response:
        fields = request.fields
        group = _group_name(fields)
        member = field(fields, "member", str)
        subscription = field(fields, "subscription", dict)
        for topic, expression in subscription.items():
            if not isinstance(topic, str) or not isinstance(expression, str):
                raise BadRequestError("subscription must map topic names to tag expressions")
            if not self.topic_exists(topic):
                raise TopicNotFoundError(f"topic {topic!r} does not exist on this broker")
            try:
                parse_tag_expression(expression)
            except BadTagExpression as err:
                raise BadTagExpressionError(str(err)) from err
        try:
            assignment = self.groups.heartbeat(
                group, member,
                client_address=field(fields, "client", str, ""),
                mode=field(fields, "mode", str, MODE_CLUSTERING),
                subscription=subscription,
                held=_queue_pairs(fields, "held", 2) if "held" in fields else [],
                now_ms=_now_ms(),
            )
        except ValueError as err:
            raise BadRequestError(str(err)) from err
        return Response({"assignment": assignment, "member_expiry_ms": self.groups.member_expiry_ms})

    async def unregister(self, request: Frame) -> Response:
        self.groups.leave(_group_name(request.fields), field(request.fields, "member", str))
        return Response()

    async def commit(self, request: Frame) -> Response:
        fields = request.fields
        group = _group_name(fields)
        member = field(fields, "member", str, "")
        entries = _queue_pairs(fields, "offsets", 3)
        for topic, queue_id, _ in entries:
            owner = self.groups.owner(group, topic, queue_id)
            if member and owner is not None and owner != member:
                raise BadRequestError(
                    f"queue {topic}/{queue_id} of group {group!r} belongs to {owner!r}, not {member!r}"
                )
        for topic, queue_id, offset in entries:
            if offset < 0:
                raise BadRequestError(f"offset {offset} for {topic}/{queue_id} is negative")
        for topic, queue_id, offset in entries:
            self.offsets.commit(group, topic, queue_id, offset)
        self.on_commit([(topic, queue_id) for topic, queue_id, _ in entries])
        return Response()

    async def fetch(self, request: Frame) -> Response:
        group = _group_name(request.fields)
        queues = _queue_pairs(request.fields, "queues", 2)
        found = [self.offsets.get(group, topic, queue_id) for topic, queue_id in queues]
        return Response({"offsets": [-1 if offset is None else offset for offset in found]})

    async def describe(self, request: Frame) -> Response:
        name = _group_name(request.fields)
        group = self.groups.group(name)
        offsets = self.offsets.group_offsets(name)
        if group is None and not offsets:
            raise GroupNotFoundError(f"this broker knows no consumer group {name!r}")
        members = []
        for member in (group.members.values() if group else ()):
            members.append({
                "member": member.member_id, "client": member.client_address, "mode": member.mode,
                "subscription": member.subscription, "last_seen_ms": member.last_seen_ms,
                "queues": sorted(group.owned_by(member.member_id)),
            })
        return Response({
            "members": members,
            "offsets": {t: {str(q): o for q, o in qs.items()} for t, qs in offsets.items()},
        })
