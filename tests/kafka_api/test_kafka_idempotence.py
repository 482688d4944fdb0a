"""Kafka's idempotent producer on gms's producer sequences: InitProducerId, a retried batch stored
once and answered with where it is, gaps and stale epochs refused with Kafka's codes, and
confluent-kafka's idempotent producer end to end; transactions refused at once."""

from __future__ import annotations

import struct
import time

import crc32c
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from gms.broker.kafka.records import CRC_START, KafkaRecord, encode_batch
from gms.broker.store.producer_state import BATCHES_KEPT
from tests.kafka_api.test_kafka_wire import call, connect

TIMEOUT_S = 30


def idempotent_batch(producer_id: int, epoch: int, sequence: int, count: int, pad: int = 0) -> bytes:
    """A batch of ``count`` records (values ``v<sequence>`` and ``pad`` bytes) as an idempotent
    producer numbers them from ``sequence``."""
    now = int(time.time() * 1000)
    batch = bytearray(encode_batch(0, [KafkaRecord(i, now, None, b"v%d" % (sequence + i) + b"." * pad, [])
                                       for i in range(count)]))
    struct.pack_into(">qhi", batch, 43, producer_id, epoch, sequence)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(batch[CRC_START:]))
    return bytes(batch)


def produce(sock, topic: str, records: bytes) -> dict:
    answer = call(sock, ApiKey.PRODUCE, 9, {"acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    return answer["responses"][0]["partition_responses"][0]


def init_producer_id(sock, transactional_id: str | None = None) -> dict:
    return call(sock, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id,
                                                   "transaction_timeout_ms": 60000, "producer_id": -1,
                                                   "producer_epoch": -1})


def read_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "idem-check", "enable.auto.commit": False})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)[1]
                for p in range(partitions)]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < sum(ends) and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                values.append(message.value())
        return values
    finally:
        consumer.close()


def test_a_retried_batch_is_stored_once_and_answered_with_where_it_is(bootstrap, topic):
    with connect(bootstrap) as sock:
        answer = init_producer_id(sock)
        assert (answer["error_code"], answer["producer_epoch"]) == (0, 0) and answer["producer_id"] >= 0
        pid = answer["producer_id"]
        assert init_producer_id(sock)["producer_id"] != pid  # every producer an id of its own
        first = idempotent_batch(pid, 0, 0, 3)
        assert (produce(sock, topic, first)["error_code"], produce(sock, topic, first)["base_offset"]) == (0, 0)
        assert produce(sock, topic, first)["base_offset"] == 0  # a retry: where it is, not stored again
        stored = produce(sock, topic, idempotent_batch(pid, 0, 3, 2))
        assert (stored["error_code"], stored["base_offset"]) == (0, 3)
        assert produce(sock, topic, idempotent_batch(pid, 0, 9, 1))["error_code"] == Err.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(sock, topic, idempotent_batch(pid, 0, 4, 1))["error_code"] == Err.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(sock, topic, idempotent_batch(pid, 0, 5, 1))["base_offset"] == 5  # the next one is taken
    assert read_values(bootstrap, topic, 2) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]


def test_a_batch_stored_as_several_gms_sends_is_recognised_when_retried(bootstrap, topic):
    with connect(bootstrap) as sock:
        pid = init_producer_id(sock)["producer_id"]
        big = idempotent_batch(pid, 0, 0, 30, pad=100_000)  # 3 MB: more than one gms send holds
        for _ in range(2):
            stored = produce(sock, topic, big)
            assert (stored["error_code"], stored["base_offset"]) == (0, 0)
        assert produce(sock, topic, idempotent_batch(pid, 0, 30, 1))["base_offset"] == 30
    assert len(read_values(bootstrap, topic, 2)) == 31


def test_stale_epochs_unknown_producers_and_old_retries_get_kafkas_codes(bootstrap, topic):
    with connect(bootstrap) as sock:
        pid = init_producer_id(sock)["producer_id"]
        assert produce(sock, topic, idempotent_batch(pid, 0, 7, 1))["error_code"] == Err.UNKNOWN_PRODUCER_ID
        for sequence in range(BATCHES_KEPT + 1):
            assert produce(sock, topic, idempotent_batch(pid, 0, sequence, 1))["error_code"] == 0
        assert produce(sock, topic, idempotent_batch(pid, 0, 0, 1))["error_code"] == Err.DUPLICATE_SEQUENCE_NUMBER
        assert produce(sock, topic, idempotent_batch(pid, 1, 0, 1))["error_code"] == 0  # a new epoch from 0
        assert produce(sock, topic, idempotent_batch(pid, 0, BATCHES_KEPT + 1, 1))["error_code"] == \
            Err.INVALID_PRODUCER_EPOCH


def test_a_transactional_producer_is_refused_at_once(bootstrap, topic):
    with connect(bootstrap) as sock:
        assert init_producer_id(sock, "tx-1")["error_code"] == Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx-1"})
    started = time.monotonic()
    with pytest.raises(KafkaException) as failed:
        producer.init_transactions(TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S / 2, "init_transactions waited for its timeout"
    assert failed.value.args[0].code() == Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_confluent_kafkas_idempotent_producer_stores_each_message_once(bootstrap, topic):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failures: list[object] = []
    for i in range(2000):
        producer.produce(topic, value=b"m%d" % i, partition=i % 2,
                         on_delivery=lambda err, msg: failures.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    assert failures == []
    values = read_values(bootstrap, topic, 2)
    assert sorted(values) == sorted(b"m%d" % i for i in range(2000))
    assert [v for v in values if int(v[1:]) % 2 == 0] == [b"m%d" % i for i in range(0, 2000, 2)]  # in order
