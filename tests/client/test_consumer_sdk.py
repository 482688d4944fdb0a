"""The consumer's offset and flow controls: seek, seek_to_beginning/end, commit(offsets),
pause/resume, rebalance callbacks, and broadcasting consumers' own offset files."""

from __future__ import annotations

import time

import pytest
from client_helpers import QUEUES, consume

from gms.client import Admin, Consumer, Producer, TopicQueue
from gms.client.local_offsets import LocalOffsetStore

PER_QUEUE = 10


def fill(broker, topic: str, per_queue: int = PER_QUEUE) -> None:
    with Producer([broker.address]) as producer:
        producer.send_batch([{"topic": topic, "body": b"%d" % i, "queue": q}
                             for q in range(QUEUES) for i in range(per_queue)])


def wait_assigned(consumer: Consumer, count: int = QUEUES, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while len(consumer.assignment()) < count:
        assert time.monotonic() < deadline, "queues not assigned in time"
        consumer.poll(20)


def positions_known(consumer: Consumer) -> None:
    """Poll until every assigned queue knows where it starts."""
    deadline = time.monotonic() + 10
    while any(consumer.position(t, q) is None for t, q in consumer.assignment()):
        assert time.monotonic() < deadline
        consumer.poll(20)


def test_seek_and_seek_to_beginning_and_end(broker, topic):
    fill(broker, topic)
    with Consumer([broker.address], group="seek", subscription={topic: "*"}, start_from="first",
                  auto_commit=False) as consumer:
        assert len(consume(consumer, QUEUES * PER_QUEUE)) == QUEUES * PER_QUEUE
        consumer.seek(topic, 3, 7)
        assert consumer.position(topic, 3) == 7
        again = consume(consumer, 3, timeout_s=3)
        assert [(m.queue_id, m.queue_offset) for m in again] == [(3, 7), (3, 8), (3, 9)]
        consumer.seek_to_beginning([(topic, 0), (topic, 1)])
        assert sorted((m.queue_id, m.queue_offset) for m in consume(consumer, 2 * PER_QUEUE, timeout_s=3)) == \
            sorted((q, o) for q in (0, 1) for o in range(PER_QUEUE))
        consumer.seek_to_beginning()
        assert len(consume(consumer, QUEUES * PER_QUEUE, timeout_s=5)) == QUEUES * PER_QUEUE
        consumer.seek_to_end()
        assert all(consumer.position(topic, q) == PER_QUEUE for q in range(QUEUES))
        assert len(consume(consumer, 1, timeout_s=0.5)) == 0


def test_commit_explicit_offsets_is_where_the_group_resumes(broker, topic):
    fill(broker, topic)
    with Consumer([broker.address], group="explicit", subscription={topic: "*"}, start_from="first",
                  auto_commit=False) as consumer:
        wait_assigned(consumer)
        consumer.commit({(topic, q): 5 for q in range(QUEUES)} | {(topic, 2): 9})
    with Consumer([broker.address], group="explicit", subscription={topic: "*"}, start_from="first",
                  auto_commit=False) as consumer:
        got = consume(consumer, QUEUES * 5 - 4, timeout_s=5)
    assert sorted((m.queue_id, m.queue_offset) for m in got) == sorted(
        [(q, o) for q in range(QUEUES) if q != 2 for o in range(5, PER_QUEUE)] + [(2, 9)])


def test_pause_and_resume(broker, topic):
    fill(broker, topic)
    with Consumer([broker.address], group="pause", subscription={topic: "*"}, start_from="first") as consumer:
        wait_assigned(consumer)
        paused = [(topic, q) for q in range(4)]
        consumer.pause(paused)
        assert consumer.paused() == paused
        got = consume(consumer, (QUEUES - 4) * PER_QUEUE, timeout_s=5)
        assert {m.queue_id for m in got} == set(range(4, QUEUES))
        assert consume(consumer, 1, timeout_s=0.5) == []
        consumer.resume(paused[:2])
        assert consumer.paused() == paused[2:]
        got = consume(consumer, 2 * PER_QUEUE, timeout_s=5)
        assert sorted((m.queue_id, m.queue_offset) for m in got) == [(q, o) for q in (0, 1) for o in range(PER_QUEUE)]


def test_rebalance_callbacks_run_inside_poll(broker, topic):
    events: list[tuple[str, str, list]] = []

    def member(name: str) -> Consumer:
        return Consumer([broker.address], group="callbacks", subscription={topic: "*"}, heartbeat_interval_ms=100,
                        on_assigned=lambda queues: events.append((name, "assigned", queues)),
                        on_revoked=lambda queues: events.append((name, "revoked", queues)))

    first = member("first")
    assert events == []  # not before poll
    first.poll(10)
    assert events == [("first", "assigned", [(topic, q) for q in range(QUEUES)])]
    second = member("second")
    try:
        deadline = time.monotonic() + 10
        while not any(e[:2] == ("second", "assigned") for e in events):
            assert time.monotonic() < deadline, events
            first.poll(20)
            second.poll(20)
        revoked = [q for name, kind, queues in events if (name, kind) == ("first", "revoked") for q in queues]
        given = [q for name, kind, queues in events if (name, kind) == ("second", "assigned") for q in queues]
        assert sorted(revoked) == sorted(given) and len(given) == QUEUES // 2
    finally:
        second.close()
        first.close()


def test_broadcasting_consumers_resume_from_their_own_offset_files(broker, topic, tmp_path):
    fill(broker, topic, per_queue=5)

    def instance(name: str) -> Consumer:
        return Consumer([broker.address], group="bc-durable", subscription={topic: "*"}, mode="broadcasting",
                        start_from="first", instance_name=name, offset_dir=tmp_path)

    with instance("one") as consumer:
        assert len(consume(consumer, QUEUES * 5)) == QUEUES * 5
        consumer.commit()
    assert (tmp_path / "bc-durable" / "one.json").exists()
    fill(broker, topic, per_queue=1)
    with instance("one") as consumer:  # restarted: only what came since
        got = consume(consumer, QUEUES + 1, timeout_s=3)
    assert sorted((m.queue_id, m.queue_offset) for m in got) == [(q, 5) for q in range(QUEUES)]
    with instance("two") as consumer:  # another instance keeps its own
        assert len(consume(consumer, QUEUES * 6 + 1, timeout_s=3)) == QUEUES * 6


def test_a_member_cut_off_for_a_member_expiry_gives_its_queues_up_and_rejoins(broker_factory, tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nmember_expiry_ms = 1500\n")
    broker = broker_factory("--config", str(config))
    topic = "fenced"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, queues=2)
    lost: list[list] = []
    with Consumer([broker.address], group="fence", subscription={topic: "*"},
                  on_revoked=lost.append) as consumer:
        wait_assigned(consumer, 2)
        broker.pause()  # SIGSTOP: no heartbeat is answered
        try:
            deadline = time.monotonic() + 10
            while consumer.assignment():
                assert time.monotonic() < deadline, "the member kept its queues"
                consumer.poll(100)
        finally:
            broker.resume()
        consumer.poll(10)  # on_revoked runs inside poll
        assert lost and sorted(q for queues in lost for q in queues) == [(topic, 0), (topic, 1)]
        wait_assigned(consumer, 2)  # joined again


def test_local_offset_store_merges_and_replaces_its_file_whole(tmp_path):
    store = LocalOffsetStore(tmp_path, "g", "host-1")
    store.commit({TopicQueue("t", 0): 5, TopicQueue("t", 1): 7})
    store.commit({TopicQueue("t", 1): 9, TopicQueue("u", 0): 1})
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["host-1.json"]  # no temporary left
    reloaded = LocalOffsetStore(tmp_path, "g", "host-1")
    assert [reloaded.get(TopicQueue(*q)) for q in (("t", 0), ("t", 1), ("u", 0), ("u", 1))] == [5, 9, 1, None]
    with pytest.raises(ValueError, match="instance name"):
        LocalOffsetStore(tmp_path, "g", "../escape")
