"""Checks of many records at once, in C (gms.record._recordcheck): the record walk of the append,
recovery and consumer paths, the serve-side CRC and envelope check, zero-copy views."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gms.naming import TOPIC_NAME_BYTES_MAX
from gms.record import _recordcheck
from gms.record.codec import check_record
from gms.record.layout import (
    FLAG_SEQUENCED,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAGIC_V1,
    OFF_CRC,
    OFF_CRC_START,
    OFF_MAGIC,
    OFF_PHYS_OFFSET,
    OFF_QUEUE_ID,
    OFF_QUEUE_OFFSET,
    OFFSETS,
    PROPS_BYTES_MAX,
    RecordCheck,
)

_LAYOUT = (OFF_MAGIC, OFF_CRC, OFF_QUEUE_ID, OFF_QUEUE_OFFSET, OFF_PHYS_OFFSET, OFF_CRC_START, OFFSETS["body_len"],
           OFFSETS["topic_len"], OFFSETS["keys_len"], OFFSETS["flags"], OFFSETS["props_len"], HEADER_SIZE, MAGIC_V1,
           FLAG_SEQUENCED, PROPS_BYTES_MAX)
assert _recordcheck.LAYOUT == _LAYOUT, "gms.record._recordcheck was built for another record layout"
# read_headers takes the u8 and u16 lengths that follow topic_len as they are laid out here.
assert [OFFSETS[f] - OFFSETS["topic_len"] for f in ("tag_len", "born_host_len", "reserved", "keys_len", "props_len")
        ] == [1, 2, 3, 4, 6] and OFFSETS["keys_len"] == OFFSETS["topic_len"] + 4


class ScanResult(NamedTuple):
    starts: np.ndarray  # int64 positions of consecutive records whose length, magic and CRC are good
    stop_pos: int  # where the scan stopped
    stop: RecordCheck  # why: OK = max_records reached or end of buffer; otherwise what is at stop_pos


def scan_records(buf: bytes | memoryview, pos: int = 0, end: int | None = None,
                 max_records: int = 1 << 62, *, verify_crc: bool = True) -> ScanResult:
    """Walk records from ``pos`` checking length, magic and CRC: the record walk of the append and
    recovery paths and of a consumer's check, in C (one call, the GIL released).

    Stops at the first position that is not a valid record, at ``end`` or after ``max_records``.
    """
    mv = memoryview(buf)
    end = len(mv) if end is None else end
    raw_starts, pos, crc_failed = _recordcheck.walk(mv, pos, end, max_records, verify_crc)
    starts = np.frombuffer(raw_starts, np.int64)
    if crc_failed:
        return ScanResult(starts, pos, RecordCheck.CORRUPT)
    stop = RecordCheck.OK
    if pos < end and len(starts) < max_records:
        stop = check_record(mv, pos, end)[0]
    return ScanResult(starts, pos, stop)


class BatchHeaders(NamedTuple):
    """The headers of a batch's records and what checking the batch needs of them (:func:`batch_headers`)."""

    headers: np.ndarray  # HEADER_DTYPE, one per record (writable)
    first_bad: int  # the first record whose header is inconsistent, -1 if none
    same_topic: bool  # every record carries the first one's topic bytes
    same_tag: bool  # ... and its tag bytes
    body_max: int


def batch_headers(buf: bytes | memoryview, starts: np.ndarray) -> BatchHeaders:
    """The headers of the records at ``starts`` of ``buf``, each checked as :func:`header_errors`
    checks it and to lie inside ``buf`` (not the CRC), in one C pass that also tells whether the
    records share one topic and one tag (as a producer's batch does) and their body lengths'
    range: what numpy took a dozen calls over gathered copies for."""
    raw, first_bad, same_topic, same_tag, body_max = _recordcheck.read_headers(
        buf, np.ascontiguousarray(starts, np.int64), TOPIC_NAME_BYTES_MAX)
    return BatchHeaders(np.frombuffer(raw, HEADER_DTYPE), first_bad, same_topic, same_tag, body_max)


def crc_mismatches(buf: bytes | memoryview | np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indexes of the records at ``starts`` (of ``sizes`` bytes) in ``buf`` whose CRC fails, in
    one C call (see :func:`check_stored`, which also checks the fields outside the CRC)."""
    return np.array(_recordcheck.crc_mismatches(buf, np.ascontiguousarray(starts, np.int64),
                                                np.ascontiguousarray(sizes, np.int64)), np.intp)


class StoredCheck(NamedTuple):
    damaged: np.ndarray  # indexes of records whose CRC fails, or of lost entries
    misplaced: np.ndarray  # indexes of intact records whose length, magic or envelope disagree with their entries


def check_stored(buf: bytes | memoryview, starts: np.ndarray, sizes: np.ndarray, base_offset: int,
                 queue_id: int | np.ndarray, queue_offsets: np.ndarray) -> StoredCheck:
    """Check records of one queue at ``starts`` of ``buf`` (a commitlog file at ``base_offset``)
    against their index entries (``sizes``, ``queue_offsets``): the CRC, and the fields outside it.
    ``queue_id``: their queue's, or an array of each record's (records of many queues).
    Entries below a header's size are lost ones (nothing is read). One C call for all of them: a
    Python call per record costs more than the CRC of 100 bytes."""
    damaged, misplaced = _recordcheck.check_stored(
        buf, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64), base_offset,
        queue_id if isinstance(queue_id, int) else np.ascontiguousarray(queue_id, np.int64),
        np.ascontiguousarray(queue_offsets, np.int64))
    return StoredCheck(np.array(damaged, np.intp), np.array(misplaced, np.intp))


def record_views(view: memoryview, starts: np.ndarray, sizes: np.ndarray) -> list[memoryview]:
    """``view[s:s + n]`` for every start and size: zero-copy records, sliced in C."""
    return _recordcheck.slices(view, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64))

