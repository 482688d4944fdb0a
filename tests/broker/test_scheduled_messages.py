"""Scheduled messages on a real broker process: hidden until their time, delivered once as a
copy, across SIGKILL and restart; producers cannot forge the broker's timer records."""

from __future__ import annotations

import datetime
import time

import pytest

from gms.client import Admin, Consumer, Producer
from gms.client.delivery import DELAY_LEVELS_S, deliver_at_ms
from gms.errors import BadRequestError, GmsError, MessageNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import encode_record
from gms.record.layout import DELIVER_AT_PROPERTY, FLAG_SCHEDULED, FLAG_TIMER_COPY, ORIGIN_PROPERTY

pytestmark = pytest.mark.timeout(120)


def read_all(broker, topic: str, want: int, within_s: float, group: str = "g") -> list[tuple[float, bytes, dict]]:
    """What a consumer group reads within ``within_s`` (stops early at ``want`` messages):
    (seconds since the call, body, properties)."""
    consumer = Consumer([broker.address], group=group, subscription={topic: "*"}, start_from="first")
    t0, got = time.monotonic(), []
    try:
        while time.monotonic() - t0 < within_s and len(got) < want:
            got += [(time.monotonic() - t0, bytes(m.body), dict(m.properties)) for m in consumer.poll(timeout_ms=100)]
    finally:
        consumer.close()
    return got


def test_a_delayed_message_is_hidden_until_its_time_then_delivered_once(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("sched", queues=1)
    with Producer([broker.address]) as producer:
        producer.send("sched", b"at once", delay_ms=0)
        scheduled = producer.send("sched", b"in 1.5 s", delay_ms=1500)
        producer.send("sched", b"after it, but visible first")
    got = read_all(broker, "sched", 4, 4.0)
    assert [body for _, body, _ in got] == [b"at once", b"after it, but visible first", b"in 1.5 s"]
    at, _, properties = got[2]
    assert 1.0 < at < 3.0, at
    assert properties[ORIGIN_PROPERTY] == str(scheduled.queue_offset)
    assert int(properties[DELIVER_AT_PROPERTY]) > 0


def test_scheduled_messages_survive_sigkill_and_are_not_delivered_twice(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("sched-kill", queues=2)
    with Producer([broker.address]) as producer:
        producer.send("sched-kill", b"early", delay_ms=200, queue=0)
        for i in range(20):
            producer.send("sched-kill", b"late-%d" % i, delay_ms=2500, queue=i % 2)
    assert [b for _, b, _ in read_all(broker, "sched-kill", 1, 2.0, "before")] == [b"early"]
    broker.kill()
    broker.restart()
    got = read_all(broker, "sched-kill", 22, 6.0, "after")
    bodies = sorted(b for _, b, _ in got)
    assert bodies == sorted([b"early", *(b"late-%d" % i for i in range(20))])  # each once


def test_deliver_at_and_delay_levels():
    now = 1_700_000_000_000
    assert deliver_at_ms(delay_level=1, now_ms=now) == now + DELAY_LEVELS_S[0] * 1000
    assert deliver_at_ms(delay_level=18, now_ms=now) == now + 2 * 3600 * 1000
    when = datetime.datetime.fromtimestamp((now + 5000) / 1000, tz=datetime.UTC)
    assert deliver_at_ms(when, now_ms=now) == now + 5000
    assert deliver_at_ms(now - 1, now_ms=now) is None  # in the past: at once
    for bad in ({"delay_level": 19}, {"delay_ms": -1}, {"delay_ms": 8 * 86_400_000}, {"delay_ms": 1, "delay_level": 1}):
        with pytest.raises(ValueError):
            deliver_at_ms(**bad, now_ms=now)


def test_producers_cannot_forge_timer_records(broker):
    """A copy flag from a producer would cancel someone's scheduled message: refused."""
    with Admin([broker.address]) as admin:
        admin.create_topic("sched-forge", queues=1)
    forged = encode_record(topic="sched-forge", body=b"x", flags=FLAG_TIMER_COPY, properties={ORIGIN_PROPERTY: "0"})
    host, port = broker.address.rsplit(":", 1)

    async def send() -> None:
        conn = await Connection.open(host, int(port))
        try:
            await conn.request(RequestCode.SEND_BATCH, {"acks": 1}, forged)
        finally:
            conn.close()
            await conn.wait_closed()

    with pytest.raises(GmsError, match="flags"):
        run(send())


def test_a_cancelled_message_stays_cancelled_across_sigkill(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("sched-cancel", queues=1)
        with Producer([broker.address]) as producer:
            cancelled = producer.send("sched-cancel", b"cancelled", delay_ms=2000)
            producer.send("sched-cancel", b"kept", delay_ms=2000)
            plain = producer.send("sched-cancel", b"plain")
        admin.cancel_scheduled(cancelled.msg_id)
        with pytest.raises(MessageNotFoundError):
            admin.cancel_scheduled(cancelled.msg_id)  # once only
        with pytest.raises(BadRequestError):
            admin.cancel_scheduled(plain.msg_id)  # not a scheduled message
    broker.kill()
    broker.restart()
    got = read_all(broker, "sched-cancel", 3, 4.0)
    assert sorted(b for _, b, _ in got) == [b"kept", b"plain"]
    with Admin([broker.address]) as admin, pytest.raises(MessageNotFoundError):
        admin.cancel_scheduled(cancelled.msg_id)  # delivered or cancelled: too late either way


def test_a_delivery_time_too_far_ahead_or_missing_is_refused(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("sched-limits", queues=1)
    too_far = str(int(time.time() * 1000) + 8 * 86_400_000)
    host, port = broker.address.rsplit(":", 1)
    for properties in ({DELIVER_AT_PROPERTY: too_far}, {}, {DELIVER_AT_PROPERTY: "soon"}):
        record = encode_record(topic="sched-limits", body=b"x", flags=FLAG_SCHEDULED, properties=properties)

        async def send(body: bytes = record) -> None:
            conn = await Connection.open(host, int(port))
            try:
                await conn.request(RequestCode.SEND_BATCH, {"acks": 1}, body)
            finally:
                conn.close()
                await conn.wait_closed()

        with pytest.raises(GmsError, match=DELIVER_AT_PROPERTY):
            run(send())


def test_deleting_a_topic_drops_its_scheduled_messages(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("sched-gone", queues=1)
        with Producer([broker.address]) as producer:
            producer.send("sched-gone", b"never", delay_ms=800)
        admin.delete_topic("sched-gone")
        admin.create_topic("sched-gone", queues=1)  # a new topic of the same name starts empty
    assert read_all(broker, "sched-gone", 1, 2.0) == []
    assert "cannot deliver" not in broker.log_tail(20_000)
