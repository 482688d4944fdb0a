"""The store's conformance suite: what the broker's services need of a store (StoreAPI), run
against every implementation in store_impls.IMPLEMENTATIONS (as NATS runs one suite against each
StreamStore). Only StoreAPI is used, on real files: appends and reads, offsets, topics, lookups by
key, time and position, truncation, retention, a reopen after close and a crash with a torn tail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_impls import IMPLEMENTATIONS, StoreImpl

from gms import record as rec
from gms.broker.store import GetStatus, QueueGet, StoreAPI
from gms.broker.store.topic_table import TopicLimits
from gms.record import Message, encode_batch, tag_hash
from gms.store_errors import MessageNotFound, StoreClosed, UnknownQueue, UnknownTopic


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request) -> StoreImpl:
    return IMPLEMENTATIONS[request.param]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(impl: StoreImpl, root: Path):
    s = impl.open(root, {})
    s.create_topic("t", 2)
    yield s
    s.close()


def send(store: StoreAPI, bodies: list[str], queue_id: int = 0, topic: str = "t", **fields) -> list[int]:
    """Append ``bodies`` as one send (one record: the single-record path); their queue offsets."""
    result = store.append(encode_batch([Message(topic, b.encode(), queue_id=queue_id, **fields) for b in bodies]))
    return result.queue_offsets.tolist()


def bodies(store: StoreAPI, queue_id: int = 0, offset: int = 0, topic: str = "t", **kwargs) -> list[str]:
    got = store.get(topic, queue_id, offset, 1000, **kwargs)
    return [bytes(rec.decode_record(view).body).decode() for view in got.records]


def test_appends_take_the_next_offsets_of_their_queue_and_read_back(store):
    assert send(store, ["a"]) == [0]
    assert send(store, ["b", "c"]) == [1, 2]
    assert send(store, ["x"], queue_id=1) == [0]
    result = store.append(encode_batch([Message("t", b"d", queue_id=0), Message("t", b"y", queue_id=1)]))
    assert result.queue_offsets.tolist() == [3, 1] and result.touched_queues == [("t", 0), ("t", 1)]
    assert bodies(store) == ["a", "b", "c", "d"] and bodies(store, 1) == ["x", "y"]
    assert bodies(store, offset=2) == ["c", "d"]
    assert (store.min_offset("t", 0), store.max_offset("t", 0)) == (0, 4)
    got = store.get("t", 0, 1, max_msgs=2)
    assert got.status is GetStatus.FOUND and got.next_offset == 3 and got.offsets.tolist() == [1, 2]


def test_get_answers_the_end_of_a_queue_and_beyond_and_a_read_limit(store):
    send(store, ["a", "b", "c"])
    assert store.get("t", 0, 3).status is GetStatus.NO_NEW_MESSAGE
    assert store.get("t", 0, 4).status is GetStatus.OFFSET_OVERFLOW
    limited = store.get("t", 0, 0, read_limit=2)
    assert len(limited.records) == 2 and limited.max_offset == 2
    assert store.get("t", 0, 2, read_limit=2).status is GetStatus.NO_NEW_MESSAGE


def test_get_filters_by_tag_and_bytes(store):
    store.append(encode_batch([Message("t", b"%d" % i, tag="even" if i % 2 == 0 else "odd") for i in range(10)]))
    assert bodies(store, tag_hashes=frozenset({tag_hash("odd")})) == ["1", "3", "5", "7", "9"]
    assert store.get("t", 0, 0, tag_hashes=frozenset({tag_hash("none")})).status is GetStatus.NO_MATCHED_MESSAGE
    assert len(store.get("t", 0, 0, max_bytes=1).records) == 1  # at least one record, whatever its size


def test_get_many_answers_each_queue_as_get_does_within_a_total_budget(store):
    send(store, ["a", "b", "c"])
    send(store, ["x" * 100, "y"], queue_id=1)
    store.create_topic("u", 1)
    queues = [QueueGet("t", 0, 1), QueueGet("t", 1, 0, read_limit=1), QueueGet("t", 0, 3), QueueGet("t", 0, 9),
              QueueGet("nope", 0, 0), QueueGet("t", 7, 0), QueueGet("u", 0, 0)]
    got = store.get_many(queues, max_msgs=1000)
    for want, found in zip(queues[:4] + queues[6:], got[:4] + got[6:], strict=True):
        single = store.get(want.topic, want.queue_id, want.offset, 1000, read_limit=want.read_limit, coalesce=True)
        assert (found.status, found.next_offset, found.min_offset, found.max_offset) == single[:4]
        assert b"".join(found.records) == b"".join(single.records)
    assert [r.status for r in got[:4] + got[6:]] == [GetStatus.FOUND, GetStatus.FOUND, GetStatus.NO_NEW_MESSAGE,
                                                     GetStatus.OFFSET_OVERFLOW, GetStatus.NO_NEW_MESSAGE]
    assert got[0].offsets.tolist() == [1, 2] and got[1].offsets.tolist() == [0] and got[1].max_offset == 1
    assert isinstance(got[4], UnknownTopic) and isinstance(got[5], UnknownQueue)
    # The total: each queue reads at most what is left of it (at least a record); none is read once it is spent.
    first = sum(view.nbytes for view in got[0].records)
    spent = store.get_many([*queues[:2], QueueGet("t", 0, 0)], max_msgs=1000, total_bytes=first + 1)
    assert len(spent) == 2 and len(spent[1].offsets) == 1
    assert len(store.get_many(queues[:3], max_msgs=1000, total_bytes=first)) == 1


def test_unknown_topics_and_queues_are_errors_and_store_nothing(store):
    with pytest.raises(UnknownTopic):
        send(store, ["a"], topic="nope")
    with pytest.raises(UnknownQueue):
        send(store, ["a", "b"], queue_id=2)
    with pytest.raises(UnknownTopic):
        store.get("nope", 0, 0)
    assert store.max_offset("t", 0) == 0 and store.stats().max_offset == 0


def test_records_are_found_by_position_queue_offset_key_and_time(store):
    before_ms = int(time.time() * 1000)
    result = store.append(encode_batch([Message("t", b"a", keys=["order-1"]), Message("t", b"b", keys=["order-2"])]))
    time.sleep(0.01)
    after_ms = int(time.time() * 1000)
    send(store, ["c"], keys=["order-1"])
    assert bytes(rec.decode_record(store.read_at(int(result.phys_offsets[1]))).body) == b"b"
    assert bytes(rec.decode_record(store.read_entry("t", 0, 2)).body) == b"c"
    with pytest.raises(MessageNotFound):
        store.read_entry("t", 0, 3)
    assert [bytes(rec.decode_record(v).body) for v in store.find_by_key("t", "order-1")] == [b"c", b"a"]
    assert store.find_by_key("t", "order-3") == []
    assert store.offset_for_timestamp("t", 0, before_ms) == 0
    assert store.offset_for_timestamp("t", 0, after_ms) == 2
    assert store.offset_for_timestamp("t", 0, after_ms + 3_600_000) == 3


def test_a_duplicate_batch_is_answered_with_where_it_was_stored(store):
    first = store.append(encode_batch([Message("t", b"a"), Message("t", b"b")]))
    again = store.batch_result(("t", 0), 0, 2)
    assert again.queue_offsets.tolist() == first.queue_offsets.tolist()
    assert again.phys_offsets.tolist() == first.phys_offsets.tolist()


def test_topics_are_created_updated_and_deleted(store):
    store.create_topics_async({"u": (3, TopicLimits(retention_ms=60_000))}).result(10)
    assert store.topics() == {"t": 2, "u": 3}
    assert store.topic_limits("u").retention_ms == 60_000
    store.update_topic_async("u", 4, TopicLimits(message_size_bytes_max=1000)).result(10)
    assert store.topics()["u"] == 4 and store.topic_limits("u").message_size_bytes_max == 1000
    assert send(store, ["x"], queue_id=3, topic="u") == [0]
    store.delete_topics(["u"]).result(10)
    assert store.topics() == {"t": 2}
    with pytest.raises(UnknownTopic):
        store.get("u", 3, 0)
    store.create_topic("u", 4)  # a new incarnation starts empty
    assert store.max_offset("u", 3) == 0


def test_a_truncated_queue_continues_at_the_cut_also_after_a_reopen(impl, root, store):
    send(store, [f"m{i}" for i in range(6)])
    send(store, ["other"], queue_id=1)
    store.truncate_queue("t", 0, 4)
    assert store.max_offset("t", 0) == 4 and bodies(store) == ["m0", "m1", "m2", "m3"]
    assert send(store, ["new"]) == [4]
    store.close()
    reopened = impl.open(root, {})
    try:
        assert bodies(reopened) == ["m0", "m1", "m2", "m3", "new"] and bodies(reopened, 1) == ["other"]
    finally:
        reopened.close()


def test_retention_expires_records_older_than_their_topics_retention(store):
    store.create_topic("short", 1, TopicLimits(retention_ms=1000))
    send(store, ["kept"])
    for _ in range(40):  # enough to fill several commitlog files
        send(store, ["x" * 4000], topic="short")
    stored_ms = int(time.time() * 1000)
    store.delete_expired(now_ms=stored_ms - 60_000)  # nothing old enough yet
    assert store.min_offset("short", 0) == 0
    store.delete_expired(now_ms=stored_ms + 60_000)
    assert store.min_offset("short", 0) == store.max_offset("short", 0) == 40
    assert store.get("short", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
    assert bodies(store) == ["kept"]  # the default retention (hours) keeps the other topic's


def test_a_reopened_store_holds_what_was_stored(impl, root, store):
    send(store, ["a", "b"], keys=["k"])
    send(store, ["c"], queue_id=1)
    store.close()
    with pytest.raises(StoreClosed):
        send(store, ["late"])
    reopened = impl.open(root, {})
    try:
        assert bodies(reopened) == ["a", "b"] and bodies(reopened, 1) == ["c"]
        assert len(reopened.find_by_key("t", "k")) == 2
        assert send(reopened, ["d"]) == [2]
    finally:
        reopened.close()


def test_a_crash_keeps_every_acknowledged_record_and_serves_no_torn_one(impl, root, tmp_path):
    """A writer killed (SIGKILL) after its acknowledged appends, its last write torn: reopened,
    the store serves every acknowledged record, nothing of the torn one, and continues the queues."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here)}
    name = next(n for n, i in IMPLEMENTATIONS.items() if i is impl)
    child = subprocess.Popen([sys.executable, str(here / "store_conformance_writer.py"), name, str(root), "25"],
                             stdout=subprocess.PIPE, env=env, text=True)
    acked: list[tuple[int, int]] = []
    try:
        while len(acked) < 25:
            line = child.stdout.readline()
            assert line, "the writer died"
            acked.append(tuple(map(int, line.split())))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    records, end = acked[-1]
    impl.tear_tail(root, end)
    store = impl.open(root, {})
    try:
        for q in (0, 1):
            assert bodies(store, q) == [f"{i:08d}" for i in range(q, records, 2)]
        assert store.stats().max_offset == end
        assert len(store.find_by_key("t", f"k{records - 1}")) == 1
        assert send(store, ["after"]) == [records // 2]
    finally:
        store.close()
