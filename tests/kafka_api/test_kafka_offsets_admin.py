"""Kafka's admin calls on a group's offsets and a partition's records against a `gms standalone`:
OffsetDelete (kafka-python's delete_group_offsets: confluent-kafka's Python API has none), DeleteRecords
(delete_records: the partition's low watermark moves, and the records below it are gone for
every reader), with the errors a Kafka broker answers."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import GroupSubscribedToTopicError, NoError

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from tests.kafka_api.test_kafka_wire import call, connect
from tests.processes import wait_until

WAIT_S = 30


def _group_name() -> str:
    return f"ko-{uuid.uuid4().hex[:8]}"


def _commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    """A simple consumer's commit (no member: the group has no Kafka members)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, partitions: list[TopicPartition]) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in consumer.committed(partitions, timeout=WAIT_S)]
    finally:
        consumer.close()


@pytest.fixture
def kp_admin(bootstrap):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    yield admin
    admin.close()


def test_offset_delete_deletes_the_partitions_named_and_keeps_the_others(bootstrap, topic, kp_admin):
    group = _group_name()
    _commit(bootstrap, group, [TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)])
    assert kp_admin.delete_group_offsets(group, [KpTopicPartition(topic, 0)]) == {KpTopicPartition(topic, 0): NoError}
    unset = -1001  # librdkafka's OFFSET_INVALID: no committed offset
    assert _committed(bootstrap, group, [TopicPartition(topic, 0), TopicPartition(topic, 1)]) == [unset, 5]


def test_offset_delete_refuses_a_topic_a_live_member_subscribes_to(bootstrap, topic, kp_admin):
    group = _group_name()
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10_000,
                       "enable.auto.commit": False})
    try:
        member.subscribe([topic])
        wait_until(lambda: member.poll(0.2) is None and bool(member.assignment()), WAIT_S)
        member.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
        refused = kp_admin.delete_group_offsets(group, [KpTopicPartition(topic, 0)])
        assert refused == {KpTopicPartition(topic, 0): GroupSubscribedToTopicError}
        assert _committed(bootstrap, group, [TopicPartition(topic, 0)]) == [2]
    finally:
        member.close()


def test_offset_delete_answers_kafkas_errors(bootstrap, topic):
    with connect(bootstrap) as sock:
        unknown = call(sock, ApiKey.OFFSET_DELETE, 0, {"group_id": _group_name(), "topics": [
            {"name": topic, "partitions": [{"partition_index": 0}]}]})
        invalid = call(sock, ApiKey.OFFSET_DELETE, 0, {"group_id": "", "topics": []})
        group = _group_name()
        _commit(bootstrap, group, [TopicPartition(topic, 0, 1)])
        missing = call(sock, ApiKey.OFFSET_DELETE, 0, {"group_id": group, "topics": [
            {"name": topic, "partitions": [{"partition_index": 99}]},
            {"name": "no-such-topic", "partitions": [{"partition_index": 0}]}]})
    assert unknown["error_code"] == Err.GROUP_ID_NOT_FOUND
    assert invalid["error_code"] == Err.INVALID_GROUP_ID
    assert missing["error_code"] == 0
    assert [t["partitions"][0]["error_code"] for t in missing["topics"]] == [Err.UNKNOWN_TOPIC_OR_PARTITION] * 2
