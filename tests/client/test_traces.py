"""Message traces on a real broker: dead letters of a consumer group and of pop consumers appear
in a message's trace; with tracing off nothing is written; a trace topic that cannot be written
(missing, not created for a topic of one's own) or a full trace buffer never fails or holds up
the client, and what is lost is counted."""

from __future__ import annotations

import time
import uuid

import pytest

from gms.client import Admin, Consumer, Producer, ProducerRecord, SimpleConsumer
from gms.client.trace_format import TRACE_TOPIC
from gms.client.tracing import Connect, TraceDispatcher
from gms.naming import dlq_topic

pytestmark = pytest.mark.timeout(90)


def events_of(address: str, msg_id: str, count: int, timeout_s: float = 10) -> list:
    with Admin([address]) as admin:
        deadline = time.monotonic() + timeout_s
        while True:
            events = admin.trace(msg_id)
            if len(events) >= count or time.monotonic() > deadline:
                return events
            time.sleep(0.1)


def test_a_message_that_keeps_failing_shows_its_dead_letter(broker, topic):
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Producer([broker.address], trace=True) as producer:
        sent = producer.send(topic, b"poison", queue=0)
    consumer = Consumer([broker.address], group=group, subscription={topic: "*"}, start_from="first",
                        max_reconsume_times=1, retry_delays_ms=(100,), trace=True)
    went: list[str] = []
    try:
        deadline = time.monotonic() + 15
        while len(went) < 2 and time.monotonic() < deadline:
            went += [consumer.nack(m, reason="cannot parse") for m in consumer.poll(100)]
    finally:
        consumer.close()
    assert went[-1] == dlq_topic(group)
    events = events_of(broker.address, sent.msg_id, 6)
    assert [e.event for e in events] == ["send", "store", "deliver", "retry", "deliver", "dead-letter"]
    dead = events[-1]
    assert (dead.group, dead.attempt, dead.details["reason"], dead.details["to"]) == (
        group, 2, "cannot parse", dlq_topic(group))
    with Admin([broker.address]) as admin:
        letter = admin.view_message(dead.details["copy_id"])
    assert (letter.topic, bytes(letter.body)) == (dlq_topic(group), b"poison")


def test_pop_consumers_trace_deliveries_nacks_acks_and_exhausted_messages(broker, topic):
    group = f"pop-{uuid.uuid4().hex[:6]}"
    with Producer([broker.address], trace=True) as producer:
        acked, dropped = producer.send_batch([ProducerRecord(topic, b"a", queue=0),
                                              ProducerRecord(topic, b"b", queue=0)])
    with SimpleConsumer([broker.address], group=group, subscription={topic: "*"}, start_from="first",
                        max_delivery_attempts=2, invisible_duration_ms=300, trace=True) as consumer:
        first = {bytes(m.body): m for m in consumer.receive(10, await_duration_ms=3000)}
        consumer.nack(first[b"a"], delay_ms=100)  # b is left to time out
        handled: set[bytes] = set()
        deadline = time.monotonic() + 10
        while len(handled) < 1 and time.monotonic() < deadline:
            for message in consumer.receive(10, await_duration_ms=500):
                assert message.delivery_attempt == 2
                if bytes(message.body) == b"a":
                    consumer.ack(message)
                    handled.add(b"a")
        deadline = time.monotonic() + 5  # b's second delivery runs out; the next receive dead-letters it
        while time.monotonic() < deadline and len(events_of(broker.address, dropped.msg_id, 0, 0)) < 5:
            consumer.receive(10, await_duration_ms=300)
    assert [e.event for e in events_of(broker.address, acked.msg_id, 6)] == [
        "send", "store", "deliver", "retry", "deliver", "ack"]
    events = events_of(broker.address, dropped.msg_id, 5)
    assert [e.event for e in events][:3] == ["send", "store", "deliver"]
    assert events[-1].event == "dead-letter" and events[-1].details["reason"] == "delivery attempts exhausted"
    assert "ack" not in [e.event for e in events]


def test_without_tracing_no_trace_topic_is_written(tmp_path):
    from processes import BrokerProcess
    broker = BrokerProcess(tmp_path / "store", []).start()
    try:
        with Admin([broker.address]) as admin:
            admin.create_topic("plain", queues=1)
        with Producer([broker.address]) as producer:
            producer.send("plain", b"x")
            producer.send_batch([ProducerRecord("plain", b"y")])
        consumer = Consumer([broker.address], group="quiet", subscription={"plain": "*"}, start_from="first")
        try:
            deadline = time.monotonic() + 5
            seen = 0
            while seen < 2 and time.monotonic() < deadline:
                seen += len(consumer.poll(100))
        finally:
            consumer.close()
        with Admin([broker.address]) as admin:
            assert TRACE_TOPIC not in admin.topics()
    finally:
        broker.stop()


def test_a_trace_topic_that_cannot_be_written_costs_the_producer_nothing(broker, topic):
    missing = f"trace-{uuid.uuid4().hex[:6]}"  # a topic of one's own is not created by the SDK
    with Producer([broker.address]) as plain:
        started = time.monotonic()
        for _ in range(200):
            plain.send(topic, b"x")
        plain_s = time.monotonic() - started
    with Producer([broker.address], trace=True, trace_topic=missing) as producer:
        started = time.monotonic()
        results = [producer.send(topic, b"x") for _ in range(200)]
        traced_s = time.monotonic() - started
        dispatcher = producer._trace.dispatcher
    assert len(results) == 200 and all(r.msg_id for r in results)
    assert traced_s < plain_s * 3 + 1.0
    assert dispatcher.lost == 200 and dispatcher.written == 0
    with Admin([broker.address]) as admin:
        assert missing not in admin.topics()


def test_a_full_trace_buffer_drops_and_counts_without_blocking():
    dispatcher = TraceDispatcher(Connect(["127.0.0.1:1"], None, None), buffer_messages_max=10,
                                 flush_interval_ms=60_000)
    try:
        started = time.monotonic()
        for _ in range(15):
            dispatcher.add(lambda: iter(()), (), 1)
        assert time.monotonic() - started < 0.5
        assert dispatcher.dropped == 5
        dispatcher.flush()  # nothing to write (the items make no records): nothing lost
        dispatcher.add(lambda: iter([("send", ["7F000001000000010000000000000000"], {})]), (), 1)
        dispatcher.flush()  # nobody listens at 127.0.0.1:1: lost, counted, never raised
        assert dispatcher.lost == 1 and dispatcher.written == 0
    finally:
        started = time.monotonic()
        dispatcher.close(timeout_ms=2000)
        assert time.monotonic() - started < 3
