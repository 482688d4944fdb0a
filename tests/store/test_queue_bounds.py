"""A consumeQueue's bounds are found by one function (consume_queue.queue_bounds), used by the
broker opening the queue and by Spark reading a store's files read-only: both must agree, also
on the queue an append left with a reserved file it never wrote."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from gms.broker.consumequeue.consume_queue import (
    CQ_DTYPE,
    ZERO_PAGES_AHEAD_BATCHES,
    ConsumeQueue,
    queue_bounds,
)
from gms.broker.mapped_file import MappedFile
from gms.spark_jobs.store_files import QueueIndex
from gms.store_errors import StoreIOError

ENTRIES_PER_FILE = 4


def _entries(first_phys: int, count: int) -> np.ndarray:
    entries = np.zeros(count, CQ_DTYPE)
    entries["phys"] = np.arange(first_phys, first_phys + count) * 100
    entries["size"] = 100
    return entries


def _write(cq: ConsumeQueue, count: int) -> None:
    start = cq.max_offset
    cq.reserve(count)
    cq.write(start, _entries(start, count))
    cq.publish(start + count)


def _bounds_both_ways(directory) -> tuple[tuple[int, int], tuple[int, int]]:
    cq = ConsumeQueue(directory, ENTRIES_PER_FILE)
    try:
        broker = (cq.min_offset, cq.max_offset)
    finally:
        cq.close()
    index = QueueIndex(directory)
    return broker, (index.min_offset, index.max_offset)


def test_spark_and_the_broker_agree_on_a_queue_spanning_files(tmp_path):
    cq = ConsumeQueue(tmp_path, ENTRIES_PER_FILE)
    _write(cq, 6)
    cq.flush()
    cq.close()
    assert _bounds_both_ways(tmp_path) == ((0, 6), (0, 6))


def test_a_reserved_file_an_append_never_wrote_ends_nothing(tmp_path):
    """An append reserved files for 5 entries and failed before writing: the queue still ends at
    3 for Spark as for the broker (Spark's own reckoning said 4, the empty file's start)."""
    cq = ConsumeQueue(tmp_path, ENTRIES_PER_FILE)
    _write(cq, 3)
    cq.reserve(5)  # files for offsets 3..7: the second one stays all zeros
    cq.flush()
    cq.close()
    assert len(list(tmp_path.iterdir())) == 2
    assert _bounds_both_ways(tmp_path) == ((0, 3), (0, 3))


def test_queue_bounds_rules():
    def slots(*files: list[int]):
        return lambda i, written, start: next(
            (s for s, size in enumerate(files[i]) if s >= start and (size > 0) == written), None)

    assert queue_bounds([], slots()) == (0, 0)
    assert queue_bounds([(0, 4), (4, 4)], slots([1, 1, 1, 1], [1, 0, 0, 0])) == (0, 5)
    assert queue_bounds([(0, 4), (4, 4)], slots([1, 1, 1, 1], [0, 0, 0, 0])) == (0, 4)  # full, then reserved
    assert queue_bounds([(8, 4), (12, 4)], slots([0, 1, 1, 1], [1, 1, 1, 1])) == (9, 16)
    # restarted at 6, inside its first file: the end is after its unwritten leading entries
    assert queue_bounds([(4, 4)], slots([0, 0, 1, 0])) == (6, 7)
    assert queue_bounds([(4, 4)], slots([0, 0, 1, 1])) == (6, 8)
    assert queue_bounds([(4, 4), (8, 4)], slots([0, 0, 1, 1], [0, 0, 0, 0])) == (6, 8)  # then reserved
    assert queue_bounds([(4, 4)], slots([0, 0, 0, 0])) == (4, 4)


@pytest.mark.parametrize("appended", [1, 2, 3, 6])
def test_a_queue_restarted_inside_a_file_reopens_where_it_was(tmp_path, appended):
    """Reset to offset 6, inside the file of offsets 4..7 (its entries 4 and 5 never written), then
    ``appended`` entries: reopened, the queue spans [6, 6 + appended) for the broker and for Spark,
    and serves exactly those entries (2 ends the first file, 6 ends inside the third). Its end was
    the file's start, 4, below its minimum. (With nothing appended no entry tells where it
    restarted: the store's saved minimums do, test_store_retention.)"""
    cq = ConsumeQueue(tmp_path, ENTRIES_PER_FILE)
    _write(cq, 3)
    cq.reset(6)
    _write(cq, appended)
    cq.flush()
    cq.close()
    assert _bounds_both_ways(tmp_path) == ((6, 6 + appended),) * 2
    cq = ConsumeQueue(tmp_path, ENTRIES_PER_FILE)
    try:
        assert cq.read(6, appended)["phys"].tolist() == _entries(6, appended)["phys"].tolist()
    finally:
        cq.close()
    assert QueueIndex(tmp_path).read(0, 100)["phys"].tolist() == _entries(6, appended)["phys"].tolist()


def _cachings(monkeypatch) -> list[tuple[int, int]]:
    """The (start, end) of every MappedFile.cache_zero_pages call from now on (each still runs)."""
    calls: list[tuple[int, int]] = []
    real = MappedFile.cache_zero_pages

    def cache_zero_pages(self: MappedFile, start: int, end: int) -> None:
        calls.append((start, end))
        real(self, start, end)

    monkeypatch.setattr(MappedFile, "cache_zero_pages", cache_zero_pages)
    return calls


def test_a_queue_fed_batches_caches_the_pages_of_its_next_batches_at_once(tmp_path, monkeypatch):
    """Batches of 250 entries (5,000 bytes) meet a new page at nearly every one; the queue caches
    the pages of the next few batches with the first, so it writes its file once every few
    batches, not at each (a file opened and written per queue and batch was a tenth of a
    thousand-topic send). The entries read back as written."""
    calls = _cachings(monkeypatch)
    cq = ConsumeQueue(tmp_path, 100_000)
    try:
        for _ in range(40):
            _write(cq, 250)
        assert len(calls) <= 40 // max(ZERO_PAGES_AHEAD_BATCHES, 2) + 2  # 40 without the look-ahead
        assert cq.read(0, 10_000)["phys"].tolist() == _entries(0, 10_000)["phys"].tolist()
    finally:
        cq.close()
    index = QueueIndex(tmp_path)  # the pages cached ahead hold zeros: no entry for Spark either
    assert (index.min_offset, index.max_offset) == (0, 10_000)


def test_a_queue_fed_a_message_at_a_time_caches_no_page_ahead(tmp_path, monkeypatch):
    """The look-ahead follows the batch size: one entry at a time caches only the page it goes to
    (a quiet queue among thousands costs no memory for pages it may never use)."""
    calls = _cachings(monkeypatch)
    cq = ConsumeQueue(tmp_path, 100_000)
    try:
        for offset in range(600):
            before = len(calls)
            _write(cq, 1)
            page_end = -(-(offset + 1) * CQ_DTYPE.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
            assert all(end <= page_end for _, end in calls[before:])
        assert calls  # 600 entries of 20 bytes cross pages
    finally:
        cq.close()


def test_a_full_disk_refuses_no_batch_for_want_of_room_to_look_ahead(tmp_path, monkeypatch):
    """Blocks for the pages cached ahead are only an optimisation: a disk with room for the batch
    but not for them stores the batch (and caches only its own pages)."""
    cq = ConsumeQueue(tmp_path, 100_000)
    real = MappedFile.allocate_to
    room_bytes = 300 * CQ_DTYPE.itemsize  # the first batch of 250 entries fits, its look-ahead not

    def allocate_to(self: MappedFile, end: int) -> None:
        if end > room_bytes:
            raise StoreIOError(f"cannot allocate {end} bytes for {self.path}: no space left on device")
        real(self, end)

    monkeypatch.setattr(MappedFile, "allocate_to", allocate_to)
    try:
        _write(cq, 250)
        assert cq.read(0, 250)["phys"].tolist() == _entries(0, 250)["phys"].tolist()
        with pytest.raises(StoreIOError):  # the next batch's own entries have no room: refused
            cq.reserve(250)
    finally:
        cq.close()


def test_a_huge_batch_caches_at_most_a_little_ahead(tmp_path, monkeypatch):
    """A batch of 100,000 entries (2 MB of them) caches its own pages and a few more, not three
    more batches of its size (6 MB written on the request loop stalled other clients' requests
    behind it: test_wire_limits' huge batch of tiny records)."""
    calls = _cachings(monkeypatch)
    cq = ConsumeQueue(tmp_path, 1_000_000)
    try:
        _write(cq, 100_000)
        own_end = 100_000 * CQ_DTYPE.itemsize
        assert max(end for _, end in calls) <= own_end + 128 * 1024
    finally:
        cq.close()
