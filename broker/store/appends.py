"""Appends: a producer's batch or single record, a replica's fetched records, lost entries; and
the other writes to queues (truncation, restart, repair). One writer at a time (the write lock);
each append is validated whole (:mod:`.validation`), placed and copied into the commitlog, told
to the dispatchers (:mod:`.dispatch`) and committed -- or leaves no trace."""

from __future__ import annotations

import logging
import operator
import struct
import threading
import time
from collections.abc import Callable
from typing import cast

import numpy as np

from gms.broker.commitlog.commitlog import ENVELOPE_DTYPE, CommitLog, Placement
from gms.broker.commitlog.flush import FlushService
from gms.broker.consumequeue.consume_queue import CQ_DTYPE
from gms.broker.store.damage import repair
from gms.broker.store.dispatch import Appended, Dispatcher
from gms.broker.store.health import out_of_space
from gms.broker.store.loader import LoadedStore
from gms.broker.store.queues import QueueGroup, group_bytes, group_counts
from gms.broker.store.types import LOST_ENTRY_SIZE, AppendResult, RepairOutcome, ReplicaGap
from gms.broker.store.validation import Admit, AppendValidator
from gms.errors import MessageNotFoundError
from gms.record.layout import FLAG_SEQUENCED, PRODUCER_FLAGS
from gms.store_errors import StoreIOError, StoreReadOnly

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")  # a record's total_size


class StoreWriter:
    """Serves the appends of a store the loader recovered (``loaded``). ``commitlog()`` and
    ``flush_service()``: the store's, while it is open (StoreClosed after)."""

    def __init__(self, loaded: LoadedStore, commitlog: Callable[[], CommitLog],
                 flush_service: Callable[[], FlushService], locks: tuple[threading.Lock, threading.Lock]) -> None:
        self._commitlog = commitlog
        self._flush_service = flush_service
        self._write_lock, self._index_lock = locks
        self._queues = loaded.queues
        self._queue = loaded.queues.queue
        self._group_by_queue = loaded.queues.group_by_queue
        self._validator = AppendValidator(loaded.config, loaded.topics, loaded.producers)
        self._before_commit = loaded.dispatchers.before_commit
        self._after_commit = loaded.dispatchers.after_commit
        # The dispatchers a single record is told of (bound once: this is per message), without flags and with.
        self._one_before = _single(self._before_commit, flagged=False), _single(self._before_commit, flagged=True)
        self._one_after = _single(self._after_commit, flagged=False), _single(self._after_commit, flagged=True)
        self._timers = loaded.dispatchers.timers
        self._producers = loaded.producers
        self._truncations = loaded.truncations
        self._damage = loaded.damage
        self.last_store_ts_ms = loaded.last_store_ts_ms
        self.disk_full = False  # the last append's new files got no space (health DISK_FULL)

    def _check_writable(self) -> None:
        failure = self._flush_service().failure
        if failure is not None:
            raise StoreReadOnly(failure.cause)

    # --- appends -----------------------------------------------------------------------------------
    def append(self, records: bytes | bytearray | memoryview, admit: Admit | None = None, *,
               allowed_flags: int = PRODUCER_FLAGS) -> AppendResult:
        """Validate, place, copy and index a batch of encoded records, all or nothing.

        ``admit(queues)``, when given, sees the (topic, queue id) pairs of the batch before
        anything is written and may refuse the batch by raising (a replica that does not lead a
        queue, too few in-sync replicas). ``allowed_flags``: the record flags the batch may carry
        (producers: FLAG_SCHEDULED; the broker's timer writes the others)."""
        buf = memoryview(records).cast("B")
        if len(buf) >= 4 and _I32.unpack_from(buf)[0] == len(buf):
            done = self._append_one(buf, admit, allowed_flags)  # a single send: no numpy
            if done is not None:
                return done
        return self._append_batch(buf, admit, allowed_flags=allowed_flags)

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
        self._validator.check_chunk(records, crc32)
        return self._append_batch(memoryview(records).cast("B"), None, replicated=True, sizes=sizes, origin=origin)

    def _append_batch(self, buf: memoryview, admit: Admit | None, *, replicated: bool = False,
                      sizes: np.ndarray | None = None, allowed_flags: int = PRODUCER_FLAGS,
                      origin: str | None = None) -> AppendResult:
        with self._write_lock:
            commitlog = self._commitlog()
            self._check_writable()
            validator = self._validator
            parsed = validator.parse_batch(buf, replicated=replicated, sizes=sizes)
            flags = parsed.headers["flags"]
            flag_union = int(np.bitwise_or.reduce(flags)) if flags.any() else 0  # nearly never: one check
            if not replicated:  # the leader checked; a limit changed since must not stall replication
                validator.check_batch(buf, parsed, flag_union, allowed_flags)
            queue_ids = parsed.headers["queue_id"].astype(np.int64)
            groups = self._group_by_queue(parsed, queue_ids)
            keys = [group.key for group in groups]
            if admit is not None:
                admit(keys)
            n = len(queue_ids)
            counts = group_counts(groups, n)  # a send may carry thousands of queues: their
            bases = [group.queue.max_offset for group in groups]  # sizes and ends, once
            envelope = np.empty(n, ENVELOPE_DTYPE)
            if replicated:
                queue_offsets = validator.check_replicated_offsets(groups, parsed)
                store_ts_ms = max(self.last_store_ts_ms, int(parsed.headers["store_ts_ms"].max()))
                envelope["store_ts_ms"] = parsed.headers["store_ts_ms"]
                sequences = {}
            else:
                sequences = (validator.check_sequences(buf, parsed, groups, counts) if flag_union & FLAG_SEQUENCED
                             else {})
                queue_offsets = _assign_queue_offsets(groups, counts, bases, n)
                store_ts_ms = max(int(time.time() * 1000), self.last_store_ts_ms)
                envelope["store_ts_ms"] = store_ts_ms
            sizes = parsed.sizes
            placement = commitlog.place(parsed.starts, sizes)
            envelope["queue_id"] = queue_ids
            envelope["queue_offset"] = queue_offsets
            envelope["phys_offset"] = placement.phys
            self._prepare(commitlog, placement, groups, counts)
            batch = Appended(np.frombuffer(buf, np.uint8), parsed, groups, counts, bases, queue_ids, queue_offsets,
                             placement.phys, sizes, parsed.index_tag_hashes, envelope["store_ts_ms"], flag_union,
                             sequences, origin)
            self._write(commitlog, buf, placement, envelope, batch)
            self.last_store_ts_ms = store_ts_ms
            for dispatcher in self._after_commit:
                dispatcher.dispatch(batch)
        self._flush_service().appended(n)
        return AppendResult(placement.end_offset, queue_ids, queue_offsets, placement.phys, keys, counts,
                            group_bytes(groups, sizes), list(map(operator.add, bases, counts)))

    def _prepare(self, commitlog: CommitLog, placement: Placement, groups: list[QueueGroup],
                 counts: list[int]) -> None:
        """Create every file the batch needs (commitlog and consumeQueues): what can fail, fails here."""
        try:
            commitlog.prepare(placement)
            for (cq, _, _), count in zip(groups, counts, strict=True):
                cq.reserve(count)
        except StoreIOError as err:
            self.disk_full = out_of_space(err)
            raise
        self.disk_full = False

    def _write(self, commitlog: CommitLog, buf: memoryview, placement: Placement, envelope: np.ndarray,
               batch: Appended) -> None:
        """Copy the batch, index it, commit it; nothing published is left by a failure, for the
        next append or recovery to find."""
        try:
            commitlog.write(buf, placement, envelope)
            for dispatcher in self._before_commit:
                dispatcher.dispatch(batch)
        except BaseException:
            commitlog.rollback(placement.end_offset)
            for (cq, _, _), base, count in zip(batch.groups, batch.bases, batch.counts, strict=True):
                cq.erase(base, count)
            raise
        commitlog.commit(placement.end_offset)

    def _append_one(self, buf: memoryview, admit: Admit | None, allowed_flags: int) -> AppendResult | None:
        """:meth:`_append_batch` of a single record with struct instead of numpy: the same checks
        and steps (numpy's fixed costs were most of a single send). None if it does not fit the
        active file: the batch path rolls."""
        with self._write_lock:
            commitlog = self._commitlog()
            self._check_writable()
            validator = self._validator
            record = validator.check_one(buf, allowed_flags)
            size, topic, queue_id, flags = record.size, record.topic, record.queue_id, record.flags
            cq = self._queue(topic, queue_id)
            if admit is not None:
                admit([(topic, queue_id)])
            sequence = validator.admit_sequence(buf, cq, (topic, queue_id), 1) if flags & FLAG_SEQUENCED else None
            phys = commitlog.place_one(size)
            if phys is None:
                return None
            queue_offset = cq.max_offset
            try:
                commitlog.prepare_one(phys, size)
                cq.reserve(1)
            except StoreIOError as err:
                self.disk_full = out_of_space(err)
                raise
            self.disk_full = False
            store_ts_ms = max(int(time.time() * 1000), self.last_store_ts_ms)
            flagged = flags != 0
            try:
                commitlog.write_one(buf, phys, queue_id, queue_offset, store_ts_ms)
                for dispatch_one in self._one_before[flagged]:
                    dispatch_one(record, buf, cq, queue_offset, phys, store_ts_ms, sequence)
            except BaseException:  # as in _write: leave no trace
                commitlog.rollback(phys + size)
                cq.erase(queue_offset, 1)
                raise
            commitlog.commit(phys + size)
            self.last_store_ts_ms = store_ts_ms
            for dispatch_one in self._one_after[flagged]:
                dispatch_one(record, buf, cq, queue_offset, phys, store_ts_ms, sequence)
        self._flush_service().appended(1)
        return AppendResult(phys + size, np.array([queue_id], np.int64), np.array([queue_offset], np.int64),
                            np.array([phys], np.int64), [(topic, queue_id)], [1], [size], [queue_offset + 1])

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
                            [int(sizes.sum())], [cq.max_offset])

    # --- replicas ------------------------------------------------------------------------------------
    def append_lost(self, topic: str, queue_id: int, offset: int, count: int) -> None:
        """Continue a replicated queue at ``offset`` with ``count`` lost entries: records its
        leader holds damaged, answered as damaged here too, so both keep the same offsets."""
        with self._write_lock:
            commitlog = self._commitlog()
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
                self.disk_full = out_of_space(err)
                raise
            cq.write(offset, entries)
            cq.publish(offset + count)

    def append_replicated_run(self, topic: str, queue_id: int, offset: int, records: bytes | bytearray | memoryview,
                              crc32: int, sizes: np.ndarray, damaged: list[int] | np.ndarray,
                              origin: str | None = None) -> int:
        """A fetch of one queue from ``offset``: ``records`` (of ``sizes``, their ``crc32`` as a
        whole) interleaved by offset with ``damaged`` offsets the leader sent as such, which
        become lost entries. Returns the commitlog end after the last record appended (0: none)."""
        self._validator.check_chunk(records, crc32)
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
                end_phys = self._append_batch(buf[byte:stop], None, replicated=True,
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
            commitlog = self._commitlog()
            self._check_writable()
            cq = self._queue(topic, queue_id)
            outcome = repair(commitlog, cq, (topic, queue_id), offset, buf, self._validator.body_size_max(),
                             self._flush_service().fail)
        self._damage.forget_damaged(topic, queue_id, [offset])
        return outcome

    # --- cuts -----------------------------------------------------------------------------------------
    def truncate_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Cut a queue back to ``offset`` (a replica following a new leader). Durable across
        crash recovery: a marker is written first, and recovery never re-indexes what it covers."""
        with self._write_lock:
            commitlog = self._commitlog()
            self._check_writable()
            cq = self._queue(topic, queue_id)
            if offset >= cq.max_offset:
                return
            self._truncations.add((topic, queue_id), offset, commitlog.committed_pos)
            self._damage.truncated((topic, queue_id), offset)  # records found damaged past the cut are gone
            with self._index_lock:
                cq.truncate(offset)
                try:
                    cq.flush()
                except StoreIOError as err:
                    self._flush_service().fail(err)
                    raise
            self._producers.truncated((topic, queue_id), offset)
        self._timers.listener.truncated(topic, queue_id)

    def restart_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Start a queue over, empty, at ``offset`` past its end: a follower whose leader no
        longer has the records it misses (retention). Its old records stay in the commitlog but
        are never indexed again: a truncation marker covers all of them for crash recovery."""
        with self._write_lock:
            commitlog = self._commitlog()
            cq = self._queue(topic, queue_id)
            if offset <= cq.max_offset:
                return
            self._truncations.add((topic, queue_id), 0, commitlog.committed_pos)
            with self._index_lock:
                cq.reset(offset)
            self._queues.save_min_offsets()
            self._producers.truncated((topic, queue_id), 0)
        self._timers.listener.truncated(topic, queue_id)


def _assign_queue_offsets(groups: list[QueueGroup], counts: list[int], bases: list[int], n: int) -> np.ndarray:
    """The one place queue offsets are chosen: each queue continues from its end (``bases``), no
    gaps. (A replica instead takes the leader's offsets, checked by the validator.)"""
    if len(groups) > 1 and isinstance(groups[0].indices, slice):  # records in a row per queue: one pass
        shifts = [base - cast(slice, g.indices).start for g, base in zip(groups, bases, strict=True)]
        return np.arange(n, dtype=np.int64) + np.repeat(np.array(shifts, np.int64), counts)
    offsets = np.empty(n, np.int64)
    for (_, idx, _), base, count in zip(groups, bases, counts, strict=True):
        offsets[idx] = np.arange(base, base + count, dtype=np.int64)
    return offsets


def _single(dispatchers: tuple[Dispatcher, ...], *, flagged: bool) -> tuple[Callable[..., None], ...]:
    """The ``dispatch_one`` of those ``dispatchers`` told of a single record without flags (or with)."""
    return tuple(d.dispatch_one for d in dispatchers
                 if d.single_records is not None and (flagged or d.single_records == 0))


def _consecutive_runs(values: list[int]) -> list[tuple[int, int]]:
    """(first, count) of each run of consecutive integers in sorted ``values``."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs
