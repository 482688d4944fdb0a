"""Reads below a compacted queue's compaction point, from its compacted log (:mod:`.compacted`):
the kept records at their original offsets, the removed ones skipped (a read at a removed offset
answers the next kept one)."""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from gms.broker.store.compacted import Segment
from gms.broker.store.records import coalesce
from gms.broker.store.types import RecordSelector
from gms.record import OFF_PHYS_OFFSET, crc_mismatches, record_views

log = logging.getLogger(__name__)
SEGMENT_SCAN_MAX = 65_536  # records one filtered read of a segment may examine


class SegmentRead(NamedTuple):
    views: list[memoryview]
    offsets: np.ndarray  # the queue offsets served
    next_offset: int
    damaged: tuple[tuple[int, int], ...]  # (queue offset, message id's commitlog offset) of records whose CRC fails


def low_offset(segment: Segment | None, cq_min: int) -> int:
    """A queue's first readable offset: its first compacted record's, else its consumeQueue's."""
    first = None if segment is None else segment.low()
    return cq_min if first is None else min(first, cq_min)


def first_at_time(segment: Segment, ts_ms: int) -> int | None:
    """The queue offset of the segment's first record stored at or after ``ts_ms`` (None: none)."""
    i = int(np.searchsorted(segment.store_ts, ts_ms))
    return int(segment.offsets[i]) if i < len(segment.offsets) else None


def read_segment(segment: Segment, offset: int, max_msgs: int, max_bytes: int, tag_hashes: frozenset[int] | None,
                 select: RecordSelector | None, coalesced: bool) -> SegmentRead | None:
    """Up to ``max_msgs`` records (about ``max_bytes``, at least one) kept at or after ``offset``
    (below the point); None if none is kept there: the read goes on at the point."""
    offsets = segment.offsets
    first = int(np.searchsorted(offsets, offset))
    if first >= len(offsets):
        return None
    max_msgs = max(max_msgs, 1)
    stop = min(len(offsets), first + (max_msgs if tag_hashes is None else SEGMENT_SCAN_MAX))
    picked = np.arange(first, stop)
    if tag_hashes is not None:
        picked = picked[np.isin(segment.tag_hashes[first:stop], np.fromiter(tag_hashes, np.int64))][:max_msgs]
        stop = int(picked[-1]) + 1 if len(picked) == max_msgs else stop
    sizes = segment.sizes[picked]
    take = min(max(int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")), 1), len(picked))
    if take < len(picked):
        stop = int(picked[take - 1]) + 1
    picked = picked[:take]
    next_offset = int(offsets[stop]) if stop < len(offsets) else segment.point
    starts, sizes = segment.starts[picked], segment.sizes[picked]
    damaged: tuple[tuple[int, int], ...] = ()
    bad = crc_mismatches(segment.view, starts, sizes) if len(picked) else np.empty(0, np.intp)
    if bad.size:  # a bit flipped since the file was opened: answered as damaged, as the commitlog's
        phys = [int.from_bytes(segment.view[s + OFF_PHYS_OFFSET:s + OFF_PHYS_OFFSET + 8], "big", signed=True)
                for s in starts[bad].tolist()]
        damaged = tuple(zip(offsets[picked[bad]].tolist(), phys, strict=True))
        log.error("compacted log %s: damaged record(s) (CRC mismatch) at offsets %s, answered as damaged",
                  segment.path, [d[0] for d in damaged])
        keep = np.ones(len(picked), bool)
        keep[bad] = False
        picked, starts, sizes = picked[keep], starts[keep], sizes[keep]
    if select is not None and len(picked):
        keep = select(segment.view, starts)
        picked, starts, sizes = picked[keep], starts[keep], sizes[keep]
    if coalesced and len(picked):
        starts, sizes = coalesce(starts, sizes)
    views = record_views(segment.view, starts, sizes) if len(starts) else []
    return SegmentRead(views, offsets[picked], next_offset, damaged)
