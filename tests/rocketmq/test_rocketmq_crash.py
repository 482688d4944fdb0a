"""A gms broker SIGKILLed and restarted under a running official RocketMQ producer and
PushConsumer: every message the producer had acknowledged reaches the consumer's listener."""

from __future__ import annotations

import threading
import uuid

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra: "
                                                  "pip install '.[rocketmq]'")

from processes import BrokerProcess, free_port, wait_until  # noqa: E402

from gms.client import Admin  # noqa: E402

pytestmark = pytest.mark.timeout(180)
BEFORE_KILL = 300  # acknowledged sends before the kill, and again after the restart


class _Collecting(rocketmq.MessageListener):
    def __init__(self) -> None:
        self.bodies: set[bytes] = set()
        self.lock = threading.Lock()

    def consume(self, message):
        with self.lock:
            self.bodies.add(message.body)
        return rocketmq.ConsumeResult.SUCCESS


def test_broker_sigkilled_under_producer_and_push_consumer_loses_no_acknowledged_message(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    broker = BrokerProcess(tmp_path / "broker", ["--rocketmq-listen", endpoint]).start()
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:6]}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, 2)
    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), request_timeout=3)
    listener = _Collecting()
    consumer = rocketmq.PushConsumer(config, group, listener, {topic: rocketmq.FilterExpression("*")})
    producer = rocketmq.Producer(config, (topic,))
    acknowledged: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        number = 0
        while not stop.is_set():
            body = f"m{number}".encode()
            number += 1
            message = rocketmq.Message()
            message.topic, message.body, message.tag = topic, body, "T"
            try:
                producer.send(message)
            except Exception:  # noqa: BLE001 - not acknowledged: the broker is down
                continue
            acknowledged.append(body)

    sender = threading.Thread(target=produce, daemon=True)
    try:
        consumer.startup()
        producer.startup()
        sender.start()
        wait_until(lambda: len(acknowledged) >= BEFORE_KILL, 60)
        broker.kill()
        broker.restart()
        resumed_at = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= resumed_at + BEFORE_KILL, 90)
        stop.set()
        sender.join(30)
        wait_until(lambda: listener.bodies >= set(acknowledged), 90)
    finally:
        stop.set()
        producer.shutdown()
        consumer.shutdown()
        broker.stop()
