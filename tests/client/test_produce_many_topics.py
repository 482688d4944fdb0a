"""send_async spread over many topics against a real broker: the batches due together for the
broker go out as one request (fewer SEND_BATCH requests than batches, seen on the broker's
/metrics), each message stored where its result says; an idempotent producer's request of many
batches that times out and is retried stores nothing twice; one batch refused in such a request
fails alone, the others are stored; a busy broker gets requests of few lingered batches, the
others growing meanwhile."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from processes import free_port
from scrape import scrape

from gms.client import Admin, Producer
from gms.client.accumulator import OPEN_BATCHES_PER_BUSY_REQUEST, REQUESTS_PER_BROKER
from gms.errors import MessageIllegalError, QueueNotFoundError

pytestmark = pytest.mark.timeout(120)

TOPICS = 30
PER_TOPIC = 5
# Batches wait for flush() (never for their linger): then all are due at once.
LINGER_MS = 60_000


def _sends(metrics_port: int, status: str = "SUCCESS") -> float:
    return sum(v for (name, labels), v in scrape(metrics_port).items()
               if name == "gms_broker_request_seconds_count"
               and dict(labels) == {"code": "SEND_BATCH", "status": status})


@pytest.fixture
def watched(broker_factory):
    """A broker with its metrics endpoint, and TOPICS topics of 4 queues on it."""
    port = free_port()
    broker = broker_factory("--metrics-listen", f"127.0.0.1:{port}")
    prefix = f"many-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:02d}" for i in range(TOPICS)]
    with Admin([broker.address]) as admin:
        for topic in topics:
            admin.create_topic(topic, queues=4)
    return broker, port, topics


def _check_stored(address: str, futures: dict[bytes, object]) -> None:
    """Every message is read back at the topic, queue and offset its result names."""
    with Admin([address]) as admin:
        for body, future in futures.items():
            result = future.result(timeout=30)  # type: ignore[attr-defined]
            message = admin.view_message(result.msg_id)
            assert (message.body, message.topic, message.queue_id, message.queue_offset) == (
                body, result.topic, result.queue_id, result.queue_offset)


def test_batches_of_many_topics_share_requests_and_land_where_their_results_say(watched):
    broker, port, topics = watched
    with Producer([broker.address], linger_ms=LINGER_MS) as producer:
        for topic in topics:  # routes looked up, connections open
            producer.send(topic, b"warm-up")
        before = _sends(port)
        futures = {b"%s/%d" % (topic.encode(), i): None for topic in topics for i in range(PER_TOPIC)}
        for body in futures:
            futures[body] = producer.send_async(body.decode().rsplit("/", 1)[0], body)
        producer.flush()
        requests = _sends(port) - before
        batches = {(f.result().topic, f.result().queue_id) for f in futures.values()}  # type: ignore[union-attr]
    assert len(batches) >= TOPICS  # each topic's messages fill one sticky batch at least
    assert 1 <= requests < len(batches) / 2
    _check_stored(broker.address, futures)


def test_an_idempotent_request_of_many_batches_retried_after_timeouts_is_stored_once(watched):
    """The request of many batches waits in the stopped broker's socket; the producer times out
    and retries each batch alone; the broker, resumed, stores the request, then answers each
    retry with where its batch is."""
    broker, _, topics = watched
    with Producer([broker.address], linger_ms=LINGER_MS, request_timeout_ms=300, retries=20,
                  retry_backoff_ms=20) as producer:
        for topic in topics:
            producer.send(topic, b"warm-up")
        futures = {b"%s/%d" % (topic.encode(), i): producer.send_async(topic, b"%s/%d" % (topic.encode(), i))
                   for topic in topics for i in range(PER_TOPIC)}
        broker.pause()
        try:
            flusher = threading.Thread(target=producer.flush)
            flusher.start()
            time.sleep(1.5)  # several timeouts and retries
        finally:
            broker.resume()
        flusher.join(60)
        assert not flusher.is_alive()
    _check_stored(broker.address, futures)
    with Admin([broker.address]) as admin:
        for topic in topics:  # the warm-up and PER_TOPIC messages, each once
            assert sum(q["max_offset"] - q["min_offset"] for q in admin.topic_stats(topic)) == 1 + PER_TOPIC


def test_a_batch_refused_in_a_request_of_many_fails_alone(watched):
    """A batch for a queue the topic does not have shares a request with the others: the broker
    refuses the request whole (stores nothing of it); each batch then goes alone, the others are
    stored and the refused one fails with the broker's error."""
    broker, port, topics = watched
    with Producer([broker.address], linger_ms=LINGER_MS, retries=0) as producer:
        for topic in topics:
            producer.send(topic, b"warm-up")
        futures = {b"%s/0" % topic.encode(): producer.send_async(topic, b"%s/0" % topic.encode())
                   for topic in topics}
        refused = producer.send_async(topics[0], b"nowhere", queue=99)
        producer.flush()
    with pytest.raises(QueueNotFoundError):
        refused.result(timeout=30)
    assert _sends(port, "QUEUE_NOT_FOUND") == 2  # the request of many, then the batch alone
    _check_stored(broker.address, futures)
    with Admin([broker.address]) as admin:
        for topic in topics:
            assert sum(q["max_offset"] - q["min_offset"] for q in admin.topic_stats(topic)) == 2


def test_a_bad_record_in_a_request_of_many_fails_its_batch_alone_and_the_others_keep_their_order(watched):
    """A batch holding a record over its topic's size limit shares a request with the other
    topics' batches: the broker refuses the request whole; the others are then stored once each,
    in order, the bad one fails with the clear error, and the same idempotent producer's next
    batches for every queue (the refused one's too) are stored after them."""
    broker, _, topics = watched
    small = f"{topics[0]}-small"
    with Admin([broker.address]) as admin:
        admin.create_topic(small, queues=1, settings={"message_size_bytes_max": 1000})
    with Producer([broker.address], linger_ms=LINGER_MS, retries=0) as producer:
        for topic in [*topics, small]:
            producer.send(topic, b"warm-up", queue=0)
        rounds = []
        for n in range(2):
            futures = {b"%s/%d" % (topic.encode(), n): producer.send_async(topic, b"%s/%d" % (topic.encode(), n),
                                                                          queue=0) for topic in topics}
            fine = producer.send_async(small, b"fits/%d" % n)
            too_large = producer.send_async(small, b"x" * 2000) if n == 0 else None
            producer.flush()
            rounds.append((futures, fine, too_large))
        after = producer.send(small, b"after")
    first_fine, refused = rounds[0][1], rounds[0][2]
    with pytest.raises(MessageIllegalError, match="1000"):
        refused.result(timeout=30)  # type: ignore[union-attr]
    with pytest.raises(MessageIllegalError):  # the record before it shared its batch
        first_fine.result(timeout=30)
    assert rounds[1][1].result(timeout=30).queue_offset == 1 and after.queue_offset == 2
    for futures, _, _ in rounds:
        _check_stored(broker.address, futures)
    with Admin([broker.address]) as admin:
        for topic in topics:
            stored = admin.topic_stats(topic)[0]
            assert stored["max_offset"] - stored["min_offset"] == 3  # warm-up, round 0, round 1: once each
        bodies = [admin.view_message(f.result(timeout=30).msg_id).body
                  for f in (rounds[0][0][b"%s/0" % topics[1].encode()], rounds[1][0][b"%s/1" % topics[1].encode()])]
        assert bodies == [b"%s/0" % topics[1].encode(), b"%s/1" % topics[1].encode()]


def test_batches_being_retried_do_not_hold_back_the_brokers_other_batches(watched):
    """More batches than a broker's requests in flight keep failing and retrying (a queue the
    topic does not have, retried with long backoffs): a good batch sent meanwhile is stored at
    once, before any of them gives up."""
    broker, _, topics = watched
    with Producer([broker.address], linger_ms=1, retries=3, retry_backoff_ms=1000) as producer:
        producer.send(topics[0], b"warm-up")
        failing = []
        for topic in topics[:8]:  # each due alone: the broker has answered the one before
            failing.append(producer.send_async(topic, b"nowhere", queue=99))
            time.sleep(0.05)
        good = producer.send_async(topics[-1], b"good")
        result = good.result(timeout=60)
        assert not any(f.done() for f in failing)
        assert result.topic == topics[-1]
        for future in failing:
            with pytest.raises(QueueNotFoundError):
                future.result(timeout=60)


def test_batches_of_many_topics_go_out_once_lingered_without_flush(watched):
    """The accumulator keeps one linger timer for all its open batches: batches opened together,
    and batches opened after the timer went idle, each go out after linger_ms, never before,
    with no flush; a thread waiting on a result is woken by its batch's answer."""
    broker, _, topics = watched
    with Producer([broker.address], linger_ms=1500) as producer:
        for topic in topics:
            producer.send(topic, b"warm-up")
        first = [producer.send_async(topic, b"first") for topic in topics[:10]]
        assert not any(f.done() for f in first)  # lingering
        with pytest.raises(TimeoutError):
            first[0].result(timeout=0.01)
        assert {f.result(timeout=30).topic for f in first} == set(topics[:10])
        later = [producer.send_async(topic, b"later") for topic in topics[10:]]  # the timer was idle
        assert not any(f.done() for f in later)
        waiter_saw: list[object] = []
        waiter = threading.Thread(target=lambda: waiter_saw.append(later[-1].result(timeout=30)))
        waiter.start()
        seen: list[str] = []
        called = threading.Event()
        later[0].add_done_callback(lambda f: (seen.append(f.result().topic), called.set()))
        assert {f.result(timeout=30).topic for f in later} == set(topics[10:])
        waiter.join(30)
        assert called.wait(30) and seen == [topics[10]]
        assert [getattr(r, "topic", None) for r in waiter_saw] == [topics[-1]]
    _check_stored(broker.address, {b"first": first[0], b"later": later[-1]})


def test_a_busy_broker_gets_requests_of_few_open_batches_the_others_grow(watched):
    """While a broker has requests in flight, a request takes at most OPEN_BATCHES_PER_BUSY_REQUEST
    of its lingered (still open) batches; the others stay open, take more messages and go with a
    later request. The broker is paused so that its first requests stay unanswered while every
    topic's batch lingers; resumed, it gets the waiting batches in requests of at most that many,
    and every message is stored where its result says."""
    broker, _, topics = watched
    with Producer([broker.address], linger_ms=50) as producer:
        for topic in topics:
            producer.send(topic, b"warm-up")
        accumulator = producer._accumulator
        requests: list[tuple[int, int]] = []  # (requests of the broker in flight before it, batches)
        send_request = accumulator._send_request

        def spied(address, batches, slot):
            requests.append((accumulator._requests[address] - 1, len(batches)))
            return send_request(address, batches, slot)

        accumulator._send_request = spied  # type: ignore[method-assign]
        broker.pause()
        try:
            futures = {b"%s/first" % topic.encode(): producer.send_async(topic, b"%s/first" % topic.encode())
                       for topic in topics}
            deadline = time.monotonic() + 60
            while len(requests) < REQUESTS_PER_BROKER and time.monotonic() < deadline:
                time.sleep(0.05)  # the first lingered batches go out and wait in the paused broker
            assert len(requests) == REQUESTS_PER_BROKER
            waiting = len(topics) - sum(batches for _, batches in requests)
            assert waiting > OPEN_BATCHES_PER_BUSY_REQUEST
            futures |= {b"%s/more" % topic.encode(): producer.send_async(topic, b"%s/more" % topic.encode())
                        for topic in topics}  # the waiting batches take these too
        finally:
            broker.resume()
        for future in futures.values():
            future.result(timeout=60)
        later = requests[REQUESTS_PER_BROKER:]
    assert later[0] == (REQUESTS_PER_BROKER - 1, OPEN_BATCHES_PER_BUSY_REQUEST)  # the first slot freed
    assert all(batches <= OPEN_BATCHES_PER_BUSY_REQUEST for busy, batches in later if busy)
    _check_stored(broker.address, futures)
