"""Retention: queues expire by their topic's retention (store time); commitlog files shared by all
topics go once no queue starts in or before them; the disk cap overrides; minimums survive
restarts and crashes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_helpers import batch, small_config

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.topic_table import TopicLimits
from gms.errors import InvalidTopicError, MessageIllegalError
from gms.record import Message, decode_record, encode_batch
from gms.store_errors import MessageTooLarge

HOUR_MS = 3_600_000
BODY = b"x" * 200  # ~290-byte records: 14 per 4 KiB commitlog file


def open_store(store_dir: Path, **overrides) -> MessageStore:
    """A small-geometry store that checkpoints at every flush (retention never deletes at or past
    the last checkpoint, where crash recovery would start)."""
    return MessageStore(store_dir, small_config(checkpoint_interval_ms=1, **overrides))


def fill(store: MessageStore, topic: str, n_batches: int, per_batch: int = 10) -> int:
    end = 0
    for i in range(n_batches):
        end = store.append(batch(topic, n=per_batch, start=per_batch * i, body=BODY)).end_phys_offset
    store.durable_future(end).result(5)
    return end


def store_ts(store: MessageStore, topic: str, offset: int, queue_id: int = 0) -> int:
    return decode_record(store.get(topic, queue_id, offset, 1).records[0]).store_ts_ms


def served(store: MessageStore, topic: str, queue_id: int = 0) -> list[int]:
    """Queue offsets a reader from the minimum gets, checked record by record."""
    got = store.get(topic, queue_id, store.min_offset(topic, queue_id), 100_000, 1 << 30)
    offsets = [decode_record(v).queue_offset for v in got.records]
    assert offsets == list(range(store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)))
    return offsets


def test_queue_minimum_moves_past_records_older_than_the_topic_retention(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("t", 1, TopicLimits(retention_ms=1000))
        fill(store, "t", 3)
        time.sleep(0.01)
        fill(store, "t", 2)
        newer = store_ts(store, "t", 30)
        assert store_ts(store, "t", 29) < newer
        phys_30 = decode_record(store.get("t", 0, 30, 1).records[0]).phys_offset
        assert store.delete_expired(now_ms=newer + 999) == phys_30 // 4096  # the cut is the store time: 30.. kept
        assert store._commitlog.min_offset == phys_30 - phys_30 % 4096  # the files before 30's went
        assert store.min_offset("t", 0) == 30 and store.max_offset("t", 0) == 50
        got = store.get("t", 0, 0, 10)
        assert (got.status, got.next_offset, got.records) == (GetStatus.OFFSET_TOO_SMALL, 30, [])
        assert served(store, "t") == list(range(30, 50))
        assert store.offset_for_timestamp("t", 0, 0) == 30
        store.delete_expired(now_ms=newer + 10 * HOUR_MS)  # everything expired: an empty queue
        assert store.min_offset("t", 0) == store.max_offset("t", 0) == 50
        assert store.get("t", 0, 50, 1).status is GetStatus.NO_NEW_MESSAGE
        store.append(batch("t", n=1))
        assert served(store, "t") == [50]


def test_broker_retention_is_the_default_of_topics_without_their_own(store_dir):
    with open_store(store_dir, retention_hours=1) as store:
        store.create_topic("default", 1)
        store.create_topic("own", 1, TopicLimits(retention_ms=3 * HOUR_MS))
        fill(store, "default", 1)
        fill(store, "own", 1)
        now = store_ts(store, "own", 9)
        store.delete_expired(now_ms=now + 2 * HOUR_MS)
        assert store.min_offset("default", 0) == 10 and store.min_offset("own", 0) == 0


def test_two_topics_share_files_until_neither_needs_them(store_dir):
    """A long-retention topic keeps the commitlog files it starts in alive, records of the
    short-retention topic in them included (they are no longer served)."""
    with open_store(store_dir) as store:
        store.create_topic("short", 1, TopicLimits(retention_ms=HOUR_MS))
        store.create_topic("long", 1, TopicLimits(retention_ms=10 * HOUR_MS))
        for i in range(8):  # interleaved: every file holds records of both topics
            store.append(batch("short", n=5, start=5 * i, body=BODY))
            store.append(batch("long", n=5, start=5 * i, body=BODY))
        store.durable_future(store._commitlog.committed_pos).result(5)
        files = list(store._commitlog.files)
        assert len(files) >= 5
        now = store_ts(store, "long", 39)
        assert store.delete_expired(now_ms=now + 2 * HOUR_MS) == 0  # long still starts in file 0
        assert store.min_offset("short", 0) == 40 and served(store, "long") == list(range(40))
        assert store._commitlog.files == files
        assert store.delete_expired(now_ms=now + 11 * HOUR_MS) == len(files) - 1  # nobody needs them
        assert store.min_offset("long", 0) == 40
        assert [f.path.exists() for f in files] == [False] * (len(files) - 1) + [True]


def test_files_before_the_long_topic_go_with_the_short_one(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("short", 1, TopicLimits(retention_ms=HOUR_MS))
        store.create_topic("long", 1, TopicLimits(retention_ms=10 * HOUR_MS))
        fill(store, "short", 6)  # ~4 files of short only
        fill(store, "long", 6)
        first_long = store.get("long", 0, 0, 1).records[0]
        long_phys = decode_record(first_long).phys_offset
        del first_long
        now = store_ts(store, "long", 59)
        deleted = store.delete_expired(now_ms=now + 2 * HOUR_MS)
        assert deleted >= 3
        assert store._commitlog.min_offset == long_phys - long_phys % 4096  # the file long starts in
        assert served(store, "long") == list(range(60))
        assert store.min_offset("short", 0) == 60


def test_minimums_survive_a_restart_and_topic_deletion_forgets_them(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("short", 1, TopicLimits(retention_ms=HOUR_MS))
        store.create_topic("long", 1)
        fill(store, "long", 1)
        fill(store, "short", 2)
        now = store_ts(store, "short", 19)
        store.delete_expired(now_ms=now + 2 * HOUR_MS)
        assert store.min_offset("short", 0) == 20
        assert store._commitlog.min_offset == 0  # long (72 h by default) keeps every file
    with open_store(store_dir) as store:
        assert store.topic_limits("short") == TopicLimits(retention_ms=HOUR_MS)
        assert store.min_offset("short", 0) == store.max_offset("short", 0) == 20
        assert store.get("short", 0, 0, 1).status is GetStatus.OFFSET_TOO_SMALL
        assert served(store, "long") == list(range(10))
        store.delete_topic("short")
        store.create_topic("short", 1)
        fill(store, "short", 1)
    with open_store(store_dir) as store:
        assert served(store, "short") == list(range(10))


def test_expiry_never_passes_the_limit(store_dir):
    """A replicated queue's minimum stays at or below its high watermark."""
    with open_store(store_dir) as store:
        store.create_topic("t", 2, TopicLimits(retention_ms=HOUR_MS))
        fill(store, "t", 3)
        store.set_expiry_limit(lambda topic, queue_id: 12 if queue_id == 0 else None)
        store.delete_expired(now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert store.min_offset("t", 0) == 12
        assert served(store, "t") == list(range(12, 30))


def test_never_deletes_the_active_file(store_dir):
    with open_store(store_dir, retention_hours=1) as store:
        store.create_topic("t", 1)
        fill(store, "t", 5)
        store.delete_expired(now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert len(store._commitlog.files) == 1
        store.append(batch(n=1))
        assert served(store, "t") == [50]


def test_disk_cap_deletes_whatever_queues_still_need(store_dir):
    cap = 8 * 4096 + 2 * 100 * 20
    with open_store(store_dir, disk_usage_max_bytes=cap) as store:
        store.create_topic("t", 1)
        fill(store, "t", 20)
        before = len(store._commitlog.files)
        deleted = store.delete_expired()
        cq = store._queues.queue("t", 0)
        usage = len(store._commitlog.files) * 4096 + len(cq.files) * cq.file_size_bytes
        assert deleted == before - len(store._commitlog.files) > 0
        assert usage <= cap
        assert store.min_offset("t", 0) > 0
        assert served(store, "t")[-1] == 199


def test_consume_queue_files_below_minimum_dropped(store_dir):
    with open_store(store_dir, retention_hours=1) as store:
        store.create_topic("t", 1)
        fill(store, "t", 30)
        time.sleep(0.01)
        fill(store, "t", 10)  # 400 entries: 4 cq files of 100
        cq = store._queues.queue("t", 0)
        assert len(cq.files) == 4
        store.delete_expired(now_ms=store_ts(store, "t", 300) + HOUR_MS - 1)
        assert store.min_offset("t", 0) == 300
        assert len(cq.files) == 1 and cq.files[0].base_offset == 300 * 20
    with open_store(store_dir, retention_hours=1) as store:
        assert store.min_offset("t", 0) == 300 and store.max_offset("t", 0) == 400


def test_a_record_over_its_topic_limit_fails_the_whole_batch(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("small", 1, TopicLimits(message_size_bytes_max=300))
        store.create_topic("big", 1)
        ok = encode_batch([Message("small", b"x" * 100)])
        assert len(ok) <= 300
        store.append(ok)
        mixed = [Message("big", b"y" * 500)] * 20 + [Message("small", b"x" * 100), Message("small", b"z" * 250)]
        with pytest.raises(MessageTooLarge, match="topic small's limit of 300 bytes") as err:
            store.append(encode_batch(mixed))
        assert isinstance(err.value, MessageIllegalError)
        assert (err.value.topic, err.value.size_bytes_max) == ("small", 300) and err.value.size_bytes > 300
        assert store.max_offset("small", 0) == 1 and store.max_offset("big", 0) == 0  # nothing of it stored
        store.append(encode_batch([Message("big", b"y" * 3000)]))  # another topic, no limit of its own
        store.update_topic("small", limits=TopicLimits(message_size_bytes_max=4000))
        store.append(encode_batch(mixed))
    with open_store(store_dir) as store:
        assert store.topic_limits("small").message_size_bytes_max == 4000


def test_limits_are_validated():
    with pytest.raises(InvalidTopicError):
        TopicLimits(retention_ms=0)
    with pytest.raises(InvalidTopicError, match="need a cluster"):
        TopicLimits().merged({"min_insync_replicas": 2})
    assert TopicLimits(5, 6).merged({"retention_ms": None}) == TopicLimits(None, 6)


CRASH_CHILD = """
import sys, time
from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.broker.store.topic_table import TopicLimits
from gms.record import Message, encode_batch

store = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=4096, cq_entries_per_file=100,
                                              flush_interval_ms=20, checkpoint_interval_ms=1,
                                              retention_check_interval_ms=60_000))
store.create_topic("short", 1, TopicLimits(retention_ms=3_600_000))
store.create_topic("long", 1)
for topic in ("short", "short", "long", "short"):
    for i in range(5):
        end = store.append(encode_batch([Message(topic, b"x" * 200)] * 10)).end_phys_offset
    time.sleep(0.01)
store.durable_future(end).result(5)
now = int(time.time() * 1000)
print(store.delete_expired(now_ms=now + 2 * 3_600_000), flush=True)
time.sleep(60)
"""


def test_sigkill_after_retention_recovers_consistently(tmp_path):
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        deleted = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert deleted >= 5  # the files before long's first record
    assert (root / "abort").exists()
    names = sorted(os.listdir(root / "commitlog"))
    with open_store(root) as store:
        assert store.recovered_from_crash
        assert sorted(os.listdir(root / "commitlog"))[0] == names[0]
        assert store.min_offset("short", 0) == store.max_offset("short", 0) == 150
        assert served(store, "long") == list(range(50))
        store.append(batch("short", n=3))
        assert served(store, "short") == [150, 151, 152]


def test_spark_reader_starts_where_the_broker_serves(store_dir):
    from gms.spark_jobs.store_files import queue_index

    with open_store(store_dir) as store:
        store.create_topic("t", 1, TopicLimits(retention_ms=HOUR_MS))
        fill(store, "t", 2)
        store.delete_expired(now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert store.min_offset("t", 0) == 20
    index = queue_index(store_dir, "t", 0)
    assert (index.min_offset, index.max_offset) == (20, 20)


def test_a_follower_restarts_a_queue_its_leader_expired(tmp_path):
    """restart_queue: the follower's old records are never indexed again, not even by a full
    recovery scan; the records it copies next are."""
    from isal.isal_zlib import crc32

    with open_store(tmp_path / "leader") as leader, open_store(tmp_path / "follower") as follower:
        for store in (leader, follower):
            store.create_topic("t", 1)
        fill(leader, "t", 12)
        fill(follower, "t", 1)
        follower.restart_queue("t", 0, 100)
        assert follower.min_offset("t", 0) == follower.max_offset("t", 0) == 100
        read = leader.read_runs("t", 0, 100, 1000, 1 << 20)
        views, sizes = read.views, read.sizes
        chunk = b"".join(bytes(v) for v in views)
        del views, read
        follower.append_replicated(chunk, crc32(chunk), sizes)
        assert served(follower, "t") == list(range(100, 120))
    (tmp_path / "follower" / "checkpoint").unlink()  # recover by scanning every commitlog file
    with open_store(tmp_path / "follower") as follower:
        assert follower.recovered_from_crash
        assert served(follower, "t") == list(range(100, 120))


@pytest.mark.parametrize("appended", [0, 5])
def test_a_queue_restarted_inside_an_index_file_reopens_where_it_was(tmp_path, appended):
    """restart_queue at 150, inside the index file of offsets 100..199, then ``appended`` records:
    after a clean restart the queue still starts at 150 and serves exactly those records (its
    reopened end was the file's start, 100, below its minimum: the records were not served;
    with none, the queue started over at 0)."""
    with open_store(tmp_path) as store:
        store.create_topic("t", 1)
        fill(store, "t", 1)
        store.restart_queue("t", 0, 150)
        if appended:
            fill(store, "t", 1, per_batch=appended)
    from gms.spark_jobs.store_files import queue_index

    index = queue_index(tmp_path, "t", 0)  # Spark's reader agrees
    assert (index.min_offset, index.max_offset) == (150, 150 + appended)
    with open_store(tmp_path) as store:
        assert (store.min_offset("t", 0), store.max_offset("t", 0)) == (150, 150 + appended)
        assert served(store, "t") == list(range(150, 150 + appended))
        fill(store, "t", 1, per_batch=2)  # and it goes on from there
        assert served(store, "t") == list(range(150, 152 + appended))
