"""Retention policy: which commitlog files may go.

Queues expire by their topic's retention (the store moves each queue's minimum past the records
stored before ``now - retention_ms``); a commitlog file is shared by every topic, so it goes only
once no queue still starts in it or before it -- or, oldest first, while the store is above its
disk cap, whatever the queues still hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter
from prometheus_client.registry import Collector

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.keyindex import KeyIndex
from gms.broker.mapped_file import MappedFile
from gms.broker.store.origins import OriginMap
from gms.broker.store.queues import QueueKey, QueueTable
from gms.broker.store.records import first_stored_at, store_ts
from gms.broker.store.topic_table import TopicTable
from gms.broker.store_config import StoreConfig
from gms.store_errors import StoreError

log = logging.getLogger(__name__)


def deletion_rule(keep_from: int, disk_usage_bytes: int,
                  disk_usage_max_bytes: int | None) -> Callable[[MappedFile], bool]:
    """A predicate for ``CommitLog.delete_oldest``: a file goes if it lies wholly below
    ``keep_from`` (the lowest commitlog offset anything still needs), or while the store is
    above its disk cap."""
    usage = [disk_usage_bytes]

    def should_delete(f: MappedFile) -> bool:
        over_cap = disk_usage_max_bytes is not None and usage[0] > disk_usage_max_bytes
        if f.end_offset <= keep_from or over_cap:
            usage[0] -= f.disk_bytes()
            return True
        return False

    return should_delete


class Housekeeper:
    """Runs ``task`` every ``interval_ms`` on a daemon thread until stopped."""

    def __init__(self, task: Callable[[], object], interval_ms: int) -> None:
        self._task = task
        self._interval_s = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gms-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._task()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class Retention:
    """Retention runs (every ``retention_check_interval_ms`` on its own thread, from
    :meth:`start` to :meth:`stop`): queues expire, then the commitlog files no queue needs.
    ``checkpointed()``: where crash recovery would start re-reading the commitlog."""

    def __init__(self, config: StoreConfig, commitlog: Callable[[], CommitLog], queues: QueueTable,
                 topics: TopicTable, keys: KeyIndex, origins: OriginMap, locks: tuple[threading.Lock, threading.Lock],
                 checkpointed: Callable[[], int]) -> None:
        self._config = config
        self._commitlog = commitlog
        self._queues = queues
        self._topics = topics
        self._keys = keys
        self._origins = origins
        self._write_lock, self._index_lock = locks
        self._checkpointed = checkpointed
        # (topic, queue id) -> the offset retention must not pass (None: the queue's end)
        self._expiry_limit: Callable[[str, int], int | None] = lambda topic, queue_id: None
        self.deleted_files = Counter("gms_broker_retention_deleted_files", "Commitlog files deleted by"
                                     " retention (expiry or the disk cap)", registry=None)
        self.deleted_bytes = Counter("gms_broker_retention_deleted_bytes", "Bytes of the commitlog files"
                                     " retention deleted", registry=None)
        self._housekeeper = Housekeeper(self._run, config.retention_check_interval_ms)

    def start(self) -> None:
        self._housekeeper.start()

    def stop(self) -> None:
        self._housekeeper.stop()

    def metric_collectors(self) -> list[Collector]:
        return [self.deleted_files, self.deleted_bytes]

    def set_expiry_limit(self, limit: Callable[[str, int], int | None]) -> None:
        """``limit(topic, queue_id)``: the offset retention never moves that queue's minimum past
        (a replicated queue's high watermark: records not yet committed do not expire, as Kafka
        keeps its log start offset below the HW); None = the queue's end."""
        self._expiry_limit = limit

    def expiry_limit(self, topic: str, queue_id: int) -> int | None:
        """The offset nothing may move a queue's minimum past (see :meth:`set_expiry_limit`)."""
        return self._expiry_limit(topic, queue_id)

    def delete_records(self, topic: str, queue_id: int, offset: int) -> int:
        """Serve a queue's records from ``offset`` on only (Kafka's DeleteRecords, and a follower
        taking its leader's first offset): its minimum moves there, never past the expiry limit
        nor back; the commitlog files no queue needs go with the next retention run. The
        queue's minimum (UnknownTopic, UnknownQueue: no such queue)."""
        with self._write_lock, self._index_lock:  # index files may be deleted
            cq = self._queues.queue(topic, queue_id)
            cap = self._expiry_limit(topic, queue_id)
            if cq.advance_min(offset if cap is None else min(offset, cap)):
                self._queues.save_min_offsets()
            return cq.min_offset

    def delete_expired(self, now_ms: int | None = None) -> int:
        """One retention run: move every queue's minimum past the records its topic no longer
        keeps, then delete the commitlog files no queue needs any more (and, oldest first, more
        while the store is above its disk cap). Returns the number of commitlog files deleted."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._write_lock, self._index_lock:  # index files may be deleted
            commitlog = self._commitlog()
            queues = self._queues.snapshot()
            moved = self._expire_queues(commitlog, queues, now_ms)
            # A file goes once every queue starts past it -- and never at or past the last
            # checkpoint: crash recovery rescans the commitlog from there.
            pins = [int(cq.read(cq.min_offset, 1)["phys"][0])
                    for cq in queues.values() if cq.min_offset < cq.max_offset]
            keep_from = min([self._checkpointed(), commitlog.committed_pos, *pins])
            cap = self._config.disk_usage_max_bytes
            rule = deletion_rule(keep_from, 0 if cap is None else self._disk_usage(commitlog), cap)
            deleted = commitlog.delete_oldest(rule)
            self._keys.delete_below(commitlog.min_offset)
            self._origins.delete_below(commitlog.min_offset)
            if deleted:  # over the disk cap, files go whatever the queues still hold
                self.deleted_files.inc(deleted)
                self.deleted_bytes.inc(deleted * commitlog.file_size_bytes)
                for cq in queues.values():
                    moved = cq.delete_below_phys(commitlog.min_offset) or moved
            if moved:
                self._queues.save_min_offsets()
        return deleted

    def _expire_queues(self, commitlog: CommitLog, queues: dict[QueueKey, ConsumeQueue], now_ms: int) -> bool:
        """Move each queue's minimum to its first record stored at or after now - retention
        (bounded by the expiry limit); True if any moved. One store-time read per queue when
        nothing expired, a binary search when something did."""
        limits = self._topics.all_limits()
        moved = False
        for (topic, queue_id), cq in queues.items():
            topic_limits = limits.get(topic)
            lo = cq.min_offset
            cap = self._expiry_limit(topic, queue_id)
            hi = cq.max_offset if cap is None else max(lo, min(cap, cq.max_offset))
            if topic_limits is None or not topic_limits.expires or lo >= hi:  # plain compact: no expiry
                continue
            cutoff_ms = now_ms - (topic_limits.retention_ms or self._config.retention_ms)
            if store_ts(commitlog, cq, lo) >= cutoff_ms:
                continue
            moved = cq.advance_min(first_stored_at(commitlog, cq, lo + 1, hi, cutoff_ms)) or moved
        return moved

    def _disk_usage(self, commitlog: CommitLog) -> int:
        """The blocks commitlog and consumeQueue files take (what ``disk_usage_max_bytes`` caps)."""
        queues = self._queues.snapshot().values()
        return (sum(f.disk_bytes() for f in commitlog.files)
                + sum(f.disk_bytes() for cq in queues for f in cq.files))

    def _run(self) -> None:
        try:
            self.delete_expired()
        except StoreError as err:
            log.error("retention run failed: %s", err)
