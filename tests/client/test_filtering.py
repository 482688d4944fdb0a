"""Tag subscriptions (with a forged hash collision), long polling, typed errors for bad input."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from client_helpers import consume

from gms.client import Consumer, Producer
from gms.client.body_decode import decode_pull_body
from gms.client.connections import parse_address
from gms.errors import BadTagExpressionError, GmsError, InvalidTopicError, MessageIllegalError, TopicNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import OFF_TAG_HASH, encode_record, seal_crc, tag_hash
from gms.tags import parse_tag_expression


def _send_raw(address: str, raw: bytes) -> None:
    async def send() -> None:
        conn = await Connection.open(*parse_address(address))
        try:
            await conn.request(RequestCode.SEND_BATCH, {"acks": 1}, raw)
        finally:
            conn.close()
    run(send())


def test_tags_filter_on_the_broker(broker, topic):
    with Producer([broker.address]) as producer:
        for tag in ("A", "B", "C", None, "B"):
            producer.send(topic, f"{tag}".encode(), tag=tag, queue=0)
    with Consumer([broker.address], group="gb", subscription={topic: "B"}, start_from="first") as only_b:
        got = consume(only_b, 3, timeout_s=1)
    assert [m.body for m in got] == [b"B", b"B"]
    with Consumer([broker.address], group="gac", subscription={topic: "A || C"}, start_from="first") as a_or_c:
        assert [m.tag for m in consume(a_or_c, 2)] == ["A", "C"]


def test_the_broker_refuses_a_forged_tag_hash(broker, topic):
    with pytest.raises(GmsError, match="tag_hash"):
        _send_raw(broker.address, _forged(topic))


def test_hash_collisions_are_dropped_by_exact_tag(topic):
    # Real xxh64 collisions cannot be found, and the broker refuses forged hashes, so the pull
    # response is built here: a record tagged "Impostor" that carries the hash of "B", between
    # two genuine "B" records, as the broker's hash filter would pass them to a "B" subscriber.
    genuine = encode_record(topic=topic, body=b"real", tag="B")
    body = memoryview(genuine + _forged(topic) + genuine)
    got = decode_pull_body(body, "PREFIX", parse_tag_expression("B"))
    assert [(m.tag, m.body) for m in got] == [("B", b"real"), ("B", b"real")]
    assert len(decode_pull_body(body, "PREFIX", parse_tag_expression("*"))) == 3


def _forged(topic: str) -> bytes:
    forged = bytearray(encode_record(topic=topic, body=b"forged", tag="Impostor", queue_id=0))
    struct.pack_into(">q", forged, OFF_TAG_HASH, tag_hash("B"))
    seal_crc(forged)
    return bytes(forged)


def test_long_poll_wakes_on_arrival(broker, topic):
    with Consumer([broker.address], group="lp", subscription={topic: "*"}, long_poll_ms=10_000) as consumer, \
            Producer([broker.address]) as producer:
        assert consumer.poll(300) == []  # the fetchers are now parked on the broker
        timer = threading.Timer(0.3, producer.send, (topic, b"wake"))
        timer.start()
        started = time.monotonic()
        got = consumer.poll(5000)
        elapsed = time.monotonic() - started
        timer.join()
    assert [m.body for m in got] == [b"wake"]
    assert elapsed < 1.5, elapsed


def test_bad_inputs_raise_typed_errors(broker, admin, topic):
    with Producer([broker.address]) as producer:
        with pytest.raises(TopicNotFoundError, match="no-such-topic"):
            producer.send("no-such-topic", b"x")
        with pytest.raises(InvalidTopicError, match="bad/name"):
            producer.send("bad/name", b"x")
        with pytest.raises(MessageIllegalError, match="exceeds the limit"):
            producer.send(topic, b"x" * (5 * 1024 * 1024))
        with pytest.raises(MessageIllegalError, match="separator"):
            producer.send(topic, b"x", keys=("has space",))
        producer.send(topic, b"still fine")  # the producer keeps working after refusals
    with pytest.raises(InvalidTopicError):
        admin.create_topic("bad/name")
    with pytest.raises(BadTagExpressionError, match="empty tag"):
        Consumer([broker.address], group="g", subscription={topic: "A ||"})
    with pytest.raises(TopicNotFoundError):
        Consumer([broker.address], group="g", subscription={"no-such-topic": "*"})
