"""Crash recovery of the commitlog as a pure scanner (RocketMQ's recoverAbnormally, made to keep
what is intact).

From a record boundary known to be durable, walk forward verifying length, magic, CRC and the
broker envelope, and hand every good stretch to ``dispatch`` (which rebuilds the consumeQueue
entries).

The envelope (queue id, queue offset, commitlog offset, store time) lies outside the CRC and is
patched by the broker after the producer's bytes are copied, so a record is *complete* only when
its envelope names its own commitlog offset and a store time. An *anchor* is a complete record
(or a file's blank end marker, which names its own length): nothing but a finished append leaves
one, since producers must send a zero envelope and a failed append is zeroed.

Whatever is broken -- a CRC that fails, a length or magic that does not frame a record, an
envelope that is not complete -- is damage *if an anchor follows it*: it costs the bytes up to
the anchor alone. The first damaged record is still indexed when its envelope is readable (it
keeps its queue offset, so no offset is ever reused; the serve path checks CRCs and answers it as
damaged, never as data); a CRC-valid record whose envelope alone is off is repaired in place.
With no anchor after it, the breakage is the torn tail of an append that never finished (or was
never acknowledged) and is cut off.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.mapped_file import MappedFile
from gms.record import (
    BLANK_MAGIC,
    BLANK_MARKER_SIZE,
    HEADER_SIZE,
    MAGIC_V1,
    OFF_PHYS_OFFSET,
    OFF_STORE_TS,
    RecordCheck,
    check_record,
    header_errors,
    scan_records,
)
from gms.record.batch import ParsedRecords, parse_records
from gms.store_errors import CorruptRecord, InvalidTopicName

log = logging.getLogger(__name__)

SCAN_CHUNK_RECORDS = 65_536  # bounds the per-chunk lists and arrays during a scan
SEARCH_CHUNK_BYTES = 4 << 20  # the anchor search copies the file this much at a time
ZERO_STRETCH_MAX_BYTES = 1 << 20  # zeros longer than this, records after them: not damage but the end
_SIZE_MAGIC = struct.Struct(">iI")
_I64 = struct.Struct(">q")
_MAGICS = (struct.pack(">I", MAGIC_V1), struct.pack(">I", BLANK_MAGIC))

Dispatch = Callable[[ParsedRecords, np.ndarray], None]


class Recovered(NamedTuple):
    end: int  # where valid data ends (the commitlog is truncated there)
    damaged: list[int]  # commitlog offsets of damaged stretches (each costs one record or more)


class _Anchor(NamedTuple):
    file_index: int  # of the file in the commitlog's list
    pos: int  # in that file


def envelope_errors(headers: np.ndarray, phys: np.ndarray) -> np.ndarray:
    """Boolean mask of records (at commitlog offsets ``phys``) whose envelope was never completed
    by the broker, or was damaged since."""
    return (headers["phys_offset"] != phys) | (headers["store_ts_ms"] <= 0)


def recover(commitlog: CommitLog, start_offset: int, dispatch: Dispatch) -> Recovered:
    """Scan from ``start_offset``, rebuild the index through ``dispatch`` and cut the torn tail."""
    files = commitlog.files
    if not files[0].base_offset <= start_offset < files[-1].end_offset:
        start_offset = files[0].base_offset
    f = commitlog.file_for(start_offset)
    pos = start_offset - f.base_offset
    if (check_record(f.view, pos, f.size_bytes)[0] in (RecordCheck.CORRUPT, RecordCheck.TRUNCATED)
            and not _claims_offset(f, pos)):
        start_offset = f.base_offset  # the checkpoint does not point at a record: rescan the file
    scanner = _Scanner(files, dispatch)
    end = scanner.run(files.index(f), start_offset - f.base_offset)
    commitlog.truncate(end)
    return Recovered(end, scanner.damaged)


class _Scanner:
    def __init__(self, files: list[MappedFile], dispatch: Dispatch) -> None:
        self.files = files
        self.dispatch = dispatch
        self.damaged: list[int] = []
        self.last_store_ts_ms = 0  # of the last good record dispatched: what a repair falls back on
        self._repaired_at = -1

    def run(self, index: int, pos: int) -> int:
        """Scan from file ``index`` at ``pos`` to the end of the data; returns that end."""
        while True:
            f = self.files[index]
            stop, pos = self._scan_file(f, pos)
            if stop is RecordCheck.BLANK:
                if index + 1 == len(self.files):
                    return f.end_offset
                index, pos = index + 1, 0
                continue
            anchor = self._next_anchor(index, pos, zeros=stop is RecordCheck.EMPTY)
            if anchor is None:  # the end of the data, or a torn tail
                if stop is not RecordCheck.EMPTY:
                    log.warning("commitlog %s: %s record at offset %d and nothing intact after it: "
                                "truncating the torn tail", f.path, stop.value, f.base_offset + pos)
                return f.base_offset + pos
            pos = self._skip_damage(f, pos, anchor)
            if anchor.file_index != index and pos >= f.size_bytes:
                index, pos = anchor.file_index, anchor.pos

    def _scan_file(self, f: MappedFile, pos: int) -> tuple[RecordCheck, int]:
        """Dispatch the good records from ``pos``; returns what stopped the walk and where."""
        view, arr = f.view, f.array
        while True:
            scan = scan_records(view, pos, f.size_bytes, SCAN_CHUNK_RECORDS)
            stop, stop_pos = scan.stop, scan.stop_pos
            if len(scan.starts):
                parsed = parse_records(arr, scan.starts)
                bad = np.flatnonzero(header_errors(parsed.headers)
                                     | envelope_errors(parsed.headers, parsed.starts + f.base_offset))
                if bad.size:  # the walk stops before it; it is damage or the torn tail
                    cut = int(bad[0])
                    parsed = ParsedRecords(parsed.starts[:cut], parsed.headers[:cut], parsed.topics,
                                           parsed.topic_index[:cut])
                    stop, stop_pos = RecordCheck.CORRUPT, int(scan.starts[cut])
                if len(parsed.starts):
                    self.dispatch(parsed, parsed.starts + f.base_offset)
                    self.last_store_ts_ms = int(parsed.headers["store_ts_ms"][-1])
                if bad.size:
                    return stop, stop_pos
            if stop is RecordCheck.OK and len(scan.starts) == SCAN_CHUNK_RECORDS and stop_pos < f.size_bytes:
                pos = stop_pos
                continue
            if stop is RecordCheck.OK:
                stop = check_record(view, stop_pos, f.size_bytes)[0]
            return stop, stop_pos

    def _next_anchor(self, index: int, pos: int, zeros: bool) -> _Anchor | None:
        """The first anchor after ``pos`` in file ``index`` or in a later file. After ``zeros``
        (where every scan of a crashed store ends) only ZERO_STRETCH_MAX_BYTES further on and the
        start of each later file are looked at: lost writes are pages, not the rest of a file."""
        for i in range(index, len(self.files)):
            f = self.files[i]
            if zeros and i > index:
                found = 0 if _is_anchor(f, 0) else None
            else:
                start = pos + 1 if i == index else 0
                found = _find_anchor(f, start, start + ZERO_STRETCH_MAX_BYTES if zeros else f.size_bytes)
            if found is not None:
                return _Anchor(i, found)
        return None

    def _skip_damage(self, f: MappedFile, pos: int, anchor: _Anchor) -> int:
        """Account for the damaged record at ``pos`` (an anchor follows it) and return where the
        scan goes on: at ``pos`` again if the record could be repaired, else past the record as
        framed if its framing fits before the anchor (more damage may follow it), else at the
        anchor (or the end of the file)."""
        same_file = self.files[anchor.file_index] is f
        limit = anchor.pos if same_file else f.size_bytes
        size = _framed_size(f.view, pos, limit)
        if not size and same_file and _repair_framing(f, pos, limit - pos):
            size = limit - pos
        if size and pos != self._repaired_at and _repair_envelope(
                f, pos, size, self.last_store_ts_ms or self._anchor_store_ts(anchor)):
            self._repaired_at = pos  # scanned again, now as a good record (never twice)
            return pos
        size = size or limit - pos
        self.damaged.append(f.base_offset + pos)
        _dispatch_damaged(f, pos, size, self.dispatch)
        return pos + size

    def _anchor_store_ts(self, anchor: _Anchor) -> int:
        """The store time of the anchor if it is a record (a blank marker has none): 1 then."""
        f = self.files[anchor.file_index]
        if _SIZE_MAGIC.unpack_from(f.view, anchor.pos)[1] != MAGIC_V1:
            return 1
        return int(_I64.unpack_from(f.view, anchor.pos + OFF_STORE_TS)[0])


def _claims_offset(f: MappedFile, pos: int) -> bool:
    """Whether a record framed at ``pos`` names ``pos`` as its own commitlog offset."""
    return bool(_framed_size(f.view, pos, f.size_bytes)) and (
        _I64.unpack_from(f.view, pos + OFF_PHYS_OFFSET)[0] == f.base_offset + pos)


def _is_anchor(f: MappedFile, pos: int) -> bool:
    """A complete record, or the blank end-of-file marker, at ``pos``."""
    check, _ = check_record(f.view, pos, f.size_bytes)
    if check is RecordCheck.BLANK:
        return True
    if check is not RecordCheck.OK:
        return False
    return (_I64.unpack_from(f.view, pos + OFF_PHYS_OFFSET)[0] == f.base_offset + pos
            and _I64.unpack_from(f.view, pos + OFF_STORE_TS)[0] > 0)


def _find_anchor(f: MappedFile, start: int, end: int) -> int | None:
    """The first anchor in ``[start, end)`` of ``f``: a search for the magic numbers (a damage
    path, so a copy of the file a few MiB at a time is fine)."""
    view, size = f.view, min(end, f.size_bytes)
    overlap = len(_MAGICS[0]) - 1
    lo = start
    while lo < size:
        hi = min(lo + SEARCH_CHUNK_BYTES, size)
        chunk = view[lo:hi].tobytes()
        hits = sorted(i for magic in _MAGICS for i in _find_all(chunk, magic))
        for i in hits:
            pos = lo + i - 4
            if pos >= start and _is_anchor(f, pos):
                return pos
        if hi == size:
            return None
        lo = hi - overlap
    return None


def _find_all(chunk: bytes, magic: bytes) -> list[int]:
    found = []
    i = chunk.find(magic)
    while i >= 0:
        found.append(i)
        i = chunk.find(magic, i + 1)
    return found


def _framed_size(view: memoryview, pos: int, end: int) -> int:
    """The size of the record framed at ``pos`` (sane length and magic, fits before ``end``), 0 if none is."""
    if end - pos < BLANK_MARKER_SIZE:
        return 0
    size, magic = _SIZE_MAGIC.unpack_from(view, pos)
    return size if magic == MAGIC_V1 and HEADER_SIZE <= size <= end - pos else 0


def _repair_framing(f: MappedFile, pos: int, size: int) -> bool:
    """A record whose length or magic took the flip: if the stretch of ``size`` bytes up to the
    next anchor is one record whose CRC holds once framed so, write the framing back."""
    if size < HEADER_SIZE:
        return False
    old = bytes(f.view[pos: pos + BLANK_MARKER_SIZE])
    _SIZE_MAGIC.pack_into(f.view, pos, size, MAGIC_V1)
    if check_record(f.view, pos, pos + size)[0] is RecordCheck.OK:
        log.error("commitlog %s: record at offset %d had a damaged length or magic (%s): repaired",
                  f.path, f.base_offset + pos, old.hex())
        return True
    f.view[pos: pos + BLANK_MARKER_SIZE] = old
    return False


def _repair_envelope(f: MappedFile, pos: int, size: int, store_ts_ms: int) -> bool:
    """Whether the record at ``pos`` is intact (framing and CRC) once its envelope is: a bit
    flipped in its commitlog offset or store time, with an anchor after it. Both are known (its
    own offset; about the previous record's time), so they are written back."""
    if check_record(f.view, pos, pos + size)[0] is not RecordCheck.OK:
        return False
    phys = f.base_offset + pos
    old_phys, old_ts = (_I64.unpack_from(f.view, pos + off)[0] for off in (OFF_PHYS_OFFSET, OFF_STORE_TS))
    if old_phys != phys or old_ts <= 0:
        _I64.pack_into(f.view, pos + OFF_PHYS_OFFSET, phys)
        if old_ts <= 0:
            _I64.pack_into(f.view, pos + OFF_STORE_TS, store_ts_ms)
        log.error("commitlog %s: record at offset %d had a damaged envelope (offset %d, store time %d): "
                  "repaired", f.path, phys, old_phys, old_ts)
    return True


def _dispatch_damaged(f: MappedFile, pos: int, size: int, dispatch: Dispatch) -> None:
    """Index a damaged record of ``size`` bytes at the queue offset it carries, if its envelope
    (which must name its own position) and its topic are readable; log it either way."""
    phys = f.base_offset + pos
    parsed = None
    if size >= HEADER_SIZE and _I64.unpack_from(f.view, pos + OFF_PHYS_OFFSET)[0] == phys:
        try:
            parsed = parse_records(f.array, [pos])
        except (CorruptRecord, InvalidTopicName):
            parsed = None
    if parsed is None:
        log.error("commitlog %s: damaged stretch of %d bytes at offset %d (header unreadable): "
                  "not indexed", f.path, size, phys)
        return
    headers = parsed.headers.copy()
    headers["total_size"] = size  # the consumeQueue entry covers the damaged stretch
    header = headers[0]
    log.error("commitlog %s: damaged record at offset %d (%d bytes): %s/%d offset %d is kept as "
              "damaged and never served as data", f.path, phys, size, parsed.topics[0],
              int(header["queue_id"]), int(header["queue_offset"]))
    dispatch(ParsedRecords(parsed.starts, headers, parsed.topics, parsed.topic_index), parsed.starts + f.base_offset)
