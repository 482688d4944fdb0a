"""Differential tests: every fast path of gms.record agrees with the reference codec
(``codec.encode_record`` / ``codec.decode_record``) on random messages and damaged batches.
The producer's batch builder, the broker's batch parser (its record-by-record path and its numpy
path) and the C walk; the consumer's reader is tested the same way in
tests/client/test_message_reader.py, the C checks in test_recordcheck.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.record import (
    HEADER_SIZE,
    Message,
    batch_headers,
    decode_record,
    encode_record,
    header_errors,
    iter_records,
    read_headers,
    scan_records,
)
from gms.record.batch import VECTORISE_RECORDS_MIN, parse_batch, parse_one
from gms.record.builder import BatchBuilder, RecordEncoder
from gms.store_errors import CorruptRecord, InvalidRecord, StoreError

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=" \x01\x02"), max_size=12)
messages = st.builds(
    Message,
    topic=st.sampled_from(["t", "orders", "a-much-longer.topic_name%1"]),
    body=st.binary(min_size=1, max_size=200),
    tag=st.one_of(st.none(), st.sampled_from(["A", "B", "tag-é"]), text.filter(bool)),
    keys=st.lists(text.filter(bool), max_size=3).map(tuple),
    properties=st.one_of(st.none(), st.dictionaries(text.filter(bool), text, max_size=3)),
)
BODY_MAX = 1 << 20


def _reference(message: Message, queue_id: int, born_host: str, born_ts_ms: int) -> bytes:
    return encode_record(topic=message.topic, body=message.body, tag=message.tag, keys=message.keys,
                         properties=message.properties, queue_id=queue_id, born_host=born_host,
                         born_ts_ms=born_ts_ms)


@settings(max_examples=200)
@given(st.lists(messages, min_size=1, max_size=40), st.integers(0, 7), st.sampled_from(["", "127.0.0.1:5"]))
def test_the_builder_writes_the_reference_bytes(batch, queue_id, born_host):
    encoder = RecordEncoder(born_host)
    builder = BatchBuilder(queue_id)
    for m in batch:
        encoder.add(builder, m.topic, m.body, m.tag, m.keys, m.properties)
    expected = b"".join(_reference(m, queue_id, born_host, builder.born_ts_ms) for m in batch)
    assert bytes(builder.seal()) == expected
    assert b"".join(builder.seal_requests(300)) == expected  # split under a size, in order


@settings(max_examples=200)
@given(st.lists(messages, min_size=1, max_size=2 * VECTORISE_RECORDS_MIN))
def test_the_batch_parser_reads_what_the_reference_decodes(batch):
    buf = b"".join(_reference(m, i % 3, "", 1) for i, m in enumerate(batch))
    parsed = parse_batch(memoryview(buf), BODY_MAX)  # record by record below VECTORISE_RECORDS_MIN, numpy above
    decoded = list(iter_records(buf))
    assert [parsed.topics[i] for i in parsed.topic_index] == [r.topic for r in decoded]
    assert parsed.starts.tolist() == list(np.cumsum([0] + [r.total_size for r in decoded[:-1]]))
    names = ("total_size", "magic", "crc32", "queue_id", "flags", "born_ts_ms", "tag_hash", "reconsume_times")
    for header, record in zip(parsed.headers, decoded, strict=True):
        assert [int(header[name]) for name in names] == [getattr(record, name) for name in names]
    assert scan_records(buf).starts.tolist() == parsed.starts.tolist()
    if len(batch) == 1:
        one = parse_one(memoryview(buf), BODY_MAX)
        assert (one.topic, one.queue_id, one.size, one.tag_hash) == (
            decoded[0].topic, decoded[0].queue_id, decoded[0].total_size, decoded[0].tag_hash)


@pytest.mark.parametrize("order", ["runs", "interleaved"])
def test_the_batch_parser_groups_many_topics(order):
    """A send of many topics' batches (each topic's records in a row, or mixed): every record's
    topic is found, the distinct ones once each."""
    names = [f"topic-{i}" * (1 + i % 3) for i in range(50)]  # of several lengths
    topics = [name for name in names for _ in range(4)] if order == "runs" else names * 4
    buf = b"".join(encode_record(topic=topic, body=b"x", born_ts_ms=1) for topic in topics)
    parsed = parse_batch(memoryview(buf), BODY_MAX)
    assert [parsed.topics[i] for i in parsed.topic_index] == topics
    assert sorted(parsed.topics) == sorted(names)


@settings(max_examples=300)
@given(st.lists(messages, min_size=1, max_size=2 * VECTORISE_RECORDS_MIN), st.integers(0, 1 << 30),
       st.integers(0, 7))
def test_a_damaged_batch_is_refused_whenever_the_reference_refuses_it(batch, where, bit):
    buf = bytearray(b"".join(_reference(m, 0, "", 1) for m in batch))
    at = where % len(buf)
    buf[at] ^= 1 << bit
    try:
        list(iter_records(bytes(buf)))
        reference_ok = True
    except (CorruptRecord, InvalidRecord, ValueError, UnicodeDecodeError):
        reference_ok = False
    try:
        parse_batch(memoryview(buf), BODY_MAX)
        parsed_ok = True
    except StoreError:
        parsed_ok = False
    assert parsed_ok == reference_ok, f"bit {bit} of byte {at} flipped: reference ok {reference_ok}"


def test_reference_decode_of_a_builder_record_round_trips_every_field():
    encoder, builder = RecordEncoder("host:1"), BatchBuilder(3)
    encoder.add(builder, "orders", b"body", "TagA", ("k1", "k2"), {"p": "v"})
    record = decode_record(bytes(builder.seal()))
    assert (record.topic, record.tag, record.keys, record.properties, bytes(record.body), record.born_host) == (
        "orders", "TagA", ("k1", "k2"), {"p": "v"}, b"body", "host:1")


@pytest.mark.parametrize("count", [1, VECTORISE_RECORDS_MIN - 1, VECTORISE_RECORDS_MIN, 100])
def test_both_parser_paths_refuse_a_bad_crc(count):
    buf = bytearray(b"".join(_reference(Message("t", b"x" * 10), 0, "", 1) for _ in range(count)))
    buf[-1] ^= 1
    with pytest.raises(CorruptRecord):
        parse_batch(memoryview(buf), BODY_MAX)


@pytest.mark.parametrize("byte", [None, *range(HEADER_SIZE)])
@settings(max_examples=15)
@given(st.lists(messages, min_size=1, max_size=40), st.integers(0, 39), st.integers(0, 7), st.integers(-100, 100))
def test_batch_headers_agrees_with_the_numpy_checks(byte, batch, which, bit, shift):
    """The C header pass (the append's and the consumer's) against the vectorised reference:
    a bit flipped in each byte of a header (no CRC stands in the way: the starts are given), or
    (``byte`` None) a start moved anywhere in or out of the buffer."""
    buf = bytearray(b"".join(_reference(m, 0, "", 1) for m in batch))
    starts = np.cumsum([0] + [len(_reference(m, 0, "", 1)) for m in batch[:-1]]).astype(np.int64)
    if byte is None:
        starts[which % len(starts)] += shift
    else:
        buf[starts[which % len(starts)] + byte] ^= 1 << bit
    got = batch_headers(bytes(buf), starts)
    arr = np.frombuffer(bytes(buf), np.uint8)
    inside = (starts >= 0) & (starts + HEADER_SIZE <= len(arr))
    headers = read_headers(arr, np.where(inside, starts, 0))
    bad = ~inside | header_errors(headers) | (starts + headers["total_size"].astype(np.int64) > len(arr))
    first_bad = int(np.flatnonzero(bad)[0]) if bad.any() else -1
    assert got.first_bad == first_bad
    if first_bad >= 0:
        assert not got.headers[first_bad:].tobytes().strip(b"\0")
        return
    assert got.headers.tobytes() == headers.tobytes()
    decoded = [decode_record(bytes(buf), int(s), verify_crc=False) for s in starts]
    assert got.same_topic == (len({r.topic for r in decoded}) == 1)
    assert got.same_tag == (len({r.tag for r in decoded}) == 1)
    assert got.body_max == max(len(r.body) for r in decoded)
