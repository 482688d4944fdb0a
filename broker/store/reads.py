"""Reads of the store: a queue's records (consumers' gets, followers' fetches), its bounds and
backlog, a record by queue offset, commitlog position, key or a leader's message id, the first
record stored at a time, and a queue's timer records. Readers take no lock: they work on
snapshots of file lists and on published ends, advanced only once what they cover is indexed."""

from __future__ import annotations

import logging
import mmap
import struct
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import OffsetExpired, pick_tags
from gms.broker.keyindex import TIME_MAX_MS, KeyIndex
from gms.broker.store.compacted import CompactedLogs
from gms.broker.store.compacted_lookups import CompactedLookups
from gms.broker.store.compacted_reads import first_at_time, low_offset, read_segment
from gms.broker.store.damage import DamageTracker, check_stored_records
from gms.broker.store.many_reads import ManyQueueRead
from gms.broker.store.origins import OriginMap, leader_key
from gms.broker.store.queues import QueueKey, QueueTable
from gms.broker.store.records import (
    POPULATE_SPAN_FACTOR_MAX,
    coalesce,
    file_runs,
    first_stored_at,
    run_views,
    views,
)
from gms.broker.store.topic_table import TopicTable
from gms.broker.store.types import (
    GET_BYTES_MAX_DEFAULT,
    GetResult,
    GetStatus,
    QueueGet,
    RecordSelector,
    ReplicaRead,
    TimerRecord,
)
from gms.record import HEADER_SIZE, OFF_QUEUE_OFFSET, RecordCheck, check_record
from gms.record.batch import parse_one
from gms.record.codec import decode_record
from gms.record.layout import HIDDEN_TAG_HASH, OFFSETS, TIMER_FLAGS
from gms.store_errors import CorruptRecord, MessageNotFound, StoreError

log = logging.getLogger(__name__)

OFF_FLAGS = OFFSETS["flags"]
SCAN_ENTRIES_MAX = 65_536  # consumeQueue entries one filtered ``get`` may examine
BACKLOG_SCAN_MAX = 262_144  # consumeQueue entries (5 MiB) a backlog count reads; more are extrapolated
REPLICA_CHECK_TTL_S = 1.0  # records checked for one follower's fetch are not checked again for others this long
_I64 = struct.Struct(">q")


class StoreReads:
    """The store's reads. ``commitlog()``: the commitlog while the store is open (StoreClosed
    after); ``flushed()``: the commitlog offset on disk."""

    def __init__(self, commitlog: Callable[[], CommitLog], queues: QueueTable, topics: TopicTable, keys: KeyIndex,
                 origins: OriginMap, damage: DamageTracker, flushed: Callable[[], int],
                 compacted: CompactedLogs) -> None:
        self._commitlog = commitlog
        self._segment = compacted.segment
        self._lookups = CompactedLookups(compacted)
        self._queue = queues.queue
        self._holds = queues.holds
        self._topics = topics
        self._keys = keys
        self._origins = origins
        self._damage = damage
        self._flushed = flushed
        # (topic, queue id) -> (first, end offset, monotonic time) of the range read_runs checked last
        self._replica_checked: dict[QueueKey, tuple[int, int, float]] = {}

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first readable offset (of a compacted queue: its first compacted record's)."""
        return low_offset(self._segment(topic, queue_id), self._queue(topic, queue_id).min_offset)

    def log_start(self, topic: str, queue_id: int) -> int:
        """The first offset held in the commitlog (what followers replicate from)."""
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
        ``coalesce`` returns adjacent records as one view, and records lying apart in small runs
        as one copy of them (a pull answer sent as-is: a view per record would cost a Python
        object and a write buffer per message). ``select`` (an SQL
        filter's) keeps only the records it selects of those read, once their CRCs held: the
        others cost no view; none selected (and none damaged) answers NO_MATCHED_MESSAGE."""
        commitlog = self._commitlog()
        commitlog.reads += 1
        cq = self._queue(topic, queue_id)
        lo, end = cq.min_offset, cq.max_offset
        hi = end if read_limit is None else max(min(end, read_limit), lo)
        if (segment := self._segment(topic, queue_id)) is not None:  # a compacted queue
            lo = low_offset(segment, lo)
            if lo <= offset < min(segment.point, hi):
                found = read_segment(segment, offset, max_msgs, max_bytes, tag_hashes, select, coalesce)
                if found is not None:
                    return GetResult(GetStatus.FOUND if found.views or found.damaged else GetStatus.NO_MATCHED_MESSAGE,
                                     found.next_offset, lo, hi, found.views, found.damaged, found.offsets)
                offset = segment.point  # nothing kept from there: the commitlog's part
            if lo <= offset < cq.min_offset:  # between the compacted log and the queue (the disk cap's cut)
                offset = cq.min_offset
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
            served = self._serve(commitlog, (topic, queue_id), offset + picked[:take], phys, sizes, coalesce, select)
        except (MessageNotFound, ValueError):  # expired under our feet: the minimum moved
            lo = cq.offset_of_phys(commitlog.min_offset)
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi, [])
        if served is None:
            return GetResult(GetStatus.NO_MATCHED_MESSAGE, next_offset, lo, hi, [])
        return GetResult(GetStatus.FOUND, next_offset, lo, hi, *served)

    def get_many(self, queues: Sequence[QueueGet], max_msgs: int = 32, max_bytes: int = GET_BYTES_MAX_DEFAULT,
                 total_bytes: int = GET_BYTES_MAX_DEFAULT) -> list[GetResult | StoreError]:
        """:meth:`get` (coalesced, every tag, no selector) of each of ``queues`` in order, each with
        ``max_bytes`` no more than what remains of ``total_bytes`` after the records served before
        it: the same answers (its error in place of a queue's: an unknown topic or queue; a queue's
        records lying apart in small runs as one copy of them, not a view per run), at a small
        part of the cost per queue (see :mod:`.many_reads`). Stops before the first queue
        reached once the total is spent: the list is then shorter than ``queues``."""
        commitlog = self._commitlog()
        commitlog.reads += len(queues)
        if any((segment := self._segment(q.topic, q.queue_id)) is not None and q.offset < segment.point
               for q in queues):  # compacted records: each queue read by get
            return self._get_each(queues, max_msgs, max_bytes, total_bytes)

        def get(topic: str, queue_id: int, offset: int, msgs: int, size: int, limit: int | None) -> GetResult:
            return self.get(topic, queue_id, offset, msgs, size, read_limit=limit, coalesce=True)
        return ManyQueueRead(commitlog, self._queue, get, queues, max_msgs, max_bytes).run(total_bytes)

    def _get_each(self, queues: Sequence[QueueGet], max_msgs: int, max_bytes: int,
                  total_bytes: int) -> list[GetResult | StoreError]:
        """:meth:`get_many` as one :meth:`get` per queue."""
        results: list[GetResult | StoreError] = []
        for topic, queue_id, offset, limit in queues:
            if total_bytes <= 0:
                break
            try:
                got = self.get(topic, queue_id, offset, max_msgs, min(max_bytes, total_bytes), read_limit=limit,
                               coalesce=True)
            except StoreError as err:
                results.append(err)
                continue
            total_bytes -= sum(len(view) for view in got.records)
            results.append(got)
        return results

    def _serve(self, commitlog: CommitLog, key: QueueKey, served: np.ndarray, phys: np.ndarray, sizes: np.ndarray,
               coalesced: bool, select: RecordSelector | None
               ) -> tuple[list[memoryview], tuple[tuple[int, int], ...], np.ndarray] | None:
        """What :meth:`get` serves of the records at ``phys`` (queue offsets ``served``): views of
        those whose CRCs hold and ``select`` keeps, the damaged ones (left out), the offsets of the
        records served; None if ``select`` kept none and none was damaged."""
        runs = file_runs(commitlog, phys) if len(phys) else []
        if len(phys) and int(phys[0]) < commitlog.released:  # far behind the writer: map the stretch at once
            for f, first, last in runs:
                begin, end = int(phys[first]), int(phys[last - 1] + sizes[last - 1])
                # Unless the queue's records lie thinly among other queues' (one of many
                # topics): mapping the whole stretch would cost a page walk per page of
                # them all, for each queue read; their own pages fault in cheaper.
                if end - begin <= POPULATE_SPAN_FACTOR_MAX * int(sizes[first:last].sum()) + mmap.PAGESIZE:
                    f.populate(begin - f.base_offset, end - f.base_offset)
        bad = check_stored_records(runs, phys, sizes, served, key[1])
        damaged: tuple[tuple[int, int], ...] = ()
        if bad.size:
            damaged = tuple(zip(served[bad].tolist(), phys[bad].tolist(), strict=True))
            self._damage.note(*key, served[bad], sizes[bad])
            log.error("%s/%d: damaged record(s) (CRC mismatch) at offsets %s, answered as damaged",
                      *key, [d[0] for d in damaged])
            keep = np.ones(len(phys), bool)
            keep[bad] = False
            phys, sizes, served = phys[keep], sizes[keep], served[keep]
            runs = file_runs(commitlog, phys) if len(phys) else []
        if select is not None and len(phys):
            keep = np.concatenate([select(f.view, phys[a:b] - f.base_offset) for f, a, b in runs])
            if not keep.all():
                phys, sizes, served = phys[keep], sizes[keep], served[keep]
                runs = file_runs(commitlog, phys) if len(phys) else []
            if not len(phys) and not damaged:
                return None
        if coalesced and len(phys):
            phys, sizes = coalesce(phys, sizes)
            return run_views(file_runs(commitlog, phys), phys, sizes), damaged, served
        return views(runs, phys, sizes), damaged, served

    def read_runs(self, topic: str, queue_id: int, offset: int, max_msgs: int, max_bytes: int) -> ReplicaRead:
        """Records of a queue from ``offset`` (at least one if any, about ``max_bytes``) as few
        views as possible: adjacent records share one view. For followers' fetches, where a
        view per record would cost a Python object per message. Damaged records (CRC) and lost
        entries of the range are listed by offset instead of sent: a follower never stores
        damage as data. CRCs are not checked past the flushed offset (bytes never read back from
        the disk), nor again within REPLICA_CHECK_TTL_S in the range checked last (the other
        followers' fetches of the same records)."""
        commitlog = self._commitlog()
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
        stop = max(int(np.searchsorted(phys, self._flushed())), skip)  # phys grows along a queue
        bad = np.flatnonzero(sizes < HEADER_SIZE)
        if skip < stop:
            check = slice(skip, stop)
            found = check_stored_records(file_runs(commitlog, phys[check]), phys[check], sizes[check],
                                         offsets[check], queue_id)
            bad = np.union1d(bad, found + skip)
            self._replica_checked[key] = (offset + skip, offset + stop, now)
        if bad.size:
            self._damage.note(topic, queue_id, offsets[bad], sizes[bad])
            keep = np.ones(take, bool)
            keep[bad] = False
            phys, sizes = phys[keep], sizes[keep]
        run_phys, run_sizes = coalesce(phys, sizes) if len(phys) else (phys, sizes)
        found_views = views(file_runs(commitlog, run_phys), run_phys, run_sizes) if len(phys) else []
        return ReplicaRead(offset + take, found_views, int(run_sizes.sum()), sizes, offsets[bad])

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
        """The stored record starting at ``phys_offset`` (message lookup by id): from the
        commitlog, or, below its first file, a compacted log's copy of it."""
        commitlog = self._commitlog()
        if phys_offset < commitlog.min_offset and (kept := self._lookups.record_at(phys_offset)) is not None:
            return kept
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
        newest first: the key index's and the compacted logs' (below their points). Each
        candidate is read and checked: its CRC, topic and keys (hashes collide) and that its
        queue still holds it (truncated, expired, compacted away or deleted ones do not count)."""
        self._topics.queue_count(topic)  # UnknownTopic
        found: list[tuple[int, memoryview]] = []
        seen: set[tuple[int, int]] = set()  # (queue id, offset): a crash may leave a record in both
        for phys in self._keys.find(topic, key, begin_ms, end_ms):
            try:
                view = self.read_at(phys)
                record = decode_record(view)
            except (MessageNotFound, CorruptRecord):
                continue
            if record.topic == topic and key in record.keys and self._holds(record.queue_id, record.queue_offset,
                                                                              topic, phys):
                found.append((record.store_ts_ms, view))
                seen.add((record.queue_id, record.queue_offset))
                if len(found) >= max_messages:
                    break
        for ts, view in self._lookups.find_by_key(topic, key, begin_ms, end_ms):
            record = decode_record(view, verify_crc=False)  # its CRC was checked
            if key in record.keys and (record.queue_id, record.queue_offset) not in seen:
                found.append((ts, view))
        found.sort(key=lambda pair: pair[0], reverse=True)  # stable: the index's order among equal times
        return [view for _, view in found[:max_messages]]

    def find_replicated(self, leader: str, leader_phys: int) -> memoryview | None:
        """This store's copy of the record that ``leader`` stored at ``leader_phys`` (a message id
        of a leader, resolved on a replica), if it still holds it in its queue (or its
        compacted log keeps it)."""
        for phys in self._origins.find(leader_key(leader), leader_phys):
            try:
                record = self.read_at(phys)
                found = parse_one(record, len(record), verify_tag_hash=False)
            except (StoreError, ValueError):
                continue
            offset = _I64.unpack_from(record, OFF_QUEUE_OFFSET)[0]
            if (self._holds(found.queue_id, offset, found.topic, phys)
                    or self._lookups.keeps(found.topic, found.queue_id, offset, phys)):
                return record
        return None

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose store timestamp is >= ``ts_ms`` (max offset if none)."""
        commitlog = self._commitlog()
        cq = self._queue(topic, queue_id)
        lo = cq.min_offset
        if (segment := self._segment(topic, queue_id)) is not None:
            found = first_at_time(segment, ts_ms)
            if found is not None:
                return found
            lo = max(lo, segment.point)
        return first_stored_at(commitlog, cq, lo, cq.max_offset, ts_ms)

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
            flags = self._flags(phys)
            for k in np.flatnonzero(flags & TIMER_FLAGS).tolist():
                yield TimerRecord(topic, queue_id, offset + int(real[k]), int(phys[k]), int(flags[k]) & TIMER_FLAGS)
            offset += len(entries)

    def _flags(self, phys: np.ndarray) -> np.ndarray:
        """The flags of the records at ``phys``, read from the commitlog, vectorised per file."""
        flags = np.zeros(len(phys), np.int64)
        if len(phys):
            for f, lo, hi in file_runs(self._commitlog(), phys):
                at = phys[lo:hi] - f.base_offset + OFF_FLAGS
                arr = f.array
                flags[lo:hi] = (arr[at].astype(np.int64) << 24 | arr[at + 1].astype(np.int64) << 16
                                | arr[at + 2].astype(np.int64) << 8 | arr[at + 3].astype(np.int64))
        return flags

