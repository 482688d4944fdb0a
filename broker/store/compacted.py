"""Compacted logs: per queue of a compacted topic, the records below its compaction point that
compaction kept (the latest per key), at their original queue offsets, in one file.

Layout: ``compacted/<topic>/<queue id>/<20-digit point>.seg`` holds stored records back to back,
byte for byte as they lay in the commitlog (their envelopes name their original queue offsets
and message ids). A queue offset below the point is served from here (a removed one answers
the next kept one, as Kafka's compacted logs leave gaps); from the point on, from the commitlog
through the consumeQueue. The cleaner (:mod:`.cleaner`) replaces the file whole: it writes
``<point>.tmp``, syncs it, renames it to ``<point>.seg``, syncs the directory and only then
removes the older one; what a crash at each step leaves is resolved by :meth:`CompactedLogs.load`
(docs/storage-format.md "Compacted topics").
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gms.broker.mapped_file import fsync_dir
from gms.private_files import make_private_dir
from gms.record import HEADER_SIZE, MAGIC_V1, OFF_MAGIC, RecordCheck, check_record, scan_records
from gms.record.columns import read_field_offsets

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
TMP_SUFFIX = ".tmp"
_EMPTY = np.empty(0, np.int64)
_MAGIC = MAGIC_V1.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Segment:
    """A queue's compacted records: those kept below ``point``, increasing queue offsets."""

    point: int
    path: Path | None
    view: memoryview  # the file's bytes (a read-only map)
    offsets: np.ndarray  # int64 queue offsets
    starts: np.ndarray  # int64 positions in ``view``
    sizes: np.ndarray  # int64
    tag_hashes: np.ndarray  # int64, the records' own
    store_ts: np.ndarray  # int64 ms

    @property
    def size_bytes(self) -> int:
        return int(self.sizes.sum())

    def low(self) -> int | None:
        """The first queue offset kept here (None: none is)."""
        return int(self.offsets[0]) if len(self.offsets) else None


def segment_name(point: int) -> str:
    return f"{point:020d}{SEGMENT_SUFFIX}"


def open_segment(path: Path, point: int) -> Segment:
    """The segment in ``path``, its records checked (length, magic, CRC; queue offsets rising
    below the point): a damaged record is never served (logged; the next compaction rewrites the
    file without it), and the intact records after it still are."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return _segment(point, path, memoryview(b""), _EMPTY)
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    return _segment(point, path, memoryview(mm), intact_records(mm, point, path))


def intact_records(mm: mmap.mmap, point: int, path: Path) -> np.ndarray:
    """The starts of the intact records of a segment's bytes. Past a damaged stretch the walk
    goes on at the next position where an intact record lies: where the damaged record's length
    says, else the next magic number starting a record whose CRC holds."""
    view, size = memoryview(mm), len(mm)
    parts, pos = [], 0
    while pos < size:
        scan = scan_records(view, pos)
        parts.append(scan.starts)
        if scan.stop is RecordCheck.OK:
            break
        bad = scan.stop_pos
        claimed = int.from_bytes(view[bad:bad + 4], "big")
        pos = bad + claimed if HEADER_SIZE <= claimed <= size - bad and check_record(view, bad + claimed)[0] in (
            RecordCheck.OK, RecordCheck.EMPTY) else _next_record(mm, bad + 1)
        log.error("compacted log %s is damaged in bytes [%d, %d) (%s): the records there are not served", path,
                  bad, pos, scan.stop.value)
    starts = np.concatenate(parts) if parts else _EMPTY
    offsets = read_field_offsets(view, starts).headers["queue_offset"].astype(np.int64) if len(starts) else _EMPTY
    # The queue offset lies outside the CRC: one that does not rise between its neighbours' was flipped
    rising = np.diff(np.concatenate(([-1], offsets, [point]))) > 0
    in_order = rising[:-1] & rising[1:]
    if not in_order.all():
        log.error("compacted log %s: %d record(s) with a queue offset out of order (damaged) not served", path,
                  int((~in_order).sum()))
    return starts[in_order]


def _next_record(mm: mmap.mmap, pos: int) -> int:
    """The first position from ``pos`` where an intact record starts (the end if none does)."""
    while (found := mm.find(_MAGIC, pos + OFF_MAGIC)) >= 0:
        pos = found - OFF_MAGIC
        if check_record(memoryview(mm), pos)[0] is RecordCheck.OK:
            return pos
        pos += 1
    return len(mm)


def _segment(point: int, path: Path | None, view: memoryview, starts: np.ndarray) -> Segment:
    if not len(starts):
        return Segment(point, path, view, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    headers = read_field_offsets(view, starts).headers
    return Segment(point, path, view, headers["queue_offset"].astype(np.int64), starts.astype(np.int64),
                   headers["total_size"].astype(np.int64), headers["tag_hash"].astype(np.int64),
                   headers["store_ts_ms"].astype(np.int64))


def empty_segment(point: int) -> Segment:
    return _segment(point, None, memoryview(b""), _EMPTY)


class CompactedLogs:
    """The compacted logs of the store's queues, under ``root`` (one directory per queue)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._segments: dict[tuple[str, int], Segment] = {}
        self._lock = threading.Lock()
        # Held by the cleaner over a queue's pass and by a topic's deletion: a pass never writes
        # into the directory of a topic deleted meanwhile.
        self.busy = threading.Lock()

    def queue_dir(self, topic: str, queue_id: int) -> Path:
        return self._root / topic / str(queue_id)

    def load(self, topics: dict[str, int]) -> None:
        """Open every queue's newest segment. A crash leaves at most: a ``.tmp`` file (torn or
        whole, never renamed: removed), and an older ``.seg`` beside the newest (the newest was
        synced before its rename: the older ones are removed). Directories of topics the table
        does not list are removed (a deleted topic, or a crash while deleting it)."""
        if not self._root.is_dir():
            return
        for topic_dir in self._root.iterdir():
            if topic_dir.name not in topics:
                shutil.rmtree(topic_dir, ignore_errors=True)
                continue
            for qdir in topic_dir.iterdir():
                if qdir.name.isdigit() and int(qdir.name) < topics[topic_dir.name]:
                    self._load_queue(topic_dir.name, int(qdir.name), qdir)

    def _load_queue(self, topic: str, queue_id: int, qdir: Path) -> None:
        segments: list[tuple[int, Path]] = []
        for path in qdir.iterdir():
            stem, suffix = path.name[:-4], path.name[-4:]
            if suffix == SEGMENT_SUFFIX and stem.isdigit():
                segments.append((int(stem), path))
            else:  # a torn or unfinished rewrite
                log.warning("compacted log %s: removing %s, left by an interrupted compaction", qdir, path.name)
                path.unlink(missing_ok=True)
        segments.sort()
        for _, older in segments[:-1]:
            older.unlink(missing_ok=True)
        if segments:
            point, path = segments[-1]
            self._segments[(topic, queue_id)] = open_segment(path, point)

    def segment(self, topic: str, queue_id: int) -> Segment | None:
        return self._segments.get((topic, queue_id))

    def install(self, topic: str, queue_id: int, point: int, tmp: Path) -> Segment:
        """Make the synced ``tmp`` the queue's segment at ``point``: renamed, directory synced,
        then the previous segment's file removed (its readers keep their map)."""
        path = tmp.with_name(segment_name(point))
        os.replace(tmp, path)
        fsync_dir(path.parent)
        segment = open_segment(path, point)
        with self._lock:
            previous = self._segments.get((topic, queue_id))
            self._segments[(topic, queue_id)] = segment
        if previous is not None and previous.path is not None and previous.path != path:
            previous.path.unlink(missing_ok=True)
        return segment

    def new_tmp(self, topic: str, queue_id: int, point: int) -> Path:
        qdir = self.queue_dir(topic, queue_id)
        if not qdir.is_dir():
            make_private_dir(qdir)
            for made in (qdir.parent, self._root, self._root.parent):
                fsync_dir(made)
        return qdir / f"{point:020d}{TMP_SUFFIX}"

    def drop(self, topic: str, queue_id: int) -> None:
        """Forget a queue's segment and remove its files (compacted records all expired)."""
        with self._lock:
            self._segments.pop((topic, queue_id), None)
        shutil.rmtree(self.queue_dir(topic, queue_id), ignore_errors=True)

    def drop_topic(self, name: str) -> None:
        """A deleted topic's compacted logs go with it (a new topic of the name starts empty)."""
        with self.busy, self._lock:
            for key in [k for k in self._segments if k[0] == name]:
                del self._segments[key]
        shutil.rmtree(self._root / name, ignore_errors=True)

    def snapshot(self) -> dict[tuple[str, int], Segment]:
        with self._lock:
            return dict(self._segments)
