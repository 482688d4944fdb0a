"""SQL92 subscriptions against a real broker: only the selected messages reach the consumer
(the broker filters), tags narrow first, and a bad expression is refused with its position at
subscribe time by the SDK and at pull time by the broker."""

from __future__ import annotations

import time

import pytest

from gms.client import Consumer, Producer, ProducerRecord, SimpleConsumer, Sql
from gms.errors import BadTagExpressionError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode, Status

pytestmark = pytest.mark.timeout(60)


def consume_all(consumer: Consumer, expected: int) -> list:
    got: list = []
    deadline = time.monotonic() + 15
    while len(got) < expected and time.monotonic() < deadline:
        got += consumer.poll(300)
    got += consumer.poll(300)  # nothing more arrives
    return got


def test_only_selected_messages_arrive(broker, topic):
    with Producer([broker.address]) as producer:
        producer.send_batch([
            ProducerRecord(topic, f"m{i}".encode(), tag="hot" if i % 2 else "cold", queue=i % 2,
                           properties={"amount": str(i), "region": "eu" if i % 10 < 3 else "us"})
            for i in range(400)])
    expression = "region = 'eu' AND amount BETWEEN 100 AND 199 AND TAGS = 'hot'"
    expected = [i for i in range(100, 200) if i % 10 < 3 and i % 2]
    with Consumer([broker.address], group="sql-readers", subscription={topic: Sql(expression)},
                  start_from="first") as consumer:
        got = consume_all(consumer, len(expected))
    assert sorted(int(m.body[1:]) for m in got) == expected


def test_a_body_holding_a_property_name_hides_no_other_message(broker, topic):
    """Properties are read from each record's properties field only: a body ending with
    ``region\x01`` (a name and its separator, as the encoding writes them) once made the broker's
    scan of the whole window run on into the next record and miss its ``region``."""
    # No stamp property before "region", and no 0x02 among the header's lengths (a born host of 2
    # bytes, e.g. "vm", would end the old scan before it reached the next record).
    with Producer([broker.address], idempotence=False, born_host="producer-host") as producer:
        producer.send_batch([
            ProducerRecord(topic, b"decoy region\x01" if i % 2 == 0 else b"m%04d" % i, queue=0,
                           properties=None if i % 2 == 0 else {"region": "eu"})
            for i in range(200)])
    expected = list(range(1, 200, 2))
    with Consumer([broker.address], group="sql-decoys", subscription={topic: Sql("region = 'eu'")},
                  start_from="first") as consumer:
        got = consume_all(consumer, len(expected))
    assert sorted(int(m.body[1:]) for m in got) == expected


def test_pop_consumers_receive_only_selected_messages(broker, topic):
    """A SimpleConsumer with a SQL92 subscription: the broker hands out the selected messages only,
    passing long runs of others within one request."""
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord(topic, f"m{i}".encode(), queue=i % 2,
                                            properties={"pick": "yes" if i % 500 == 7 else "no"})
                            for i in range(2000)])
    expected = [i for i in range(2000) if i % 500 == 7]  # 4 of 2000: runs of ~250 left out per queue
    got: list[int] = []
    with SimpleConsumer([broker.address], group="sql-pop", subscription={topic: Sql("pick = 'yes'")},
                        start_from="first", await_duration_ms=2000) as consumer:
        deadline = time.monotonic() + 15
        while len(got) < len(expected) and time.monotonic() < deadline:
            messages = consumer.receive(32)
            got += [int(m.body[1:]) for m in messages]
            consumer.ack(messages)
    assert sorted(got) == expected
    with pytest.raises(BadTagExpressionError, match="position"):
        SimpleConsumer([broker.address], group="sql-pop", subscription={topic: Sql("amount >")})


def test_bad_expressions_are_refused_with_their_position(broker, topic):
    with pytest.raises(BadTagExpressionError, match="position 8"):
        Consumer([broker.address], group="sql-bad", subscription={topic: Sql("amount > 'x'")})

    async def pull() -> None:
        host, port = broker.address.rsplit(":", 1)
        connection = await Connection.open(host, int(port))
        try:
            await connection.request(RequestCode.PULL, {"topic": topic, "queue_id": 0, "offset": 0,
                                                        "sql": "amount >"})
        finally:
            connection.close()
    with pytest.raises(BadTagExpressionError, match="position 8") as raised:
        run(pull())
    assert raised.value.status == Status.BAD_TAG_EXPRESSION
