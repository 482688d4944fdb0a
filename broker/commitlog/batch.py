"""Vectorised reading of a buffer of concatenated records (a send batch, or a stretch of
commitlog during recovery): one Python loop finds record starts and checks CRCs, numpy does the
rest (fixed-offset fields, length consistency, grouping by topic and by tag)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gms.naming import validate_topic_name
from gms.record import (HEADER_SIZE, RecordCheck, gather_rows, header_errors, read_headers, scan_records,
                        tag_hash)
from gms.store_errors import BodyTooLarge, CorruptRecord, EmptyBody, InvalidRecord


class ParsedRecords(NamedTuple):
    starts: np.ndarray  # int64 position of each record in the buffer
    headers: np.ndarray  # HEADER_DTYPE, one per record
    topics: list[str]  # distinct topics of the batch
    topic_index: np.ndarray  # per record: index into ``topics``

    @property
    def sizes(self) -> np.ndarray:
        return self.headers["total_size"].astype(np.int64)


def group_bytes(arr: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                keys: np.ndarray | None = None) -> tuple[list[bytes], np.ndarray]:
    """Distinct byte strings ``arr[offsets[i]:offsets[i]+lengths[i]]`` and each one's index.

    ``keys`` (e.g. the records' tag hashes) proposes the grouping, which is then verified row by
    row; without keys, or if the proposal is wrong, rows are grouped by sorting the bytes."""
    n = len(offsets)
    width = int(lengths.max()) if n else 0
    if width == 0:
        return [b""], np.zeros(n, np.intp)
    mat = gather_rows(arr, offsets, width)
    if not (lengths == width).all():
        mat[np.arange(width) >= lengths[:, None]] = 0
    if (mat == mat[0]).all():
        return [mat[0].tobytes()], np.zeros(n, np.intp)
    if keys is not None:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        if (mat == mat[first][inverse]).all() and (lengths == lengths[first][inverse]).all():
            return [mat[i, : lengths[i]].tobytes() for i in first], inverse
    key = np.empty((n, width + 1), np.uint8)
    key[:, 0] = lengths
    key[:, 1:] = mat
    _, first, inverse = np.unique(key.view(f"V{width + 1}").ravel(), return_index=True, return_inverse=True)
    return [mat[i, : lengths[i]].tobytes() for i in first], inverse.ravel()


def parse_records(arr: np.ndarray, starts: list[int] | np.ndarray,
                  headers: np.ndarray | None = None) -> ParsedRecords:
    """Headers and topic grouping of records already walked by ``scan_records``."""
    starts_arr = np.asarray(starts, np.int64)
    headers = read_headers(arr, starts_arr) if headers is None else headers
    raw_topics, topic_index = group_bytes(arr, starts_arr + HEADER_SIZE, headers["topic_len"])
    try:
        topics = [validate_topic_name(t.decode()) for t in raw_topics]
    except UnicodeDecodeError as err:
        raise CorruptRecord(int(starts_arr[0]), f"topic is not utf-8: {err}") from err
    return ParsedRecords(starts_arr, headers, topics, topic_index)


def parse_batch(buf: memoryview, body_size_max_bytes: int, verify_tag_hash: bool = True) -> ParsedRecords:
    """Validate a whole send batch (length, magic, CRC, field lengths, topic names, body size,
    tag hashes) and describe it; raises on the first bad record, before anything is stored."""
    if len(buf) == 0:
        raise InvalidRecord("batch", "is empty")
    scan = scan_records(buf)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(buf):
        raise CorruptRecord(scan.stop_pos, f"{scan.stop.value} record in the batch")
    arr = np.frombuffer(buf, np.uint8)
    starts_arr = np.array(scan.starts, np.int64)
    headers = read_headers(arr, starts_arr)
    bad = np.flatnonzero(header_errors(headers))
    if bad.size:
        raise CorruptRecord(int(starts_arr[bad[0]]), "field lengths do not add up to total_size")
    body_len = headers["body_len"]
    if (body_len == 0).any():
        raise EmptyBody()
    if int(body_len.max()) > body_size_max_bytes:
        raise BodyTooLarge(int(body_len.max()), body_size_max_bytes)
    parsed = parse_records(arr, starts_arr, headers)
    if verify_tag_hash:
        _check_tag_hashes(arr, parsed)
    return parsed


def _check_tag_hashes(arr: np.ndarray, parsed: ParsedRecords) -> None:
    """The consumeQueue filters on the producer's tag hash, so a wrong one would hide a message
    from its subscribers: verify it once per distinct tag of the batch."""
    headers = parsed.headers
    tags, tag_index = group_bytes(arr, parsed.starts + HEADER_SIZE + headers["topic_len"], headers["tag_len"],
                                  headers["tag_hash"])
    try:
        expected = np.array([tag_hash(t.decode()) for t in tags], np.int64)
    except UnicodeDecodeError as err:
        raise CorruptRecord(int(parsed.starts[0]), f"tag is not utf-8: {err}") from err
    bad = np.flatnonzero(expected[tag_index] != headers["tag_hash"])
    if bad.size:
        raise InvalidRecord("tag_hash", f"record at byte {int(parsed.starts[bad[0]])} carries "
                                        f"{int(headers['tag_hash'][bad[0]])}, not xxhash64 of its tag")
