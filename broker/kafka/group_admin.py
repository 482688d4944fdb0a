"""ListGroups, DescribeGroups, DeleteGroups and OffsetDelete: the groups a broker coordinates, as
Kafka's admin clients list, describe and delete consumer groups and their offsets. Both kinds are
answered: Kafka's (the members of its classic protocol, :mod:`.groups`) and gms's (the group
service's members and offsets).

A gms group with members is a consumer group of protocol ``gms`` (gms's own assignment) whose
members' assignments are their queues, encoded as a Kafka consumer's; a group known only by its
committed offsets is Empty without a protocol type, as Kafka's simple consumer groups are.
Deleting a group deletes its committed offsets on every broker (as ``gms group delete`` does),
refused with NON_EMPTY_GROUP while it has live members, Kafka's or gms's. Deleting a group's
offsets of some partitions deletes them at each partition's leader, refused per partition with
GROUP_SUBSCRIBED_TO_TOPIC while a member subscribes to the topic (a Kafka member) or reads the
queue (a gms member).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gms.broker.kafka.errors import Err, code_of
from gms.broker.kafka.groups import CONSUMER, EMPTY, STABLE, KafkaGroups
from gms.broker.kafka.wire import Writer
from gms.broker.services import Services
from gms.errors import GmsError, GroupNotEmptyError, GroupNotFoundError
from gms.protocol.groups import QueueRef

DEAD = "Dead"  # DescribeGroups' state of a group the coordinator does not know
GMS_PROTOCOL = "gms"  # the protocol (assignor) named for a gms group's members
AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)


class GroupAdmin:
    def __init__(self, services: Services, members: KafkaGroups) -> None:
        self.groups = services.groups
        self.topics = services.topics
        self.members = members

    def _coordinator_code(self, name: str) -> int:
        """NONE if this broker coordinates ``name``, else the group's error code."""
        try:
            return Err.NONE if self.groups.coordinator(name) == self.members.address else Err.NOT_COORDINATOR
        except GmsError as err:
            return Err.INVALID_GROUP_ID if code_of(err) == Err.INVALID_REQUEST else code_of(err)

    async def _known_anywhere(self) -> set[str]:
        """The groups with Kafka members here or members or offsets on any live broker."""
        brokers = [info.address for info in self.topics.live_brokers() or ()]
        return {*self.members.names(), *await self.groups.names_everywhere(brokers)}

    async def list_groups(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        wanted = set(req.get("states_filter") or ())
        rows = []
        for name in sorted(await self._known_anywhere()):
            if self._coordinator_code(name) != Err.NONE:
                continue
            described = self._described(name, known=True)
            if wanted and described["group_state"] not in wanted:
                continue
            rows.append({"group_id": name, "protocol_type": described["protocol_type"],
                         "group_state": described["group_state"]})
        return {"error_code": 0, "groups": rows}

    async def describe_groups(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        rows = []
        known: set[str] | None = None  # asked of the other brokers only for a group unknown here
        for name in req["groups"]:
            code = self._coordinator_code(name)
            if code != Err.NONE:
                rows.append({"error_code": code, "group_id": name, "group_state": "", "protocol_type": "",
                             "protocol_data": "", "members": []})
                continue
            described = self._described(name, known=False)
            if described["group_state"] == DEAD:
                known = await self._known_anywhere() if known is None else known
                described = self._described(name, known=name in known)
            rows.append({"error_code": 0, "group_id": name, **described})
        return {"groups": rows}

    def _described(self, name: str, known: bool) -> dict[str, Any]:
        """A group coordinated here: its state, protocol and members (Kafka's, else gms's); one
        without members here is Empty if ``known`` (its offsets are on other brokers), else Dead."""
        kafka = self.members.known(name)
        if kafka is not None and (kafka.members or kafka.state != EMPTY):
            stable = kafka.state == STABLE
            members = [{"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": "",
                        "client_host": _host(m.client),
                        "member_metadata": dict(m.protocols).get(kafka.protocol or "", b"") if stable else b"",
                        "member_assignment": m.assignment if stable else b""} for m in kafka.members.values()]
            return {"group_state": kafka.state, "protocol_type": kafka.protocol_type,
                    "protocol_data": (kafka.protocol or "") if stable else "", "members": members,
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        try:
            view = self.groups.describe(name)
        except GroupNotFoundError:
            return {"group_state": EMPTY if known else DEAD, "protocol_type": "", "protocol_data": "", "members": [],
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        members = [{"member_id": m.member_id, "client_id": "", "client_host": _host(m.client_address),
                    "member_metadata": _subscription(m.subscription), "member_assignment": _assignment(queues)}
                   for m, queues in view.members]
        return {"group_state": STABLE if members else EMPTY, "protocol_type": CONSUMER if members else "",
                "protocol_data": GMS_PROTOCOL if members else "", "members": members,
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    async def delete_groups(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        return {"results": [{"group_id": name, "error_code": await self._delete(name)}
                            for name in req["groups_names"]]}

    async def _delete(self, name: str) -> int:
        code = self._coordinator_code(name)
        if code != Err.NONE:
            return code
        kafka = self.members.known(name)
        if kafka is not None and kafka.members:
            return Err.NON_EMPTY_GROUP
        brokers = [info.address for info in self.topics.live_brokers() or ()]
        try:
            deleted = await self.groups.delete_everywhere(name, brokers)
        except GmsError as err:  # GroupNotEmptyError: NON_EMPTY_GROUP
            return code_of(err)
        self.members.forget(name)
        return Err.NONE if deleted or kafka is not None else Err.GROUP_ID_NOT_FOUND


    async def offset_delete(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        name = req["group_id"]
        code = self._coordinator_code(name)
        kafka = self.members.known(name)
        if code == Err.NONE and kafka is not None and kafka.members and kafka.protocol_type != CONSUMER:
            code = Err.NON_EMPTY_GROUP  # a group of another protocol: Kafka knows none of its topics
        elif code == Err.NONE and kafka is None and name not in await self._known_anywhere():
            code = Err.GROUP_ID_NOT_FOUND
        if code != Err.NONE:
            return {"error_code": code, "topics": []}
        subscribed = self.members.subscribed(name)
        queues = [QueueRef(topic["name"], p["partition_index"]) for topic in req["topics"]
                  if topic["name"] not in subscribed for p in topic["partitions"]]
        errors = iter(await self.groups.delete_offsets_at_leaders(name, queues))
        return {"error_code": 0, "topics": [{"name": topic["name"], "partitions": [
            {"partition_index": p["partition_index"],
             "error_code": Err.GROUP_SUBSCRIBED_TO_TOPIC if topic["name"] in subscribed else _offset_code(next(errors))}
            for p in topic["partitions"]]} for topic in req["topics"]]}


def _offset_code(err: GmsError | None) -> int:
    """A partition's code in OffsetDelete: a gms member reading the queue is a subscriber."""
    if err is None:
        return Err.NONE
    return Err.GROUP_SUBSCRIBED_TO_TOPIC if isinstance(err, GroupNotEmptyError) else code_of(err)


def _host(address: str) -> str:
    """Kafka's ClientHost: "/" and the client's host."""
    return "/" + address.rpartition(":")[0].strip("[]") if address else ""


def _assignment(queues: list[QueueRef]) -> bytes:
    """Queues as a Kafka consumer's assignment (ConsumerProtocolAssignment v0: version, topics
    with their partitions, null user data), so Kafka's admin clients show a gms member's queues."""
    by_topic: dict[str, list[int]] = {}
    for topic, queue_id in queues:
        by_topic.setdefault(topic, []).append(queue_id)
    writer = Writer()
    writer.int16(0)
    writer.int32(len(by_topic))
    for topic, ids in by_topic.items():
        writer.string(topic, False)
        writer.int32(len(ids))
        for queue_id in ids:
            writer.int32(queue_id)
    writer.blob(None, False)
    return bytes(writer.buf)


def _subscription(topics: Iterable[str]) -> bytes:
    """Topics as a Kafka consumer's subscription (ConsumerProtocolSubscription v0: version,
    topics, null user data): a gms member's metadata."""
    names = list(topics)
    writer = Writer()
    writer.int16(0)
    writer.int32(len(names))
    for topic in names:
        writer.string(topic, False)
    writer.blob(None, False)
    return bytes(writer.buf)
