"""Kafka consumer groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on gms: confluent-kafka
consumers that subscribe share a topic's partitions with the client-side assignors, rebalance as
members join and leave, and between them read every message once; kafka-python's and aiokafka's
group consumers read a topic whole."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer

from tests.kafka_api.conftest import PARTITIONS
from tests.processes import wait_until

WAIT_S = 60
PER_PHASE = 100


class Member(threading.Thread):
    """A subscribed consumer polling until told to leave; what it read, and when it was assigned."""

    def __init__(self, bootstrap: str, group: str, topic: str, strategy: str, seen: list) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "session.timeout.ms": 10_000, "partition.assignment.strategy": strategy,
                                  "auto.commit.interval.ms": 200})
        self.consumer.subscribe([topic], on_assign=self._assigned)
        self.assignments = 0
        self.seen = seen
        self.leave = threading.Event()
        self.start()

    def _assigned(self, consumer, partitions) -> None:
        self.assignments += 1

    def run(self) -> None:
        while not self.leave.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.seen.append((message.partition(), message.offset()))
        self.consumer.close()  # commits what it read, leaves the group


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_members_joining_and_leaving_share_the_partitions_and_read_each_message_once(bootstrap, topic, strategy):
    group = f"kg-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    seen: list = []
    sent = 0

    def produce() -> None:
        nonlocal sent
        for _ in range(PER_PHASE):
            producer.produce(topic, value=b"%d" % sent, partition=sent % PARTITIONS)
            sent += 1
        assert producer.flush(WAIT_S) == 0

    members = [Member(bootstrap, group, topic, strategy, seen)]
    try:
        wait_until(lambda: members[0].assignments > 0, WAIT_S)
        produce()
        wait_until(lambda: len(seen) >= sent, WAIT_S)
        for _ in range(2):  # two more join, one at a time, each while messages keep coming
            members.append(Member(bootstrap, group, topic, strategy, seen))
            wait_until(lambda: members[-1].assignments > 0, WAIT_S)
            produce()
            wait_until(lambda: len(seen) >= sent, WAIT_S)
        members[0].leave.set()
        members[0].join(WAIT_S)
        produce()
        wait_until(lambda: len(seen) >= sent, WAIT_S)
        time.sleep(1)  # anything read twice would show up by now
    finally:
        for member in members:
            member.leave.set()
        for member in members:
            member.join(WAIT_S)
    twice = [key for key, count in Counter(seen).items() if count > 1]
    assert (len(set(seen)), twice) == (sent, [])


def test_kafka_python_and_aiokafka_consumers_subscribe(bootstrap, topic):
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(PER_PHASE):
        producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(WAIT_S) == 0
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"kp-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        read = sorted(int(m.value) for m in consumer)
    finally:
        consumer.close()
    assert read == list(range(PER_PHASE))

    async def aio() -> list[int]:
        aio_consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"ak-{uuid.uuid4().hex[:8]}",
                                        auto_offset_reset="earliest")
        await aio_consumer.start()
        got: list[int] = []
        try:
            deadline = time.monotonic() + WAIT_S
            while len(got) < PER_PHASE and time.monotonic() < deadline:
                batches = await aio_consumer.getmany(timeout_ms=500)
                got += [int(m.value) for messages in batches.values() for m in messages]
        finally:
            await aio_consumer.stop()
        return sorted(got)
    assert asyncio.run(aio()) == list(range(PER_PHASE))
