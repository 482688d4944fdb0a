"""Consumer retries on a real broker: a nacked message comes back to its group after the backoff
with reconsume_times counting up, other groups are unaffected, and after max_reconsume_times it
lands in the group's dead-letter topic with the reason."""

from __future__ import annotations

import time

import pytest

from gms.client import Admin, Consumer, Producer
from gms.client.retries import DLQ_REASON_PROPERTY, ORIGIN_MSG_ID_PROPERTY, origin_topic
from gms.naming import dlq_topic, retry_topic

pytestmark = pytest.mark.timeout(120)


def test_nacked_messages_come_back_then_go_to_the_dead_letter_topic(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("work", queues=2)
    with Producer([broker.address]) as producer:
        sent = producer.send("work", b"job", tag="t", keys=("k1",), properties={"p": "1"})
    failing = Consumer([broker.address], group="failing", subscription={"work": "*"}, start_from="first",
                       max_reconsume_times=2, retry_delays_ms=(300, 600))
    attempts: list[tuple[float, int, str]] = []
    t0 = time.monotonic()
    try:
        while len(attempts) < 3 and time.monotonic() - t0 < 15:
            for message in failing.poll(timeout_ms=100):
                attempts.append((time.monotonic() - t0, message.reconsume_times, message.topic))
                assert (bytes(message.body), message.tag, message.keys, origin_topic(message)) == \
                    (b"job", "t", ("k1",), "work")
                assert message.properties["p"] == "1"
                went = failing.nack(message, reason=f"attempt {message.reconsume_times} failed")
                assert went == (retry_topic("failing") if message.reconsume_times < 2 else dlq_topic("failing"))
        time.sleep(1.0)
        assert not list(failing.poll(timeout_ms=200))  # dead: not delivered again
    finally:
        failing.close()
    assert [a[1:] for a in attempts] == [(0, "work"), (1, retry_topic("failing")), (2, retry_topic("failing"))]
    assert attempts[1][0] - attempts[0][0] >= 0.25 and attempts[2][0] - attempts[1][0] >= 0.55  # the backoff

    other = Consumer([broker.address], group="other", subscription={"work": "*"}, start_from="first")
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            seen += [bytes(m.body) for m in other.poll(timeout_ms=100)]
    finally:
        other.close()
    assert seen == [b"job"]  # another group: once, never the retries

    dead = Consumer([broker.address], group="dlq-reader", subscription={dlq_topic("failing"): "*"},
                    start_from="first")
    try:
        letters = []
        deadline = time.monotonic() + 5
        while not letters and time.monotonic() < deadline:
            letters = list(dead.poll(timeout_ms=200))
    finally:
        dead.close()
    assert len(letters) == 1
    letter = letters[0]
    assert bytes(letter.body) == b"job" and letter.reconsume_times == 3
    assert letter.properties[DLQ_REASON_PROPERTY] == "attempt 2 failed"
    assert letter.properties[ORIGIN_MSG_ID_PROPERTY] == sent.msg_id


def test_a_listener_that_raises_gets_the_message_again(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("listened", queues=1)
    with Producer([broker.address]) as producer:
        producer.send("listened", b"flaky")
        producer.send("listened", b"fine")
    consumer = Consumer([broker.address], group="listener", subscription={"listened": "*"}, start_from="first",
                        retry_delays_ms=(200,))
    seen: list[tuple[bytes, int]] = []

    def handle(message) -> None:
        seen.append((bytes(message.body), message.reconsume_times))
        if message.body == b"flaky" and message.reconsume_times == 0:
            raise RuntimeError("downstream timeout")

    deadline = time.monotonic() + 10
    try:
        consumer.listen(handle, stop=lambda: len(seen) >= 3 or time.monotonic() > deadline)
    finally:
        consumer.close()
    assert seen == [(b"flaky", 0), (b"fine", 0), (b"flaky", 1)]
