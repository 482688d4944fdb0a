"""Keyless messages of short-lived producers spread over a topic's queues: each producer's round
robin (and so its sticky batch) starts at a random queue, not at queue 0 for every one of them
(`gms produce` runs one producer per command)."""

from __future__ import annotations

from client_helpers import QUEUES

from gms.client import Producer

PRODUCERS = 40


def test_short_lived_producers_spread_over_the_queues(broker, topic):
    sync_queues, async_queues = [], []
    for _ in range(PRODUCERS):
        with Producer([broker.address]) as producer:
            sync_queues.append(producer.send(topic, b"one").queue_id)
        with Producer([broker.address]) as producer:
            async_queues.append(producer.send_async(topic, b"one").result(30).queue_id)
    # 40 uniform picks of 8 queues all within 3 queues: odds below 1e-12.
    assert len(set(sync_queues)) > 3, sync_queues
    assert len(set(async_queues)) > 3, async_queues
    assert set(sync_queues) | set(async_queues) <= set(range(QUEUES))
