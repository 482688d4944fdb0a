"""Where stored records lie: the commitlog files a queue's records are in, and zero-copy views."""

from __future__ import annotations

import itertools
import struct

import numpy as np

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.mapped_file import MappedFile
from gms.record import OFF_STORE_TS, _recordcheck, record_views
from gms.store_errors import MessageNotFound

FileRuns = list[tuple[MappedFile, int, int]]
# A read far behind the writer maps its stretch of the commitlog at once only if the stretch is at
# most this many times the bytes it serves (see StoreReads.get).
POPULATE_SPAN_FACTOR_MAX = 4
# Records lying apart in runs of this size or less on average are served as one copy of them.
COPY_RUN_BYTES_MAX = 16 << 10
_STORE_TS = struct.Struct(">q")


def file_runs(commitlog: CommitLog, phys: np.ndarray) -> FileRuns:
    """The commitlog files the records at ``phys`` lie in: (file, lo, hi) for each run of
    records ``phys[lo:hi]`` in one file (one run unless the records cross a file end)."""
    files = commitlog.files
    base0, fsize = files[0].base_offset, commitlog.file_size_bytes
    if int(phys[0]) < base0:
        raise MessageNotFound(int(phys[0]), "expired")
    # A lost entry may point at the end of the last file (nothing is read for it).
    file_idx = np.minimum((phys - base0) // fsize, len(files) - 1)
    if file_idx[0] == file_idx[-1]:
        return [(files[int(file_idx[0])], 0, len(phys))]
    cuts = [0, *(np.flatnonzero(np.diff(file_idx)) + 1).tolist(), len(phys)]
    return [(files[int(file_idx[lo])], lo, hi) for lo, hi in itertools.pairwise(cuts)]


def views(runs: FileRuns, phys: np.ndarray, sizes: np.ndarray) -> list[memoryview]:
    """Zero-copy views of the records at ``phys`` (in the file ``runs``)."""
    if len(runs) == 1:
        f = runs[0][0]
        return record_views(f.view, phys - f.base_offset, sizes)
    found: list[memoryview] = []
    for f, lo, hi in runs:
        found += record_views(f.view, phys[lo:hi] - f.base_offset, sizes[lo:hi])
    return found


def run_views(runs: FileRuns, phys: np.ndarray, sizes: np.ndarray) -> list[memoryview]:
    """:func:`views` of coalesced runs, or, where they are many and small (a queue of one of many
    topics, its records among the others'), one copy of them back to back: an object and a write
    buffer per record cost more than copying it (the same bytes either way)."""
    total = int(sizes.sum())
    if len(phys) < 2 or total >= COPY_RUN_BYTES_MAX * len(phys):
        return views(runs, phys, sizes)
    into = np.empty(total, np.uint8)  # not zeroed first: every byte is copied to
    at = np.cumsum(sizes) - sizes
    for f, lo, hi in runs:
        _recordcheck.gather(f.view, phys[lo:hi] - f.base_offset, sizes[lo:hi], into, at[lo:hi])
    return [into.data]


def coalesce(phys: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge records that lie back to back in the commitlog into (start, size) runs.
    A run never crosses a commitlog file: every file ends with a blank marker."""
    ends = phys + sizes
    breaks = np.flatnonzero(phys[1:] != ends[:-1]) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks, [len(phys)])) - 1
    return phys[firsts], ends[lasts] - phys[firsts]


def store_ts(commitlog: CommitLog, cq: ConsumeQueue, offset: int) -> int:
    """The store time of the record at a queue offset."""
    view = commitlog.read(int(cq.read(offset, 1)["phys"][0]), OFF_STORE_TS + _STORE_TS.size)
    return _STORE_TS.unpack_from(view, OFF_STORE_TS)[0]


def first_stored_at(commitlog: CommitLog, cq: ConsumeQueue, lo: int, hi: int, ts_ms: int) -> int:
    """Binary search of [lo, hi) by store time (never decreasing along a queue)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if store_ts(commitlog, cq, mid) < ts_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo
