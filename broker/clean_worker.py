"""The compaction worker: a child process (:func:`main`, argument: the broker's pid) the
cleaner (:mod:`gms.broker.store.cleaner`) starts at its first compaction and keeps (started
again if it died) to compact queues one after the other. The CPU work of a compaction
(checking CRCs, reading every record's key, choosing the survivors, writing them) runs here,
outside the broker's interpreter and at the lowest CPU and IO priority: the broker's request
loop neither waits for the GIL behind it nor shares a core with it.

For each :class:`Job` it reads on stdin, it writes the survivors to the job's ``tmp`` file at the
job's IO rate, syncs it and prints one JSON line (bytes written, records kept, damaged records
left out). It never renames nor deletes a file: the cleaner installs the tmp (rename, directory sync) and
moves the queue's minimum. Killed at any point, it leaves at most the tmp file, which the
cleaner removes (or opening the store does: a ``.tmp`` is never trusted). It dies with the
thread that started it (``PR_SET_PDEATHSIG``: the cleaner's, or one calling
``MessageStore.compact``), so no worker outlives a killed broker. It lies outside the store
package, whose import would double its start-up time.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np

from gms.private_files import open_private
from gms.record import MAGIC_V1, OFF_QUEUE_ID, check_stored, crc_mismatches
from gms.record.columns import bytes_column, property_columns, read_field_offsets
from gms.record.layout import KAFKA_KEY_PROPERTY, TOMBSTONE_PROPERTY

log = logging.getLogger("gms.broker.clean_worker")

# The worker's command (python -c; argument: the broker's pid). Not -m: the store imports this
# module. Its priority is lowered before the imports of this module, which take most of its start-up.
WORKER_MAIN = ("import sys; from gms.broker.worker_priority import lower_priority; lower_priority(int(sys.argv[1]));"
               " from gms.broker.clean_worker import main; main()")

CHUNK_RECORDS = 4096  # records whose keys are read at a time (the IO budget spent between)
_ARRAYS = ("seg_starts", "seg_sizes", "phys", "sizes", "offsets")
_HEAD_STRUCT = struct.Struct(">iI")  # as broker/store/damage.py repairs a header
_ENVELOPE_HEAD_STRUCT = struct.Struct(">iqq")


class IoBudget:
    """Sleeps so that the bytes spent stay under ``rate`` a second."""

    def __init__(self, rate: int) -> None:
        self._rate = rate
        self._start, self._spent = time.monotonic(), 0

    def spend(self, nbytes: int) -> None:
        self._spent += nbytes
        ahead = self._spent / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)
        if time.monotonic() - self._start > 1.0:  # a fresh window: idle time does not bank a burst
            self._start, self._spent = time.monotonic(), 0


@dataclass(frozen=True)
class Job:
    """One queue's compaction: the compacted log's records (``segment``, ``seg_starts``,
    ``seg_sizes``), then the commitlog's below the point (``phys``, ``sizes``, ``offsets``; in
    the files ``runs``: path, base offset and the slice of the records lying in it)."""

    queue_id: int
    tmp: str
    segment: str | None
    runs: list[tuple[str, int, int, int]]
    tombstones_before: int  # tombstones stored before this go
    expired_before: int  # records stored before this go (compact,delete)
    io_bytes_per_s: int
    seg_starts: np.ndarray
    seg_sizes: np.ndarray
    phys: np.ndarray
    sizes: np.ndarray
    offsets: np.ndarray

    def encode(self) -> bytes:
        """A JSON line of the scalars, then the int64 arrays back to back."""
        head = {name: value for name, value in self.__dict__.items() if name not in _ARRAYS}
        head["counts"] = [len(getattr(self, name)) for name in _ARRAYS]
        arrays = b"".join(np.ascontiguousarray(getattr(self, name), np.int64).tobytes() for name in _ARRAYS)
        return json.dumps(head).encode() + b"\n" + arrays

    @classmethod
    def decode(cls, stream: IO[bytes]) -> Job | None:
        """The next job on ``stream`` (None: it ended)."""
        line = stream.readline()
        if not line:
            return None
        head = json.loads(line)
        counts = head.pop("counts")
        for name, n in zip(_ARRAYS, counts, strict=True):
            head[name] = np.frombuffer(stream.read(8 * n), np.int64)
        head["runs"] = [tuple(run) for run in head["runs"]]
        return cls(**head)


class Candidates(NamedTuple):
    """Records a pass looks at, in queue offset order: where their bytes are and what decides."""

    bufs: list[memoryview]  # a view per record source (the segment, commitlog files)
    source: np.ndarray  # per record, its buffer in ``bufs``
    starts: np.ndarray
    sizes: np.ndarray
    latest: np.ndarray  # bool: the record is its key's latest (or has no key)
    tombstone: np.ndarray  # bool
    store_ts: np.ndarray


def record_keys(buf: memoryview, starts: np.ndarray) -> tuple[list[bytes | None], np.ndarray, np.ndarray]:
    """The compaction key of each record at ``starts`` (the first of its keys: the SDK's ``key=``
    or a Kafka record's key; else a key kept whole as a property; else None: never compacted
    away), whether it is a tombstone, and its store time."""
    fields = read_field_offsets(buf, starts)
    keys = bytes_column(buf, fields.keys_at, fields.headers["keys_len"])
    props = property_columns(buf, fields, (KAFKA_KEY_PROPERTY, TOMBSTONE_PROPERTY))
    found: list[bytes | None] = [
        key.split(b" ", 1)[0] if key else None if kafka is None else b"\x00" + kafka.encode()
        for key, kafka in zip(keys, props[KAFKA_KEY_PROPERTY].tolist(), strict=True)]
    return found, props[TOMBSTONE_PROPERTY] != None, fields.headers["store_ts_ms"].astype(np.int64)  # noqa: E711


def survivors(candidates: Candidates, tombstones_before: int, expired_before: int) -> np.ndarray:
    """Indexes of the candidates a compaction keeps: the latest of each key (and every record
    without one), minus tombstones stored before ``tombstones_before`` and records stored before
    ``expired_before``."""
    keep = candidates.latest & ~(candidates.tombstone & (candidates.store_ts < tombstones_before))
    return np.flatnonzero(keep & (candidates.store_ts >= expired_before))


def map_file(path: str) -> memoryview:
    """The file mapped privately (copy on write: a header repaired here stays here)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        return memoryview(mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)) if size else memoryview(b"")


def sources(job: Job) -> tuple[list[memoryview], list[tuple[int, np.ndarray, np.ndarray]], int]:
    """The record sources (views) and, per source, the candidates' starts and sizes in it, the
    damaged ones left out (CRC; a record lost by recovery): (views, parts, damaged count)."""
    bufs: list[memoryview] = []
    parts: list[tuple[int, np.ndarray, np.ndarray]] = []
    damaged = 0
    if job.segment is not None and len(job.seg_starts):
        bufs.append(map_file(job.segment))
        bad = crc_mismatches(bufs[0], job.seg_starts, job.seg_sizes)
        keep = np.ones(len(job.seg_starts), bool)
        keep[bad] = False
        damaged += bad.size
        parts.append((0, job.seg_starts[keep], job.seg_sizes[keep]))
    for path, base, lo, hi in job.runs:
        view = map_file(path)
        starts, sizes, offsets = job.phys[lo:hi] - base, job.sizes[lo:hi], job.offsets[lo:hi]
        check = check_stored(view, starts, sizes, base, job.queue_id, offsets)
        for i in check.misplaced.tolist():  # the CRC holds, the header outside it not: as the index says
            _HEAD_STRUCT.pack_into(view, int(starts[i]), int(sizes[i]), MAGIC_V1)
            _ENVELOPE_HEAD_STRUCT.pack_into(view, int(starts[i]) + OFF_QUEUE_ID, job.queue_id, int(offsets[i]),
                                            int(starts[i]) + base)
        keep = np.ones(hi - lo, bool)
        keep[check.damaged] = False
        damaged += check.damaged.size
        bufs.append(view)
        parts.append((len(bufs) - 1, starts[keep], sizes[keep]))
    if damaged:
        log.error("queue %d: %d damaged record(s) left out of compaction", job.queue_id, damaged)
    return bufs, parts, damaged


def decide(bufs: list[memoryview], parts: list[tuple[int, np.ndarray, np.ndarray]], budget: IoBudget) -> Candidates:
    """The keys of every candidate and which is its key's latest."""
    last: dict[bytes | None, int] = {}  # key -> its latest candidate
    tombstones, times, keyless, source, starts, sizes = [], [], [], [], [], []
    count = 0
    for index, part_starts, part_sizes in parts:
        for lo in range(0, len(part_starts), CHUNK_RECORDS):  # the IO spread over the pass
            budget.spend(int(part_sizes[lo:lo + CHUNK_RECORDS].sum()))
            keys, tombstone, store_ts = record_keys(bufs[index], part_starts[lo:lo + CHUNK_RECORDS])
            last.update(zip(keys, range(count, count + len(keys)), strict=True))
            count += len(keys)
            tombstones.append(tombstone)
            times.append(store_ts)
            keyless.append(np.fromiter((key is None for key in keys), bool, len(keys)))
        source.append(np.full(len(part_starts), index, np.int64))
        starts.append(part_starts)
        sizes.append(part_sizes)

    def joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(arrays) if arrays else np.empty(0, dtype)
    latest = joined(keyless, bool)  # a record without a key always stays
    last.pop(None, None)
    latest[np.fromiter(last.values(), np.int64, len(last))] = True
    return Candidates(bufs, joined(source, np.int64), joined(starts, np.int64), joined(sizes, np.int64),
                      latest, joined(tombstones, bool), joined(times, np.int64))


def write(tmp: str, candidates: Candidates, kept: np.ndarray, budget: IoBudget) -> int:
    """The survivors to ``tmp``, synced; the bytes written."""
    source, starts, sizes = candidates.source[kept], candidates.starts[kept], candidates.sizes[kept]
    # records back to back in one source are written as one run
    breaks = np.flatnonzero((source[1:] != source[:-1]) | (starts[1:] != starts[:-1] + sizes[:-1])) + 1
    firsts = np.concatenate(([0], breaks)).astype(np.int64) if len(kept) else np.empty(0, np.int64)
    ends = np.concatenate((breaks, [len(kept)])).astype(np.int64) if len(kept) else firsts
    with os.fdopen(open_private(Path(tmp), os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        for first, end in zip(firsts.tolist(), ends.tolist(), strict=True):
            buf, begin = candidates.bufs[int(source[first])], int(starts[first])
            size = int(starts[end - 1] + sizes[end - 1]) - begin
            fh.write(buf[begin:begin + size])
            budget.spend(size)
        fh.flush()
        os.fsync(fh.fileno())
    return int(sizes.sum())


def compact(job: Job) -> dict[str, int]:
    budget = IoBudget(job.io_bytes_per_s)
    bufs, parts, damaged = sources(job)
    candidates = decide(bufs, parts, budget)
    kept = survivors(candidates, job.tombstones_before, job.expired_before)
    return {"written": write(job.tmp, candidates, kept, budget), "kept": len(kept), "damaged": damaged}


def main() -> None:
    """The worker, its priority lowered (:data:`WORKER_MAIN`): jobs on stdin, one after the
    other, each one's outcome on stdout; it ends with its stdin (a job that fails ends it, the
    traceback logged)."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    while (job := Job.decode(sys.stdin.buffer)) is not None:
        print(json.dumps(compact(job)), flush=True)

