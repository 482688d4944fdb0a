"""Columnar readers: the fields of many records at once (a PULL response, a scan), with numpy."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from gms.naming import TOPIC_NAME_BYTES_MAX
from gms.record import _recordcheck
from gms.record.checks import batch_headers
from gms.record.codec import decode_keys
from gms.record.layout import (
    HEADER_DTYPE,
    HEADER_SIZE,
    KEY_SEPARATOR,
    MAGIC_V1,
)
from gms.store_errors import CorruptRecord


def gather_rows(arr: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """``arr[o:o+width]`` for every offset as one (n, width) uint8 array. Rows are copied out of a
    strided window view (one memcpy per row, ~6x faster than a fancy index per byte); offsets too
    close to the end to have ``width`` bytes get zeros past the end."""
    usable = len(arr) - width + 1
    if usable > 0 and (len(offsets) == 0 or int(offsets.max()) < usable):
        return as_strided(arr, (usable, width), (arr.strides[0], arr.strides[0]))[offsets]
    padded = np.zeros(len(arr) + width, np.uint8)
    padded[: len(arr)] = arr
    return gather_rows(padded, offsets, width)


def read_headers(arr: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The fixed headers of the records at ``starts`` of ``arr`` (uint8) as a HEADER_DTYPE array."""
    return gather_rows(arr, starts, HEADER_SIZE).view(HEADER_DTYPE).ravel()


def header_errors(headers: np.ndarray) -> np.ndarray:
    """Boolean mask of headers whose lengths are inconsistent (vectorised ``validate_header``)."""
    total = headers["total_size"].astype(np.int64)
    expected = (HEADER_SIZE + headers["topic_len"].astype(np.int64) + headers["tag_len"]
                + headers["born_host_len"] + headers["keys_len"] + headers["props_len"]
                + headers["body_len"].astype(np.int64))
    return ((headers["magic"] != MAGIC_V1) | (headers["body_len"] < 0) | (headers["topic_len"] < 1)
            | (headers["topic_len"] > TOPIC_NAME_BYTES_MAX) | (headers["reserved"] != 0)
            | (expected != total))

class FieldOffsets(NamedTuple):
    """Where the variable fields of each of a batch of records start (int64 arrays, positions in
    the buffer) and how long they are, from their headers (:func:`read_field_offsets`)."""

    headers: np.ndarray  # HEADER_DTYPE
    topic_at: np.ndarray
    tag_at: np.ndarray
    born_host_at: np.ndarray
    keys_at: np.ndarray
    props_at: np.ndarray
    body_at: np.ndarray


def read_field_offsets(buf: bytes | memoryview, starts: np.ndarray) -> FieldOffsets:
    """The headers and field positions of the records at ``starts`` of ``buf``, every header
    checked as :func:`validate_header` does (magic, lengths adding up to total_size, the record
    inside the buffer; not the CRC): CorruptRecord names the first record that fails."""
    starts = np.asarray(starts, np.int64)
    checked = batch_headers(buf, starts)
    if checked.first_bad >= 0:
        raise CorruptRecord(int(starts[checked.first_bad]),
                            "record header is inconsistent (magic, lengths, total_size or past the buffer's end)")
    headers = checked.headers
    topic_at = starts + HEADER_SIZE
    tag_at = topic_at + headers["topic_len"]
    born_host_at = tag_at + headers["tag_len"]
    keys_at = born_host_at + headers["born_host_len"]
    props_at = keys_at + headers["keys_len"]
    body_at = props_at + headers["props_len"]
    return FieldOffsets(headers, topic_at, tag_at, born_host_at, keys_at, props_at, body_at)


# Records sharing a few distinct text values (topics, tags) are decoded once per value when at
# most this fraction of them are distinct; otherwise one by one.
_DISTINCT_TEXTS_MAX_FRACTION = 4


class Undecodable:
    """Stands in a text column for a field that is not valid UTF-8 (see :func:`text_column`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDECODABLE"


UNDECODABLE = Undecodable()


class _Decoded(dict[bytes, "str | Undecodable | None"]):
    """utf-8 text of each distinct raw value, decoded on first sight; ``empty`` for none."""

    def __init__(self, empty: str | None) -> None:
        super().__init__({b"": empty})

    def __missing__(self, raw: bytes) -> str | Undecodable | None:
        try:
            text: str | Undecodable | None = raw.decode()
        except UnicodeDecodeError:
            text = UNDECODABLE
        self[raw] = text
        return text


def bytes_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """``bytes(buf[at[i]: at[i] + lengths[i]])`` for every ``i``, made in C: a batch of records
    of one size (a producer batch) is one strided numpy view turned into a list of bytes; a few
    distinct lengths are gathered one length at a time; many are sliced one by one."""
    n = len(at)
    if n == 0:
        return []
    arr = np.frombuffer(buf, np.uint8)
    at = np.asarray(at, np.int64)
    lengths = np.asarray(lengths, np.int64)
    width = int(lengths[0])
    if n == 1 or ((lengths == width).all() and (np.diff(at) == at[1] - at[0]).all() and at[1] > at[0]):
        if width == 0:
            return [b""] * n
        stride = int(at[1] - at[0]) if n > 1 else width
        return np.ndarray((n,), f"V{width}", arr, int(at[0]), (stride,)).tolist()
    if (lengths == width).all():  # one size, not evenly stepped: gathered, then as above
        return [b""] * n if width == 0 else gather_rows(arr, at, width).view(f"V{width}").ravel().tolist()
    distinct, inverse = np.unique(lengths, return_inverse=True)
    if len(distinct) * 8 > n:
        mv = memoryview(buf)
        return list(map(bytes, map(mv.__getitem__, map(slice, at.tolist(), (at + lengths).tolist()))))
    out = np.empty(n, object)
    for index, width in enumerate(distinct.tolist()):
        rows = np.flatnonzero(inverse == index)
        if width == 0:
            out[rows] = b""
        else:
            out[rows] = gather_rows(arr, at[rows], width).view(f"V{width}").ravel().astype(object)
    return out.tolist()


def text_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray,
                groups: np.ndarray | None = None, empty: str | None = "") -> list[str | Undecodable | None]:
    """The utf-8 text at ``at`` (``lengths`` bytes) of every record, ``empty`` where there is
    none, :data:`UNDECODABLE` where it is not valid utf-8. ``groups`` (e.g. tag hashes) says
    which records likely share a value: when few values are distinct, each is decoded once and
    the others are only compared with it (vectorised, so a hash collision or a wrong hash costs
    speed, never correctness)."""
    n = len(at)
    if n == 0:
        return []
    at = np.asarray(at, np.int64)
    lengths = np.asarray(lengths, np.int64)
    arr = np.frombuffer(buf, np.uint8)
    if not lengths.any():
        return [empty] * n
    keys = lengths if groups is None else groups
    inverse: np.ndarray | None = None
    first: np.ndarray | list[int] = [0]
    if not (keys == keys[0]).all():
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        if len(distinct) * _DISTINCT_TEXTS_MAX_FRACTION > n:
            inverse = first = None  # type: ignore[assignment]
    if first is not None:
        rep = first[inverse] if inverse is not None else 0
        same = bool((lengths == lengths[rep]).all())
        width = int(lengths.max())
        if same and width and inverse is None:
            same = _all_alike(arr, at, width)
        elif same and width:
            rows = _windows(arr, at, width)
            if (lengths != width).any():
                rows = np.where(np.arange(width) < lengths[:, None], rows, 0)
            same = bool((rows == rows[rep]).all())
        if same:
            decoded = _Decoded(empty)
            values = [decoded[bytes(arr[a: a + length])] for a, length in
                      zip(at[first].tolist(), lengths[first].tolist(), strict=True)]
            if inverse is None:
                return values * n
            return np.array(values, object)[inverse].tolist()
    decoded = _Decoded(empty)
    return list(map(decoded.__getitem__, bytes_column(buf, at, lengths)))


def _all_alike(arr: np.ndarray, at: np.ndarray, width: int) -> bool:
    """Whether ``arr[a: a + width]`` is the same bytes for every ``a`` of ``at``. When ``at``
    steps evenly, 8 bytes of every record are compared at a time (one strided uint64 column
    each, so a topic costs one or a few vectorised compares); else the rows are gathered."""
    n = len(at)
    first = int(at[0])
    step = int(at[1]) - first if n > 1 else 0
    if step > 0 and first + (n - 1) * step + -(-width // 8) * 8 <= len(arr) and (np.diff(at) == step).all():
        for offset in range(0, width, 8):
            words = np.ndarray((n,), "<u8", arr, first + offset, (step,))
            differ = words ^ words[0]
            if width - offset < 8:  # the bytes past the field are not compared
                differ &= np.uint64((1 << (8 * (width - offset))) - 1)
            if differ.any():
                return False
        return True
    rows = gather_rows(arr, at, width)
    return bool((rows == rows[0]).all())


def _windows(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``arr[a: a + width]`` for every ``a`` of ``at``, as rows: a strided view when ``at`` steps
    evenly (records of one size), else a gathered copy (zeros past the end of ``arr``)."""
    if len(at) > 1:
        step = int(at[1] - at[0])
        if step > 0 and (np.diff(at) == step).all() and int(at[-1]) + width <= len(arr):
            return np.ndarray((len(at), width), np.uint8, arr, int(at[0]), (step, 1))
    return gather_rows(arr, at, width)


def keys_column(buf: bytes | memoryview, at: np.ndarray, lengths: np.ndarray) -> list[tuple[str, ...] | Undecodable]:
    """:func:`decode_keys` of the keys field of every record (split in C), :data:`UNDECODABLE`
    where they are not valid utf-8."""
    n = len(at)
    lengths = np.asarray(lengths, np.int64)
    present = np.flatnonzero(lengths)
    if len(present) == 0:
        return [()] * n
    joined = _decoded_joined(np.frombuffer(buf, np.uint8), np.asarray(at, np.int64)[present], lengths[present])
    keys: list[tuple[str, ...] | Undecodable]
    if joined is not None and not (joined[1] == ord(KEY_SEPARATOR)).any():  # one key each
        keys = list(zip(joined[0]))
    elif joined is not None:
        keys = list(map(tuple, map(str.split, joined[0], repeat(KEY_SEPARATOR))))
    else:  # some are not utf-8 (or every joiner occurs in them): one by one
        raw = bytes_column(buf, np.asarray(at, np.int64)[present], lengths[present])
        keys = [decode_keys(r) if _is_utf8(r) else UNDECODABLE for r in raw]
    if len(present) == n:
        return keys
    out: list[tuple[str, ...] | Undecodable] = [()] * n
    for index, value in zip(present.tolist(), keys, strict=True):
        out[index] = value
    return out


# Bytes that may stand between fields joined for one decode (ascii: never inside a utf-8
# sequence), tried in turn until one occurs in none of the fields.
_JOINERS = b"\n\x00\x1f\x1e"


def _decoded_joined(arr: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> tuple[list[str], np.ndarray] | None:
    """The utf-8 text of every field (``lengths`` bytes at ``at``) with one ``decode`` and one
    ``split``, and the bytes decoded: the fields are gathered into one buffer (numpy), a joiner
    byte after each. A concatenation with ascii between the fields is valid utf-8 exactly when
    every field is. None when some field is not utf-8 or holds every joiner."""
    n = len(at)
    if n == 0:
        return [], arr[:0]
    spans = lengths + 1
    ends = np.cumsum(spans)
    positions = np.repeat(at - (ends - spans), spans) + np.arange(int(ends[-1]))
    np.minimum(positions, len(arr) - 1, out=positions)  # the last joiner may lie past the buffer
    joined = arr[positions]
    for joiner in _JOINERS:
        joined[ends - 1] = joiner
        if np.count_nonzero(joined == joiner) == n:
            break
    else:
        return None
    try:
        texts = joined.tobytes().decode().split(chr(joiner))
    except UnicodeDecodeError:
        return None
    texts.pop()  # what follows the last joiner: nothing
    return texts, joined


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True



def exact_tag_mask(buf: bytes | memoryview, offsets: FieldOffsets, tags: frozenset[str]) -> np.ndarray:
    """Which records carry exactly one of ``tags`` (compared as bytes, vectorised): what a tag-hash
    match leaves to check, since different tags may share a hash."""
    arr = np.frombuffer(buf, np.uint8)
    tag_len = offsets.headers["tag_len"]
    tag_at = offsets.tag_at
    keep = np.zeros(len(tag_at), bool)
    for tag in tags:
        raw = np.frombuffer(tag.encode(), np.uint8)
        same_len = np.flatnonzero(tag_len == len(raw))
        rows = gather_rows(arr, tag_at[same_len], len(raw))
        keep[same_len[(rows == raw).all(axis=1)]] = True
    return keep


def property_columns(buf: bytes | memoryview, offsets: FieldOffsets, names: Iterable[str]) -> dict[str, np.ndarray]:
    """For each property name, an object array with each record's value (``None`` where a
    record lacks it), read in one C pass over the records' properties fields (never their
    bodies). ``TAGS`` is the record's tag (SQL filters)."""
    count, names = len(offsets.props_at), list(names)
    columns: dict[str, np.ndarray] = {}
    wanted = [name for name in names if name != "TAGS"]
    if wanted:
        props_at = np.ascontiguousarray(offsets.props_at, np.int64)
        values = _recordcheck.property_values(buf, props_at, np.ascontiguousarray(offsets.body_at, np.int64) - props_at,
                                              tuple(name.encode() for name in wanted))
        for name, value in zip(wanted, values, strict=True):
            column = columns[name] = np.empty(count, object)
            column[:] = value
    if "TAGS" in names:
        headers = offsets.headers
        column = columns["TAGS"] = np.empty(count, object)
        column[:] = text_column(buf, offsets.tag_at, headers["tag_len"], groups=headers["tag_hash"], empty=None)
    return columns
