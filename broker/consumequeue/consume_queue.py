"""One queue's index: fixed 20-byte entries, entry N = queue offset N, in mapped files.

Layout of an entry (RocketMQ's ConsumeQueue unit, big-endian)::

    +----------------------+--------------+----------------------+
    | commitlog offset i64 | size i32     | tag hash i64         |
    +----------------------+--------------+----------------------+

Files hold ``entries_per_file`` entries and are named by their 20-digit starting *byte* offset
(queue offset × 20), so the file of an offset is found by arithmetic. An entry with size 0 has
never been written: that is how the end of a queue is found on open.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gms.broker.mapped_file import MappedFile
from gms.broker.segment_list import SegmentList
from gms.record import _recordcheck
from gms.store_errors import StoreError, StoreInvariantBroken, StoreIOError

CQ_UNIT = struct.Struct(">qiq")
SCAN_CHUNK_ENTRIES = 3_276  # entries (64 KiB) read at a time to find a queue's ends on open
CQ_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tag_hash", ">i8")])
assert CQ_UNIT.size == CQ_DTYPE.itemsize == 20
# reserve caches the zero pages of this many more batches of the size it reserves for, beyond the
# batch itself: a queue fed batches of a few hundred entries meets a new page at nearly every one,
# and each caching is a file opened and written (thousands of such queues made it a tenth of a
# send's time). The look-ahead follows the batch size, so a queue fed a message at a time caches
# no page early (an empty or quiet queue costs no memory); and at most ZERO_PAGES_AHEAD_BYTES_MAX
# ahead, so a batch of a hundred thousand entries (whose own pages are most of the work) does not
# write megabytes more on the request loop.
ZERO_PAGES_AHEAD_BATCHES = 3
ZERO_PAGES_AHEAD_BYTES_MAX = 64 * 1024
_TAG_HASH = struct.Struct(">q")
_TAG_HASH_AT = 12  # after the commitlog offset and the size
assert CQ_UNIT.size == _TAG_HASH_AT + _TAG_HASH.size


def pick_tags(entries: np.ndarray, tag_hashes: np.ndarray, max_picks: int) -> tuple[np.ndarray, int]:
    """The indexes of ``entries`` (a :meth:`ConsumeQueue.read`) whose tag hash is one of
    ``tag_hashes``, at most ``max_picks``, and how many entries were scanned to find them (all,
    unless ``max_picks`` were found first): one C pass that stops when it has enough."""
    found, scanned = _recordcheck.pick_tags(entries, CQ_UNIT.size, _TAG_HASH_AT, tag_hashes, max_picks)
    return np.frombuffer(found, np.int64), scanned


def _first_slot(f: MappedFile, written: bool, start: int) -> int | None:
    """The slot in ``f`` of its first entry from slot ``start`` on that is written (size > 0;
    else: that is not), None if there is none. Only the entries before the end of the file's data
    on disk are read (the rest is holes, all zeros), in chunks, through pread (not through the
    map): opening a queue costs neither a whole file's worth of page faults nor resident memory."""
    slots = f.size_bytes // CQ_UNIT.size
    end = max(min(-(-f.data_end() // CQ_UNIT.size), slots), start)
    slot = start
    for raw in f.read_chunks(start * CQ_UNIT.size, end * CQ_UNIT.size, SCAN_CHUNK_ENTRIES * CQ_UNIT.size):
        sizes = np.frombuffer(raw, CQ_DTYPE, len(raw) // CQ_UNIT.size)["size"]
        hits = np.flatnonzero(sizes > 0 if written else sizes <= 0)
        if hits.size:
            return slot + int(hits[0])
        slot += len(sizes)
    return None if written or end == slots else end


def queue_bounds(files: Sequence[tuple[int, int]],
                 first_slot: Callable[[int, bool, int], int | None]) -> tuple[int, int]:
    """(minimum, end) of a queue whose files are ``files`` ((queue offset of the first entry,
    entries), in offset order); ``first_slot(i, written, start)``: the slot of file i's first entry
    from slot ``start`` on that is written (size > 0; written=False: that is not), None if none.

    The minimum is the first file's first written entry: its entries before it were never written
    when the queue was restarted at an offset inside that file (ConsumeQueue.reset), so its end is
    looked for after them. The end is the newest file's first unwritten entry, past files an append
    reserved and then failed to write (they are empty). The broker opens its queues with this, and
    so does Spark reading a store (gms.spark_jobs.store_files)."""
    if not files:
        return 0, 0
    lead = first_slot(0, True, 0) or 0

    def used(i: int) -> int | None:
        return first_slot(i, False, lead if i == 0 else 0)

    newest = len(files) - 1
    end_slot = used(newest)
    while newest > 0 and end_slot == 0:
        newest -= 1
        end_slot = used(newest)
    first, entries = files[newest]
    return files[0][0] + lead, first + (entries if end_slot is None else end_slot)


def restored_bounds(min_offset: int, max_offset: int, saved_min: int) -> tuple[int, int]:
    """(minimum, end) of a queue found at [min_offset, max_offset) in its files whose minimum was
    saved as ``saved_min``: the minimum never moves back, nor past the end; but an empty queue
    whose end is below it restarts there. Nothing in its files tells where a queue restarted
    (:meth:`ConsumeQueue.reset`) before anything was written to it again: without this its offsets
    would start over from its file's start, or 0. The broker and Spark both apply this."""
    if min_offset == max_offset < saved_min:
        return saved_min, saved_min
    return max(min_offset, min(saved_min, max_offset)), max_offset


class OffsetExpired(StoreError):
    """Entries asked for lie below a minimum that retention has just moved (answer as below min)."""

    def __init__(self, offset: int, min_offset: int) -> None:
        super().__init__(f"queue offset {offset} expired (the queue now starts at {min_offset})")
        self.offset = offset


class ConsumeQueue:
    __slots__ = ("_flushed_offset", "_ready_offset", "_segments", "entries_per_file", "file_size_bytes", "max_offset",
                 "min_offset")

    def __init__(self, directory: Path, entries_per_file: int) -> None:
        """Map the queue's files and find its minimum and end."""
        self.entries_per_file = entries_per_file
        self.file_size_bytes = entries_per_file * CQ_UNIT.size
        self._segments = SegmentList.load(directory, self.file_size_bytes)
        files = self.files
        # max_offset: the next offset to be written; published after the entries are.
        self.min_offset, self.max_offset = queue_bounds(
            [(f.base_offset // CQ_UNIT.size, entries_per_file) for f in files],
            lambda i, written, start: _first_slot(files[i], written, start))
        self._flushed_offset = self.max_offset
        # Entries below this lie in the last file, with blocks and their pages cached (by reserve):
        # reserving them again is nothing to do (a queue among thousands reserves a few entries
        # at nearly every append).
        self._ready_offset = 0

    @property
    def directory(self) -> Path:
        return self._segments.directory

    @property
    def files(self) -> list[MappedFile]:
        """The files in offset order; replaced, never mutated: readers take a snapshot."""
        return self._segments.files

    def _file(self, offset: int, files: list[MappedFile]) -> MappedFile:
        f = self._segments.file_for(offset * CQ_UNIT.size, files)
        if f is None:  # a reader that took the minimum before retention moved it and dropped files
            raise OffsetExpired(offset, self.min_offset)
        return f

    def reserve(self, count: int) -> None:
        """Create the files that entries [max_offset, max_offset + count) go to and give them
        blocks there. An append does this for every queue of its batch before it writes anything:
        creating and allocating files is what can fail."""
        if count <= 0 or self.max_offset + count <= self._ready_offset:
            return
        last = self.max_offset + count - 1
        while not self.files or last >= self.files[-1].end_offset // CQ_UNIT.size:
            start = (self.files[-1].end_offset // CQ_UNIT.size if self.files
                     else self.max_offset - self.max_offset % self.entries_per_file)
            self._add_file(start)
        offset, files = self.max_offset, self.files
        ahead = min(count * ZERO_PAGES_AHEAD_BATCHES, ZERO_PAGES_AHEAD_BYTES_MAX // CQ_UNIT.size)
        while offset <= last:
            f = self._file(offset, files)
            file_end = f.end_offset // CQ_UNIT.size
            end = min(last + 1, file_end)
            first = f.base_offset // CQ_UNIT.size
            f.allocate_to((end - first) * CQ_UNIT.size)
            # in the file of ``last``, the pages of the next few batches as well (within the file)
            warm = min(file_end, end + ahead) if end > last else end
            try:
                f.allocate_to((warm - first) * CQ_UNIT.size)
            except StoreIOError:  # a full disk: what the batch needs has blocks, the look-ahead waits
                warm = end
            # Past max_offset a queue's files hold zeros (recovery zeroes what it cuts off).
            f.cache_zero_pages((max(offset, first) - first) * CQ_UNIT.size, (warm - first) * CQ_UNIT.size)
            offset = end
        # ``f`` holds ``last``: its pages up to the one of ``warm`` are cached now
        cached = -(-(warm - first) * CQ_UNIT.size // mmap.PAGESIZE) * mmap.PAGESIZE
        self._ready_offset = (f.base_offset + min(cached, f.size_bytes)) // CQ_UNIT.size

    def write(self, start_offset: int, entries: np.ndarray) -> None:
        """Copy ``entries`` (CQ_DTYPE) into the reserved files at ``start_offset``; readers see
        them once :meth:`publish` moves the end."""
        self.write_raw(start_offset, entries.view(np.uint8).data)

    def write_raw(self, start_offset: int, raw: memoryview) -> None:
        """:meth:`write` of entries given as their bytes (one queue's slice of a batch's entries:
        a send of thousands of queues' batches makes no numpy call per queue)."""
        if start_offset != self.max_offset:
            raise StoreInvariantBroken(f"{self.directory}: entries written at {start_offset}, not at the end"
                                       f" {self.max_offset}")
        entries = len(raw) // CQ_UNIT.size
        slot = start_offset % self.entries_per_file
        if slot + entries <= self.entries_per_file:  # all in one file, as nearly always
            self._file(start_offset, self.files).view[slot * CQ_UNIT.size: slot * CQ_UNIT.size + len(raw)] = raw
            return
        offset, done = start_offset, 0
        while done < entries:
            slot = offset % self.entries_per_file
            count = min(entries - done, self.entries_per_file - slot)
            self._file(offset, self.files).view[slot * CQ_UNIT.size: (slot + count) * CQ_UNIT.size] = \
                raw[done * CQ_UNIT.size: (done + count) * CQ_UNIT.size]
            offset += count
            done += count

    def write_one(self, offset: int, phys: int, size: int, tag_hash: int) -> None:
        """:meth:`write` of one entry."""
        if offset != self.max_offset:
            raise StoreInvariantBroken(f"{self.directory}: entry written at {offset}, not at the end {self.max_offset}")
        CQ_UNIT.pack_into(self._file(offset, self.files).view, offset % self.entries_per_file * CQ_UNIT.size,
                          phys, size, tag_hash)

    def set_tag_hash(self, offset: int, tag_hash: int) -> None:
        """Rewrite the tag hash of a written entry (a repaired record's) and make it durable."""
        f = self._file(offset, self.files)
        _TAG_HASH.pack_into(f.view, offset % self.entries_per_file * CQ_UNIT.size + _TAG_HASH_AT, tag_hash)
        f.flush()

    def publish(self, end_offset: int) -> None:
        """The entries below ``end_offset`` are written: serve them."""
        if end_offset < self.max_offset:
            raise StoreInvariantBroken(f"{self.directory}: end {end_offset} published below {self.max_offset}")
        self.max_offset = end_offset

    def erase(self, start_offset: int, count: int) -> None:
        """Undo a failed append from ``start_offset``: zero its entries (as never written)."""
        self.max_offset = min(self.max_offset, start_offset)
        present = min(count, self.files[-1].end_offset // CQ_UNIT.size - start_offset) if self.files else 0
        if present > 0:
            self.write(start_offset, np.zeros(present, CQ_DTYPE))

    def _add_file(self, offset: int) -> None:
        self._segments.append(self._segments.create(offset * CQ_UNIT.size, sync_dirs=False))

    def read(self, start: int, count: int) -> np.ndarray:
        """Entries [start, start+count) as a CQ_DTYPE array; the caller keeps within [min, max)."""
        return self.read_raw(start, count).view(CQ_DTYPE)

    def read_raw(self, start: int, count: int) -> np.ndarray:
        """:meth:`read`'s entries as their bytes (uint8): the entries of many queues are joined as
        such, then viewed as CQ_DTYPE once (a view costs more than the slice)."""
        files = self.files
        parts = []
        while count > 0:
            f = self._file(start, files)
            slot = start % self.entries_per_file
            take = min(count, self.entries_per_file - slot)
            parts.append(f.array[slot * CQ_UNIT.size: (slot + take) * CQ_UNIT.size])
            start += take
            count -= take
        if not parts:
            return np.empty(0, np.uint8)
        # Joined as bytes: numpy joins big-endian records into native-order ones, and readers of
        # the raw entries (pick_tags) take them as stored.
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def flush(self, least_entries: int = 0, deferred: list[MappedFile] | None = None) -> int | None:
        """fdatasync the files written since the last flush (and close the deleted files readers
        have released: this runs at every checkpoint), unless fewer than ``least_entries`` were
        written since: then None if nothing waits, else the commitlog position of the first entry
        left unflushed (recovery must re-read the commitlog from there). With ``deferred`` the
        files are added to it instead, and count as synced: the caller syncs them (many at once,
        FilesystemSync) before anything relies on them, and a failed sync fails the store."""
        self._segments.close_released()
        end = self.max_offset
        if end == self._flushed_offset:
            return None
        if end - self._flushed_offset < least_entries:
            first = max(self._flushed_offset, self.min_offset)  # retention may have taken the first
            return int(self.read(first, 1)["phys"][0]) if first < end else None
        self._segments.sync_dirs()  # after reading ``end``: the files of the entries below it are named there
        files = self.files
        first = max(self._flushed_offset, files[0].base_offset // CQ_UNIT.size)
        for f in files:
            lo, hi = f.base_offset // CQ_UNIT.size, f.end_offset // CQ_UNIT.size
            if hi > first and lo < end:
                if deferred is None:
                    f.flush()
                else:
                    deferred.append(f)
        self._flushed_offset = end
        return None

    def truncate(self, offset: int) -> None:
        """Forget entries from ``offset`` on (recovery past a torn commitlog, or a replica's
        truncation to its leader); they are zeroed so a reopen finds the same end."""
        offset = max(offset, self.min_offset)
        if offset >= self.max_offset:
            return
        self._segments.delete_from(offset * CQ_UNIT.size)
        self._ready_offset = 0
        keep = self.files
        if keep:
            keep[-1].zero_from((offset % self.entries_per_file) * CQ_UNIT.size if offset < keep[-1].end_offset
                               // CQ_UNIT.size else keep[-1].size_bytes)
        self.max_offset = self._flushed_offset = offset
        if not keep:
            self.min_offset = offset

    def reset(self, offset: int) -> None:
        """Drop every entry and restart the queue empty at ``offset`` (index rebuild from a
        commitlog whose older files have expired)."""
        self._segments.delete_from(0)
        self._ready_offset = 0
        self.min_offset = self.max_offset = self._flushed_offset = offset

    def offset_of_phys(self, phys: int) -> int:
        """The first queue offset whose entry points at or after commitlog offset ``phys``.

        Entries are read with pread (a descriptor per file the search visits), not through the
        map: recovery and retention ask every queue, and a queue nobody reads keeps no pages in
        the broker's resident set (a read through the map brings in 64 KiB of fault-around)."""
        lo, hi = self.min_offset, self.max_offset
        files, fds = self.files, dict[int, int]()

        def phys_at(offset: int) -> int:
            f = self._file(offset, files)
            fd = fds.get(f.base_offset)
            if fd is None:
                try:
                    fd = fds[f.base_offset] = os.open(f.path, os.O_RDONLY)
                except OSError:  # deleted under us (retention): its map may still be there
                    return int(self.read(offset, 1)["phys"][0])
            return int(CQ_UNIT.unpack(os.pread(fd, CQ_UNIT.size, offset % self.entries_per_file * CQ_UNIT.size))[0])

        try:
            while lo < hi:  # entries are in commitlog order, so the phys column is sorted
                mid = (lo + hi) // 2
                if phys_at(mid) < phys:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        finally:
            for fd in fds.values():
                os.close(fd)

    def truncate_to_phys(self, phys_end: int) -> None:
        """Drop entries pointing at or past ``phys_end`` (the commitlog was cut there)."""
        self.truncate(self.offset_of_phys(phys_end))

    def delete_below_phys(self, phys_min: int) -> bool:
        """The commitlog now starts at ``phys_min``: move the minimum to the first entry still in it."""
        return self.advance_min(self.offset_of_phys(phys_min))

    def advance_min(self, offset: int) -> bool:
        """Retention: entries below ``offset`` (at most the end) are no longer served; files wholly
        below the minimum are deleted (never the last one; one a reader still holds is closed
        once released). True if the minimum moved."""
        offset = min(offset, self.max_offset)
        moved = offset > self.min_offset
        if moved:
            self.min_offset = offset
        self._segments.delete_oldest(lambda f: f.end_offset // CQ_UNIT.size <= self.min_offset)
        return moved

    def restore_min(self, offset: int) -> None:
        """On open, the minimum saved before (store.min_offsets.json), as :func:`restored_bounds`."""
        if restored_bounds(self.min_offset, self.max_offset, offset)[1] != self.max_offset:
            self.reset(offset)
        else:
            self.advance_min(offset)

    def close(self) -> None:
        self._segments.close()
