"""The C conversions of the Kafka adapter (gms.broker.kafka._convert) against the record-by-record
reference of gms.broker.kafka.convert: a produce's Kafka batches to gms records (keys, null keys
and values, headers, the gms.tag header, timestamps, several batches, every compression, send
bodies split at their limit, malformed batches) and stored gms records to a fetch's batch."""

from __future__ import annotations

import re
import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.broker.kafka import _convert
from gms.broker.kafka.convert import from_gms, gms_bodies, to_gms
from gms.broker.kafka.fetched import _converted, fetched_batch
from gms.broker.kafka.records import (
    BATCH_HEADER,
    CorruptBatch,
    KafkaRecord,
    decode_batch,
    encode_batch,
    open_batch,
    split_batches,
    wrap_batch,
)
from gms.errors import GmsError
from gms.record import decode_record, encode_record
from gms.record.codec import seal_crc
from gms.record.layout import FLAG_SEQUENCED, HEADER, HEADER_SIZE, MAGIC_V1, OFF_QUEUE_OFFSET, SEQUENCE_PROPERTY
from gms.store_errors import CorruptRecord

from .test_kafka_codec import _recompressed

COMPRESSIONS = [(1, cramjam.gzip.compress), (2, cramjam.snappy.compress_raw), (3, cramjam.lz4.compress),
                (4, cramjam.zstd.compress)]
KEYS = st.one_of(st.none(), st.just(b""), st.binary(max_size=20), st.text("ab c\x01é\t", max_size=12).map(str.encode),
                 st.text("abcXYZ09-_.:", min_size=1, max_size=30).map(str.encode))
HEADER_NAMES = st.sampled_from(["h", "h", "gms.tag", "ü", "x y", "", "a\x01", "__KAFKA_KEY", "__KAFKA_B64.h"])
HEADER_VALUES = st.one_of(st.none(), st.binary(max_size=8), st.sampled_from([b"", b"T", b"a\x02b", "é".encode()]),
                          st.text("ab\x01\x00 ", max_size=5).map(str.encode))
HEADERS = st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4)
RECORDS = st.lists(st.tuples(KEYS, st.one_of(st.none(), st.binary(max_size=200)),
                             st.one_of(st.just([]), st.just([]), HEADERS), st.integers(-(1 << 20), 1 << 20)),
                   min_size=1, max_size=30)


def _batch(base_ts: int, rows: list, codec: int | None = None) -> bytes:
    records = [KafkaRecord(i, base_ts + ts, key, value, headers) for i, (key, value, headers, ts) in enumerate(rows)]
    batch = encode_batch(0, records)
    compress = dict(COMPRESSIONS).get(codec) if codec else None
    return _recompressed(batch, codec, compress) if codec and compress else batch


def _reference(topic: str, queue_id: int, data: bytes, client: str, limit: int) -> list[bytes]:
    """The record-by-record conversion, split into send bodies as a produce splits them."""
    bodies: list[bytes] = []
    for raw in split_batches(memoryview(data)):
        for record in decode_batch(raw).records:
            encoded = to_gms(topic, queue_id, record, client)
            if bodies and len(bodies[-1]) + len(encoded) <= limit:
                bodies[-1] += encoded
            else:
                bodies.append(encoded)
    return bodies


def _in_c(topic: str, queue_id: int, data: bytes, client: str, limit: int) -> list[bytes]:
    chunks: list[bytearray] = []

    def convert(delta, ts, key, value, headers):
        return to_gms(topic, queue_id, KafkaRecord(delta, ts, key, value, headers), client)

    for raw in split_batches(memoryview(data)):
        _, records, count, base_ts = open_batch(raw)
        assert _convert.to_gms(records, count, base_ts, topic.encode(), queue_id, client.encode(), limit, convert,
                               chunks)
    return [bytes(chunk) for chunk in chunks]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 42), RECORDS, st.sampled_from([None, None, 1, 2, 3, 4])),
                min_size=1, max_size=3),
       st.integers(0, 1 << 30), st.sampled_from([150, 1000, 1 << 20]))
def test_a_produce_converted_in_c_is_the_record_by_record_conversion(batches, queue_id, limit):
    data = b"".join(_batch(base_ts, rows, codec) for base_ts, rows, codec in batches)
    assert _outcome(_in_c, data, queue_id, limit) == _outcome(_reference, data, queue_id, limit)


def _outcome(convert, data: bytes, queue_id: int, limit: int) -> object:
    """The send bodies, or the error (a record no gms record can hold: an empty header name ...)."""
    try:
        return convert("orders", queue_id, data, "10.0.0.9:4242", limit)
    except GmsError as err:
        return type(err), str(err)


def test_plain_records_are_converted_in_c_and_the_others_by_the_mapping():
    rows = [(b"k1", b"v", [], 0), (None, None, [], 1), (b"two words", b"w", [], 2), (b"k", b"h", [("a", b"1")], 3),
            (b"\xff", b"b", [("gms.tag", b"T")], 4)]
    raw = split_batches(memoryview(_batch(1_700_000_000_000, rows)))[0]
    _, records, count, base_ts = open_batch(raw)
    seen: list[tuple] = []

    def convert(*fields):
        seen.append(fields)
        return to_gms("t", 0, KafkaRecord(*fields), "h")

    chunks: list[bytearray] = []
    assert _convert.to_gms(records, count, base_ts, b"t", 0, b"h", 1 << 20, convert, chunks)
    assert [fields[2] for fields in seen] == [None, b"\xff"]  # a null value and a key not ASCII: mapped in Python
    decoded = [decode_record(chunks[0], pos) for pos in _starts(chunks[0])]
    assert [(r.keys, bytes(r.body), r.tag, r.born_ts_ms) for r in decoded] == [
        (("k1",), b"v", None, 1_700_000_000_000), ((), b"", None, 1_700_000_000_001),
        ((), b"w", None, 1_700_000_000_002), (("k",), b"h", None, 1_700_000_000_003),
        ((), b"b", "T", 1_700_000_000_004)]
    assert [r.properties for r in decoded[1:]] == [{"__TOMBSTONE": "1"}, {"__KAFKA_KEY": "dHdvIHdvcmRz"}, {"a": "1"},
                                                   {"__KAFKA_KEY": "/w=="}]


@pytest.mark.parametrize("key, headers, in_c", [
    (b"k", [("a", b"1"), ("b", None), ("c", b"")], True),
    (b"k", [("bin", b"\x00\x01\x7f")], True),  # base64 under __KAFKA_B64.bin
    (b"two words", [], True),  # base64 under __KAFKA_KEY
    (b"", [], True),
    (b"k", [("a", b"1"), ("a", b"2")], False),  # repeated: the last value, in the first one's place
    (b"k", [("a", "é".encode())], False),
    (b"k", [("é", b"1")], False),
    (b"k", [("gms.tag", b"T")], False),
    (b"k", [(f"h{i}", b"v") for i in range(33)], False),
    (b"k", [("h", b"v" * 0x10000)], False),  # properties past their limit: refused
    (b"k" * 0x10000, [], False),  # a gms key past its limit: refused
    (b" " * 0xC000, [], False),  # its base64 past the properties' limit: refused
], ids=["text", "binary", "key-with-space", "key-empty", "repeated", "value-not-ascii", "name-not-ascii", "tag",
        "33-headers", "props-too-long", "key-too-long", "key-property-too-long"])
def test_which_headers_and_keys_are_mapped_in_c(key, headers, in_c):
    data = _batch(1_700_000_000_000, [(key, b"v", headers, 0)])
    raw = split_batches(memoryview(data))[0]
    _, records, count, base_ts = open_batch(raw)
    seen: list[tuple] = []

    def convert(*fields):
        seen.append(fields)
        return to_gms("t", 0, KafkaRecord(*fields), "h")

    try:
        expected: object = _reference("t", 0, data, "h", 1 << 22)
    except GmsError as err:
        expected = type(err)
    try:
        chunks: list[bytearray] = []
        assert _convert.to_gms(records, count, base_ts, b"t", 0, b"h", 1 << 22, convert, chunks)
        got: object = [bytes(chunk) for chunk in chunks]
    except GmsError as err:
        got = type(err)
    assert got == expected
    assert (seen == []) == in_c


def test_a_timestamp_of_zero_is_stored_as_1_as_the_mapping_does():
    data = _batch(0, [(None, b"v", [], 0), (b"k", b"v", [], -5)])
    assert _in_c("t", 0, data, "h", 1 << 20) == _reference("t", 0, data, "h", 1 << 20)


@pytest.mark.parametrize("records", [
    b"\x02",  # a record of 1 byte: cut short
    b"\x7f" + b"\x00" * 4,  # a length past the end
    b"\x10\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # a value length of 11 varint bytes
    b"\x0c\x00\x00\x00\x01\x0a\x00\x02\x02\xff\x00\x00",  # a value running past its record
    b"\x0e\x00\x00\x00\x01\x00\x02\x02\xff\x01\x00\x00\x00\x00",  # a header key that is not UTF-8
    b"\x10\x00\x00\x00\x01\x00\x02\x01\x01",  # a header key that is null
    b"\x0e\x00\x00\x00\x01\x00\x00\x00",  # a record longer than its fields
    b"\x0c\x00\x00\x00\x01\x00\x00\x00",  # bytes after the last record
], ids=["cut-short", "length-past-end", "varint-too-long", "field-past-record", "header-key-not-utf8",
        "header-key-null", "record-too-long", "trailing-bytes"])
def test_a_batch_c_does_not_take_raises_the_reference_error(records):
    batch = wrap_batch(0, records, 1, 0, 0, 0)
    _, raw, count, base_ts = open_batch(memoryview(batch))
    chunks: list[bytearray] = []
    assert not _convert.to_gms(raw, count, base_ts, b"t", 0, b"h", 1 << 20, _never, chunks)
    assert chunks == []
    with pytest.raises(CorruptBatch) as reference:
        decode_batch(memoryview(batch))
    with pytest.raises(CorruptBatch, match=re.escape(str(reference.value))):
        gms_bodies("t", 0, memoryview(batch), "h")


def test_a_timestamp_beyond_64_bits_is_left_to_the_reference():
    records = b"\x1e\x00" + b"\xff" * 9 + b"\x02" + b"\x00\x01\x01\x00"  # decodes, but no gms record holds it
    batch = wrap_batch(0, records, 1, 0, 0, 0)
    _, raw, count, base_ts = open_batch(memoryview(batch))
    assert not -(1 << 63) <= decode_batch(memoryview(batch)).records[0].timestamp_ms < 1 << 63
    assert not _convert.to_gms(raw, count, base_ts, b"t", 0, b"h", 1 << 20, _never, [])
    with pytest.raises(struct.error):
        gms_bodies("t", 0, memoryview(batch), "h")


def _never(*fields):
    raise AssertionError(f"converted {fields}")


@pytest.mark.parametrize("topic, client", [("t" * 200, "h"), ("a b", "h"), ("t", "h" * 300)])
def test_a_topic_or_client_no_gms_record_holds_fails_as_the_mapping_does(topic, client):
    data = memoryview(_batch(5, [(b"k", b"v", [], 0)]))
    with pytest.raises(GmsError) as reference:
        to_gms(topic, 0, decode_batch(split_batches(data)[0]).records[0], client)
    with pytest.raises(type(reference.value), match=re.escape(str(reference.value))):
        gms_bodies(topic, 0, data, client)


@pytest.mark.parametrize("size", [0xFFFF, 0x10000])
def test_a_key_at_and_past_the_keys_limit(size):
    data = memoryview(_batch(5, [(b"k" * size, b"v", [], 0)]))
    try:
        expected: object = _reference("t", 0, bytes(data), "h", 1 << 22)
    except GmsError as err:
        expected = type(err)
    try:
        got: object = [bytes(body) for body in gms_bodies("t", 0, data, "h")]
    except GmsError as err:
        got = type(err)
    assert got == expected


def _starts(buf: bytes | bytearray) -> list[int]:
    starts, pos = [], 0
    while pos < len(buf):
        starts.append(pos)
        pos += struct.unpack_from(">i", buf, pos)[0]
    return starts


def _stored(records: list[bytes], first_offset: int) -> bytearray:
    buf = bytearray()
    for i, record in enumerate(records):
        one = bytearray(record)
        struct.pack_into(">q", one, OFF_QUEUE_OFFSET, first_offset + i)
        buf += one
    return buf


def test_a_fetch_converts_every_kind_of_stored_record_as_the_reference():
    stored = _stored([
        encode_record(topic="t", body=b"", born_ts_ms=9),
        encode_record(topic="t", body=b"v", keys=("a", "b"), born_host="h:1", born_ts_ms=3),
        encode_record(topic="t", body=b"s", flags=FLAG_SEQUENCED, properties={SEQUENCE_PROPERTY: "1"}, born_ts_ms=4),
        encode_record(topic="t", body=b"t", tag="T", born_ts_ms=1 << 41),
        encode_record(topic="t", body=b"k", properties={"__KAFKA_KEY": "/w==", "__KAFKA_B64.h": "AA=="}),
        encode_record(topic="t", body=b"x" * 70_000, keys=("k" * 300,), born_ts_ms=7)], 1 << 33)
    cut = _starts(stored)[3]
    views = [memoryview(stored)[:cut], memoryview(stored)[cut:]]
    assert fetched_batch(views) == encode_batch(*from_gms(views))
    records = decode_batch(memoryview(bytes(fetched_batch(views)))).records
    assert [(r.key, r.headers) for r in records[2:5]] == [
        (None, []), (None, [("gms.tag", b"T")]), (b"\xff", [("h", b"\x00")])]


def _raw_record(props: bytes, tag: bytes = b"", keys: bytes = b"k") -> bytes:
    """A stored record with these fields as they are (the encoder checks them)."""
    topic, host, body = b"t", b"h", b"v"
    total = HEADER_SIZE + len(topic) + len(tag) + len(host) + len(keys) + len(props) + len(body)
    record = bytearray(HEADER.pack(total, MAGIC_V1, 0, 0, 0, 0, 0, 0, 3, 0, 0, len(body), len(topic), len(tag),
                                   len(host), 0, len(keys), len(props)) + topic + tag + host + keys + props + body)
    seal_crc(record)
    return bytes(record)


STAMP = f"{SEQUENCE_PROPERTY}\x010000000000000001.00000000.0000000000000000.00000002\x02".encode()


@pytest.mark.parametrize("record, in_c", [
    (_raw_record(STAMP), True),
    (_raw_record(f"{SEQUENCE_PROPERTY}\x01a\x01b\x02".encode()), True),  # one property still
    (_raw_record(b"p\x011\x02" + STAMP + b"q\x01\x02"), True),
    (_raw_record(STAMP, tag=b"T"), True),
    (_raw_record("p\x01é\x02é\x01x\x02".encode(), tag="é".encode()), True),
    (_raw_record(b"\x01v\x02"), True),  # an empty name: a header with an empty key
    (_raw_record(b"__KAFKA_KEY\x01/w==\x02"), False),
    (_raw_record(b"__KAFKA_B64.h\x01AA==\x02"), False),
    (_raw_record("__KAFKA_KEY\x01é\x02".encode()), False),  # not base64: the text itself
    (_raw_record(b"p\x011\x02p\x012\x02"), False),  # repeated: the last value, in the first one's place
    (_raw_record(b"__TOMBSTONE\x011\x02"), False),  # a tombstone: a null value
    (_raw_record(b"".join(b"p%d\x01v\x02" % i for i in range(33))), False),
], ids=["stamp", "stamp-with-separator", "stamp-among-others", "stamp-and-tag", "not-ascii", "empty-name", "key",
        "base64", "key-not-base64", "repeated", "tombstone", "33-properties"])
def test_which_stored_records_are_answered_in_c(record, in_c):
    views = [memoryview(_stored([record], 5))]
    converted: list[int] = []

    def convert(view, pos, base_offset, base_ts):
        converted.append(pos)
        return _converted(view, pos, base_offset, base_ts)

    _convert.to_kafka(views, convert)
    assert (converted == []) == in_c
    assert fetched_batch(views) == encode_batch(*from_gms(views))


@pytest.mark.parametrize("record", [
    _raw_record(b"p\x011"), _raw_record(b"p1\x02"), _raw_record(b"\x02"), _raw_record(b"p\x01\xff\x02"),
    _raw_record(b"", tag=b"\xed\xa0\x80"), _raw_record(b"", keys=b"\xc0\x80"),
    _raw_record(b"", tag=b"\xf4\x90\x80\x80"),
], ids=["no-end", "no-separator", "empty-item", "value-not-utf8", "tag-surrogate", "key-overlong", "tag-past-unicode"])
def test_a_stored_record_the_decoder_refuses_is_refused_as_the_reference_does(record):
    views = [memoryview(_stored([record], 5))]
    with pytest.raises(CorruptRecord):
        from_gms(views)
    with pytest.raises(CorruptRecord):
        fetched_batch(views)


PROPERTY_NAMES = st.sampled_from(["p", "é", "x y", "__KAFKA_KEY", "__KAFKA_B64.h", SEQUENCE_PROPERTY])
PROPERTY_VALUES = st.one_of(st.text("ab é=/+", max_size=8), st.sampled_from(["AA==", "/w==", "YQ", "*"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(PROPERTY_NAMES, PROPERTY_VALUES, max_size=4), st.sampled_from([None, "é"]),
                          st.lists(st.text("ab", min_size=1, max_size=3), max_size=2), st.binary(max_size=30),
                          st.integers(1, 1 << 42)), min_size=1, max_size=12))
def test_a_fetch_in_c_is_the_record_by_record_conversion(rows):
    records = [encode_record(topic="t", body=body, tag=tag, keys=keys, properties=props, born_ts_ms=born)
               for props, tag, keys, body, born in rows]
    stored = _stored(records, 1 << 20)
    cut = _starts(stored)[len(records) // 2]
    views = [memoryview(stored)[:cut], memoryview(stored)[cut:]] if cut else [memoryview(stored)]
    assert fetched_batch(views) == encode_batch(*from_gms(views))


def test_a_view_that_does_not_hold_whole_records_is_refused():
    record = encode_record(topic="t", body=b"v", born_ts_ms=1)
    with pytest.raises(ValueError):
        _convert.to_kafka([memoryview(record)[:-1]], _never)
    with pytest.raises(ValueError):
        _convert.to_kafka([memoryview(b"")], _never)
    assert BATCH_HEADER.size == 61  # the room to_kafka leaves for the header


def test_a_record_converted_in_python_may_be_longer_than_the_stored_records():
    """to_kafka writes into a buffer the size of the stored records: a longer answer grows it."""
    plain, other = encode_record(topic="t", body=b"v", born_ts_ms=1), _raw_record(b"__TOMBSTONE\x011\x02")
    views = [memoryview(_stored([plain, other, plain], 5))]
    mapped: list[bytes] = []

    def convert(view, pos, base_offset, base_ts):
        mapped.append(_converted(view, pos, base_offset, base_ts))
        return b"r" * (1 << 20)

    records, count, *_ = _convert.to_kafka(views, convert)
    reference = bytes(fetched_batch(views))
    at = reference.index(mapped[0], BATCH_HEADER.size)
    assert count == 3
    assert bytes(records[BATCH_HEADER.size:]) == (reference[BATCH_HEADER.size:at] + b"r" * (1 << 20)
                                                  + reference[at + len(mapped[0]):])
    with pytest.raises(TypeError):
        _convert.to_kafka(views, lambda view, pos, base_offset, base_ts: "text")
