"""The shared commitlog: a queue of fixed-size mapped files all topics append to.

Placement (which file and offset each record of a batch lands at) is computed first and purely,
so the store can validate and assign everything before a byte is written; then ``write`` copies
each run of records that fits in a file with one copy and patches the broker envelope of all of
them with one numpy scatter. A record never straddles files: a file whose remaining room cannot
take the next record is closed with a blank marker (RocketMQ's END_FILE_MIN_BLANK_LENGTH rule).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gms.broker.commitlog.warmer import Warmer
from gms.broker.mapped_file import MappedFile
from gms.broker.segment_list import SegmentList
from gms.record import BLANK_MAGIC, BLANK_MARKER_SIZE, OFF_CRC_START, OFF_QUEUE_ID
from gms.record._recordcheck import gather
from gms.store_errors import MessageNotFound, StoreClosed, StoreInvariantBroken

_BLANK = struct.Struct(">iI")
# Flushed commitlog pages further than this behind the flushed end leave the broker's resident set
# (they stay in the page cache): readers of recent messages still find them mapped.
RESIDENT_TAIL_BYTES = 32 << 20
RELEASE_STEP_BYTES = 8 << 20
# Warming the next file waits while consumers read (reading a GiB into the page cache beside
# them halved a 1 KiB consume on a 2-core virtual machine, though the warmer only runs on an idle
# CPU) -- until the active file is this full: then the next file must be ready. It never waits
# for writes: a writer that keeps writing needs the next file warm when it gets there.
WARM_WAIT_UNTIL_FULL = 0.75
# The next file is created and warmed once the active one is this full, not before: a store that
# holds a few messages (a standalone to try things out) has no second file.
PREPARE_NEXT_AT = 0.5
ENVELOPE_BYTES = OFF_CRC_START - OFF_QUEUE_ID  # queue_id, queue_offset, phys_offset, store_ts_ms
ENVELOPE_DTYPE = np.dtype([("queue_id", ">i4"), ("queue_offset", ">i8"), ("phys_offset", ">i8"),
                           ("store_ts_ms", ">i8")])
assert ENVELOPE_DTYPE.itemsize == ENVELOPE_BYTES == 28
_ENVELOPE = struct.Struct(">iqqq")  # ENVELOPE_DTYPE, for one record
assert _ENVELOPE.size == ENVELOPE_BYTES


class Run(NamedTuple):
    """Consecutive records of a batch that go to one file with one copy."""

    base: int  # the file's base offset
    first: int  # index of the first record
    end: int  # index after the last record
    src_start: int  # their bytes in the batch buffer
    src_end: int
    phys: int  # commitlog offset of the first record


class Placement(NamedTuple):
    phys: np.ndarray  # int64 commitlog offset of each record
    runs: list[Run]
    end_offset: int  # the write position after the batch


class CommitLog:
    def __init__(self, directory: Path, file_size_bytes: int, warmer: Warmer | None) -> None:
        """Map the existing files (creating the first one if there is none: then ``had_data`` is
        False); the end is declared next, by :meth:`set_end` or recovery's :meth:`truncate`."""
        self.file_size_bytes = file_size_bytes
        self._warmer = warmer
        self._segments = SegmentList.load(directory, file_size_bytes)
        self.had_data = bool(self._segments.files)
        if not self.had_data:
            self._segments.append(self._segments.create(0))
        self._spare: dict[int, MappedFile] = {}  # pre-created files after the active one
        self._spare_lock = threading.Lock()
        self._closed = False  # warming stops, and creates no file, once closed
        self._next_prepared = False  # the next file was asked for (see PREPARE_NEXT_AT)
        self.released = 0  # pages below this offset were released from the resident set
        self.write_pos = 0  # where the next record goes (writer-private until committed)
        self.committed_pos = 0  # everything below is fully written and indexed: readable, flushable
        self.reads = 0  # reads of records served so far (warming waits while they come)

    def set_end(self, end_offset: int) -> None:
        """Declare where the data ends (from the checkpoint or recovery); later files are removed."""
        segments = self._segments
        segments.delete_from(end_offset + 1)  # the files that start after the end
        if not segments.files:
            segments.append(segments.create(end_offset - end_offset % self.file_size_bytes))
        elif end_offset == segments.files[-1].end_offset:
            segments.append(segments.create(end_offset))
        self.write_pos = self.committed_pos = end_offset
        if self._warmer is not None:
            active = self.active
            self._warmer.submit(lambda: active.warm(stop=lambda: self._closed))
        self._next_prepared = False
        self._prepare_next_when_due()

    # --- geometry ------------------------------------------------------------------------------
    @property
    def files(self) -> list[MappedFile]:
        """The files in offset order; replaced, never mutated: readers take a snapshot."""
        return self._segments.files

    @property
    def min_offset(self) -> int:
        return self.files[0].base_offset

    @property
    def active(self) -> MappedFile:
        return self.files[-1]

    def file_for(self, phys_offset: int, files: list[MappedFile] | None = None) -> MappedFile:
        files = self.files if files is None else files
        f = self._segments.file_for(phys_offset, files)
        if f is None:
            raise MessageNotFound(phys_offset, f"outside the commitlog [{files[0].base_offset}, "
                                               f"{self.committed_pos})")
        return f

    def place(self, starts: np.ndarray, sizes: np.ndarray) -> Placement:
        """Where each record of a batch will land; pure (no file is touched)."""
        pos = self.write_pos
        base = self.active.base_offset
        first = int(starts[0])
        span = int(starts[-1] + sizes[-1]) - first  # the records of a batch are contiguous
        if pos + span <= base + self.file_size_bytes - BLANK_MARKER_SIZE:  # the usual case: it all fits
            return Placement(starts + (pos - first), [Run(base, 0, len(starts), first, first + span, pos)], pos + span)
        ends = starts + sizes
        phys = np.empty(len(starts), np.int64)
        runs = []
        i, n = 0, len(starts)
        while i < n:
            room = base + self.file_size_bytes - BLANK_MARKER_SIZE - pos
            k = int(np.searchsorted(ends, int(starts[i]) + room, side="right"))
            if k == i:
                base += self.file_size_bytes
                pos = base
                continue
            src_start, src_end = int(starts[i]), int(ends[k - 1])
            phys[i:k] = starts[i:k] + (pos - src_start)
            runs.append(Run(base, i, k, src_start, src_end, pos))
            pos += src_end - src_start
            i = k
        return Placement(phys, runs, pos)

    # --- writing -------------------------------------------------------------------------------
    def prepare(self, placement: Placement) -> None:
        """Create the files the batch rolls into and give them blocks where it goes, before anything
        of it is written: a full disk or a descriptor limit fails the append here, with nothing to undo."""
        active = self.active
        self._allocate(active, self.write_pos)  # where a roll writes its blank marker
        for run in placement.runs:
            f = active if run.base == active.base_offset else self._spare_file(run.base)
            self._allocate(f, run.phys + run.src_end - run.src_start)

    def prepare_one(self, phys: int, size: int) -> None:
        """:meth:`prepare` of one record placed by :meth:`place_one`."""
        self._allocate(self.active, phys + size)

    @staticmethod
    def _allocate(f: MappedFile, end_offset: int) -> None:
        """Blocks for ``f`` up to ``end_offset`` and the blank marker a roll may write there."""
        if end_offset - f.base_offset + BLANK_MARKER_SIZE > f.allocated:
            f.allocate_to(min(end_offset - f.base_offset + BLANK_MARKER_SIZE, f.size_bytes))

    def write(self, buf: memoryview, placement: Placement, envelope: np.ndarray) -> None:
        """Copy the prepared batch as placed and patch the envelopes (ENVELOPE_DTYPE per record)."""
        env_bytes = envelope.view(np.uint8).data
        for base, i, k, src_start, src_end, phys in placement.runs:
            if base != self.active.base_offset:
                self._roll(base)
            f = self.active
            f.write(phys - base, buf[src_start:src_end])
            # each record's envelope in one C copy (a numpy scatter took 28 byte indices a record)
            gather(env_bytes, np.arange(i, k, dtype=np.int64) * ENVELOPE_BYTES,
                   np.full(k - i, ENVELOPE_BYTES, np.int64), f.view, placement.phys[i:k] - (base - OFF_QUEUE_ID))
            self.write_pos = phys + src_end - src_start
        if self.write_pos != placement.end_offset:
            raise StoreInvariantBroken(f"commitlog write ended at {self.write_pos}, its placement at"
                                       f" {placement.end_offset}")

    def commit(self, end_offset: int) -> None:
        """The batch written up to ``end_offset`` is indexed: readers and the flusher may have it.
        The committed end only moves forward (set_end, at open, is the one way to place it)."""
        if not self.committed_pos <= end_offset == self.write_pos:
            raise StoreInvariantBroken(f"commitlog commit to {end_offset} (committed {self.committed_pos},"
                                       f" written {self.write_pos})")
        self.committed_pos = end_offset
        if not self._next_prepared:
            self._prepare_next_when_due()

    def place_one(self, size: int) -> int | None:
        """Where a single record of ``size`` bytes goes if it fits the active file (None: it
        rolls, :meth:`place` places it)."""
        pos = self.write_pos
        return pos if pos + size <= self.active.end_offset - BLANK_MARKER_SIZE else None

    def write_one(self, buf: memoryview, phys: int, queue_id: int, queue_offset: int, store_ts_ms: int) -> None:
        """``write`` of one record placed by :meth:`place_one`, its envelope packed with struct."""
        f = self.active
        pos = phys - f.base_offset
        f.write(pos, buf)
        _ENVELOPE.pack_into(f.view, pos + OFF_QUEUE_ID, queue_id, queue_offset, phys, store_ts_ms)
        self.write_pos = phys + len(buf)

    def rollback(self, end_offset: int) -> None:
        """Undo a write that failed before it was committed: zero whatever it may have copied from
        ``committed_pos`` up to ``end_offset`` (blank markers included) and give the files it
        rolled into back to the spares, so no trace of the batch is left for recovery to find."""
        start, end = self.committed_pos, end_offset
        for f in self.files:
            lo, hi = max(start, f.base_offset), min(end, f.end_offset)
            if lo < hi:
                f.array[lo - f.base_offset: hi - f.base_offset] = 0
        rolled = self._segments.take_from(start + 1)  # the files the batch rolled into
        if rolled:
            with self._spare_lock:
                self._spare.update((f.base_offset, f) for f in rolled)
        self.write_pos = start

    def _roll(self, base: int) -> None:
        f = self.active
        left = f.end_offset - self.write_pos
        _BLANK.pack_into(f.view, self.write_pos - f.base_offset, left, BLANK_MAGIC)
        self._segments.append(self._spare_file(base))
        with self._spare_lock:
            self._spare.pop(base, None)
        self.write_pos = base
        self._next_prepared = False

    def _spare_file(self, base: int) -> MappedFile:
        with self._spare_lock:
            if base not in self._spare:
                if self._closed:  # the warmer, late: no file is created behind a closed commitlog
                    raise StoreClosed()
                self._spare[base] = self._segments.create(base)
            return self._spare[base]

    def _prepare_next_when_due(self) -> None:
        """Once the active file is PREPARE_NEXT_AT full, create and pre-fault the next file in the
        background. Only a file nobody writes yet is warmed: populating pages the writer is
        touching at the same time slows it down ~4x."""
        active = self.active
        if self.committed_pos - active.base_offset >= PREPARE_NEXT_AT * active.size_bytes:
            self._next_prepared = True
            if self._warmer is not None:
                base = active.end_offset
                self._warmer.submit(lambda: self._warm_spare(base))

    def _warm_spare(self, base: int) -> None:
        try:
            f = self._spare_file(base)
        except StoreClosed:
            return
        f.warm(stop=lambda: self._closed or self.active is f, wait=self._busy_watch())

    def _busy_watch(self) -> Callable[[], bool]:
        """For the warmer: whether records were read since the last look, while the active file
        is less than WARM_WAIT_UNTIL_FULL full (then warming waits for a pause in the reads)."""
        last = self.reads

        def busy() -> bool:
            nonlocal last
            seen, last = last, self.reads
            active = self.active
            return last != seen and self.write_pos - active.base_offset < WARM_WAIT_UNTIL_FULL * active.size_bytes

        return busy

    # --- reading -------------------------------------------------------------------------------
    def read(self, phys_offset: int, size: int) -> memoryview:
        f = self.file_for(phys_offset)
        pos = phys_offset - f.base_offset
        return f.view[pos: pos + size]

    # --- flushing, truncation, deletion --------------------------------------------------------
    def flush_range(self, start: int, end: int) -> None:
        """Make [start, end) durable (whole files are fdatasync'ed; only dirty pages are written)."""
        if end <= start:
            return
        for f in self.files:
            if f.end_offset > start and f.base_offset < end:
                f.flush()

    def release_behind(self, offset: int) -> None:
        """Release the mapped pages below ``offset`` (flushed data; the flush thread calls this),
        in steps of at least RELEASE_STEP_BYTES so small flushes make no system call."""
        if offset - self.released < RELEASE_STEP_BYTES:
            return
        for f in self.files:
            if f.end_offset > self.released and f.base_offset < offset:
                f.release(max(self.released, f.base_offset) - f.base_offset, min(offset, f.end_offset) - f.base_offset)
        self.released = offset

    def truncate(self, end_offset: int) -> None:
        """Recovery: erase everything from ``end_offset`` on (zero the tail, delete later files)."""
        f = self.file_for(end_offset) if end_offset < self.files[-1].end_offset else self.files[-1]
        f.zero_from(end_offset - f.base_offset)
        self.set_end(end_offset)

    def delete_oldest(self, should_delete: Callable[[MappedFile], bool]) -> int:
        """Delete files from the oldest while ``should_delete`` says so, never the active one; a
        file a reader still holds goes all the same (closed once released). Returns the number
        deleted."""
        return self._segments.delete_oldest(should_delete)

    def close(self) -> None:
        """Unmap the files. The warmer's job under way gives up at its next look, and is waited
        for only a little (see :mod:`gms.broker.commitlog.warmer`)."""
        warmer = self._warmer
        if warmer is not None:
            warmer.close()  # first: it may hold the lock below, creating a spare file
        with self._spare_lock:
            self._closed = True
            spares, self._spare = list(self._spare.values()), {}
        if warmer is not None:
            warmer.join()
        for f in spares:
            f.try_close()
        self._segments.close()
