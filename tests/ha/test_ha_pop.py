"""Pop state follows leadership: a queue's followers copy what its group has in flight and what
it acknowledged, so after the leader is SIGKILLed the new leader hands out only what was not
acknowledged, after its invisible duration, with the attempt counted."""

from __future__ import annotations

import time

import pytest
from ha_helpers import HaCluster, wait_for

from gms.client import Producer, SimpleConsumer

pytestmark = pytest.mark.timeout(120)


def test_a_new_leader_carries_on_with_the_pop_state_of_a_killed_one(ha_cluster: HaCluster):
    ha_cluster.create_topic("pop-ha", queues=1, replicas=3, min_isr=2)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1) as producer:
        for i in range(20):
            producer.send("pop-ha", b"m%d" % i)
    consumer = SimpleConsumer(nameserver=ha_cluster.nameserver, group="g", subscription={"pop-ha": "*"},
                              start_from="first", await_duration_ms=500)
    try:
        first = list(consumer.receive(100, invisible_duration_ms=4000))
        assert len(first) == 20
        consumer.ack(first[::2])
        time.sleep(1.0)  # the followers fetch the group's state with their next fetches
        leader_id = ha_cluster.topic("pop-ha").queues[0].leader
        ha_cluster.broker_by_id(leader_id).kill()
        wait_for(lambda: ha_cluster.topic("pop-ha").queues[0].leader not in (None, leader_id), 20)
        again: list = []
        deadline = time.monotonic() + 20
        while len(again) < 10 and time.monotonic() < deadline:
            try:
                again += consumer.receive(100, invisible_duration_ms=30_000)
            except Exception:  # noqa: BLE001 - routes settle after the failover
                time.sleep(0.2)
        consumer.ack(again)
        time.sleep(0.5)
        assert not consumer.receive(100, await_duration_ms=500)
    finally:
        consumer.close()
    assert sorted(bytes(m.body) for m in again) == sorted(bytes(m.body) for m in first[1::2])
    assert {m.delivery_attempt for m in again} == {2}
