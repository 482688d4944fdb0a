"""FIFO message groups on a real broker: a group's messages go to one queue in the order sent,
and a FIFO consumer that fails one gets it again before anything after it; after
max_reconsume_times it goes to the dead-letter topic and the group moves on."""

from __future__ import annotations

import time

import pytest

from gms.client import Admin, Consumer, Producer
from gms.naming import dlq_topic

pytestmark = pytest.mark.timeout(120)


def test_a_failed_message_holds_its_group_back_until_it_succeeds(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("fifo", queues=4)
    with Producer([broker.address]) as producer:
        for i in range(5):
            for group in ("a", "b"):
                producer.send("fifo", f"{group}{i}".encode(), message_group=group)
    consumer = Consumer([broker.address], group="fifo-readers", subscription={"fifo": "*"}, start_from="first",
                        fifo=True)
    order: list[str] = []
    failures = {"a1": 2}  # a1 fails twice, then succeeds

    def handle(message) -> None:
        body = bytes(message.body).decode()
        order.append(body)
        if failures.get(body, 0):
            failures[body] -= 1
            raise RuntimeError("not yet")

    deadline = time.monotonic() + 20
    try:
        consumer.listen(handle, stop=lambda: {"a4", "b4"} <= set(order) or time.monotonic() > deadline)
    finally:
        consumer.close()
    a_seen = [x for x in order if x.startswith("a")]
    assert a_seen == ["a0", "a1", "a1", "a1", "a2", "a3", "a4"]  # nothing of a after a1 until it succeeded
    assert [x for x in order if x.startswith("b")] == [f"b{i}" for i in range(5)]


def test_a_message_failing_too_often_goes_to_the_dead_letters_and_the_group_moves_on(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("fifo-dlq", queues=1)
    with Producer([broker.address]) as producer:
        for body in (b"ok-1", b"poison", b"ok-2"):
            producer.send("fifo-dlq", body, message_group="g")
    consumer = Consumer([broker.address], group="fifo-dlq-readers", subscription={"fifo-dlq": "*"},
                        start_from="first", fifo=True, max_reconsume_times=2)
    order: list[bytes] = []

    def handle(message) -> None:
        order.append(bytes(message.body))
        if message.body == b"poison":
            raise ValueError("cannot parse")

    deadline = time.monotonic() + 20
    try:
        consumer.listen(handle,
                        stop=lambda: b"ok-2" in order or time.monotonic() > deadline)
    finally:
        consumer.close()
    assert order == [b"ok-1", b"poison", b"poison", b"poison", b"ok-2"]
    reader = Consumer([broker.address], group="dlq-check", subscription={dlq_topic("fifo-dlq-readers"): "*"},
                      start_from="first")
    try:
        letters: list = []
        end = time.monotonic() + 5
        while not letters and time.monotonic() < end:
            letters = list(reader.poll(timeout_ms=200))
    finally:
        reader.close()
    assert [bytes(m.body) for m in letters] == [b"poison"] and letters[0].reconsume_times == 3
