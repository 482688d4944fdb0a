"""RecallMessage with the official RocketMQ client: a DELAY message's send answers a recall handle,
recalling it before its time cancels it (gms's scheduled-message cancel), so no consumer ever sees
it while one sent alongside arrives; recalling it again, or a mangled handle, fails clearly."""

from __future__ import annotations

import time
import uuid

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

from rocketmq.v5.exception import BadRequestException, NotFoundException  # noqa: E402

from gms.client import Admin  # noqa: E402

pytestmark = pytest.mark.timeout(60)
DELAY_MS = 3000


def test_recalled_delay_message_is_never_delivered(broker):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, 2)
    config = rocketmq.ClientConfiguration(broker.rocketmq, rocketmq.Credentials())
    consumer = rocketmq.SimpleConsumer(config, "g-recall", {topic: rocketmq.FilterExpression("*")}, await_duration=1)
    producer = rocketmq.Producer(config, (topic,))
    consumer.startup()
    producer.startup()
    try:
        consumer.receive(16, 10)  # places the new group at the end of the queues
        receipts = {}
        for body in (b"recalled", b"kept"):
            message = rocketmq.Message()
            message.topic, message.body = topic, body
            message.delivery_timestamp = int(time.time() * 1000) + DELAY_MS
            receipts[body] = producer.send(message)
        assert all(r.recall_handle for r in receipts.values())
        recalled = receipts[b"recalled"]
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id

        received = []
        deadline = time.monotonic() + DELAY_MS / 1000 + 4
        while time.monotonic() < deadline:
            received += consumer.receive(16, 10)
        assert [m.body for m in received] == [b"kept"]
        consumer.ack(received[0])

        with pytest.raises(NotFoundException, match="delivered or cancelled already"):
            producer.recall_message(topic, recalled.recall_handle)
        with pytest.raises(NotFoundException, match="delivered or cancelled already"):  # delivered: too late
            producer.recall_message(topic, receipts[b"kept"].recall_handle)
        with pytest.raises(BadRequestException, match="not one of gms's"):
            producer.recall_message(topic, "bm90IGEgaGFuZGxl")
    finally:
        producer.shutdown()
        consumer.shutdown()
