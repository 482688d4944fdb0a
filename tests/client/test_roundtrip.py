"""Producing and consuming through a real broker: fields, batches, ordering, async sends."""

from __future__ import annotations

import threading
import time

import pytest
from client_helpers import QUEUES, consume

from gms.client import Admin, Consumer, Producer, ProducerRecord
from gms.errors import GmsError
from gms.msgid import decode_msg_id


def test_every_field_round_trips(broker, admin, topic):
    before_ms = int(time.time() * 1000)
    with Producer([broker.address], born_host="10.1.2.3:555") as producer:
        sent = producer.send(topic, b"\x00body\xff", tag="TagA", keys=("k1", "k2"),
                             properties={"p": "v", "x": ""}, queue=5)
    assert (sent.topic, sent.queue_id, sent.queue_offset, sent.broker) == (topic, 5, 0, broker.address)
    assert decode_msg_id(sent.msg_id).port == broker.port
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        [msg] = consume(consumer, 1)
    assert (msg.topic, msg.queue_id, msg.queue_offset, msg.msg_id) == (topic, 5, 0, sent.msg_id)
    assert (msg.tag, msg.keys, dict(msg.properties)) == ("TagA", ("k1", "k2"), {"p": "v", "x": ""})
    assert (msg.body, msg.born_host, msg.reconsume_times) == (b"\x00body\xff", "10.1.2.3:555", 0)
    assert before_ms <= msg.born_timestamp_ms <= msg.store_timestamp_ms <= int(time.time() * 1000)
    assert admin.view_message(sent.msg_id).body == b"\x00body\xff"


def test_a_key_is_stored_as_the_first_key_or_whole_in_a_property(broker, topic):
    sent = [(b"a", {"key": "customer-7", "keys": ("o-3", "customer-7")}), (b"b", {"key": b"text"}),
            (b"c", {"key": b"\xff\x00"}), (b"d", {"key": "two words", "keys": ("o-4",)})]
    with Producer([broker.address]) as producer:
        producer.send(topic, sent[0][0], queue=1, **sent[0][1])
        producer.send_async(topic, sent[1][0], queue=1, **sent[1][1]).result(10)
        producer.send_batch([ProducerRecord(topic, sent[2][0], queue=1, **sent[2][1])])
        producer.send_oneway(topic, sent[3][0], queue=1, **sent[3][1])
        with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
            got = sorted(consume(consumer, 4), key=lambda m: m.queue_offset)
    assert [(m.body, m.keys, dict(m.properties)) for m in got] == [
        (b"a", ("customer-7", "o-3"), {}), (b"b", ("text",), {}), (b"c", (), {"__KAFKA_KEY": "/wA="}),
        (b"d", ("o-4",), {"__KAFKA_KEY": "dHdvIHdvcmRz"})]


def test_batch_results_in_input_order(broker, topic):
    records = [ProducerRecord(topic, b"m%d" % i, key=f"k{i % 5}") for i in range(200)]
    with Producer([broker.address]) as producer:
        results = producer.send_batch(records) + producer.send_batch([{"topic": topic, "body": b"d", "queue": 2}])
    assert len(results) == 201 and results[-1].queue_id == 2
    assert len({r.msg_id for r in results}) == 201
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        got = consume(consumer, 201)
    by_id = {m.msg_id: m.body for m in got}
    assert [by_id[r.msg_id] for r in results[:200]] == [b"m%d" % i for i in range(200)]


def test_same_key_same_queue_in_order(broker, topic):
    with Producer([broker.address], linger_ms=1) as producer:
        futures = [producer.send_async(topic, b"%d" % i, key=f"user-{i % 3}") for i in range(300)]
        producer.flush()
    queues = {}
    for i, future in enumerate(futures):
        queues.setdefault(f"user-{i % 3}", set()).add(future.result().queue_id)
    assert all(len(q) == 1 for q in queues.values())
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        got = consume(consumer, 300)
    per_key: dict[int, list[int]] = {}
    for msg in got:
        per_key.setdefault(int(msg.body) % 3, []).append(int(msg.body))
    assert all(values == sorted(values) for values in per_key.values())
    assert sum(len(v) for v in per_key.values()) == 300


def test_send_async_batches_and_calls_back(broker, topic):
    done = threading.Event()
    seen = []

    def callback(future):
        seen.append(future.result().queue_offset)
        if len(seen) == 1000:
            done.set()

    with Producer([broker.address], linger_ms=20, batch_bytes=16 * 1024) as producer:
        futures = [producer.send_async(topic, b"x" * 100, queue=1, callback=callback) for _ in range(1000)]
        assert done.wait(10)
    assert sorted(f.result().queue_offset for f in futures) == list(range(1000))
    assert sorted(seen) == list(range(1000))


def test_plain_async_messages_fill_one_queue_per_batch(broker, topic):
    """Kafka's sticky partitioner: plain messages stick to one queue until their batch is sent,
    then the next batch goes to the next queue (not one queue per message)."""
    with Producer([broker.address], linger_ms=60_000, batch_bytes=4096) as producer:
        futures = [producer.send_async(topic, b"p" * 100) for _ in range(200)]  # ~25 per batch
        keyed = [producer.send_async(topic, b"k", key=f"k{i % 4}") for i in range(40)]
        producer.flush()
    queues = [f.result().queue_id for f in futures]
    runs = [q for i, q in enumerate(queues) if i == 0 or q != queues[i - 1]]
    assert 6 <= len(runs) <= 10  # one run per batch
    assert len(set(queues)) >= min(QUEUES, len(runs)) - 1  # batch after batch, round the queues
    by_key: dict[str, set[int]] = {}
    for i, future in enumerate(keyed):  # keyed messages keep to their key's queue
        by_key.setdefault(f"k{i % 4}", set()).add(future.result().queue_id)
    assert all(len(q) == 1 for q in by_key.values())
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        assert len(consume(consumer, 240)) == 240


def test_send_async_failure_reaches_every_message_of_the_batch(broker_factory):
    broker = broker_factory()
    with Admin([broker.address]) as admin:
        admin.create_topic("t", queues=1)
    with Producer([broker.address], retries=0, request_timeout_ms=2000) as producer:
        producer.send("t", b"route")  # routes known; then the broker goes away
        broker.stop()
        called = []
        futures = [producer.send_async("t", b"m%d" % i, queue=0, callback=called.append) for i in range(50)]
        producer.flush()
        for future in futures:
            assert future.done() and not future.cancelled() and not future.running()
            assert isinstance(future.exception(), GmsError)
            with pytest.raises(GmsError):
                future.result()
        assert called == futures  # each callback got its own message's future


def test_send_async_without_acks_resolves_to_none(broker, topic):
    with Producer([broker.address], acks=0) as producer:
        futures = [producer.send_async(topic, b"fire", queue=3) for _ in range(20)]
        producer.flush()
        assert [f.result(10) for f in futures] == [None] * 20
        producer_sync = producer.send(topic, b"sync", queue=3)  # acks=0: nothing to report
    assert producer_sync is None


def test_oneway_is_stored(broker, admin, topic):
    with Producer([broker.address]) as producer:
        for _ in range(10):
            producer.send_oneway(topic, b"fire", queue=0)
        producer.send(topic, b"sync", queue=0)  # answered after the oneway frames before it
    stats = {q["queue_id"]: q["max_offset"] for q in admin.topic_stats(topic)}
    assert stats[0] == 11 and len(stats) == QUEUES
