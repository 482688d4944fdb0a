"""Committed consumer-group offsets travel with the queue's records to the followers, so a group
resumes where it committed on the new leader after a SIGKILLed one, not from ``start_from``."""

from __future__ import annotations

from ha_helpers import request, wait_for
from test_ha_failover import leader_of, wait_new_leader

from gms.client import Consumer, Producer
from gms.protocol.codes import RequestCode

MESSAGES = 300
CONSUMED_FIRST = 120
POLL_TIMEOUT_MS = 200


def committed_on(address: str, group: str, topic: str) -> int:
    return request(address, RequestCode.FETCH_OFFSET, {"group": group, "queues": [[topic, 0]]})["offsets"][0]


def poll_until(consumer: Consumer, count: int, timeout_s: float = 20) -> list:
    got: list = []

    def more() -> bool:
        got.extend(consumer.poll(POLL_TIMEOUT_MS))
        return len(got) >= count

    wait_for(more, timeout_s, interval_s=0)
    return got


def test_group_resumes_from_its_commit_on_the_new_leader(ha_cluster):
    topic, group = "ha-group", "g1"
    ha_cluster.create_topic(topic, 1)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1, linger_ms=0) as producer:
        for i in range(MESSAGES):
            producer.send(topic, f"m{i}".encode(), queue=0)

    with Consumer(nameserver=ha_cluster.nameserver, group=group, subscription={topic: "*"},
                  start_from="first", auto_commit=False, max_poll_messages=CONSUMED_FIRST) as consumer:
        first = poll_until(consumer, CONSUMED_FIRST)
        consumer.commit()
    position = first[-1].queue_offset + 1
    assert [m.queue_offset for m in first] == list(range(position))
    assert 0 < position < MESSAGES

    old = ha_cluster.topic(topic).queues[0]
    followers = [ha_cluster.broker_by_id(b) for b in old.replicas if b != old.leader]
    # The followers copied the commit with their next fetch (woken by the commit).
    wait_for(lambda: all(committed_on(f.address, group, topic) == position for f in followers), 5)

    leader_of(ha_cluster, topic, 0).kill()
    new_leader = ha_cluster.broker_by_id(wait_new_leader(ha_cluster, topic, 0, old.leader))
    assert committed_on(new_leader.address, group, topic) == position

    with Consumer(nameserver=ha_cluster.nameserver, group=group, subscription={topic: "*"},
                  start_from="first", auto_commit=False) as consumer:
        rest = poll_until(consumer, MESSAGES - position)
    assert [m.queue_offset for m in rest] == list(range(position, MESSAGES))
    assert [m.body for m in rest] == [f"m{i}".encode() for i in range(position, MESSAGES)]
