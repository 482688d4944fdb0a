"""Fetch sessions (KIP-227): kafka-python's consumer, which opens a session and then fetches
incrementally, reads every message through them; on the wire, an incremental fetch is answered
only the partitions with news, forgotten partitions are left out, and an unknown session or a
wrong epoch answers Kafka's errors."""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Producer
from kafka import KafkaConsumer

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from tests.kafka_api.conftest import PARTITIONS
from tests.kafka_api.test_kafka_wire import call, connect
from tests.processes import wait_until

WAIT_S = 30
VERSION = 12


def _produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(WAIT_S) == 0


def test_kafka_pythons_consumer_reads_everything_through_incremental_fetches(bootstrap, topic, caplog):
    first = [b"first-%d" % i for i in range(20)]
    later = [b"later-%d" % i for i in range(20)]
    for partition in range(PARTITIONS):
        _produce(bootstrap, topic, partition, first)
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"kf-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", fetch_max_wait_ms=200)
    got: list[bytes] = []
    try:
        with caplog.at_level(logging.DEBUG, logger="kafka.consumer.fetcher"):
            deadline = time.monotonic() + WAIT_S
            while len(got) < len(first) * PARTITIONS and time.monotonic() < deadline:
                got += [r.value for rs in consumer.poll(timeout_ms=500).values() for r in rs]
            for partition in range(PARTITIONS):
                _produce(bootstrap, topic, partition, later)
            while len(got) < (len(first) + len(later)) * PARTITIONS and time.monotonic() < deadline:
                got += [r.value for rs in consumer.poll(timeout_ms=500).values() for r in rs]
    finally:
        consumer.close()
    assert sorted(got) == sorted((first + later) * PARTITIONS)
    assert "incremental fetch response for session" in caplog.text  # the session went on, not just opened


def _fetch(sock, topic: str, session_id: int, epoch: int, partitions: dict[int, int],
           forgotten: list[int] | None = None, wait_ms: int = 100) -> dict:
    return call(sock, ApiKey.FETCH, VERSION, {
        "replica_id": -1, "max_wait_ms": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": session_id, "session_epoch": epoch, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p, offset in partitions.items()]}]
        if partitions else [],
        "forgotten_topics_data": [{"topic": topic, "partitions": forgotten}] if forgotten else []})


def _answered(answer: dict) -> dict[int, int]:
    """Each partition answered, with the number of bytes of records."""
    return {p["partition_index"]: len(p["records"] or b"") for t in answer["responses"] for p in t["partitions"]}


def test_an_incremental_fetch_answers_only_the_partitions_with_news(bootstrap, topic):
    with connect(bootstrap) as sock:
        wait_until(lambda: all(p["error_code"] == 0 for t in _fetch(sock, topic, 0, -1, {0: 0, 1: 0})["responses"]
                               for p in t["partitions"]), WAIT_S)  # the new topic's queues are led
        opened = _fetch(sock, topic, 0, 0, {0: 0, 1: 0})
        session = opened["session_id"]
        assert opened["error_code"] == 0 and session > 0
        assert set(_answered(opened)) == {0, 1}  # a full fetch answers every partition
        assert _answered(_fetch(sock, topic, session, 1, {})) == {}  # nothing new anywhere
        _produce(bootstrap, topic, 0, [b"x"])
        news = _fetch(sock, topic, session, 2, {}, wait_ms=5_000)
        assert list(_answered(news)) == [0] and _answered(news)[0] > 0  # records, and a new high watermark
        assert _answered(_fetch(sock, topic, session, 3, {0: 1})) == {}  # read up to the end
        _produce(bootstrap, topic, 1, [b"y"])
        assert _answered(_fetch(sock, topic, session, 4, {}, forgotten=[1])) == {}  # partition 1 left the session
        wrong_epoch = _fetch(sock, topic, session, 9, {})
        closed = _fetch(sock, topic, session, -1, {0: 0})  # a full fetch closing the session
        after_close = _fetch(sock, topic, session, 6, {})
        unknown = _fetch(sock, topic, 12345, 1, {})
    assert (wrong_epoch["error_code"], wrong_epoch["responses"]) == (Err.INVALID_FETCH_SESSION_EPOCH, [])
    assert (closed["error_code"], closed["session_id"], set(_answered(closed))) == (0, 0, {0})
    assert after_close["error_code"] == unknown["error_code"] == Err.FETCH_SESSION_ID_NOT_FOUND
