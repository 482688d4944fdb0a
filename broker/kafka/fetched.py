"""A fetch's stored gms records as one Kafka record batch, without a Python step per message.

The records are laid out in C (``_convert.to_kafka``): each Kafka record's varints (length,
timestamp and offset deltas, key and value lengths), its key and value copied from the stored
bytes, its properties as headers (but an idempotent producer's stamp) and its tag as ``gms.tag``.
A record whose properties the mapping decodes from base64 (a Kafka producer's key that is not
gms's, a header value that is not text), repeats a name or holds more than 32 is converted here
(:func:`gms.broker.kafka.convert.kafka_record`), and so is one the decoder refuses (it raises
here). The record-by-record reference is ``encode_batch(*from_gms(views))``.
"""

from __future__ import annotations

from gms.broker.kafka._convert import to_kafka
from gms.broker.kafka.convert import kafka_record
from gms.broker.kafka.records import encode_records, seal_batch
from gms.record import decode_record


def fetched_batch(views: list[memoryview]) -> bytearray:
    """The Kafka batch of stored gms records (views of one or more adjacent records, in offset
    order, their CRCs checked by the store)."""
    batch, count, base_offset, last_offset, base_ts, max_ts = to_kafka(views, _converted)
    seal_batch(batch, base_offset, count, last_offset - base_offset, base_ts, max_ts)
    return batch


def _converted(view: memoryview, pos: int, base_offset: int, base_ts: int) -> bytes:
    """The Kafka record of the gms record at ``pos``, mapped record by record."""
    return bytes(encode_records([kafka_record(decode_record(view, pos, verify_crc=False), base_offset)], base_ts))
