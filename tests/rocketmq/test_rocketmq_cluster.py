"""The official RocketMQ 5 client against a gms cluster of two brokers (embedded etcd, a nameserver
process, broker processes serving the RocketMQ API): one endpoint's route names every queue at
its leader's endpoint, a producer reaches both brokers and consumers receive from both; a
PushConsumer consumes, retries a failing message with the group's retry delays and leaves it in
the dead letters after the group's max delivery attempts."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import grpc
import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra: "
                                                  "pip install '.[rocketmq]'")

from gms_cluster import LocalCluster  # noqa: E402
from processes import free_port, wait_until  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

from gms.client import Admin, SimpleConsumer  # noqa: E402
from gms.errors import TopicNotFoundError  # noqa: E402

pytestmark = pytest.mark.timeout(120)
QUEUES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("rmq-cluster")).start(nameservers=1, brokers=0)
    try:
        for _ in range(2):
            endpoint = f"127.0.0.1:{free_port()}"
            running.add_broker("--rocketmq-listen", endpoint).rocketmq = endpoint
        running.wait_registered(2)
        yield running
    finally:
        running.stop()


@pytest.fixture
def topic(cluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(name, QUEUES)
    return name


def _config(endpoint: str):
    return rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials())


def _message(topic: str, body: bytes):
    message = rocketmq.Message()
    message.topic, message.body, message.tag = topic, body, "T"
    return message


def _send_all(endpoint: str, topic: str, bodies: list[bytes]) -> None:
    producer = rocketmq.Producer(_config(endpoint), (topic,))
    producer.startup()
    try:
        for body in bodies:
            producer.send(_message(topic, body))
    finally:
        producer.shutdown()


def test_one_endpoint_routes_to_every_leader_and_consumers_read_both_brokers(cluster, topic):
    first, second = cluster.brokers
    with grpc.insecure_channel(first.rocketmq) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        route = stub.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10)
        assignment = stub.QueryAssignment(service_pb2.QueryAssignmentRequest(
            topic=definition_pb2.Resource(name=topic), group=definition_pb2.Resource(name="g")), timeout=10)
    assert route.status.code == definition_pb2.Code.OK
    endpoints = {q.id: f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}"
                 for q in route.message_queues}
    assert sorted(endpoints) == list(range(QUEUES))
    assert set(endpoints.values()) == {first.rocketmq, second.rocketmq}  # the topic spreads over both
    assert len(assignment.assignments) == 2  # one per broker: a receive there pops all it leads

    consumer = rocketmq.SimpleConsumer(_config(second.rocketmq), "g-cluster", {topic: rocketmq.FilterExpression("*")},
                                      await_duration=1)
    consumer.startup()
    try:
        bodies = [f"m{i}".encode() for i in range(40)]
        _send_all(first.rocketmq, topic, bodies)  # the client sends each queue's messages to its leader
        with Admin(nameserver=cluster.nameserver) as admin:
            per_broker = Counter()
            for stats in admin.topic_stats(topic):
                per_broker[stats["broker"]] += stats["max_offset"]
        assert sum(per_broker.values()) == 40 and len(per_broker) == 2 and min(per_broker.values()) > 0
        received = []
        deadline = time.monotonic() + 30
        while len(received) < 40 and time.monotonic() < deadline:
            for message in consumer.receive(32, 30):
                received.append(message.body)
                consumer.ack(message)
        assert sorted(received) == sorted(bodies)
    finally:
        consumer.shutdown()


class _Listener(rocketmq.MessageListener):
    """Succeeds, except for bodies starting with b"bad" (each attempt counted)."""

    def __init__(self) -> None:
        self.consumed: list[bytes] = []
        self.attempts: Counter[bytes] = Counter()
        self.lock = threading.Lock()

    def consume(self, message):
        with self.lock:
            self.attempts[message.body] += 1
            if message.body.startswith(b"bad"):
                return rocketmq.ConsumeResult.FAILURE
            self.consumed.append(message.body)
        return rocketmq.ConsumeResult.SUCCESS


def test_push_consumer_consumes_retries_and_dead_letters(cluster, topic):
    group = f"g-push-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.set_group_settings(group, max_reconsume_times=1, retry_delays_ms=[1000])  # 2 delivery attempts
    listener = _Listener()
    consumer = rocketmq.PushConsumer(_config(cluster.brokers[0].rocketmq), group, listener,
                                    {topic: rocketmq.FilterExpression("*")})
    consumer.startup()
    try:
        bodies = [f"ok{i}".encode() for i in range(30)]
        _send_all(cluster.brokers[1].rocketmq, topic, [*bodies, b"bad-1"])
        wait_until(lambda: len(listener.consumed) >= len(bodies), 30)
        assert sorted(listener.consumed) == sorted(bodies)
        wait_until(lambda: _stored(cluster, f"%DLQ%{group}") == 1, 40)  # at the receive after the last attempt
        dead = SimpleConsumer(nameserver=cluster.nameserver, group=f"{group}-dlq",
                              subscription={f"%DLQ%{group}": "*"}, start_from="first", await_duration_ms=1000)
        try:
            found = []
            wait_until(lambda: bool(found.extend(dead.receive(16))) or bool(found), 30)
            assert [m.body for m in found] == [b"bad-1"]
        finally:
            dead.close()
        assert listener.attempts[b"bad-1"] == 2  # the group's max delivery attempts
        assert all(listener.attempts[body] == 1 for body in bodies)
    finally:
        consumer.shutdown()



def test_dead_letters_from_both_brokers_are_stored_once_at_the_dead_letter_topics_leader(cluster, topic):
    """The dead-letter topic has one queue, led by one of the two brokers: the other broker's
    endpoint stores its dead letters there through its own connection, each exactly once."""
    group = f"g-dlq-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.set_group_settings(group, max_reconsume_times=0)  # one delivery attempt
    listener = _Listener()
    consumer = rocketmq.PushConsumer(_config(cluster.brokers[0].rocketmq), group, listener,
                                    {topic: rocketmq.FilterExpression("*")})
    consumer.startup()
    try:
        bad = [f"bad-{i}".encode() for i in range(4 * QUEUES)]
        _send_all(cluster.brokers[1].rocketmq, topic, bad)  # round robin: every queue, on both brokers
        wait_until(lambda: _stored(cluster, f"%DLQ%{group}") >= len(bad), 40)
        dead = SimpleConsumer(nameserver=cluster.nameserver, group=f"{group}-dlq",
                              subscription={f"%DLQ%{group}": "*"}, start_from="first", await_duration_ms=1000)
        try:
            found: list = []
            wait_until(lambda: bool(found.extend(dead.receive(64))) or len(found) >= len(bad), 30)
            assert sorted(m.body for m in found) == sorted(bad)
            assert {m.properties["__RETRY_TOPIC"] for m in found} == {topic}
            assert all(m.properties["__DLQ_REASON"] for m in found)
        finally:
            dead.close()
        assert _stored(cluster, f"%DLQ%{group}") == len(bad)  # none twice
        assert all(listener.attempts[body] == 1 for body in bad)
    finally:
        consumer.shutdown()


def _stored(cluster, topic: str) -> int:
    """Messages ``topic`` holds (0 while it does not exist)."""
    with Admin(nameserver=cluster.nameserver) as admin:
        try:
            return sum(stats["max_offset"] - stats["min_offset"] for stats in admin.topic_stats(topic))
        except TopicNotFoundError:
            return 0


def test_sends_right_after_the_topic_is_created_reach_every_leader(cluster):
    """Created right after a burst of 400 other topics (the brokers' views and assignments take it
    a moment after the creation returns), a replicated topic takes a send to each of its queues at
    once, through one endpoint, from a producer running before the topic existed."""
    batch = uuid.uuid4().hex[:6]
    burst, topic = [f"burst-{batch}-{i}" for i in range(400)], f"t-{batch}"
    producer = rocketmq.Producer(_config(cluster.brokers[0].rocketmq))
    producer.startup()
    with Admin(nameserver=cluster.nameserver) as admin:
        try:
            admin.create_topics([(name, 8) for name in burst])
            admin.create_topic(topic, QUEUES, replicas=2)
            receipts = [producer.send(_message(topic, b"at once %d" % i)) for i in range(QUEUES)]
            assert _stored(cluster, topic) == QUEUES
        finally:
            producer.shutdown()
            admin.delete_topics([*burst, topic])
    # round robin over the queues: both brokers lead some
    assert sorted(r.message_queue.message_queue0().id for r in receipts) == list(range(QUEUES))
