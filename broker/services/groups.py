"""Consumer groups: the coordinator's membership (heartbeat, leave, describe) and the committed
offsets of the queues led here (commit, fetch).

The dead letters of a group are :mod:`gms.broker.services.dead_letters`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from gms.broker.groups import MODE_CLUSTERING, Beat, GroupCoordinator, Member
from gms.broker.offsets import OffsetStore
from gms.broker.queue_claims import QueueClaims
from gms.broker.services.peers import Peers
from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    GmsError,
    GroupNotEmptyError,
    GroupNotFoundError,
    NotCoordinatorError,
    QueueNotFoundError,
    TopicNotFoundError,
)
from gms.protocol.codes import RequestCode
from gms.protocol.groups import QueueOffset, QueueRef
from gms.protocol.rows import encode
from gms.tags import BadTagExpression, parse_tag_expression

Q = TypeVar("Q", QueueRef, QueueOffset)  # a queue, or a queue with an offset

GROUP_NAME_BYTES_MAX = 255


def check_group_name(group: str) -> str:
    """``group`` if a consumer group may have that name (BadRequestError otherwise)."""
    if not group or len(group.encode()) > GROUP_NAME_BYTES_MAX:
        raise BadRequestError(f"group name must be 1..{GROUP_NAME_BYTES_MAX} bytes")
    return group


@dataclass(frozen=True, slots=True)
class HeartbeatArgs:
    """A member's heartbeat: its ``subscription`` (topic → tag expression), how it consumes
    (``mode``), the queues it still ``held`` (adopted by a coordinator that just took over)."""

    group: str
    member: str
    subscription: dict[str, str]
    client: str = ""
    mode: str = MODE_CLUSTERING
    held: tuple[QueueRef, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group as one broker knows it: its members (from its coordinator; empty elsewhere) with
    the queues each owns, and the offsets committed here (topic → queue id → offset)."""

    members: list[tuple[Member, list[QueueRef]]]
    offsets: dict[str, dict[int, int]]


class GroupService:
    def __init__(
        self,
        groups: GroupCoordinator,
        claims: QueueClaims,
        offsets: OffsetStore,
        queue_count: Callable[[str], int],
        coordinator_of: Callable[[str], str],
        address: str,
        readable: Callable[[tuple[str, int]], tuple[int, int]],
        on_commit: Callable[[list[tuple[str, int]]], None] = lambda queues: None,
        leader_of: Callable[[str, int], str | None] = lambda topic, queue_id: None,
        peers: Peers | None = None,
        arrival: Callable[[Mapping[str, None]], Awaitable[None]] | None = None,
    ) -> None:
        """``queue_count(topic)``: the topic's queues over the cluster (0: unknown topic);
        ``coordinator_of(group)``: the address of the group's coordinator; ``address``: ours;
        ``readable(key)``: a queue's offsets consumers may read, [min, end); ``leader_of``: the
        address of a queue's leader as the cluster routes it (None: here, or no nameservers);
        ``peers``: the broker's connections to the others (commits at other leaders);
        ``arrival(topics)``: returns once the cluster's view holds ``topics``, bounded
        (TopicService.arrivals): a commit right after a topic's creation is not refused for a
        topic this broker's view has yet to receive (see :meth:`_arrived`)."""
        self.groups = groups
        self.claims = claims
        self.offsets = offsets
        self.queue_count = queue_count
        self.coordinator_of = coordinator_of
        self.address = address
        self.readable = readable
        self.on_commit = on_commit  # the queues whose commits changed (replicated to followers)
        self.leader_of = leader_of
        self.peers = peers
        self.arrival = arrival

    def _coordinated_here(self, group: str) -> None:
        coordinator = self.coordinator_of(group)
        if coordinator != self.address:
            raise NotCoordinatorError(f"group {group!r} is coordinated by {coordinator}, not {self.address}",
                                      fields={"coordinator": coordinator})

    def coordinator(self, group: str) -> str:
        return self.coordinator_of(check_group_name(group))

    def heartbeat(self, args: HeartbeatArgs) -> Beat:
        """Record a member's heartbeat (at the group's coordinator): what it may consume now."""
        group = check_group_name(args.group)
        self._coordinated_here(group)
        for topic, expression in args.subscription.items():
            if not isinstance(topic, str) or not isinstance(expression, str):
                raise BadRequestError("subscription must map topic names to tag expressions")
            if not self.queue_count(topic):
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
            try:
                parse_tag_expression(expression)
            except BadTagExpression as err:
                raise BadTagExpressionError(str(err)) from err
        try:
            return self.groups.heartbeat(group, args.member, client_address=args.client, mode=args.mode,
                                         subscription=args.subscription, held=args.held, now_ms=_now_ms())
        except ValueError as err:
            raise BadRequestError(str(err)) from err

    def leave(self, group: str, member: str) -> None:
        check_group_name(group)
        self._coordinated_here(group)
        self.groups.leave(group, member)

    async def commit_offsets(self, group: str, entries: list[QueueOffset], member: str = "",
                             released: Iterable[QueueRef] = ()) -> None:
        """Commit offsets of queues led here. A clustering ``member`` names itself: its commit
        is refused while another member holds the queue (a zombie's late commit), and
        ``released`` lists the queues it hands over (their claims end)."""
        check_group_name(group)
        await self._arrived(entries)
        for topic, queue_id, offset in entries:  # unknown queues would grow the offsets without bound
            if offset < 0:
                raise BadRequestError(f"offset {offset} for {topic}/{queue_id} is negative")
            self._check_queue(topic, queue_id)
        if member:
            now_ms = _now_ms()
            for topic, queue_id, _ in entries:
                self.claims.check(group, member, topic, queue_id, now_ms)
        for topic, queue_id, offset in entries:
            self.offsets.commit(group, topic, queue_id, offset)
        if member:
            self.claims.release(group, member, released)
        self.on_commit([(topic, queue_id) for topic, queue_id, _ in entries])

    def committed_offsets(self, group: str, queues: list[QueueRef], member: str = "") -> list[int | None]:
        """The group's committed offsets (None: none); a ``member`` asking for its start position
        is refused (QUEUE_HELD) while another member still reads the queue, so it starts after
        that member's last commit."""
        check_group_name(group)
        if member:
            now_ms = _now_ms()
            for topic, queue_id in queues:
                self.claims.check(group, member, topic, queue_id, now_ms)
        return [self.offsets.get(group, topic, queue_id) for topic, queue_id in queues]

    async def commit_at_leaders(self, group: str, entries: list[QueueOffset]) -> list[GmsError | None]:
        """Commit each queue's offset where the group's offsets of that queue live, its leader:
        here (:meth:`commit_offsets`), or over this broker's connection to it (a protocol whose
        consumers commit to the group's coordinator, as Kafka's do). Each entry's error, or None."""
        async def commit_here(entry: QueueOffset) -> None:
            await self.commit_offsets(group, [entry])
        return await self._apply_at_leaders(group, entries, commit_here, RequestCode.COMMIT_OFFSET, "offsets")

    async def committed_at_leaders(self, group: str, queues: list[QueueRef]) -> list[int | GmsError | None]:
        """:meth:`committed_offsets` of each queue asked of its leader (see :meth:`commit_at_leaders`):
        the offset, None for none, or the error."""
        found: list[int | GmsError | None] = [None] * len(queues)
        here, elsewhere = await self._by_leader(queues)
        for i in here:
            try:
                found[i] = self.committed_offsets(group, [queues[i]])[0]
            except GmsError as err:
                found[i] = err

        async def ask(address: str, indexes: list[int]) -> None:
            try:
                answer = await self.peers.request(address, RequestCode.FETCH_OFFSET,  # type: ignore[union-attr]
                                                  {"group": group, "queues": [encode(queues[i]) for i in indexes]})
                for i, offset in zip(indexes, answer["offsets"], strict=True):
                    found[i] = None if offset < 0 else int(offset)
            except GmsError as err:
                for i in indexes:
                    found[i] = err
        await asyncio.gather(*(ask(address, indexes) for address, indexes in elsewhere.items()))
        return found

    async def delete_offsets_at_leaders(self, group: str, queues: list[QueueRef]) -> list[GmsError | None]:
        """:meth:`delete_offsets` of each queue at its leader (see :meth:`commit_at_leaders`):
        each queue's error, or None."""
        async def delete_here(queue: QueueRef) -> None:
            await self.delete_offsets(group, [queue])
        return await self._apply_at_leaders(group, queues, delete_here, RequestCode.DELETE_OFFSETS, "queues")

    async def _apply_at_leaders(self, group: str, items: list[Q], apply_here: Callable[[Q], Awaitable[None]],
                                code: RequestCode, field: str) -> list[GmsError | None]:
        """``apply_here`` to each of ``items`` led here; the others sent to their leaders as
        ``code`` requests (the items in ``field``). Each item's error, or None."""
        errors: list[GmsError | None] = [None] * len(items)
        here, elsewhere = await self._by_leader(items)
        for i in here:
            try:
                await apply_here(items[i])
            except GmsError as err:
                errors[i] = err

        async def forward(address: str, indexes: list[int]) -> None:
            try:
                await self.peers.request(address, code,  # type: ignore[union-attr]
                                         {"group": group, field: [encode(items[i]) for i in indexes]})
            except GmsError as err:
                for i in indexes:
                    errors[i] = err
        await asyncio.gather(*(forward(address, indexes) for address, indexes in elsewhere.items()))
        return errors

    async def _by_leader(self, queues: list[Q]) -> tuple[list[int], dict[str, list[int]]]:
        """The indexes of the queues led here (or whose leader is not known), and of the others by
        their leader's address, once their topics have arrived in the view (:meth:`_arrived`)."""
        await self._arrived(queues)
        here: list[int] = []
        elsewhere: dict[str, list[int]] = {}
        for i, queue in enumerate(queues):
            leader = self.leader_of(queue.topic, queue.queue_id)
            if leader is not None and leader != self.address and self.peers is not None:
                elsewhere.setdefault(leader, []).append(i)
            else:
                here.append(i)
        return here, elsewhere

    async def _arrived(self, queues: Iterable[QueueRef | QueueOffset]) -> None:
        """Return once the view holds the topics of ``queues`` (at once when it does; bounded
        when it does not: a topic created a moment ago, or none, which etcd tells at once)."""
        unknown = {queue.topic: None for queue in queues if not self.queue_count(queue.topic)}
        if unknown and self.arrival is not None:
            await self.arrival(unknown)

    def _check_queue(self, topic: str, queue_id: int) -> None:
        """TopicNotFoundError or QueueNotFoundError unless the cluster has the queue."""
        queue_count = self.queue_count(topic)
        if not queue_count:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        if not 0 <= queue_id < queue_count:
            raise QueueNotFoundError(f"topic {topic!r} has no queue {queue_id} (it has {queue_count})")

    def describe(self, name: str, members: bool = True) -> GroupView:
        """Members (from the coordinator) and the offsets committed on this broker. A
        non-coordinator answers only ``offsets`` unless asked for ``members`` explicitly."""
        check_group_name(name)
        if members:
            self._coordinated_here(name)
        group = self.groups.group(name)
        offsets = self.offsets.group_offsets(name)
        if (group is None or not members) and not offsets:
            raise GroupNotFoundError(f"this broker knows no consumer group {name!r}")
        listed = [] if group is None or not members else [
            (member, [QueueRef(*key) for key in sorted(group.owned_by(member.member_id))])
            for member in group.members.values()]
        return GroupView(listed, offsets)


    # -- offsets set by an operator ----------------------------------------------------------------

    async def reset_offsets(self, group: str, entries: list[QueueOffset], force: bool = False) -> list[QueueOffset]:
        """Set committed offsets of a group; the offsets stored. Unlike a commit no member has to
        own the queues, and each offset is clamped to what consumers can read: [min offset, max
        offset] (the high watermark where the queue is replicated). All or nothing: every queue
        is checked (led here, exists) before any offset changes."""
        check_group_name(group)
        if not force:
            self._refuse_live_members(group, [(topic, queue_id) for topic, queue_id, _ in entries])
        stored = []
        for topic, queue_id, offset in entries:
            low, high = self.readable((topic, queue_id))
            stored.append(QueueOffset(topic, queue_id, min(max(offset, low), high)))
        for topic, queue_id, offset in stored:
            self.offsets.commit(group, topic, queue_id, offset)
        await self.offsets.persist_async()
        self.on_commit([(topic, queue_id) for topic, queue_id, _ in stored])
        return stored

    async def delete_group(self, group: str, force: bool = False) -> list[QueueRef]:
        """Delete every offset the group committed here (as leader or follower; followers that
        miss this delete them from their next REPLICA_FETCH); the queues it had offsets on."""
        check_group_name(group)
        if not force:
            self._refuse_live_members(group, None)
        queues = self.offsets.delete_group(group)
        await self.offsets.persist_async()
        self.on_commit(queues)
        return [QueueRef(*key) for key in queues]

    async def delete_offsets(self, group: str, queues: list[QueueRef], force: bool = False) -> list[QueueRef]:
        """Delete the group's committed offsets of ``queues`` here (as :meth:`delete_group` does
        all of them); those it had. Refused (GroupNotEmptyError) while a member of the group reads
        any of them, unless ``force``; every queue is checked before any offset goes."""
        check_group_name(group)
        await self._arrived(queues)
        for topic, queue_id in queues:
            self._check_queue(topic, queue_id)
        if not force:
            self._refuse_live_members(group, [(topic, queue_id) for topic, queue_id in queues])
        deleted = self.offsets.delete_offsets(group, queues)
        await self.offsets.persist_async()
        self.on_commit(deleted)
        return [QueueRef(*key) for key in deleted]

    async def delete_everywhere(self, group: str, brokers: Iterable[str]) -> int:
        """:meth:`delete_group` here and at each other of ``brokers`` (addresses; the queues'
        leaders and followers), as ``gms group delete`` does: GroupNotEmptyError while a member
        is live at any of them. The number of queues whose offsets went."""
        deleted = len(await self.delete_group(group))
        for address in brokers:
            if address != self.address and self.peers is not None:
                answer = await self.peers.request(address, RequestCode.DELETE_GROUP, {"group": group, "force": False})
                deleted += len(answer["queues"])
        return deleted

    def group_names(self) -> list[str]:
        """The groups with members coordinated here or offsets committed here."""
        return sorted({*self.groups.group_names(), *self.offsets.groups()})

    async def names_everywhere(self, brokers: Iterable[str]) -> set[str]:
        """:meth:`group_names` here and at each other of ``brokers`` (addresses; a group's offsets
        live at its queues' leaders, not at its coordinator). A broker that does not answer is
        left out."""
        names = set(self.group_names())
        others = [address for address in brokers if address != self.address]
        if self.peers is None or not others:
            return names
        answers = await asyncio.gather(*(self.peers.request(address, RequestCode.BROKER_STATUS, {})
                                         for address in others), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, GmsError):
                continue
            if isinstance(answer, BaseException):
                raise answer
            names.update(answer["groups"])
        return names

    def _refuse_live_members(self, group: str, queues: list[tuple[str, int]] | None) -> None:
        """Members would commit over the change: refuse while any reads ``queues`` (all of the
        group's queues when None) here, or heartbeats here if this broker coordinates the group
        (``force`` skips this check; the Admin client asks the group's coordinator first)."""
        known = self.groups.group(group)
        live = set(known.members) if known is not None else set()
        live |= self.claims.readers(group, _now_ms(), queues)
        if live:
            raise GroupNotEmptyError(f"group {group!r} has live members: {', '.join(sorted(live))}")


def _now_ms() -> int:
    return int(time.time() * 1000)
