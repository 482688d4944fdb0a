"""MessageStore: the broker's storage engine (commitlog + consumeQueues + flush + recovery +
retention) behind one small API.

Layout under ``root_dir``::

    commitlog/<20-digit start offset>               shared mapped files, all topics
    consumequeue/<topic>/<queue id>/<20-digit byte offset>   20-byte index entries
    index/<20-digit commitlog offset>                key index files (gms.broker.keyindex)
    config/topics.json                               topic -> queue count, retention, message size
    config/min_offsets.json                          queue minimums moved by per-topic retention
    checkpoint, abort                                recovery bookkeeping

The store is made of parts, one module each (docs/architecture.md): the loader recovers them
(:mod:`.loader`), the writer serves appends (:mod:`.appends`) through one validator
(:mod:`.validation`) and the dispatchers that keep the indexes (:mod:`.dispatch`); reads
(:mod:`.reads`), damage tracking and repair (:mod:`.damage`), retention (:mod:`.retention`),
topics (:mod:`.topics`) and durability (:mod:`.durability`) are the others. MessageStore opens
them, offers their operations as its own and closes them.

One writer at a time (appends hold a lock); readers never take it: they work on snapshots of
file lists and on published end offsets, which are advanced only after the bytes they cover are
written and indexed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from prometheus_client.registry import Collector

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.commitlog.flush import FlushListener, FlushService
from gms.broker.store.appends import StoreWriter
from gms.broker.store.cleaner import Cleaner
from gms.broker.store.compacted import CompactedLogs
from gms.broker.store.disk_usage import DiskUsage
from gms.broker.store.durability import Durability
from gms.broker.store.health import StoreHealth
from gms.broker.store.loader import StoreLoader
from gms.broker.store.reads import StoreReads
from gms.broker.store.retention import Retention
from gms.broker.store.topics import StoreTopics
from gms.broker.store.types import StoreStats, TimerListener
from gms.broker.store_config import StoreConfig
from gms.store_errors import StoreClosed, StoreIOError

log = logging.getLogger(__name__)


class MessageStore:
    """Open with :meth:`open` (or the constructor, which opens: recovery runs, the flush and
    retention threads start); :meth:`close` once, or use it as a context manager."""

    def __init__(self, root_dir: str | Path, config: StoreConfig | None = None) -> None:
        self.root = Path(root_dir)
        loaded = StoreLoader(self.root, config or StoreConfig()).load()
        self.paths, self.config = loaded.paths, loaded.config
        self.producers = loaded.producers  # idempotent producers' last batches
        self.recovered_from_crash = loaded.recovered_from_crash
        self.recovered_damaged = loaded.recovered_damaged  # damaged stretches the last recovery found
        self._commitlog, self._queues, self._keys, self._origins = (
            loaded.commitlog, loaded.queues, loaded.keys, loaded.origins)
        self._abort, self._timers = loaded.abort, loaded.dispatchers.timers
        self._closed = False
        self._disk_usage = DiskUsage(self.paths.root)
        self._write_lock = threading.Lock()
        # Held while index files are synced (checkpoint) and while they are closed or deleted
        # (topic delete, queue truncation, retention), so a sync never meets a closed file.
        # Order: _write_lock, then _index_lock, then the queue table's lock.
        self._index_lock = threading.Lock()
        locks = (self._write_lock, self._index_lock)
        self._durability = Durability(self.paths, self.config, loaded.commitlog, loaded.queues,
                                      (loaded.keys, loaded.origins, loaded.producers), self._index_lock,
                                      lambda: writer.last_store_ts_ms, loaded.checkpointed_offset)
        self._flusher = self._durability.flusher
        self._writer = writer = StoreWriter(loaded, self._cl, self._flush_service, locks)
        compacted = CompactedLogs(self.paths.compacted)
        compacted.load(loaded.topics.snapshot())
        reads = StoreReads(self._cl, loaded.queues, loaded.topics, loaded.keys, loaded.origins, loaded.damage,
                           lambda: self._flusher.flushed_offset, compacted)
        self._retention = retention = Retention(self.config, self._cl, loaded.queues, loaded.topics, loaded.keys,
                                                loaded.origins, locks, lambda: self._durability.checkpointed_offset)
        self._cleaner = Cleaner(self.config, self._cl, loaded.queues, loaded.topics, compacted, locks,
                                retention.expiry_limit)
        topics = self._topics = StoreTopics(self.paths, self._cl, loaded.topics, loaded.queues, loaded.producers,
                                            loaded.truncations, locks, lambda: self._timers.listener, compacted)
        # The parts' operations, as the store's own: bound here, so a call costs what a method's does.
        self.append, self.append_replicated, self.append_replicated_run = (
            writer.append, writer.append_replicated, writer.append_replicated_run)
        self.append_lost, self.batch_result, self.repair_record = (
            writer.append_lost, writer.batch_result, writer.repair_record)
        self.truncate_queue, self.restart_queue = writer.truncate_queue, writer.restart_queue
        self.min_offset, self.max_offset, self.get, self.get_many, self.read_runs, self.backlog = (
            reads.min_offset, reads.max_offset, reads.get, reads.get_many, reads.read_runs, reads.backlog)
        self.log_start, self.compact = reads.log_start, self._cleaner.clean
        self._compacted, self.compacted_segment = compacted, compacted.segment
        self.read_entry, self.read_at, self.find_by_key, self.find_replicated = (
            reads.read_entry, reads.read_at, reads.find_by_key, reads.find_replicated)
        self.offset_for_timestamp, self.timer_records = reads.offset_for_timestamp, reads.timer_records
        self.damaged_records, self.forget_damaged = loaded.damage.damaged_records, loaded.damage.forget_damaged
        self.create_topic, self.create_topics, self.create_topics_async = (
            topics.create_topic, topics.create_topics, topics.create_topics_async)
        self.update_topic, self.update_topic_async, self.topic_limits, self.topics, self.queue_count = (
            topics.update_topic, topics.update_topic_async, topics.topic_limits, topics.topics, topics.queue_count)
        self.delete_topic, self.delete_topics = topics.delete_topic, topics.delete_topics
        self.delete_expired, self.set_expiry_limit = self._retention.delete_expired, self._retention.set_expiry_limit
        self.delete_records = self._retention.delete_records
        self.queues_opened = loaded.queues.keys
        self._durability.start()
        self._retention.start()
        self._cleaner.start()

    @classmethod
    def open(cls, root_dir: str | Path, config: StoreConfig | None = None) -> MessageStore:
        """The store under ``root_dir``, open: recovered if the last run did not close it."""
        return cls(root_dir, config)

    def close(self) -> None:
        """Flush, checkpoint and remove the abort marker -- only if everything written is on disk:
        after a failed flush the marker stays, and the next open recovers from the last
        checkpoint written before the failure."""
        if self._closed:
            return
        commitlog, flusher = self._commitlog, self._flusher
        self._topics.close()
        self._cleaner.stop()
        self._retention.stop()
        with self._write_lock:
            flushed = flusher.stop()
            if flusher.failure is None and flushed == commitlog.committed_pos:
                try:
                    self._durability.checkpoint_at(flushed, int(time.time() * 1000), thorough=True)
                    self._abort.clear()
                except (OSError, StoreIOError) as err:
                    log.error("closed without a clean-shutdown marker, the next start recovers: %s", err)
            else:
                log.error("closed without a clean-shutdown marker after a failed flush (%d of %d bytes on "
                          "disk): the next start recovers", flushed, commitlog.committed_pos)
            self._durability.close()
            commitlog.close()
            self._queues.close()
            self._keys.close()
            self._origins.close()
            self._closed = True

    def copy_tmp(self, topic: str, queue_id: int, point: int) -> Path:
        """Where a follower writes its copy of its leader's compacted log at ``point`` while it
        comes (not a ``.seg``: opening the store removes it)."""
        return self._compacted.new_tmp(topic, queue_id, point).with_name(f"{point:020d}.copy.tmp")

    def install_copy(self, topic: str, queue_id: int, point: int, tmp: Path, start: int) -> bool:
        """Make a follower's synced copy of its leader's compacted log the queue's at ``point``,
        then start the queue over empty at ``start`` (the point, or the leader's first offset if
        retention moved it beyond) if it ends before; False (the copy removed) if the queue is
        gone (its topic deleted meanwhile) or its own compacted log reached past ``point`` while
        the copy came (the copy would drop what that log kept at and past the point). A crash
        between the two leaves the copy installed and the queue where it was: its next fetch
        copies and installs again."""
        with self._compacted.busy:  # never beside a cleaner pass over the queue
            own = self._compacted.segment(topic, queue_id)
            if (self._queues.by_key.get((topic, queue_id)) is None or not tmp.exists()
                    or (own is not None and own.point > point)):
                tmp.unlink(missing_ok=True)
                return False
            self._compacted.install(topic, queue_id, point, tmp)
            self.restart_queue(topic, queue_id, start)
        return True

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cl(self) -> CommitLog:
        """The commitlog, while the store is open."""
        if self._closed:
            raise StoreClosed()
        return self._commitlog

    def _flush_service(self) -> FlushService:
        if self._closed:
            raise StoreClosed()
        return self._flusher

    @property
    def health(self) -> StoreHealth:
        if self._flusher.failure is not None:
            return StoreHealth.READ_ONLY
        return StoreHealth.DISK_FULL if self._writer.disk_full else StoreHealth.WRITABLE

    # --- durability ------------------------------------------------------------------------------
    @property
    def flushed_offset(self) -> int:
        return self._flusher.flushed_offset

    def durable_future(self, phys_offset: int) -> Future:
        """Resolved once the commitlog is flushed up to ``phys_offset`` (an AppendResult end)."""
        return self._flush_service().durable_future(phys_offset)

    def request_flush(self, phys_offset: int) -> None:
        """``durable_future`` without the future: flush listeners hear when it is done."""
        self._flush_service().request_flush(phys_offset)

    def add_flush_listener(self, listener: FlushListener) -> None:
        """``listener(flushed_offset, error)`` runs in the flush thread after every flush."""
        self._flush_service().add_listener(listener)

    # --- the rest --------------------------------------------------------------------------------
    def set_timer_listener(self, listener: TimerListener) -> None:
        """``listener`` hears of each appended record carrying timer flags (client, replicated or
        the timer's own appends) once it is stored, and of truncated queues."""
        self._timers.listener = listener

    def stats(self) -> StoreStats:
        commitlog = self._cl()
        return StoreStats(commitlog.min_offset, commitlog.committed_pos, self._disk_usage.bytes())

    def metric_collectors(self) -> list[Collector]:
        """The store's own metrics (flush latency and errors, retention deletions), for a registry."""
        return [self._flusher.latency, self._flusher.errors, *self._retention.metric_collectors(),
                *self._cleaner.metric_collectors()]

    def resident_fraction(self) -> float:
        """Of the active commitlog file's written pages, the fraction in the page cache (what a
        consumer at the tail reads without touching the disk)."""
        commitlog = self._cl()
        active = commitlog.files[-1] if commitlog.files else None
        if active is None:
            return 0.0
        return active.resident_fraction(commitlog.committed_pos - active.base_offset)
