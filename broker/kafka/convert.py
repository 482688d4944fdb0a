"""Kafka records <-> gms records (docs/kafka-compat.md, "The mapping").

- the partition is the queue; a record's offset is its queue offset;
- the timestamp (CreateTime) is the record's born time; a fetch answers it as CreateTime;
- a key that is UTF-8 text without a space is the record's gms key; any other key is kept whole in
  the property ``__KAFKA_KEY`` (base64) and answered as it came;
- headers are properties: a value that is UTF-8 text (without the property separators \\x01 and
  \\x02) under its own name, any other value base64 under ``__KAFKA_B64.<name>``; the header
  ``gms.tag`` is the record's tag (so tag subscriptions filter Kafka producers' messages), and a
  fetch answers a tagged record's tag as that header;
- a null value (Kafka's tombstone) is stored as an empty body with the property ``__TOMBSTONE``,
  which compacted topics read as the key's deletion (docs/storage-format.md); a record with that
  property is answered with a null value.

A produce converts each batch in C (``_convert.to_gms``, :func:`gms_bodies`) and a fetch the
stored records in C (:mod:`.fetched`); in both, a record the C code does not map (a key or header
that is not ASCII, the ``gms.tag`` header ...; a gms tag or properties) is converted alone here,
and the functions here are the record-by-record reference the C code is tested against.
"""

from __future__ import annotations

import base64

from gms.broker.kafka import _convert
from gms.broker.kafka.records import KafkaRecord, decode_records, open_batch, split_batches
from gms.broker.kafka.wire import Malformed
from gms.errors import GmsError
from gms.naming import validate_topic_name
from gms.protocol.frame import SEND_BODY_SIZE_MAX_BYTES
from gms.record import Record, encode_record, iter_records
from gms.record.layout import BORN_HOST_BYTES_MAX, PROP_NAME_VALUE_SEPARATOR, PROP_SEPARATOR, TOMBSTONE_PROPERTY

TAG_HEADER = "gms.tag"
KEY_PROPERTY = "__KAFKA_KEY"
B64_PREFIX = "__KAFKA_B64."
_SEPARATORS = (PROP_NAME_VALUE_SEPARATOR, PROP_SEPARATOR)


def _text(raw: bytes) -> str | None:
    """``raw`` as a property's text, None if it cannot be one."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    return None if any(sep in text for sep in _SEPARATORS) else text


def to_gms(topic: str, queue_id: int, record: KafkaRecord, born_host: str) -> bytes:
    """One gms record (InvalidRecord / MessageIllegalError: it cannot be one)."""
    properties: dict[str, str] = {}
    tag: str | None = None
    for name, value in record.headers:
        if name == TAG_HEADER and value:
            tag = value.decode(errors="replace")
            continue
        raw = value or b""
        text = _text(raw)
        if text is None:
            properties[B64_PREFIX + name] = base64.b64encode(raw).decode()
        else:
            properties[name] = text
    keys: tuple[str, ...] = ()
    key = record.key
    if key is not None:
        text = _text(key)
        if text and " " not in text:
            keys = (text,)
        else:
            properties[KEY_PROPERTY] = base64.b64encode(key).decode()
    if record.value is None:
        properties[TOMBSTONE_PROPERTY] = "1"
    return encode_record(topic=topic, body=record.value or b"", tag=tag, keys=keys, properties=properties,
                         queue_id=queue_id, born_host=born_host, born_ts_ms=record.timestamp_ms or 1)


def gms_bodies(topic: str, queue_id: int, data: memoryview | None, client: str) -> list[bytearray]:
    """A partition's batches as gms records, in send bodies of at most SEND_BODY_SIZE_MAX_BYTES
    (a larger record alone). Malformed: a batch does not decode; GmsError: a record cannot be a
    gms record. Each batch is converted in C, the records it does not map by :func:`to_gms`; a
    batch it does not take (a malformed one), and every batch when the topic or client name is
    no gms record's (to_gms raises why), goes record by record through the reference."""
    if not data:
        raise Malformed("a partition without records")
    names = _names(topic, client)
    chunks: list[bytearray] = []

    def convert(delta: int, ts: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes | None]]) -> bytes:
        return to_gms(topic, queue_id, KafkaRecord(delta, ts, key, value, headers), client)

    for batch in split_batches(data):
        _, raw, count, base_ts = open_batch(batch)
        if names is not None and _convert.to_gms(raw, count, base_ts, names[0], queue_id, names[1],
                                                 SEND_BODY_SIZE_MAX_BYTES, convert, chunks):
            continue
        for record in decode_records(raw, count, base_ts):
            encoded = to_gms(topic, queue_id, record, client)
            if chunks and len(chunks[-1]) + len(encoded) <= SEND_BODY_SIZE_MAX_BYTES:
                chunks[-1] += encoded
            else:
                chunks.append(bytearray(encoded))
    if not chunks:
        raise Malformed("a batch without records")
    return chunks


def _names(topic: str, client: str) -> tuple[bytes, bytes] | None:
    """The topic and born host as a gms record holds them; None if they cannot be."""
    host = client.encode()
    try:
        validate_topic_name(topic)
    except GmsError:
        return None
    return (topic.encode(), host) if len(host) <= BORN_HOST_BYTES_MAX else None


def from_gms(views: list[memoryview]) -> tuple[int, list[KafkaRecord]]:
    """The Kafka records of stored gms records (views of one or more adjacent records, in offset
    order, CRCs checked by the store): the first one's offset, and each with its delta from it.
    The reference the vectorised conversion (:mod:`.fetched`) is tested against."""
    records = [rec for view in views for rec in iter_records(view, verify_crc=False)]
    base = records[0].queue_offset
    return base, [kafka_record(rec, base) for rec in records]


def kafka_record(rec: Record, base_offset: int) -> KafkaRecord:
    """The Kafka record of a decoded gms record (its offset delta from ``base_offset``)."""
    headers: list[tuple[str, bytes | None]] = []
    key: bytes | None = " ".join(rec.keys).encode() if rec.keys else None
    body: bytes | None = bytes(rec.body)
    for name, value in rec.properties.items():
        if name == TOMBSTONE_PROPERTY:
            body = None
        elif name == KEY_PROPERTY:
            key = _unb64(value)
        elif name.startswith(B64_PREFIX):
            headers.append((name[len(B64_PREFIX):], _unb64(value)))
        else:
            headers.append((name, value.encode()))
    if rec.tag:
        headers.append((TAG_HEADER, rec.tag.encode()))
    return KafkaRecord(rec.queue_offset - base_offset, rec.born_ts_ms, key, body, headers)


def _unb64(value: str) -> bytes:
    """A property's base64 value decoded; the text itself if it is not base64 (a gms producer's)."""
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        return value.encode()
