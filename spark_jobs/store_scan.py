"""Reading a store's files: plan queue ranges on the driver, turn each range into Arrow batches.

The index decides what is read: entries are filtered by tag hash before the commitlog is
touched, and the time bounds become offset bounds by binary search on the store timestamps
(they never decrease within a store), so neither costs a body read.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from gms.address import split_address
from gms.broker.store.compacted import Segment
from gms.msgid import encode_msg_id
from gms.record import OFF_PHYS_OFFSET, OFF_STORE_TS
from gms.record.layout import HIDDEN_TAG_HASH
from gms.spark_jobs.arrow_batches import check_records, to_batch
from gms.spark_jobs.options import BATCH_BYTES_MAX, EARLIEST, LATEST, OptionError, ReadOptions, resolve_offset
from gms.spark_jobs.partitions import BadRecordSink, QueueRange, QueueSpan, after_index_filters
from gms.spark_jobs.store_files import (
    CommitLogFiles,
    QueueIndex,
    compacted_segment,
    queue_index,
    read_topics,
    store_root,
)

_STORE_TS = struct.Struct(">q")
_MSG_ID_OFFSET_HEX_DIGITS = 16


def msg_id_prefix(broker_address: str | None) -> bytes | None:
    """The hex part of every msg_id naming ``host:port`` (gms.msgid), or None without one."""
    if broker_address is None:
        return None
    try:
        host, port = split_address(broker_address, "brokerAddress")
    except ValueError as err:
        raise OptionError(str(err)) from err
    return encode_msg_id(host, port, 0)[:-_MSG_ID_OFFSET_HEX_DIGITS].encode()


def selected_topics(available: dict[str, int], wanted: tuple[str, ...] | None) -> dict[str, int]:
    if wanted is None:
        return dict(sorted(available.items()))
    missing = [t for t in wanted if t not in available]
    if missing:
        raise OptionError(f"topics {missing} do not exist (known: {sorted(available)})")
    return {t: available[t] for t in wanted}


def _offset_for_time(index: QueueIndex, commitlog: CommitLogFiles, ts_ms: int, lo: int, hi: int) -> int:
    """The first offset in [lo, hi) stored at or after ``ts_ms`` (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        phys = int(index.read(mid, 1)["phys"][0])
        base = int(commitlog.file_base(np.array([phys]))[0])
        arr = commitlog.array(base)
        if arr is None:  # expired under us: everything before it is gone too
            lo = mid + 1
            continue
        if _STORE_TS.unpack_from(arr.data, phys - base + OFF_STORE_TS)[0] < ts_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def queue_bounds(root: Path, topic: str, queue_id: int, options: ReadOptions,
                 commitlog: CommitLogFiles) -> tuple[int, int]:
    """The offsets [start, end) of one queue the options select (start == end: nothing)."""
    index = queue_index(root, topic, queue_id)
    low, high = index.min_offset, index.max_offset
    segment = compacted_segment(root, topic, queue_id)
    if segment is not None and len(segment.offsets):  # a compacted queue starts at its first kept record
        low = min(low, int(segment.offsets[0]))
    start = resolve_offset(options.starting_offsets, topic, queue_id, low, high, EARLIEST)
    end = resolve_offset(options.ending_offsets, topic, queue_id, low, high, LATEST)
    if start < end and options.start_time_ms is not None:
        start = _offset_for_time(index, commitlog, options.start_time_ms, start, end)
    if start < end and options.end_time_ms is not None:
        end = _offset_for_time(index, commitlog, options.end_time_ms, start, end)
    return start, max(start, end)


def _store_dir(options: ReadOptions) -> str:
    if options.path is None:
        raise OptionError("load(STORE_DIR) a store, or set the brokers or nameserver option")
    return options.path


def store_spans(options: ReadOptions) -> list[QueueSpan]:
    """The selected offsets of every queue of the selected topics."""
    root = store_root(_store_dir(options))
    commitlog = CommitLogFiles(root)
    return [QueueSpan(topic, queue_id, *queue_bounds(root, topic, queue_id, options, commitlog), None)
            for topic, count in selected_topics(read_topics(root), options.topics).items()
            for queue_id in range(count)]


def _byte_bounded(sizes: np.ndarray) -> int:
    """How many leading entries fit in one batch of BATCH_BYTES_MAX (at least one)."""
    return max(int(np.searchsorted(np.cumsum(sizes.astype(np.int64)), BATCH_BYTES_MAX, side="right")), 1)


@lru_cache(maxsize=1)
def _task_commitlog(root: Path) -> CommitLogFiles:
    """The commitlog maps shared by the tasks a Python worker runs one after another: the queues
    of a store interleave in the same files, so a fresh map per task would fault in the same
    pages again (one fault every few records of a queue)."""
    return CommitLogFiles(root)


def read_store_range(rng: QueueRange, options: ReadOptions, schema: pa.Schema,
                     report_bad: BadRecordSink) -> Iterator[pa.RecordBatch]:
    root = store_root(_store_dir(options))
    index = queue_index(root, rng.topic, rng.queue_id)
    commitlog = _task_commitlog(root)
    prefix = msg_id_prefix(options.broker_address)
    hashes = options.tags.hashes
    wanted = np.array(sorted(hashes), np.int64) if hashes is not None else None
    pos = rng.start
    segment = compacted_segment(root, rng.topic, rng.queue_id)
    if segment is not None and pos < segment.point:  # below the compaction point: the compacted log's records
        yield from _compacted_batches(segment, rng, options, schema, report_bad, prefix)
        pos = segment.point
    pos = max(pos, index.min_offset)  # retention may have moved the minimum since planning
    while pos < rng.end:
        entries = index.read(pos, min(options.batch_records, rng.end - pos))
        if not len(entries):
            return
        entries = entries[:_byte_bounded(entries["size"])]
        offsets = np.arange(pos, pos + len(entries), dtype=np.int64)
        pos += len(entries)
        if wanted is not None:
            hit = np.isin(entries["tag_hash"], wanted)
            entries, offsets = entries[hit], offsets[hit]
        else:  # scheduled messages not yet delivered (their delivered copies are read instead)
            visible = entries["tag_hash"] != HIDDEN_TAG_HASH
            if not visible.all():
                entries, offsets = entries[visible], offsets[visible]
        phys = entries["phys"].astype(np.int64)
        sizes = entries["size"].astype(np.int64)
        bases = commitlog.file_base(phys)
        cuts = [0, *(np.flatnonzero(np.diff(bases)) + 1).tolist(), len(bases)]
        for lo, hi in itertools.pairwise(cuts):
            if lo == hi:
                continue
            base = int(bases[lo])
            arr = commitlog.array(base)
            if arr is None:
                continue  # deleted by retention while we read: those records are gone, not corrupt
            records, bad = check_records(arr, phys[lo:hi] - base, sizes[lo:hi], offsets[lo:hi], phys[lo:hi])
            report_bad(rng.topic, rng.queue_id, offsets[lo:hi][bad], phys[lo:hi][bad])
            records = after_index_filters(records, options)
            if len(records.starts):
                yield to_batch(records, schema, prefix)


def _compacted_batches(segment: Segment, rng: QueueRange, options: ReadOptions, schema: pa.Schema,
                       report_bad: BadRecordSink, prefix: bytes | None) -> Iterator[pa.RecordBatch]:
    """The compacted log's records in [rng.start, min(rng.end, its point)), as the index's are."""
    lo, hi = np.searchsorted(segment.offsets, [rng.start, min(rng.end, segment.point)])
    hashes = options.tags.hashes
    arr = np.frombuffer(segment.view, np.uint8) if len(segment.view) else np.empty(0, np.uint8)
    while lo < hi:
        take = min(options.batch_records, int(hi - lo))
        take = _byte_bounded(segment.sizes[lo:lo + take])
        picked = np.arange(lo, lo + take)
        lo += take
        if hashes is not None:
            picked = picked[np.isin(segment.tag_hashes[picked], np.array(sorted(hashes), np.int64))]
        offsets = segment.offsets[picked]
        records, bad = check_records(arr, segment.starts[picked], segment.sizes[picked], offsets)
        if bad.any():  # their message ids, as the commitlog's bad records are named
            at = segment.starts[picked][bad] + OFF_PHYS_OFFSET
            report_bad(rng.topic, rng.queue_id, offsets[bad],
                       np.array([int.from_bytes(arr[a:a + 8].tobytes(), "big", signed=True) for a in at.tolist()]))
        records = after_index_filters(records, options)
        if len(records.starts):
            yield to_batch(records, schema, prefix)
