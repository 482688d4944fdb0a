"""Lookups by key and by message id of the records compacted logs keep (:mod:`.compacted`):
below a compacted queue's point, the key index and the commitlog lose them with the commitlog
files, so each compacted log gets an index of its own, built at its first lookup (vectorised
over the whole log) and kept until the log is replaced: every key's hash, and the commitlog
offset each record was stored at (what its message id names)."""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from gms.broker.keyindex.keys import batch_keys, key_hash
from gms.broker.store.compacted import CompactedLogs, Segment
from gms.broker.store.queues import QueueKey
from gms.record import OFF_PHYS_OFFSET, crc_mismatches
from gms.record.columns import read_field_offsets
from gms.store_errors import CorruptRecord

log = logging.getLogger(__name__)


class SegmentIndex(NamedTuple):
    """The keys and stored positions of a segment's records (rows: positions in the segment's arrays)."""

    key_hashes: np.ndarray  # int64 ascending: the hash of every key of every kept record
    key_rows: np.ndarray  # the record (row of the segment) of each
    phys: np.ndarray  # int64 ascending: the commitlog offset each record was stored at
    phys_rows: np.ndarray


def index_segment(segment: Segment, topic: str) -> SegmentIndex:
    """The index of a segment's records whose CRC holds (one damaged since the segment was
    opened is left out: it would not be answered)."""
    rows = np.arange(len(segment.starts))
    bad = crc_mismatches(segment.view, segment.starts, segment.sizes) if len(rows) else np.empty(0, np.intp)
    rows = np.delete(rows, bad)
    try:
        headers = read_field_offsets(segment.view, segment.starts[rows]).headers if len(rows) else None
    except CorruptRecord as err:  # a length outside the CRC flipped since: the log is looked up no more
        log.error("compacted log %s: %s: not indexed for lookups", segment.path, err)
        headers = None
    if headers is None:
        empty = np.empty(0, np.int64)
        return SegmentIndex(empty, empty, empty, empty)
    keys = batch_keys(np.frombuffer(segment.view, np.uint8), segment.starts[rows], headers, [topic],
                      np.zeros(len(rows), np.intp))
    by_hash = np.argsort(keys.hashes, kind="stable")
    phys = headers["phys_offset"].astype(np.int64)
    by_phys = np.argsort(phys, kind="stable")
    return SegmentIndex(keys.hashes[by_hash], rows[keys.records[by_hash]], phys[by_phys], rows[by_phys])


def checked(segment: Segment, row: int) -> memoryview | None:
    """The segment's record at ``row`` if its CRC holds (a damaged one is never answered)."""
    start, size = int(segment.starts[row]), int(segment.sizes[row])
    if crc_mismatches(segment.view, segment.starts[row:row + 1], segment.sizes[row:row + 1]).size:
        log.error("compacted log %s: damaged record (CRC mismatch) at offset %d, not answered", segment.path,
                  int(segment.offsets[row]))
        return None
    return segment.view[start:start + size]


class CompactedLookups:
    """Lookups in the compacted logs of a store (any thread; an index is built once per log)."""

    def __init__(self, compacted: CompactedLogs) -> None:
        self._compacted = compacted
        self._indexes: dict[QueueKey, tuple[Segment, SegmentIndex]] = {}

    def _segments(self, topic: str | None = None) -> list[tuple[Segment, SegmentIndex]]:
        """The compacted logs (of ``topic``, or all) with their indexes; those of logs replaced or
        dropped are forgotten."""
        segments = self._compacted.snapshot()
        indexes = {key: pair for key, pair in self._indexes.items() if segments.get(key) is pair[0]}
        found = []
        for key, segment in segments.items():
            if topic is not None and key[0] != topic:
                continue
            if key not in indexes:
                indexes[key] = (segment, index_segment(segment, key[0]))
            found.append(indexes[key])
        self._indexes = indexes  # a race only builds an index twice
        return found

    def record_at(self, phys: int) -> memoryview | None:
        """The kept record stored at commitlog offset ``phys`` (its message id's), if any."""
        for segment, index in self._segments():
            i = int(np.searchsorted(index.phys, phys))
            if i < len(index.phys) and int(index.phys[i]) == phys:
                return checked(segment, int(index.phys_rows[i]))
        return None

    def keeps(self, topic: str, queue_id: int, offset: int, phys: int) -> bool:
        """The queue's compacted log keeps the record stored at ``phys`` at queue offset ``offset``."""
        segment = self._compacted.segment(topic, queue_id)
        if segment is None:
            return False
        i = int(np.searchsorted(segment.offsets, offset))
        if i >= len(segment.offsets) or int(segment.offsets[i]) != offset:
            return False
        at = int(segment.starts[i]) + OFF_PHYS_OFFSET
        return int.from_bytes(segment.view[at:at + 8], "big", signed=True) == phys

    def find_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int) -> list[tuple[int, memoryview]]:
        """(store time, record) of the kept records of ``topic`` that may carry ``key`` (hashes
        collide: the caller checks), stored in [begin_ms, end_ms]."""
        wanted = key_hash(topic, key)
        found = []
        for segment, index in self._segments(topic):
            lo = int(np.searchsorted(index.key_hashes, wanted))
            hi = int(np.searchsorted(index.key_hashes, wanted, side="right"))
            rows = np.unique(index.key_rows[lo:hi])
            times = segment.store_ts[rows]
            for row, ts in zip(rows.tolist(), times.tolist(), strict=True):
                if begin_ms <= ts <= end_ms and (view := checked(segment, row)) is not None:
                    found.append((ts, view))
        return found
