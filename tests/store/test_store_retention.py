import os
import time

from store_helpers import batch, small_config

from gms.broker.store import GetStatus, MessageStore

HOUR_MS = 3_600_000


def fill(store, n_batches: int) -> None:
    for i in range(n_batches):
        store.append(batch(n=10, start=10 * i, body=b"x" * 200))


def age_files(store, count: int, age_ms: int) -> None:
    old_s = (time.time() * 1000 - age_ms) / 1000
    for f in store._commitlog.files[:count]:
        os.utime(f.path, (old_s, old_s))


def test_deletes_exactly_the_expired_files(store_dir):
    with MessageStore(store_dir, small_config(retention_hours=1)) as store:
        store.create_topic("t", 1)
        fill(store, 20)  # ~60 KiB over 4 KiB files
        files = list(store._commitlog.files)
        assert len(files) > 6
        age_files(store, 3, 2 * HOUR_MS)
        assert store.delete_expired() == 3
        assert store._commitlog.files == files[3:]
        assert all(not f.path.exists() for f in files[:3])
        min_phys = files[3].base_offset
        lo = store.min_offset("t", 0)
        first = store.get("t", 0, lo, 1).records[0]
        from gms.record import decode_record
        assert decode_record(first).phys_offset >= min_phys
        assert store.get("t", 0, 0, 1).status is GetStatus.OFFSET_TOO_SMALL
        assert store.delete_expired() == 0  # nothing else is old


def test_never_deletes_the_active_file(store_dir):
    with MessageStore(store_dir, small_config(retention_hours=1)) as store:
        store.create_topic("t", 1)
        fill(store, 5)
        age_files(store, len(store._commitlog.files), 2 * HOUR_MS)
        store.delete_expired()
        assert len(store._commitlog.files) == 1
        store.append(batch(n=1))


def test_disk_cap(store_dir):
    cap = 8 * 4096 + 2 * 100 * 20
    with MessageStore(store_dir, small_config(disk_usage_max_bytes=cap)) as store:
        store.create_topic("t", 1)
        fill(store, 20)
        before = len(store._commitlog.files)
        deleted = store.delete_expired()
        cq = store._queue("t", 0)
        usage = len(store._commitlog.files) * 4096 + len(cq.files) * cq.file_size_bytes
        assert deleted == before - len(store._commitlog.files) > 0
        assert usage <= cap


def test_consume_queue_files_below_minimum_dropped(store_dir):
    with MessageStore(store_dir, small_config(retention_hours=1)) as store:
        store.create_topic("t", 1)
        fill(store, 40)  # 400 entries: 4 cq files of 100
        cq = store._queue("t", 0)
        assert len(cq.files) == 4
        age_files(store, len(store._commitlog.files) - 2, 2 * HOUR_MS)
        store.delete_expired()
        assert store.min_offset("t", 0) > 300
        assert len(cq.files) == 1 and cq.files[0].base_offset == 300 * 20
    with MessageStore(store_dir, small_config(retention_hours=1)) as store:
        assert store.min_offset("t", 0) >= 300 and store.max_offset("t", 0) == 400
