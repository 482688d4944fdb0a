"""Fsync errors stop writes (fail-stop, PostgreSQL's lesson), and the flush thread survives every
other error. Real stores on real files; fsync failures come from the store's documented seam
(``GMS_FAULT_FSYNC_FAIL_FILE``: while the named file exists, every data flush fails with EIO)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from gms.broker.store import MessageStore
from gms.broker.store import durability as store_module
from gms.broker.store.checkpoint import read_checkpoint
from gms.broker.store.health import FSYNC_FAULT_ENV, StoreHealth
from gms.broker.store.paths import ABORT_FILE, StorePaths
from gms.broker.store_config import StoreConfig
from gms.errors import ServerError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C
from gms.record import Message, encode_batch, encode_record, iter_records
from gms.store_errors import StoreIOError, StoreReadOnly

RECORD = encode_record(topic="t", body=b"x" * 100)


@pytest.fixture
def fault_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fail-fsync"
    monkeypatch.setenv(FSYNC_FAULT_ENV, str(path))
    return path


def open_store(root: Path, **overrides) -> MessageStore:
    config = StoreConfig(commitlog_file_size_bytes=1 << 20, cq_entries_per_file=1000, warm_next_file=False,
                         **overrides)
    store = MessageStore.open(root, config)
    if "t" not in store.topics():
        store.create_topic("t", 2)
    return store


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_failed_fsync_fails_waiters_and_stops_writes_until_restart(tmp_path, fault_file):
    root = tmp_path / "store"
    store = open_store(root, flush_mode="sync", checkpoint_interval_ms=0)
    acked = store.append(RECORD).end_phys_offset
    assert store.durable_future(acked).result(5) == acked
    checkpointed = read_checkpoint(StorePaths(root).checkpoint).commitlog_flushed_offset
    assert checkpointed == acked and store.health is StoreHealth.WRITABLE

    fault_file.touch()
    lost = store.append(RECORD).end_phys_offset
    with pytest.raises(StoreReadOnly, match="restart"):
        store.durable_future(lost).result(5)
    assert store.health is StoreHealth.READ_ONLY
    fault_file.unlink()  # the disk "works" again: a later fsync would succeed, proving nothing
    with pytest.raises(StoreReadOnly):
        store.append(RECORD)
    with pytest.raises(StoreReadOnly):
        store.durable_future(lost).result(5)
    store.close()
    assert read_checkpoint(StorePaths(root).checkpoint).commitlog_flushed_offset == checkpointed
    assert (root / ABORT_FILE).exists(), "no clean-shutdown marker over unflushed data"

    store = open_store(root, flush_mode="sync")
    try:
        assert store.recovered_from_crash and store.health is StoreHealth.WRITABLE
        assert store.get("t", 0, 0).records[0].tobytes()[40:] == RECORD[40:]
    finally:
        store.close()


def test_async_mode_never_advances_the_checkpoint_after_a_failed_fsync(tmp_path, fault_file):
    root = tmp_path / "store"
    store = open_store(root, flush_mode="async", flush_interval_ms=10, checkpoint_interval_ms=0)
    try:
        first = store.append(RECORD).end_phys_offset
        wait_for(lambda: read_checkpoint(StorePaths(root).checkpoint) is not None
                 and read_checkpoint(StorePaths(root).checkpoint).commitlog_flushed_offset == first)
        fault_file.touch()
        store.append(RECORD)
        wait_for(lambda: store.health is StoreHealth.READ_ONLY)
        fault_file.unlink()
        time.sleep(0.1)  # ten more intervals: none of them may flush or checkpoint
        assert store.flushed_offset == first
        assert read_checkpoint(StorePaths(root).checkpoint).commitlog_flushed_offset == first
    finally:
        store.close()
    assert (root / ABORT_FILE).exists()


def test_close_after_a_failed_final_flush_writes_no_clean_marker(tmp_path, fault_file):
    root = tmp_path / "store"
    store = open_store(root, flush_mode="async", flush_interval_ms=60_000)
    store.append(RECORD)
    fault_file.touch()
    store.close()
    checkpoint = read_checkpoint(StorePaths(root).checkpoint)
    assert checkpoint is None or checkpoint.commitlog_flushed_offset == 0
    assert (root / ABORT_FILE).exists()
    fault_file.unlink()
    reopened = open_store(root)
    try:
        assert reopened.recovered_from_crash
    finally:
        reopened.close()


def test_an_error_in_the_flush_loop_does_not_stop_flushing(tmp_path, monkeypatch):
    """Any other error (here the checkpoint file cannot be written) is logged; the thread goes on,
    and the store stays writable: the previous checkpoint is still true."""
    root = tmp_path / "store"
    real_write = store_module.write_checkpoint
    failures = []

    def failing_once(*args):
        if not failures:
            failures.append(1)
            raise OSError(28, "No space left on device")
        real_write(*args)

    monkeypatch.setattr(store_module, "write_checkpoint", failing_once)
    store = open_store(root, flush_mode="async", flush_interval_ms=10, checkpoint_interval_ms=0)
    try:
        first = store.append(RECORD).end_phys_offset
        wait_for(lambda: store.flushed_offset == first)
        assert failures
        second = store.append(RECORD).end_phys_offset
        wait_for(lambda: store.flushed_offset == second)
        wait_for(lambda: read_checkpoint(StorePaths(root).checkpoint).commitlog_flushed_offset == second)
        assert store.health is StoreHealth.WRITABLE
    finally:
        store.close()


def test_a_flush_that_gets_no_descriptor_is_retried_not_fail_stop(tmp_path, monkeypatch):
    """EMFILE before any data reached the fsync is not a lost write: retried at the next interval."""
    store = open_store(tmp_path / "store", flush_mode="sync", flush_interval_ms=10)
    real_fdatasync = os.fdatasync
    refused = []

    def fdatasync(fd: int) -> None:
        if not refused:
            refused.append(fd)
            raise OSError(errno.EMFILE, "Too many open files")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    try:
        end = store.append(RECORD).end_phys_offset
        assert store.durable_future(end).result(5) == end
        assert refused and store.health is StoreHealth.WRITABLE
    finally:
        store.close()


def test_topic_delete_never_closes_an_index_file_the_checkpoint_is_syncing(tmp_path, monkeypatch):
    """The checkpoint's first fdatasync of a consumeQueue file starts a topic delete and gives it
    time to run: it must wait for the checkpoint instead of closing the file under it."""
    root = tmp_path / "store"
    store = open_store(root, flush_mode="sync", checkpoint_interval_ms=0)
    store.create_topic("doomed", 1)
    real_fdatasync = os.fdatasync
    deleter: list[threading.Thread] = []

    def fdatasync(fd: int) -> None:
        if not deleter and "/consumequeue/doomed/" in os.readlink(f"/proc/self/fd/{fd}"):
            deleter.append(threading.Thread(target=store.delete_topic, args=("doomed",)))
            deleter[0].start()
            deleter[0].join(0.3)
        real_fdatasync(fd)

    try:
        store.append(encode_record(topic="doomed", body=b"d"))
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        end = store.append(RECORD).end_phys_offset
        assert store.durable_future(end).result(5) == end
        assert deleter, "the checkpoint synced the doomed topic's index"
        deleter[0].join(5)
        monkeypatch.undo()
        assert "doomed" not in store.topics() and store.health is StoreHealth.WRITABLE
        later = store.append(RECORD).end_phys_offset
        assert store.durable_future(later).result(5) == later
    finally:
        store.close()


def test_a_broker_whose_fsync_failed_refuses_sends_and_reports_it(broker_factory, fault_file, monkeypatch):
    """A real sync-flush broker: acknowledged sends survive, the send whose flush failed and every
    later one get a non-retriable error saying to restart, BROKER_STATUS reports read_only, and
    the restart (fault gone) recovers and takes writes again."""
    broker = broker_factory("--flush", "sync")

    def batch(start: int, n: int = 3) -> bytes:
        return encode_batch(Message("orders", b"m%d" % i, queue_id=0) for i in range(start, start + n))

    async def before_and_during(conn: Connection) -> None:
        await conn.request(C.CREATE_TOPIC, {"topic": "orders", "queues": 1})
        await conn.request(C.SEND_BATCH, {}, batch(0))
        assert (await conn.request(C.BROKER_STATUS, {})).fields["store_health"] == "writable"
        fault_file.touch()
        for start in (3, 6):  # the failing flush, then the refused append
            with pytest.raises(ServerError, match=r"read-only.*restart") as failed:
                await conn.request(C.SEND_BATCH, {}, batch(start))
            assert not failed.value.retriable
        fault_file.unlink()
        with pytest.raises(ServerError, match="read-only"):
            await conn.request(C.SEND_BATCH, {}, batch(9))
        assert (await conn.request(C.BROKER_STATUS, {})).fields["store_health"] == "read_only"

    async def after_restart(conn: Connection) -> None:
        assert (await conn.request(C.BROKER_STATUS, {})).fields["store_health"] == "writable"
        await conn.request(C.SEND_BATCH, {}, batch(100, 1))
        pulled = await conn.request(C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "max_msgs": 100})
        bodies = [bytes(r.body) for r in iter_records(bytes(pulled.body))]
        assert bodies[:3] == [b"m0", b"m1", b"m2"] and bodies[-1] == b"m100"

    def call(scenario) -> None:
        async def main() -> None:
            conn = await Connection.open("127.0.0.1", broker.port)
            try:
                await scenario(conn)
            finally:
                conn.close()
        run(main())

    call(before_and_during)
    broker.stop()
    assert (broker.store_dir / "store" / ABORT_FILE).exists()
    monkeypatch.delenv(FSYNC_FAULT_ENV)
    broker.restart()
    assert "did not stop cleanly" in broker.log_tail(20_000)
    call(after_restart)


def test_an_append_that_gets_no_space_reports_disk_full_until_one_succeeds(tmp_path, monkeypatch):
    """ENOSPC while creating a file refuses that append (nothing stored) and flags the store
    disk_full; it is not fail-stop: the next append that finds space clears the flag."""
    store = open_store(tmp_path / "store", flush_mode="sync")
    real_fallocate = os.posix_fallocate

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(StoreIOError):
            store.append(RECORD)  # the queue's first consumeQueue file cannot be allocated
        assert store.health is StoreHealth.DISK_FULL and store.max_offset("t", 0) == 0
        monkeypatch.setattr(os, "posix_fallocate", real_fallocate)
        end = store.append(RECORD).end_phys_offset
        assert store.durable_future(end).result(5) == end
        assert store.health is StoreHealth.WRITABLE and store.max_offset("t", 0) == 1
    finally:
        store.close()
