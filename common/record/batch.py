"""Reading a buffer of concatenated records (a send batch, or a stretch of commitlog during
recovery): one Python loop finds record starts and checks CRCs; the rest (fixed-offset fields,
length consistency, grouping by topic and by tag) is checked with numpy for large batches, and
record by record with ``struct`` below VECTORISE_RECORDS_MIN, where numpy's fixed cost per call
(a microsecond or more, dozens of calls) would dwarf the work. Both feed the same ParsedRecords."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from gms.naming import validate_topic_name
from gms.record import (
    HEADER_DTYPE,
    HEADER_SIZE,
    RecordCheck,
    _recordcheck,
    batch_headers,
    read_headers,
    scan_records,
    tag_hash,
    validate_header,
)
from gms.record.layout import index_tag_hash, index_tag_hashes
from gms.store_errors import BodyTooLarge, CorruptRecord, InvalidRecord

VECTORISE_RECORDS_MIN = 16  # from this many records a batch is checked with numpy
_NAMES_CACHED_MAX = 4096  # distinct topic names / tags whose checks are remembered
# indexes in a header tuple (gms.record.HEADER)
_QUEUE_ID, _PHYS, _STORE_TS, _FLAGS, _TAG_HASH, _BODY_LEN, _TOPIC_LEN, _TAG_LEN = 3, 5, 6, 7, 9, 11, 12, 13


class ParsedRecords(NamedTuple):
    starts: np.ndarray  # int64 position of each record in the buffer
    headers: np.ndarray  # HEADER_DTYPE, one per record
    topics: list[str]  # distinct topics of the batch
    topic_index: np.ndarray  # per record: index into ``topics``

    @property
    def sizes(self) -> np.ndarray:
        return self.headers["total_size"].astype(np.int64)

    @property
    def index_tag_hashes(self) -> np.ndarray:
        """The consumeQueue tag hash column (hidden records: HIDDEN_TAG_HASH)."""
        return index_tag_hashes(self.headers)


def group_bytes(arr: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, *,
                alike: bool = False) -> tuple[list[bytes], np.ndarray]:
    """Distinct byte strings ``arr[offsets[i]:offsets[i]+lengths[i]]`` and each one's index.

    C (``group_rows``): each row is compared with the row before, and only the first row of each
    run of equal rows is looked up (a send of a thousand topics holds each queue's batch in a run
    of a few hundred rows). ``alike``: every row is known to hold the first one's bytes
    (:func:`batch_headers` said so)."""
    n = len(offsets)
    if n == 0:
        return [b""], np.zeros(0, np.intp)
    if alike:
        at = int(offsets[0])
        return [arr[at: at + int(lengths[0])].tobytes()], np.zeros(n, np.intp)
    try:
        distinct, index = _recordcheck.group_rows(arr, offsets.astype(np.int64, copy=False), lengths.astype(np.int64))
    except ValueError as err:  # a length past the batch's end: the record's own checks say which
        raise CorruptRecord(int(offsets[0]), f"a record's name runs past the end of the batch: {err}") from err
    return distinct, np.frombuffer(index, np.intp)


@lru_cache(maxsize=_NAMES_CACHED_MAX)
def _topic_name(raw: bytes) -> str:
    """A record's topic, decoded and validated once per distinct name (raises like validate_topic_name)."""
    return validate_topic_name(raw.decode())


@lru_cache(maxsize=_NAMES_CACHED_MAX)
def _tag_hash_of(raw: bytes) -> int:
    return tag_hash(raw.decode())


def parse_records(arr: np.ndarray, starts: list[int] | np.ndarray,
                  headers: np.ndarray | None = None, *, one_topic: bool = False) -> ParsedRecords:
    """Headers and topic grouping of records already walked by ``scan_records``. ``one_topic``:
    every record is known to carry the first one's topic bytes."""
    starts_arr = np.asarray(starts, np.int64)
    headers = read_headers(arr, starts_arr) if headers is None else headers
    raw_topics, topic_index = group_bytes(arr, starts_arr + HEADER_SIZE, headers["topic_len"], alike=one_topic)
    try:
        topics = [_topic_name(t) for t in raw_topics]
    except UnicodeDecodeError as err:
        raise CorruptRecord(int(starts_arr[0]), f"topic is not utf-8: {err}") from err
    return ParsedRecords(starts_arr, headers, topics, topic_index)


def parse_batch(buf: memoryview, body_size_max_bytes: int, verify_tag_hash: bool = True, *,
                verify_crc: bool = True, sizes: np.ndarray | None = None) -> ParsedRecords:
    """Validate a whole send batch (length, magic, CRC, field lengths, topic names, body size,
    tag hashes) and describe it; raises on the first bad record, before anything is stored.
    ``verify_crc=False``: the caller already checked the batch's bytes against one CRC of the
    whole (records a replica copies from its leader, which checked each record's CRC).
    ``sizes``: each record's size as the sender claims it (a leader's consumeQueue entries), so
    the record starts come from one cumsum instead of a Python walk; they must add up to the
    buffer and agree with every record's own total_size (checked vectorised below)."""
    if len(buf) == 0:
        raise InvalidRecord("batch", "is empty")
    if sizes is not None:
        starts_arr = _starts_from_sizes(sizes, len(buf))
    else:
        scan = scan_records(buf, verify_crc=verify_crc)
        if scan.stop is not RecordCheck.OK or scan.stop_pos != len(buf):
            raise CorruptRecord(scan.stop_pos, f"{scan.stop.value} record in the batch")
        if len(scan.starts) < VECTORISE_RECORDS_MIN:
            return _parse_few(buf, scan.starts.tolist(), body_size_max_bytes, verify_tag_hash)
        starts_arr = scan.starts
    arr = np.frombuffer(buf, np.uint8)
    checked = batch_headers(buf, starts_arr)
    if checked.first_bad >= 0:
        raise CorruptRecord(int(starts_arr[checked.first_bad]), "field lengths do not add up to total_size")
    headers = checked.headers
    if sizes is not None:
        wrong = np.flatnonzero(headers["total_size"] != sizes)
        if wrong.size:
            raise CorruptRecord(int(starts_arr[wrong[0]]), "record size differs from the one announced")
    _check_body_lengths(checked.body_max, body_size_max_bytes)
    parsed = parse_records(arr, starts_arr, headers, one_topic=checked.same_topic)
    if verify_tag_hash:
        _check_tag_hashes(arr, parsed, one_tag=checked.same_tag)
    return parsed


class OneRecord(NamedTuple):
    """What an append needs of a single record (:func:`parse_one`)."""

    topic: str
    queue_id: int
    size: int
    tag_hash: int  # as indexed: HIDDEN_TAG_HASH for a hidden record
    stamped: bool  # its phys_offset or store_ts_ms is set: only the broker may set them
    flags: int


def parse_one(buf: memoryview, body_size_max_bytes: int, verify_tag_hash: bool = True) -> OneRecord:
    """``parse_batch`` of a buffer holding exactly one record (a single send): the same checks
    with ``struct`` alone, no numpy call (whose fixed costs would be most of a single send)."""
    fields = validate_header(buf, 0, verify_crc=True)
    if fields[0] != len(buf):
        raise CorruptRecord(0, f"one record of {fields[0]} bytes in a buffer of {len(buf)}")
    _check_body_lengths(fields[_BODY_LEN], body_size_max_bytes)
    topic_end = HEADER_SIZE + fields[_TOPIC_LEN]
    topic = _decode_topic(bytes(buf[HEADER_SIZE:topic_end]), 0)
    if verify_tag_hash:
        _check_tag_hash(bytes(buf[topic_end: topic_end + fields[_TAG_LEN]]), fields[_TAG_HASH], 0)
    flags = fields[_FLAGS]
    return OneRecord(topic, fields[_QUEUE_ID], fields[0], index_tag_hash(flags, fields[_TAG_HASH]),
                     bool(fields[_PHYS] | fields[_STORE_TS]), flags)


def _decode_topic(raw: bytes, pos: int) -> str:
    try:
        return _topic_name(raw)
    except UnicodeDecodeError as err:
        raise CorruptRecord(pos, f"topic is not utf-8: {err}") from err


def _starts_from_sizes(sizes: np.ndarray, buf_len: int) -> np.ndarray:
    """Record starts from announced sizes: each at least a header long (so every start has a
    whole header to read), together exactly the buffer."""
    sizes = np.asarray(sizes, np.int64)
    if sizes.size == 0 or int(sizes.min()) < HEADER_SIZE or int(sizes.sum()) != buf_len:
        raise CorruptRecord(0, f"announced record sizes do not tile the {buf_len}-byte batch")
    starts = np.empty(sizes.size, np.int64)
    starts[0] = 0
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts


def _parse_few(buf: memoryview, starts: list[int], body_size_max_bytes: int,
               verify_tag_hash: bool) -> ParsedRecords:
    """``parse_batch`` of a few records: the same rules record by record (``validate_header``
    is the scalar twin of ``header_errors``), no numpy until the result is assembled."""
    fields = [validate_header(buf, pos, verify_crc=False) for pos in starts]  # CRCs: checked by the scan
    body_lens = [f[_BODY_LEN] for f in fields]
    _check_body_lengths(max(body_lens), body_size_max_bytes)
    topics: dict[str, int] = {}
    topic_index = []
    for pos, f in zip(starts, fields, strict=True):
        topic_end = pos + HEADER_SIZE + f[_TOPIC_LEN]
        topic = _decode_topic(bytes(buf[pos + HEADER_SIZE: topic_end]), pos)
        topic_index.append(topics.setdefault(topic, len(topics)))
        if verify_tag_hash:
            _check_tag_hash(bytes(buf[topic_end: topic_end + f[_TAG_LEN]]), f[_TAG_HASH], pos)
    headers = np.frombuffer(b"".join([buf[pos: pos + HEADER_SIZE] for pos in starts]), HEADER_DTYPE)
    return ParsedRecords(np.array(starts, np.int64), headers, list(topics), np.array(topic_index, np.intp))


def _check_body_lengths(longest: int, body_size_max_bytes: int) -> None:
    if longest > body_size_max_bytes:
        raise BodyTooLarge(longest, body_size_max_bytes)


def _check_tag_hash(raw_tag: bytes, carried: int, pos: int) -> None:
    """The consumeQueue filters on the producer's tag hash, so a wrong one would hide a message
    from its subscribers."""
    try:
        expected = _tag_hash_of(raw_tag)
    except UnicodeDecodeError as err:
        raise CorruptRecord(pos, f"tag is not utf-8: {err}") from err
    if expected != carried:
        raise InvalidRecord("tag_hash", f"record at byte {pos} carries {carried}, not xxhash64 of its tag")


def _check_tag_hashes(arr: np.ndarray, parsed: ParsedRecords, *, one_tag: bool = False) -> None:
    """``_check_tag_hash`` of a large batch: one hash per distinct tag, one vectorised comparison.
    ``one_tag``: every record is known to carry the first one's tag bytes."""
    headers = parsed.headers
    tags, tag_index = group_bytes(arr, parsed.starts + HEADER_SIZE + headers["topic_len"], headers["tag_len"],
                                  alike=one_tag)
    try:
        expected = np.array([_tag_hash_of(t) for t in tags], np.int64)
    except UnicodeDecodeError as err:
        raise CorruptRecord(int(parsed.starts[0]), f"tag is not utf-8: {err}") from err
    bad = np.flatnonzero(expected[tag_index] != headers["tag_hash"])
    if bad.size:  # raises, naming the first record whose hash is wrong
        i = int(bad[0])
        _check_tag_hash(tags[tag_index[i]], int(headers["tag_hash"][i]), int(parsed.starts[i]))
