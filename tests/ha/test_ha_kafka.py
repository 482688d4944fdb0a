"""Kafka clients through failures on a replicated cluster (three brokers serving Kafka, queues on
three replicas, min ISR 2): confluent-kafka's idempotent producer keeps producing while every
queue's leader is SIGKILLed in turn and restarted, and every message it produced is stored exactly
once -- its retries to the new leaders are recognised by their sequences."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaError, Producer
from ha_helpers import HaCluster
from processes import free_port
from test_ha_failover import kill_each_leader_in_turn, leader_of, pull_all

QUEUES = 3
WAIT_S = 120


@pytest.fixture
def kafka_cluster(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=1, brokers=0)
    try:
        for _ in range(3):
            endpoint = f"127.0.0.1:{free_port()}"
            cluster.add_broker("--kafka-listen", endpoint).kafka = endpoint
        cluster.wait_registered(3)
        yield cluster
    finally:
        cluster.stop()


class KafkaSender(threading.Thread):
    """An idempotent confluent-kafka producer producing numbered messages round the partitions
    until stopped; what was delivered, and any error a delivery or the producer reported."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                                  "message.timeout.ms": WAIT_S * 1000, "error_cb": self._failed})
        self.topic = topic
        self.produced = 0
        self.delivered: list[bytes] = []
        self.errors: list[KafkaError] = []
        self.stopping = threading.Event()

    def _failed(self, err: KafkaError) -> None:
        if err.fatal():
            self.errors.append(err)

    def _delivered(self, err: KafkaError | None, message) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append(message.value())

    def run(self) -> None:
        while not self.stopping.is_set():
            for _ in range(20):
                self.producer.produce(self.topic, value=b"m%d" % self.produced, partition=self.produced % QUEUES,
                                      on_delivery=self._delivered)
                self.produced += 1
            self.producer.poll(0.01)
        self.producer.flush(WAIT_S)


@pytest.mark.slow
def test_an_idempotent_kafka_producer_stores_each_message_once_through_leader_kills(kafka_cluster):
    topic = "kafka-once"
    kafka_cluster.create_topic(topic, QUEUES)
    sender = KafkaSender(",".join(broker.kafka for broker in kafka_cluster.brokers), topic)
    sender.start()
    kill_each_leader_in_turn(kafka_cluster, topic, QUEUES, 1.5)
    time.sleep(1.0)
    sender.stopping.set()
    sender.join(WAIT_S + 30)
    assert not sender.errors, f"{len(sender.errors)} errors, e.g. {sender.errors[:3]}"
    assert len(sender.delivered) == sender.produced > 100
    stored: Counter[bytes] = Counter()
    for queue in range(QUEUES):
        stored.update(body for _, body in pull_all(leader_of(kafka_cluster, topic, queue).address, topic, queue))
    twice = {body: n for body, n in stored.items() if n > 1}
    assert not twice, f"{len(twice)} messages stored more than once, e.g. {list(twice)[:3]}"
    missing = [body for body in sender.delivered if body not in stored]
    assert not missing, f"{len(missing)} delivered messages lost, e.g. {missing[:3]}"
