"""Pop consumption (SimpleConsumer) on a real broker: one delivery per message to any consumer of
the group, acknowledged by receipt handle; redelivery only after the invisible duration, with
the attempt counted; dead letters once the attempts run out; state kept across restarts and
SIGKILL; bad requests refused while the broker keeps serving."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from processes import wait_until

from gms.client import Admin, Producer, ProducerRecord, ReceiptHandle, SimpleConsumer
from gms.client.offset_reset import ResetSpec
from gms.client.retries import DLQ_REASON_PROPERTY, origin_topic
from gms.errors import BadRequestError, ReceiptHandleExpiredError, TopicNotFoundError
from gms.naming import dlq_topic

pytestmark = pytest.mark.timeout(120)


def _topic(admin: Admin, queues: int) -> str:
    name = f"pop-{uuid.uuid4().hex[:8]}"
    admin.create_topic(name, queues=queues)
    return name


def _send(address: str, topic: str, count: int, **kwargs) -> None:
    with Producer([address]) as producer:
        producer.send_batch([ProducerRecord(topic, b"m%d" % i, **kwargs) for i in range(count)])


def _consumer(address: str, topic: str, group: str | None = None, **kwargs) -> SimpleConsumer:
    kwargs.setdefault("start_from", "first")
    kwargs.setdefault("await_duration_ms", 300)
    return SimpleConsumer([address], group=group or f"g-{uuid.uuid4().hex[:6]}", subscription={topic: "*"}, **kwargs)


def test_a_message_comes_again_only_after_its_invisible_duration_with_the_attempt_counted(broker, admin):
    topic = _topic(admin, 2)
    _send(broker.address, topic, 6)
    with _consumer(broker.address, topic) as consumer:
        first = list(consumer.receive(10, invisible_duration_ms=800))
        assert sorted(bytes(m.body) for m in first) == [b"m%d" % i for i in range(6)]
        assert {m.delivery_attempt for m in first} == {1}
        consumer.ack(first[:3])
        assert not consumer.receive(10, await_duration_ms=200)  # the rest is invisible
        time.sleep(0.8)
        again = list(consumer.receive(10, invisible_duration_ms=5000))
        assert sorted(m.msg_id for m in again) == sorted(m.msg_id for m in first[3:])
        assert {m.delivery_attempt for m in again} == {2}
        with pytest.raises(ReceiptHandleExpiredError) as expired:
            consumer.ack(first[3:])  # the first delivery's handles: handed out again since
        assert len(expired.value.fields["expired"]) == 3
        with pytest.raises(ReceiptHandleExpiredError):
            consumer.ack_async(first[3:4]).result(10)  # the same, without waiting for it
        consumer.ack([str(m.receipt_handle) for m in again])  # handles as text work too
        consumer.ack(again)  # acknowledging again is fine
        assert not consumer.receive(10, invisible_duration_ms=100, await_duration_ms=400)


def test_ten_consumers_on_two_queues_receive_and_acknowledge_every_message_exactly_once(broker, admin):
    topic = _topic(admin, 2)
    total = 3000
    _send(broker.address, topic, total)
    group = "ten"
    received: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with _consumer(broker.address, topic, group, invisible_duration_ms=60_000) as consumer:
                idle_since = time.monotonic()
                while time.monotonic() - idle_since < 1.5:
                    messages = list(consumer.receive(16, await_duration_ms=200))
                    if messages:
                        idle_since = time.monotonic()
                        consumer.ack(messages)
                        with lock:
                            received.update(bytes(m.body).decode() for m in messages)
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert set(received) == {f"m{i}" for i in range(total)}
    assert max(received.values()) == 1  # nothing handed out twice: every invisible duration held


def test_change_invisible_duration_and_nack_move_when_a_message_comes_again(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 2)
    with _consumer(broker.address, topic, retry_delays_ms=(300,)) as consumer:
        a, b = consumer.receive(2, invisible_duration_ms=500)
        consumer.change_invisible_duration(a, 3000)  # still working on it
        consumer.nack(b)  # back in 300 ms (its schedule)
        time.sleep(0.7)
        again = list(consumer.receive(10, invisible_duration_ms=5000))
        assert [(m.msg_id, m.delivery_attempt) for m in again] == [(b.msg_id, 2)]
        consumer.change_invisible_duration(again[0], 0)  # visible at once
        assert [m.delivery_attempt for m in consumer.receive(10)] == [3]
        with pytest.raises(ReceiptHandleExpiredError):
            consumer.change_invisible_duration(b, 1000)  # its first delivery's handle
        consumer.ack(a)


def test_a_message_handed_out_max_delivery_attempts_times_goes_to_the_dead_letter_topic(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 1, tag="t", keys=("k",))
    group = f"dead-{uuid.uuid4().hex[:6]}"
    deliveries = []
    with _consumer(broker.address, topic, group, max_delivery_attempts=3, invisible_duration_ms=200) as consumer:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(deliveries) < 4:
            deliveries += [m.delivery_attempt for m in consumer.receive(10, await_duration_ms=300)]
    assert deliveries == [1, 2, 3]  # never acknowledged; the fourth went to the dead letters
    with _consumer(broker.address, dlq_topic(group)) as letters:
        dead = list(letters.receive(10, await_duration_ms=3000))
        letters.ack(dead)
    assert [(bytes(m.body), m.tag, m.keys, origin_topic(m)) for m in dead] == [(b"m0", "t", ("k",), topic)]
    assert dead[0].properties[DLQ_REASON_PROPERTY] == "delivery attempts exhausted"


def test_tag_subscriptions_and_start_positions(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 3, tag="old")
    with SimpleConsumer([broker.address], group="late", subscription={topic: "new"}, await_duration_ms=300) as late:
        assert not late.receive(10)  # starts at the end: nothing yet
        _send(broker.address, topic, 2, tag="new")
        _send(broker.address, topic, 2, tag="other")
        got = list(late.receive(10))
        assert [(bytes(m.body), m.tag) for m in got] == [(b"m0", "new"), (b"m1", "new")]
        late.ack(got)
    with _consumer(broker.address, topic) as early:  # a new group from the first message
        assert len(early.receive(100)) == 7


@pytest.mark.parametrize("stop", ["graceful", "sigkill"])
def test_pop_state_survives_a_restart(broker_factory, stop):
    broker = broker_factory()
    with Admin([broker.address]) as admin:
        topic = _topic(admin, 2)
    _send(broker.address, topic, 20)
    invisible_s = 6
    with _consumer(broker.address, topic, "durable") as consumer:
        received_at = time.monotonic()
        first = list(consumer.receive(100, invisible_duration_ms=invisible_s * 1000))
        assert len(first) == 20
        acked = first[::2]
        consumer.ack(acked)
    if stop == "graceful":
        broker.stop()
    else:
        time.sleep(1.5)  # the offsets (and the pop state with them) are persisted every second
        broker.kill()
    broker.restart()
    with _consumer(broker.address, topic, "durable") as consumer:
        early = consumer.receive(100, await_duration_ms=300)
        if time.monotonic() - received_at < invisible_s:  # asked before the invisible time ran out (a slow
            assert not early  # restart may outlast it): still invisible
        again = list(early)
        wait_until(lambda: again.extend(consumer.receive(100, invisible_duration_ms=10_000)) or len(again) >= 10, 30)
        consumer.ack(again)
        assert not consumer.receive(100, await_duration_ms=300)
    assert sorted(m.msg_id for m in again) == sorted(m.msg_id for m in first[1::2])
    assert {m.delivery_attempt for m in again} == {2}


def test_a_sigkill_right_after_acknowledging_loses_no_message(broker_factory):
    broker = broker_factory()
    with Admin([broker.address]) as admin:
        topic = _topic(admin, 1)
    _send(broker.address, topic, 50)
    with _consumer(broker.address, topic, "crash") as consumer:
        first = list(consumer.receive(100, invisible_duration_ms=500))
        consumer.ack(first[:25])
    broker.kill()  # before the state was persisted: some acknowledged ones may come again
    broker.restart()
    seen = {m.msg_id for m in first[:25]}
    with _consumer(broker.address, topic, "crash") as consumer:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not seen >= {m.msg_id for m in first}:
            got = list(consumer.receive(100, invisible_duration_ms=10_000))
            consumer.ack(got)
            seen |= {m.msg_id for m in got}
    assert seen == {m.msg_id for m in first}


def test_a_reset_of_the_group_offsets_starts_pop_consumption_over(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 5)
    with _consumer(broker.address, topic, "again") as consumer:
        consumer.ack(consumer.receive(10))
        admin.reset_offsets("again", [topic], ResetSpec.earliest(), execute=True, force=True)
        assert len(consumer.receive(10)) == 5


def test_bad_pop_requests_get_clear_errors_and_the_broker_keeps_serving(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 1)
    with _consumer(broker.address, topic) as consumer:
        with pytest.raises(BadRequestError, match="invisible_ms"):
            consumer.receive(1, invisible_duration_ms=0)
        with pytest.raises(BadRequestError, match="invisible_ms"):
            consumer.receive(1, invisible_duration_ms=13 * 3600 * 1000)
        with pytest.raises(ValueError, match="receipt handle"):
            consumer.ack("not;a handle")
        with pytest.raises(ReceiptHandleExpiredError):
            consumer.ack(ReceiptHandle(topic, 0, 99, 1))  # never handed out
        assert len(consumer.receive(1)) == 1
    with (pytest.raises(TopicNotFoundError),
          SimpleConsumer([broker.address], group="g", subscription={"no-such-topic": "*"}) as missing):
        missing.receive(1)


def test_a_fifo_group_gets_a_queues_messages_one_batch_at_a_time_in_order(broker, admin):
    topic = _topic(admin, 1)
    _send(broker.address, topic, 6)
    with _consumer(broker.address, topic, fifo=True) as first, _consumer(broker.address, topic, first.group,
                                                                          fifo=True) as second:
        batch = list(first.receive(2, invisible_duration_ms=600))
        assert [bytes(m.body) for m in batch] == [b"m0", b"m1"]
        assert not second.receive(10, await_duration_ms=200)  # held until the batch is done
        first.ack(batch[1])  # m0 is still in flight: nothing after it goes out
        assert not second.receive(10, await_duration_ms=200)
        time.sleep(0.6)
        again = list(second.receive(10, invisible_duration_ms=5000))
        assert [(bytes(m.body), m.delivery_attempt) for m in again] == [(b"m0", 2)]  # first, alone
        second.ack(again)
        rest = list(second.receive(10))
        assert [bytes(m.body) for m in rest] == [b"m2", b"m3", b"m4", b"m5"]
