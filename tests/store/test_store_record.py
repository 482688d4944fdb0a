import struct
import zlib

import pytest

from gms import record as rec
from gms.store_errors import CorruptRecord, InvalidRecord, InvalidTopicName


def test_round_trip_every_field():
    raw = rec.encode_record(topic="orders.eu-1%x_y", body=b"\x00payload\xff", tag="TagA", keys=("k1", "k2"),
                            properties={"a": "1", "unicode": "é"}, queue_id=3, flags=7, born_host="10.0.0.1:5",
                            born_ts_ms=123456, reconsume_times=2)
    buf = bytearray(raw)
    rec.write_broker_fields(buf, 0, 3, 42, 4096, 999)
    r = rec.decode_record(bytes(buf))
    assert (r.total_size, r.magic, r.queue_id, r.queue_offset, r.phys_offset, r.store_ts_ms) == (
        len(raw), rec.MAGIC_V1, 3, 42, 4096, 999)
    assert (r.flags, r.born_ts_ms, r.reconsume_times) == (7, 123456, 2)
    assert (r.topic, r.tag, r.born_host, r.keys) == ("orders.eu-1%x_y", "TagA", "10.0.0.1:5", ("k1", "k2"))
    assert r.properties == {"a": "1", "unicode": "é"}
    assert bytes(r.body) == b"\x00payload\xff"
    assert r.tag_hash == rec.tag_hash("TagA") != 0
    assert r.crc32 == zlib.crc32(raw[rec.OFF_CRC_START:])


def test_no_tag_and_empty_optionals():
    r = rec.decode_record(rec.encode_record(topic="t", body=b"x"))
    assert (r.tag, r.tag_hash, r.keys, r.properties, r.born_host) == (None, 0, (), {}, "")
    assert rec.tag_hash(None) == rec.tag_hash("") == 0


def test_tag_hash_is_signed_xxh64():
    import xxhash
    for tag in ("a", "TagA", "x" * 200):
        h = rec.tag_hash(tag)
        assert -(1 << 63) <= h < (1 << 63)
        assert h % (1 << 64) == xxhash.xxh64_intdigest(tag.encode())


def test_batch_and_iter_records():
    msgs = [rec.Message("t", b"m%d" % i, tag="x" if i % 2 else None, queue_id=i) for i in range(5)]
    decoded = list(rec.iter_records(rec.encode_batch(msgs)))
    assert [bytes(r.body) for r in decoded] == [b"m%d" % i for i in range(5)]
    assert [r.queue_id for r in decoded] == list(range(5))


def test_header_layout_asserted():
    assert rec.HEADER_SIZE == 76 and rec.HEADER_DTYPE.itemsize == 76
    assert rec.OFFSETS["keys_len"] == 72


@pytest.mark.parametrize("mutate", ["crc", "magic", "total_small", "total_big", "topic_len", "body_len"])
def test_decode_rejects_corruption(mutate):
    buf = bytearray(rec.encode_record(topic="t", body=b"hello"))
    if mutate == "crc":
        buf[-1] ^= 0xFF
    elif mutate == "magic":
        buf[5] ^= 1
    elif mutate == "total_small":
        struct.pack_into(">i", buf, 0, 10)
    elif mutate == "total_big":
        struct.pack_into(">i", buf, 0, len(buf) + 1)
    elif mutate == "topic_len":
        buf[68] = 0
    elif mutate == "body_len":
        struct.pack_into(">i", buf, 64, 4)
    with pytest.raises(CorruptRecord):
        rec.decode_record(bytes(buf))
    assert rec.check_record(bytes(buf), 0)[0] in (rec.RecordCheck.CORRUPT, rec.RecordCheck.TRUNCATED)


def test_check_record_outcomes():
    raw = rec.encode_record(topic="t", body=b"hello")
    assert rec.check_record(raw + bytes(20), 0) == (rec.RecordCheck.OK, len(raw))
    assert rec.check_record(raw[:-1], 0)[0] is rec.RecordCheck.TRUNCATED
    assert rec.check_record(bytes(64), 0)[0] is rec.RecordCheck.EMPTY
    blank = struct.pack(">iI", 16, rec.BLANK_MAGIC) + bytes(8)
    assert rec.check_record(blank, 0) == (rec.RecordCheck.BLANK, 16)
    assert rec.check_record(blank + bytes(4), 0)[0] is rec.RecordCheck.CORRUPT  # blank must fill the end


def test_scan_stops_at_first_bad_crc():
    records = [rec.encode_record(topic="t", body=b"r%d" % i) for i in range(4)]
    buf = bytearray(b"".join(records))
    buf[len(records[0]) + len(records[1]) + 77] ^= 1  # record 2's body (CRC-covered)
    scan = rec.scan_records(bytes(buf))
    assert len(scan.starts) == 2 and scan.stop is rec.RecordCheck.CORRUPT
    assert scan.stop_pos == len(records[0]) + len(records[1])


def test_properties_and_keys_codecs():
    assert rec.decode_properties(rec.encode_properties({"a": "b", "c": ""})) == {"a": "b", "c": ""}
    assert rec.decode_keys(rec.encode_keys(["x", "y"])) == ("x", "y")
    with pytest.raises(InvalidRecord):
        rec.encode_keys(["has space"])
    with pytest.raises(InvalidRecord):
        rec.encode_properties({"a\x01": "b"})


@pytest.mark.parametrize("topic", ["", "a" * 128, "../x", "a/b", "tab\t", ".", "..", "é"])
def test_encoder_rejects_bad_topics(topic):
    with pytest.raises(InvalidTopicName):
        rec.encode_record(topic=topic, body=b"x")


def test_encoder_limits():
    with pytest.raises(InvalidRecord):
        rec.encode_record(topic="t", body=b"x", tag="t" * 256)


def test_filter_exact_tags_drops_hash_collisions():
    a = rec.encode_record(topic="t", body=b"a", tag="wanted")
    b = rec.encode_record(topic="t", body=b"b", tag="other")
    views = [memoryview(a), memoryview(b)]
    assert [bytes(v) for v in rec.filter_exact_tags(views, frozenset({"wanted"}))] == [a]
    assert rec.filter_exact_tags(views, None) == views
