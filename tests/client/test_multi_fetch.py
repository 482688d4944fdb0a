"""FETCH, the multi-queue fetch, against a real broker: a group of hundreds of topics reads
every message once in queue order; a topic deleted while subscribed is given up alone; bad
requests get clear errors and the broker serves on."""

from __future__ import annotations

import time
import uuid

import pytest

from gms.client import Admin, Consumer, Producer, ProducerRecord
from gms.errors import BadRequestError, GmsError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode, Status
from gms.protocol.fetch import EARLIEST, FETCH_QUEUES_MAX, decode_fetch_answer

TOPICS = 200
QUEUES = 2
PER_QUEUE = 5


def fetch(address: str, fields: dict, timeout_ms: float = 10_000):
    """One FETCH on a connection of its own: (rows, body)."""
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            frame = await conn.request(RequestCode.FETCH, fields, timeout_ms=timeout_ms)
            return decode_fetch_answer(frame.fields, len(frame.body)), bytes(frame.body)
        finally:
            conn.close()

    return run(main())


def test_a_group_of_200_topics_reads_every_message_once_in_queue_order(broker):
    prefix = f"mf-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:03d}" for i in range(TOPICS)]
    with Admin([broker.address]) as admin:
        assert not [r for r in admin.create_topics([(t, QUEUES) for t in topics]) if r.error]
    expected: dict[tuple[str, int], list[bytes]] = {}
    with Producer([broker.address]) as producer:
        records = []
        for n in range(PER_QUEUE):
            for topic in topics:
                for queue in range(QUEUES):
                    body = f"{topic}/{queue}/{n}".encode()
                    expected.setdefault((topic, queue), []).append(body)
                    records.append(ProducerRecord(topic, body, queue=queue))
        producer.send_batch(records)
    got: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    total = TOPICS * QUEUES * PER_QUEUE
    with Consumer([broker.address], group=f"g-{prefix}", subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False) as consumer:
        deadline = time.monotonic() + 60
        count = 0
        while count < total and time.monotonic() < deadline:
            for m in consumer.poll(500):
                got.setdefault((m.topic, m.queue_id), []).append((m.queue_offset, m.body))
                count += 1
        time.sleep(0.5)  # nothing more comes (no message twice)
        for m in consumer.poll(200):
            got.setdefault((m.topic, m.queue_id), []).append((m.queue_offset, m.body))
    assert {q: [b for _, b in messages] for q, messages in got.items()} == expected
    assert all([o for o, _ in messages] == list(range(PER_QUEUE)) for messages in got.values())


def test_a_topic_deleted_while_subscribed_is_given_up_and_the_others_go_on(broker, caplog):
    doomed, kept = f"del-{uuid.uuid4().hex[:6]}", f"keep-{uuid.uuid4().hex[:6]}"
    revoked: list = []
    with Admin([broker.address]) as admin:
        admin.create_topic(doomed, queues=2)
        admin.create_topic(kept, queues=2)
        with Producer([broker.address]) as producer, \
                Consumer([broker.address], group=f"g-{doomed}", subscription={doomed: "*", kept: "*"},
                         start_from="first", on_revoked=revoked.extend) as consumer:
            producer.send(doomed, b"before")
            producer.send(kept, b"before")
            bodies = []
            deadline = time.monotonic() + 20
            while len(bodies) < 2 and time.monotonic() < deadline:
                bodies += [m.body for m in consumer.poll(200)]
            assert sorted(bodies) == [b"before", b"before"]
            admin.delete_topic(doomed)
            deadline = time.monotonic() + 30
            while {q.topic for q in consumer.assignment()} != {kept}:
                assert time.monotonic() < deadline, consumer.assignment()
                consumer.poll(200)
            producer.send(kept, b"after")
            after = []
            while not after:
                assert time.monotonic() < deadline
                after += [(m.topic, m.body) for m in consumer.poll(200)]
            assert after == [(kept, b"after")]
    assert {q.topic for q in revoked} == {doomed}
    assert f"subscribed topic {doomed} no longer exists" in caplog.text


def test_each_queue_fails_alone_and_the_broker_serves_on(broker, topic):
    with Producer([broker.address]) as producer:
        producer.send(topic, b"x", queue=0)
    rows, body = fetch(broker.address, {"queues": [[topic, 0, 0], [topic, 1, 5], ["no-such-topic", 0, 0],
                                                   [topic, 99, 0]]})
    by_queue = {(r.topic, r.queue_id): r for r in rows}
    assert by_queue[topic, 0].status == Status.SUCCESS and by_queue[topic, 0].next_offset == 1 and body
    assert by_queue[topic, 1].status == Status.OFFSET_ILLEGAL and by_queue[topic, 1].max_offset == 0
    assert by_queue["no-such-topic", 0].status == Status.TOPIC_NOT_FOUND
    assert by_queue[topic, 99].status == Status.QUEUE_NOT_FOUND
    rows, _ = fetch(broker.address, {"queues": [[topic, 0, EARLIEST], [topic, 1, EARLIEST]]})
    assert [(r.queue_id, r.next_offset) for r in rows] == [(0, 1), (1, 0)]


@pytest.mark.parametrize("fields, says", [
    ({}, "'queues' is required"),
    ({"queues": "t"}, "'queues' must be list"),
    ({"queues": []}, "must list 1..10000 queues"),
    ({"queues": [["t", 0, 0]] * (FETCH_QUEUES_MAX + 1)}, "must list 1..10000 queues"),
    ({"queues": [["t", "0", 0]]}, "queue_id"),
    ({"queues": [["t", 0]]}, "rows of [topic, queue_id, offset]"),
    ({"queues": [["t", 0, 1 << 63]]}, "offset"),
    ({"queues": [["t", 0, 0], ["t", 0, 3]]}, "more than once"),
    ({"queues": [["t", 0, 0]], "filters": {"t": "*"}}, "[tags, sql]"),
    ({"queues": [["t", 0, 0]], "poll_ms": "soon"}, "'poll_ms'"),
])
def test_a_malformed_fetch_gets_bad_request_and_the_broker_serves_on(broker, topic, fields, says):
    with pytest.raises(BadRequestError, match=None) as caught:
        fetch(broker.address, fields)
    assert says in str(caught.value)
    rows, _ = fetch(broker.address, {"queues": [[topic, 0, 0]]})  # still serving
    assert rows == [] or rows[0].status == Status.SUCCESS


def test_a_bad_filter_fails_its_topic_only(broker, topic):
    with Producer([broker.address]) as producer:
        producer.send(topic, b"x", queue=0, tag="a")
    rows, _ = fetch(broker.address, {"queues": [[topic, 0, 0], ["other", 0, 0]],
                                     "filters": {topic: ["a ||| b", ""]}})
    assert {r.topic: r.status for r in rows}[topic] == Status.BAD_TAG_EXPRESSION
    with pytest.raises(GmsError):
        fetch(broker.address, {"queues": [[topic, 0, 0]], "group": 5})


def test_a_parked_fetch_answers_when_any_of_its_queues_gets_a_message(broker, admin):
    topics = [f"park-{uuid.uuid4().hex[:6]}-{i}" for i in range(50)]
    assert not [r for r in admin.create_topics([(t, 2) for t in topics]) if r.error]

    async def main():
        host, port = broker.address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            import asyncio
            pending = asyncio.ensure_future(conn.request(
                RequestCode.FETCH, {"queues": [[t, q, 0] for t in topics for q in range(2)], "poll_ms": 20_000},
                timeout_ms=30_000))
            await asyncio.sleep(0.5)
            assert not pending.done()  # nothing yet: parked
            await asyncio.to_thread(_send, broker.address, topics[37])
            frame = await pending
            return decode_fetch_answer(frame.fields, len(frame.body))
        finally:
            conn.close()

    rows = run(main())
    assert [(r.topic, r.queue_id, r.next_offset) for r in rows] == [(topics[37], 1, 1)]


def test_a_fetch_whose_budget_runs_out_leaves_the_queues_past_it_unclaimed(broker, admin):
    """The broker admits a FETCH's queues (claims, index reads) a segment at a time and stops
    where the byte budget runs out: a queue past it was not read, so another member of the group
    may read it at once (no QUEUE_HELD), and the first member's next request reads it."""
    prefix = f"budget-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:03d}" for i in range(160)]  # 320 queues: more than one segment
    assert not [r for r in admin.create_topics([(t, 2) for t in topics]) if r.error]
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord(t, b"x" * 1000, queue=q) for t in (topics[0], topics[-1]) for q in (0, 1)])
    group = f"g-{prefix}"
    queues = [[t, q, 0] for t in topics for q in range(2)]
    rows, _ = fetch(broker.address, {"queues": queues, "max_total_bytes": 1, "group": group, "member": "m1"})
    assert [(r.topic, r.queue_id, r.status) for r in rows] == [(topics[0], 0, Status.SUCCESS)]
    rows, _ = fetch(broker.address, {"queues": [[topics[-1], 1, 0]], "group": group, "member": "m2"})
    assert [(r.topic, r.queue_id, r.status, r.next_offset) for r in rows] == [(topics[-1], 1, Status.SUCCESS, 1)]
    rows, _ = fetch(broker.address, {"queues": queues[1:], "group": group, "member": "m1"})
    assert {(r.topic, r.queue_id): r.status for r in rows} == {
        (topics[0], 1): Status.SUCCESS, (topics[-1], 0): Status.SUCCESS, (topics[-1], 1): Status.QUEUE_HELD}


def _send(address: str, topic: str) -> None:
    with Producer([address]) as producer:
        producer.send(topic, b"wake", queue=1)


def test_more_queues_than_one_fetch_names_go_out_in_several_requests(broker, monkeypatch):
    """A request naming thousands of queues stops where its byte budget runs out and the next
    names them all again (the broker re-reads the drained ones): the consumer splits a broker's
    queues into requests of FETCH_REQUEST_QUEUES at most, and reads every message once."""
    from gms.client import fetcher
    from gms.client.connections import ConnectionPool

    monkeypatch.setattr(fetcher, "FETCH_REQUEST_QUEUES", 16, raising=False)
    asked: list[list[tuple[str, int]]] = []
    request = ConnectionPool.request

    async def spied(self, address, code, fields=None, *args, **kwargs):
        if code == RequestCode.FETCH:
            asked.append([(t, q) for t, q, _ in fields["queues"]])
        return await request(self, address, code, fields, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "request", spied)
    prefix = f"split-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:02d}" for i in range(20)]
    with Admin([broker.address]) as admin:
        assert not [r for r in admin.create_topics([(t, QUEUES) for t in topics]) if r.error]
    expected = {(t, q): [f"{t}/{q}/{n}".encode() for n in range(PER_QUEUE)] for t in topics for q in range(QUEUES)}
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord(t, body, queue=q)
                             for (t, q), bodies in expected.items() for body in bodies])
    got: dict[tuple[str, int], list[bytes]] = {}
    with Consumer([broker.address], group=f"g-{prefix}", subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False, long_poll_ms=500) as consumer:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < len(expected) * PER_QUEUE and time.monotonic() < deadline:
            for m in consumer.poll(500):
                got.setdefault((m.topic, m.queue_id), []).append(m.body)
        time.sleep(1.5)  # idle long polls go on (and nothing comes twice)
        for m in consumer.poll(200):
            got.setdefault((m.topic, m.queue_id), []).append(m.body)
    assert got == expected
    assert max(map(len, asked)) <= 16
    assert set(expected) <= {q for queues in asked for q in queues}  # and the group's retry topic


def test_once_an_answer_runs_out_of_bytes_requests_name_as_many_queues_and_those_with_records_first(broker,
                                                                                                    monkeypatch):
    """A request naming more queues than its answer's byte budget holds makes the broker decode,
    and the consumer name again, those past where it ran out: the next requests name as many
    queues as that answer held, those with records to read before those caught up (which wait
    in requests of their own); every message still comes once."""
    from gms.client import fetcher
    from gms.client.connections import ConnectionPool

    monkeypatch.setattr(fetcher, "FETCH_TOTAL_BYTES_DEFAULT", 30_000)
    monkeypatch.setattr(fetcher, "FETCH_FIT_QUEUES_MIN", 1)
    asked: list[list[tuple[str, int]]] = []
    answered: list[list[tuple[tuple[str, int], bool]]] = []  # (queue, caught up) per row
    request = ConnectionPool.request

    async def spied(self, address, code, fields=None, *args, **kwargs):
        if code != RequestCode.FETCH:
            return await request(self, address, code, fields, *args, **kwargs)
        asked.append([(t, q) for t, q, _ in fields["queues"]])
        frame = await request(self, address, code, fields, *args, **kwargs)
        answered.append([((r.topic, r.queue_id), r.next_offset >= r.max_offset)
                         for r in decode_fetch_answer(frame.fields, len(frame.body))])
        return frame

    monkeypatch.setattr(ConnectionPool, "request", spied)
    prefix = f"fits-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:02d}" for i in range(20)]
    with Admin([broker.address]) as admin:
        assert not [r for r in admin.create_topics([(t, QUEUES) for t in topics]) if r.error]
    per_queue = 8
    expected = {(t, q): [f"{t}/{q}/{n}".encode().ljust(1000, b".") for n in range(per_queue)]
                for t in topics for q in range(QUEUES)}
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord(t, body, queue=q)
                             for (t, q), bodies in expected.items() for body in bodies])
    got: dict[tuple[str, int], list[bytes]] = {}
    with Consumer([broker.address], group=f"g-{prefix}", subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False, long_poll_ms=5000, fetch_max_bytes=10_000) as consumer:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < len(expected) * per_queue and time.monotonic() < deadline:
            for m in consumer.poll(500):
                got.setdefault((m.topic, m.queue_id), []).append(m.body)
    assert got == expected
    first = answered[0]
    assert set(expected) <= set(asked[0]) and 0 < len(first) < len(expected)  # one request (and the retry
    # topic's queue), cut by the byte budget
    assert all(len(queues) <= len(first) for queues in asked[1:4])
    assert not {queue for queue, caught_up in first if caught_up} & set(asked[1])


def test_idle_answers_leave_requests_whole_when_one_queue_may_fill_an_answer(broker, monkeypatch):
    """With ``fetch_max_bytes`` as large as an answer, an idle answer (nothing to read) is not
    taken for one its byte budget cut: the queues are still asked for in one request, not one each."""
    from gms.client import fetcher
    from gms.client.connections import ConnectionPool
    from gms.protocol.fetch import FETCH_BYTES_MAX

    monkeypatch.setattr(fetcher, "FETCH_TOTAL_BYTES_DEFAULT", FETCH_BYTES_MAX)
    asked: list[int] = []
    request = ConnectionPool.request

    async def spied(self, address, code, fields=None, *args, **kwargs):
        if code == RequestCode.FETCH:
            asked.append(len(fields["queues"]))
        return await request(self, address, code, fields, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "request", spied)
    prefix = f"idle-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:02d}" for i in range(20)]
    with Admin([broker.address]) as admin:
        assert not [r for r in admin.create_topics([(t, QUEUES) for t in topics]) if r.error]
    with Consumer([broker.address], group=f"g-{prefix}", subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False, long_poll_ms=200, fetch_max_bytes=FETCH_BYTES_MAX) as consumer:
        while len(asked) < 4:  # a few idle answers
            assert not consumer.poll(100)
        with Producer([broker.address]) as producer:
            producer.send_batch([ProducerRecord(t, b"x", queue=q) for t in topics for q in range(QUEUES)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(topics) * QUEUES and time.monotonic() < deadline:
            got += consumer.poll(500)
    assert len(got) == len(topics) * QUEUES
    assert asked[:4] == [asked[0]] * 4 and asked[0] > len(topics) * QUEUES  # and the retry topic's queue


def test_polls_cut_across_queues_hand_out_each_message_once_and_commit_where_they_stopped(broker):
    """A poll smaller than an answer cuts its queues' ranges (7 messages of queues of 9) and joins
    those of consecutive queues: every message once in queue order, positions and commits past
    the last message handed out, a seek reads its queue again alone."""
    prefix = f"mc-{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}-{i:02d}" for i in range(30)]
    per_queue = 9
    with Admin([broker.address]) as admin:
        assert not [r for r in admin.create_topics([(t, QUEUES) for t in topics]) if r.error]
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord(t, f"{t}/{q}/{n}".encode(), queue=q)
                             for n in range(per_queue) for t in topics for q in range(QUEUES)])
    total = len(topics) * QUEUES * per_queue
    group = f"g-{prefix}"

    def read(consumer: Consumer, count: int) -> dict[tuple[str, int], list[int]]:
        got: dict[tuple[str, int], list[int]] = {}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < count and time.monotonic() < deadline:
            polled = consumer.poll(500)
            assert len(polled) <= 7
            for m in polled:
                assert m.body == f"{m.topic}/{m.queue_id}/{m.queue_offset}".encode()
                got.setdefault((m.topic, m.queue_id), []).append(m.queue_offset)
        return got

    with Consumer([broker.address], group=group, subscription=dict.fromkeys(topics, "*"), start_from="first",
                  auto_commit=False, max_poll_messages=7) as consumer:
        got = read(consumer, total)
        assert got == {(t, q): list(range(per_queue)) for t in topics for q in range(QUEUES)}
        assert {consumer.position(t, q) for t in topics for q in range(QUEUES)} == {per_queue}
        consumer.commit()
        consumer.seek(topics[3], 1, 4)
        assert read(consumer, per_queue - 4) == {(topics[3], 1): list(range(4, per_queue))}
        assert not consumer.poll(300)
    with Consumer([broker.address], group=group, subscription=dict.fromkeys(topics, "*"), start_from="first",
                  auto_commit=False) as again:
        assert not again.poll(1000)  # committed past the last message of every queue
