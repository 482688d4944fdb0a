"""Scheduled messages follow their queue's leadership: followers keep track of what is pending
(they replicate the hidden records and the delivered copies), and a new leader delivers what
comes due after the old one is SIGKILLed, each message once."""

from __future__ import annotations

import time

import pytest
from ha_helpers import HaCluster, wait_for

from gms.client import Consumer, Producer

pytestmark = pytest.mark.timeout(120)


def test_a_new_leader_delivers_the_scheduled_messages_of_a_killed_one(ha_cluster: HaCluster):
    ha_cluster.create_topic("sched-ha", queues=1, replicas=3, min_isr=2)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1) as producer:
        producer.send("sched-ha", b"delivered by the first leader", delay_ms=100)
        for i in range(10):
            producer.send("sched-ha", b"late-%d" % i, delay_ms=3000)
    leader_id = ha_cluster.topic("sched-ha").queues[0].leader
    consumer = Consumer(nameserver=ha_cluster.nameserver, group="g", subscription={"sched-ha": "*"},
                        start_from="first")
    try:
        got: list[bytes] = []
        wait_for(lambda: got.extend(bytes(m.body) for m in consumer.poll(timeout_ms=100)) or got, 10)
        assert got == [b"delivered by the first leader"]
        time.sleep(0.5)  # the followers fetch the copy: they must not deliver it again
        ha_cluster.broker_by_id(leader_id).kill()
        wait_for(lambda: ha_cluster.topic("sched-ha").queues[0].leader not in (None, leader_id), 20)
        deadline = time.monotonic() + 20
        while len(got) < 11 and time.monotonic() < deadline:
            got += [bytes(m.body) for m in consumer.poll(timeout_ms=200)]
        time.sleep(1.0)
        got += [bytes(m.body) for m in consumer.poll(timeout_ms=500)]  # nothing more: no duplicates
    finally:
        consumer.close()
    assert sorted(got) == sorted([b"delivered by the first leader", *(b"late-%d" % i for i in range(10))])
