"""Crash recovery of the commitlog as a pure scanner (RocketMQ's recoverAbnormally).

From a record boundary known to be durable, walk forward verifying length, magic and CRC; hand
every good stretch to ``dispatch`` (which rebuilds the consumeQueue entries); stop at the first
bad or torn record, or at never-written zeros, and cut the commitlog there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from gms.broker.commitlog.batch import ParsedRecords, parse_records
from gms.broker.commitlog.commitlog import CommitLog
from gms.record import RecordCheck, check_record, header_errors, scan_records

log = logging.getLogger(__name__)

SCAN_CHUNK_RECORDS = 65_536  # bounds the per-chunk lists and arrays during a scan


def recover(commitlog: CommitLog, start_offset: int,
            dispatch: Callable[[ParsedRecords, np.ndarray], None]) -> int:
    """Scan from ``start_offset``; returns the offset where valid data ends (the commitlog is
    truncated there)."""
    files = commitlog.files
    if not files[0].base_offset <= start_offset < files[-1].end_offset:
        start_offset = files[0].base_offset
    f = commitlog.file_for(start_offset)
    if check_record(f.view, start_offset - f.base_offset, f.size_bytes)[0] is RecordCheck.CORRUPT:
        start_offset = f.base_offset  # the checkpoint does not point at a record: rescan the file
    index = files.index(f)
    pos = start_offset - f.base_offset
    end = start_offset
    while index < len(files):
        f = files[index]
        stop, pos = _scan_file(f, pos, dispatch)
        end = f.base_offset + pos
        if stop is not RecordCheck.BLANK:
            if stop is not RecordCheck.EMPTY:
                log.warning("commitlog %s: %s record at offset %d, truncating", f.path, stop.value, end)
            break
        end = f.end_offset
        index += 1
        pos = 0
    commitlog.truncate(end)
    return end


def _scan_file(f, pos: int, dispatch: Callable[[ParsedRecords, np.ndarray], None]) -> tuple[RecordCheck, int]:
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
        if stop is RecordCheck.OK and len(scan.starts) == SCAN_CHUNK_RECORDS and stop_pos < f.size_bytes:
            pos = stop_pos
            continue
        if stop is RecordCheck.OK:
            stop = check_record(view, stop_pos, f.size_bytes)[0]
        return stop, stop_pos
