"""Decoding PULL bodies into lazy message sequences: producer batches, mixed sizes, CRCs, tags."""

from __future__ import annotations

import struct
from itertools import pairwise

import numpy as np
import pytest

from gms.client.body_decode import decode_fetch_body, decode_pull_body
from gms.client.structs import ReceivedMessages
from gms.record import OFF_QUEUE_OFFSET, Message, encode_batch, encode_record
from gms.store_errors import CorruptRecord
from gms.tags import MATCH_ALL, parse_tag_expression


def _stored(records: bytes) -> bytearray:
    """``records`` with queue offsets 0, 1, ... written in, as the broker stores them."""
    buf = bytearray(records)
    pos, offset = 0, 0
    while pos < len(buf):
        struct.pack_into(">q", buf, pos + OFF_QUEUE_OFFSET, offset)
        pos += struct.unpack_from(">i", buf, pos)[0]
        offset += 1
    return buf


def _batch(count: int, body_size: int, tag: str | None = "A", topic: str = "t") -> bytes:
    return encode_batch([Message(topic, bytes([i % 251]) * body_size, tag=tag) for i in range(count)])


@pytest.mark.parametrize("runs", [
    [(300, 100)],  # one producer batch
    [(40, 100), (30, 7), (2, 50)],  # several batches; a short run may end the body
    [(3, 10), (40, 20)],  # a short run in the middle
    [(1, n) for n in range(1, 40)],  # every size different
])
def test_every_record_is_found_in_order(runs):
    body = _stored(b"".join(_batch(count, size) for count, size in runs))
    got = decode_pull_body(memoryview(body), "P", MATCH_ALL)
    expected = [bytes([i % 251]) * size for count, size in runs for i in range(count)]
    assert [m.body for m in got] == expected
    assert [m.queue_offset for m in got] == list(range(len(expected)))


@pytest.mark.parametrize("sizes", [[100] * 50, [100] * 15 + [80] * 20, list(range(1, 30))])
def test_a_flipped_body_byte_is_a_crc_error(sizes):
    body = _stored(b"".join(_batch(1, size) for size in sizes))
    body[-1] ^= 0xFF  # last byte of the last record's body
    with pytest.raises(CorruptRecord):
        decode_pull_body(memoryview(body), "P", MATCH_ALL)


def test_a_bad_length_is_corrupt():
    body = _stored(_batch(40, 100))
    struct.pack_into(">i", body, 0, 1 << 30)
    with pytest.raises(CorruptRecord):
        decode_pull_body(memoryview(body), "P", MATCH_ALL)


def test_exact_tags_are_compared_whatever_the_topic_length():
    records = [encode_record(topic=topic, tag=tag, body=b"x") for topic, tag in
               [("t", "A"), ("topic-longer", "AB"), ("tt", None), ("t", "B"), ("a-topic", "A"), ("t", "BA")]]
    body = _stored(b"".join(records))
    got = decode_pull_body(memoryview(body), "P", parse_tag_expression("A || B"))
    assert [(m.topic, m.tag) for m in got] == [("t", "A"), ("t", "B"), ("a-topic", "A")]


def test_a_fetch_answer_of_many_topics_gives_each_message_its_own_topic():
    """The topics of a FETCH answer are decoded once per queue's span and checked byte for byte:
    a record whose topic differs from its span's others (a broker's mistake) keeps its own."""
    spans_topics = [[f"topic-{i:04d}"] * 10 for i in range(40)]  # few distinct: decoded per span
    spans_topics[7][1] = "topic-9999"  # one span's record of another topic, of the same length
    spans_topics[9][2] = "t"  # and one of another length
    parts = [_stored(b"".join(encode_record(topic=topic, body=b"x") for topic in topics)) for topics in spans_topics]
    body = memoryview(b"".join(parts))
    bounds = [0, *np.cumsum([len(p) for p in parts]).tolist()]
    got = decode_fetch_body(body, [(start, end, MATCH_ALL) for start, end in pairwise(bounds)], "P",
                            verify_crc=True)
    assert got is not None
    batch, firsts, lasts = got
    assert batch is not None
    assert [[m.topic for m in batch[first:last]] for first, last in zip(firsts, lasts, strict=True)] == spans_topics


def test_messages_are_a_list_like_sequence():
    body = memoryview(_stored(_batch(10, 5)))
    first = decode_pull_body(body, "P", MATCH_ALL)
    head, tail = first.split(4)
    assert (len(head), len(tail)) == (4, 6)
    joined = ReceivedMessages.concat([tail, ReceivedMessages(), head])
    assert len(joined) == 10 and bool(ReceivedMessages()) is False
    assert [m.queue_offset for m in joined] == [4, 5, 6, 7, 8, 9, 0, 1, 2, 3]
    assert (joined[0].queue_offset, joined[6].queue_offset, joined[-1].queue_offset) == (4, 0, 3)
    assert [m.queue_offset for m in joined[5:8]] == [9, 0, 1]
    assert joined == list(tail) + list(head) and ReceivedMessages() == []
    assert [*head, *tail] == first and head + tail == list(first)
    with pytest.raises(IndexError):
        joined[10]
