"""Read-only access to a broker's store files, safe while a broker is writing them.

The broker's own classes (``MappedFile``, ``ConsumeQueue``, ``MessageStore``) open files
read-write, resize short files and take the abort marker, so Spark reads the same layout here
with ``O_RDONLY`` maps instead. Nothing is ever written. A queue's files and bounds are found by
the broker's own rules (``segment_list.newest_run``, ``consume_queue.queue_bounds``, as the
``ConsumeQueue`` constructor finds them when a broker opens the queue): it ends at the first entry
of size 0 of its newest file with entries (in its first file, after its first written one), and
its saved minimum applies as the broker applies it (``consume_queue.restored_bounds``). The broker
writes the commitlog bytes before the entry that points at them, so everything up to that entry
is readable. Commitlog files deleted by
retention while we read are reported as missing, not as corruption.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np

from gms.broker.consumequeue.consume_queue import (
    CQ_DTYPE,
    CQ_UNIT,
    SCAN_CHUNK_ENTRIES,
    queue_bounds,
    restored_bounds,
)
from gms.broker.consumequeue.min_offsets import load_min_offsets
from gms.broker.mapped_file import list_files
from gms.broker.segment_list import newest_run
from gms.broker.store.compacted import SEGMENT_SUFFIX, Segment, open_segment
from gms.broker.store.paths import StorePaths
from gms.naming import validate_topic_name


class StoreLayoutError(ValueError):
    """The path does not hold a gms store."""


def store_root(path: str | Path) -> Path:
    """The store root for ``path``: a store root itself or a broker's ``--store-dir``."""
    for candidate in (StorePaths(Path(path)), StorePaths.of_broker(path)):
        if candidate.commitlog.is_dir() or candidate.topics.is_file():
            return candidate.root
    raise StoreLayoutError(f"{path} holds no gms store (no commitlog/ or config/topics.json)")


def read_topics(root: Path) -> dict[str, int]:
    """Topic name -> queue count from ``config/topics.json`` (empty if there is none yet)."""
    path = StorePaths(root).topics
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_bytes())
        return {validate_topic_name(name): int(spec["queue_count"]) for name, spec in doc["topics"].items()}
    except (ValueError, KeyError, TypeError) as err:
        raise StoreLayoutError(f"unreadable topic table {path}: {err}") from err


def read_consumer_offsets(root: Path) -> dict[str, dict[str, dict[int, int]]]:
    """group -> topic -> queue id -> committed offset (the broker persists it periodically)."""
    path = StorePaths(root).consumer_offsets
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if doc.get("version") != 1:
        raise StoreLayoutError(f"{path}: unknown offsets file version {doc.get('version')!r}")
    return {group: {topic: {int(q): int(o) for q, o in queues.items()} for topic, queues in topics.items()}
            for group, topics in doc["offsets"].items()}


def _map_read_only(path: Path) -> np.ndarray | None:
    """The whole file as a read-only uint8 array, or None if it is gone or empty."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        return np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ), np.uint8)
    finally:
        os.close(fd)  # the map keeps its own reference to the file


def _first_slot(entries: np.ndarray, written: bool, start: int) -> int | None:
    """As the broker's ``consume_queue._first_slot``, over a mapped file's entries, read in chunks
    up to the first hit: a queue's file is mostly holes past its end (300,000 entries, 6 MB),
    which a whole scan faulted in, per task, for every queue read."""
    for lo in range(start, len(entries), SCAN_CHUNK_ENTRIES):
        sizes = entries["size"][lo:lo + SCAN_CHUNK_ENTRIES]
        hits = np.flatnonzero(sizes > 0 if written else sizes <= 0)
        if hits.size:
            return lo + int(hits[0])
    return None


class QueueIndex:
    """One consumeQueue, read-only: entries by queue offset, found by arithmetic."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        found = []  # (base byte offset, entries)
        for base_bytes, path in list_files(directory):
            arr = _map_read_only(path)
            if arr is not None and not len(arr) % CQ_UNIT.size:  # an empty file's or a torn size: unusable
                found.append((base_bytes, arr))
        run = found[newest_run([(base, len(arr)) for base, arr in found]):]
        # (first queue offset, entries) of the newest contiguous run, as the broker maps them
        self._files = [(base // CQ_UNIT.size, arr.view(CQ_DTYPE)) for base, arr in run]
        self.min_offset, self.max_offset = queue_bounds(
            [(first, len(entries)) for first, entries in self._files],
            lambda i, written, start: _first_slot(self._files[i][1], written, start))

    def read(self, start: int, count: int) -> np.ndarray:
        """Entries [start, start+count) (CQ_DTYPE), clipped to what the index holds."""
        start = max(start, self.min_offset)
        end = min(start + count, self.max_offset)
        parts = []
        for first, entries in self._files:
            lo, hi = max(start, first), min(end, first + len(entries))
            if lo < hi:
                parts.append(entries[lo - first: hi - first])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, CQ_DTYPE)


def queue_index(root: Path, topic: str, queue_id: int) -> QueueIndex:
    """A queue's index, starting where the broker serves it: per-topic retention may have moved
    the minimum past entries still on disk (``config/min_offsets.json``)."""
    paths = StorePaths(root)
    index = QueueIndex(paths.queue_dir(topic, queue_id))
    saved = load_min_offsets(paths.min_offsets).get((topic, queue_id), 0)
    index.min_offset, index.max_offset = restored_bounds(index.min_offset, index.max_offset, saved)
    return index


def compacted_segment(root: Path, topic: str, queue_id: int) -> Segment | None:
    """A compacted queue's compacted log (the kept records below its compaction point), read-only:
    the newest ``.seg`` file, as the broker opens it (a ``.tmp`` is never read). The broker may
    replace it meanwhile: a file gone under us is looked for again."""
    directory = StorePaths(root).compacted / topic / str(queue_id)
    for _ in range(3):
        try:
            points = sorted((int(p.name[:-len(SEGMENT_SUFFIX)]), p) for p in directory.iterdir()
                            if p.name.endswith(SEGMENT_SUFFIX) and p.name[:-len(SEGMENT_SUFFIX)].isdigit())
        except FileNotFoundError:
            return None
        if not points:
            return None
        try:
            return open_segment(points[-1][1], points[-1][0])
        except FileNotFoundError:
            continue
    return None


class CommitLogFiles:
    """The commitlog's files mapped read-only on first use; all have the same size."""

    def __init__(self, root: Path) -> None:
        self._dir = StorePaths(root).commitlog
        self._maps: dict[int, np.ndarray | None] = {}
        self._paths: dict[int, Path] = {}
        self.file_size_bytes = 0
        self._relist()

    def _relist(self) -> None:
        self._paths = dict(list_files(self._dir))
        if not self.file_size_bytes and self._paths:
            self.file_size_bytes = next(iter(self._paths.values())).stat().st_size

    def file_base(self, phys: np.ndarray) -> np.ndarray:
        """The base offset of the file holding each commitlog offset."""
        if not self.file_size_bytes:
            self._relist()
        return phys - phys % max(self.file_size_bytes, 1)

    def array(self, base: int) -> np.ndarray | None:
        """The file starting at ``base`` as uint8, or None if retention deleted it."""
        if base not in self._maps:
            if base not in self._paths:  # rolled since we listed: look again once
                self._relist()
            path = self._paths.get(base)
            self._maps[base] = _map_read_only(path) if path is not None else None
        return self._maps[base]
