"""The fetcher's read-ahead: while answers come full and alike it asks for the next one before
the awaited one arrives; whatever it guessed, every message comes once, in order."""

from __future__ import annotations

import time

import pytest

import gms.client.fetcher as fetcher
from gms.client import Admin, Consumer, Producer, ProducerRecord


@pytest.fixture
def read_aheads(monkeypatch):
    """How many read-ahead PULLs were sent and how many were dropped unused."""
    counts = {"sent": 0, "dropped": 0}
    original_new, original_drop = fetcher._ReadAhead.__new__, fetcher._ReadAhead.drop

    def new(cls, *args):
        counts["sent"] += 1
        return original_new(cls, *args)

    def drop(self):
        counts["dropped"] += 1
        original_drop(self)

    monkeypatch.setattr(fetcher._ReadAhead, "__new__", new)
    monkeypatch.setattr(fetcher._ReadAhead, "drop", drop)
    return counts


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
def test_every_message_once_in_order(broker, read_aheads, sizes):
    topic = f"ra-{sizes}-{time.time_ns()}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, queues=1)
    bodies = [(b"%06d" % i) * (1 if sizes == "same" else 1 + (i * i * 7919) % 23 // (1 + i % 5)) for i in range(3000)]
    # Not idempotent: its stamp makes the first record of each batch longer than the others.
    with Producer([broker.address], idempotence=False) as producer:
        for start in range(0, len(bodies), 500):
            producer.send_batch([ProducerRecord(topic, body) for body in bodies[start:start + 500]])
    # Answers bounded by count (same sizes) or by bytes (varying sizes: guesses miss).
    got = _read_all(broker.address, topic, len(bodies), fetch_max_messages=100, fetch_max_bytes=4000)
    assert got == list(enumerate(bodies))
    assert read_aheads["sent"] > 0
    if sizes == "same":
        assert read_aheads["dropped"] <= 1  # the one in flight when the consumer closed, at most
    else:
        assert read_aheads["dropped"] > 0  # some guesses missed: dropped, asked again
