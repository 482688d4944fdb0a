"""Kafka records <-> gms records (docs/kafka-compat.md, "The mapping").

- the partition is the queue; a record's offset is its queue offset;
- the timestamp (CreateTime) is the record's born time; a fetch answers it as CreateTime;
- a key that is UTF-8 text without a space is the record's gms key; any other key is kept whole in
  the property ``__KAFKA_KEY`` (base64) and answered as it came;
- headers are properties: a value that is UTF-8 text (without the property separators \\x01 and
  \\x02) under its own name, any other value base64 under ``__KAFKA_B64.<name>``; the header
  ``gms.tag`` is the record's tag (so tag subscriptions filter Kafka producers' messages), and a
  fetch answers a tagged record's tag as that header;
- a null value is stored as an empty body (answered as an empty value).

A produce converts record by record here (a Python step per message: docs/kafka-compat.md); a
fetch converts the records without a tag or properties column by column (:mod:`.fetched`) and
the others one by one here.
"""

from __future__ import annotations

import base64
import binascii

from gms.broker.kafka.records import KafkaRecord
from gms.record import Record, encode_record, iter_records
from gms.record.layout import PROP_NAME_VALUE_SEPARATOR, PROP_SEPARATOR

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
    return encode_record(topic=topic, body=record.value or b"", tag=tag, keys=keys, properties=properties,
                         queue_id=queue_id, born_host=born_host, born_ts_ms=record.timestamp_ms or 1)


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
    for name, value in rec.properties.items():
        if name == KEY_PROPERTY:
            key = _unb64(value)
        elif name.startswith(B64_PREFIX):
            headers.append((name[len(B64_PREFIX):], _unb64(value)))
        else:
            headers.append((name, value.encode()))
    if rec.tag:
        headers.append((TAG_HEADER, rec.tag.encode()))
    return KafkaRecord(rec.queue_offset - base_offset, rec.born_ts_ms, key, bytes(rec.body), headers)


def _unb64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        return value.encode()
