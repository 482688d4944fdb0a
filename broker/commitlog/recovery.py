"""Crash recovery of the commitlog as a pure scanner (RocketMQ's recoverAbnormally).

From a record boundary known to be durable, walk forward verifying length, magic and CRC and
hand every good stretch to ``dispatch`` (which rebuilds the consumeQueue entries).

A record whose CRC fails but whose framing is intact (length and magic sane, and a valid record
or the file's blank marker follows it, possibly after more such records) is *damaged*: it costs
that record alone. It is logged, counted and still indexed when its envelope and topic are
readable (it keeps its queue offset, so no offset is ever reused; the serve path checks CRCs and
answers it as damaged, never as data). Only a torn tail -- framing unreadable, or nothing valid
after it -- is cut off.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gms.broker.commitlog.batch import ParsedRecords, parse_records
from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.mapped_file import MappedFile
from gms.record import (
    BLANK_MARKER_SIZE,
    HEADER_SIZE,
    MAGIC_V1,
    OFF_PHYS_OFFSET,
    RecordCheck,
    check_record,
    header_errors,
    scan_records,
)
from gms.store_errors import CorruptRecord, InvalidTopicName

log = logging.getLogger(__name__)

SCAN_CHUNK_RECORDS = 65_536  # bounds the per-chunk lists and arrays during a scan
_SIZE_MAGIC = struct.Struct(">iI")
_PHYS = struct.Struct(">q")

Dispatch = Callable[[ParsedRecords, np.ndarray], None]


class Recovered(NamedTuple):
    end: int  # where valid data ends (the commitlog is truncated there)
    damaged: list[int]  # commitlog offsets of damaged records (CRC mismatch, framing intact)


def recover(commitlog: CommitLog, start_offset: int, dispatch: Dispatch) -> Recovered:
    """Scan from ``start_offset``, rebuild the index through ``dispatch`` and cut the torn tail."""
    files = commitlog.files
    if not files[0].base_offset <= start_offset < files[-1].end_offset:
        start_offset = files[0].base_offset
    f = commitlog.file_for(start_offset)
    pos = start_offset - f.base_offset
    if (check_record(f.view, pos, f.size_bytes)[0] is RecordCheck.CORRUPT
            and not damaged_size(f.view, pos, f.size_bytes)):
        start_offset = f.base_offset  # the checkpoint does not point at a record: rescan the file
    index = files.index(f)
    pos = start_offset - f.base_offset
    end = start_offset
    damaged: list[int] = []
    while index < len(files):
        f = files[index]
        stop, pos = _scan_file(f, pos, dispatch, damaged)
        end = f.base_offset + pos
        if stop is not RecordCheck.BLANK:
            if stop is not RecordCheck.EMPTY:
                log.warning("commitlog %s: %s record at offset %d, truncating", f.path, stop.value, end)
            break
        end = f.end_offset
        index += 1
        pos = 0
    commitlog.truncate(end)
    return Recovered(end, damaged)


def _scan_file(f: MappedFile, pos: int, dispatch: Dispatch, damaged: list[int]) -> tuple[RecordCheck, int]:
    view, arr = f.view, f.array
    while True:
        scan = scan_records(view, pos, f.size_bytes, SCAN_CHUNK_RECORDS)
        stop, stop_pos = scan.stop, scan.stop_pos
        if scan.starts:
            parsed = parse_records(arr, scan.starts)
            bad = np.flatnonzero(header_errors(parsed.headers))
            if bad.size:  # CRC-valid but inconsistent: never stored by us; cut before it
                cut = int(bad[0])
                parsed = ParsedRecords(parsed.starts[:cut], parsed.headers[:cut], parsed.topics,
                                       parsed.topic_index[:cut])
                stop, stop_pos = RecordCheck.CORRUPT, int(scan.starts[cut])
            if len(parsed.starts):
                dispatch(parsed, parsed.starts + f.base_offset)
            if bad.size:
                return stop, stop_pos
        if stop is RecordCheck.CORRUPT:
            size = damaged_size(view, stop_pos, f.size_bytes)
            if size:
                _dispatch_damaged(f, stop_pos, dispatch)
                damaged.append(f.base_offset + stop_pos)
                pos = stop_pos + size
                continue
        if stop is RecordCheck.OK and len(scan.starts) == SCAN_CHUNK_RECORDS and stop_pos < f.size_bytes:
            pos = stop_pos
            continue
        if stop is RecordCheck.OK:
            stop = check_record(view, stop_pos, f.size_bytes)[0]
        return stop, stop_pos


def _framed_size(view: memoryview, pos: int, end: int) -> int:
    """The size of the record framed at ``pos`` (sane length and magic), 0 if none is."""
    if end - pos < BLANK_MARKER_SIZE:
        return 0
    size, magic = _SIZE_MAGIC.unpack_from(view, pos)
    return size if magic == MAGIC_V1 and HEADER_SIZE <= size <= end - pos else 0


def damaged_size(view: memoryview, pos: int, end: int) -> int:
    """The size of the record at ``pos`` if it is damaged rather than a torn tail: its framing
    is intact and, past it and any more framed-but-bad records, a valid record or the blank
    end-of-file marker follows. 0 if what lies at ``pos`` is a torn tail."""
    size = _framed_size(view, pos, end)
    after = pos + size
    while size:
        check = check_record(view, after, end)[0]
        if check in (RecordCheck.OK, RecordCheck.BLANK):
            return size
        if check is not RecordCheck.CORRUPT:
            return 0  # zeros or a short record after it: the tail was torn
        step = _framed_size(view, after, end)
        if not step:
            return 0
        after += step
    return 0


def _dispatch_damaged(f: MappedFile, pos: int, dispatch: Dispatch) -> None:
    """Index a damaged record at the queue offset it carries, if its envelope (which must name
    its own position) and its topic are readable; log it either way."""
    phys = f.base_offset + pos
    parsed = None
    if _PHYS.unpack_from(f.view, pos + OFF_PHYS_OFFSET)[0] == phys:
        try:
            parsed = parse_records(f.array, [pos])
        except (CorruptRecord, InvalidTopicName):
            parsed = None
    if parsed is None or header_errors(parsed.headers)[0]:
        log.error("commitlog %s: damaged record at offset %d (CRC mismatch, header unreadable); "
                  "not indexed", f.path, phys)
        return
    header = parsed.headers[0]
    log.error("commitlog %s: damaged record at offset %d (CRC mismatch): %s/%d offset %d is kept "
              "as damaged and never served as data", f.path, phys, parsed.topics[0],
              int(header["queue_id"]), int(header["queue_offset"]))
    dispatch(parsed, parsed.starts + f.base_offset)
