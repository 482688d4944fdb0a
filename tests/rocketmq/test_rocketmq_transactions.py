"""Transactional messages of the official RocketMQ 5 Python client against a real gms broker, on
gms's own transactions: commit (seen by RocketMQ and gms consumers), rollback, and transactions
left open resolved by the producer's TransactionChecker through its Telemetry stream, or rolled
back when the checks run out. The broker's check timing is shortened to seconds."""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra: "
                                                  "pip install '.[rocketmq]'")

from rocketmq import TransactionResolution  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from rocketmq.v5.exception import ClientException  # noqa: E402

from gms.broker.rocketmq.mapping import from_rocketmq, producer_group  # noqa: E402
from gms.client import Admin, SimpleConsumer  # noqa: E402
from gms.record.layout import FLAG_HALF, TX_GROUP_PROPERTY, TX_ID_PROPERTY, TX_TIMEOUT_PROPERTY  # noqa: E402
from tests.processes import wait_until  # noqa: E402
from tests.rocketmq.conftest import rocketmq_broker  # noqa: E402

pytestmark = pytest.mark.timeout(60)

Code = definition_pb2.Code

TIMEOUT_MS, CHECK_INTERVAL_MS, CHECK_MAX = 1500, 1000, 2


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("rmq-tx")
    config = root / "broker.toml"
    config.write_text(f"[broker]\ntransaction_timeout_ms = {TIMEOUT_MS}\n"
                      f"transaction_check_interval_ms = {CHECK_INTERVAL_MS}\ntransaction_check_max = {CHECK_MAX}\n")
    yield from rocketmq_broker(root, "--config", str(config))


@pytest.fixture(scope="module")
def admin(broker):
    with Admin([broker.address]) as admin:
        yield admin


@pytest.fixture
def topic(admin) -> str:
    name = f"tx-{uuid.uuid4().hex[:8]}"
    admin.create_topic(name, 2)
    return name


def test_a_transaction_message_is_a_half_message():
    message = definition_pb2.Message(topic=definition_pb2.Resource(name="orders"), body=b"x")
    message.system_properties.message_id = "01AB"
    message.system_properties.message_type = definition_pb2.MessageType.TRANSACTION
    message.system_properties.orphaned_transaction_recovery_duration.FromMilliseconds(2500)
    half = from_rocketmq(message, 0, 4 << 20)
    assert half.flags == FLAG_HALF
    assert {k: half.properties[k] for k in (TX_ID_PROPERTY, TX_GROUP_PROPERTY, TX_TIMEOUT_PROPERTY)} == {
        TX_ID_PROPERTY: "01AB", TX_GROUP_PROPERTY: "%RMQ_PRODUCER%orders", TX_TIMEOUT_PROPERTY: "2500"}


class Checker(rocketmq.TransactionChecker):
    """Answers every check-back with ``resolution`` and keeps the messages it was asked about."""

    def __init__(self, resolution: int) -> None:
        self.resolution = resolution
        self.checked: list = []
        self.lock = threading.Lock()

    def check(self, message):
        with self.lock:
            self.checked.append(message)
        return self.resolution


def _config(broker):
    return rocketmq.ClientConfiguration(broker.rocketmq, rocketmq.Credentials())


def _producer(broker, topic, checker):
    producer = rocketmq.Producer(_config(broker), (topic,), checker)
    producer.startup()
    return producer


def _consumer(broker, topic, group):
    consumer = rocketmq.SimpleConsumer(_config(broker), group, {topic: rocketmq.FilterExpression("*")},
                                      await_duration=1)
    consumer.startup()
    consumer.receive(16, 10)  # gms starts a new group at the end of its queues: this places it
    return consumer


def _message(topic, body, tag="T", key=None):
    message = rocketmq.Message()
    message.topic, message.body, message.tag = topic, body, tag
    if key:
        message.keys = key
    return message


def _receive_until(consumer, body, timeout_s=15.0):
    """Everything received until a message with ``body`` came (acknowledged)."""
    received = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and body not in [m.body for m in received]:
        batch = consumer.receive(16, 10)
        for message in batch:
            consumer.ack(message)
        received += batch
    assert body in [m.body for m in received], f"{body!r} not received in {timeout_s} s"
    return received


def _open_transactions(admin, topic):
    return [row for row in admin.list_transactions() if row["queues"][0][0] == topic]


def _wait_resolved(admin, topic, timeout_s):
    deadline = time.monotonic() + timeout_s
    while _open_transactions(admin, topic):
        assert time.monotonic() < deadline, f"a transaction on {topic} still open after {timeout_s} s"
        time.sleep(0.1)


def test_commit_is_seen_by_rocketmq_and_gms_consumers(broker, admin, topic):
    consumer = _consumer(broker, topic, "g-tx-commit")
    gms_consumer = SimpleConsumer([broker.address], group="g-tx-commit-gms", subscription={topic: "*"},
                                  start_from="first", await_duration_ms=1000)
    checker = Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    producer = _producer(broker, topic, checker)
    try:
        transaction = producer.begin_transaction()
        receipt = producer.send(_message(topic, b"order-1", key="o1"), transaction)
        assert receipt.transaction_id
        [row] = _open_transactions(admin, topic)  # a half message of gms's transactions, the topic's group
        assert (row["tx_id"], row["group"], row["messages"]) == (receipt.transaction_id, producer_group(topic), 1)
        assert consumer.receive(16, 10) == []  # hidden until committed
        transaction.commit()
        [message] = _receive_until(consumer, b"order-1")
        assert message.message_id == receipt.message_id
        assert (message.tag, message.keys, message.properties) == ("T", {"o1"}, {})
        assert message.message_type == rocketmq.grpc_protocol.definition_pb2.MessageType.TRANSACTION
        got: list = []
        wait_until(lambda: bool(got.extend(gms_consumer.receive(16))) or bool(got), 10)
        assert [(m.body, m.keys) for m in got] == [(b"order-1", ("o1",))]
        gms_consumer.ack(got)
        transaction.commit()  # again: idempotent
        assert _open_transactions(admin, topic) == []
    finally:
        producer.shutdown()
        consumer.shutdown()
        gms_consumer.close()


def test_rollback_is_never_delivered(broker, admin, topic):
    consumer = _consumer(broker, topic, "g-tx-rollback")
    checker = Checker(TransactionResolution.COMMIT)  # would commit: must never be asked
    producer = _producer(broker, topic, checker)
    try:
        transaction = producer.begin_transaction()
        producer.send(_message(topic, b"cancelled"), transaction)
        transaction.rollback()
        with pytest.raises(ClientException, match="rolled back already"):
            transaction.commit()
        time.sleep((TIMEOUT_MS + CHECK_INTERVAL_MS) / 1000)  # past its check-back, had it stayed open
        producer.send(_message(topic, b"after"))
        assert [m.body for m in _receive_until(consumer, b"after")] == [b"after"]
        assert checker.checked == [] and _open_transactions(admin, topic) == []
    finally:
        producer.shutdown()
        consumer.shutdown()


@pytest.mark.parametrize("resolution", [TransactionResolution.COMMIT, TransactionResolution.ROLLBACK])
def test_open_transaction_resolved_by_the_checker(broker, admin, topic, resolution):
    consumer = _consumer(broker, topic, f"g-tx-check-{resolution}")
    checker = Checker(resolution)
    producer = _producer(broker, topic, checker)
    try:
        receipt = producer.send(_message(topic, b"orphan", key="k1"), producer.begin_transaction())  # never ended
        wait_until(lambda: bool(checker.checked), 15)
        [asked] = checker.checked[:1]
        assert (asked.message_id, asked.topic, asked.body, asked.keys) == (receipt.message_id, topic, b"orphan", {"k1"})
        _wait_resolved(admin, topic, 10)  # the checker's EndTransaction
        producer.send(_message(topic, b"after"))
        received = _receive_until(consumer, b"after")
        if resolution == TransactionResolution.COMMIT:
            assert sorted(m.body for m in received) == [b"after", b"orphan"]
            assert receipt.message_id in {m.message_id for m in received}
        else:
            assert [m.body for m in received] == [b"after"]
        assert {m.message_id for m in checker.checked} == {receipt.message_id}
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_unanswered_transaction_is_rolled_back_when_checks_run_out(broker, admin, topic):
    consumer = _consumer(broker, topic, "g-tx-unanswered")
    checker = Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)  # "unknown": asked again
    producer = _producer(broker, topic, checker)
    try:
        producer.send(_message(topic, b"undecided"), producer.begin_transaction())
        _wait_resolved(admin, topic, 15)
        wait_until(lambda: len(checker.checked) >= CHECK_MAX, 5)  # asked at every check (its thread may lag)
        assert len(checker.checked) == CHECK_MAX
        producer.send(_message(topic, b"after"))
        assert [m.body for m in _receive_until(consumer, b"after")] == [b"after"]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_telemetry_refuses_what_gms_never_asks_for(broker):
    """Thread stacks and verify results answer requests gms never makes: refused at once, and the
    stream still answers settings and ends when the client ends it."""
    commands = [service_pb2.TelemetryCommand(thread_stack_trace=service_pb2.ThreadStackTrace(nonce="n1")),
                service_pb2.TelemetryCommand(verify_message_result=service_pb2.VerifyMessageResult(nonce="n2")),
                service_pb2.TelemetryCommand(settings=definition_pb2.Settings(
                    client_type=definition_pb2.ClientType.PRODUCER,
                    publishing=definition_pb2.Publishing(topics=[definition_pb2.Resource(name="none")])))]
    with grpc.insecure_channel(broker.rocketmq) as channel:
        answers = list(service_pb2_grpc.MessagingServiceStub(channel).Telemetry(iter(commands), timeout=10))
    assert [a.status.code for a in answers] == [Code.NOT_IMPLEMENTED, Code.NOT_IMPLEMENTED, Code.OK]
    assert "thread_stack_trace" in answers[0].status.message
    assert answers[2].settings.publishing.topics[0].name == "none"
