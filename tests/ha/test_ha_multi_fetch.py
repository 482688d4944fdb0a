"""A group reading many replicated topics through FETCH (a request per broker for all its
queues): a killed broker's queues move to their new leaders and the others keep flowing."""

from __future__ import annotations

import time
from dataclasses import replace

from ha_helpers import wait_for

from gms.client import Consumer, Producer
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX

TOPICS = 8
QUEUES = 2
LONG_POLL_MS = 20_000  # far longer than a consumer should take to follow a queue that moved


def _read(consumer: Consumer, want: set[bytes], timeout_s: float) -> set[bytes]:
    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen and time.monotonic() < deadline:
        seen.update(m.body for m in consumer.poll(200))
    return seen


def _send_round(nameserver: str, topics: list[str], tag: str) -> set[bytes]:
    bodies = set()
    with Producer(nameserver=nameserver, acks=-1, retries=20) as producer:
        for topic in topics:
            for q in range(QUEUES):
                body = f"{tag}/{topic}/{q}".encode()
                producer.send(topic, body, queue=q)
                bodies.add(body)
    return bodies


def test_a_killed_leader_moves_its_queues_and_the_others_keep_flowing(ha_cluster):
    topics = [f"mf-ha-{i}" for i in range(TOPICS)]
    for topic in topics:
        ha_cluster.create_topic(topic, QUEUES)
    first = _send_round(ha_cluster.nameserver, topics, "before")
    with Consumer(nameserver=ha_cluster.nameserver, group="mf-ha", subscription=dict.fromkeys(topics, "*"),
                  start_from="first") as consumer:
        assert _read(consumer, first, 60) >= first
        victim_id = ha_cluster.topic(topics[0]).queues[0].leader
        moved = [(t, q.queue_id) for t in topics for q in ha_cluster.topic(t).queues if q.leader == victim_id]
        ha_cluster.broker_by_id(victim_id).kill()
        wait_for(lambda: all(ha_cluster.topic(t).queues[q].leader not in ("", victim_id) for t, q in moved), 30)
        second = _send_round(ha_cluster.nameserver, topics, "after")
        seen = _read(consumer, second, 60)
        assert second <= seen, sorted(second - seen)[:5]
        assert moved and len(moved) < TOPICS * QUEUES  # some queues moved, the others did not


def test_a_fetch_parked_at_a_broker_that_stops_leading_answers_at_once(ha_cluster):
    """Leadership moves away from a live broker (here written into etcd as the controller would):
    the fetch parked there for the queue is woken and answers that the broker is not the leader,
    so the consumer follows the queue to its new leader at once, not after its long poll."""
    topic = "mf-moved"
    ha_cluster.create_topic(topic, QUEUES)
    metadata = ha_cluster.topic(topic)
    queue = metadata.queues[0]
    new_leader = next(r for r in queue.isr if r != queue.leader)
    with Consumer(nameserver=ha_cluster.nameserver, group="mf-moved", subscription={topic: "*"},
                  start_from="first", long_poll_ms=LONG_POLL_MS) as consumer:
        first = _send_round(ha_cluster.nameserver, [topic], "before")
        assert _read(consumer, first, 60) >= first  # its fetches now park at the leader
        consumer.poll(500)
        moved = replace(metadata, queues=(replace(queue, leader=new_leader, leader_epoch=queue.leader_epoch + 1),
                                          *metadata.queues[1:]))
        client = EtcdClient(ha_cluster.etcd.endpoint)
        try:
            client.put(f"{DEFAULT_PREFIX}topics/{topic}", moved.to_json())
        finally:
            client.close()
        moved_at = time.monotonic()
        second = _send_round(ha_cluster.nameserver, [topic], "after")
        assert _read(consumer, second, 60) >= second
        assert time.monotonic() - moved_at < LONG_POLL_MS / 1000 / 2
