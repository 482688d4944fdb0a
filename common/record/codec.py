"""The reference codec: one record at a time, every field checked (producers of tests and tools,
the decoder of the CLI and of message lookups). The fast paths in builder, checks, columns and batch
must agree with it (tests/store/test_record_paths.py and the tests it names)."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from isal.isal_zlib import crc32  # zlib's CRC-32 (same values), ~6x faster on small records

from gms.naming import TOPIC_NAME_BYTES_MAX, validate_topic_name
from gms.record.layout import (
    BLANK_MAGIC,
    BLANK_MARKER_SIZE,
    BORN_HOST_BYTES_MAX,
    HEADER,
    HEADER_SIZE,
    KEY_SEPARATOR,
    KEYS_BYTES_MAX,
    MAGIC_V1,
    OFF_CRC,
    OFF_CRC_START,
    OFF_QUEUE_ID,
    OFFSETS,
    PROP_NAME_VALUE_SEPARATOR,
    PROP_SEPARATOR,
    PROPS_BYTES_MAX,
    RECORD_BYTES_MAX,
    SEQUENCE_PROPERTY,
    TAG_BYTES_MAX,
    RecordCheck,
    tag_hash,
)
from gms.store_errors import CorruptRecord, InvalidRecord

_SIZE_MAGIC = struct.Struct(">iI")
_BROKER_FIELDS = struct.Struct(">iqqq")  # queue_id .. store_ts_ms
assert _BROKER_FIELDS.size == OFF_CRC_START - OFF_QUEUE_ID


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
    result.pop(SEQUENCE_PROPERTY, None)  # the idempotent producer's stamp, for the brokers only
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

