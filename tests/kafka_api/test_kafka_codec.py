"""The Kafka adapter's codec without a broker: Apache Kafka's schemas read and written at every
version served, record batches v2 in every compression, and the vectorised conversion of stored
gms records to a Kafka batch against the record-by-record reference."""

from __future__ import annotations

import struct

import cramjam
import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.broker.kafka.apis import SUPPORTED, request_schema, response_schema
from gms.broker.kafka.convert import from_gms
from gms.broker.kafka.fetched import fetched_batch
from gms.broker.kafka.records import (
    BATCH_HEADER,
    CRC_START,
    CorruptBatch,
    KafkaRecord,
    decode_batch,
    encode_batch,
    split_batches,
    wrap_batch,
)
from gms.broker.kafka.wire import Reader, Writer
from gms.record import encode_record
from gms.record.layout import OFF_QUEUE_OFFSET, OFF_STORE_TS


@pytest.mark.parametrize("key", sorted(SUPPORTED))
def test_every_served_version_of_every_schema_reads_back_what_it_writes(key):
    low, high = SUPPORTED[key]
    for version in range(low, high + 1):
        for schema in (request_schema(key), response_schema(key)):
            writer = Writer()
            schema.write(writer, {}, version)  # every field at its default
            value = schema.read(Reader(bytes(writer.buf)), version)
            again = Writer()
            schema.write(again, value, version)
            assert again.buf == writer.buf, (schema.name, version)


def _recompressed(batch: bytes, codec: int, compress) -> bytes:
    """``batch`` with its records compressed by ``codec``, as a producer sends it."""
    header = list(BATCH_HEADER.unpack_from(batch))
    body = bytes(compress(batch[BATCH_HEADER.size:]))
    header[1] = BATCH_HEADER.size - 12 + len(body)
    header[5] |= codec
    out = bytearray(BATCH_HEADER.pack(*header) + body)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[CRC_START:])))
    return bytes(out)


@pytest.mark.parametrize("codec, compress", [
    (1, cramjam.gzip.compress), (2, cramjam.snappy.compress_raw), (3, cramjam.lz4.compress),
    (4, cramjam.zstd.compress)],
    ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_decodes_to_its_records(codec, compress):
    records = [KafkaRecord(i, 1_700_000_000_000 + i, b"k%d" % i if i % 2 else None, b"v" * i,
                           [("h", b"\xff"), ("n", None)]) for i in range(50)]
    batch = _recompressed(encode_batch(7, records), codec, compress)
    (raw,) = split_batches(memoryview(batch))
    decoded = decode_batch(raw)
    assert (decoded.base_offset, decoded.records) == (7, records)
    broken = bytearray(batch)
    broken[-1] ^= 1
    with pytest.raises(CorruptBatch):
        decode_batch(memoryview(bytes(broken)))


def _stored(rows: list[tuple[int, int, bytes, tuple[str, ...], str | None]]) -> bytearray:
    """gms records as a queue stores them: (queue offset, born time, body, keys, tag) each; a
    tagged one carries a property too."""
    buf = bytearray()
    for offset, born, body, keys, tag in rows:
        record = bytearray(encode_record(topic="t", body=body, keys=keys, born_host="10.0.0.1:5", born_ts_ms=born,
                                         tag=tag, properties={"p": "é"} if tag else None))
        struct.pack_into(">q", record, OFF_QUEUE_OFFSET, offset)
        struct.pack_into(">q", record, OFF_STORE_TS, born + 1)
        buf += record
    return buf


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1 << 40),
       st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 1 << 45), st.binary(max_size=300),
                          st.lists(st.text("abcé", min_size=1, max_size=200), max_size=2),
                          st.sampled_from([None, None, None, "T"])), min_size=1, max_size=40),
       st.integers(1, 3))
def test_the_vectorised_conversion_is_the_record_by_record_one(base, rows, parts):
    offsets = [base + sum(gap for gap, *_ in rows[:i + 1]) for i in range(len(rows))]  # gaps: hidden records
    stored = _stored([(offset, born, body, tuple(keys), tag)
                      for offset, (_, born, body, keys, tag) in zip(offsets, rows, strict=True)])
    view = memoryview(stored)
    sizes = [struct.unpack_from(">i", stored, pos)[0] for pos in _starts(stored)]
    cut = max(1, len(sizes) // parts)
    views, pos = [], 0
    for i in range(0, len(sizes), cut):
        size = sum(sizes[i:i + cut])
        views.append(view[pos:pos + size])
        pos += size
    assert fetched_batch(views) == encode_batch(*from_gms(views))


def _starts(buf: bytearray) -> list[int]:
    starts, pos = [], 0
    while pos < len(buf):
        starts.append(pos)
        pos += struct.unpack_from(">i", buf, pos)[0]
    return starts


def test_records_with_a_tag_or_properties_are_converted_with_headers():
    buf = bytearray(encode_record(topic="t", body=b"b", tag="T", properties={"p": "1"}, born_ts_ms=5))
    (record,) = decode_batch(memoryview(fetched_batch([memoryview(buf)]))).records
    assert (record.value, record.headers) == (b"b", [("p", b"1"), ("gms.tag", b"T")])


@pytest.mark.parametrize("records", [
    b"\x02",  # a record of 1 byte: cut short
    b"\x7f" + b"\x00" * 4,  # a length past the end
    b"\x10\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # a value length of 11 varint bytes
    b"\x0c\x00\x00\x00\x01\x0a\x00\x02\x02\xff\x00\x00",  # a value running past its record
    b"\x0e\x00\x00\x00\x01\x00\x02\x02\xff\x01\x00\x00\x00\x00",  # a header key that is not UTF-8
], ids=["cut-short", "length-past-end", "varint-too-long", "field-past-record", "header-key-not-utf8"])
def test_a_batch_whose_crc_holds_but_whose_records_do_not_decode_is_corrupt(records):
    batch = wrap_batch(0, records, 1, 0, 0, 0)
    with pytest.raises(CorruptBatch):
        decode_batch(memoryview(batch))
