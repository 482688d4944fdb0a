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

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from prometheus_client import Counter, Gauge
from prometheus_client.registry import Collector

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue, OffsetExpired
from gms.broker.store.compacted import CompactedLogs, Segment
from gms.broker.store.damage import check_stored_records
from gms.broker.store.queues import QueueTable
from gms.broker.store.records import file_runs, first_stored_at
from gms.broker.store.topic_table import TopicLimits, TopicTable
from gms.broker.store_config import StoreConfig
from gms.private_files import open_private
from gms.record import HEADER_SIZE
from gms.record.columns import bytes_column, property_columns, read_field_offsets
from gms.record.layout import HIDDEN_TAG_HASH, KAFKA_KEY_PROPERTY, TOMBSTONE_PROPERTY
from gms.store_errors import StoreError

log = logging.getLogger(__name__)

CLEAN_ENTRIES_MAX = 1 << 20  # queue offsets one pass over a queue compacts at most (20 MiB of entries)
CHUNK_RECORDS = 256  # records whose keys are read between two yields of the GIL (~0.3 ms of work)
YIELD_S = 0.0001


class IoBudget:
    """Sleeps so that the bytes spent stay under ``rate`` a second (woken early by ``stop``)."""

    def __init__(self, rate: int, stop: threading.Event) -> None:
        self._rate, self._stop = rate, stop
        self._start, self._spent = time.monotonic(), 0

    def spend(self, nbytes: int) -> None:
        self._spent += nbytes
        ahead = self._spent / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            self._stop.wait(ahead)
        if time.monotonic() - self._start > 1.0:  # a fresh window: idle time does not bank a burst
            self._start, self._spent = time.monotonic(), 0


class Candidates(NamedTuple):
    """Records a pass looks at, in queue offset order: where their bytes are and what decides."""

    bufs: list[memoryview]  # a view per record source (the segment, commitlog files)
    source: np.ndarray  # per record, its buffer in ``bufs``
    starts: np.ndarray
    sizes: np.ndarray
    latest: np.ndarray  # bool: the record is its key's latest (or has no key)
    tombstone: np.ndarray  # bool
    store_ts: np.ndarray


def record_keys(buf: memoryview, starts: np.ndarray) -> tuple[list[bytes | None], np.ndarray, np.ndarray]:
    """The compaction key of each record at ``starts`` (the first of its keys: the SDK's ``key=``
    or a Kafka record's key; else a key kept whole as a property; else None: never compacted
    away), whether it is a tombstone, and its store time."""
    fields = read_field_offsets(buf, starts)
    keys = bytes_column(buf, fields.keys_at, fields.headers["keys_len"])
    props = property_columns(buf, fields, (KAFKA_KEY_PROPERTY, TOMBSTONE_PROPERTY))
    found: list[bytes | None] = [
        key.split(b" ", 1)[0] if key else None if kafka is None else b"\x00" + kafka.encode()
        for key, kafka in zip(keys, props[KAFKA_KEY_PROPERTY].tolist(), strict=True)]
    return found, props[TOMBSTONE_PROPERTY] != None, fields.headers["store_ts_ms"].astype(np.int64)  # noqa: E711


def survivors(candidates: Candidates, tombstones_before: int, expired_before: int) -> np.ndarray:
    """Indexes of the candidates a compaction keeps: the latest of each key (and every record
    without one), minus tombstones stored before ``tombstones_before`` and records stored before
    ``expired_before``."""
    keep = candidates.latest & ~(candidates.tombstone & (candidates.store_ts < tombstones_before))
    return np.flatnonzero(keep & (candidates.store_ts >= expired_before))


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
        self._budget = IoBudget(config.compaction_io_bytes_per_s, self._stop)
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
        if self._thread.is_alive():
            self._thread.join()

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
        candidates = self._candidates(commitlog, segment, entries, start, queue_id)
        retention_ms = limits.retention_ms or self._config.retention_ms
        kept = survivors(candidates, now_ms - int(limits.compaction("tombstone_retention_ms")),
                         now_ms - retention_ms if limits.expires else 0)
        written = self._write(topic, queue_id, point, candidates, kept)
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

    def _candidates(self, commitlog: CommitLog, segment: Segment | None, entries: np.ndarray, start: int,
                    queue_id: int) -> Candidates:
        """The compacted log's records, then the commitlog's in [start, point) whose CRCs hold
        (a damaged record, or a lost one, is left out: it is answered as damaged no more)."""
        bufs: list[memoryview] = []
        parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        if segment is not None and len(segment.starts):
            bufs.append(segment.view)
            parts.append((0, segment.starts, segment.sizes))
        phys, sizes = entries["phys"].astype(np.int64), entries["size"].astype(np.int64)
        offsets = np.arange(start, start + len(entries), dtype=np.int64)
        real = np.flatnonzero(sizes >= HEADER_SIZE)
        phys, sizes, offsets = phys[real], sizes[real], offsets[real]
        if len(phys):
            runs = file_runs(commitlog, phys)
            bad = check_stored_records(runs, phys, sizes, offsets, queue_id)
            if bad.size:
                log.error("queue %d: %d damaged record(s) left out of compaction", queue_id, bad.size)
                keep = np.ones(len(phys), bool)
                keep[bad] = False
                phys, sizes = phys[keep], sizes[keep]
                runs = file_runs(commitlog, phys) if len(phys) else []
            for f, lo, hi in runs:
                bufs.append(f.view)
                parts.append((len(bufs) - 1, phys[lo:hi] - f.base_offset, sizes[lo:hi]))
        return self._decide(bufs, parts)

    def _decide(self, bufs: list[memoryview], parts: list[tuple[int, np.ndarray, np.ndarray]]) -> Candidates:
        """The keys of every candidate and which is its key's latest, CHUNK_RECORDS at a time with
        the GIL let go between chunks (the request loop's sends wait no longer than a chunk)."""
        last: dict[bytes | None, int] = {}  # key -> its latest candidate
        tombstones, times, keyless, sources, starts, sizes = [], [], [], [], [], []
        count = 0
        for index, part_starts, part_sizes in parts:
            for lo in range(0, len(part_starts), CHUNK_RECORDS):
                chunk = part_starts[lo:lo + CHUNK_RECORDS]
                self._budget.spend(int(part_sizes[lo:lo + CHUNK_RECORDS].sum()))
                keys, tombstone, store_ts = record_keys(bufs[index], chunk)
                last.update(zip(keys, range(count, count + len(chunk)), strict=True))
                count += len(chunk)
                tombstones.append(tombstone)
                times.append(store_ts)
                keyless.append(np.fromiter((key is None for key in keys), bool, len(keys)))
                self._stop.wait(YIELD_S)
            sources.append(np.full(len(part_starts), index, np.int64))
            starts.append(part_starts)
            sizes.append(part_sizes)

        def joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(arrays) if arrays else np.empty(0, dtype)
        latest = joined(keyless, bool)  # a record without a key always stays
        last.pop(None, None)
        latest[np.fromiter(last.values(), np.int64, len(last))] = True
        return Candidates(bufs, joined(sources, np.int64), joined(starts, np.int64), joined(sizes, np.int64),
                          latest, joined(tombstones, bool), joined(times, np.int64))

    def _write(self, topic: str, queue_id: int, point: int, candidates: Candidates, kept: np.ndarray) -> int:
        """The survivors as the queue's new compacted log (tmp, sync, rename, directory sync);
        the bytes written."""
        tmp = self._compacted.new_tmp(topic, queue_id, point)
        source, starts, sizes = candidates.source[kept], candidates.starts[kept], candidates.sizes[kept]
        # records back to back in one source are written as one run
        breaks = np.flatnonzero((source[1:] != source[:-1]) | (starts[1:] != starts[:-1] + sizes[:-1])) + 1
        firsts = np.concatenate(([0], breaks)).astype(np.int64) if len(kept) else np.empty(0, np.int64)
        ends = np.concatenate((breaks, [len(kept)])).astype(np.int64) if len(kept) else firsts
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            with os.fdopen(fd, "wb") as fh:
                for n, (first, end) in enumerate(zip(firsts.tolist(), ends.tolist(), strict=True), 1):
                    buf, begin = candidates.bufs[int(source[first])], int(starts[first])
                    size = int(starts[end - 1] + sizes[end - 1]) - begin
                    fh.write(buf[begin:begin + size])
                    self._budget.spend(size)
                    if n % CHUNK_RECORDS == 0:
                        self._stop.wait(YIELD_S)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._compacted.install(topic, queue_id, point, tmp)
        return int(sizes.sum())

    def _advance(self, cq: ConsumeQueue, point: int) -> None:
        """The queue's minimum to ``point`` (the compacted log serves below it), saved."""
        with self._write_lock, self._index_lock:  # index files may be deleted
            moved = cq.advance_min(point)
        if moved:
            self._queues.save_min_offsets()
