"""The cleaner of compacted topics: one thread per store that, for each queue of a topic whose
``cleanup_policy`` compacts, keeps the latest record per key below a compaction point in the
queue's compacted log (:mod:`.compacted`) and moves the queue's minimum to that point, so the
commitlog files below it can go (retention deletes them once nothing else needs them).

A pass over a queue, from its current point P0 (or its minimum) on:

1. The new point P is the highest multiple of the topic's ``segment_roll_messages`` at or below
   the first offset the cleaner may not touch yet: stored less than ``min_compaction_lag_ms`` ago,
   at or past the high watermark / the oldest undelivered scheduled message (the expiry limit
   retention uses), or a hidden entry (a scheduled message not yet due, an open transaction's
   half). Nothing to do when P <= P0.
2. Only if the records in [P0, P) make at least ``dirty_ratio`` of the bytes (those plus the
   compacted log's), they are read with the compacted log's and the survivors chosen: for each
   key the record at the highest offset; records without a key always survive; a tombstone is
   dropped once it was stored more than ``tombstone_retention_ms`` ago (with the older records of
   its key, dropped already); ``compact,delete`` topics drop what their retention expired.
3. The survivors are written to ``<P>.tmp`` at a bounded rate (``compaction_io_bytes_per_s``),
   synced, renamed to ``<P>.seg``, the directory synced, the older segment removed; then the
   queue's minimum moves to P and is saved (``min_offsets.json``).

The rules depend only on the records (keys, store times) and the topic's settings, so replicas,
which keep their leader's offsets and store times, keep the same offsets below the same point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prometheus_client import Counter, Gauge
from prometheus_client.registry import Collector

from gms.broker.clean_worker import WORKER_MAIN, Job
from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue, OffsetExpired
from gms.broker.store.compacted import CompactedLogs, Segment
from gms.broker.store.queues import QueueTable
from gms.broker.store.records import file_runs, first_stored_at
from gms.broker.store.topic_table import TopicLimits, TopicTable
from gms.broker.store_config import StoreConfig
from gms.broker.worker_priority import process_threads, restore_priority
from gms.record import HEADER_SIZE
from gms.record.layout import HIDDEN_TAG_HASH
from gms.store_errors import StoreError

log = logging.getLogger(__name__)

CLEAN_ENTRIES_MAX = 1 << 20  # queue offsets one pass over a queue compacts at most (20 MiB of entries)
_NONE = np.empty(0, np.int64)


class Cleaner:
    """The cleaner thread (from :meth:`start` to :meth:`stop`); :meth:`clean` is one pass."""

    def __init__(self, config: StoreConfig, commitlog: Callable[[], CommitLog], queues: QueueTable,
                 topics: TopicTable, compacted: CompactedLogs, locks: tuple[threading.Lock, threading.Lock],
                 expiry_limit: Callable[[str, int], int | None]) -> None:
        self._config = config
        self._commitlog = commitlog
        self._queues = queues
        self._topics = topics
        self._compacted = compacted
        self._write_lock, self._index_lock = locks
        self._expiry_limit = expiry_limit
        self._stop = threading.Event()
        self._worker: subprocess.Popen[bytes] | None = None  # the compaction worker, once started
        self._thread = threading.Thread(target=self._run, name="gms-cleaner", daemon=True)
        self.cleanable_ratio = Gauge("gms_broker_compaction_cleanable_ratio", "Of the compacted queues' bytes"
                                     " the cleaner could compact, the largest fraction not yet compacted"
                                     " (as of its last pass)", registry=None)
        self.reclaimed_bytes = Counter("gms_broker_compaction_reclaimed_bytes", "Bytes of records compaction"
                                       " removed", registry=None)
        self.last_run = Gauge("gms_broker_compaction_last_run_timestamp_seconds", "When the cleaner last"
                              " finished a pass (0: never)", registry=None)
        self.compacted_queues = Counter("gms_broker_compaction_queues_compacted", "Compactions done (a"
                                        " queue's compacted log replaced)", registry=None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if (worker := self._worker) is not None:  # the tmp file of a job under way is removed by its pass
            restore_priority(process_threads(worker.pid))  # its exit, waited for below, needs a CPU
            worker.kill()
        if self._thread.is_alive():
            self._thread.join()
        if worker is not None:
            with contextlib.suppress(BrokenPipeError), worker:  # its pipes closed, its exit waited for
                pass

    def metric_collectors(self) -> list[Collector]:
        return [self.cleanable_ratio, self.reclaimed_bytes, self.last_run, self.compacted_queues]

    def _run(self) -> None:
        interval = self._config.compaction_check_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.clean()
            except Exception:  # a pass that failed is retried at the next one; the thread must live
                log.exception("a compaction pass failed")

    def clean(self, now_ms: int | None = None) -> int:
        """One pass over every compacted queue; the number of queues compacted."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        limits = self._topics.all_limits()
        done, ratio = 0, 0.0
        for (topic, queue_id), cq in self._queues.snapshot().items():
            topic_limits = limits.get(topic)
            if topic_limits is None or self._stop.is_set():
                continue
            if not topic_limits.compacted:  # switched back to delete: its compacted log goes once expired
                segment = self._compacted.segment(topic, queue_id)
                if segment is not None and segment.point < cq.min_offset:
                    self._compacted.drop(topic, queue_id)
                continue
            with self._compacted.busy:  # a topic deletion waits for the queue's pass
                if self._queues.by_key.get((topic, queue_id)) is not cq:  # deleted meanwhile
                    continue
                try:
                    queue_ratio, compacted = self._clean_queue(topic, queue_id, cq, topic_limits, now_ms)
                except (StoreError, OffsetExpired, ValueError, OSError) as err:
                    log.warning("%s/%d: compaction skipped: %s", topic, queue_id, err)
                    continue
            ratio = max(ratio, queue_ratio)
            done += compacted
        self.cleanable_ratio.set(ratio)
        self.last_run.set(time.time())
        return done

    def _clean_queue(self, topic: str, queue_id: int, cq: ConsumeQueue, limits: TopicLimits,
                     now_ms: int) -> tuple[float, bool]:
        """Compact one queue if it is due: (its cleanable ratio, whether it was compacted)."""
        segment = self._compacted.segment(topic, queue_id)
        if segment is not None and segment.point > cq.min_offset:  # a crash came before the minimum moved
            self._advance(cq, segment.point)
        if segment is not None and segment.point < cq.min_offset and limits.expires:
            self._compacted.drop(topic, queue_id)  # retention expired all it held
            segment = None
        start = cq.min_offset
        point = self._point(topic, queue_id, cq, start, limits, now_ms)
        if point <= start:
            return 0.0, False
        commitlog = self._commitlog()
        entries = cq.read(start, point - start)
        dirty = int(entries["size"].astype(np.int64).sum())
        clean = 0 if segment is None else segment.size_bytes
        ratio = dirty / max(dirty + clean, 1)
        if ratio < float(limits.compaction("dirty_ratio")):
            return ratio, False
        retention_ms = limits.retention_ms or self._config.retention_ms
        job = self._job(commitlog, segment, entries, start, queue_id, self._compacted.new_tmp(topic, queue_id, point),
                        now_ms - int(limits.compaction("tombstone_retention_ms")),
                        now_ms - retention_ms if limits.expires else 0)
        written = self._run_worker(job)
        self._compacted.install(topic, queue_id, point, Path(job.tmp))
        self._advance(cq, point)
        self.reclaimed_bytes.inc(max(dirty + clean - written, 0))
        self.compacted_queues.inc()
        return ratio, True

    def _point(self, topic: str, queue_id: int, cq: ConsumeQueue, start: int, limits: TopicLimits,
               now_ms: int) -> int:
        """The compaction point a pass may reach from ``start`` (see the module's step 1)."""
        end = cq.max_offset
        cap = self._expiry_limit(topic, queue_id)
        if cap is not None:
            end = min(end, cap)
        end = min(end, start + CLEAN_ENTRIES_MAX)
        lag = int(limits.compaction("min_compaction_lag_ms"))
        if end > start and lag > 0:
            end = first_stored_at(self._commitlog(), cq, start, end, now_ms - lag + 1)
        if end > start:
            hidden = np.flatnonzero(cq.read(start, end - start)["tag_hash"] == HIDDEN_TAG_HASH)
            if hidden.size:
                end = start + int(hidden[0])
        roll = int(limits.compaction("segment_roll_messages"))
        return end // roll * roll

    def _job(self, commitlog: CommitLog, segment: Segment | None, entries: np.ndarray, start: int, queue_id: int,
             tmp: Path, tombstones_before: int, expired_before: int) -> Job:
        """The worker's job: the compacted log's records, then the commitlog's in [start, point)
        (lost entries left out) and the commitlog files they lie in."""
        phys, sizes = entries["phys"].astype(np.int64), entries["size"].astype(np.int64)
        offsets = np.arange(start, start + len(entries), dtype=np.int64)
        real = np.flatnonzero(sizes >= HEADER_SIZE)
        phys, sizes, offsets = phys[real], sizes[real], offsets[real]
        runs = [(str(f.path), f.base_offset, lo, hi) for f, lo, hi in file_runs(commitlog, phys)] if len(phys) else []
        seg = segment if segment is not None and segment.path is not None and len(segment.starts) else None
        return Job(queue_id, str(tmp), None if seg is None else str(seg.path), runs, tombstones_before,
                   expired_before, self._config.compaction_io_bytes_per_s, _NONE if seg is None else seg.starts,
                   _NONE if seg is None else seg.sizes, phys, sizes, offsets)

    def _started_worker(self) -> subprocess.Popen[bytes]:
        """The worker process, started if there is none or it died."""
        worker = self._worker
        if worker is None or worker.poll() is not None:
            if worker is not None:
                with contextlib.suppress(BrokenPipeError), worker:
                    pass
            worker = self._worker = subprocess.Popen([sys.executable, "-P", "-c", WORKER_MAIN, str(os.getpid())],
                                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            if self._stop.is_set():  # stop() came before the worker was known
                worker.kill()
        return worker

    def _run_worker(self, job: Job) -> int:
        """Run ``job`` in the worker process (:mod:`gms.broker.clean_worker`); the bytes it wrote
        to ``job.tmp`` (synced). The tmp file goes if the worker fails or is killed."""
        try:
            worker = self._started_worker()
            assert worker.stdin is not None and worker.stdout is not None
            try:  # one write (the GIL let go while it blocks), then its answer
                worker.stdin.write(job.encode())
                worker.stdin.flush()
                answer = worker.stdout.readline()
            except (BrokenPipeError, ValueError):  # ValueError: stop() closed the pipes
                answer = b""
            if not answer:
                raise OSError(f"the compaction worker exited with {worker.wait()}")
            return int(json.loads(answer)["written"])
        except BaseException:
            Path(job.tmp).unlink(missing_ok=True)
            raise

    def _advance(self, cq: ConsumeQueue, point: int) -> None:
        """The queue's minimum to ``point`` (the compacted log serves below it), saved."""
        with self._write_lock, self._index_lock:  # index files may be deleted
            moved = cq.advance_min(point)
        if moved:
            self._queues.save_min_offsets()
