"""FilesystemSync: many files are synced with one syncfs, few (or on another filesystem) one by
one; a failed syncfs falls back to syncing each file, which raises for an error of ours."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from store_helpers import batch, mapped_kib, small_config

from gms.broker import filesystem_sync
from gms.broker.filesystem_sync import SYNCFS_FILES_MIN, FilesystemSync
from gms.broker.mapped_file import MappedFile
from gms.broker.store import MessageStore
from gms.store_errors import StoreIOError

SIZE = 64 * 1024

pytestmark = pytest.mark.skipif(
    filesystem_sync._syncfs is None or filesystem_sync._kernel_version() < filesystem_sync.SYNCFS_KERNEL_MIN,
    reason="no syncfs that reports errors here")


def dirty_kib(under: Path) -> int:
    return mapped_kib(under, ("Shared_Dirty:", "Private_Dirty:"))


def written_files(directory: Path, n: int) -> list[MappedFile]:
    directory.mkdir()
    files = [MappedFile.create(directory, i * SIZE, SIZE) for i in range(n)]
    for f in files:
        f.write(0, b"x" * 10_000)
    return files


@pytest.fixture
def syncfs_calls(monkeypatch):
    """The real syncfs, counted."""
    calls: list[int] = []
    real = filesystem_sync._syncfs

    def counted(fd: int) -> int:
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(filesystem_sync, "_syncfs", counted)
    return calls


def test_many_files_are_written_back_by_one_syncfs(tmp_path, syncfs_calls):
    files = written_files(tmp_path / "q", SYNCFS_FILES_MIN)
    assert dirty_kib(tmp_path) > 0
    sync = FilesystemSync.open(tmp_path)
    try:
        sync.sync(files)
    finally:
        sync.close()
    assert len(syncfs_calls) == 1
    assert dirty_kib(tmp_path) == 0  # every page written back: clean again


def test_few_files_are_synced_one_by_one(tmp_path, syncfs_calls):
    files = written_files(tmp_path / "q", SYNCFS_FILES_MIN - 1)
    sync = FilesystemSync.open(tmp_path)
    try:
        sync.sync(files)
    finally:
        sync.close()
    assert syncfs_calls == []
    assert dirty_kib(tmp_path) == 0


def test_a_failed_syncfs_syncs_each_file_and_raises_for_one_of_ours(tmp_path, monkeypatch, caplog):
    """syncfs reports an error of any file of the filesystem since the store opened, another
    program's too: each file is then synced, and only an error of ours fails the sync."""
    files = written_files(tmp_path / "q", SYNCFS_FILES_MIN)

    def failing(fd: int) -> int:
        import ctypes
        ctypes.set_errno(5)  # EIO
        return -1

    monkeypatch.setattr(filesystem_sync, "_syncfs", failing)
    sync = FilesystemSync.open(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            sync.sync(files)  # none of ours fails: written back one by one
        assert f"syncing its {SYNCFS_FILES_MIN} files one by one" in caplog.text
        assert dirty_kib(tmp_path) == 0
        os.unlink(files[7].path)  # its fdatasync now fails
        with pytest.raises(StoreIOError, match=files[7].path.name):
            sync.sync(files)
    finally:
        sync.close()


def test_a_checkpoint_over_many_queues_syncs_their_files_with_one_syncfs(store_dir, syncfs_calls):
    queues = [(f"t{i:02d}", q) for i in range(SYNCFS_FILES_MIN // 4 + 1) for q in range(4)]
    with MessageStore(store_dir, small_config(checkpoint_interval_ms=3_600_000)) as store:
        for topic in {topic for topic, _ in queues}:
            store.create_topic(topic, 4)
        for topic, queue_id in queues:
            store.append(batch(topic, n=3, queue_id=queue_id))
        assert dirty_kib(store_dir / "consumequeue") > 0
        assert syncfs_calls == []
    assert len(syncfs_calls) == 1  # the closing checkpoint syncs every queue
    with MessageStore(store_dir, small_config()) as store:
        assert not store.recovered_from_crash
        assert all(store.max_offset(topic, queue_id) == 3 for topic, queue_id in queues)
