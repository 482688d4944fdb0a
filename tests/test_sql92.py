"""SQL92 property filters: RocketMQ's subset, SQL's three-valued logic, errors naming the
position, and property columns read from real encoded records (a body that looks like a
property is not one)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.record import Message, _recordcheck, encode_batch
from gms.record.columns import property_columns, read_field_offsets
from gms.sql92 import BadFilterExpression, compile_filter

COLUMNS = {
    "a": np.array(["1", "5", None, "x", "10"], dtype=object),
    "region": np.array(["eu", "us", "eu", None, "e'u"], dtype=object),
    "TAGS": np.array(["t1", "t2", "t1", "t3", None], dtype=object),
}


@pytest.mark.parametrize(("expression", "selected"), [
    ("a > 2", [0, 1, 0, 0, 1]),
    ("a >= 5 AND a <= 5", [0, 1, 0, 0, 0]),
    ("a = 5", [0, 1, 0, 0, 0]),
    ("a <> 5", [1, 0, 0, 0, 1]),  # unknown for the missing and the non-numeric values
    ("a BETWEEN 1 AND 5", [1, 1, 0, 0, 0]),
    ("a NOT BETWEEN 1 AND 5", [0, 0, 0, 0, 1]),
    ("region = 'eu'", [1, 0, 1, 0, 0]),
    ("region <> 'eu'", [0, 1, 0, 0, 1]),
    ("region = 'e''u'", [0, 0, 0, 0, 1]),
    ("region IN ('eu', 'us')", [1, 1, 1, 0, 0]),
    ("region NOT IN ('eu')", [0, 1, 0, 0, 1]),
    ("a IS NULL", [0, 0, 1, 0, 0]),
    ("a IS NOT NULL", [1, 1, 0, 1, 1]),
    ("NOT (a > 2)", [1, 0, 0, 0, 0]),  # NOT unknown stays unknown
    ("a > 2 OR region IS NULL", [0, 1, 0, 1, 1]),
    ("region = 'eu' and not a > 2 or TAGS = 't3'", [1, 0, 0, 1, 0]),
    ("TAGS IN ('t1')", [1, 0, 1, 0, 0]),
    ("missing = 'x' OR TRUE", [1, 1, 1, 1, 1]),
    ("FALSE", [0, 0, 0, 0, 0]),
])
def test_semantics(expression, selected):
    assert compile_filter(expression).select(COLUMNS, 5).astype(int).tolist() == selected


def test_names_read():
    assert compile_filter("a > 1 AND (TAGS = 'x' OR b IS NULL)").names == {"a", "TAGS", "b"}


@pytest.mark.parametrize(("expression", "position"), [
    ("a >", 3), ("a = 'x' AND", 9), ("a LIKE 'x'", 3), ("a > 'x'", 3), ("a IN ()", 7), ("a = 1 1", 7),
])
def test_bad_expressions_name_the_position(expression, position):
    with pytest.raises(BadFilterExpression, match=rf"position {position}\b"):
        compile_filter(expression)


def test_empty_and_oversized_expressions():
    with pytest.raises(BadFilterExpression, match="empty"):
        compile_filter("  ")
    with pytest.raises(BadFilterExpression, match="at most"):
        compile_filter("a = 1 OR " * 1000 + "a = 2")


def starts_of(buf: bytes) -> np.ndarray:
    starts, pos = [], 0
    while pos < len(buf):
        starts.append(pos)
        pos += struct.unpack_from(">i", buf, pos)[0]
    return np.array(starts, np.int64)


def test_property_columns_from_records():
    messages = [Message(topic="t", tag=f"t{i % 2}" if i != 3 else None,
                        body=b"amount\x01999" if i == 0 else b"x",
                        properties={"amount": str(i), "region": "eu"} if i % 4 else {"region": "us\u00e9"})
                for i in range(8)]
    buf = encode_batch(messages)
    columns = property_columns(buf, read_field_offsets(buf, starts_of(buf)), ["amount", "region", "TAGS", "nope"])
    assert columns["amount"].tolist() == [None, "1", "2", "3", None, "5", "6", "7"]  # not the body's
    assert columns["region"].tolist() == ["us\u00e9", "eu", "eu", "eu", "us\u00e9", "eu", "eu", "eu"]
    assert columns["TAGS"].tolist() == ["t0", "t1", "t0", None, "t0", "t1", "t0", "t1"]
    assert columns["nope"].tolist() == [None] * 8
    selected = compile_filter("amount > 4 OR region = 'us\u00e9'").select(columns, 8)
    assert np.flatnonzero(selected).tolist() == [0, 4, 5, 6, 7]


def test_a_name_that_ends_another_is_not_it():
    buf = encode_batch([Message(topic="t", body=b"", properties={"xamount": "1", "amount": "2"}),
                        Message(topic="t", body=b"", properties={"xamount": "3"})])
    columns = property_columns(buf, read_field_offsets(buf, starts_of(buf)), ["amount"])
    assert columns["amount"].tolist() == ["2", None]


_PROPERTY_NAMES = st.sampled_from(["a", "b", "ab", "region", "x.y", "TAGS"])
_TEXTS = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(_PROPERTY_NAMES, _TEXTS, max_size=4), st.binary(max_size=24)),
                min_size=1, max_size=6))
def test_property_columns_read_what_the_codec_decodes(records):
    """Every record's column value is its decoded property (bodies holding names and separators
    included: only the properties field is read)."""
    buf = encode_batch([Message(topic="t", body=body, properties=props) for props, body in records])
    names = ["a", "b", "ab", "region", "x.y", "zz"]
    columns = property_columns(buf, read_field_offsets(buf, starts_of(buf)), names)
    for name in names:
        assert columns[name].tolist() == [props.get(name) for props, _ in records]


def test_property_values_of_damaged_encodings():
    """What a malformed properties field reads as: invalid utf-8 replaced, a property without its
    terminator is none, of a name given twice the last value counts, a value may hold 0x01."""
    fields = [b"a\x01\xff1\x02", b"a\x01x\x02a", b"a\x01x\x02a\x01y\x02", b"a\x01b\x01c\x02", b""]
    buf = b"".join(fields)
    at = np.cumsum([0] + [len(f) for f in fields[:-1]]).astype(np.int64)
    lengths = np.array([len(f) for f in fields], np.int64)
    assert _recordcheck.property_values(buf, at, lengths, (b"a",)) == [["\ufffd1", "x", "y", "b\x01c", None]]
    with pytest.raises(ValueError, match="not inside"):
        _recordcheck.property_values(buf, at, lengths + 1, (b"a",))
