"""Consumer-group requests: finding the coordinator, heartbeat/membership and group description
(served by the group's coordinator), committed offsets (served by each queue's leader)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gms.broker.groups import MODE_CLUSTERING, GroupCoordinator
from gms.broker.offsets import OffsetStore
from gms.broker.queue_claims import QueueClaims
from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    GroupNotFoundError,
    NotCoordinatorError,
    QueueNotFoundError,
    TopicNotFoundError,
)
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.groups import QueueRef, queue_offsets, queue_refs
from gms.protocol.rows import encode
from gms.tags import BadTagExpression, parse_tag_expression

GROUP_NAME_BYTES_MAX = 255


def _now_ms() -> int:
    return int(time.time() * 1000)


def group_name_field(fields: Any) -> str:
    return check_group_name(field(fields, "group", str))


def check_group_name(group: str) -> str:
    """``group`` if a consumer group may have that name (BadRequestError otherwise)."""
    if not group or len(group.encode()) > GROUP_NAME_BYTES_MAX:
        raise BadRequestError(f"group name must be 1..{GROUP_NAME_BYTES_MAX} bytes")
    return group


class GroupHandlers:
    def __init__(
        self,
        groups: GroupCoordinator,
        claims: QueueClaims,
        offsets: OffsetStore,
        queue_count: Callable[[str], int],
        coordinator_of: Callable[[str], str],
        address: str,
        on_commit: Callable[[list[tuple[str, int]]], None] = lambda queues: None,
    ) -> None:
        """``queue_count(topic)``: the topic's queues over the cluster (0: unknown topic);
        ``coordinator_of(group)``: the address of the group's coordinator; ``address``: ours."""
        self.groups = groups
        self.claims = claims
        self.offsets = offsets
        self.queue_count = queue_count
        self.coordinator_of = coordinator_of
        self.address = address
        self.on_commit = on_commit  # the queues whose commits changed (replicated to followers)

    def _coordinated_here(self, group: str) -> None:
        coordinator = self.coordinator_of(group)
        if coordinator != self.address:
            raise NotCoordinatorError(f"group {group!r} is coordinated by {coordinator}, not {self.address}",
                                      fields={"coordinator": coordinator})

    async def find_coordinator(self, request: Frame) -> Response:
        return Response({"coordinator": self.coordinator_of(group_name_field(request.fields))})

    async def heartbeat(self, request: Frame) -> Response:
        fields = request.fields
        group = group_name_field(fields)
        self._coordinated_here(group)
        member = field(fields, "member", str)
        subscription = field(fields, "subscription", dict)
        for topic, expression in subscription.items():
            if not isinstance(topic, str) or not isinstance(expression, str):
                raise BadRequestError("subscription must map topic names to tag expressions")
            if not self.queue_count(topic):
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
            try:
                parse_tag_expression(expression)
            except BadTagExpression as err:
                raise BadTagExpressionError(str(err)) from err
        try:
            beat = self.groups.heartbeat(
                group, member,
                client_address=field(fields, "client", str, ""),
                mode=field(fields, "mode", str, MODE_CLUSTERING),
                subscription=subscription,
                held=queue_refs(fields, "held") if "held" in fields else [],
                now_ms=_now_ms(),
            )
        except ValueError as err:
            raise BadRequestError(str(err)) from err
        return Response({"assignment": beat.assignment, "heartbeat_interval_ms": beat.heartbeat_interval_ms,
                         "member_expiry_ms": self.groups.member_expiry_ms})

    async def unregister(self, request: Frame) -> Response:
        group = group_name_field(request.fields)
        self._coordinated_here(group)
        self.groups.leave(group, field(request.fields, "member", str))
        return Response()

    async def commit(self, request: Frame) -> Response:
        """Commit offsets of queues led here. A clustering member names itself (``member``):
        its commit is refused while another member holds the queue (a zombie's late commit),
        and ``release`` lists the queues it hands over (their claims end)."""
        fields = request.fields
        group = group_name_field(fields)
        member = field(fields, "member", str, "")
        entries = queue_offsets(fields, "offsets")
        released = queue_refs(fields, "release") if "release" in fields else []
        for topic, queue_id, offset in entries:  # unknown queues would grow the offsets without bound
            if offset < 0:
                raise BadRequestError(f"offset {offset} for {topic}/{queue_id} is negative")
            queue_count = self.queue_count(topic)
            if not queue_count:
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
            if not 0 <= queue_id < queue_count:
                raise QueueNotFoundError(f"topic {topic!r} has no queue {queue_id} (it has {queue_count})")
        if member:
            now_ms = _now_ms()
            for topic, queue_id, _ in entries:
                self.claims.check(group, member, topic, queue_id, now_ms)
        for topic, queue_id, offset in entries:
            self.offsets.commit(group, topic, queue_id, offset)
        if member:
            self.claims.release(group, member, released)
        self.on_commit([(topic, queue_id) for topic, queue_id, _ in entries])
        return Response()

    async def fetch(self, request: Frame) -> Response:
        """Committed offsets; a member asking for its start position is refused (QUEUE_HELD)
        while another member still reads the queue, so it starts after that member's last commit."""
        group = group_name_field(request.fields)
        queues = queue_refs(request.fields, "queues")
        member = field(request.fields, "member", str, "")
        if member:
            now_ms = _now_ms()
            for topic, queue_id in queues:
                self.claims.check(group, member, topic, queue_id, now_ms)
        found = [self.offsets.get(group, topic, queue_id) for topic, queue_id in queues]
        return Response({"offsets": [-1 if offset is None else offset for offset in found]})

    async def describe(self, request: Frame) -> Response:
        """Members (from the coordinator) and the offsets committed on this broker. A
        non-coordinator answers only ``offsets`` unless asked for ``members`` explicitly."""
        name = group_name_field(request.fields)
        want_members = field(request.fields, "members", bool, True)
        if want_members:
            self._coordinated_here(name)
        group = self.groups.group(name)
        offsets = self.offsets.group_offsets(name)
        if (group is None or not want_members) and not offsets:
            raise GroupNotFoundError(f"this broker knows no consumer group {name!r}")
        members = [] if group is None or not want_members else [
            {"member": member.member_id, "client": member.client_address, "mode": member.mode,
             "subscription": member.subscription, "last_seen_ms": member.last_seen_ms,
             "queues": [encode(QueueRef(*key)) for key in sorted(group.owned_by(member.member_id))]}
            for member in group.members.values()
        ]
        return Response({
            "members": members,
            "offsets": {t: {str(q): o for q, o in qs.items()} for t, qs in offsets.items()},
        })
