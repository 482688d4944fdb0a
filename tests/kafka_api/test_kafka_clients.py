"""Kafka's own clients against gms's Kafka API (`gms standalone`): confluent-kafka (librdkafka),
kafka-python and aiokafka produce with each acks mode and compression and read back with assign,
seek and offsets-for-times; commits land in the gms group; topics are created and deleted through
the admin API; gms's SDK and Kafka clients read each other's messages, fields intact."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioPartition
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpPartition

from gms.client import Consumer as GmsConsumer
from gms.client import Producer as GmsProducer
from tests.processes import wait_until

WAIT_S = 30


def consume(bootstrap: str, topic: str, partition: int, count: int, offset: int = 0) -> list:
    """``count`` messages of one partition from ``offset``, with confluent-kafka's assign."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        got: list = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_with_each_acks_and_compression(bootstrap, topic, acks, compression):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "compression.type": compression,
                         "linger.ms": 5})
    delivered: list = []
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i, key=b"key-%d" % i, partition=1,
                         headers=[("h", b"x%d" % i), ("bin", b"\xff\x00")], timestamp=1_700_000_000_000 + i,
                         on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(WAIT_S) == 0
    assert delivered == [None] * 20
    got = consume(bootstrap, topic, 1, 20)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [(i, b"key-%d" % i, b"v%d" % i) for i in range(20)]
    assert got[3].headers() == [("h", b"x3"), ("bin", b"\xff\x00")]
    assert got[3].timestamp() == (1, 1_700_000_000_003)  # CreateTime, kept


@pytest.mark.parametrize("acks", [0, 1, "all"])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_kafka_python_produces_and_seeks(bootstrap, topic, acks, compression):
    # kafka-python's snappy, lz4 and zstd need extra packages; librdkafka covers them above. Its
    # idempotent producer (the default) needs acks=all.
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks, compression_type=compression,
                             enable_idempotence=acks == "all")
    for i in range(5):
        producer.send(topic, value=b"early-%d" % i, key=b"k", partition=0)
    producer.flush(WAIT_S)
    time.sleep(0.05)
    since = int(time.time() * 1000)
    time.sleep(0.05)  # the broker's store time of the next records is after ``since``
    for i in range(5):
        producer.send(topic, value=b"late-%d" % i, partition=0, headers=[("n", b"%d" % i)])
    producer.flush(WAIT_S)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        tp = KpPartition(topic, 0)
        consumer.assign([tp])
        wait_until(lambda: consumer.end_offsets([tp])[tp] == 10, WAIT_S)
        assert consumer.beginning_offsets([tp])[tp] == 0
        assert consumer.offsets_for_times({tp: since})[tp].offset == 5
        consumer.seek(tp, 7)
        got = [(m.offset, m.value, m.headers) for m in consumer]
    finally:
        consumer.close()
    assert got == [(7, b"late-2", [("n", b"2")]), (8, b"late-3", [("n", b"3")]), (9, b"late-4", [("n", b"4")])]


def test_aiokafka_produces_and_consumes(bootstrap, topic):
    async def run() -> list:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip")
        await producer.start()
        try:
            sent = [await producer.send_and_wait(topic, b"a%d" % i, key=b"ak", partition=1) for i in range(3)]
            assert [meta.offset for meta in sent] == [0, 1, 2]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioPartition(topic, 1)])
            consumer.seek(AioPartition(topic, 1), 1)
            return [await asyncio.wait_for(consumer.getone(), WAIT_S) for _ in range(2)]
        finally:
            await consumer.stop()
    got = asyncio.run(run())
    assert [(m.offset, m.key, m.value) for m in got] == [(1, b"ak", b"a1"), (2, b"ak", b"a2")]


def test_commits_are_the_gms_groups_offsets(bootstrap, topic, standalone):
    group = f"kg-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)], asynchronous=False)
        assert [tp.offset for tp in consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)],
                                                       timeout=WAIT_S)] == [0, 0]
    finally:
        consumer.close()
    described = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "group", "describe", group, "--nameserver",
                                standalone["nameserver"], "--json"], capture_output=True, text=True, timeout=60,
                               check=False)
    assert described.returncode == 0, described.stderr
    assert topic in described.stdout


def test_topics_are_created_and_deleted_through_the_admin_api(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"k-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(WAIT_S)
    assert len(admin.list_topics(timeout=WAIT_S).topics[name].partitions) == 3
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS"):
        admin.create_topics([NewTopic(name, 3, 1)])[name].result(WAIT_S)
    admin.delete_topics([name])[name].result(WAIT_S)
    wait_until(lambda: name not in admin.list_topics(timeout=WAIT_S).topics, WAIT_S)


def test_a_gms_producers_messages_reach_a_kafka_consumer(bootstrap, topic, standalone):
    with GmsProducer(nameserver=standalone["nameserver"]) as producer:
        producer.send(topic, b"from-gms", tag="TagA", keys=("order-1",), properties={"p": "1"}, queue=1)
    (message,) = consume(bootstrap, topic, 1, 1)
    assert (message.key(), message.value()) == (b"order-1", b"from-gms")
    assert dict(message.headers()) == {"p": b"1", "gms.tag": b"TagA"}


def test_a_kafka_producers_messages_reach_a_gms_consumer_filtering_by_tag(bootstrap, topic, standalone):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, tag in enumerate(["A", "B", "A"]):
        producer.produce(topic, value=b"m%d" % i, key=b"k%d" % i, partition=0,
                         headers=[("gms.tag", tag.encode()), ("p", b"v%d" % i)])
    assert producer.flush(WAIT_S) == 0
    consumer = GmsConsumer(nameserver=standalone["nameserver"], group=f"gg-{uuid.uuid4().hex[:8]}",
                           subscription={topic: "A"}, start_from="first")
    got: list = []
    try:
        wait_until(lambda: bool(got.extend(consumer.poll(500))) or len(got) >= 2, WAIT_S)
    finally:
        consumer.close()
    assert [(m.body, m.tag, m.keys, m.properties) for m in got] == [
        (b"m0", "A", ("k0",), {"p": "v0"}), (b"m2", "A", ("k2",), {"p": "v2"})]


def test_a_batch_larger_than_one_gms_send_is_stored_whole_and_in_order(bootstrap, topic):
    # 50,000 records in one batch are ~1.5 MB as Kafka records and ~6 MB as gms records: over the
    # 2 MiB one gms send takes, so the broker stores them in several, adjacent.
    count = 50_000
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1000, "batch.num.messages": 100_000,
                         "batch.size": 8 << 20, "message.max.bytes": 16 << 20, "acks": "all"})
    offsets: list = []
    for i in range(count):
        producer.produce(topic, value=b"%020d" % i, partition=0,
                         on_delivery=lambda err, msg: offsets.append((err, msg.offset(), msg.value())))
    assert producer.flush(WAIT_S) == 0
    assert {err for err, _, _ in offsets} == {None}
    assert sorted(offsets, key=lambda row: row[1]) == [(None, i, b"%020d" % i) for i in range(count)]
    got = consume(bootstrap, topic, 0, count)
    assert [m.value() for m in got] == [b"%020d" % i for i in range(count)]


def test_a_record_over_the_topics_max_message_bytes_is_message_too_large_and_the_rest_is_stored(bootstrap):
    name = f"k-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config={"max.message.bytes": str(64 << 10)})])[name].result(WAIT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4 << 20})
    outcomes: list = []
    for value in (b"a" * 1000, b"b" * (256 << 10), b"c" * 1000):
        producer.produce(name, value=value, partition=0, on_delivery=lambda err, msg: outcomes.append(err))
        producer.flush(WAIT_S)
    assert [err.code() if err else None for err in outcomes] == [None, KafkaError.MSG_SIZE_TOO_LARGE, None]
    assert [m.value()[:1] for m in consume(bootstrap, name, 0, 2)] == [b"a", b"c"]


def test_a_kafka_producers_messages_reach_a_rocketmq_5_client(bootstrap, topic, standalone):
    rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")
    endpoint = standalone["rocketmq"].split()[0]
    consumer = rocketmq.SimpleConsumer(rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials()), "g-kafka-rmq",
                                       {topic: rocketmq.FilterExpression("A")}, await_duration=1)
    consumer.startup()
    try:
        consumer.receive(16, 10)  # gms starts a new group at the end of its queues: this places it
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i, tag in enumerate(["A", "B", "A"]):
            producer.produce(topic, value=b"r%d" % i, key=b"rk%d" % i, partition=i % 2,
                             headers=[("gms.tag", tag.encode()), ("p", b"v%d" % i)])
        assert producer.flush(WAIT_S) == 0
        got: list = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.receive(16, 10)
        for message in got:
            consumer.ack(message)
    finally:
        consumer.shutdown()
    assert sorted((m.body, m.tag, tuple(m.keys), m.properties.get("p")) for m in got) == [
        (b"r0", "A", ("rk0",), "v0"), (b"r2", "A", ("rk2",), "v2")]
