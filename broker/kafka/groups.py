"""Kafka's classic consumer group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on the
broker that coordinates the gms group of the same name (FindCoordinator names it).

The assignment is the clients' own (range, roundrobin, cooperative-sticky …): the coordinator
runs Kafka's rebalance, not gms's. A group goes Empty -> PreparingRebalance (a member joins, leaves
or expires: every member must join again, within the longest rebalance timeout, or is dropped) ->
CompletingRebalance (the generation is bumped; the leader, the first member to have joined, gets
every member's metadata and sends the assignment in its SyncGroup) -> Stable (each member got its
part). Heartbeats during a rebalance answer REBALANCE_IN_PROGRESS, so members join again; a member
silent for its session timeout is dropped. Commits (:mod:`.offsets`) are checked against the
member and generation. Membership lives in the coordinator's memory: after it restarts, members
join again (their commits are gms's, kept).

Static membership (KIP-345, ``group.instance.id``): a member joining with an instance id keeps it
until it leaves or its session times out. The instance joining again without its member id (its
process restarted) takes its old place under a new member id: in a Stable group whose protocol it
does not change, with its old assignment and no rebalance (the leader is answered the members
with ``skip_assignment``); otherwise the group rebalances as for any join. Its old member id is
fenced: its requests answer FENCED_INSTANCE_ID, as do a join, heartbeat, SyncGroup, commit or
leave naming the instance with another member id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gms.broker.kafka.errors import Err, code_of
from gms.broker.kafka.wire import Malformed, Reader
from gms.broker.services import Services
from gms.errors import GmsError

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
CONSUMER = "consumer"  # the protocol type of Kafka's consumers
SESSION_TIMEOUT_MS_MIN, SESSION_TIMEOUT_MS_MAX = 1_000, 1_800_000  # Kafka's: 6 s and 30 min
EXPIRY_CHECK_S = 0.5
MEMBER_ID_REQUIRED_VERSION = 4  # from JoinGroup v4 a new member first gets its id (KIP-394)
PENDING_MAX = 1_000


@dataclass(slots=True)
class _Member:
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    last_seen: float
    client: str  # its host:port
    instance_id: str | None = None  # a static member's group.instance.id
    join: asyncio.Future[dict[str, Any]] | None = None
    sync: asyncio.Future[dict[str, Any]] | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class _Group:
    state: str = EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # member ids handed out, not joined yet
    static: dict[str, str] = field(default_factory=dict)  # instance id -> its member's id
    deadline: asyncio.TimerHandle | None = None  # when the join phase ends regardless


class GroupError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class KafkaGroups:
    def __init__(self, services: Services, address: str) -> None:
        self.groups_service = services.groups
        self.address = address
        self._groups: dict[str, _Group] = {}
        self._expiry: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire_forever())

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        for group in self._groups.values():
            for member in group.members.values():
                for future in (member.join, member.sync):
                    if future is not None and not future.done():
                        future.cancel()

    def known(self, group_id: str) -> _Group | None:
        """The Kafka group of that name this broker coordinates (None: none has members or
        is rebalancing)."""
        return self._groups.get(group_id)

    def names(self) -> list[str]:
        return list(self._groups)

    def subscribed(self, group_id: str) -> set[str]:
        """The topics the members of a Kafka group subscribe to (their consumer protocol
        metadata: ConsumerProtocolSubscription's topics; metadata that is not one names none)."""
        group = self._groups.get(group_id)
        if group is None or group.protocol_type != CONSUMER:
            return set()
        topics: set[str] = set()
        for member in group.members.values():
            protocols = dict(member.protocols)
            metadata = protocols.get(group.protocol or "", next(iter(protocols.values()), b""))
            try:
                reader = Reader(metadata)
                reader.int16()  # the subscription's version
                topics.update(reader.string(False) or "" for _ in range(reader.int32()))
            except Malformed:
                continue
        return topics

    def forget(self, group_id: str) -> None:
        """Drop a group without members (deleted)."""
        group = self._groups.get(group_id)
        if group is not None and not group.members:
            del self._groups[group_id]

    def _coordinated(self, group_id: str) -> _Group:
        try:
            if self.groups_service.coordinator(group_id) != self.address:
                raise GroupError(Err.NOT_COORDINATOR)
        except GmsError as err:
            raise GroupError(Err.INVALID_GROUP_ID if code_of(err) == Err.INVALID_REQUEST else code_of(err)) from err
        return self._groups.setdefault(group_id, _Group())

    # -- JoinGroup -----------------------------------------------------------------------------

    async def join_group(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        member_id = req["member_id"]
        try:
            group = self._coordinated(req["group_id"])
            joining = self._joining(group, req, version, client)
        except GroupError as err:
            return {"error_code": err.code, "generation_id": -1, "member_id": member_id, "leader": "",
                    "protocol_name": None if version >= 7 else ""}
        if isinstance(joining, str):  # a new member of v4+: it joins again with the id it is given
            return {"error_code": Err.MEMBER_ID_REQUIRED, "generation_id": -1, "member_id": joining,
                    "leader": "", "protocol_name": None if version >= 7 else ""}
        member, replaced = joining
        if replaced and group.state == STABLE and self._selected(group) == group.protocol:
            # a static member back: its old place and assignment, no rebalance
            leader = member.member_id == group.leader
            return {"error_code": 0, "generation_id": group.generation, "protocol_type": group.protocol_type,
                    "protocol_name": group.protocol, "leader": group.leader, "skip_assignment": leader,
                    "member_id": member.member_id, "members": self._everyone(group) if leader else []}
        loop = asyncio.get_running_loop()
        member.join = join = loop.create_future()
        if group.state != PREPARING:
            self._prepare(group)
        if all(m.join is not None for m in group.members.values()):
            self._complete_join(group)
        return await join

    def _joining(self, group: _Group, req: dict[str, Any], version: int, client: str) -> tuple[_Member, bool] | str:
        """The member joining and whether it is a static member taking its old place, or the id a
        new member of v4+ is given (it joins again with it)."""
        session_ms = req["session_timeout_ms"]
        if not SESSION_TIMEOUT_MS_MIN <= session_ms <= SESSION_TIMEOUT_MS_MAX:
            raise GroupError(Err.INVALID_SESSION_TIMEOUT)
        protocols = [(p["name"], bytes(p["metadata"])) for p in req["protocols"]]
        if not protocols or not req["protocol_type"]:
            raise GroupError(Err.INCONSISTENT_GROUP_PROTOCOL)
        if group.members and (req["protocol_type"] != group.protocol_type
                              or not self._common(group, {name for name, _ in protocols})):
            raise GroupError(Err.INCONSISTENT_GROUP_PROTOCOL)
        member_id, instance = req["member_id"], req.get("group_instance_id")
        replaced = False
        if instance is not None and instance in group.static:
            if member_id and member_id != group.static[instance]:
                raise GroupError(Err.FENCED_INSTANCE_ID)
            if not member_id:  # the instance restarted: it takes its old member's place
                member_id, replaced = self._replace(group, group.static[instance]), True
        elif not member_id:
            member_id = f"{instance or 'member'}-{uuid.uuid4()}"
            if version >= MEMBER_ID_REQUIRED_VERSION and instance is None:
                if len(group.pending) >= PENDING_MAX:  # ids handed out to members never seen again
                    group.pending.clear()
                group.pending.add(member_id)
                return member_id
        elif member_id not in group.members and member_id not in group.pending:
            raise GroupError(Err.UNKNOWN_MEMBER_ID)
        group.pending.discard(member_id)
        group.protocol_type = req["protocol_type"]
        rebalance_ms = req.get("rebalance_timeout_ms", -1)
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = _Member(member_id, session_ms, session_ms, protocols, 0.0, client,
                                                        instance)
            if instance is not None:
                group.static[instance] = member_id
        member.session_timeout_ms = session_ms
        member.rebalance_timeout_ms = rebalance_ms if rebalance_ms > 0 else session_ms
        member.protocols, member.last_seen = protocols, asyncio.get_running_loop().time()
        return member, replaced

    @staticmethod
    def _replace(group: _Group, old_id: str) -> str:
        """A static member's new member id, taking the place of ``old_id`` (its assignment, and
        the lead if it led): the old id is fenced."""
        old = group.members.pop(old_id)
        _answer(old, Err.FENCED_INSTANCE_ID)
        new_id = f"{old.instance_id}-{uuid.uuid4()}"
        group.members[new_id] = dataclasses.replace(old, member_id=new_id, join=None, sync=None)
        group.static[old.instance_id or ""] = new_id
        if group.leader == old_id:
            group.leader = new_id
        return new_id

    def _selected(self, group: _Group) -> str:
        """The protocol the members' votes pick among those all of them support."""
        names = self._common(group, {name for name, _ in next(iter(group.members.values())).protocols})
        votes = Counter(next(name for name, _ in m.protocols if name in names) for m in group.members.values())
        return votes.most_common(1)[0][0]

    @staticmethod
    def _everyone(group: _Group) -> list[dict[str, Any]]:
        """The members as the leader's JoinGroup answer lists them, with their metadata."""
        return [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                 "metadata": dict(m.protocols)[group.protocol or ""]} for m in group.members.values()]

    @staticmethod
    def _common(group: _Group, names: set[str]) -> set[str]:
        for member in group.members.values():
            names &= {name for name, _ in member.protocols}
        return names

    def _prepare(self, group: _Group) -> None:
        """Start a rebalance: every member must join again within the longest rebalance timeout."""
        group.state = PREPARING
        for member in group.members.values():
            if member.sync is not None and not member.sync.done():
                member.sync.set_result({"error_code": Err.REBALANCE_IN_PROGRESS, "assignment": b""})
            member.sync = None
        timeout_s = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        if group.deadline is not None:
            group.deadline.cancel()
        group.deadline = asyncio.get_running_loop().call_later(timeout_s, self._complete_join, group)

    def _complete_join(self, group: _Group) -> None:
        """End the join phase: drop who did not join again, bump the generation, answer the joins."""
        if group.state != PREPARING:
            return
        if group.deadline is not None:
            group.deadline.cancel()
            group.deadline = None
        for member_id in [m.member_id for m in group.members.values() if m.join is None]:
            _drop(group, member_id)
        group.generation += 1
        if not group.members:
            group.state, group.leader, group.protocol = EMPTY, None, None
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol = self._selected(group)
        group.state = COMPLETING
        everyone = self._everyone(group)
        for member in group.members.values():
            join, member.join = member.join, None
            if join is not None and not join.done():
                join.set_result({"error_code": 0, "generation_id": group.generation,
                                 "protocol_type": group.protocol_type, "protocol_name": group.protocol,
                                 "leader": group.leader, "member_id": member.member_id,
                                 "members": everyone if member.member_id == group.leader else []})

    # -- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------------

    def _member(self, group_id: str, member_id: str, generation: int,
                instance: str | None) -> tuple[_Group, _Member]:
        group = self._coordinated(group_id)
        _check_instance(group, member_id, instance)
        member = group.members.get(member_id)
        if member is None:
            raise GroupError(Err.UNKNOWN_MEMBER_ID)
        member.last_seen = asyncio.get_running_loop().time()
        if generation != group.generation:
            raise GroupError(Err.ILLEGAL_GENERATION)
        return group, member

    async def sync_group(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        try:
            group, member = self._member(req["group_id"], req["member_id"], req["generation_id"],
                                         req.get("group_instance_id"))
            if group.state == PREPARING:
                raise GroupError(Err.REBALANCE_IN_PROGRESS)
        except GroupError as err:
            return {"error_code": err.code, "assignment": b""}
        answer = {"protocol_type": group.protocol_type, "protocol_name": group.protocol}
        if group.state == STABLE:
            return {**answer, "error_code": 0, "assignment": member.assignment}
        if member.member_id == group.leader:
            parts = {a["member_id"]: bytes(a["assignment"]) for a in req["assignments"]}
            group.state = STABLE
            for each in group.members.values():
                each.assignment = parts.get(each.member_id, b"")
                sync, each.sync = each.sync, None
                if sync is not None and not sync.done():
                    sync.set_result({**answer, "error_code": 0, "assignment": each.assignment})
            return {**answer, "error_code": 0, "assignment": member.assignment}
        member.sync = sync = asyncio.get_running_loop().create_future()
        return await sync

    def heartbeat(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        try:
            group, _ = self._member(req["group_id"], req["member_id"], req["generation_id"],
                                    req.get("group_instance_id"))
        except GroupError as err:
            return {"error_code": err.code}
        return {"error_code": Err.REBALANCE_IN_PROGRESS if group.state == PREPARING else 0}

    def leave_group(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        leaving = ([{"member_id": req["member_id"], "group_instance_id": None}] if version < 3
                   else req["members"])
        try:
            group = self._coordinated(req["group_id"])
        except GroupError as err:
            return {"error_code": err.code}
        rows = []
        for row in leaving:
            member_id, instance = row["member_id"], row.get("group_instance_id")
            code = Err.UNKNOWN_MEMBER_ID
            if instance is not None and instance in group.static:  # (by instance alone: an admin's removal)
                code = Err.FENCED_INSTANCE_ID if member_id and member_id != group.static[instance] else code
                member_id = member_id or group.static[instance]
            found = _drop(group, member_id) if code != Err.FENCED_INSTANCE_ID else None
            rows.append({"member_id": row["member_id"], "group_instance_id": instance,
                         "error_code": 0 if found is not None else code})
            if found is not None:
                self._gone(group, found)
        return {"error_code": 0 if version >= 3 or rows[0]["error_code"] == 0 else rows[0]["error_code"],
                "members": rows}

    def _gone(self, group: _Group, member: _Member) -> None:
        """A member left or expired: the others rebalance."""
        _answer(member, Err.UNKNOWN_MEMBER_ID)
        if group.leader == member.member_id:
            group.leader = None
        if not group.members:
            if group.deadline is not None:
                group.deadline.cancel()
            group.state, group.leader, group.protocol, group.deadline = EMPTY, None, None, None
            group.generation += 1
            return
        if group.state != PREPARING:
            self._prepare(group)
        elif all(m.join is not None for m in group.members.values()):
            self._complete_join(group)

    def check_commit(self, group_id: str, member_id: str, generation: int, instance: str | None = None) -> None:
        """GroupError unless a commit may go ahead: a simple consumer's (no member, generation -1)
        to a group without members, or a member's of the current generation (also while the group
        prepares a rebalance: members commit what they give up), not while it completes one."""
        group = self._groups.get(group_id)
        if group is not None:
            _check_instance(group, member_id, instance)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                raise GroupError(Err.UNKNOWN_MEMBER_ID)
            return
        if group is None or member_id not in group.members:
            raise GroupError(Err.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            raise GroupError(Err.ILLEGAL_GENERATION)
        if group.state == COMPLETING:
            raise GroupError(Err.REBALANCE_IN_PROGRESS)

    async def _expire_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            now = loop.time()
            for name, group in list(self._groups.items()):
                for member in [m for m in group.members.values()
                               if m.join is None and now - m.last_seen > m.session_timeout_ms / 1000]:
                    _drop(group, member.member_id)
                    self._gone(group, member)
                if group.state == EMPTY and not group.members and not group.pending:
                    del self._groups[name]


def _drop(group: _Group, member_id: str) -> _Member | None:
    """Take a member out of the group (a static member's instance id with it); None if unknown."""
    member = group.members.pop(member_id, None)
    if member is not None and member.instance_id is not None and group.static.get(member.instance_id) == member_id:
        del group.static[member.instance_id]
    return member


def _answer(member: _Member, code: int) -> None:
    """Answer a member's JoinGroup or SyncGroup under way with ``code`` (it left, expired, or
    was fenced)."""
    for future in (member.join, member.sync):
        if future is not None and not future.done():
            future.set_result({"error_code": code, "generation_id": -1, "assignment": b"",
                               "member_id": member.member_id, "leader": ""})


def _check_instance(group: _Group, member_id: str, instance: str | None) -> None:
    """FENCED_INSTANCE_ID for a request naming a static member's instance with another member id."""
    if instance is not None and group.static.get(instance, member_id) != member_id:
        raise GroupError(Err.FENCED_INSTANCE_ID)
