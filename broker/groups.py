"""Consumer groups: membership by heartbeat and queue ownership with a safe hand-off.

One broker coordinates each group (:func:`coordinator_index`: the group's xxhash64 over the
live brokers sorted by id, as Kafka picks a group coordinator by the group's hash). The
coordinator spreads every subscribed topic's queues — all of them, on every broker — evenly over
the members subscribed to that topic (contiguous ranges over the members sorted by id, as
RocketMQ's ``AllocateMessageQueueAveragely``), but only moves a queue to its new member after the
previous owner has released it — the owner learns of the change in its heartbeat response,
commits what it consumed, and stops reporting the queue as ``held`` — or has expired. That
hand-off keeps a message from being consumed twice while members join and leave.

A coordinator that takes a group over (restart, failover) knows nothing of it: members tell it
what they hold, and an unowned queue a member reports as held is adopted by that member. A new
member that arrives before an old holder is covered by the queue leaders' claims
(:mod:`gms.broker.queue_claims`), not by this module.

Broadcasting members own nothing: every one of them reads every queue.

Time is passed in (``now_ms``) so the rules can be tested without sleeping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import xxhash

QueueKey = tuple[str, int]  # (topic, queue id)

MODE_CLUSTERING = "clustering"
MODE_BROADCASTING = "broadcasting"
MODES = (MODE_CLUSTERING, MODE_BROADCASTING)

# Members heartbeat this often while their group is settled (Kafka's heartbeat.interval.ms is
# 3 s); never more than a third of the member expiry, so two lost beats do not expire a member.
HEARTBEAT_INTERVAL_MS_MAX = 3000
# ... and this often while a queue of their group waits for its hand-off, so a join or leave
# completes one normal interval (the owner learning of it) plus the hand-off after it happened.
REBALANCE_HEARTBEAT_INTERVAL_MS = 100


def heartbeat_interval_ms(member_expiry_ms: int) -> int:
    """How often members of a settled group heartbeat."""
    return max(min(HEARTBEAT_INTERVAL_MS_MAX, member_expiry_ms // 3), 1)


def coordinator_index(group: str, broker_count: int) -> int:
    """Index of the group's coordinator among ``broker_count`` live brokers sorted by id."""
    return xxhash.xxh64_intdigest(group.encode()) % broker_count


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


class Beat(NamedTuple):
    """A heartbeat's answer: the queues per topic the member may consume now, and how soon
    it should heartbeat again."""

    assignment: dict[str, list[int]]
    heartbeat_interval_ms: int


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
    """The groups this broker coordinates.

    ``queue_count(topic)`` is the topic's queue count over the whole cluster (0 if unknown); it
    is asked on every heartbeat so topic changes are picked up without notifications.
    """

    def __init__(self, queue_count: Callable[[str], int], member_expiry_ms: int) -> None:
        self._queue_count = queue_count
        self.member_expiry_ms = member_expiry_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms(member_expiry_ms)
        self._groups: dict[str, Group] = {}
        self.rebalances: Counter[str] = Counter()  # group -> membership changes (joins, leaves, expiries)

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
    ) -> Beat:
        """Record a heartbeat; return what this member may consume now."""
        if mode not in MODES:
            raise ValueError(f"consumer mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.expire(now_ms)
        group = self._groups.setdefault(group_name, Group(group_name))
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, client_address, mode, dict(subscription), now_ms, now_ms)
            group.members[member_id] = member
            self.rebalances[group_name] += 1
        member.mode, member.subscription, member.last_seen_ms = mode, dict(subscription), now_ms
        member.client_address = client_address
        if mode == MODE_BROADCASTING:
            self._release(group, member_id, keep=set())
            assignment = {topic: list(range(self._queue_count(topic))) for topic in subscription}
            return Beat(assignment, self._interval(group))
        held_keys = {key for key in held if key[0] in subscription and 0 <= key[1] < self._queue_count(key[0])}
        # Queues the member no longer reports as held are released; unowned ones it reports
        # are adopted (what a coordinator that just took the group over learns first).
        self._release(group, member_id, keep=held_keys)
        for key in held_keys:
            group.owners.setdefault(key, member_id)
        target = self._target(group)
        for key in target.get(member_id, set()):
            group.owners.setdefault(key, member_id)
        assigned: dict[str, list[int]] = {topic: [] for topic in subscription}
        for topic, queue_id in sorted(group.owned_by(member_id) & target.get(member_id, set())):
            assigned[topic].append(queue_id)
        return Beat(assigned, self._interval(group, target))

    def leave(self, group_name: str, member_id: str) -> None:
        group = self._groups.get(group_name)
        if group is not None:
            if group.members.pop(member_id, None) is not None:
                self.rebalances[group_name] += 1
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
                    self.rebalances[group.name] += 1
        for group in list(self._groups.values()):
            self._forget_if_empty(group)
        return dropped

    def forget(self, group_name: str) -> None:
        """Stop coordinating ``group_name`` (another broker coordinates it now)."""
        self._groups.pop(group_name, None)

    # -- queries --------------------------------------------------------------------

    def owner(self, group_name: str, topic: str, queue_id: int) -> str | None:
        group = self._groups.get(group_name)
        return None if group is None else group.owners.get((topic, queue_id))

    def group(self, group_name: str) -> Group | None:
        return self._groups.get(group_name)

    def group_names(self) -> list[str]:
        return sorted(self._groups)

    # -- internals ------------------------------------------------------------------

    def _interval(self, group: Group, target: dict[str, set[QueueKey]] | None = None) -> int:
        """The short interval while some member's queues differ from its target (a hand-off
        under way, or a member still waiting for queues), else the normal one."""
        target = self._target(group) if target is None else target
        for member in group.members.values():
            settled = group.owned_by(member.member_id) == target.get(member.member_id, set())
            if member.mode == MODE_CLUSTERING and not settled:
                return min(REBALANCE_HEARTBEAT_INTERVAL_MS, self.heartbeat_interval_ms)
        return self.heartbeat_interval_ms

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
            queue_ids = list(range(self._queue_count(topic)))
            for member_id, queue_ids_of in allocate_evenly(queue_ids, member_ids).items():
                target.setdefault(member_id, set()).update((topic, q) for q in queue_ids_of)
        return target
