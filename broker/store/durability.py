"""Durability: the flush thread's flush of the commitlog, and the checkpoints that say from where
crash recovery must re-read it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gms.broker.commitlog.commitlog import RESIDENT_TAIL_BYTES, CommitLog
from gms.broker.commitlog.flush import FlushService
from gms.broker.filesystem_sync import FilesystemSync
from gms.broker.keyindex import KeyIndex
from gms.broker.mapped_file import MappedFile
from gms.broker.store.checkpoint import Checkpoint, write_checkpoint
from gms.broker.store.health import fsync_fault_file
from gms.broker.store.origins import OriginMap
from gms.broker.store.paths import StorePaths
from gms.broker.store.producer_state import ProducerStates
from gms.broker.store.queues import QueueTable
from gms.broker.store_config import StoreConfig
from gms.store_errors import StoreIOError

log = logging.getLogger(__name__)

# A checkpoint syncs a consumeQueue once it took this many entries since its last sync (two pages,
# RocketMQ's flushConsumeQueueLeastPages); every CQ_FLUSH_THOROUGH_CHECKPOINTS intervals (and at
# close) it syncs all.
CQ_FLUSH_LEAST_ENTRIES = 2 * 4096 // 20
CQ_FLUSH_THOROUGH_CHECKPOINTS = 10


class Durability:
    """Owns the flush service (``flusher``; started by :meth:`start`), whose flush is
    :meth:`_flush_all`. ``last_store_ts()``: the store time of the last record appended.
    ``checkpointed_offset``: where crash recovery would start re-reading the commitlog."""

    def __init__(self, paths: StorePaths, config: StoreConfig, commitlog: CommitLog, queues: QueueTable,
                 indexes: tuple[KeyIndex, OriginMap, ProducerStates], index_lock: threading.Lock,
                 last_store_ts: Callable[[], int], checkpointed_offset: int) -> None:
        self._paths = paths
        self._config = config
        self._commitlog = commitlog
        self._queues = queues
        self._keys, self._origins, self._producers = indexes
        self._index_lock = index_lock
        self._last_store_ts = last_store_ts
        self.checkpointed_offset = checkpointed_offset
        # The first checkpoint comes one interval after opening, like every later one.
        self._last_checkpoint_ms = int(time.time() * 1000)
        self._last_thorough_checkpoint_ms = self._last_checkpoint_ms
        self._fsync_fault = fsync_fault_file()  # tests only: see store.health.FSYNC_FAULT_ENV
        self._queue_files_sync = FilesystemSync.open(paths.root)
        self.flusher = FlushService(config, self._flush_all, lambda: commitlog.committed_pos, commitlog.committed_pos)

    def start(self) -> None:
        self.flusher.start()

    def close(self) -> None:
        """After the last checkpoint."""
        self._queue_files_sync.close()

    def _flush_all(self) -> int:
        """The flush thread's flush: the commitlog, and every ``checkpoint_interval_ms`` the
        indexes and the checkpoint. A failed fsync raises StoreIOError (the flush service then
        fails stop); a checkpoint file that cannot be written is logged, the previous one stays."""
        commitlog = self._commitlog
        end = commitlog.committed_pos
        start = self.flusher.flushed_offset
        if self._fsync_fault is not None and end > start and self._fsync_fault.exists():
            raise StoreIOError(f"fdatasync failed: injected while {self._fsync_fault} exists")
        commitlog.flush_range(start, end)
        commitlog.release_behind(end - RESIDENT_TAIL_BYTES)
        now_ms = int(time.time() * 1000)
        if now_ms - self._last_checkpoint_ms >= self._config.checkpoint_interval_ms:
            try:
                self.checkpoint_at(end, now_ms)
            except OSError as err:
                self._last_checkpoint_ms = now_ms  # retried at the next interval, not every flush
                log.error("checkpoint not written (the previous one stays valid): %s", err)
        return end

    def checkpoint_at(self, end: int, now_ms: int, *, thorough: bool = False) -> None:
        """Flush the indexes up to ``end`` (all entries below it are written) and record from where
        recovery must re-read the commitlog.

        A consumeQueue with fewer than CQ_FLUSH_LEAST_ENTRIES new entries is not synced, except at a
        thorough checkpoint (every CQ_FLUSH_THOROUGH_CHECKPOINTS intervals, and at close), and the checkpoint stops at
        its first unsynced entry's record (RocketMQ's flushConsumeQueueLeastPages): with thousands
        of queues each taking a few entries a second, syncing every queue's file every second was
        thousands of fdatasyncs a second, and each synced page faulted again (write-protected) at
        its next entry, on the request loop."""
        thorough = thorough or (now_ms - self._last_thorough_checkpoint_ms
                                >= CQ_FLUSH_THOROUGH_CHECKPOINTS * self._config.checkpoint_interval_ms)
        least = 0 if thorough else CQ_FLUSH_LEAST_ENTRIES
        safe = end
        files: list[MappedFile] = []
        with self._index_lock:
            for cq in self._queues.snapshot().values():
                unsynced = cq.flush(least, files)
                if unsynced is not None:
                    safe = min(safe, unsynced)
            self._queue_files_sync.sync(files)  # thousands of queues: one syncfs, not an fdatasync each
            self._keys.flush()
            self._origins.sync()
        self._queues.dir_syncs.sync()  # after the queues' ends were read: their directories are named
        self._producers.save(end, now_ms)  # before the checkpoint: recovery from it re-reads what follows
        write_checkpoint(self._paths.checkpoint, Checkpoint(end, safe, self._last_store_ts(), now_ms))
        self._last_checkpoint_ms = now_ms
        if thorough:
            self._last_thorough_checkpoint_ms = now_ms
        self.checkpointed_offset = safe
