"""A read of many queues in one call (:meth:`StoreReads.get_many`): what :meth:`StoreReads.get`
answers for each, a consumer's FETCH of a group subscribed to many topics, at numpy's speed.

A ``get`` costs ~15 numpy calls whatever it reads: a queue holding 50 records of one topic among
a thousand costs the broker more per record than the records themselves. Here each queue costs
only its index lookup and the slice of its entries; the rest is one pass over all of them: the
visible entries, each queue's ``max_msgs`` / ``max_bytes`` (grouped cumulative sums), the total
byte budget in queue order, one CRC check per commitlog file, adjacent records coalesced per
queue, the views -- or, for a queue whose records lie apart in small runs, one copy of them back
to back (``records`` is then one buffer, as a coalesced view is: the same bytes). A queue this
cannot answer as ``get`` would is read by ``get`` itself, in its turn: one whose entries
retention just dropped, or whose records hold damage (a CRC mismatch, a lost entry, a header to
repair) or lie below the commitlog's start."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.ma  # np.unique imports it on its first call: 15-80 ms of a broker's first fetch

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import CQ_DTYPE, ConsumeQueue, OffsetExpired
from gms.broker.mapped_file import MappedFile
from gms.broker.store.records import COPY_RUN_BYTES_MAX, POPULATE_SPAN_FACTOR_MAX
from gms.broker.store.types import GetResult, GetStatus, QueueGet
from gms.record import _recordcheck, check_stored, record_views
from gms.record.layout import HIDDEN_TAG_HASH
from gms.store_errors import StoreError

# get(topic, queue_id, offset, max_msgs, max_bytes, read_limit) of one queue, coalesced
QueueGetter = Callable[[str, int, int, int, int, int | None], GetResult]
ManyResults = list[GetResult | StoreError]


class _Records(NamedTuple):
    """Records served (per record, queue after queue): their queue's place, commitlog offset,
    size and queue offset."""

    queue_of: np.ndarray
    phys: np.ndarray
    sizes: np.ndarray
    offsets: np.ndarray

    def before(self, queue: int) -> _Records:
        """Those of the queues before ``queue``."""
        cut = int(np.searchsorted(self.queue_of, queue))
        return _Records(self.queue_of[:cut], self.phys[:cut], self.sizes[:cut], self.offsets[:cut])


class ManyQueueRead:
    """One :meth:`StoreReads.get_many`. Arrays are indexed by the queue's place in ``queues``
    (per queue) or run over the visible entries of all of them, queue after queue (per entry)."""

    def __init__(self, commitlog: CommitLog, queue: Callable[[str, int], ConsumeQueue], get: QueueGetter,
                 queues: Sequence[QueueGet], max_msgs: int, max_bytes: int) -> None:
        self._commitlog, self._get, self._queues = commitlog, get, queues
        self._max_msgs, self._max_bytes = max(max_msgs, 1), max_bytes
        n = len(queues)
        self.results: list[GetResult | StoreError | None] = [None] * n
        self._fallback = np.zeros(n, bool)  # read by ``get`` in its turn
        self._bounds: list[tuple[int, int]] = [(0, 0)] * n  # (min offset, end served) of the queues read
        windows = [0] * n
        raws = []
        for i, (topic, queue_id, offset, limit) in enumerate(queues):
            try:
                cq = queue(topic, queue_id)
            except StoreError as err:
                self.results[i] = err
                continue
            lo, end = cq.min_offset, cq.max_offset
            hi = end if limit is None else max(min(end, limit), lo)
            if offset < lo:
                self.results[i] = GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi, [])
            elif offset > end:
                self.results[i] = GetResult(GetStatus.OFFSET_OVERFLOW, hi, lo, hi, [])
            elif offset >= hi:
                self.results[i] = GetResult(GetStatus.NO_NEW_MESSAGE, offset, lo, hi, [])
            else:
                window = min(hi - offset, self._max_msgs)
                try:
                    raws.append(cq.read_raw(offset, window))
                except (OffsetExpired, ValueError):  # retention moved the minimum: get answers
                    self._fallback[i] = True
                    continue
                windows[i] = window
                self._bounds[i] = (lo, hi)
        self._windows = np.array(windows, np.int64)
        self._offsets = np.array([q.offset for q in queues], np.int64)
        self._ids = np.array([q.queue_id for q in queues], np.int64)
        self._index(np.concatenate(raws).view(CQ_DTYPE) if raws else np.empty(0, CQ_DTYPE))

    def _index(self, entries: np.ndarray) -> None:
        """The visible entries of every queue read, and what each queue takes of them under its
        own limits (``take``: records; ``served``: their bytes)."""
        n = len(self._queues)
        queue_of = np.repeat(np.arange(n), self._windows)
        place = np.arange(len(entries)) - np.repeat(np.cumsum(self._windows) - self._windows, self._windows)
        visible = entries["tag_hash"] != HIDDEN_TAG_HASH  # scheduled messages not yet due, cancels
        if not visible.all():
            entries, queue_of, place = entries[visible], queue_of[visible], place[visible]
        self._queue_of, self._place = queue_of, place
        self._phys, self._sizes = entries["phys"].astype(np.int64), entries["size"].astype(np.int64)
        self._picked = np.bincount(queue_of, minlength=n)
        self._first = np.cumsum(self._picked) - self._picked  # each queue's first visible entry
        sums = np.cumsum(self._sizes)
        # bytes up to and with each entry, within its queue
        self._within = sums - np.concatenate(([0], sums))[self._first][queue_of]
        fits = np.bincount(queue_of[self._within <= self._max_bytes], minlength=n)
        self.take = np.minimum(np.maximum(fits, 1), self._picked)  # at least one record, if any
        self.served = np.zeros(n, np.int64)
        has = np.flatnonzero(self.take)
        self.served[has] = self._within[self._first[has] + self.take[has] - 1]
        for i in np.flatnonzero((self._windows > 0) & (self._picked == 0)).tolist():
            lo, hi = self._bounds[i]
            self.results[i] = GetResult(GetStatus.NO_MATCHED_MESSAGE, int(self._offsets[i] + self._windows[i]),
                                        lo, hi, [])

    def run(self, total_bytes: int) -> ManyResults:
        """Read the queues in order, each with ``max_bytes`` no more than what remains of
        ``total_bytes`` after the records served before it; stop before the first queue reached
        once none remains."""
        n, start, budget = len(self._queues), 0, total_bytes
        while start < n:
            end, left = self._plan(start, budget)
            bad = self._serve(start, end)
            if bad is not None:  # read again from it: ``get`` reads it
                budget -= int(self.served[start:bad].sum())
                start = bad
                continue
            start, budget = end, left
            if start == n or budget <= 0:
                break
            if self._fallback[start]:
                topic, queue_id, offset, limit = self._queues[start]
                found = self._get(topic, queue_id, offset, self._max_msgs, min(self._max_bytes, budget), limit)
                self.results[start] = found
                budget -= sum(view.nbytes for view in found.records)
                start += 1
            else:  # the budget cuts this queue's records: then it is served as the others
                self._cut(start, budget)
        return self.results[:start]  # type: ignore[return-value]

    def _plan(self, start: int, budget: int) -> tuple[int, int]:
        """(end, budget left there): the queues from ``start`` up to ``end`` take what their own
        limits let them (the budget left before each covers it); ``end`` is the end, or a queue
        ``get`` reads, or one the budget cuts, or the first reached with no budget left."""
        served = self.served[start:]
        before = budget - (np.cumsum(served) - served)
        special = (before <= 0) | self._fallback[start:] | ((served > before) & (self.take[start:] > 1))
        stops = np.flatnonzero(special)
        if not stops.size:
            return len(self._queues), budget - int(served.sum())
        return start + int(stops[0]), int(before[stops[0]])

    def _cut(self, i: int, budget: int) -> None:
        """Queue ``i`` takes what fits ``budget`` (less than its own limits let it take)."""
        within = self._within[self._first[i]: self._first[i] + self.take[i]]
        self.take[i] = max(int(np.searchsorted(within, budget, side="right")), 1)
        self.served[i] = within[self.take[i] - 1]

    def _serve(self, start: int, end: int) -> int | None:
        """Answer the queues [start, end) with their ``take`` records; the first of them whose
        records ``get`` must read instead (those before it are answered), None if none."""
        queues = np.flatnonzero(self.take[start:end]) + start
        if not queues.size:
            return None
        takes = self.take[queues]
        at = np.repeat(self._first[queues] - (np.cumsum(takes) - takes), takes) + np.arange(int(takes.sum()))
        records = _Records(self._queue_of[at], self._phys[at], self._sizes[at], self._offsets[self._queue_of[at]]
                           + self._place[at])
        files = self._commitlog.files
        expired = records.phys < files[0].base_offset
        bad = self._troubled(records.queue_of[expired]) if expired.any() else None
        if bad is not None:
            records = records.before(bad)
            queues, takes = queues[queues < bad], takes[queues < bad]
        if not queues.size:
            return bad
        # A lost entry may point at the end of the last file (nothing is read for it).
        file_of = np.minimum((records.phys - files[0].base_offset) // self._commitlog.file_size_bytes, len(files) - 1)
        try:
            if int(records.phys.min()) < self._commitlog.released:
                self._populate(files, records, file_of)
            damaged = self._check(files, records, file_of)
            if damaged is not None:
                bad = damaged
                records, file_of = records.before(bad), file_of[: int(np.searchsorted(records.queue_of, bad))]
                queues, takes = queues[queues < bad], takes[queues < bad]
            if queues.size:
                self._answer(queues, takes, files, records, file_of)
        except ValueError:  # a file closed under our feet (retention), or a record not inside it
            return self._troubled(queues)
        return bad

    def _troubled(self, queues: np.ndarray) -> int:
        """``get`` reads these queues in their turn: the first of them."""
        self._fallback[queues] = True
        return int(queues.min())

    def _check(self, files: list[MappedFile], records: _Records, file_of: np.ndarray) -> int | None:
        """The first queue whose records are not all intact where their entries say: ``get``
        reads it (and notes, logs or repairs what it finds)."""
        bad = []
        kinds = np.unique(file_of).tolist()
        for k in kinds:
            f = files[k]
            mine = np.flatnonzero(file_of == k) if len(kinds) > 1 else slice(None)
            queue_of = records.queue_of[mine]
            check = check_stored(f.view, records.phys[mine] - f.base_offset, records.sizes[mine], f.base_offset,
                                 self._ids[queue_of], records.offsets[mine])
            bad += [queue_of[found] for found in (check.damaged, check.misplaced) if found.size]
        return self._troubled(np.concatenate(bad)) if bad else None

    def _populate(self, files: list[MappedFile], records: _Records, file_of: np.ndarray) -> None:
        """As ``get`` does for a read far behind the writer (its first record released from the
        resident set): map each queue's stretch of each file at once, unless its records lie
        thinly among other queues' (see StoreReads._serve)."""
        queue_of, phys, sizes = records.queue_of, records.phys, records.sizes
        breaks = np.flatnonzero((queue_of[1:] != queue_of[:-1]) | (file_of[1:] != file_of[:-1])) + 1
        firsts = np.concatenate(([0], breaks))
        lasts = np.concatenate((breaks, [len(phys)])) - 1
        queue_first = phys[np.searchsorted(queue_of, queue_of[firsts])]
        begins, ends = phys[firsts], phys[lasts] + sizes[lasts]
        dense = ends - begins <= POPULATE_SPAN_FACTOR_MAX * np.add.reduceat(sizes, firsts) + mmap.PAGESIZE
        for j in np.flatnonzero(dense & (queue_first < self._commitlog.released)).tolist():
            f = files[int(file_of[firsts[j]])]
            f.populate(int(begins[j]) - f.base_offset, int(ends[j]) - f.base_offset)

    def _answer(self, queues: np.ndarray, takes: np.ndarray, files: list[MappedFile], records: _Records,
                file_of: np.ndarray) -> None:
        """The FOUND results of ``queues``, whose records (``takes`` each) are these."""
        queue_of, phys, offsets = records.queue_of, records.phys, records.offsets
        ends = phys + records.sizes
        # Runs of adjacent records of a queue (a run never crosses a commitlog file: every file
        # ends with a blank marker).
        breaks = np.flatnonzero((phys[1:] != ends[:-1]) | (queue_of[1:] != queue_of[:-1])) + 1
        firsts = np.concatenate(([0], breaks))
        lasts = np.concatenate((breaks, [len(phys)])) - 1
        buffers = _buffers(files, np.searchsorted(queues, queue_of[firsts]), len(queues), phys[firsts],
                           ends[lasts] - phys[firsts], file_of[firsts])
        counts = np.cumsum(takes).tolist()
        last = self._first[queues] + takes - 1
        nexts = np.where(takes == self._picked[queues], self._offsets[queues] + self._windows[queues],
                         self._offsets[queues] + self._place[last] + 1).tolist()
        count_at = 0
        for i, found, count_end, next_offset in zip(queues.tolist(), buffers, counts, nexts, strict=True):
            lo, hi = self._bounds[i]
            self.results[i] = GetResult(GetStatus.FOUND, next_offset, lo, hi, found, (), offsets[count_at:count_end])
            count_at = count_end


def _buffers(files: list[MappedFile], run_queue: np.ndarray, queues: int, run_phys: np.ndarray,
             run_sizes: np.ndarray, run_files: np.ndarray) -> list[list[memoryview]]:
    """Each queue's records, from its runs of adjacent records (``run_queue``: the queue of each):
    a zero-copy view per run, or, where the runs are small (a queue of one of many topics, its
    records among the others'), one copy of them back to back: an object per record costs more
    than copying it."""
    runs = np.bincount(run_queue, minlength=queues)
    size = np.bincount(run_queue, run_sizes, minlength=queues).astype(np.int64)
    copied = (runs > 1) & (size < COPY_RUN_BYTES_MAX * runs)
    run_copied = copied[run_queue]
    kept = ~run_copied
    views = _views(files, run_phys[kept], run_sizes[kept], run_files[kept]) if kept.any() else []
    copies: list[memoryview] = []
    if run_copied.any():
        from_phys, sizes, from_files = run_phys[run_copied], run_sizes[run_copied], run_files[run_copied]
        at = np.cumsum(sizes) - sizes
        into = np.empty(int(sizes.sum()), np.uint8)  # not zeroed first: every byte is copied to
        for k in np.unique(from_files).tolist():
            mine = from_files == k
            f = files[k]
            _recordcheck.gather(f.view, from_phys[mine] - f.base_offset, sizes[mine], into, at[mine])
        per_queue = runs[copied]
        copies = record_views(into.data, at[np.cumsum(per_queue) - per_queue], size[copied])
    found: list[list[memoryview]] = []
    view_at = copy_at = 0
    for count, is_copied in zip(runs.tolist(), copied.tolist(), strict=True):
        if is_copied:
            found.append([copies[copy_at]])
            copy_at += 1
        else:
            found.append(views[view_at: view_at + count])
            view_at += count
    return found


def _views(files: list[MappedFile], phys: np.ndarray, sizes: np.ndarray, file_of: np.ndarray) -> list[memoryview]:
    """Zero-copy views of the records at ``phys`` (in the files ``file_of``)."""
    if file_of[0] == file_of[-1] and (len(files) == 1 or (file_of == file_of[0]).all()):
        f = files[int(file_of[0])]
        return record_views(f.view, phys - f.base_offset, sizes)
    found = [memoryview(b"")] * len(phys)
    for k in np.unique(file_of).tolist():
        mine = np.flatnonzero(file_of == k)
        f = files[k]
        for j, view in zip(mine.tolist(), record_views(f.view, phys[mine] - f.base_offset, sizes[mine]), strict=True):
            found[j] = view
    return found
