"""Dead letters while the dead-letter topic's leader dies: a cluster of three brokers serving the
RocketMQ API, a group allowing one delivery attempt, messages on a queue of one broker handed out
and let go, then moved to the group's dead-letter topic (led by another broker, replicated on all
three) by the receives that find them exhausted, and that leader SIGKILLed while the copies are
being stored. Once the dead-letter queue has a new leader every copy is there exactly once, and
every original is acknowledged (none is handed out or moved again).

The brokers keep their default lease (10 s): the new leader takes over after the dead-letter
service's retries of the copy in flight ran out, and a copy stored and replicated just before the
SIGKILL, its answer lost, was stored a second time by the move retried later under a new producer
id (before the fix: a copy or two of the 800 twice)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import grpc
import pytest

pytest.importorskip("rocketmq", reason="the RocketMQ API is the `rocketmq` extra: pip install '.[rocketmq]'")

from ha_helpers import BROKER_TOML, LEASE_TTL_S, HaCluster, request, wait_for
from processes import free_port
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
from test_ha_failover import pull_all

from gms.client import Admin, Producer
from gms.naming import SYSTEM_TOPIC_FIELD, dlq_topic
from gms.protocol.codes import RequestCode

pytestmark = pytest.mark.timeout(240)
MESSAGES = 200
GROUPS = 4  # dead-letter topics led by the killed broker
INVISIBLE_S = 1  # the first delivery's: then the messages are exhausted (one attempt allowed)
DEFAULT_LEASE_TTL_S = 10  # the broker's (BrokerConfig.lease_ttl_s)


@pytest.fixture
def cluster(tmp_path):
    running = HaCluster(tmp_path).start(nameservers=1, brokers=0)
    config = tmp_path / "default-lease.toml"  # read after HaCluster's own --config: this lease wins
    config.write_text(BROKER_TOML.replace(f"lease_ttl_s = {LEASE_TTL_S}", f"lease_ttl_s = {DEFAULT_LEASE_TTL_S}"))
    try:
        for _ in range(3):
            endpoint = f"127.0.0.1:{free_port()}"
            running.add_broker("--rocketmq-listen", endpoint, "--config", str(config)).rocketmq = endpoint
        running.wait_registered(3)
        yield running
    finally:
        running.stop()


def _receive(endpoint: str, group: str, topic: str) -> list[definition_pb2.Message]:
    """One ReceiveMessage (it moves the exhausted messages it finds to the dead letters first)."""
    request_ = service_pb2.ReceiveMessageRequest(
        group=definition_pb2.Resource(name=group),
        message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=topic), id=-1),
        batch_size=1024)
    request_.filter_expression.type = definition_pb2.FilterType.TAG
    request_.filter_expression.expression = "*"
    request_.invisible_duration.seconds = INVISIBLE_S
    request_.long_polling_timeout.seconds = 1
    with grpc.insecure_channel(endpoint) as channel:
        answers = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(request_, timeout=60))
    return [answer.message for answer in answers if answer.HasField("message")]


def _dead_letters(cluster: HaCluster, dlq: str) -> Counter[bytes]:
    leader = cluster.broker_by_id(cluster.topic(dlq).queues[0].leader)
    return Counter(body for _, body in pull_all(leader.address, dlq, 0))


def _dead_letter_topics(cluster: HaCluster, count: int) -> tuple[str, list[str]]:
    """The groups (one delivery attempt each) of ``count`` dead-letter topics made as the brokers make
    them, whose one queue is led by the same broker: that broker's id and the groups."""
    groups = [f"g-{uuid.uuid4().hex[:6]}" for _ in range(3 * count)]
    with Admin(nameserver=cluster.nameserver) as admin:
        for group in groups:
            admin.set_group_settings(group, max_reconsume_times=0)
            request(cluster.nameservers[0].address, RequestCode.CREATE_TOPIC, {
                "topic": dlq_topic(group), "queues": 1, "replicas": 3, "settings": {"min_insync_replicas": 2},
                SYSTEM_TOPIC_FIELD: True})
    for group in groups:
        wait_for(lambda g=group: len(cluster.topic(dlq_topic(g)).queues[0].isr) == 3, 20)
    leaders = {group: cluster.topic(dlq_topic(group)).queues[0].leader for group in groups}
    leader, _ = Counter(leaders.values()).most_common(1)[0]
    return leader, [group for group in groups if leaders[group] == leader][:count]


def test_dead_letters_survive_their_leaders_sigkill_once_each(cluster):
    """Several groups move their messages at once (one copy in flight per dead-letter topic): at the
    SIGKILL some copies are on their way, some stored and replicated with their answer not back."""
    dlq_leader, groups = _dead_letter_topics(cluster, GROUPS)
    topic = f"t-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, 3, replicas=1, min_isr=1)
    queue_id, source = next((q.queue_id, q.leader) for q in cluster.topic(topic).queues if q.leader != dlq_leader)
    endpoint = cluster.broker_by_id(source).rocketmq
    bodies = [f"m{i}".encode() for i in range(MESSAGES)]
    with Producer(nameserver=cluster.nameserver) as producer:
        for body in bodies:
            producer.send(topic, body, queue=queue_id)
    for group in groups:
        handed: list[definition_pb2.Message] = []
        wait_for(lambda g=group, h=handed: bool(h.extend(_receive(endpoint, g, topic))) or len(h) >= MESSAGES, 30)
        assert sorted(m.body for m in handed) == sorted(bodies)  # attempt 1 of 1, never acknowledged

    receiving = threading.Event()
    redelivered: list[bytes] = []

    def receive_until_stopped(group: str) -> None:  # the receives that move the exhausted messages
        while not receiving.is_set():
            try:
                redelivered.extend(m.body for m in _receive(endpoint, group, topic))
            except grpc.RpcError:  # a receive that failed to move its messages: they stay in flight
                time.sleep(0.2)

    movers = [threading.Thread(target=receive_until_stopped, args=(group,), daemon=True) for group in groups]
    time.sleep(INVISIBLE_S)
    for mover in movers:
        mover.start()
    killed = cluster.broker_by_id(dlq_leader)

    def stored_on_killed() -> int:
        return sum(request(killed.address, RequestCode.QUERY_MAX_OFFSET, {"topic": dlq_topic(g), "queue_id": 0})
                   ["offset"] for g in groups)

    try:  # SIGKILL once part of the copies are stored: the next ones are on their way to it
        wait_for(lambda: stored_on_killed() >= len(groups) * MESSAGES // 5, 60, interval_s=0.005)
        killed.kill()
        for group in groups:
            wait_for(lambda g=group: cluster.topic(dlq_topic(g)).queues[0].leader not in (None, dlq_leader),
                     6 * DEFAULT_LEASE_TTL_S)
            wait_for(lambda g=group: sum(_dead_letters(cluster, dlq_topic(g)).values()) >= MESSAGES, 120)
        time.sleep(3 * INVISIBLE_S)  # an original not acknowledged would be moved (or handed out) again by now
    finally:
        receiving.set()
        for mover in movers:
            mover.join(90)
    for group in groups:
        stored = _dead_letters(cluster, dlq_topic(group))
        assert sorted(stored) == sorted(bodies), group  # none lost
        assert [body for body, count in stored.items() if count > 1] == [], group  # none stored twice
    assert redelivered == []  # one attempt allowed: exhausted messages are moved, never handed out again
