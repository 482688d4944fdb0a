"""The official RocketMQ 5 Python client (rocketmq-python-client) against a real gms broker's
RocketMQ gRPC API: send, receive with a tag filter, acknowledge, redelivery after the invisible
duration, and messages crossing between the RocketMQ client and gms's own SDK."""

from __future__ import annotations

import time
import uuid

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra: "
                                                  "pip install '.[rocketmq]'")

from gms.client import Admin, Producer, SimpleConsumer  # noqa: E402
from tests.processes import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def topic(broker) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with Admin([broker.address]) as admin:
        admin.create_topic(name, 4)
    return name


def _config(broker):
    return rocketmq.ClientConfiguration(broker.rocketmq, rocketmq.Credentials())


def _consumer(broker, topic, group, expression="*"):
    consumer = rocketmq.SimpleConsumer(_config(broker), group, {topic: rocketmq.FilterExpression(expression)},
                                      await_duration=1)
    consumer.startup()
    consumer.receive(16, 10)  # gms starts a new group at the end of its queues: this places it
    return consumer


def _receive(consumer, count, invisible_s=10, timeout_s=10.0):
    received = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count and time.monotonic() < deadline:
        received += consumer.receive(16, invisible_s)
    return received


def _producer(broker, topic):
    producer = rocketmq.Producer(_config(broker), (topic,))
    producer.startup()
    return producer


def _message(topic, body, tag, keys=(), properties=None):
    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    message.tag = tag
    if keys:
        for key in keys:  # the setter adds one key per assignment
            message.keys = key
    for name, value in (properties or {}).items():
        message.add_property(name, value)
    return message


def test_send_receive_ack_and_redelivery(broker, topic):
    consumer = _consumer(broker, topic, "g-rmq", "TagA")
    producer = _producer(broker, topic)
    try:
        receipts = [producer.send(_message(topic, f"body-{i}".encode(), "TagA", (f"k{i}", "order"),
                                           {"n": str(i), "lang": "py"})) for i in range(3)]
        producer.send(_message(topic, b"other", "TagB"))
        received = _receive(consumer, 3, invisible_s=2)
        assert sorted(m.body for m in received) == [b"body-0", b"body-1", b"body-2"]
        by_id = {m.message_id: m for m in received}
        assert set(by_id) == {r.message_id for r in receipts}  # the client's own ids come back
        for message in received:
            i = int(message.properties["n"])
            assert message.topic == topic and message.tag == "TagA"
            assert message.keys == {f"k{i}", "order"}
            assert message.properties == {"n": str(i), "lang": "py"}
            assert message.delivery_attempt == 1 and not message.corrupted
            assert abs(message.born_timestamp - time.time() * 1000) < 60_000
        for message in received[:2]:
            consumer.ack(message)
        unacked = received[2]
        again = _receive(consumer, 1, timeout_s=8)  # visible again after its 2 s
        assert [m.message_id for m in again] == [unacked.message_id]
        assert again[0].delivery_attempt == 2 and again[0].body == unacked.body
        consumer.ack(again[0])
        assert consumer.receive(16, 2) == []  # TagB filtered out, everything else acknowledged
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_change_invisible_duration_and_stale_ack(broker, topic):
    consumer = _consumer(broker, topic, "g-inv")
    producer = _producer(broker, topic)
    try:
        producer.send(_message(topic, b"slow", "T"))
        [message] = _receive(consumer, 1, invisible_s=1)
        consumer.change_invisible_duration(message, 30)
        time.sleep(1.5)
        assert consumer.receive(16, 1) == []  # still invisible: the new duration holds
        consumer.change_invisible_duration(message, 1)
        [again] = _receive(consumer, 1, invisible_s=30)
        assert again.message_id == message.message_id and again.delivery_attempt == 2
        with pytest.raises(rocketmq.v5.exception.BadRequestException):
            consumer.ack(message)  # the first delivery's handle: handed out again since
        consumer.ack(again)
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_gms_sdk_and_rocketmq_client_interoperate(broker, topic):
    consumer = _consumer(broker, topic, "g-mixed")
    gms_consumer = SimpleConsumer([broker.address], group="g-gms", subscription={topic: "*"}, start_from="first",
                                  await_duration_ms=1000)
    producer = _producer(broker, topic)
    try:
        with Producer([broker.address]) as gms_producer:
            sent = gms_producer.send(topic, b"from-gms", tag="X", keys=("gk",), properties={"p": "1"})
        receipt = producer.send(_message(topic, b"from-rmq", "Y", ("rk",), {"q": "2"}))
        received = {m.body: m for m in _receive(consumer, 2)}
        assert set(received) == {b"from-gms", b"from-rmq"}
        from_gms = received[b"from-gms"]
        assert (from_gms.tag, from_gms.keys, from_gms.properties) == ("X", {"gk"}, {"p": "1"})
        assert from_gms.message_id == sent.msg_id  # gms's own id where no RocketMQ client gave one
        assert received[b"from-rmq"].message_id == receipt.message_id
        for message in received.values():
            consumer.ack(message)
        got = []
        wait_until(lambda: bool(got.extend(gms_consumer.receive(16)) or len(got) >= 2), 10)
        by_body = {m.body: m for m in got}
        from_rmq = by_body[b"from-rmq"]
        assert (from_rmq.tag, from_rmq.keys, from_rmq.properties.get("q")) == ("Y", ("rk",), "2")
        gms_consumer.ack(got)
    finally:
        producer.shutdown()
        consumer.shutdown()
        gms_consumer.close()


def test_sql_filter_and_a_delayed_message_at_its_time(broker, topic):
    consumer = rocketmq.SimpleConsumer(
        _config(broker), "g-sql", {topic: rocketmq.FilterExpression("region = 'eu' AND amount > 10",
                                                                    rocketmq.grpc_protocol.FilterType.SQL)},
        await_duration=1)
    consumer.startup()
    producer = _producer(broker, topic)
    try:
        for body, region, amount in ((b"eu-20", "eu", "20"), (b"eu-5", "eu", "5"), (b"us-50", "us", "50")):
            producer.send(_message(topic, body, "T", properties={"region": region, "amount": amount}))
        delayed = _message(topic, b"eu-30-later", "T", properties={"region": "eu", "amount": "30"})
        due_ms = int(time.time() * 1000) + 2500
        delayed.delivery_timestamp = due_ms
        producer.send(delayed)
        [first] = _receive(consumer, 1, timeout_s=10)
        assert first.body == b"eu-20" and first.properties == {"region": "eu", "amount": "20"}
        consumer.ack(first)
        [later] = _receive(consumer, 1, timeout_s=10)
        assert time.time() * 1000 >= due_ms - 50  # not before its time (store clock vs ours)
        assert later.body == b"eu-30-later" and later.delivery_timestamp == due_ms
        consumer.ack(later)
        assert consumer.receive(16, 2) == []  # eu-5 and us-50 never selected
    finally:
        producer.shutdown()
        consumer.shutdown()
