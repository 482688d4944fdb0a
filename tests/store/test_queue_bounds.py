"""A consumeQueue's bounds are found by one function (consume_queue.queue_bounds), used by the
broker opening the queue and by Spark reading a store's files read-only: both must agree, also
on the queue an append left with a reserved file it never wrote."""

from __future__ import annotations

import numpy as np
import pytest

from gms.broker.consumequeue.consume_queue import CQ_DTYPE, ConsumeQueue, queue_bounds
from gms.spark_jobs.store_files import QueueIndex

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
