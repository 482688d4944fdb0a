"""The Kafka API on a gms cluster of three brokers (embedded etcd, a nameserver, broker processes
each serving Kafka): any broker's Metadata names every broker at the Kafka address it registered,
and each partition's leader, replicas and ISR as gms routes the queue; a producer with acks=all
reaches every leader and a consumer reads every partition back from it."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from gms_cluster import LocalCluster
from processes import free_port, wait_until

from gms.client import Admin

pytestmark = pytest.mark.timeout(180)
BROKERS = 3
QUEUES = 6
WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("kafka-cluster")).start(nameservers=1, brokers=0)
    try:
        for _ in range(BROKERS):
            endpoint = f"127.0.0.1:{free_port()}"
            running.add_broker("--kafka-listen", endpoint).kafka = endpoint
        running.wait_registered(BROKERS)
        yield running
    finally:
        running.stop()


def test_metadata_names_every_broker_and_each_partitions_leader_and_isr(cluster):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, QUEUES, replicas=BROKERS)
    endpoints = {broker.kafka for broker in cluster.brokers}
    admin = AdminClient({"bootstrap.servers": cluster.brokers[0].kafka})

    def settled() -> bool:
        found = admin.list_topics(timeout=WAIT_S)
        partitions = found.topics.get(topic)
        return (partitions is not None and len(partitions.partitions) == QUEUES
                and all(p.leader >= 0 and len(p.isrs) == BROKERS for p in partitions.partitions.values()))
    wait_until(settled, WAIT_S)
    metadata = admin.list_topics(timeout=WAIT_S)
    assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == endpoints
    leaders = {p.leader for p in metadata.topics[topic].partitions.values()}
    assert leaders <= set(metadata.brokers) and len(leaders) > 1  # the queues are spread
    for partition in metadata.topics[topic].partitions.values():
        assert sorted(partition.replicas) == sorted(metadata.brokers)

    producer = Producer({"bootstrap.servers": cluster.brokers[1].kafka, "acks": "all"})
    for queue in range(QUEUES):
        producer.produce(topic, value=b"to-%d" % queue, partition=queue)
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({"bootstrap.servers": cluster.brokers[2].kafka, "group.id": "g", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, queue, 0) for queue in range(QUEUES)])
        got = {}
        deadline = time.monotonic() + WAIT_S
        while len(got) < QUEUES and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                got[message.partition()] = message.value()
    finally:
        consumer.close()
    assert got == {queue: b"to-%d" % queue for queue in range(QUEUES)}
