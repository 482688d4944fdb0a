"""The Kafka API on a gms cluster of three brokers (embedded etcd, a nameserver, broker processes
each serving Kafka): any broker's Metadata names every broker at the Kafka address it registered,
and each partition's leader, replicas and ISR as gms routes the queue; a producer with acks=all
reaches every leader and a consumer reads every partition back from it; DeleteRecords moves a
partition's first offset on its followers too, OffsetDelete deletes at each partition's leader."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from gms_cluster import LocalCluster
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import NoError
from processes import wait_until

from gms.client import Admin
from gms.errors import GroupNotFoundError
from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode

pytestmark = pytest.mark.timeout(180)
BROKERS = 3
QUEUES = 6
WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("kafka-cluster")).start(nameservers=1, brokers=0)
    try:
        for index in range(BROKERS):  # port 0: a port picked free beforehand can be taken meanwhile
            port_file = running.root / f"broker{index}.kafka-port"
            broker = running.add_broker("--kafka-listen", "127.0.0.1:0", "--kafka-port-file", str(port_file))
            wait_until(port_file.exists, WAIT_S)
            broker.kafka = f"127.0.0.1:{int(port_file.read_text())}"
        running.wait_registered(BROKERS)
        yield running
    finally:
        running.stop()


def _settled_topic(cluster) -> tuple[str, object]:
    """A new topic of QUEUES queues on every broker, once Metadata shows each with a leader and
    a full ISR; (its name, that Metadata)."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, QUEUES, replicas=BROKERS)
    admin = AdminClient({"bootstrap.servers": cluster.brokers[0].kafka})

    def settled() -> bool:
        found = admin.list_topics(timeout=WAIT_S)
        partitions = found.topics.get(topic)
        return (partitions is not None and len(partitions.partitions) == QUEUES
                and all(p.leader >= 0 and len(p.isrs) == BROKERS for p in partitions.partitions.values()))
    wait_until(settled, WAIT_S)
    return topic, admin.list_topics(timeout=WAIT_S)


def test_metadata_names_every_broker_and_each_partitions_leader_and_isr(cluster):
    topic, metadata = _settled_topic(cluster)
    endpoints = {broker.kafka for broker in cluster.brokers}
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


def test_a_commit_to_the_coordinator_is_stored_at_each_partitions_leader(cluster):
    topic, metadata = _settled_topic(cluster)
    gms_address = {broker.kafka: broker.address for broker in cluster.brokers}
    leader_of = {p.id: gms_address[f"{metadata.brokers[p.leader].host}:{metadata.brokers[p.leader].port}"]
                 for p in metadata.topics[topic].partitions.values()}
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.brokers[0].kafka, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, queue, 10 + queue) for queue in range(QUEUES)],
                        asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, queue) for queue in range(QUEUES)], timeout=WAIT_S)
    finally:
        consumer.close()
    assert [(tp.offset, tp.error) for tp in committed] == [(10 + queue, None) for queue in range(QUEUES)]
    with Admin(nameserver=cluster.nameserver) as admin:
        held = admin.group_describe(group)["offsets"]
    holders: dict[int, set[str]] = {queue: set() for queue in range(QUEUES)}
    for broker, topics in held.items():  # the leaders, and followers that copied the offsets since
        for queue, offset in topics.get(topic, {}).items():
            if offset == 10 + queue:
                holders[queue].add(broker)
    # each at its queue's leader, where gms consumers of the group read them
    assert all(leader_of[queue] in holders[queue] for queue in range(QUEUES)), (holders, leader_of)


def test_every_broker_names_the_same_controller_and_a_groups_offsets_are_listed_and_deleted_everywhere(cluster):
    controllers = set()
    for broker in cluster.brokers:
        admin = AdminClient({"bootstrap.servers": broker.kafka})
        described = admin.describe_cluster(request_timeout=WAIT_S).result(WAIT_S)
        assert len(described.nodes) == BROKERS
        controllers |= {described.controller.id, admin.list_topics(timeout=WAIT_S).controller_id}
    assert len(controllers) == 1

    topic, _ = _settled_topic(cluster)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.brokers[0].kafka, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, queue, 1) for queue in range(QUEUES)], asynchronous=False)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": cluster.brokers[1].kafka})
    listed = [g.group_id for g in admin.list_consumer_groups().result(WAIT_S).valid]
    assert listed.count(group) == 1  # by its coordinator alone, its offsets being at the leaders
    assert admin.describe_consumer_groups([group])[group].result(WAIT_S).is_simple_consumer_group
    admin.delete_consumer_groups([group])[group].result(WAIT_S)
    with Admin(nameserver=cluster.nameserver) as gms_admin, pytest.raises(GroupNotFoundError):
        gms_admin.group_describe(group)


def _min_offsets(address: str, topic: str) -> dict[int, int]:
    """The first offset of each of ``topic``'s queues a broker holds (leading or following)."""
    host, port = address.rsplit(":", 1)
    connection = BlockingConnection.open(host, int(port))
    try:
        answer = connection.request(RequestCode.TOPIC_STATS, {"topic": topic}, timeout_ms=WAIT_S * 1000)
        queues = answer.fields["queues"]
    finally:
        connection.close()
    return {row["queue_id"]: row["min_offset"] for row in queues}


def test_delete_records_moves_the_first_offset_on_every_replica_and_offset_delete_reaches_every_leader(cluster):
    topic, _ = _settled_topic(cluster)
    producer = Producer({"bootstrap.servers": cluster.brokers[0].kafka, "acks": "all"})
    for queue in range(QUEUES):
        for i in range(5):
            producer.produce(topic, value=b"%d" % i, partition=queue)
    assert producer.flush(WAIT_S) == 0
    admin = AdminClient({"bootstrap.servers": cluster.brokers[1].kafka})
    deleted = admin.delete_records([TopicPartition(topic, queue, 3) for queue in range(QUEUES)])
    assert [future.result(WAIT_S).low_watermark for future in deleted.values()] == [3] * QUEUES
    expected = dict.fromkeys(range(QUEUES), 3)
    wait_until(lambda: all(_min_offsets(broker.address, topic) == expected for broker in cluster.brokers), WAIT_S)

    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.brokers[2].kafka, "group.id": group,
                         "enable.auto.commit": False})
    kp = KafkaAdminClient(bootstrap_servers=cluster.brokers[0].kafka)
    try:
        consumer.commit(offsets=[TopicPartition(topic, queue, 4) for queue in range(QUEUES)], asynchronous=False)
        dropped = kp.delete_group_offsets(group, [KpTopicPartition(topic, queue) for queue in range(QUEUES - 1)])
        assert set(dropped.values()) == {NoError}
        committed = consumer.committed([TopicPartition(topic, queue) for queue in range(QUEUES)], timeout=WAIT_S)
    finally:
        kp.close()
        consumer.close()
    assert [tp.offset for tp in committed] == [-1001] * (QUEUES - 1) + [4]  # each deleted at its leader
    elected = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(WAIT_S)
    assert [error.code() for error in elected.values()] == [KafkaError.ELECTION_NOT_NEEDED]


def test_a_commit_right_after_a_topics_creation_is_stored_not_refused_as_unknown(cluster):
    """The coordinator's view (or a leader's) may not hold a topic created a moment ago: the
    commit waits for it to arrive rather than answer UNKNOWN_TOPIC_OR_PARTITION."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.brokers[0].kafka, "group.id": group,
                         "enable.auto.commit": False})
    try:
        with Admin(nameserver=cluster.nameserver) as admin:
            for round_ in range(5):
                topic = f"t-{uuid.uuid4().hex[:8]}"
                admin.create_topic(topic, QUEUES, replicas=BROKERS)
                offsets = [TopicPartition(topic, queue, round_ + queue) for queue in range(QUEUES)]
                consumer.commit(offsets=offsets, asynchronous=False)
                committed = consumer.committed([TopicPartition(topic, queue) for queue in range(QUEUES)],
                                               timeout=WAIT_S)
                expected = [(round_ + queue, None) for queue in range(QUEUES)]
                assert [(tp.offset, tp.error) for tp in committed] == expected
    finally:
        consumer.close()
