"""Record format v1: the one layout shared by producer, broker store, consumer and Spark.

Big-endian. The first 40 bytes are the envelope the broker owns (it may rewrite them without
touching the checksum); bytes from 40 on are written by the producer and covered by the CRC,
like Kafka's v2 batch keeps base offset and leader epoch outside its CRC::

    off size field
    0   4   total_size      i32  whole record including this field
    4   4   magic           u32  MAGIC_V1 (BLANK_MAGIC marks end-of-file filler)
    8   4   crc32           u32  crc32 of bytes [40, total_size)
    12  4   queue_id        i32  broker may rewrite
    16  8   queue_offset    i64  broker-assigned
    24  8   phys_offset     i64  broker-assigned (commitlog offset of this record)
    32  8   store_ts_ms     i64  broker-assigned
    --- CRC-covered, written by the producer ---
    40  4   flags           i32
    44  8   born_ts_ms      i64
    52  8   tag_hash        i64  xxhash64(tag utf-8) as signed int64; 0 = no tag
    60  4   reconsume_times i32
    64  4   body_len        i32
    68  1   topic_len       u8   1..127
    69  1   tag_len         u8
    70  1   born_host_len   u8
    71  1   reserved        u8   0
    72  2   keys_len        u16  keys, utf-8, separated by KEY_SEPARATOR
    74  2   props_len       u16  properties, utf-8 "k\\x01v\\x02k\\x01v\\x02"
    76  ... topic, tag, born_host, keys, properties, body

A commitlog file ends with a blank marker (total_size = bytes left in the file, BLANK_MAGIC);
a record is placed in a file only if it leaves at least BLANK_MARKER_SIZE bytes after it.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import NamedTuple

import numpy as np
import xxhash
from isal.isal_zlib import crc32  # zlib's CRC-32 (same values), ~6x faster on small records
from numpy.lib.stride_tricks import as_strided

from gms import _recordcheck
from gms.naming import TOPIC_NAME_BYTES_MAX, validate_topic_name
from gms.store_errors import CorruptRecord, InvalidRecord

MAGIC_V1 = 0x474D5301  # "GMS\x01"
BLANK_MAGIC = 0x474D53FF  # "GMS\xff": filler up to the end of a commitlog file
BLANK_MARKER_SIZE = 8  # total_size + magic; RocketMQ's END_FILE_MIN_BLANK_LENGTH

KEY_SEPARATOR = " "
PROP_NAME_VALUE_SEPARATOR = "\x01"
PROP_SEPARATOR = "\x02"

# (name, struct code): the fixed part, in order. Offsets are derived, never typed by hand.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", "i"),
    ("magic", "I"),
    ("crc32", "I"),
    ("queue_id", "i"),
    ("queue_offset", "q"),
    ("phys_offset", "q"),
    ("store_ts_ms", "q"),
    ("flags", "i"),
    ("born_ts_ms", "q"),
    ("tag_hash", "q"),
    ("reconsume_times", "i"),
    ("body_len", "i"),
    ("topic_len", "B"),
    ("tag_len", "B"),
    ("born_host_len", "B"),
    ("reserved", "B"),
    ("keys_len", "H"),
    ("props_len", "H"),
)
HEADER = struct.Struct(">" + "".join(code for _, code in _FIELDS))
HEADER_SIZE = HEADER.size
OFFSETS: dict[str, int] = dict(
    # accumulate(initial=0) yields one more (the end) than there are fields: not strict.
    zip((name for name, _ in _FIELDS), accumulate((struct.calcsize(">" + c) for _, c in _FIELDS), initial=0),
        strict=False)
)
OFF_MAGIC = OFFSETS["magic"]
OFF_CRC = OFFSETS["crc32"]
OFF_QUEUE_ID = OFFSETS["queue_id"]
OFF_QUEUE_OFFSET = OFFSETS["queue_offset"]
OFF_PHYS_OFFSET = OFFSETS["phys_offset"]
OFF_STORE_TS = OFFSETS["store_ts_ms"]
OFF_CRC_START = OFFSETS["flags"]  # the CRC covers [OFF_CRC_START, total_size)
OFF_TAG_HASH = OFFSETS["tag_hash"]
OFF_VARIABLE = HEADER_SIZE

assert HEADER_SIZE == 76, HEADER_SIZE
assert (OFF_MAGIC, OFF_CRC, OFF_QUEUE_ID, OFF_QUEUE_OFFSET) == (4, 8, 12, 16)
assert (OFF_PHYS_OFFSET, OFF_STORE_TS, OFF_CRC_START, OFF_TAG_HASH) == (24, 32, 40, 52)
assert OFFSETS["body_len"] == 64 and OFFSETS["topic_len"] == 68 and OFFSETS["props_len"] == 74
assert _recordcheck.LAYOUT == (OFF_MAGIC, OFF_CRC, OFF_QUEUE_ID, OFF_QUEUE_OFFSET, OFF_PHYS_OFFSET, OFF_CRC_START,
                               HEADER_SIZE, MAGIC_V1), "gms._recordcheck was built for another record layout"

# The same fixed part as a numpy dtype, for reading the headers of a whole batch at once.
HEADER_DTYPE = np.dtype([(name, ">" + ("u" if c in "IBH" else "i") + str(struct.calcsize(c)))
                         for name, c in ((n, c) for n, c in _FIELDS)])
assert HEADER_DTYPE.itemsize == HEADER_SIZE

_SIZE_MAGIC = struct.Struct(">iI")
_BROKER_FIELDS = struct.Struct(">iqqq")  # queue_id .. store_ts_ms
assert _BROKER_FIELDS.size == OFF_CRC_START - OFF_QUEUE_ID

TAG_BYTES_MAX = 255
BORN_HOST_BYTES_MAX = 255
KEYS_BYTES_MAX = 0xFFFF
PROPS_BYTES_MAX = 0xFFFF
RECORD_BYTES_MAX = 0x7FFFFFFF
NO_TAG_HASH = 0


class RecordCheck(enum.Enum):
    """What lies at a position of a commitlog file (RocketMQ's checkMessageAndReturnSize)."""

    OK = "ok"  # a valid record
    BLANK = "blank"  # end-of-file filler: the rest of the file holds no record
    EMPTY = "empty"  # zeros: nothing was ever written here
    TRUNCATED = "truncated"  # a record header promises more bytes than there are
    CORRUPT = "corrupt"  # bad magic, impossible length or CRC mismatch


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record; every field of the format, the body as a zero-copy view."""

    total_size: int
    magic: int
    crc32: int
    queue_id: int
    queue_offset: int
    phys_offset: int
    store_ts_ms: int
    flags: int
    born_ts_ms: int
    tag_hash: int
    reconsume_times: int
    topic: str
    tag: str | None
    born_host: str
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    body: memoryview


class Message(NamedTuple):
    """What a producer sends; ``encode_batch`` turns a sequence of these into records."""

    topic: str
    body: bytes
    tag: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] | None = None
    queue_id: int = 0
    flags: int = 0
    born_host: str = ""
    born_ts_ms: int = 0  # 0 = now
    reconsume_times: int = 0


def tag_hash(tag: str | None) -> int:
    """xxhash64 of the tag's utf-8 bytes as a signed int64 (the consumeQueue column); 0 = no tag."""
    if not tag:
        return NO_TAG_HASH
    h = xxhash.xxh64_intdigest(tag.encode())
    return h - (1 << 64) if h >= (1 << 63) else h


def encode_keys(keys: Iterable[str]) -> bytes:
    keys = tuple(keys)
    for key in keys:
        if not key or KEY_SEPARATOR in key:
            raise InvalidRecord("keys", f"key {key!r} is empty or contains the separator {KEY_SEPARATOR!r}")
    return KEY_SEPARATOR.join(keys).encode()


def decode_keys(raw: bytes | memoryview) -> tuple[str, ...]:
    return tuple(bytes(raw).decode().split(KEY_SEPARATOR)) if len(raw) else ()


def encode_properties(properties: Mapping[str, str] | None) -> bytes:
    if not properties:
        return b""
    parts = []
    for name, value in properties.items():
        for text in (name, value):
            if PROP_NAME_VALUE_SEPARATOR in text or PROP_SEPARATOR in text:
                raise InvalidRecord("properties", f"{text!r} contains a separator character")
        if not name:
            raise InvalidRecord("properties", "empty property name")
        parts.append(f"{name}{PROP_NAME_VALUE_SEPARATOR}{value}{PROP_SEPARATOR}")
    return "".join(parts).encode()


def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    text = bytes(raw).decode()
    if not text:
        return {}
    if not text.endswith(PROP_SEPARATOR):
        raise ValueError("properties do not end with the separator")
    result = {}
    for item in text[:-1].split(PROP_SEPARATOR):
        name, sep, value = item.partition(PROP_NAME_VALUE_SEPARATOR)
        if not sep:
            raise ValueError(f"property {item!r} has no name/value separator")
        result[name] = value
    return result


def _limited(field: str, raw: bytes, size_max: int) -> bytes:
    if len(raw) > size_max:
        raise InvalidRecord(field, f"{len(raw)} bytes exceeds the limit of {size_max}")
    return raw


def encode_record(
    *,
    topic: str,
    body: bytes | memoryview,
    tag: str | None = None,
    keys: Iterable[str] = (),
    properties: Mapping[str, str] | None = None,
    queue_id: int = 0,
    flags: int = 0,
    born_host: str = "",
    born_ts_ms: int = 0,
    reconsume_times: int = 0,
) -> bytes:
    """Encode one record with zero broker fields (the broker assigns offsets and timestamps)."""
    topic_raw = validate_topic_name(topic).encode()
    tag_raw = _limited("tag", (tag or "").encode(), TAG_BYTES_MAX)
    host_raw = _limited("born_host", born_host.encode(), BORN_HOST_BYTES_MAX)
    keys_raw = _limited("keys", encode_keys(keys), KEYS_BYTES_MAX)
    props_raw = _limited("properties", encode_properties(properties), PROPS_BYTES_MAX)
    total = HEADER_SIZE + len(topic_raw) + len(tag_raw) + len(host_raw) + len(keys_raw) + len(props_raw) + len(body)
    if total > RECORD_BYTES_MAX:
        raise InvalidRecord("body", f"record of {total} bytes exceeds {RECORD_BYTES_MAX}")
    buf = bytearray(total)
    HEADER.pack_into(
        buf, 0, total, MAGIC_V1, 0, queue_id, 0, 0, 0,
        flags, born_ts_ms or int(time.time() * 1000), tag_hash(tag), reconsume_times, len(body),
        len(topic_raw), len(tag_raw), len(host_raw), 0, len(keys_raw), len(props_raw),
    )
    buf[HEADER_SIZE:] = b"".join((topic_raw, tag_raw, host_raw, keys_raw, props_raw, body))
    seal_crc(buf)
    return bytes(buf)


def seal_crc(buf: bytearray | memoryview, pos: int = 0) -> None:
    """(Re)compute the CRC of the record at ``pos`` after its producer part was written."""
    total = _SIZE_MAGIC.unpack_from(buf, pos)[0]
    struct.pack_into(">I", buf, pos + OFF_CRC, crc32(memoryview(buf)[pos + OFF_CRC_START: pos + total]))


def encode_batch(messages: Iterable[Message]) -> bytes:
    """Concatenate the records of several messages: the body of one send request."""
    return b"".join(encode_record(**m._asdict()) for m in messages)


def write_broker_fields(buf: bytearray | memoryview, pos: int, queue_id: int, queue_offset: int,
                        phys_offset: int, store_ts_ms: int) -> None:
    """Patch the broker-owned envelope of one record (outside the CRC)."""
    _BROKER_FIELDS.pack_into(buf, pos + OFF_QUEUE_ID, queue_id, queue_offset, phys_offset, store_ts_ms)


def check_record(buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> tuple[RecordCheck, int]:
    """Classify what starts at ``pos``; returns the outcome and the size it occupies (0 unless OK
    or BLANK). ``end`` is where the enclosing file or buffer ends."""
    end = len(buf) if end is None else end
    left = end - pos
    if left < BLANK_MARKER_SIZE:
        return (RecordCheck.EMPTY if not any(bytes(buf[pos:end])) else RecordCheck.TRUNCATED), 0
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return (RecordCheck.BLANK, size) if size == left else (RecordCheck.CORRUPT, 0)
    if magic == 0 and size == 0:
        return RecordCheck.EMPTY, 0
    if magic != MAGIC_V1 or size < HEADER_SIZE:
        return RecordCheck.CORRUPT, 0
    if size > left:
        return RecordCheck.TRUNCATED, 0
    try:
        validate_header(buf, pos, verify_crc=True)
    except CorruptRecord:
        return RecordCheck.CORRUPT, 0
    return RecordCheck.OK, size


def validate_header(buf: bytes | memoryview, pos: int, verify_crc: bool) -> tuple:
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecord(pos, f"{len(buf) - pos} bytes left, a header needs {HEADER_SIZE}")
    fields = HEADER.unpack_from(buf, pos)
    total, magic, crc = fields[0], fields[1], fields[2]
    if magic != MAGIC_V1:
        raise CorruptRecord(pos, f"magic {magic:#x} is not {MAGIC_V1:#x}")
    if total < HEADER_SIZE or total > len(buf) - pos:
        raise CorruptRecord(pos, f"total_size {total} outside {HEADER_SIZE}..{len(buf) - pos}")
    body_len, topic_len, tag_len, host_len, reserved, keys_len, props_len = fields[11:]
    if body_len < 0 or not 1 <= topic_len <= TOPIC_NAME_BYTES_MAX or reserved != 0:
        raise CorruptRecord(pos, f"body_len {body_len}, topic_len {topic_len}, reserved {reserved}")
    expected = HEADER_SIZE + topic_len + tag_len + host_len + keys_len + props_len + body_len
    if expected != total:
        raise CorruptRecord(pos, f"total_size {total} but the field lengths add up to {expected}")
    if verify_crc and crc32(memoryview(buf)[pos + OFF_CRC_START: pos + total]) != crc:
        raise CorruptRecord(pos, "CRC mismatch")
    return fields


# The fields of Record that come straight from the fixed header, in header order.
_HEADER_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Record))[:11]


def decode_record(buf: bytes | memoryview, pos: int = 0, verify_crc: bool = True) -> Record:
    """Decode the record at ``pos``, checking every length against the buffer and total_size."""
    fields = validate_header(buf, pos, verify_crc)
    mv = memoryview(buf)
    topic_len, tag_len, host_len, _, keys_len, props_len = fields[12:]
    cut = pos + HEADER_SIZE
    parts = []
    for length in (topic_len, tag_len, host_len, keys_len, props_len):
        parts.append(mv[cut: cut + length])
        cut += length
    topic_raw, tag_raw, host_raw, keys_raw, props_raw = parts
    try:
        return Record(
            **dict(zip(_HEADER_FIELD_NAMES, fields, strict=False)),
            topic=bytes(topic_raw).decode(),
            tag=bytes(tag_raw).decode() or None,
            born_host=bytes(host_raw).decode(),
            keys=decode_keys(keys_raw),
            properties=decode_properties(props_raw),
            body=mv[cut: pos + fields[0]],
        )
    except (UnicodeDecodeError, ValueError) as err:
        raise CorruptRecord(pos, f"undecodable text field: {err}") from err


def iter_records(buf: bytes | memoryview, verify_crc: bool = True) -> Iterator[Record]:
    """Decode every record of a concatenation (a send body or a pull response)."""
    pos = 0
    while pos < len(buf):
        record = decode_record(buf, pos, verify_crc)
        yield record
        pos += record.total_size


def record_tag(buf: bytes | memoryview, pos: int = 0) -> str | None:
    """The exact tag of the stored record at ``pos`` (to re-check a tag-hash match)."""
    topic_len, tag_len = buf[pos + OFFSETS["topic_len"]], buf[pos + OFFSETS["tag_len"]]
    start = pos + HEADER_SIZE + topic_len
    return bytes(buf[start: start + tag_len]).decode() or None


def filter_exact_tags(records: Iterable[memoryview], tags: frozenset[str] | None) -> list[memoryview]:
    """Drop records whose tag only collided by hash with a subscribed tag."""
    if tags is None:
        return list(records)
    return [r for r in records if record_tag(r) in tags]


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


def gather_rows(arr: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """``arr[o:o+width]`` for every offset as one (n, width) uint8 array. Rows are copied out of a
    strided window view (one memcpy per row, ~6x faster than a fancy index per byte); offsets too
    close to the end to have ``width`` bytes get zeros past the end."""
    usable = len(arr) - width + 1
    if usable > 0 and (len(offsets) == 0 or int(offsets.max()) < usable):
        return as_strided(arr, (usable, width), (arr.strides[0], arr.strides[0]))[offsets]
    padded = np.zeros(len(arr) + width, np.uint8)
    padded[: len(arr)] = arr
    return gather_rows(padded, offsets, width)


def read_headers(arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The fixed headers of the records at ``starts`` of ``arr`` (uint8) as a HEADER_DTYPE array."""
    return gather_rows(arr, starts, HEADER_SIZE).view(HEADER_DTYPE).ravel()


def header_errors(headers: np.ndarray) -> np.ndarray:
    """Boolean mask of headers whose lengths are inconsistent (vectorised ``validate_header``)."""
    total = headers["total_size"].astype(np.int64)
    expected = (HEADER_SIZE + headers["topic_len"].astype(np.int64) + headers["tag_len"]
                + headers["born_host_len"] + headers["keys_len"] + headers["props_len"]
                + headers["body_len"].astype(np.int64))
    return ((headers["magic"] != MAGIC_V1) | (headers["body_len"] < 0) | (headers["topic_len"] < 1)
            | (headers["topic_len"] > TOPIC_NAME_BYTES_MAX) | (headers["reserved"] != 0)
            | (expected != total))


def crc_mismatches(buf: bytes | memoryview | np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indexes of the records at ``starts`` (of ``sizes`` bytes) in ``buf`` whose CRC fails, in
    one C call (see :func:`check_stored`, which also checks the fields outside the CRC)."""
    return np.array(_recordcheck.crc_mismatches(buf, np.ascontiguousarray(starts, np.int64),
                                                np.ascontiguousarray(sizes, np.int64)), np.intp)


class StoredCheck(NamedTuple):
    damaged: np.ndarray  # indexes of records whose CRC fails, or of lost entries
    misplaced: np.ndarray  # indexes of intact records whose length, magic or envelope disagree with their entries


def check_stored(buf: bytes | memoryview, starts: np.ndarray, sizes: np.ndarray, base_offset: int,
                 queue_id: int, queue_offsets: np.ndarray) -> StoredCheck:
    """Check records of one queue at ``starts`` of ``buf`` (a commitlog file at ``base_offset``)
    against their index entries (``sizes``, ``queue_offsets``): the CRC, and the fields outside it.
    Entries below a header's size are lost ones (nothing is read). One C call for all of them: a
    Python call per record costs more than the CRC of 100 bytes."""
    damaged, misplaced = _recordcheck.check_stored(
        buf, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64), base_offset,
        queue_id, np.ascontiguousarray(queue_offsets, np.int64))
    return StoredCheck(np.array(damaged, np.intp), np.array(misplaced, np.intp))


def record_views(view: memoryview, starts: np.ndarray, sizes: np.ndarray) -> list[memoryview]:
    """``view[s:s + n]`` for every start and size: zero-copy records, sliced in C."""
    return _recordcheck.slices(view, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64))


# --- columnar readers: the fields of many records at once (a PULL response, a scan) ----------

class FieldOffsets(NamedTuple):
    """Where the variable fields of each of a batch of records start (int64 arrays, positions in
    the buffer) and how long they are, from their headers (:func:`read_field_offsets`)."""

    headers: np.ndarray  # HEADER_DTYPE
    topic_at: np.ndarray
    tag_at: np.ndarray
    born_host_at: np.ndarray
    keys_at: np.ndarray
    props_at: np.ndarray
    body_at: np.ndarray


def read_field_offsets(buf: bytes | memoryview, starts: np.ndarray) -> FieldOffsets:
    """The headers and field positions of the records at ``starts`` of ``buf``, every header
    checked as :func:`validate_header` does (magic, lengths adding up to total_size, the record
    inside the buffer; not the CRC): CorruptRecord names the first record that fails."""
    arr = np.frombuffer(buf, np.uint8)
    starts = np.asarray(starts, np.int64)
    headers = _uniform_headers(arr, starts)
    if headers is not None:  # one layout: check the first, the rest are the same bytes
        lengths = headers[:1]
        checked = [headers[:1], starts[:1]]
    else:
        headers = lengths = read_headers(arr, starts)
        checked = [headers, starts]
    bad = header_errors(checked[0]) | (checked[1] + HEADER_SIZE > len(arr))
    bad |= checked[1] + checked[0]["total_size"].astype(np.int64) > len(arr)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise CorruptRecord(int(checked[1][first]), "record header is inconsistent (magic, lengths or total_size)")
    if lengths is not headers and int(starts[-1]) + int(lengths["total_size"][0]) > len(arr):
        raise CorruptRecord(int(starts[-1]), "record runs past the end of the buffer")
    topic_at = starts + HEADER_SIZE
    tag_at = topic_at + _column_or_scalar(lengths["topic_len"])
    born_host_at = tag_at + _column_or_scalar(lengths["tag_len"])
    keys_at = born_host_at + _column_or_scalar(lengths["born_host_len"])
    props_at = keys_at + _column_or_scalar(lengths["keys_len"])
    body_at = props_at + _column_or_scalar(lengths["props_len"])
    return FieldOffsets(headers, topic_at, tag_at, born_host_at, keys_at, props_at, body_at)


def _column_or_scalar(column: np.ndarray) -> np.ndarray | int:
    return int(column[0]) if len(column) == 1 else column.astype(np.int64)


def _uniform_headers(arr: np.ndarray, starts: np.ndarray) -> np.ndarray | None:
    """The headers at ``starts`` as one strided view when the starts step evenly and every
    record's total_size, magic and field lengths are the first record's (a producer batch):
    three vectorised compares instead of checking each header. None otherwise."""
    n = len(starts)
    if n < 2:
        return None
    first = int(starts[0])
    step = int(starts[1]) - first
    if step < HEADER_SIZE or first < 0 or first + (n - 1) * step + HEADER_SIZE > len(arr):
        return None
    if not (np.diff(starts) == step).all():
        return None
    for offset, dtype in ((0, "<u8"), (OFFSETS["body_len"], "<u8"), (OFFSETS["keys_len"], "<u4")):
        same = np.ndarray((n,), dtype, arr, first + offset, (step,))  # total_size+magic; the lengths
        if not (same == same[0]).all():
            return None
    return np.ndarray((n,), HEADER_DTYPE, arr, first, (step,))


# Records sharing a few distinct text values (topics, tags) are decoded once per value when at
# most this fraction of them are distinct; otherwise one by one.
_DISTINCT_TEXTS_MAX_FRACTION = 4


class Undecodable:
    """Stands in a text column for a field that is not valid UTF-8 (see :func:`text_column`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDECODABLE"


UNDECODABLE = Undecodable()


class _Decoded(dict[bytes, "str | Undecodable | None"]):
    """utf-8 text of each distinct raw value, decoded on first sight; ``empty`` for none."""

    def __init__(self, empty: str | None) -> None:
        super().__init__({b"": empty})

    def __missing__(self, raw: bytes) -> str | Undecodable | None:
        try:
            text: str | Undecodable | None = raw.decode()
        except UnicodeDecodeError:
            text = UNDECODABLE
        self[raw] = text
        return text


def bytes_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """``bytes(buf[at[i]: at[i] + lengths[i]])`` for every ``i``, made in C: a batch of records
    of one size (a producer batch) is one strided numpy view turned into a list of bytes; a few
    distinct lengths are gathered one length at a time; many are sliced one by one."""
    n = len(at)
    if n == 0:
        return []
    arr = np.frombuffer(buf, np.uint8)
    at = np.asarray(at, np.int64)
    lengths = np.asarray(lengths, np.int64)
    width = int(lengths[0])
    if n == 1 or ((lengths == width).all() and (np.diff(at) == at[1] - at[0]).all() and at[1] > at[0]):
        if width == 0:
            return [b""] * n
        stride = int(at[1] - at[0]) if n > 1 else width
        return np.ndarray((n,), f"V{width}", arr, int(at[0]), (stride,)).tolist()
    if (lengths == width).all():  # one size, not evenly stepped: gathered, then as above
        return [b""] * n if width == 0 else gather_rows(arr, at, width).view(f"V{width}").ravel().tolist()
    distinct, inverse = np.unique(lengths, return_inverse=True)
    if len(distinct) * 8 > n:
        mv = memoryview(buf)
        return list(map(bytes, map(mv.__getitem__, map(slice, at.tolist(), (at + lengths).tolist()))))
    out = np.empty(n, object)
    for index, width in enumerate(distinct.tolist()):
        rows = np.flatnonzero(inverse == index)
        if width == 0:
            out[rows] = b""
        else:
            out[rows] = gather_rows(arr, at[rows], width).view(f"V{width}").ravel().astype(object)
    return out.tolist()


def text_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray,
                groups: np.ndarray | None = None, empty: str | None = "") -> list[str | Undecodable | None]:
    """The utf-8 text at ``at`` (``lengths`` bytes) of every record, ``empty`` where there is
    none, :data:`UNDECODABLE` where it is not valid utf-8. ``groups`` (e.g. tag hashes) says
    which records likely share a value: when few values are distinct, each is decoded once and
    the others are only compared with it (vectorised, so a hash collision or a wrong hash costs
    speed, never correctness)."""
    n = len(at)
    if n == 0:
        return []
    at = np.asarray(at, np.int64)
    lengths = np.asarray(lengths, np.int64)
    arr = np.frombuffer(buf, np.uint8)
    if not lengths.any():
        return [empty] * n
    keys = lengths if groups is None else groups
    inverse: np.ndarray | None = None
    first: np.ndarray | list[int] = [0]
    if not (keys == keys[0]).all():
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        if len(distinct) * _DISTINCT_TEXTS_MAX_FRACTION > n:
            inverse = first = None  # type: ignore[assignment]
    if first is not None:
        rep = first[inverse] if inverse is not None else 0
        same = bool((lengths == lengths[rep]).all())
        width = int(lengths.max())
        if same and width and inverse is None:
            same = _all_alike(arr, at, width)
        elif same and width:
            rows = _windows(arr, at, width)
            if (lengths != width).any():
                rows = np.where(np.arange(width) < lengths[:, None], rows, 0)
            same = bool((rows == rows[rep]).all())
        if same:
            decoded = _Decoded(empty)
            values = [decoded[bytes(arr[a: a + length])] for a, length in
                      zip(at[first].tolist(), lengths[first].tolist(), strict=True)]
            if inverse is None:
                return values * n
            return np.array(values, object)[inverse].tolist()
    decoded = _Decoded(empty)
    return list(map(decoded.__getitem__, bytes_column(buf, at, lengths)))


def _all_alike(arr: np.ndarray, at: np.ndarray, width: int) -> bool:
    """Whether ``arr[a: a + width]`` is the same bytes for every ``a`` of ``at``. When ``at``
    steps evenly, 8 bytes of every record are compared at a time (one strided uint64 column
    each, so a topic costs one or a few vectorised compares); else the rows are gathered."""
    n = len(at)
    first = int(at[0])
    step = int(at[1]) - first if n > 1 else 0
    if step > 0 and first + (n - 1) * step + -(-width // 8) * 8 <= len(arr) and (np.diff(at) == step).all():
        for offset in range(0, width, 8):
            words = np.ndarray((n,), "<u8", arr, first + offset, (step,))
            differ = words ^ words[0]
            if width - offset < 8:  # the bytes past the field are not compared
                differ &= np.uint64((1 << (8 * (width - offset))) - 1)
            if differ.any():
                return False
        return True
    rows = gather_rows(arr, at, width)
    return bool((rows == rows[0]).all())


def _windows(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``arr[a: a + width]`` for every ``a`` of ``at``, as rows: a strided view when ``at`` steps
    evenly (records of one size), else a gathered copy (zeros past the end of ``arr``)."""
    if len(at) > 1:
        step = int(at[1] - at[0])
        if step > 0 and (np.diff(at) == step).all() and int(at[-1]) + width <= len(arr):
            return np.ndarray((len(at), width), np.uint8, arr, int(at[0]), (step, 1))
    return gather_rows(arr, at, width)


def keys_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray) -> list[tuple[str, ...] | Undecodable]:
    """:func:`decode_keys` of the keys field of every record (split in C), :data:`UNDECODABLE`
    where they are not valid utf-8."""
    n = len(at)
    lengths = np.asarray(lengths, np.int64)
    present = np.flatnonzero(lengths)
    if len(present) == 0:
        return [()] * n
    joined = _decoded_joined(np.frombuffer(buf, np.uint8), np.asarray(at, np.int64)[present], lengths[present])
    keys: list[tuple[str, ...] | Undecodable]
    if joined is not None and not (joined[1] == ord(KEY_SEPARATOR)).any():  # one key each
        keys = list(zip(joined[0]))
    elif joined is not None:
        keys = list(map(tuple, map(str.split, joined[0], repeat(KEY_SEPARATOR))))
    else:  # some are not utf-8 (or every joiner occurs in them): one by one
        raw = bytes_column(buf, np.asarray(at, np.int64)[present], lengths[present])
        keys = [decode_keys(r) if _is_utf8(r) else UNDECODABLE for r in raw]
    if len(present) == n:
        return keys
    out: list[tuple[str, ...] | Undecodable] = [()] * n
    for index, value in zip(present.tolist(), keys, strict=True):
        out[index] = value
    return out


# Bytes that may stand between fields joined for one decode (ascii: never inside a utf-8
# sequence), tried in turn until one occurs in none of the fields.
_JOINERS = b"\n\x00\x1f\x1e"


def _decoded_joined(arr: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> tuple[list[str], np.ndarray] | None:
    """The utf-8 text of every field (``lengths`` bytes at ``at``) with one ``decode`` and one
    ``split``, and the bytes decoded: the fields are gathered into one buffer (numpy), a joiner
    byte after each. A concatenation with ascii between the fields is valid utf-8 exactly when
    every field is. None when some field is not utf-8 or holds every joiner."""
    n = len(at)
    if n == 0:
        return [], arr[:0]
    spans = lengths + 1
    ends = np.cumsum(spans)
    positions = np.repeat(at - (ends - spans), spans) + np.arange(int(ends[-1]))
    np.minimum(positions, len(arr) - 1, out=positions)  # the last joiner may lie past the buffer
    joined = arr[positions]
    for joiner in _JOINERS:
        joined[ends - 1] = joiner
        if np.count_nonzero(joined == joiner) == n:
            break
    else:
        return None
    try:
        texts = joined.tobytes().decode().split(chr(joiner))
    except UnicodeDecodeError:
        return None
    texts.pop()  # what follows the last joiner: nothing
    return texts, joined


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True
