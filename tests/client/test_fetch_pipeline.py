"""Answers bounded by count or by bytes: while the fetcher decodes one answer the next request is
already out (from where the answer ended); every message comes once, in order."""

from __future__ import annotations

import time

import pytest

from gms.client import Admin, Consumer, Producer, ProducerRecord


def _read_all(address: str, topic: str, count: int, **options) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    with Consumer([address], group=f"g-{time.time_ns()}", subscription={topic: "*"}, start_from="first",
                  auto_commit=False, **options) as consumer:
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} read"
            got.extend((m.queue_offset, m.body) for m in consumer.poll(500))
        time.sleep(0.3)  # nothing more comes
        got.extend((m.queue_offset, m.body) for m in consumer.poll(100))
    return got


@pytest.mark.parametrize("sizes", ["same", "varying"])
def test_every_message_once_in_order(broker, sizes):
    topic = f"ra-{sizes}-{time.time_ns()}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, queues=1)
    bodies = [(b"%06d" % i) * (1 if sizes == "same" else 1 + (i * i * 7919) % 23 // (1 + i % 5)) for i in range(3000)]
    # Not idempotent: its stamp makes the first record of each batch longer than the others.
    with Producer([broker.address], idempotence=False) as producer:
        for start in range(0, len(bodies), 500):
            producer.send_batch([ProducerRecord(topic, body) for body in bodies[start:start + 500]])
    # Answers bounded by count (same sizes) or by bytes (varying sizes).
    got = _read_all(broker.address, topic, len(bodies), fetch_max_messages=100, fetch_max_bytes=4000)
    assert got == list(enumerate(bodies))
