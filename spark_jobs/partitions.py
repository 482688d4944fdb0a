"""What a Spark task reads (queue offset ranges, dealt into partitions), how bad records are
reported, and the filters applied after the index: exact tags and store time."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from pyspark.sql.datasource import InputPartition

from gms.spark_jobs.arrow_batches import Records, exact_tag_mask
from gms.spark_jobs.options import OnCorrupt, ReadOptions

log = logging.getLogger(__name__)


class QueueRange(NamedTuple):
    """Queue offsets [start, end) of one queue; ``broker`` is set for a live-cluster read."""

    topic: str
    queue_id: int
    start: int
    end: int
    broker: str | None = None

    def __repr__(self) -> str:
        where = f"@{self.broker}" if self.broker else ""
        return f"QueueRange({self.topic}/{self.queue_id}{where} [{self.start}, {self.end}))"


class QueueRanges(InputPartition):
    """What one Spark task reads: queue ranges, one after the other."""

    def __init__(self, ranges: tuple[QueueRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"QueueRanges{self.ranges!r}"


class QueueSpan(NamedTuple):
    """The selected offsets of one queue (start == end when nothing is selected)."""

    topic: str
    queue_id: int
    start: int
    end: int
    broker: str | None  # who serves the queue on a live read


def split_spans(spans: list[QueueSpan], records_max: int, records_min: int,
                parallelism: int | None = None) -> list[QueueRanges]:
    """The partitions of a read: queues longer than ``records_max`` cut into offset ranges, and
    the ranges, in order, dealt into about one partition per ``records_min`` records (a multiple
    of ``parallelism``, the cluster's cores when known, so each core gets as many; never more
    than there are ranges). Each Spark task costs tens of ms of the JVM's and its Python worker's
    CPU however few rows it reads: a partition per queue of 30k records spent more on that than
    on the records."""
    ranges = [QueueRange(s.topic, s.queue_id, lo, min(lo + records_max, s.end), s.broker)
              for s in spans for lo in range(s.start, s.end, records_max)]
    if not ranges:
        return []
    total = sum(r.end - r.start for r in ranges)
    count = -(-total // records_min)
    if parallelism:
        count = -(-count // parallelism) * parallelism
    count = min(count, len(ranges))
    groups: list[list[QueueRange]] = [[] for _ in range(count)]
    before = 0
    for rng in ranges:  # each range to the group its first record falls in: as many records each
        groups[before * count // total].append(rng)
        before += rng.end - rng.start
    return [QueueRanges(tuple(group)) for group in groups if group]


class CorruptRecordsError(RuntimeError):
    """Records that fail their checks were found with onCorrupt=fail."""

    def __init__(self, topic: str, queue_id: int, queue_offsets: list[int], phys_offsets: list[int]) -> None:
        super().__init__(f"{len(queue_offsets)} corrupt record(s) in {topic}/{queue_id} at queue offsets "
                         f"{queue_offsets[:10]} (commitlog offsets {phys_offsets[:10]})")
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offsets = queue_offsets
        self.phys_offsets = phys_offsets


BadRecordSink = Callable[[str, int, np.ndarray, np.ndarray], None]


def bad_record_sink(on_corrupt: OnCorrupt, counter: Any | None) -> BadRecordSink:
    """Where bad records go: an exception, or a warning plus an accumulator (when one exists)."""
    def report(topic: str, queue_id: int, queue_offsets: np.ndarray, phys: np.ndarray) -> None:
        if not len(queue_offsets):
            return
        if on_corrupt is OnCorrupt.FAIL:
            raise CorruptRecordsError(topic, queue_id, queue_offsets.tolist(), phys.tolist())
        log.warning("skipped %d corrupt record(s) in %s/%d at queue offsets %s", len(queue_offsets), topic,
                    queue_id, queue_offsets[:10].tolist())
        if counter is not None:
            counter.add(len(queue_offsets))
    return report


def after_index_filters(records: Records, options: ReadOptions) -> Records:
    """Drop records outside [startTime, endTime) and tag-hash collisions."""
    keep = np.ones(len(records.starts), bool)
    ts = records.headers["store_ts_ms"]
    if options.start_time_ms is not None:
        keep &= ts >= options.start_time_ms
    if options.end_time_ms is not None:
        keep &= ts < options.end_time_ms
    if options.tags.tags is not None and keep.any():
        keep &= exact_tag_mask(records, options.tags.tags)
    return records if keep.all() else records.take(keep)
