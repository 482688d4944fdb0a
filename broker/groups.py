"""Consumer groups: membership by heartbeat and queue ownership with a safe hand-off.

In clustering mode each queue of a subscribed topic belongs to at most one live
member of the group at any moment.  The broker computes a *target* allocation
(queues spread evenly over the members sorted by id, as RocketMQ's
``AllocateMessageQueueAveragely``) but only moves a queue to its new member
after the previous owner has released it — the owner learns of the change in
its heartbeat response, commits what it consumed, and stops reporting the
queue as held — or has expired.  That hand-off is what keeps a message from
being consumed twice while members join and leave.

Broadcasting members own nothing: every one of them reads every queue.

Time is passed in (``now_ms``) so the rules can be tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

QueueKey = tuple[str, int]  # (topic, queue id)

MODE_CLUSTERING = "clustering"
MODE_BROADCASTING = "broadcasting"
MODES = (MODE_CLUSTERING, MODE_BROADCASTING)


@dataclass
class Member:
    member_id: str
    client_address: str
    mode: str
    subscription: dict[str, str]  # topic -> tag expression
    last_seen_ms: int
    joined_ms: int


@dataclass
class Group:
    name: str
    members: dict[str, Member] = field(default_factory=dict)
    owners: dict[QueueKey, str] = field(default_factory=dict)

    def owned_by(self, member_id: str) -> set[QueueKey]:
        return {key for key, owner in self.owners.items() if owner == member_id}


def allocate_evenly(queue_ids: list[int], member_ids: list[str]) -> dict[str, list[int]]:
    """Contiguous, even split of queues over members (first members get the remainder)."""
    members = sorted(member_ids)
    allocation: dict[str, list[int]] = {m: [] for m in members}
    if not members:
        return allocation
    base, extra = divmod(len(queue_ids), len(members))
    start = 0
    for index, member in enumerate(members):
        count = base + (1 if index < extra else 0)
        allocation[member] = queue_ids[start:start + count]
        start += count
    return allocation


class GroupCoordinator:
    """Tracks the groups consuming from this broker.

    ``queue_ids(topic)`` lists the topic's queues served here (empty if the topic
    is unknown); it is asked on every heartbeat so topic changes are picked up
    without notifications.
    """

    def __init__(self, queue_ids: Callable[[str], list[int]], member_expiry_ms: int) -> None:
        self._queue_ids = queue_ids
        self.member_expiry_ms = member_expiry_ms
        self._groups: dict[str, Group] = {}

    # -- membership -----------------------------------------------------------------

    def heartbeat(
        self,
        group_name: str,
        member_id: str,
        *,
        client_address: str,
        mode: str,
        subscription: dict[str, str],
        held: Iterable[QueueKey],
        now_ms: int,
    ) -> dict[str, list[int]]:
        """Record a heartbeat; return the queues per topic this member may consume now."""
        if mode not in MODES:
            raise ValueError(f"consumer mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.expire(now_ms)
        group = self._groups.setdefault(group_name, Group(group_name))
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, client_address, mode, dict(subscription), now_ms, now_ms)
            group.members[member_id] = member
        member.mode, member.subscription, member.last_seen_ms = mode, dict(subscription), now_ms
        member.client_address = client_address
        if mode == MODE_BROADCASTING:
            self._release(group, member_id, keep=set())
            return {topic: self._queue_ids(topic) for topic in subscription}
        # Queues the member no longer reports as held are released.
        self._release(group, member_id, keep=set(held))
        target = self._target(group).get(member_id, set())
        for key in target:
            if group.owners.get(key) is None:
                group.owners[key] = member_id
        assigned: dict[str, list[int]] = {topic: [] for topic in subscription}
        for topic, queue_id in sorted(group.owned_by(member_id) & target):
            assigned[topic].append(queue_id)
        return assigned

    def leave(self, group_name: str, member_id: str) -> None:
        group = self._groups.get(group_name)
        if group is not None:
            group.members.pop(member_id, None)
            self._release(group, member_id, keep=set())
            self._forget_if_empty(group)

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Drop members silent for longer than the expiry; return (group, member) dropped."""
        dropped = []
        for group in self._groups.values():
            for member_id, member in list(group.members.items()):
                if now_ms - member.last_seen_ms > self.member_expiry_ms:
                    del group.members[member_id]
                    self._release(group, member_id, keep=set())
                    dropped.append((group.name, member_id))
        for group in list(self._groups.values()):
            self._forget_if_empty(group)
        return dropped

    # -- queries --------------------------------------------------------------------

    def owner(self, group_name: str, topic: str, queue_id: int) -> str | None:
        group = self._groups.get(group_name)
        return None if group is None else group.owners.get((topic, queue_id))

    def may_consume(self, group_name: str, member_id: str, topic: str, queue_id: int) -> bool:
        """A clustering member may pull or commit only the queues it owns."""
        group = self._groups.get(group_name)
        if group is None or member_id not in group.members:
            return False
        member = group.members[member_id]
        if member.mode == MODE_BROADCASTING:
            return True
        return group.owners.get((topic, queue_id)) == member_id

    def group(self, group_name: str) -> Group | None:
        return self._groups.get(group_name)

    def group_names(self) -> list[str]:
        return sorted(self._groups)

    # -- internals ------------------------------------------------------------------

    def _forget_if_empty(self, group: Group) -> None:
        """A group with no members is no longer coordinated (its committed offsets stay)."""
        if not group.members:
            self._groups.pop(group.name, None)

    def _release(self, group: Group, member_id: str, keep: set[QueueKey]) -> None:
        for key in group.owned_by(member_id) - keep:
            del group.owners[key]

    def _target(self, group: Group) -> dict[str, set[QueueKey]]:
        """The even allocation of every subscribed topic's queues over its members."""
        by_topic: dict[str, list[str]] = {}
        for member in group.members.values():
            if member.mode == MODE_CLUSTERING:
                for topic in member.subscription:
                    by_topic.setdefault(topic, []).append(member.member_id)
        target: dict[str, set[QueueKey]] = {}
        for topic, member_ids in by_topic.items():
            for member_id, queue_ids in allocate_evenly(self._queue_ids(topic), member_ids).items():
                target.setdefault(member_id, set()).update((topic, q) for q in queue_ids)
        return target
