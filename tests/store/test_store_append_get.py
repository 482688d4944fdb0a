import os
import struct
import threading
import time

import numpy as np
import pytest
from store_helpers import batch, small_config

from gms import record as rec
from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_config import StoreConfig


def bodies(result):
    return [bytes(rec.decode_record(v).body) for v in result.records]


def test_append_and_get_round_trip(store):
    result = store.append(batch(n=5))
    assert list(result.queue_offsets) == [0, 1, 2, 3, 4]
    assert list(result.queue_ids) == [0] * 5
    assert result.end_phys_offset == store.flushed_offset or result.end_phys_offset > 0
    got = store.get("t", 0, 0, 100)
    assert got.status is GetStatus.FOUND and got.next_offset == 5
    assert bodies(got) == [b"body-%d" % i for i in range(5)]
    for i, view in enumerate(got.records):
        r = rec.decode_record(view)
        assert (r.queue_offset, r.phys_offset, r.queue_id) == (i, int(result.phys_offsets[i]), 0)
        assert bytes(store.read_at(r.phys_offset)) == bytes(view)
    assert store.get("t", 0, 5, 10).status is GetStatus.NO_NEW_MESSAGE
    assert store.get("t", 0, 9, 10).status is GetStatus.OFFSET_OVERFLOW


def test_batch_across_topics_and_queues(store):
    store.create_topic("u", 2)
    msgs = [rec.Message("t" if i % 3 else "u", b"m%d" % i, queue_id=i % 2) for i in range(30)]
    result = store.append(rec.encode_batch(msgs))
    seen: dict[tuple[str, int], list[int]] = {}
    for m, qo in zip(msgs, result.queue_offsets.tolist(), strict=True):
        seen.setdefault((m.topic, m.queue_id), []).append(qo)
    for offsets in seen.values():
        assert offsets == list(range(len(offsets)))  # per queue, in batch order, no gaps
    store.append(rec.encode_batch(msgs))
    for (topic, q), offsets in seen.items():
        assert store.max_offset(topic, q) == 2 * len(offsets)
        got = store.get(topic, q, 0, 1000)
        expected = [m.body for m in msgs if (m.topic, m.queue_id) == (topic, q)] * 2
        assert bodies(got) == expected


def test_file_roll_at_boundary(store):
    # 4 KiB commitlog files: 60 records of ~88 bytes span several files, each ending in a blank marker
    for i in range(6):
        store.append(batch(n=10, start=10 * i))
    files = store._commitlog.files
    assert len(files) >= 2
    for f in files[:-1]:
        scan = rec.scan_records(f.view, 0, f.size_bytes)
        assert scan.stop is rec.RecordCheck.BLANK
        assert f.size_bytes - scan.stop_pos >= rec.BLANK_MARKER_SIZE
    got = store.get("t", 0, 0, 1000)
    assert bodies(got) == [b"body-%d" % i for i in range(60)]


def test_batch_larger_than_a_file_is_split_at_record_boundaries(store):
    result = store.append(batch(n=120))  # ~10 KiB into 4 KiB files
    assert len({p // 4096 for p in result.phys_offsets.tolist()}) >= 3
    assert bodies(store.get("t", 0, 0, 1000)) == [b"body-%d" % i for i in range(120)]


def test_consume_queue_files_roll_at_100_entries(store):
    for i in range(25):
        store.append(batch(n=10, start=10 * i))
    cq = store._queues.queue("t", 0)
    assert len(cq.files) == 3 and cq.max_offset == 250
    got = store.get("t", 0, 95, 10)
    assert bodies(got) == [b"body-%d" % i for i in range(95, 105)]


def test_max_msgs_and_max_bytes(store):
    store.append(batch(n=20))
    got = store.get("t", 0, 3, 5)
    assert got.next_offset == 8 and len(got.records) == 5
    size = len(got.records[0])
    got = store.get("t", 0, 0, 100, max_bytes=3 * size)
    assert len(got.records) == 3 and got.next_offset == 3
    got = store.get("t", 0, 0, 100, max_bytes=1)  # at least one record, never stuck
    assert len(got.records) == 1 and got.next_offset == 1


def test_tag_filter_skips_without_reading(store):
    msgs = [rec.Message("t", b"m%d" % i, tag=f"tag{i % 10}") for i in range(100)]
    store.append(rec.encode_batch(msgs))
    got = store.get("t", 0, 0, 1000, tag_hashes=frozenset({rec.tag_hash("tag3")}))
    assert bodies(got) == [b"m%d" % i for i in range(3, 100, 10)]
    assert got.next_offset == 100
    got = store.get("t", 0, 0, 2, tag_hashes=frozenset({rec.tag_hash("tag3"), rec.tag_hash("tag4")}))
    assert bodies(got) == [b"m3", b"m4"] and got.next_offset == 5
    got = store.get("t", 0, 0, 10, tag_hashes=frozenset({rec.tag_hash("nope")}))
    assert got.status is GetStatus.NO_MATCHED_MESSAGE and got.next_offset == 100


def test_tag_filter_across_consume_queue_files(store_dir):
    """A window of entries read from two consumeQueue files is filtered like one from a single
    file (the entries joined in native byte order matched no tag: a filtered pull answered 'no
    match' for the whole window and the consumer went past its messages)."""
    with MessageStore(store_dir, small_config(cq_entries_per_file=16)) as store:
        store.create_topic("t", 1)
        store.append(rec.encode_batch([rec.Message("t", b"m%d" % i, tag=f"tag{i % 3}") for i in range(40)]))
        got = store.get("t", 0, 10, 1000, tag_hashes=frozenset({rec.tag_hash("tag1")}))
        assert bodies(got) == [b"m%d" % i for i in range(10, 40) if i % 3 == 1] and got.next_offset == 40


def _forge_tag_hash(raw: bytes, forged: int) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(">q", buf, rec.OFF_TAG_HASH, forged)
    rec.seal_crc(buf)
    return bytes(buf)


def test_tag_hash_collision_resolved_by_exact_tag(store_dir):
    with MessageStore(store_dir, small_config(verify_tag_hash=False)) as store:
        store.create_topic("t", 1)
        wanted = rec.encode_record(topic="t", body=b"right", tag="wanted")
        collider = _forge_tag_hash(rec.encode_record(topic="t", body=b"wrong", tag="other"), rec.tag_hash("wanted"))
        store.append(wanted + collider)
        got = store.get("t", 0, 0, 10, tag_hashes=frozenset({rec.tag_hash("wanted")}))
        assert bodies(got) == [b"right", b"wrong"]  # the store sees equal hashes
        exact = rec.filter_exact_tags(got.records, frozenset({"wanted"}))
        assert [bytes(rec.decode_record(v).body) for v in exact] == [b"right"]


def test_forged_tag_hash_rejected_when_verifying(store):
    from gms.store_errors import InvalidRecord
    forged = _forge_tag_hash(rec.encode_record(topic="t", body=b"x", tag="a"), 12345)
    with pytest.raises(InvalidRecord):
        store.append(forged)


def test_offset_for_timestamp(store):
    store.append(batch(n=3))
    time.sleep(0.01)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.01)
    store.append(batch(n=4, start=3))
    assert store.offset_for_timestamp("t", 0, 0) == 0
    assert store.offset_for_timestamp("t", 0, middle_ms) == 3
    assert store.offset_for_timestamp("t", 0, middle_ms + 60_000) == 7


def test_new_store_is_not_a_crash(store_dir):
    with MessageStore(store_dir, small_config()) as store:
        assert not store.recovered_from_crash


def test_restart_after_clean_stop(store_dir):
    with MessageStore(store_dir, small_config()) as store:
        store.create_topic("t", 2)
        for i in range(7):
            store.append(batch(n=10, start=10 * i, queue_id=i % 2))
    with MessageStore(store_dir, small_config()) as store:
        assert not store.recovered_from_crash
        assert store.topics() == {"t": 2}
        assert store.max_offset("t", 0) == 40 and store.max_offset("t", 1) == 30
        result = store.append(batch(n=1, start=99))
        assert result.queue_offsets.tolist() == [40]
        assert len(store.get("t", 0, 0, 1000).records) == 41


def test_durable_future_sync_mode(store_dir):
    with MessageStore(store_dir, small_config(flush_mode="sync")) as store:
        store.create_topic("t", 1)
        result = store.append(batch(n=3))
        assert store.durable_future(result.end_phys_offset).result(timeout=5) >= result.end_phys_offset
        assert store.flushed_offset >= result.end_phys_offset


def test_durable_future_async_mode(store):
    result = store.append(batch(n=3))
    assert store.durable_future(result.end_phys_offset).result(timeout=5) >= result.end_phys_offset


def test_topic_admin(store_dir):
    from gms.store_errors import TopicExists, UnknownQueue, UnknownTopic
    with MessageStore(store_dir, small_config()) as store:
        store.create_topic("a", 2)
        with pytest.raises(TopicExists):
            store.create_topic("a", 3)
        store.update_topic("a", 3)
        store.append(batch(topic="a", n=2, queue_id=2))
        store.delete_topic("a")
        assert store.topics() == {}
        assert not (store_dir / "consumequeue" / "a").exists()
        with pytest.raises(UnknownTopic):
            store.get("a", 0, 0, 1)
        store.create_topic("b", 1)
        with pytest.raises(UnknownQueue):
            store.max_offset("b", 1)
    with MessageStore(store_dir, small_config()) as store:
        assert store.topics() == {"b": 1}


def test_a_file_a_reader_holds_is_deleted_at_once_and_closed_once_released(store_dir):
    store = MessageStore.open(store_dir, small_config(checkpoint_interval_ms=1))
    store.create_topic("t", 4)
    for i in range(10):
        end = store.append(batch(n=10, start=10 * i)).end_phys_offset
    store.durable_future(end).result(5)  # checkpointed: retention deletes only below the checkpoint
    held = store.get("t", 0, 0, 1).records[0]
    before = bytes(held)
    first = store._commitlog.files[0]
    assert not first.try_close()  # a reader holds a view: the map stays
    assert store.delete_expired(now_ms=int(time.time() * 1000) + 10**12) >= 2  # the held file and the next
    assert first not in store._commitlog.files and not first.path.exists()
    assert not first.closed and bytes(held) == before  # still mapped: the view stays readable
    del held
    store.delete_expired()
    assert first.closed
    store.close()


def test_append_result_arrays(store):
    result = store.append(batch(n=4))
    assert isinstance(result.phys_offsets, np.ndarray) and np.all(np.diff(result.phys_offsets) > 0)


def test_coalesced_get_returns_the_same_bytes_in_fewer_views(tmp_path):
    with MessageStore(tmp_path, StoreConfig(commitlog_file_size_bytes=64 * 1024)) as store:
        store.create_topic("t", 2)
        for i in range(30):  # interleave two queues so runs break where the other queue's records sit
            store.append(rec.encode_record(topic="t", body=f"m{i}".encode(), queue_id=i % 3 // 2,
                                           tag="A" if i % 5 else "B"))
        for tags in (None, frozenset({rec.tag_hash("A")})):
            plain = store.get("t", 0, 0, 100, tag_hashes=tags)
            merged = store.get("t", 0, 0, 100, tag_hashes=tags, coalesce=True)
            assert b"".join(map(bytes, merged.records)) == b"".join(map(bytes, plain.records))
            assert len(merged.records) < len(plain.records)
            assert merged.next_offset == plain.next_offset


def test_a_coalesced_get_of_records_lying_apart_answers_one_copy_of_them(tmp_path):
    """A queue's records interleaved with another queue's (runs of one record), over several
    commitlog files, come back as one buffer of them back to back: not a view (and a write
    buffer on the connection) per record."""
    with MessageStore(tmp_path, StoreConfig(commitlog_file_size_bytes=64 * 1024)) as store:
        store.create_topic("t", 2)
        for i in range(400):
            store.append(rec.encode_record(topic="t", body=b"%d" % i + b"x" * 500, queue_id=i % 2))
        assert len(store._cl().files) > 2
        plain = store.get("t", 0, 0, 200, max_bytes=1 << 20)
        merged = store.get("t", 0, 0, 200, max_bytes=1 << 20, coalesce=True)
        assert len(plain.records) == 200 and len(merged.records) == 1
        assert bytes(merged.records[0]) == b"".join(map(bytes, plain.records))
        assert (merged.next_offset, merged.offsets.tolist()) == (plain.next_offset, plain.offsets.tolist())


def test_a_get_of_released_pages_answers_the_queue_bounds(store_dir, monkeypatch):
    """Reading far behind the writer maps the stretch at once (its pages were released after
    their flush); the answer still names the queue's bounds, which consumers read ahead by."""
    monkeypatch.setattr("gms.broker.store.durability.RESIDENT_TAIL_BYTES", 0)
    body = b"x" * 1000
    with MessageStore.open(store_dir, small_config(commitlog_file_size_bytes=64 << 20, flush_interval_ms=10)) as store:
        store.create_topic("t", 1)
        for start in range(0, 12_000, 1000):  # 12 MB: past the release step
            store.append(batch(n=1000, body=body, start=start))
        deadline = time.monotonic() + 10
        while store._cl().released == 0:  # the flush thread releases what it flushed
            assert time.monotonic() < deadline, "flushed pages were never released"
            time.sleep(0.01)
        for coalesce in (False, True):
            got = store.get("t", 0, 2000, 500, max_bytes=1 << 20, coalesce=coalesce)
            assert got.status is GetStatus.FOUND
            assert (got.min_offset, got.next_offset, got.max_offset) == (0, 2500, 12_000)
            assert b"".join(map(bytes, got.records)).count(body) == 500


def test_the_next_file_is_warmed_by_a_thread_that_runs_only_when_a_cpu_is_idle(store_dir):
    """Pre-faulting a GiB must not take the cores that serve sends and pulls."""
    with MessageStore.open(store_dir, small_config(warm_next_file=True)) as store:
        store.create_topic("t", 1)
        deadline = time.monotonic() + 10
        while True:  # the warmer starts with the first file to warm
            store.append(batch(n=200, body=b"x" * 100))
            warmers = [t for t in threading.enumerate() if t.name.startswith("gms-warm")]
            if warmers:
                break
            assert time.monotonic() < deadline, "no warming thread"
        assert {os.sched_getscheduler(t.native_id) for t in warmers} == {os.SCHED_IDLE}
        assert os.sched_getscheduler(0) != os.SCHED_IDLE


def test_warming_the_next_file_waits_for_reads_not_for_writes(tmp_path):
    """Consumers reading are not slowed by a GiB of warming; a writer is never left without a
    warm next file, and once the active file is 3/4 full warming goes on regardless."""
    commitlog = CommitLog(tmp_path, 1 << 20, None)
    commitlog.set_end(0)
    busy = commitlog._busy_watch()
    assert not busy()  # nothing happened
    commitlog.reads += 1
    assert busy()  # a consumer read: wait
    commitlog.write_pos += 1000
    assert not busy()  # writes alone: go on
    commitlog.reads += 1
    commitlog.write_pos = 3 << 18  # 3/4 of the file written
    assert not busy()  # the next file is needed soon: go on even while reads come
    commitlog.close()
