"""Differential tests: the consumer's fast message reader (``decode_pull_body`` →
:class:`MessageBatch` → :class:`ReceivedMessage`) agrees with the reference decoder
:func:`gms.record.decode_record` on random records, random batches and damaged records."""

from __future__ import annotations

import copy
import gc
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gms.client._rows import make_rows
from gms.client.body_decode import decode_pull_body
from gms.client.structs import MessageBatch, ReceivedMessage, ReceivedMessages, _Same, _Slices
from gms.record import (
    HEADER,
    HEADER_SIZE,
    KEY_SEPARATOR,
    MAGIC_V1,
    OFF_CRC,
    OFF_CRC_START,
    PROP_NAME_VALUE_SEPARATOR,
    PROP_SEPARATOR,
    bytes_column,
    decode_keys,
    decode_properties,
    decode_record,
    encode_keys,
    encode_properties,
    keys_column,
    seal_crc,
    tag_hash,
    text_column,
    write_broker_fields,
)
from gms.store_errors import CorruptRecord
from gms.tags import MATCH_ALL, parse_tag_expression

PREFIX = "7F00000100002A4B"
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

def _filled(sizes: st.SearchStrategy[int], alphabet: str = "abc") -> st.SearchStrategy[str]:
    """Texts of the given sizes (in bytes, ascii) that shrink fast: limits of the format."""
    return st.builds(lambda n, c: c * n, sizes, st.sampled_from(alphabet))


topics = st.one_of(st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.%-", min_size=1,
                           max_size=127).filter(lambda t: t not in (".", "..")), _filled(st.just(127)))
tags = st.one_of(st.none(), st.sampled_from(["A", "B", "tag-1", "ü", "长"]),
                 st.text(max_size=80).filter(lambda t: len(t.encode()) <= 255), _filled(st.integers(250, 255)))
keys = st.one_of(st.lists(st.text(min_size=1, max_size=20).filter(lambda k: KEY_SEPARATOR not in k), max_size=4),
                 st.lists(_filled(st.just(65_535)), min_size=1, max_size=1))
no_separators = st.text(max_size=20).filter(lambda t: PROP_SEPARATOR not in t and PROP_NAME_VALUE_SEPARATOR not in t)
properties = st.one_of(st.none(), st.dictionaries(no_separators.filter(bool), no_separators, max_size=4),
                       st.builds(lambda n: {"big": "v" * n}, st.integers(65_000, 65_530)))
bodies = st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"\x00", b"\x00" * 100, b"x\x00\x00"]),
                   st.builds(lambda n, b: bytes([b]) * n, st.integers(60_000, 1 << 20), st.integers(0, 255)))
hosts = st.one_of(st.text(max_size=30).filter(lambda t: len(t.encode()) <= 255), _filled(st.just(255)))


@st.composite
def records(draw: st.DrawFn, topic: str | None = None) -> bytes:
    return _record(draw, topic, body=draw(bodies), tag=draw(tags))


def _record(draw: st.DrawFn, topic: str | None, *, body: bytes, tag: str | None) -> bytes:
    from gms.record import encode_record
    return encode_record(topic=topic or draw(topics), body=body, tag=tag, keys=draw(keys),
                         properties=draw(properties), born_host=draw(hosts),
                         born_ts_ms=draw(st.integers(1, 2**62)), reconsume_times=draw(st.integers(0, 2**31 - 1)),
                         flags=draw(st.integers(-(2**31), 2**31 - 1)))


@st.composite
def batches(draw: st.DrawFn) -> list[bytes]:
    """Records as a PULL answer holds them: one topic; a producer batch (one layout, many
    records), a mix of layouts, or both."""
    topic = draw(topics)
    kind = draw(st.sampled_from(["uniform", "mixed", "runs"]))
    if kind == "mixed":
        return draw(st.lists(records(topic), min_size=1, max_size=30))
    out: list[bytes] = []
    for _ in range(1 if kind == "uniform" else draw(st.integers(1, 4))):
        size = draw(st.integers(0, 300))
        tag = draw(tags)
        count = draw(st.integers(1, 60))
        keys_fixed = draw(st.booleans())
        shape = draw(keys)
        for i in range(count):
            out.append(_record(draw, topic, body=bytes([i % 256]) * size, tag=tag) if not keys_fixed else
                       _encode(topic, bytes([i % 256]) * size, tag, shape))
    return out


def _encode(topic: str, body: bytes, tag: str | None, keys: list[str]) -> bytes:
    from gms.record import encode_record
    return encode_record(topic=topic, body=body, tag=tag, keys=keys, born_ts_ms=1)


def _stored(records: list[bytes], queue_id: int = 3, first_offset: int = 10,
            offsets: list[int] | None = None) -> tuple[bytearray, list[int]]:
    """The records back to back with broker fields written, and where each starts."""
    buf = bytearray()
    starts = []
    for i, raw in enumerate(records):
        starts.append(len(buf))
        buf += raw
        write_broker_fields(buf, starts[-1], queue_id, offsets[i] if offsets else first_offset + i,
                            1_000_000 + starts[-1], 1_700_000_000_000 + i)
    return buf, starts


_TEXT_FIELDS = {"topic": 0, "tag": 1, "born_host": 2, "keys": 3, "properties": 4}


def _reference_fields(buf: bytes | bytearray | memoryview, pos: int) -> dict[str, object]:
    """Each field of the record at ``pos`` as the reference decoder reads it. Where it refuses
    the record for a text field that is not utf-8, each text field is decoded alone with the
    reference's own functions, and a field that fails is given as the exception it raises."""
    try:
        record = decode_record(buf, pos, verify_crc=False)
    except CorruptRecord as err:
        if "undecodable" not in str(err):
            raise
        fields = dict(_reference_fields_of(decode_record_parts(buf, pos)))
    else:
        fields = {"topic": record.topic, "tag": record.tag, "born_host": record.born_host,
                  "keys": record.keys, "properties": dict(record.properties), "body": bytes(record.body)}
    header = HEADER.unpack_from(buf, pos)
    fields.update({"queue_id": header[3], "queue_offset": header[4], "phys_offset": header[5],
                   "store_timestamp_ms": header[6], "born_timestamp_ms": header[8], "reconsume_times": header[10],
                   "msg_id": f"{PREFIX}{header[5]:016X}"})
    return fields


def decode_record_parts(buf: bytes | bytearray | memoryview, pos: int) -> list[bytes]:
    """The raw variable fields of the record at ``pos``: topic, tag, born host, keys, props, body."""
    header = HEADER.unpack_from(buf, pos)
    lengths = [header[12], header[13], header[14], header[16], header[17], header[11]]
    out = []
    cut = pos + HEADER_SIZE
    for length in lengths:
        out.append(bytes(buf[cut: cut + length]))
        cut += length
    return out


def _reference_fields_of(parts: list[bytes]) -> dict[str, object]:
    decoders = {"topic": lambda raw: raw.decode(), "tag": lambda raw: raw.decode() or None,
                "born_host": lambda raw: raw.decode(), "keys": decode_keys, "properties": decode_properties}
    fields: dict[str, object] = {"body": parts[5]}
    for name, index in _TEXT_FIELDS.items():
        try:
            fields[name] = decoders[name](parts[index])
        except ValueError as err:
            fields[name] = err
    return fields


def _assert_same(message: ReceivedMessage, buf: bytes | bytearray | memoryview, pos: int) -> None:
    reference = _reference_fields(buf, pos)
    for name, value in reference.items():
        if isinstance(value, ValueError):
            with pytest.raises(ValueError):
                getattr(message, name)
            continue
        got = getattr(message, name)
        assert got == value, name
        assert type(got) is type(value) or name == "properties", name
    if not any(isinstance(value, ValueError) for value in reference.values()):
        assert message.record() == decode_record(buf, pos, verify_crc=False)


@SETTINGS
@given(batches(), st.booleans())
def test_every_message_agrees_with_the_reference_decoder(records: list[bytes], verify_crc: bool) -> None:
    buf, starts = _stored(records)
    messages = decode_pull_body(memoryview(bytes(buf)), PREFIX, MATCH_ALL, verify_crc=verify_crc)
    assert len(messages) == len(records)
    made = list(messages)
    for message, pos in zip(made, starts, strict=True):
        assert type(message) is ReceivedMessage
        _assert_same(message, buf, pos)
    assert [messages[i].queue_offset for i in range(-len(made), len(made))] == [m.queue_offset for m in made] * 2
    assert made == list(MessageBatch(memoryview(buf), starts, PREFIX))  # type: ignore[arg-type]


@SETTINGS
@given(records())
def test_one_record_alone(record: bytes) -> None:
    stored, _ = _stored([record])
    buf = b"\x00" * 7 + stored  # not at position 0
    message = ReceivedMessage(memoryview(buf), 7, PREFIX)
    _assert_same(message, buf, 7)
    assert copy.copy(message) == message and hash(copy.copy(message)) == hash(message)
    assert repr(message).startswith("ReceivedMessage(topic=")


@SETTINGS
@given(batches(), st.data())
def test_splitting_and_joining_keep_the_order(records: list[bytes], data: st.DataObject) -> None:
    buf, _ = _stored(records)
    messages = decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL, verify_crc=False)
    cut = data.draw(st.integers(0, len(messages)))
    head, tail = messages.split(cut)
    cut2 = data.draw(st.integers(0, len(tail)))
    mid, rest = tail.split(cut2)
    joined = ReceivedMessages.concat([rest, head, mid])
    # Read from the headers before any message is made, then from the made columns.
    unmade = [joined.queue_offset(i) for i in range(-len(joined), len(joined))]
    expected = [m.queue_offset for m in messages]
    assert unmade == [joined.queue_offset(i) for i in range(-len(joined), len(joined))]
    assert unmade == [joined[i].queue_offset for i in range(-len(joined), len(joined))]
    with pytest.raises(IndexError):
        joined.queue_offset(len(joined))
    assert [m.queue_offset for m in joined] == expected[cut + cut2:] + expected[:cut] + expected[cut:cut + cut2]
    assert [joined[i].queue_offset for i in range(len(joined))] == [m.queue_offset for m in joined]
    assert [m.body for m in joined[1:5]] == [m.body for m in list(joined)[1:5]]


@SETTINGS
@given(st.lists(st.tuples(tags, st.binary(max_size=20)), min_size=1, max_size=40),
       st.sets(st.sampled_from(["A", "B", "tag-1", "ü", "长", "zz"]), min_size=1))
def test_an_exact_tag_filter_keeps_just_those_tags(tagged: list[tuple[str | None, bytes]], wanted: set[str]) -> None:
    buf, starts = _stored([_encode("t", body, tag, []) for tag, body in tagged])
    messages = decode_pull_body(memoryview(buf), PREFIX, parse_tag_expression(" || ".join(sorted(wanted))))
    expected = [pos for (tag, _), pos in zip(tagged, starts, strict=True) if tag in wanted]
    assert len(messages) == len(expected)
    for message, pos in zip(messages, expected, strict=True):
        _assert_same(message, buf, pos)


# --- damaged records ---------------------------------------------------------------------------

def _raw_record(topic: bytes, tag: bytes, host: bytes, keys: bytes, props: bytes, body: bytes, *,
                tag_hash_value: int | None = None, reserved: int = 0) -> bytearray:
    """A record built byte by byte (any bytes in its text fields), CRC sealed."""
    total = HEADER_SIZE + len(topic) + len(tag) + len(host) + len(keys) + len(props) + len(body)
    buf = bytearray(total)
    hashed = tag_hash(tag.decode(errors="replace")) if tag_hash_value is None else tag_hash_value
    HEADER.pack_into(buf, 0, total, MAGIC_V1, 0, 0, 0, 0, 0, 0, 1, hashed, 0, len(body),
                     len(topic), len(tag), len(host), reserved, len(keys), len(props))
    buf[HEADER_SIZE:] = topic + tag + host + keys + props + body
    seal_crc(buf)
    return buf


bad_utf8 = st.sampled_from([b"\xff", b"\xc3", b"a\x80b", b"\xed\xa0\x80", b"ok\xf0\x9f"])


@SETTINGS
@given(st.sampled_from(["topic", "tag", "born_host", "keys", "properties"]), bad_utf8, st.integers(1, 30),
       st.integers(0, 29), st.booleans())
def test_undecodable_text_fails_on_access_to_that_field_only(field: str, bad: bytes, count: int, which: int,
                                                             same_tag: bool) -> None:
    """decode_record refuses a record whose text is not utf-8; the consumer delivers it (its CRC
    holds) and raises UnicodeDecodeError when the broken field is read, as it always has."""
    assume(which < count)
    parts = {"topic": b"t", "tag": b"A" if same_tag else b"", "born_host": b"h", "keys": b"k1 k2",
             "properties": encode_properties({"p": "v"})}
    records = [_raw_record(parts["topic"], parts["tag"], parts["born_host"], parts["keys"], parts["properties"],
                           bytes([i]) * 10) for i in range(count)]
    broken = dict(parts, **{field: bad})
    if field == "tag":  # keep the tag hash as a producer would compute it from its bytes
        broken["tag"] = bad
    records[which] = _raw_record(broken["topic"], broken["tag"], broken["born_host"], broken["keys"],
                                 broken["properties"], bytes([which]) * 10)
    buf, starts = _stored(records)
    with pytest.raises(CorruptRecord):
        decode_record(buf, starts[which])
    messages = list(decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL))
    assert len(messages) == count
    for message, pos in zip(messages, starts, strict=True):
        _assert_same(message, buf, pos)
    with pytest.raises(ValueError):
        getattr(messages[which], field)
    assert messages[which].body == bytes([which]) * 10 and messages[which].queue_offset == 10 + which


@SETTINGS
@given(batches(), st.data())
def test_a_flipped_covered_byte_is_refused_unless_the_broker_checked(records: list[bytes],
                                                                     data: st.DataObject) -> None:
    buf, starts = _stored(records)
    which = data.draw(st.integers(0, len(records) - 1))
    pos = starts[which]
    size = len(records[which])
    at = data.draw(st.integers(pos + OFF_CRC_START, pos + size - 1))
    buf[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        decode_record(buf, pos)
    with pytest.raises(CorruptRecord):
        decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL, verify_crc=True)
    # Without the CRC check the framing and header checks still hold: a header whose lengths
    # no longer add up is refused, as decode_record refuses it.
    try:
        decode_record(buf, pos, verify_crc=False)
    except CorruptRecord as err:
        if "undecodable" not in str(err):
            with pytest.raises(CorruptRecord):
                decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL, verify_crc=False)
            return
    messages = decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL, verify_crc=False)
    assert len(messages) == len(records)
    for message, start in zip(messages, starts, strict=True):
        _assert_same(message, buf, start)


@pytest.mark.parametrize("damage", ["reserved", "topic_len_zero", "lengths_disagree", "wrong_tag_hash"])
def test_inconsistent_headers(damage: str) -> None:
    good = [_raw_record(b"t", b"A", b"", b"", b"", bytes([i]) * 20) for i in range(40)]
    if damage == "reserved":
        good[5] = _raw_record(b"t", b"A", b"", b"", b"", b"x" * 20, reserved=1)
    elif damage == "topic_len_zero":
        good[5] = _raw_record(b"", b"At", b"", b"", b"", b"x" * 20)
    elif damage == "lengths_disagree":
        record = bytearray(good[5])
        struct.pack_into(">i", record, 64, 19)  # body_len one short of what total_size says
        seal_crc(record)
        good[5] = record
    else:  # a producer that wrote another tag's hash: the tag still reads as its bytes say
        good[5] = _raw_record(b"t", b"B", b"", b"", b"", bytes([5]) * 20, tag_hash_value=tag_hash("A"))
    buf, starts = _stored(good)
    if damage == "wrong_tag_hash":
        messages = list(decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL))
        assert [m.tag for m in messages] == ["A"] * 5 + ["B"] + ["A"] * 34
        for message, pos in zip(messages, starts, strict=True):
            _assert_same(message, buf, pos)
        return
    with pytest.raises(CorruptRecord):
        decode_record(buf, starts[5])
    with pytest.raises(CorruptRecord):
        decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL)


# --- the column readers on their own -------------------------------------------------------------

@SETTINGS
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=60), st.booleans(), st.integers(0, 3))
def test_column_readers_agree_with_slicing(values: list[bytes], repeated: bool, gap: int) -> None:
    import numpy as np
    if repeated:
        values = [values[0]] * len(values)
    buf = bytearray()
    at = []
    for value in values:
        buf += b"\xee" * gap
        at.append(len(buf))
        buf += value
    at_arr = np.array(at, np.int64)
    lengths = np.array([len(v) for v in values], np.int64)
    assert bytes_column(bytes(buf), at_arr, lengths) == values
    texts = text_column(bytes(buf), at_arr, lengths, empty=None)
    for value, text in zip(values, texts, strict=True):
        try:
            expected = value.decode() or None
        except UnicodeDecodeError:
            assert repr(text) == "UNDECODABLE"
        else:
            assert text == expected
    for value, got in zip(values, keys_column(bytes(buf), at_arr, lengths), strict=True):
        try:
            expected_keys = tuple(value.decode().split(KEY_SEPARATOR)) if value else ()
        except UnicodeDecodeError:
            assert repr(got) == "UNDECODABLE"
        else:
            assert got == expected_keys


def test_encode_keys_round_trip_through_the_reader() -> None:
    buf, _ = _stored([_encode("t", b"b", None, ["a", "b\tc", "ü"])])
    (message,) = decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL)
    assert message.keys == ("a", "b\tc", "ü") and encode_keys(message.keys) == b"a b\tc \xc3\xbc"
    assert OFF_CRC == 8


@pytest.mark.parametrize("keys_of", [
    lambda i: [f"k{i}"],  # one key each: no split
    lambda i: [f"k{i}", "x\ny", "\x00"],  # several, holding the first joiners
    lambda i: ["a\n\x00\x1f\x1e" + str(i)] if i % 3 else [],  # every joiner, some without keys
])
def test_keys_of_a_batch(keys_of) -> None:
    records = [_encode("t", b"b", None, keys_of(i)) for i in range(50)]
    buf, starts = _stored(records)
    messages = list(decode_pull_body(memoryview(buf), PREFIX, MATCH_ALL))
    assert [m.keys for m in messages] == [tuple(keys_of(i)) for i in range(50)]
    for message, pos in zip(messages, starts, strict=True):
        _assert_same(message, buf, pos)


@SETTINGS
@given(batches())
def test_raw_record_is_the_stored_record(raws: list[bytes]) -> None:
    buf = b"".join(raws)
    starts = [0]
    for raw in raws[:-1]:
        starts.append(starts[-1] + len(raw))
    for start, raw in zip(starts, raws, strict=True):
        assert bytes(ReceivedMessage(buf, start, PREFIX).raw_record) == raw


# --- messages made from the columns in C ---------------------------------------------------------

class _Row(tuple):  # type: ignore[type-arg]
    __slots__ = ()


class _OtherRow(tuple):  # type: ignore[type-arg]
    __slots__ = ()


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.data())
def test_make_rows_agrees_with_making_each_row_in_python(values: list[int], data: st.DataObject) -> None:
    n = len(values)
    batch = object()
    columns = (_Same("topic"), [str(v) for v in values], [bytes([v]) * v for v in values],
               range(100, 100 + 3 * n, 3), range(n), _Same(batch))
    classes = data.draw(st.sampled_from([_Same(_Row), [(_Row, _OtherRow)[v % 2] for v in values]]))
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    made = make_rows(classes, columns, start, stop)
    expected = [tuple.__new__(classes.value if isinstance(classes, _Same) else classes[i],
                              [c.value if isinstance(c, _Same) else c[i] for c in columns])
                for i in range(start, stop)]
    assert made == expected and [type(m) for m in made] == [type(m) for m in expected]
    assert not any(gc.is_tracked(m) for m in made)  # never in a cycle: see _rows.c
    assert all(m[5] is batch for m in made)


@SETTINGS
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.data())
def test_make_rows_copies_bodies_out_of_the_buffer(bodies: list[bytes], data: st.DataObject) -> None:
    gaps = data.draw(st.lists(st.integers(0, 5), min_size=len(bodies), max_size=len(bodies)))
    buf, at = b"", []
    for body, gap in zip(bodies, gaps, strict=True):
        buf += b"-" * gap
        at.append(len(buf))
        buf += body
    sizes = np.array([len(b) for b in bodies], np.int64)
    start = data.draw(st.integers(0, len(bodies)))
    made = make_rows(_Same(_Row), (_Slices(memoryview(buf), np.array(at, np.int64), sizes),), start, len(bodies))
    assert made == [(body,) for body in bodies[start:]] and all(type(m[0]) is bytes for m in made)


def test_make_rows_copies_many_bodies_of_two_columns() -> None:
    """Past 64 KiB the bodies are copied with the GIL released, every slice column's."""
    rng = np.random.default_rng(7)
    bodies = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 200)]
    buf = b"".join(bodies)
    sizes = np.array([len(b) for b in bodies], np.int64)
    at = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    column = _Slices(memoryview(buf), at, sizes)
    reversed_column = _Slices(memoryview(buf), at[::-1].copy(), sizes[::-1].copy())
    made = make_rows(_Same(_Row), (column, reversed_column), 3, len(bodies))
    assert made == [(bodies[i], bodies[-1 - i]) for i in range(3, len(bodies))]


def test_make_rows_refuses_slices_outside_the_buffer() -> None:
    def slices(at: list[int], sizes: list[int], dtype: type = np.int64) -> _Slices:
        return _Slices(memoryview(b"0123456789"), np.array(at, dtype), np.array(sizes, dtype))

    assert make_rows(_Same(_Row), (slices([0, 8], [10, 2]),), 0, 2) == [(b"0123456789",), (b"89",)]
    for at, sizes in (([0, 9], [1, 2]), ([-1], [1]), ([0], [-1]), ([11], [0]), ([2**62], [2**62])):
        with pytest.raises(ValueError, match="not inside the buffer"):
            make_rows(_Same(_Row), (slices(at, sizes),), 0, len(at))
    with pytest.raises(ValueError, match="int64"):
        make_rows(_Same(_Row), (slices([0], [1], np.int32),), 0, 1)
    with pytest.raises(ValueError, match="int64"):
        make_rows(_Same(_Row), (slices([0], [1]),), 0, 2)  # shorter than the rows


def test_make_rows_refuses_what_is_not_a_column_or_a_row_class() -> None:
    with pytest.raises(IndexError):
        make_rows(_Same(_Row), ([1, 2],), 0, 3)
    with pytest.raises(IndexError):
        make_rows(_Same(_Row), (range(2),), 0, 3)
    with pytest.raises(TypeError):
        make_rows(_Same(_Row), ((1, 2),), 0, 1)  # a tuple of two values is not a column
    with pytest.raises(TypeError):
        make_rows(_Same(dict), (_Same(1),), 0, 1)
    with pytest.raises(TypeError):
        make_rows([_Row, 5], (_Same(1),), 0, 2)
    with pytest.raises(ValueError):
        make_rows(_Same(_Row), (_Same(1),), 2, 1)
    assert make_rows(_Same(_Row), (), 0, 2) == [(), ()]
