"""`gms standalone` serves the RocketMQ 5 gRPC API (free ports here, never the default 8081): the
official client sends and receives through the port its banner prints; the group settings of
`gms group config` hold for it (max delivery attempts, then the dead-letter topic; FIFO)."""

from __future__ import annotations

import time
import uuid

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

import grpc  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

from gms.client import Admin, SimpleConsumer  # noqa: E402
from gms.client.retries import DLQ_REASON_PROPERTY  # noqa: E402
from gms.naming import EXHAUSTED_REASON, dlq_topic  # noqa: E402
from tests.processes import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def topic(standalone) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=standalone["nameserver"]) as admin:
        admin.create_topic(name, 2)
    return name


def _clients(standalone, topic, group):
    config = rocketmq.ClientConfiguration(standalone["rocketmq"], rocketmq.Credentials())
    consumer = rocketmq.SimpleConsumer(config, group, {topic: rocketmq.FilterExpression("*")}, await_duration=1)
    consumer.startup()
    consumer.receive(16, 10)  # places the new group at the end of the queues
    producer = rocketmq.Producer(config, (topic,))
    producer.startup()
    return consumer, producer


def _send(producer, topic, body, message_group=None):
    message = rocketmq.Message()
    message.topic, message.body, message.tag = topic, body, "T"
    if message_group:
        message.message_group = message_group
    return producer.send(message)


def _receive(consumer, count, invisible_s, timeout_s=10.0):
    received: list = []
    wait_until(lambda: bool(received.extend(consumer.receive(16, invisible_s)) or len(received) >= count), timeout_s)
    return received


def _dead_letters(standalone, group, count):
    reader = SimpleConsumer(nameserver=standalone["nameserver"], group=f"{group}-dlq-reader",
                            subscription={dlq_topic(group): "*"}, start_from="first", await_duration_ms=500)
    try:
        got: list = []
        wait_until(lambda: bool(got.extend(reader.receive(16)) or len(got) >= count), 15)
        reader.ack(got)
        return got
    finally:
        reader.close()


def test_standalone_serves_the_rocketmq_api(standalone, topic):
    assert standalone["rocketmq"].startswith("127.0.0.1:") and not standalone["rocketmq"].endswith(":8081")
    consumer, producer = _clients(standalone, topic, "g-standalone")
    try:
        sent = _send(producer, topic, b"through standalone")
        received = _receive(consumer, 1, 10)
        assert [(m.message_id, m.body) for m in received] == [(sent.message_id, b"through standalone")]
        consumer.ack(received[0])
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_exhausted_message_goes_to_the_groups_dead_letters(standalone, topic):
    with Admin(nameserver=standalone["nameserver"]) as admin:
        admin.set_group_settings("g-dlq", max_reconsume_times=1)  # 2 delivery attempts
    consumer, producer = _clients(standalone, topic, "g-dlq")
    try:
        sent = _send(producer, topic, b"doomed")
        attempts = [m.delivery_attempt for m in _receive(consumer, 1, 1)]
        attempts += [m.delivery_attempt for m in _receive(consumer, 1, 1)]  # never acknowledged
        assert attempts == [1, 2]
        time.sleep(1.2)
        assert consumer.receive(16, 1) == []  # the third pop moves it to the dead letters
        [dead] = _dead_letters(standalone, "g-dlq", 1)
        assert dead.body == b"doomed" and dead.properties[DLQ_REASON_PROPERTY] == EXHAUSTED_REASON
        assert dead.properties["__RMQ_MSG_ID"] == sent.message_id  # a RocketMQ client sees the same id there
        assert consumer.receive(16, 1) == []  # gone for the group
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_forward_message_to_dead_letter_queue(standalone, topic):
    consumer, producer = _clients(standalone, topic, "g-fwd")
    try:
        _send(producer, topic, b"given up")
        [message] = _receive(consumer, 1, 1)
        with grpc.insecure_channel(standalone["rocketmq"]) as channel:
            answer = service_pb2_grpc.MessagingServiceStub(channel).ForwardMessageToDeadLetterQueue(
                service_pb2.ForwardMessageToDeadLetterQueueRequest(
                    group=definition_pb2.Resource(name="g-fwd"), topic=definition_pb2.Resource(name=topic),
                    receipt_handle=message.receipt_handle, message_id=message.message_id,
                    delivery_attempt=1, max_delivery_attempts=17), timeout=10)
        assert answer.status.code == definition_pb2.Code.OK, answer.status.message
        [dead] = _dead_letters(standalone, "g-fwd", 1)
        assert dead.body == b"given up"
        time.sleep(1.2)
        assert consumer.receive(16, 1) == []  # acknowledged by the forward: never handed out again
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_fifo_group_gets_a_message_group_in_order(standalone, topic):
    with Admin(nameserver=standalone["nameserver"]) as admin:
        admin.set_group_settings("g-fifo", fifo=True)
    consumer, producer = _clients(standalone, topic, "g-fifo")
    try:
        for i in range(3):
            _send(producer, topic, f"m{i}".encode(), message_group="order-1")
        first = _receive(consumer, 3, 2)
        assert [m.body for m in first] == [b"m0", b"m1", b"m2"]
        _send(producer, topic, b"m3", message_group="order-1")
        assert consumer.receive(16, 2) == []  # the queue waits for the batch in flight
        for message in first:
            consumer.ack(message)
        assert [m.body for m in _receive(consumer, 1, 2)] == [b"m3"]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_transactional_message_is_hidden_until_committed(standalone, topic):
    """Through the raw API, in a cluster (the standalone's broker is registered): a TRANSACTION
    message is a half message of gms's transactions, seen by no consumer until EndTransaction."""
    tx_id = f"01{uuid.uuid4().hex}"
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"half")
    message.system_properties.message_id = tx_id
    message.system_properties.message_type = definition_pb2.MessageType.TRANSACTION
    reader = SimpleConsumer(nameserver=standalone["nameserver"], group=f"g-{tx_id}", subscription={topic: "*"},
                            start_from="first", await_duration_ms=1000)
    try:
        with grpc.insecure_channel(standalone["rocketmq"]) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            answer = stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), timeout=10)
            assert answer.status.code == definition_pb2.Code.OK
            assert answer.entries[0].transaction_id == tx_id
            assert reader.receive(16) == []
            ended = stub.EndTransaction(service_pb2.EndTransactionRequest(
                topic=message.topic, message_id=tx_id, transaction_id=tx_id,
                resolution=definition_pb2.TransactionResolution.COMMIT,
                source=definition_pb2.TransactionSource.SOURCE_CLIENT), timeout=10)
            assert ended.status.code == definition_pb2.Code.OK
        got: list = []
        wait_until(lambda: bool(got.extend(reader.receive(16))) or bool(got), 10)
        assert [m.body for m in got] == [b"half"]
        reader.ack(got)
    finally:
        reader.close()


@pytest.fixture
def burst_then_topic(standalone):
    """A topic created right after a burst of 500 others: the broker applies new topics on its loop
    a moment after their creation returns, here later still as it is creating the burst's files."""
    batch = uuid.uuid4().hex[:6]
    burst = [f"burst-{batch}-{i}" for i in range(500)]
    topic = f"t-{batch}"
    with Admin(nameserver=standalone["nameserver"]) as admin:
        def create() -> str:
            admin.create_topics([(name, 8) for name in burst])
            admin.create_topic(topic, 2)
            return topic
        try:
            yield create
        finally:
            admin.delete_topics([*burst, topic])


def test_send_right_after_the_topic_is_created(standalone, burst_then_topic):
    """The send waits for the broker to take the topic's queues (not TOPIC_NOT_FOUND, which a
    client's quick retries would all get)."""
    config = rocketmq.ClientConfiguration(standalone["rocketmq"], rocketmq.Credentials())
    producer = rocketmq.Producer(config)  # started before the topic exists: nothing delays the send
    producer.startup()
    try:
        topic = burst_then_topic()
        sent = _send(producer, topic, b"at once")
    finally:
        producer.shutdown()
    consumer, producer = _clients(standalone, topic, "g-sent-at-once")
    try:
        # a new group starts from the queues' beginning (docs/rocketmq-compat.md): it reads the send
        assert [(m.message_id, m.body) for m in _receive(consumer, 1, 10)] == [(sent.message_id, b"at once")]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_receive_right_after_the_topic_is_created(standalone, burst_then_topic):
    """A receive as well: no message yet, and no error."""
    topic = burst_then_topic()
    config = rocketmq.ClientConfiguration(standalone["rocketmq"], rocketmq.Credentials())
    consumer = rocketmq.SimpleConsumer(config, "g-at-once", {topic: rocketmq.FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        assert consumer.receive(16, 10) == []
    finally:
        consumer.shutdown()


def test_a_topic_that_does_not_exist_is_answered_at_once(standalone):
    """Only a topic etcd holds is waited for: an unknown one is TOPIC_NOT_FOUND, not a wait to the deadline."""
    topic = f"never-{uuid.uuid4().hex[:8]}"
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"x")
    message.system_properties.message_id = uuid.uuid4().hex
    with grpc.insecure_channel(standalone["rocketmq"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        started = time.monotonic()
        route = stub.QueryRoute(service_pb2.QueryRouteRequest(topic=message.topic), timeout=30)
        sent = stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), timeout=30)
        elapsed = time.monotonic() - started
    assert (route.status.code, sent.status.code) == (definition_pb2.Code.TOPIC_NOT_FOUND,) * 2
    assert elapsed < 10  # a wait would last to the send timeout (5 s) per call
