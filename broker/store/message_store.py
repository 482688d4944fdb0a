"""MessageStore: the broker's storage engine (commitlog + consumeQueues + flush + recovery +
retention) behind one small API.

Layout under ``root_dir``::

    commitlog/<20-digit start offset>               shared mapped files, all topics
    consumequeue/<topic>/<queue id>/<20-digit byte offset>   20-byte index entries
    index/<20-digit commitlog offset>                key index files (gms.broker.keyindex)
    config/topics.json                               topic -> queue count, retention, message size
    config/min_offsets.json                          queue minimums moved by per-topic retention
    checkpoint, abort                                recovery bookkeeping

One writer at a time (``append`` holds a lock); readers never take it: they work on snapshots of
file lists and on published end offsets, which are advanced only after the bytes they cover are
written and indexed.
"""

from __future__ import annotations

import enum
import itertools
import logging
import mmap
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, NoReturn, Protocol, cast

import numpy as np
from isal.isal_zlib import crc32 as chunk_crc32  # zlib's CRC-32 values, several times faster
from prometheus_client import Counter
from prometheus_client.registry import Collector

from gms.broker.commitlog.commitlog import ENVELOPE_DTYPE, RESIDENT_TAIL_BYTES, CommitLog
from gms.broker.commitlog.flush import FlushListener, FlushService
from gms.broker.commitlog.recovery import recover
from gms.broker.consumequeue.consume_queue import CQ_DTYPE, ConsumeQueue, OffsetExpired, pick_tags
from gms.broker.consumequeue.min_offsets import load_min_offsets, save_min_offsets
from gms.broker.keyindex import TIME_MAX_MS, KeyIndex, keys_field
from gms.broker.mapped_file import MappedFile, fsync_dir, run_when_idle, tree_disk_bytes
from gms.broker.store.checkpoint import (
    AbortMarker,
    Checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from gms.broker.store.health import StoreHealth, fsync_fault_file, out_of_space
from gms.broker.store.layout import check_layout
from gms.broker.store.origins import OriginMap, leader_key, runs
from gms.broker.store.paths import StorePaths
from gms.broker.store.producer_state import DuplicateBatch, ProducerStates
from gms.broker.store.retention import Housekeeper, deletion_rule
from gms.broker.store.topic_table import QUEUE_COUNT_MAX, TopicLimits, TopicTable
from gms.broker.store.truncation_log import TruncationLog
from gms.broker.store_config import StoreConfig
from gms.errors import DuplicateBatchError, MessageNotFoundError
from gms.private_files import make_private_dir, tighten_tree
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING
from gms.record import (
    HEADER_SIZE,
    MAGIC_V1,
    OFF_QUEUE_ID,
    OFF_QUEUE_OFFSET,
    OFF_STORE_TS,
    RecordCheck,
    check_record,
    check_stored,
    record_views,
)
from gms.record.batch import ParsedRecords, parse_batch, parse_one, parse_records
from gms.record.codec import decode_record
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_HALF,
    FLAG_SCHEDULED,
    FLAG_SEQUENCED,
    HIDDEN_TAG_HASH,
    OFFSETS,
    PRODUCER_FLAGS,
    SEQUENCE_PROPERTY,
    TIMER_FLAGS,
    TX_GROUP_PROPERTY,
    TX_ID_CHARS_MAX,
    TX_ID_PROPERTY,
)
from gms.record.sequence import STAMP_BYTES, BatchSequence, read_sequence, read_sequences
from gms.store_errors import (
    CorruptRecord,
    InvalidRecord,
    MessageNotFound,
    MessageTooLarge,
    StoreClosed,
    StoreError,
    StoreIOError,
    StoreReadOnly,
    UnknownQueue,
    UnknownTopic,
)

log = logging.getLogger(__name__)

OFF_FLAGS = OFFSETS["flags"]

# A checkpoint syncs a consumeQueue once it took this many entries since its last sync (two pages,
# RocketMQ's flushConsumeQueueLeastPages); every CQ_FLUSH_THOROUGH_CHECKPOINTS intervals (and at
# close) it syncs all.
CQ_FLUSH_LEAST_ENTRIES = 2 * 4096 // 20
CQ_FLUSH_THOROUGH_CHECKPOINTS = 10
# A read far behind the writer maps its stretch of the commitlog at once only if the stretch is at
# most this many times the bytes it serves (see MessageStore.get).
POPULATE_SPAN_FACTOR_MAX = 4
SCAN_ENTRIES_MAX = 65_536  # consumeQueue entries one filtered ``get`` may examine
BACKLOG_SCAN_MAX = 262_144  # consumeQueue entries (5 MiB) a backlog count reads; more are extrapolated
GET_BYTES_MAX_DEFAULT = 4 << 20
_STORE_TS = _I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")  # a record's total_size
REPLICA_CHECK_TTL_S = 1.0  # records checked for one follower's fetch are not checked again for others this long
LOST_ENTRY_SIZE = 1  # a consumeQueue entry for a record recovery could not find: answered as damaged
_STORED_HEAD = np.dtype([("total_size", ">i4"), ("magic", ">u4"), ("crc32", ">u4"), ("queue_id", ">i4"),
                         ("queue_offset", ">i8"), ("phys_offset", ">i8")])  # the bytes outside the CRC but one
_HEAD_STRUCT = struct.Struct(">iI")
_ENVELOPE_HEAD_STRUCT = struct.Struct(">iqq")
GAP_RECORDS_MAX = 1024  # a queue offset further ahead than this is a flipped bit, not lost records


class GetStatus(enum.Enum):
    FOUND = "found"
    NO_NEW_MESSAGE = "no_new_message"  # offset == max: nothing yet (long-poll here)
    NO_MATCHED_MESSAGE = "no_matched_message"  # entries scanned, none matched the tag filter
    OFFSET_TOO_SMALL = "offset_too_small"  # below the minimum (expired): restart at next_offset
    OFFSET_OVERFLOW = "offset_overflow"  # beyond the end of the queue


class GetResult(NamedTuple):
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[memoryview]  # zero-copy views of stored records (send them as-is)
    # (queue offset, commitlog offset) of records in the answered range whose CRC fails: left
    # out of ``records`` (damage is never served as data), their offsets consumed all the same
    damaged: tuple[tuple[int, int], ...] = ()
    offsets: np.ndarray | None = None  # the queue offsets of the records served (status FOUND)


# (a commitlog file's view, starts of records in it) -> which of those records to serve (bool mask)
RecordSelector = Callable[[memoryview, np.ndarray], np.ndarray]


class TimerRecord(NamedTuple):
    """A stored record the timer service follows: scheduled, a delivered copy or a cancel."""

    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    flags: int  # its TIMER_FLAGS


class TimerListener(Protocol):
    """What the broker's timer service hears from the store (on the writing thread)."""

    def appended(self, records: list[TimerRecord]) -> None:
        """Records with timer flags were stored (client, replicated or the timer's own)."""

    def truncated(self, topic: str, queue_id: int) -> None:
        """A queue was cut back or restarted: what the timer knows of it may be gone."""

    def deleted(self, topic: str) -> None:
        """A topic was deleted, records and all."""


class _NoTimers:
    def appended(self, records: list[TimerRecord]) -> None:
        pass

    def truncated(self, topic: str, queue_id: int) -> None:
        pass

    def deleted(self, topic: str) -> None:
        pass


class AppendResult(NamedTuple):
    end_phys_offset: int  # wait for durable_future(end_phys_offset) to know the batch is on disk
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    phys_offsets: np.ndarray
    touched_queues: list[tuple[str, int]]  # the (topic, queue id) pairs the batch appended to
    queue_counts: list[int]  # how many records went to each of them
    queue_bytes: list[int]  # and how many bytes


class ReplicaRead(NamedTuple):
    """A follower's fetch read of one queue (:meth:`MessageStore.read_runs`)."""

    next_offset: int
    views: list[memoryview]  # the intact records, adjacent ones in one view
    size: int  # their bytes
    sizes: np.ndarray  # int64, each intact record's size, in offset order
    damaged: np.ndarray  # int64 queue offsets of the range held damaged (or lost): not in ``views``


class RepairOutcome(enum.Enum):
    REPAIRED = "repaired"  # the damaged copy was rewritten from the given one
    INTACT = "intact"  # the stored copy was not damaged: nothing written


class ReplicaGap(StoreError):
    """Replicated records do not continue their queue (the follower must truncate or refetch)."""


class _IndexGap(Exception):
    """Recovery found records whose queue offsets do not continue their index."""


class StoreStats(NamedTuple):
    min_offset: int  # first commitlog byte still kept
    max_offset: int  # end of the written commitlog
    disk_used_bytes: int  # what the store's directory takes on disk (``du``: allocated blocks)


class _QueueGroup(NamedTuple):
    queue: ConsumeQueue
    indices: np.ndarray | slice  # the batch's records of this queue, in batch order
    key: tuple[str, int]


class MessageStore:
    """Open with :meth:`open` (or the constructor, which opens: recovery runs, the flush and
    retention threads start); :meth:`close` once, or use it as a context manager."""

    def __init__(self, root_dir: str | Path, config: StoreConfig | None = None) -> None:
        self.root = Path(root_dir)
        self.paths = paths = StorePaths(self.root)
        self.config = config or StoreConfig()
        self._topics = TopicTable(paths.topics)
        # Topic creations and the files of deleted topics, in the order they were asked for.
        self._topic_worker = ThreadPoolExecutor(1, thread_name_prefix="gms-topic-admin")
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queues_lock = threading.Lock()
        self._write_lock = threading.Lock()
        # Held while index files are synced (checkpoint) and while they are closed or deleted
        # (topic delete, queue truncation, retention), so a sync never meets a closed file.
        # Order: _write_lock, then _index_lock, then _queues_lock.
        self._index_lock = threading.Lock()
        self._disk_full = False  # the last append's new files got no space (health DISK_FULL)
        self._abort = AbortMarker(paths.abort)
        self._truncations = TruncationLog(paths.truncations)
        # (topic, queue id) -> the offset retention must not pass (None: the queue's end)
        self._expiry_limit: Callable[[str, int], int | None] = lambda topic, queue_id: None
        # Told of every appended record with timer flags (the broker's timer service).
        self._timers: TimerListener = _NoTimers()
        self._last_store_ts_ms = 0
        # The first checkpoint comes one interval after opening, like every later one.
        self._last_checkpoint_ms = int(time.time() * 1000)
        self._last_thorough_checkpoint_ms = self._last_checkpoint_ms
        self.recovered_damaged = 0  # damaged stretches the last recovery found
        self._rebuilding_all = False  # recovery from the oldest file: queues may start late
        # Queue offsets of records found damaged (by recovery or a read), for a follower to ask
        # its leader's copy of (lost entries are not in it: nothing can repair them in place).
        self._known_damaged: dict[tuple[str, int], set[int]] = {}
        self._known_damaged_lock = threading.Lock()
        # (topic, queue id) -> (first, end offset, monotonic time) of the range read_runs checked last
        self._replica_checked: dict[tuple[str, int], tuple[int, int, float]] = {}
        self._closed = False
        # Messages, offsets and replication state are the owner's only: files 0600 in 0700
        # directories (a store written by an older version is tightened, with a warning).
        make_private_dir(self.root)
        tighten_tree(self.root)
        check_layout(paths.layout, self.config)
        self._topics.load()
        self._truncations.load()
        self._warmer = ThreadPoolExecutor(1, thread_name_prefix="gms-warm", initializer=run_when_idle
                                          ) if self.config.warm_next_file else None
        commitlog = self._commitlog = CommitLog(
            paths.commitlog, self.config.commitlog_file_size_bytes, self._warmer)
        had_data = commitlog.had_data
        self._keys = KeyIndex.open(paths.key_index, slot_count=self.config.key_index_slots,
                                   entries_per_file=self.config.key_index_entries_per_file)
        self._load_queues()
        # Where the records this store replicated lay on their leaders (message ids on any replica).
        self._origins = OriginMap(paths.origins, self.config.commitlog_file_size_bytes)
        # Idempotent producers' last batches: as of the last checkpoint, then what recovery re-reads.
        self.producers = ProducerStates(paths.producers, self.config.producer_state_expiry_ms)
        producers_whole = self.producers.load()
        checkpoint = read_checkpoint(paths.checkpoint)
        clean = checkpoint if checkpoint is not None and not self._abort.found() else None
        if clean is not None and not self._clean_end_ok(clean.commitlog_flushed_offset):
            log.warning("checkpoint does not match the commitlog end; recovering")
            clean = None
        # Recovery re-reads from the checkpoint; derived state found damaged needs it from further back.
        start = checkpoint.cq_safe_offset if checkpoint and producers_whole else commitlog.min_offset
        if self._keys.lost_from is not None:  # damaged key index files were dropped: re-index their records
            start = max(min(start, self._keys.lost_from), commitlog.min_offset)
        if clean is None or not producers_whole or self._keys.lost_from is not None:
            self._recover(start)
        else:
            commitlog.set_end(clean.commitlog_flushed_offset)
            self._last_store_ts_ms = clean.store_ts_ms
        # A new store did not crash.
        self.recovered_from_crash = clean is None and (had_data or self._abort.found())
        # cq_safe_offset of the last checkpoint: crash recovery would start there
        self._checkpointed_offset = checkpoint.cq_safe_offset if checkpoint else commitlog.min_offset
        saved_minimums = load_min_offsets(paths.min_offsets)
        for topic, queue_id in saved_minimums:  # an empty queue that starts past 0 (its files expired)
            if self._topics.get(topic) is not None:
                self._queue_for(topic, queue_id)
        for key, cq in self._queues.items():  # entries whose commitlog file expired are below the minimum
            cq.delete_below_phys(commitlog.min_offset)
            cq.restore_min(saved_minimums.get(key, 0))  # and those per-topic retention expired
        self._truncations.prune(commitlog.min_offset)
        self._abort.set()
        end = commitlog.committed_pos
        self._fsync_fault = fsync_fault_file()  # tests only: see store_health.FSYNC_FAULT_ENV
        self._flusher = FlushService(self.config, self._flush_all, lambda: commitlog.committed_pos, end)
        self._flusher.start()
        self._retention_files = Counter("gms_broker_retention_deleted_files", "Commitlog files deleted by"
                                        " retention (expiry or the disk cap)", registry=None)
        self._retention_bytes = Counter("gms_broker_retention_deleted_bytes", "Bytes of the commitlog files"
                                        " retention deleted", registry=None)
        self._housekeeper = Housekeeper(self._housekeeping, self.config.retention_check_interval_ms)
        self._housekeeper.start()
        self._topic_worker.submit(self._drop_orphan_queues)

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
        self._topic_worker.shutdown(wait=True)
        self._housekeeper.stop()
        with self._write_lock:
            flushed = flusher.stop()
            if flusher.failure is None and flushed == commitlog.committed_pos:
                try:
                    self._checkpoint_at(flushed, int(time.time() * 1000), thorough=True)
                    self._abort.clear()
                except (OSError, StoreIOError) as err:
                    log.error("closed without a clean-shutdown marker, the next start recovers: %s", err)
            else:
                log.error("closed without a clean-shutdown marker after a failed flush (%d of %d bytes on "
                          "disk): the next start recovers", flushed, commitlog.committed_pos)
            if self._warmer is not None:
                self._warmer.shutdown(wait=True, cancel_futures=True)
            commitlog.close()
            for cq in self._queues.values():
                cq.close()
            self._keys.close()
            self._origins.close()
            self._closed = True

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cl(self) -> CommitLog:
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
        return StoreHealth.DISK_FULL if self._disk_full else StoreHealth.WRITABLE

    def _check_writable(self) -> None:
        failure = self._flush_service().failure
        if failure is not None:
            raise StoreReadOnly(failure.cause)

    def _clean_end_ok(self, end: int) -> bool:
        files = self._cl().files
        if not files[0].base_offset <= end <= files[-1].end_offset:
            return False
        if end == files[-1].end_offset:
            return True
        f = self._cl().file_for(end)
        return check_record(f.view, end - f.base_offset, f.size_bytes)[0] is RecordCheck.EMPTY

    def _recover(self, start: int) -> None:
        """Rebuild the index from ``start``; if an index turns out to miss entries before it (files
        lost), rebuild every index from the oldest commitlog file."""
        for cq in self._queues.values():
            cq.truncate_to_phys(start)
        self._keys.truncate(start)
        try:
            recovered = recover(self._cl(), start, self._dispatch_recovered)
        except _IndexGap as gap:
            log.warning("%s; rebuilding every consumeQueue from the whole commitlog", gap)
            for cq in self._queues.values():
                cq.reset(0)
            start = self._cl().min_offset
            self._keys.truncate(start)
            self._rebuilding_all = True
            try:
                recovered = recover(self._cl(), start, self._dispatch_recovered)
            finally:
                self._rebuilding_all = False
        end = recovered.end
        for cq in self._queues.values():
            cq.truncate_to_phys(end)
        self.recovered_damaged = len(recovered.damaged)
        for phys in recovered.damaged:
            self._note_damaged_at(phys)
        log.log(logging.ERROR if recovered.damaged else logging.INFO,
                "recovered commitlog from %d to %d; %d damaged record(s) kept as damaged",
                start, end, len(recovered.damaged))

    # --- topics --------------------------------------------------------------------------------
    def create_topic(self, name: str, queue_count: int, limits: TopicLimits | None = None) -> None:
        """A new incarnation of ``name``: records of a deleted earlier one (still in the commitlog)
        are never indexed under it, even by a crash recovery or an index rebuild."""
        self.create_topics({name: (queue_count, limits or TopicLimits())})

    def create_topics(self, topics: Mapping[str, tuple[int, TopicLimits]]) -> None:
        """Create many topics (name: (queue count, limits)) with one save of the topic table;
        they take records once it is on disk. Blocks on that write: off the event loop, call
        :meth:`create_topics_async`."""
        with self._write_lock:  # no record of an earlier incarnation is stored past this
            created_at_offset = self._cl().committed_pos
        for name in topics:
            self._drop_leftover_queues(name)
        self._topics.create_many(topics, created_at_offset=created_at_offset)
        self._make_queue_dirs({name: range(count) for name, (count, _) in topics.items()})

    def _make_queue_dirs(self, queues: Mapping[str, Iterable[int]]) -> None:
        """Make the index directories of new queues here (the topic worker), not at their first
        append on the request loop: a directory made and synced there cost ~1 ms per queue, and
        the first sends to a thousand new topics stalled the broker's every request for seconds.
        An empty directory is all an empty queue costs (4 KiB). A failure leaves the rest to
        the first append, which makes what is missing."""
        root = self.paths.consumequeue
        try:
            make_private_dir(root)
            for name, queue_ids in queues.items():
                made = [d for d in (self.paths.queue_dir(name, q) for q in queue_ids) if not d.is_dir()]
                if not made:
                    continue
                topic_dir = made[0].parent
                new_topic_dir = not topic_dir.is_dir()
                for directory in made:
                    make_private_dir(directory)
                fsync_dir(topic_dir)
                if new_topic_dir:
                    fsync_dir(root)
        except OSError as err:
            log.warning("cannot make the index directories of new queues (%s): their first appends make them", err)

    def create_topics_async(self, topics: Mapping[str, tuple[int, TopicLimits]]) -> Future[None]:
        """:meth:`create_topics` on the topic worker, after every deletion handed to it before."""
        return self._topic_worker.submit(self.create_topics, topics)

    def _drop_leftover_queues(self, name: str) -> None:
        """Remove the index files of a deleted incarnation of ``name`` that a crash left behind (the
        topic table had dropped it, its files were still being removed): a new one starts empty."""
        leftover = self.paths.consumequeue / name
        if self._topics.get(name) is None and leftover.exists():
            log.warning("topic %s: removing the index files a deleted topic of this name left", name)
            shutil.rmtree(leftover, ignore_errors=True)

    def _drop_orphan_queues(self) -> None:
        """Remove the index files of every topic the table does not list (see above)."""
        try:
            names = [d.name for d in self.paths.consumequeue.iterdir()]
        except FileNotFoundError:
            return
        for name in names:
            self._drop_leftover_queues(name)

    def update_topic(self, name: str, queue_count: int | None = None, limits: TopicLimits | None = None) -> None:
        """Grow the queue count and/or replace the topic's limits (None: leave as is)."""
        self._topics.update(name, queue_count, limits)
        if queue_count is not None:
            self._make_queue_dirs({name: range(queue_count)})

    def update_topic_async(self, name: str, queue_count: int | None = None,
                           limits: TopicLimits | None = None) -> Future[None]:
        """:meth:`update_topic` on the topic worker (it may write the topic table)."""
        return self._topic_worker.submit(self.update_topic, name, queue_count, limits)

    def topic_limits(self, name: str) -> TopicLimits:
        return self._topics.limits(name)

    def delete_topic(self, name: str) -> None:
        self.delete_topics([name]).result()

    def delete_topics(self, names: Iterable[str]) -> Future[None]:
        """Delete topics: from now on they take no record and serve none (call it on the thread
        that appends: O(their queues), no I/O). Their files go on the topic worker: the topic
        table without them first (so a crash never leaves a listed topic missing records), then
        their index files; the future resolves when that is done. UnknownTopic, deleting none,
        if one is not here."""
        with self._write_lock:
            counts = self._topics.remove(names)
            with self._queues_lock:
                queues = [cq for name, count in counts.items() for queue_id in range(count)
                          if (cq := self._queues.pop((name, queue_id), None)) is not None]
            for name in counts:
                self.producers.deleted(name)
        for name in counts:
            self._timers.deleted(name)
        return self._topic_worker.submit(self._remove_topic_files, list(counts), queues)

    def _remove_topic_files(self, names: list[str], queues: list[ConsumeQueue]) -> None:
        with self._index_lock:
            for cq in queues:
                cq.close()
        self._topics.persist()  # raises on a failure: the files stay, listed until a later write drops them
        with self._write_lock:
            for name in names:
                self._truncations.drop_topic(name)
        for name in names:
            shutil.rmtree(self.paths.consumequeue / name, ignore_errors=True)
        self._save_min_offsets()  # a topic created again under one of the names starts at 0

    def topics(self) -> dict[str, int]:
        return self._topics.snapshot()

    def _load_queues(self) -> None:
        """Open the queues that have index files (those that ever held data: an empty queue has
        an empty directory or none) with one listing of the consumeQueue root, not a look-up per
        known topic."""
        topics = self._topics.snapshot()
        try:
            with os.scandir(self.paths.consumequeue) as entries:
                topic_dirs = [Path(e.path) for e in entries if e.name in topics and e.is_dir()]
        except FileNotFoundError:
            return
        for topic_dir in topic_dirs:
            for qdir in topic_dir.iterdir():
                if qdir.name.isdigit() and int(qdir.name) < QUEUE_COUNT_MAX and _has_entries(qdir):
                    self._queue_for(topic_dir.name, int(qdir.name))

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        count = self._topics.queue_count(topic)
        if not 0 <= queue_id < count:
            raise UnknownQueue(topic, queue_id, count)
        return self._queue_for(topic, queue_id)

    def _queue_for(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            with self._queues_lock:
                cq = self._queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self.paths.queue_dir(topic, queue_id), self.config.cq_entries_per_file)
                    self._queues[(topic, queue_id)] = cq
        return cq

    # --- append --------------------------------------------------------------------------------
    def append(self, records: bytes | bytearray | memoryview,
               admit: Callable[[list[tuple[str, int]]], None] | None = None, *,
               allowed_flags: int = PRODUCER_FLAGS) -> AppendResult:
        """Validate, place, copy and index a batch of encoded records, all or nothing.

        ``admit(queues)``, when given, sees the (topic, queue id) pairs of the batch before
        anything is written and may refuse the batch by raising (a replica that does not lead a
        queue, too few in-sync replicas). ``allowed_flags``: the record flags the batch may carry
        (producers: FLAG_SCHEDULED; the broker's timer writes the others)."""
        return self._append(records, admit, replicated=False, allowed_flags=allowed_flags)

    def append_replicated(self, records: bytes | bytearray | memoryview, crc32: int,
                          sizes: np.ndarray | None = None, origin: str | None = None) -> AppendResult:
        """Append records fetched from a queue's leader, keeping the queue offsets (and store
        timestamps) they carry; each queue's records must continue it exactly
        (:class:`ReplicaGap` otherwise, nothing written).

        ``crc32`` is the leader's ``zlib.crc32`` of ``records`` as a whole: one check at GB/s
        instead of one per record. The leader verified every record's own CRC when it accepted
        it, so bytes equal to the leader's carry valid record CRCs (:class:`CorruptRecord`
        otherwise, nothing written) and tag hashes (not recomputed here either); recovery
        still checks record by record. ``sizes``, when
        given, are the records' sizes from the leader's consumeQueue: they replace the walk
        over the records and are checked against every record's header. ``origin``: the leader's
        address, noted with where the records lay there (:mod:`gms.broker.store.origins`)."""
        if chunk_crc32(records) != crc32:
            raise CorruptRecord(0, f"replicated chunk of {len(records)} bytes does not match the leader's CRC")
        return self._append(records, None, replicated=True, sizes=sizes, origin=origin)

    def _append(self, records: bytes | bytearray | memoryview,
                admit: Callable[[list[tuple[str, int]]], None] | None, *, replicated: bool,
                sizes: np.ndarray | None = None, allowed_flags: int = PRODUCER_FLAGS,
                origin: str | None = None) -> AppendResult:
        buf = memoryview(records).cast("B")
        if not replicated and len(buf) >= 4 and _I32.unpack_from(buf)[0] == len(buf):
            done = self._append_one(buf, admit, allowed_flags)  # a single send: no numpy
            if done is not None:
                return done
        with self._write_lock:
            commitlog = self._cl()
            self._check_writable()
            try:
                parsed = parse_batch(buf, self._body_size_max(),
                                     self.config.verify_tag_hash and not replicated,
                                     verify_crc=not replicated, sizes=sizes)
            except InvalidRecord as err:
                self._refuse_body(buf, err)
            sizes = parsed.sizes
            if len(buf) > self.config.record_size_max_bytes and int(sizes.max()) > self.config.record_size_max_bytes:
                raise InvalidRecord("record", f"{int(sizes.max())} bytes cannot fit a commitlog file of "
                                              f"{self.config.commitlog_file_size_bytes} bytes")
            if not replicated:  # the leader checked; a limit changed since must not stall replication
                self._check_message_sizes(parsed, sizes, len(buf))
                if (parsed.headers["phys_offset"] | parsed.headers["store_ts_ms"]).any():
                    # recovery knows a finished append by the envelope it patches in: it must not be forged
                    raise InvalidRecord("envelope", "phys_offset and store_ts_ms are set by the broker: send zeros")
            flags = parsed.headers["flags"]
            flagged = bool(flags.any())  # nearly never: one check for the batch
            if flagged and not replicated:
                if (flags & ~allowed_flags).any():
                    raise InvalidRecord("flags", f"only flags {allowed_flags:#x} may be sent")
                scheduled = np.flatnonzero(flags & FLAG_SCHEDULED)
                if scheduled.size:
                    self._check_delivery_times(buf, parsed.starts[scheduled].tolist())
                halves = np.flatnonzero(flags & FLAG_HALF)
                if halves.size:
                    _check_halves(buf, parsed.starts[halves].tolist())
            queue_ids = parsed.headers["queue_id"].astype(np.int64)
            groups = self._group_by_queue(parsed, queue_ids)
            if admit is not None:
                admit([group.key for group in groups])
            sequenced = flagged and bool((flags & FLAG_SEQUENCED).any())
            checked: dict[int, BatchSequence] = {}  # the stamps read by the check, by record index
            if sequenced and not replicated:
                checked = self._check_sequence(buf, parsed, flags, groups)
            envelope = np.empty(len(queue_ids), ENVELOPE_DTYPE)
            if replicated:
                queue_offsets = self._check_replicated_offsets(groups, parsed)
                store_ts_ms = max(self._last_store_ts_ms, int(parsed.headers["store_ts_ms"].max()))
                envelope["store_ts_ms"] = parsed.headers["store_ts_ms"]
            else:
                queue_offsets = self._assign_queue_offsets(groups, len(queue_ids))
                store_ts_ms = max(int(time.time() * 1000), self._last_store_ts_ms)
                envelope["store_ts_ms"] = store_ts_ms
            placement = commitlog.place(parsed.starts, sizes)
            envelope["queue_id"] = queue_ids
            envelope["queue_offset"] = queue_offsets
            envelope["phys_offset"] = placement.phys
            try:
                commitlog.prepare(placement)  # create every file the batch needs: what can fail, fails here
                self._reserve(groups, len(queue_ids))
            except StoreIOError as err:
                self._disk_full = out_of_space(err)
                raise
            self._disk_full = False
            try:
                commitlog.write(buf, placement, envelope)
                self._dispatch(groups, queue_offsets, placement.phys, sizes, parsed.index_tag_hashes, reserved=True)
                self._keys.add(np.frombuffer(buf, np.uint8), parsed, placement.phys, envelope["store_ts_ms"])
            except BaseException:  # nothing was published: leave no trace for the next append or recovery
                commitlog.rollback(placement.end_offset)
                for cq, idx, _ in groups:
                    cq.erase(int(queue_offsets[idx][0]), _group_size(idx, len(queue_ids)))
                raise
            if sequenced:  # before the commit, as the indexes: a checkpoint that covers the batch knows it
                self._note_sequences(buf, parsed, queue_offsets, placement.phys, envelope["store_ts_ms"], checked)
            commitlog.commit(placement.end_offset)
            self._last_store_ts_ms = store_ts_ms
            if flagged and (timer_flags := flags & TIMER_FLAGS).any():
                self._tell_timers(parsed, queue_ids, queue_offsets, placement.phys, timer_flags)
            if origin is not None:  # where they lay on the leader: its envelopes in ``buf``
                try:
                    self._origins.add(runs(parsed.headers["phys_offset"].astype(np.int64), placement.phys,
                                           sizes.astype(np.int64), leader_key(origin)))
                except OSError as err:  # stored and committed: only their leader's message ids miss them here
                    log.warning("message ids of %d record(s) from %s will not resolve on this replica: %s",
                                len(queue_ids), origin, err)
        self._flush_service().appended(len(queue_ids))
        n = len(queue_ids)
        return AppendResult(placement.end_offset, queue_ids, queue_offsets, placement.phys,
                            [group.key for group in groups], [_group_size(g.indices, n) for g in groups],
                            _group_bytes(groups, sizes))

    def _append_one(self, buf: memoryview, admit: Callable[[list[tuple[str, int]]], None] | None,
                    allowed_flags: int) -> AppendResult | None:
        """:meth:`_append` of a single record with struct instead of numpy: the same checks and
        steps (numpy's fixed costs were most of a single send). None if it does not fit the
        active file: the general path rolls."""
        with self._write_lock:
            commitlog = self._cl()
            self._check_writable()
            try:
                record = parse_one(buf, self._body_size_max(), self.config.verify_tag_hash)
            except InvalidRecord as err:
                self._refuse_body(buf, err)
            size, topic, queue_id = record.size, record.topic, record.queue_id
            if size > self.config.record_size_max_bytes:
                raise InvalidRecord("record", f"{size} bytes cannot fit a commitlog file of "
                                              f"{self.config.commitlog_file_size_bytes} bytes")
            limit = self._topics.limits(topic).message_size_bytes_max or self._default_limit(0)
            unstamped = size - STAMP_BYTES if record.flags & FLAG_SEQUENCED else size  # as in _check_message_sizes
            if limit and unstamped > limit:
                raise MessageTooLarge(topic, unstamped, limit)
            if record.stamped:
                raise InvalidRecord("envelope", "phys_offset and store_ts_ms are set by the broker: send zeros")
            if record.flags & ~allowed_flags:
                raise InvalidRecord("flags", f"only flags {allowed_flags:#x} may be sent")
            if record.flags & FLAG_SCHEDULED:
                self._check_delivery_times(buf, [0])
            if record.flags & FLAG_HALF:
                _check_halves(buf, [0])
            cq = self._queue(topic, queue_id)
            if admit is not None:
                admit([(topic, queue_id)])
            sequence = self._admit_sequence(buf, cq, (topic, queue_id), 1) if record.flags & FLAG_SEQUENCED else None
            phys = commitlog.place_one(size)
            if phys is None:
                return None
            queue_offset = cq.max_offset
            try:
                commitlog.prepare_one(phys, size)
                cq.reserve(1)
            except StoreIOError as err:
                self._disk_full = out_of_space(err)
                raise
            self._disk_full = False
            store_ts_ms = max(int(time.time() * 1000), self._last_store_ts_ms)
            try:
                commitlog.write_one(buf, phys, queue_id, queue_offset, store_ts_ms)
                cq.write_one(queue_offset, phys, size, record.tag_hash)
                self._keys.add_one(topic, keys_field(buf), phys, store_ts_ms)
                cq.publish(queue_offset + 1)
            except BaseException:  # as in _append: leave no trace
                commitlog.rollback(phys + size)
                cq.erase(queue_offset, 1)
                raise
            if sequence is not None:  # before the commit, as in _append
                self.producers.appended((topic, queue_id), sequence, queue_offset, phys, store_ts_ms)
            commitlog.commit(phys + size)
            self._last_store_ts_ms = store_ts_ms
            if record.flags & TIMER_FLAGS:
                self._timers.appended([TimerRecord(topic, queue_id, queue_offset, phys, record.flags & TIMER_FLAGS)])
        self._flush_service().appended(1)
        return AppendResult(phys + size, np.array([queue_id], np.int64), np.array([queue_offset], np.int64),
                            np.array([phys], np.int64), [(topic, queue_id)], [1], [size])

    def _check_sequence(self, buf: memoryview, parsed: ParsedRecords, flags: np.ndarray,
                        groups: list[_QueueGroup]) -> dict[int, BatchSequence]:
        """An idempotent producer's batches: each queue's records one contiguous batch, stamped on
        its first record; the stamps, by the index of the record that carries each. A body of
        several queues' batches (a producer's batches for one broker sent together) is admitted
        whole or not at all: each is checked in body order, and one stored before refuses the body
        (``DuplicateBatchError``: the producer sends each alone, answered with where it is), as
        does any other refusal."""
        stamped = np.flatnonzero(flags & FLAG_SEQUENCED)
        n = len(flags)
        if len(groups) == 1:
            if len(stamped) != 1 or stamped[0] != 0:
                raise InvalidRecord(SEQUENCE_PROPERTY, "only the first record of a queue's batch carries a"
                                                       " producer sequence")
            cq, _, key = groups[0]
            return {0: self._admit_sequence(buf, cq, key, n)}
        if isinstance(groups[0].indices, slice):  # several groups of records in a row, in body order
            firsts = [cast(slice, idx).start for _, idx, _ in groups]
            counts = [_group_size(idx, n) for _, idx, _ in groups]
            in_rows = True
        else:  # index arrays
            indices = [cast(np.ndarray, idx) for _, idx, _ in groups]
            firsts = [int(idx[0]) for idx in indices]
            counts = [len(idx) for idx in indices]
            in_rows = all(int(idx[-1]) - int(idx[0]) + 1 == len(idx) for idx in indices)
        if len(stamped) != len(groups) or set(stamped.tolist()) != set(firsts) or not in_rows:
            raise InvalidRecord(SEQUENCE_PROPERTY, "each queue's records in a send are one batch, in a row,"
                                                   " stamped with a producer sequence on its first record")
        checked = {}
        positions = parsed.starts[firsts].tolist()
        stamps: list[BatchSequence] | list[None] = _read_stamps(buf, parsed, firsts) or [None] * len(firsts)
        for first, count, pos, stamp, (cq, _, key) in sorted(
                zip(firsts, counts, positions, stamps, groups, strict=True), key=lambda g: g[0]):
            try:
                checked[first] = self._admit_sequence(buf, cq, key, count, pos, stamp)
            except DuplicateBatch as duplicate:
                raise DuplicateBatchError(
                    f"{duplicate}; in a send of {len(groups)} queues' batches: nothing was stored, send each"
                    " batch alone", fields={"topic": key[0], "queue_id": key[1]}) from None
        return checked

    def _admit_sequence(self, buf: memoryview, cq: ConsumeQueue, key: tuple[str, int], n: int,
                        pos: int = 0, sequence: BatchSequence | None = None) -> BatchSequence:
        """The stamp of a batch of ``n`` records to ``key`` (its first at ``pos``; ``sequence``:
        read already): refused if out of order or fenced, DuplicateBatch if stored before
        (docs/idempotence.md)."""
        if sequence is None:
            sequence = read_sequence(buf, pos)
        if sequence.records != n:
            raise InvalidRecord(SEQUENCE_PROPERTY, f"the batch holds {n} records, its sequence says {sequence.records}")
        known = self.producers.check(key, sequence, cq.max_offset)
        if known is not None:
            raise DuplicateBatch(key, known.base_offset, known.stored, n)
        return sequence

    def _note_sequences(self, buf: memoryview | np.ndarray, parsed: ParsedRecords, queue_offsets: np.ndarray,
                        phys: np.ndarray, store_ts_ms: np.ndarray,
                        checked: Mapping[int, BatchSequence] | None = None) -> None:
        """Stamped records were stored (sent, replicated or re-read by recovery): the producer state
        follows. ``buf`` holds the records at ``parsed.starts``; ``checked``: stamps read already."""
        headers, topics, checked = parsed.headers, parsed.topics, checked or {}
        stamped = np.flatnonzero(headers["flags"] & FLAG_SEQUENCED)
        for i, topic_index, queue_id, start, queue_offset, at, ts_ms in zip(
                stamped.tolist(), parsed.topic_index[stamped].tolist(), headers["queue_id"][stamped].tolist(),
                parsed.starts[stamped].tolist(), queue_offsets[stamped].tolist(), phys[stamped].tolist(),
                store_ts_ms[stamped].tolist(), strict=True):
            key = (topics[topic_index], queue_id)
            sequence = checked.get(i)
            if sequence is None:
                try:
                    sequence = read_sequence(buf, start)
                except InvalidRecord as err:  # stored already: only the producer state misses it
                    log.warning("%s/%d@%d: %s", *key, queue_offset, err)
                    continue
            self.producers.appended(key, sequence, queue_offset, at, ts_ms)

    def batch_result(self, key: tuple[str, int], base_offset: int, count: int) -> AppendResult:
        """An AppendResult of records stored before (an idempotent producer's duplicate batch)."""
        cq = self._queue(*key)
        if base_offset < cq.min_offset or base_offset + count > cq.max_offset:
            raise MessageNotFoundError(f"{key[0]}/{key[1]}: offsets {base_offset}..{base_offset + count - 1} are"
                                  " not all in the queue any more")
        entries = cq.read(base_offset, count)
        phys = entries["phys"].astype(np.int64)
        sizes = entries["size"].astype(np.int64)
        return AppendResult(int((phys + sizes).max()), np.full(count, key[1], np.int64),
                            np.arange(base_offset, base_offset + count, dtype=np.int64), phys, [key], [count],
                            [int(sizes.sum())])

    def _check_delivery_times(self, buf: memoryview, starts: list[int]) -> None:
        """Scheduled records carry a delivery time no further ahead than schedule_max_delay_ms."""
        latest = int(time.time() * 1000) + self.config.schedule_max_delay_ms
        for start in starts:
            raw = decode_record(buf, start, verify_crc=False).properties.get(DELIVER_AT_PROPERTY, "")
            if not raw.lstrip("-").isdigit():
                raise InvalidRecord(DELIVER_AT_PROPERTY, f"a scheduled message needs its delivery time in epoch ms,"
                                                         f" not {raw!r}")
            if int(raw) > latest:
                raise InvalidRecord(DELIVER_AT_PROPERTY, f"delivery more than {self.config.schedule_max_delay_ms} ms"
                                                         " ahead (schedule_max_delay_ms)")

    def _refuse_body(self, buf: memoryview, err: InvalidRecord) -> NoReturn:
        """Raise ``err``, a batch's parse failure, unless it is a body over the limits of the topics
        here in a batch naming a topic not here yet (created a moment ago, with a larger
        ``message_size_bytes_max``): that is UnknownTopic, which senders retry, not a refusal."""
        if err.field == "body":
            try:
                topics = parse_batch(buf, MESSAGE_SIZE_BYTES_MAX_CEILING, False, verify_crc=False).topics
            except InvalidRecord:
                raise err from None
            for topic in topics:
                if self._topics.get(topic) is None:
                    raise UnknownTopic(topic) from err
        raise err

    def _body_size_max(self) -> int:
        """The body limit a record is parsed with: ``body_size_max_bytes``, or the largest topic's
        ``message_size_bytes_max`` when that is larger (then each record is held to its own topic's
        limit by :meth:`_check_message_sizes`)."""
        return max(self.config.body_size_max_bytes, self._topics.message_size_max)

    def _default_limit(self, unchecked: int) -> int:
        """The record limit of a topic without its own ``message_size_bytes_max``: ``unchecked``
        (the parse's body check was ``body_size_max_bytes``) unless a topic's larger limit raised
        that check; then ``body_size_max_bytes``, counted as stored."""
        return unchecked if self._topics.message_size_max <= self.config.body_size_max_bytes \
            else self.config.body_size_max_bytes

    def _check_message_sizes(self, parsed: ParsedRecords, sizes: np.ndarray, batch_bytes: int) -> None:
        """Each record against its topic's ``message_size_bytes_max``: nothing when the whole batch
        is within the smallest limit (the usual case), else one vectorised comparison."""
        per_topic = [self._topics.limits(t).message_size_bytes_max or self._default_limit(batch_bytes)
                     for t in parsed.topics]
        if batch_bytes <= min(per_topic):
            return
        limits = np.array(per_topic, np.int64)
        # an idempotent producer's stamp is the broker's, not the message's: it does not count
        stamps = np.where(parsed.headers["flags"] & FLAG_SEQUENCED, STAMP_BYTES, 0)
        over = np.flatnonzero(sizes - stamps > limits[parsed.topic_index])
        if over.size:
            i = int(over[0])
            raise MessageTooLarge(parsed.topics[parsed.topic_index[i]], int(sizes[i] - stamps[i]),
                                  int(limits[parsed.topic_index[i]]))

    @staticmethod
    def _check_replicated_offsets(groups: list[_QueueGroup], parsed: ParsedRecords) -> np.ndarray:
        queue_offsets = parsed.headers["queue_offset"].astype(np.int64)
        for cq, idx, key in groups:
            offs = queue_offsets[idx]
            if int(offs[0]) != cq.max_offset or (len(offs) > 1 and (np.diff(offs) != 1).any()):
                raise ReplicaGap(f"queue {key[0]}/{key[1]} ends at {cq.max_offset}; replicated records"
                                 f" carry offsets {int(offs[0])}..{int(offs[-1])} that do not continue it")
        return queue_offsets

    def truncate_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Cut a queue back to ``offset`` (a replica following a new leader). Durable across
        crash recovery: a marker is written first, and recovery never re-indexes what it covers."""
        with self._write_lock:
            commitlog = self._cl()
            self._check_writable()
            cq = self._queue(topic, queue_id)
            if offset >= cq.max_offset:
                return
            self._truncations.add((topic, queue_id), offset, commitlog.committed_pos)
            with self._known_damaged_lock:  # records found damaged past the cut are gone
                found = self._known_damaged.get((topic, queue_id), set())
                found.difference_update([o for o in found if o >= offset])
            with self._index_lock:
                cq.truncate(offset)
                try:
                    cq.flush()
                except StoreIOError as err:
                    self._flush_service().fail(err)
                    raise
            self.producers.truncated((topic, queue_id), offset)
        self._timers.truncated(topic, queue_id)

    def restart_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Start a queue over, empty, at ``offset`` past its end: a follower whose leader no
        longer has the records it misses (retention). Its old records stay in the commitlog but
        are never indexed again: a truncation marker covers all of them for crash recovery."""
        with self._write_lock:
            commitlog = self._cl()
            cq = self._queue(topic, queue_id)
            if offset <= cq.max_offset:
                return
            self._truncations.add((topic, queue_id), 0, commitlog.committed_pos)
            with self._index_lock:
                cq.reset(offset)
            self._save_min_offsets()
            self.producers.truncated((topic, queue_id), 0)
        self._timers.truncated(topic, queue_id)

    def _group_by_queue(self, parsed: ParsedRecords, queue_ids: np.ndarray) -> list[_QueueGroup]:
        """Split a batch by (topic, queue); unknown topics and queue ids raise here."""
        if len(parsed.topics) == 1:  # the usual batch, one queue of one topic: few or no numpy calls
            first = int(queue_ids[0])
            if (0 <= first < self._topics.queue_count(parsed.topics[0])
                    and (len(queue_ids) == 1 or bool((queue_ids == first).all()))):
                key = (parsed.topics[0], first)
                return [_QueueGroup(self._queue_for(*key), slice(None), key)]
        counts = np.array([self._topics.queue_count(t) for t in parsed.topics], np.int64)
        per_record = counts[parsed.topic_index]
        bad = np.flatnonzero((queue_ids < 0) | (queue_ids >= per_record))
        if bad.size:
            i = int(bad[0])
            raise UnknownQueue(parsed.topics[parsed.topic_index[i]], int(queue_ids[i]), int(per_record[i]))
        keys = parsed.topic_index * QUEUE_COUNT_MAX + queue_ids
        if (keys == keys[0]).all():
            key = (parsed.topics[parsed.topic_index[0]], int(queue_ids[0]))
            return [_QueueGroup(self._queue_for(*key), slice(None), key)]
        topics, queue_for = parsed.topics, self._queue_for
        starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        firsts = [0, *starts.tolist()]
        run_keys = keys[firsts].tolist()
        if len(set(run_keys)) == len(run_keys):  # each queue's records in a row (a producer's batches): slices
            ends = [*firsts[1:], len(keys)]
            run_topics = [topics[t] for t in parsed.topic_index[firsts].tolist()]
            return [_QueueGroup(queue_for(topic, queue_id), slice(first, end), (topic, queue_id))
                    for topic, queue_id, first, end in zip(run_topics, queue_ids[firsts].tolist(), firsts, ends,
                                                           strict=True)]
        order = np.argsort(keys, kind="stable")
        bounds = np.flatnonzero(np.diff(keys[order])) + 1
        groups = []
        for idx in np.split(order, bounds):
            first = int(idx[0])
            key = (parsed.topics[parsed.topic_index[first]], int(queue_ids[first]))
            groups.append(_QueueGroup(self._queue_for(*key), idx, key))
        return groups

    @staticmethod
    def _assign_queue_offsets(groups: list[_QueueGroup], n: int) -> np.ndarray:
        """The one place queue offsets are chosen: each queue continues from its end, no gaps.
        (A replica would instead take the leader's offsets after truncating its queues.)"""
        if len(groups) > 1 and isinstance(groups[0].indices, slice):  # records in a row per queue: one pass
            counts = [_group_size(idx, n) for _, idx, _ in groups]
            shifts = [cq.max_offset - cast(slice, idx).start for cq, idx, _ in groups]  # record index -> offset
            return np.arange(n, dtype=np.int64) + np.repeat(np.array(shifts, np.int64), counts)
        offsets = np.empty(n, np.int64)
        for cq, idx, _ in groups:
            offsets[idx] = np.arange(cq.max_offset, cq.max_offset + _group_size(idx, n), dtype=np.int64)
        return offsets

    @staticmethod
    def _reserve(groups: list[_QueueGroup], n: int) -> None:
        for cq, idx, _ in groups:
            cq.reserve(_group_size(idx, n))

    @classmethod
    def _dispatch(cls, groups: list[_QueueGroup], queue_offsets: np.ndarray, phys: np.ndarray,
                  sizes: np.ndarray, tag_hashes: np.ndarray, *, reserved: bool = False) -> None:
        """Write one consumeQueue entry per record (the entries of a queue go in with one copy), then
        publish every queue's new end: a batch is never seen half indexed. ``reserved``: the
        append reserved the entries already (recovery's batches are reserved here)."""
        n = len(phys)
        if not reserved:
            cls._reserve(groups, n)
        entries = np.empty(n, CQ_DTYPE)
        entries["phys"] = phys
        entries["size"] = sizes
        entries["tag_hash"] = tag_hashes
        for cq, idx, _ in groups:
            cq.write(int(queue_offsets[idx][0]), entries[idx])
        for cq, idx, _ in groups:
            cq.publish(int(queue_offsets[idx][0]) + _group_size(idx, n))

    def _dispatch_recovered(self, parsed: ParsedRecords, phys: np.ndarray) -> None:
        """Rebuild index entries for records found by recovery, at the offsets they carry."""
        queue_ids = parsed.headers["queue_id"].astype(np.int64)
        counts = np.array([self._topics.get(t) or 0 for t in parsed.topics], np.int64)
        born = np.array([self._topics.created_at_offset(t) for t in parsed.topics], np.int64)
        known = (queue_ids >= 0) & (queue_ids < counts[parsed.topic_index]) & (phys >= born[parsed.topic_index])
        if not known.all():  # records of deleted topics (or earlier incarnations) or queues: nothing to index
            keep = np.flatnonzero(known)
            if not keep.size:
                return
            parsed, queue_ids, phys = _kept(parsed, keep), queue_ids[keep], phys[keep]
        groups = self._group_by_queue(parsed, queue_ids)
        queue_offsets = parsed.headers["queue_offset"].astype(np.int64)
        if self._truncations:  # a replica cut these records off: never index them again
            cut = np.zeros(len(queue_ids), bool)
            for _, idx, key in groups:
                covered = self._truncations.truncated(*key, queue_offsets[idx], phys[idx])
                if covered is not None:
                    cut[idx] = covered
            if cut.any():
                keep = np.flatnonzero(~cut)
                if not keep.size:
                    return
                parsed = ParsedRecords(parsed.starts[keep], parsed.headers[keep], parsed.topics,
                                       parsed.topic_index[keep])
                queue_ids, phys, queue_offsets = queue_ids[keep], phys[keep], queue_offsets[keep]
                groups = self._group_by_queue(parsed, queue_ids)
        sizes, tag_hashes = parsed.sizes, parsed.index_tag_hashes
        consistent = []
        for group in groups:
            cq, idx, key = group
            offs = queue_offsets[idx]
            first = int(offs[0])
            continues = len(offs) == 1 or bool((np.diff(offs) == 1).all())
            if self._rebuilding_all and not cq.files and first > cq.max_offset:
                cq.reset(first)  # older entries expired with their commitlog files
            if continues and first != cq.max_offset and not self._rebuilding_all:
                # the index, not the records, is off: rebuild it all
                raise _IndexGap(f"queue {cq.directory}: records carry offset {first}, "
                                f"the index ends at {cq.max_offset}")
            if continues and first == cq.max_offset:
                consistent.append(group)
            else:  # damaged envelopes: never a reason to refuse to start
                self._index_reconciled(cq, key, offs, phys[idx], sizes[idx], tag_hashes[idx])
        if consistent:
            self._dispatch(consistent, queue_offsets, phys, sizes, tag_hashes)
        f = self._cl().file_for(int(phys[0]))  # recovery hands over the records of one file at a time
        in_file = ParsedRecords(phys - f.base_offset, parsed.headers, parsed.topics, parsed.topic_index)
        self._keys.add(f.array, in_file, phys, parsed.headers["store_ts_ms"])
        if (parsed.headers["flags"] & FLAG_SEQUENCED).any():
            self._note_sequences(f.array, in_file, queue_offsets, phys, parsed.headers["store_ts_ms"])
        self._last_store_ts_ms = max(self._last_store_ts_ms, int(parsed.headers["store_ts_ms"].max()))

    def _index_reconciled(self, cq: ConsumeQueue, key: tuple[str, int], carried: np.ndarray, phys: np.ndarray,
                          sizes: np.ndarray, tag_hashes: np.ndarray) -> None:
        """Index a queue's recovered records whose queue offsets do not continue it (a bit flipped
        in an envelope, or records lost in a damaged stretch): offsets are reconciled, damaged
        envelopes rewritten, missing records answered as damaged. See :func:`reconcile_offsets`."""
        plan = reconcile_offsets(carried, cq.max_offset)
        commitlog = self._cl()
        entries: list[tuple[int, int, int]] = []
        for k, offset in enumerate(plan.offsets.tolist()):
            if offset < 0:
                log.error("%s/%d: record at commitlog offset %d carries queue offset %d, which "
                          "does not fit the queue: not indexed", *key, int(phys[k]), int(carried[k]))
                continue
            lost = offset - (cq.max_offset + len(entries))
            if lost:
                log.error("%s/%d: %d record(s) before offset %d lost in damaged commitlog data: "
                          "answered as damaged", *key, lost, offset)
                entries += [(int(phys[k]), LOST_ENTRY_SIZE, 0)] * lost
            if offset != int(carried[k]):
                log.error("%s/%d: record at commitlog offset %d carried queue offset %d: repaired to %d",
                          *key, int(phys[k]), int(carried[k]), offset)
                f = commitlog.file_for(int(phys[k]))
                _I64.pack_into(f.view, int(phys[k]) - f.base_offset + OFF_QUEUE_OFFSET, offset)
            entries.append((int(phys[k]), int(sizes[k]), int(tag_hashes[k])))
        if entries:
            start = cq.max_offset
            cq.reserve(len(entries))
            cq.write(start, np.array(entries, CQ_DTYPE))
            cq.publish(start + len(entries))

    # --- durability ----------------------------------------------------------------------------
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

    def _flush_all(self) -> int:
        """The flush thread's flush: the commitlog, and every ``checkpoint_interval_ms`` the
        indexes and the checkpoint. A failed fsync raises StoreIOError (the flush service then
        fails stop); a checkpoint file that cannot be written is logged, the previous one stays."""
        commitlog = self._cl()
        end = commitlog.committed_pos
        start = self._flusher.flushed_offset
        if self._fsync_fault is not None and end > start and self._fsync_fault.exists():
            raise StoreIOError(f"fdatasync failed: injected while {self._fsync_fault} exists")
        commitlog.flush_range(start, end)
        commitlog.release_behind(end - RESIDENT_TAIL_BYTES)
        now_ms = int(time.time() * 1000)
        if now_ms - self._last_checkpoint_ms >= self.config.checkpoint_interval_ms:
            try:
                self._checkpoint_at(end, now_ms)
            except OSError as err:
                self._last_checkpoint_ms = now_ms  # retried at the next interval, not every flush
                log.error("checkpoint not written (the previous one stays valid): %s", err)
        return end

    def _checkpoint_at(self, end: int, now_ms: int, *, thorough: bool = False) -> None:
        """Flush the indexes up to ``end`` (all entries below it are written) and record from where
        recovery must re-read the commitlog.

        A consumeQueue with fewer than CQ_FLUSH_LEAST_ENTRIES new entries is not synced, except at a
        thorough checkpoint (every CQ_FLUSH_THOROUGH_CHECKPOINTS intervals, and at close), and the checkpoint stops at
        its first unsynced entry's record (RocketMQ's flushConsumeQueueLeastPages): with thousands
        of queues each taking a few entries a second, syncing every queue's file every second was
        thousands of fdatasyncs a second, and each synced page faulted again (write-protected) at
        its next entry, on the request loop."""
        thorough = thorough or (now_ms - self._last_thorough_checkpoint_ms
                                >= CQ_FLUSH_THOROUGH_CHECKPOINTS * self.config.checkpoint_interval_ms)
        least = 0 if thorough else CQ_FLUSH_LEAST_ENTRIES
        safe = end
        with self._index_lock:
            with self._queues_lock:
                queues = list(self._queues.values())
            for cq in queues:
                unsynced = cq.flush(least)
                if unsynced is not None:
                    safe = min(safe, unsynced)
            self._keys.flush()
            self._origins.sync()
        self.producers.save(end, now_ms)  # before the checkpoint: recovery from it re-reads what follows
        write_checkpoint(self.paths.checkpoint, Checkpoint(end, safe, self._last_store_ts_ms, now_ms))
        self._last_checkpoint_ms = now_ms
        if thorough:
            self._last_thorough_checkpoint_ms = now_ms
        self._checkpointed_offset = safe

    # --- reads ---------------------------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).max_offset

    def get(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
            max_bytes: int = GET_BYTES_MAX_DEFAULT, tag_hashes: frozenset[int] | None = None,
            read_limit: int | None = None, coalesce: bool = False, select: RecordSelector | None = None) -> GetResult:
        """Up to ``max_msgs`` records (and about ``max_bytes``, at least one) from ``offset``,
        skipping entries whose tag hash is not subscribed without reading the commitlog.

        ``read_limit`` (a replicated queue's high watermark) hides the offsets at and past it:
        they are answered like the end of the queue, and ``max_offset`` reports the limit.
        ``coalesce`` returns adjacent records as one view (a pull answer sent as-is: a view per
        record would cost a Python object and a write buffer per message). ``select`` (an SQL
        filter's) keeps only the records it selects of those read, once their CRCs held: the
        others cost no view; none selected (and none damaged) answers NO_MATCHED_MESSAGE."""
        commitlog = self._cl()
        commitlog.reads += 1
        cq = self._queue(topic, queue_id)
        lo, end = cq.min_offset, cq.max_offset
        hi = end if read_limit is None else max(min(end, read_limit), lo)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi, [])
        if offset > end:
            return GetResult(GetStatus.OFFSET_OVERFLOW, hi, lo, hi, [])
        if offset >= hi:
            return GetResult(GetStatus.NO_NEW_MESSAGE, offset, lo, hi, [])
        window = min(hi - offset, max(max_msgs, 1) if tag_hashes is None else SCAN_ENTRIES_MAX)
        try:
            entries = cq.read(offset, window)
        except (OffsetExpired, ValueError):  # retention moved the minimum and closed or dropped index files
            lo = cq.min_offset
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, max(hi, lo), [])
        if tag_hashes is None:
            visible = entries["tag_hash"] != HIDDEN_TAG_HASH  # scheduled messages not yet due, cancels
            picked = np.arange(window) if visible.all() else np.flatnonzero(visible)
        else:  # the window's entries of those tags, scanned only until max_msgs are found
            picked, window = pick_tags(entries, np.fromiter(tag_hashes, np.int64), max(max_msgs, 1))
        if not picked.size:
            return GetResult(GetStatus.NO_MATCHED_MESSAGE, offset + window, lo, hi, [])
        sizes = entries["size"][picked].astype(np.int64)
        take = min(max(int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")), 1), max_msgs)
        next_offset = offset + window if take == len(picked) else offset + int(picked[take - 1]) + 1
        phys, sizes = entries["phys"][picked[:take]].astype(np.int64), sizes[:take]
        try:
            runs = self._file_runs(commitlog, phys) if len(phys) else []
            if len(phys) and int(phys[0]) < commitlog.released:  # far behind the writer: map the stretch at once
                for f, first, last in runs:
                    begin, end = int(phys[first]), int(phys[last - 1] + sizes[last - 1])
                    # Unless the queue's records lie thinly among other queues' (one of many
                    # topics): mapping the whole stretch would cost a page walk per page of
                    # them all, for each queue read; their own pages fault in cheaper.
                    if end - begin <= POPULATE_SPAN_FACTOR_MAX * int(sizes[first:last].sum()) + mmap.PAGESIZE:
                        f.populate(begin - f.base_offset, end - f.base_offset)
            bad = self._checked(runs, phys, sizes, offset + picked[:take], queue_id)
            damaged: tuple[tuple[int, int], ...] = ()
            served = offset + picked[:take]
            if bad.size:
                damaged = tuple(zip((offset + picked[bad]).tolist(), phys[bad].tolist(), strict=True))
                self._note_damaged(topic, queue_id, offset + picked[bad], sizes[bad])
                log.error("%s/%d: damaged record(s) (CRC mismatch) at offsets %s, answered as damaged",
                          topic, queue_id, [d[0] for d in damaged])
                keep = np.ones(len(phys), bool)
                keep[bad] = False
                phys, sizes, served = phys[keep], sizes[keep], served[keep]
                runs = self._file_runs(commitlog, phys) if len(phys) else []
            if select is not None and len(phys):
                keep = np.concatenate([select(f.view, phys[a:b] - f.base_offset) for f, a, b in runs])
                if not keep.all():
                    phys, sizes, served = phys[keep], sizes[keep], served[keep]
                    runs = self._file_runs(commitlog, phys) if len(phys) else []
                if not len(phys) and not damaged:
                    return GetResult(GetStatus.NO_MATCHED_MESSAGE, next_offset, lo, hi, [])
            if coalesce and len(phys):
                phys, sizes = _runs(phys, sizes)
                runs = self._file_runs(commitlog, phys)
            records = self._views(runs, phys, sizes)
        except (MessageNotFound, ValueError):  # expired under our feet: the minimum moved
            lo = cq.offset_of_phys(commitlog.min_offset)
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi, [])
        return GetResult(GetStatus.FOUND, next_offset, lo, hi, records, damaged, served)

    def read_runs(self, topic: str, queue_id: int, offset: int, max_msgs: int, max_bytes: int) -> ReplicaRead:
        """Records of a queue from ``offset`` (at least one if any, about ``max_bytes``) as few
        views as possible: adjacent records share one view. For followers' fetches, where a
        view per record would cost a Python object per message. Damaged records (CRC) and lost
        entries of the range are listed by offset instead of sent: a follower never stores
        damage as data. CRCs are not checked past the flushed offset (bytes never read back from
        the disk), nor again within REPLICA_CHECK_TTL_S in the range checked last (the other
        followers' fetches of the same records)."""
        commitlog = self._cl()
        cq = self._queue(topic, queue_id)
        window = min(cq.max_offset - offset, max_msgs)
        if window <= 0 or offset < cq.min_offset:
            return ReplicaRead(offset, [], 0, np.empty(0, np.int64), np.empty(0, np.int64))
        entries = cq.read(offset, window)
        sizes = entries["size"].astype(np.int64)
        take = max(int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")), 1)
        phys, sizes = entries["phys"][:take].astype(np.int64), sizes[:take]
        offsets = np.arange(offset, offset + take, dtype=np.int64)
        # CRCs are checked where damage can be; lost entries always (that costs nothing). Not past
        # the flushed offset: those bytes are what the append wrote (and checked), never read back
        # from the disk -- what a caught-up follower fetches. Nor the range another follower's
        # fetch checked a moment ago: a record costs one CRC check, not one per follower.
        key, now = (topic, queue_id), time.monotonic()
        lo, hi, checked_at = self._replica_checked.get(key, (0, 0, 0.0))
        skip = min(hi - offset, take) if lo <= offset < hi and now - checked_at < REPLICA_CHECK_TTL_S else 0
        stop = max(int(np.searchsorted(phys, self.flushed_offset)), skip)  # phys grows along a queue
        bad = np.flatnonzero(sizes < HEADER_SIZE)
        if skip < stop:
            check = slice(skip, stop)
            found = self._checked(self._file_runs(commitlog, phys[check]), phys[check], sizes[check],
                                  offsets[check], queue_id)
            bad = np.union1d(bad, found + skip)
            self._replica_checked[key] = (offset + skip, offset + stop, now)
        if bad.size:
            self._note_damaged(topic, queue_id, offsets[bad], sizes[bad])
            keep = np.ones(take, bool)
            keep[bad] = False
            phys, sizes = phys[keep], sizes[keep]
        run_phys, run_sizes = _runs(phys, sizes) if len(phys) else (phys, sizes)
        views = self._views(self._file_runs(commitlog, run_phys), run_phys, run_sizes) if len(phys) else []
        return ReplicaRead(offset + take, views, int(run_sizes.sum()), sizes, offsets[bad])

    # --- damaged records between replicas -------------------------------------------------------
    def _note_damaged(self, topic: str, queue_id: int, offsets: np.ndarray, sizes: np.ndarray) -> None:
        found = offsets[sizes != LOST_ENTRY_SIZE].tolist()
        if found:
            with self._known_damaged_lock:
                self._known_damaged.setdefault((topic, queue_id), set()).update(found)

    def _note_damaged_at(self, phys: int) -> None:
        """Note the damaged record recovery indexed at ``phys`` (if its envelope says where)."""
        try:
            f = self._cl().file_for(phys)
            parsed = parse_records(f.array, [phys - f.base_offset])
            topic, header = parsed.topics[0], parsed.headers[0]
            offset = int(header["queue_offset"])
            if self._indexes(int(header["queue_id"]), offset, topic, phys):
                self._note_damaged(topic, int(header["queue_id"]), np.array([offset]), np.array([0]))
        except (StoreError, ValueError, UnicodeDecodeError):
            pass  # not indexed, or its header is unreadable: a read notes what it finds

    def damaged_records(self, topic: str, queue_id: int) -> list[int]:
        """Queue offsets of records found damaged here (by recovery or a read), ascending: what a
        follower asks its leader's intact copies of. Lost entries are not listed."""
        with self._known_damaged_lock:
            return sorted(self._known_damaged.get((topic, queue_id), ()))

    def forget_damaged(self, topic: str, queue_id: int, offsets: list[int]) -> None:
        """Stop listing these offsets (no intact copy can be had): they stay damaged."""
        with self._known_damaged_lock:
            self._known_damaged.get((topic, queue_id), set()).difference_update(offsets)

    def append_lost(self, topic: str, queue_id: int, offset: int, count: int) -> None:
        """Continue a replicated queue at ``offset`` with ``count`` lost entries: records its
        leader holds damaged, answered as damaged here too, so both keep the same offsets."""
        with self._write_lock:
            commitlog = self._cl()
            self._check_writable()
            cq = self._queue(topic, queue_id)
            if offset != cq.max_offset:
                raise ReplicaGap(f"{topic}/{queue_id}: lost entries from {offset}, the queue ends at {cq.max_offset}")
            # At the queue's previous record (or, in an empty queue, where the next record goes):
            # the index stays sorted, and a checkpoint at the commitlog's end keeps these entries
            # (recovery cuts the index at entries pointing at or past where it starts scanning).
            previous = cq.max_offset - 1
            entries = np.zeros(count, CQ_DTYPE)
            entries["phys"] = (int(cq.read(previous, 1)["phys"][0]) if previous >= cq.min_offset
                               else commitlog.committed_pos)
            entries["size"] = LOST_ENTRY_SIZE
            try:
                cq.reserve(count)
            except StoreIOError as err:
                self._disk_full = out_of_space(err)
                raise
            cq.write(offset, entries)
            cq.publish(offset + count)

    def append_replicated_run(self, topic: str, queue_id: int, offset: int, records: bytes | bytearray | memoryview,
                              crc32: int, sizes: np.ndarray, damaged: list[int] | np.ndarray,
                              origin: str | None = None) -> int:
        """A fetch of one queue from ``offset``: ``records`` (of ``sizes``, their ``crc32`` as a
        whole) interleaved by offset with ``damaged`` offsets the leader sent as such, which
        become lost entries. Returns the commitlog end after the last record appended (0: none)."""
        if chunk_crc32(records) != crc32:
            raise CorruptRecord(0, f"replicated chunk of {len(records)} bytes does not match the leader's CRC")
        buf = memoryview(records).cast("B")
        sizes = np.asarray(sizes, np.int64)
        ends = np.cumsum(sizes)
        done = byte = end_phys = 0  # records appended, their bytes
        position = offset
        for first, count_lost in [*_consecutive_runs(sorted(int(d) for d in damaged)), (None, 0)]:
            count = (len(sizes) - done) if first is None else first - position
            if count < 0 or count > len(sizes) - done:
                raise ReplicaGap(f"{topic}/{queue_id}: damaged offset {first} does not fit the fetch from {offset}")
            if count:
                stop = int(ends[done + count - 1])
                end_phys = self._append(buf[byte:stop], None, replicated=True,
                                        sizes=sizes[done: done + count], origin=origin).end_phys_offset
                done, byte, position = done + count, stop, position + count
            if first is not None:
                log.error("queue %s/%d: offsets %d..%d are damaged on the leader: indexed as damaged here",
                          topic, queue_id, first, first + count_lost - 1)
                self.append_lost(topic, queue_id, first, count_lost)
                position += count_lost
        return end_phys

    def repair_record(self, topic: str, queue_id: int, offset: int,
                      record: bytes | bytearray | memoryview) -> RepairOutcome:
        """Rewrite this store's damaged copy of ``topic/queue_id@offset`` in place from an intact
        copy (its leader's): only that record is taken -- its CRC must hold (:class:`CorruptRecord`)
        and its size, topic and tag hash match the index entry (:class:`InvalidRecord`; the entry's
        tag hash, taken from the damaged bytes by recovery, is rewritten from the copy's). The
        envelope gets this store's queue and commitlog offsets and keeps the copy's store time.
        A lost entry has no bytes here to rewrite (:class:`InvalidRecord`). Durable on return."""
        buf = memoryview(record).cast("B")
        with self._write_lock:
            commitlog = self._cl()
            self._check_writable()
            cq = self._queue(topic, queue_id)
            if not cq.min_offset <= offset < cq.max_offset:
                raise InvalidRecord("offset", f"{topic}/{queue_id}@{offset} is outside the queue "
                                              f"[{cq.min_offset}, {cq.max_offset})")
            entry = cq.read(offset, 1)[0]
            phys, size = int(entry["phys"]), int(entry["size"])
            if size == LOST_ENTRY_SIZE:
                raise InvalidRecord("offset", f"{topic}/{queue_id}@{offset} is a lost entry: no room in the "
                                              "commitlog to rewrite it")
            if len(buf) != size:
                raise InvalidRecord("record", f"{len(buf)} bytes; {topic}/{queue_id}@{offset} has {size}")
            parsed = parse_batch(buf, self._body_size_max())
            copy_hash = int(parsed.index_tag_hashes[0])
            damaged = bool(self._checked(self._file_runs(commitlog, np.array([phys])), np.array([phys]),
                                         np.array([size]), np.array([offset]), queue_id).size)
            if parsed.topics != [topic] or (copy_hash != int(entry["tag_hash"]) and not damaged):
                raise InvalidRecord("record", f"not {topic}/{queue_id}@{offset} (topic {parsed.topics[0]}, "
                                              f"tag hash {copy_hash})")
            outcome = RepairOutcome.INTACT
            if damaged:
                f = commitlog.file_for(phys)
                pos = phys - f.base_offset
                f.array[pos: pos + size] = np.frombuffer(buf, np.uint8)
                _ENVELOPE_HEAD_STRUCT.pack_into(f.view, pos + OFF_QUEUE_ID, queue_id, offset, phys)
                try:
                    if copy_hash != int(entry["tag_hash"]):  # the flip was in the tag hash recovery indexed
                        cq.set_tag_hash(offset, copy_hash)
                    f.flush()  # the flush thread only syncs what is new
                except StoreIOError as err:
                    self._flush_service().fail(err)
                    raise
                outcome = RepairOutcome.REPAIRED
                log.warning("%s/%d@%d: damaged record at commitlog offset %d rewritten from an intact copy",
                            topic, queue_id, offset, phys)
        self.forget_damaged(topic, queue_id, [offset])
        return outcome

    @staticmethod
    def _file_runs(commitlog: CommitLog, phys: np.ndarray) -> list[tuple[MappedFile, int, int]]:
        """The commitlog files the records at ``phys`` lie in: (file, lo, hi) for each run of
        records ``phys[lo:hi]`` in one file (one run unless the records cross a file end)."""
        files = commitlog.files
        base0, fsize = files[0].base_offset, commitlog.file_size_bytes
        if int(phys[0]) < base0:
            raise MessageNotFound(int(phys[0]), "expired")
        # A lost entry may point at the end of the last file (nothing is read for it).
        file_idx = np.minimum((phys - base0) // fsize, len(files) - 1)
        if file_idx[0] == file_idx[-1]:
            return [(files[int(file_idx[0])], 0, len(phys))]
        cuts = [0, *(np.flatnonzero(np.diff(file_idx)) + 1).tolist(), len(phys)]
        return [(files[int(file_idx[lo])], lo, hi) for lo, hi in itertools.pairwise(cuts)]

    @staticmethod
    def _checked(runs: list[tuple[MappedFile, int, int]], phys: np.ndarray, sizes: np.ndarray, offsets: np.ndarray,
                 queue_id: int) -> np.ndarray:
        """Indexes of the records at ``phys`` (in the file ``runs``) whose CRC fails, and of the
        entries for records recovery found lost. Length, magic and envelope lie outside the CRC: a
        bit flipped there would hand consumers an undecodable record or a wrong position. The
        consumeQueue entry that led here knows them all; any that disagree in a record whose CRC
        holds are rewritten."""
        damaged = []
        for f, lo, hi in runs:
            check = check_stored(f.view, phys[lo:hi] - f.base_offset, sizes[lo:hi], f.base_offset, queue_id,
                                 offsets[lo:hi])
            damaged.append(check.damaged + lo)
            for i in (check.misplaced + lo).tolist():
                pos = int(phys[i]) - f.base_offset
                log.error("record at commitlog offset %d had a damaged header %s: repaired from its index entry",
                          int(phys[i]), np.frombuffer(f.view, _STORED_HEAD, 1, pos)[0])
                _HEAD_STRUCT.pack_into(f.view, pos, int(sizes[i]), MAGIC_V1)
                _ENVELOPE_HEAD_STRUCT.pack_into(f.view, pos + OFF_QUEUE_ID, queue_id, int(offsets[i]), int(phys[i]))
        return damaged[0] if len(damaged) == 1 else np.concatenate(damaged) if damaged else np.empty(0, np.intp)

    @staticmethod
    def _views(runs: list[tuple[MappedFile, int, int]], phys: np.ndarray, sizes: np.ndarray) -> list[memoryview]:
        """Zero-copy views of the records at ``phys`` (in the file ``runs``)."""
        if len(runs) == 1:
            f = runs[0][0]
            return record_views(f.view, phys - f.base_offset, sizes)
        views: list[memoryview] = []
        for f, lo, hi in runs:
            views += record_views(f.view, phys[lo:hi] - f.base_offset, sizes[lo:hi])
        return views

    def backlog(self, topic: str, queue_id: int, start: int, tag_hashes: frozenset[int] | None,
                read_limit: int | None = None) -> tuple[int, int | None]:
        """Of the records from queue offset ``start`` to the end (or ``read_limit``): how many a
        subscription to ``tag_hashes`` (None: every tag) would receive, and the offset of the
        first. Reads the consumeQueue only, at most BACKLOG_SCAN_MAX entries: beyond them the
        count is extrapolated from those read."""
        cq = self._queue(topic, queue_id)
        start = max(start, cq.min_offset)
        end = cq.max_offset if read_limit is None else min(cq.max_offset, read_limit)
        if end <= start:
            return 0, None
        window = min(end - start, BACKLOG_SCAN_MAX)
        try:
            hashes = cq.read(start, window)["tag_hash"]
        except (OffsetExpired, ValueError):  # retention moved the minimum meanwhile
            return 0, None
        wanted = (hashes != HIDDEN_TAG_HASH if tag_hashes is None
                  else np.isin(hashes, np.fromiter(tag_hashes, np.int64)))
        picked = np.flatnonzero(wanted)
        count = picked.size if window == end - start else round(picked.size * (end - start) / window)
        return count, start + int(picked[0]) if picked.size else None

    def read_entry(self, topic: str, queue_id: int, offset: int) -> memoryview:
        """The stored record at a queue offset, hidden ones included (the timer's own reads)."""
        cq = self._queue(topic, queue_id)
        if not cq.min_offset <= offset < cq.max_offset:
            raise MessageNotFound(offset, f"outside {topic}/{queue_id} [{cq.min_offset}, {cq.max_offset})")
        return self.read_at(int(cq.read(offset, 1)["phys"][0]))

    def read_at(self, phys_offset: int) -> memoryview:
        """The stored record starting at ``phys_offset`` (message lookup by id)."""
        commitlog = self._cl()
        if not commitlog.min_offset <= phys_offset < commitlog.committed_pos:
            raise MessageNotFound(phys_offset, f"outside [{commitlog.min_offset}, {commitlog.committed_pos})")
        f = commitlog.file_for(phys_offset)
        pos = phys_offset - f.base_offset
        status, size = check_record(f.view, pos, f.size_bytes)
        if status is not RecordCheck.OK:
            raise MessageNotFound(phys_offset, "not the start of a record")  # stored records all checked
        return f.view[pos: pos + size]

    def find_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = TIME_MAX_MS,
                    max_messages: int = 32) -> list[memoryview]:
        """Up to ``max_messages`` records of ``topic`` carrying ``key``, stored in [begin_ms, end_ms],
        newest first. Each candidate of the key index is read and checked: its CRC, topic and keys
        (hashes collide) and that its queue still holds it (truncated, expired or deleted ones
        do not count)."""
        self._topics.queue_count(topic)  # UnknownTopic
        found: list[memoryview] = []
        for phys in self._keys.find(topic, key, begin_ms, end_ms):
            try:
                view = self.read_at(phys)
                record = decode_record(view)
            except (MessageNotFound, CorruptRecord):
                continue
            if record.topic == topic and key in record.keys and self._indexes(record.queue_id, record.queue_offset,
                                                                                topic, phys):
                found.append(view)
                if len(found) >= max_messages:
                    break
        return found

    def find_replicated(self, leader: str, leader_phys: int) -> memoryview | None:
        """This store's copy of the record that ``leader`` stored at ``leader_phys`` (a message id
        of a leader, resolved on a replica), if it still holds it in its queue."""
        for phys in self._origins.find(leader_key(leader), leader_phys):
            try:
                record = self.read_at(phys)
                found = parse_one(record, len(record), verify_tag_hash=False)
            except (StoreError, ValueError):
                continue
            if self._indexes(found.queue_id, _I64.unpack_from(record, OFF_QUEUE_OFFSET)[0], found.topic, phys):
                return record
        return None

    def _indexes(self, queue_id: int, offset: int, topic: str, phys: int) -> bool:
        """The queue ``topic/queue_id`` holds the record at ``phys`` at ``offset``."""
        try:
            cq = self._queue(topic, queue_id)
            return cq.min_offset <= offset < cq.max_offset and int(cq.read(offset, 1)["phys"][0]) == phys
        except (StoreError, OffsetExpired, ValueError):
            return False

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose store timestamp is >= ``ts_ms`` (max offset if none)."""
        commitlog = self._cl()
        cq = self._queue(topic, queue_id)
        return self._first_stored_at(commitlog, cq, cq.min_offset, cq.max_offset, ts_ms)

    @staticmethod
    def _store_ts(commitlog: CommitLog, cq: ConsumeQueue, offset: int) -> int:
        view = commitlog.read(int(cq.read(offset, 1)["phys"][0]), OFF_STORE_TS + _STORE_TS.size)
        return _STORE_TS.unpack_from(view, OFF_STORE_TS)[0]

    @classmethod
    def _first_stored_at(cls, commitlog: CommitLog, cq: ConsumeQueue, lo: int, hi: int, ts_ms: int) -> int:
        """Binary search of [lo, hi) by store time (never decreasing along a queue)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if cls._store_ts(commitlog, cq, mid) < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def stats(self) -> StoreStats:
        commitlog = self._cl()
        return StoreStats(commitlog.min_offset, commitlog.committed_pos, tree_disk_bytes(self.paths.root))

    def metric_collectors(self) -> list[Collector]:
        """The store's own metrics (flush latency and errors, retention deletions), for a registry."""
        return [self._flusher.latency, self._flusher.errors, self._retention_files, self._retention_bytes]

    def resident_fraction(self) -> float:
        """Of the active commitlog file's written pages, the fraction in the page cache (what a
        consumer at the tail reads without touching the disk)."""
        commitlog = self._cl()
        active = commitlog.files[-1] if commitlog.files else None
        if active is None:
            return 0.0
        return active.resident_fraction(commitlog.committed_pos - active.base_offset)

    def _disk_usage(self, commitlog: CommitLog) -> int:
        """The blocks commitlog and consumeQueue files take (what ``disk_usage_max_bytes`` caps)."""
        with self._queues_lock:
            queues = list(self._queues.values())
        return (sum(f.disk_bytes() for f in commitlog.files)
                + sum(f.disk_bytes() for cq in queues for f in cq.files))

    # --- retention -----------------------------------------------------------------------------
    def set_timer_listener(self, listener: TimerListener) -> None:
        """``listener`` hears of each appended record carrying timer flags (client, replicated or
        the timer's own appends) once it is stored, and of truncated queues."""
        self._timers = listener

    def _tell_timers(self, parsed: ParsedRecords, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                     phys: np.ndarray, timer_flags: np.ndarray) -> None:
        self._timers.appended([
            TimerRecord(parsed.topics[int(parsed.topic_index[i])], int(queue_ids[i]), int(queue_offsets[i]),
                        int(phys[i]), int(timer_flags[i]))
            for i in np.flatnonzero(timer_flags).tolist()])

    def timer_records(self, topic: str, queue_id: int, start: int, chunk: int = 65_536) -> Iterator[TimerRecord]:
        """The records with timer flags in a queue from offset ``start`` to its end (a restart's
        rescan): up to the first hidden entry only the index is read; from there the flags of
        every record, from the commitlog, vectorised per file."""
        cq = self._queue(topic, queue_id)
        offset = max(start, cq.min_offset)
        seen_hidden = False  # copies matter only after a scheduled record: until one, the index alone is read
        while offset < cq.max_offset:
            entries = cq.read(offset, min(chunk, cq.max_offset - offset))
            if not seen_hidden:
                hidden = np.flatnonzero(entries["tag_hash"] == HIDDEN_TAG_HASH)
                if not hidden.size:
                    offset += len(entries)
                    continue
                seen_hidden = True
                skip = int(hidden[0])
                entries, offset = entries[skip:], offset + skip
            real = np.flatnonzero(entries["size"] >= HEADER_SIZE)  # lost entries have no record
            phys = entries["phys"][real].astype(np.int64)
            flags = np.zeros(len(phys), np.int64)
            if len(phys):
                for f, lo, hi in self._file_runs(self._cl(), phys):
                    at = phys[lo:hi] - f.base_offset + OFF_FLAGS
                    arr = f.array
                    flags[lo:hi] = (arr[at].astype(np.int64) << 24 | arr[at + 1].astype(np.int64) << 16
                                    | arr[at + 2].astype(np.int64) << 8 | arr[at + 3].astype(np.int64))
            for k in np.flatnonzero(flags & TIMER_FLAGS).tolist():
                yield TimerRecord(topic, queue_id, offset + int(real[k]), int(phys[k]), int(flags[k]) & TIMER_FLAGS)
            offset += len(entries)

    def set_expiry_limit(self, limit: Callable[[str, int], int | None]) -> None:
        """``limit(topic, queue_id)``: the offset retention never moves that queue's minimum past
        (a replicated queue's high watermark: records not yet committed do not expire, as Kafka
        keeps its log start offset below the HW); None = the queue's end."""
        self._expiry_limit = limit

    def delete_expired(self, now_ms: int | None = None) -> int:
        """One retention run: move every queue's minimum past the records its topic no longer
        keeps, then delete the commitlog files no queue needs any more (and, oldest first, more
        while the store is above its disk cap). Returns the number of commitlog files deleted."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._write_lock, self._index_lock:  # index files may be deleted
            commitlog = self._cl()
            with self._queues_lock:
                queues = dict(self._queues)
            moved = self._expire_queues(commitlog, queues, now_ms)
            # A file goes once every queue starts past it -- and never at or past the last
            # checkpoint: crash recovery rescans the commitlog from there.
            pins = [int(cq.read(cq.min_offset, 1)["phys"][0])
                    for cq in queues.values() if cq.min_offset < cq.max_offset]
            keep_from = min([self._checkpointed_offset, commitlog.committed_pos, *pins])
            cap = self.config.disk_usage_max_bytes
            rule = deletion_rule(keep_from, 0 if cap is None else self._disk_usage(commitlog), cap)
            deleted = commitlog.delete_oldest(rule)
            self._keys.delete_below(commitlog.min_offset)
            self._origins.delete_below(commitlog.min_offset)
            if deleted:  # over the disk cap, files go whatever the queues still hold
                self._retention_files.inc(deleted)
                self._retention_bytes.inc(deleted * commitlog.file_size_bytes)
                for cq in queues.values():
                    moved = cq.delete_below_phys(commitlog.min_offset) or moved
            if moved:
                self._save_min_offsets()
        return deleted

    def _expire_queues(self, commitlog: CommitLog, queues: dict[tuple[str, int], ConsumeQueue],
                       now_ms: int) -> bool:
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
            if topic_limits is None or lo >= hi:
                continue
            cutoff_ms = now_ms - (topic_limits.retention_ms or self.config.retention_ms)
            if self._store_ts(commitlog, cq, lo) >= cutoff_ms:
                continue
            moved = cq.advance_min(self._first_stored_at(commitlog, cq, lo + 1, hi, cutoff_ms)) or moved
        return moved

    def _save_min_offsets(self) -> None:
        with self._queues_lock:
            minimums = {key: cq.min_offset for key, cq in self._queues.items()}
        save_min_offsets(self.paths.min_offsets, minimums)

    def _housekeeping(self) -> None:
        try:
            self.delete_expired()
        except StoreError as err:
            log.error("retention run failed: %s", err)


class Reconciled(NamedTuple):
    offsets: np.ndarray  # the queue offset each record is indexed at; -1: not indexed


def _kept(parsed: ParsedRecords, keep: np.ndarray) -> ParsedRecords:
    """The records ``keep`` of ``parsed``, naming only their own topics (a deleted topic's name
    would fail the grouping, which takes every topic named for one to store to)."""
    index = parsed.topic_index[keep]
    used = np.unique(index)
    remap = np.zeros(len(parsed.topics), np.int64)
    remap[used] = np.arange(len(used))
    return ParsedRecords(parsed.starts[keep], parsed.headers[keep], [parsed.topics[i] for i in used], remap[index])


def reconcile_offsets(carried: np.ndarray, expected: int) -> Reconciled:
    """Queue offsets for a queue's records found by recovery, in commitlog order, when the offsets
    they carry do not simply continue the queue from ``expected``. A record is taken at its carried
    offset when that continues the queue; one whose successor continues the queue as if it had had
    the expected offset has a flipped offset (taken at the expected one); one ahead of the queue
    (by at most GAP_RECORDS_MAX) whose successor follows it marks records lost before it; anything
    else (an offset behind the queue: a record that a flipped queue id sent here) is not indexed,
    unless it is the last one, which is taken at the expected offset rather than lost."""
    out = np.full(len(carried), -1, np.int64)
    values = carried.tolist()
    for k, c in enumerate(values):
        nxt = values[k + 1] if k + 1 < len(values) else None
        if c == expected or nxt == expected + 1:
            out[k] = expected
        elif expected < c <= expected + GAP_RECORDS_MAX and nxt in (None, c + 1):
            out[k] = c
        elif nxt is None:
            out[k] = expected
        else:
            continue
        expected = int(out[k]) + 1
    return Reconciled(out)


def _has_entries(queue_dir: Path) -> bool:
    """Whether a queue's index directory holds anything (made empty with its topic otherwise)."""
    with os.scandir(queue_dir) as entries:
        return next(entries, None) is not None


def _consecutive_runs(values: list[int]) -> list[tuple[int, int]]:
    """(first, count) of each run of consecutive integers in sorted ``values``."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs


def _group_size(indices: np.ndarray | slice, n: int) -> int:
    """How many of a batch's ``n`` records a queue group holds."""
    if isinstance(indices, slice):
        return (n if indices.stop is None else indices.stop) - (indices.start or 0)
    return len(indices)


def _read_stamps(buf: memoryview, parsed: ParsedRecords, firsts: list[int]) -> list[BatchSequence] | None:
    """The producer sequences stamped on records ``firsts`` (a send of many queues' batches), read
    in one pass; None if any is not where and how a producer stamps it (each is then read alone,
    in body order, which says what is wrong)."""
    headers = parsed.headers[firsts]
    if (headers["props_len"] < STAMP_BYTES).any():
        return None
    ends = parsed.starts[firsts] + HEADER_SIZE
    for length in ("topic_len", "tag_len", "born_host_len", "keys_len", "props_len"):
        ends += headers[length]
    return read_sequences(buf, ends)


def _group_bytes(groups: list[_QueueGroup], sizes: np.ndarray) -> list[int]:
    """The bytes of each group's records (groups of records in a row: one numpy call for all)."""
    if len(groups) > 1 and isinstance(groups[0].indices, slice):
        return np.add.reduceat(sizes, [cast(slice, g.indices).start for g in groups]).tolist()
    return [int(sizes[g.indices].sum()) for g in groups]


def _runs(phys: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge records that lie back to back in the commitlog into (start, size) runs.
    A run never crosses a commitlog file: every file ends with a blank marker."""
    ends = phys + sizes
    breaks = np.flatnonzero(phys[1:] != ends[:-1]) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks, [len(phys)])) - 1
    return phys[firsts], ends[lasts] - phys[firsts]


def _check_halves(buf: memoryview, starts: list[int]) -> None:
    """Half messages name their transaction and producer group, and are not scheduled too
    (docs/transactions.md)."""
    for start in starts:
        record = decode_record(buf, start, verify_crc=False)
        tx_id, group = record.properties.get(TX_ID_PROPERTY, ""), record.properties.get(TX_GROUP_PROPERTY, "")
        if record.flags & FLAG_SCHEDULED:
            raise InvalidRecord("flags", "a half message cannot be scheduled too")
        if not 0 < len(tx_id) <= TX_ID_CHARS_MAX or not group:
            raise InvalidRecord(TX_ID_PROPERTY, f"a half message needs {TX_ID_PROPERTY} (1..{TX_ID_CHARS_MAX} "
                                                f"characters) and {TX_GROUP_PROPERTY}")
