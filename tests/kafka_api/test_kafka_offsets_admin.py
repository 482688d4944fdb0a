"""Kafka's admin calls on a group's offsets and a partition's records against a `gms standalone`:
OffsetDelete (kafka-python's delete_group_offsets: confluent-kafka's Python API has none), DeleteRecords
(delete_records: the partition's low watermark moves, and the records below it are gone for
every reader) and ElectLeaders, with the errors a Kafka broker answers."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_END, Consumer, ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import GroupSubscribedToTopicError, NoError

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from gms.client import Consumer as GmsConsumer
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


def _produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=b"m%d" % i, partition=partition)
    assert producer.flush(WAIT_S) == 0


def _first_read(bootstrap: str, topic: str, partition: int) -> int:
    """The offset of the first record a consumer reading from offset 0 gets (reset to earliest)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _group_name(), "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                return message.offset()
        raise AssertionError("nothing read")
    finally:
        consumer.close()


def test_delete_records_moves_the_low_watermark_and_readers_start_there(bootstrap, topic):
    _produce(bootstrap, topic, 0, 10)
    _produce(bootstrap, topic, 1, 3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = [TopicPartition(topic, 0, 4), TopicPartition(topic, 1, OFFSET_END)]
    deleted = {tp.partition: future.result(WAIT_S) for tp, future in admin.delete_records(asked).items()}
    assert {p: d.low_watermark for p, d in deleted.items()} == {0: 4, 1: 3}
    assert _first_read(bootstrap, topic, 0) == 4  # offset 0 is out of range now: reset to the earliest
    low, high = Consumer({"bootstrap.servers": bootstrap, "group.id": "w"}).get_watermark_offsets(
        TopicPartition(topic, 0), timeout=WAIT_S)
    assert (low, high) == (4, 10)
    again = admin.delete_records([TopicPartition(topic, 0, 2)])  # below the low watermark: nothing moves
    assert next(iter(again.values())).result(WAIT_S).low_watermark == 4


def test_delete_records_answers_kafkas_errors(bootstrap, topic):
    _produce(bootstrap, topic, 0, 2)
    compacted = f"kc-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(compacted, 1, 1, config={"cleanup.policy": "compact"})])[compacted].result(WAIT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(compacted, key=b"k", value=b"v", partition=0)
    assert producer.flush(WAIT_S) == 0  # once its queue is led here
    with connect(bootstrap) as sock:
        answer = call(sock, ApiKey.DELETE_RECORDS, 2, {"timeout_ms": 5000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "offset": 3},
                                           {"partition_index": 0, "offset": -2},
                                           {"partition_index": 9, "offset": 0}]},
            {"name": compacted, "partitions": [{"partition_index": 0, "offset": 0}]},
            {"name": "no-such-topic", "partitions": [{"partition_index": 0, "offset": 0}]}]})
    codes = [p["error_code"] for t in answer["topics"] for p in t["partitions"]]
    assert codes == [Err.OFFSET_OUT_OF_RANGE, Err.OFFSET_OUT_OF_RANGE, Err.UNKNOWN_TOPIC_OR_PARTITION,
                     Err.POLICY_VIOLATION, Err.UNKNOWN_TOPIC_OR_PARTITION]
    assert _first_read(bootstrap, topic, 0) == 0  # nothing was deleted


def test_elect_leaders_answers_that_no_election_is_needed(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        result = admin.elect_leaders(election, [TopicPartition(topic, 0), TopicPartition(topic, 9)]).result(WAIT_S)
        codes = {tp.partition: error.code() if error is not None else None for tp, error in result.items()}
        assert codes == {0: KafkaError.ELECTION_NOT_NEEDED, 9: KafkaError.UNKNOWN_TOPIC_OR_PART}


def test_offset_delete_refuses_the_queues_a_gms_member_reads(bootstrap, topic, standalone, kp_admin):
    group = _group_name()
    _commit(bootstrap, group, [TopicPartition(topic, 0, 1)])
    consumer = GmsConsumer(nameserver=standalone["nameserver"], group=group, subscription={topic: "*"})
    try:
        def refused() -> bool:
            consumer.poll(200)
            answer = kp_admin.delete_group_offsets(group, [KpTopicPartition(topic, 0)])
            return answer == {KpTopicPartition(topic, 0): GroupSubscribedToTopicError}
        wait_until(refused, WAIT_S)  # once the member reads the queue
    finally:
        consumer.close()
