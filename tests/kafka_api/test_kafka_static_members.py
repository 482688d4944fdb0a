"""Static group membership (KIP-345, ``group.instance.id``) in Kafka's classic group protocol: a
confluent-kafka consumer restarting with its instance id takes its partitions back without a
rebalance of the others; one that does not come back is dropped after its session timeout, not
before; an old member id of a restarted instance is fenced (FENCED_INSTANCE_ID)."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from tests.kafka_api.conftest import PARTITIONS
from tests.kafka_api.test_kafka_wire import call, connect
from tests.processes import wait_until

WAIT_S = 60
HEARTBEAT_MS = 300


class StaticMember(threading.Thread):
    """A subscribed consumer with an instance id, polling until closed; its rebalance events."""

    def __init__(self, bootstrap: str, group: str, topic: str, instance: str, session_ms: int) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
                                  "session.timeout.ms": session_ms, "heartbeat.interval.ms": HEARTBEAT_MS,
                                  "enable.auto.commit": False})
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        self.partitions: set[int] = set()
        self.events: list[str] = []
        self.stop = threading.Event()
        self.start()

    def _assigned(self, consumer, partitions) -> None:
        self.partitions = {tp.partition for tp in partitions}
        self.events.append("assigned")

    def _revoked(self, consumer, partitions) -> None:
        self.partitions = set()
        self.events.append("revoked")

    def run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.1)
        self.consumer.close()  # a static member does not leave the group: its session runs on

    def close(self) -> None:
        self.stop.set()
        self.join(WAIT_S)


def _members(bootstrap: str, group: str, topic: str, session_ms: int) -> tuple[StaticMember, StaticMember]:
    first = StaticMember(bootstrap, group, topic, "a", session_ms)
    second = StaticMember(bootstrap, group, topic, "b", session_ms)
    wait_until(lambda: len(first.partitions) == len(second.partitions) == PARTITIONS // 2, WAIT_S)
    return first, second


def test_a_static_member_restarting_takes_its_partitions_back_without_a_rebalance(bootstrap, topic):
    group = f"ks-{uuid.uuid4().hex[:8]}"
    first, second = _members(bootstrap, group, topic, 30_000)
    try:
        owned, others_events = set(first.partitions), list(second.events)
        first.close()
        again = StaticMember(bootstrap, group, topic, "a", 30_000)
        try:
            wait_until(lambda: bool(again.partitions), WAIT_S)
            assert again.partitions == owned
            time.sleep(10 * HEARTBEAT_MS / 1000)  # heartbeats in which a rebalance would reach the other member
            assert second.events == others_events and len(second.partitions) == PARTITIONS // 2
        finally:
            again.close()
    finally:
        second.close()


def test_a_static_member_that_does_not_come_back_is_dropped_after_its_session_timeout(bootstrap, topic):
    group = f"ks-{uuid.uuid4().hex[:8]}"
    session_ms = 6_000
    first, second = _members(bootstrap, group, topic, session_ms)
    try:
        first.close()
        closed = time.monotonic()
        wait_until(lambda: len(second.partitions) == PARTITIONS, WAIT_S)
        assert time.monotonic() - closed >= session_ms / 1000 * 0.8  # not at its close: at its session's end
    finally:
        second.close()


def _join(sock, group: str, member_id: str, instance: str) -> dict:
    return call(sock, ApiKey.JOIN_GROUP, 5, {
        "group_id": group, "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000, "member_id": member_id,
        "group_instance_id": instance, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"m"}]})


def test_an_old_member_id_of_a_restarted_instance_is_fenced(bootstrap):
    group = f"ks-{uuid.uuid4().hex[:8]}"
    with connect(bootstrap) as sock:
        first = _join(sock, group, "", "x")  # a static member is not asked to join again for an id
        assert first["error_code"] == 0 and first["leader"] == first["member_id"]
        old, generation = first["member_id"], first["generation_id"]
        synced = call(sock, ApiKey.SYNC_GROUP, 3, {"group_id": group, "generation_id": generation, "member_id": old,
                                                   "group_instance_id": "x", "assignments": [
                                                       {"member_id": old, "assignment": b"mine"}]})
        assert (synced["error_code"], synced["assignment"]) == (0, b"mine")
        back = _join(sock, group, "", "x")
        new = back["member_id"]
        assert (back["error_code"], back["generation_id"], back["leader"]) == (0, generation, new) and new != old
        assert _join(sock, group, old, "x")["error_code"] == Err.FENCED_INSTANCE_ID

        def beat(member_id: str) -> int:
            return call(sock, ApiKey.HEARTBEAT, 3, {"group_id": group, "generation_id": generation,
                                                    "member_id": member_id, "group_instance_id": "x"})["error_code"]
        assert (beat(old), beat(new)) == (Err.FENCED_INSTANCE_ID, 0)
        resynced = call(sock, ApiKey.SYNC_GROUP, 3, {"group_id": group, "generation_id": generation,
                                                     "member_id": new, "group_instance_id": "x", "assignments": []})
        assert (resynced["error_code"], resynced["assignment"]) == (0, b"mine")  # its old assignment
        left = call(sock, ApiKey.LEAVE_GROUP, 3, {"group_id": group, "members": [
            {"member_id": old, "group_instance_id": "x"}, {"member_id": "", "group_instance_id": "y"}]})
        assert [m["error_code"] for m in left["members"]] == [Err.FENCED_INSTANCE_ID, Err.UNKNOWN_MEMBER_ID]
        removed = call(sock, ApiKey.LEAVE_GROUP, 3, {"group_id": group, "members": [
            {"member_id": "", "group_instance_id": "x"}]})  # by its instance id alone, as an admin removes it
        assert [m["error_code"] for m in removed["members"]] == [0]
        assert beat(new) == Err.UNKNOWN_MEMBER_ID
