"""Stored records -> Arrow record batches, column by column, without a Python object per record.

Input is a uint8 array (a mapped commitlog file or a pull response body) and the positions of
records in it. Headers are read in one gather through ``gms.record.read_headers`` (the record
layout is declared there, not here); variable-length fields are copied out with one C call
per column (``gms.record._recordcheck.gather``); keys and properties are split with Arrow
compute kernels. Only the requested columns are built, so a count or a tag histogram never
copies a body.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gms.record import (
    HEADER_SIZE,
    KEY_SEPARATOR,
    PROP_NAME_VALUE_SEPARATOR,
    PROP_SEPARATOR,
    crc_mismatches,
    header_errors,
    read_headers,
)
from gms.record._recordcheck import gather
from gms.record.layout import SEQUENCE_PROPERTY

MS_TO_US = 1000
# The two hex digits of every byte value, as the 2 bytes of a uint16 (one lookup per byte).
_HEX_PAIRS = np.frombuffer(b"".join(b"%02X" % v for v in range(256)), np.uint16)
_VARIABLE_FIELDS = ("topic_len", "tag_len", "born_host_len", "keys_len", "props_len", "body_len")


class Records:
    """Checked records of one buffer: positions and their parsed headers (HEADER_DTYPE)."""

    def __init__(self, arr: np.ndarray, starts: np.ndarray, headers: np.ndarray) -> None:
        self.arr = arr
        self.starts = starts  # int64 positions in arr
        self.headers = headers

    def take(self, mask: np.ndarray) -> Records:
        return Records(self.arr, self.starts[mask], self.headers[mask])

    @functools.cached_property
    def field_starts(self) -> dict[str, np.ndarray]:
        """Where each variable-length field starts (int64 positions in arr): after the header and
        the fields before it, summed once for all the columns a batch builds."""
        found, pos = {}, self.starts + HEADER_SIZE
        for name in _VARIABLE_FIELDS:
            found[name] = pos
            pos = pos + self.headers[name].astype(np.int64)
        return found


def check_records(arr: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                  queue_offsets: np.ndarray | None = None,
                  phys: np.ndarray | None = None, *, scattered: bool = True) -> tuple[Records, np.ndarray]:
    """Read and verify the records at ``starts`` (length, magic, field lengths, CRC and, when
    given, the queue and commitlog offsets the index expects). Returns the good records and the
    boolean mask of bad positions, so the caller can count or fail on them.

    ``scattered`` records are first copied back to back (one memcpy each, in C): a queue's
    records lie scattered over the commitlog (a TLB and cache miss each), so they are gathered
    once and the CRC and every column read sequential memory. (A pull answer's lie back to back
    already.)"""
    starts = starts.astype(np.int64, copy=False)
    sizes = sizes.astype(np.int64, copy=False)
    bad = (sizes < HEADER_SIZE) | (starts < 0) | (starts + sizes > len(arr))
    if scattered and len(sizes) and not bad.any():
        packed_at = np.zeros(len(sizes), np.int64)
        np.cumsum(sizes[:-1], out=packed_at[1:])
        packed = np.empty(int(packed_at[-1] + sizes[-1]), np.uint8)
        gather(arr.data, starts, sizes, packed, packed_at)
        arr, starts = packed, packed_at
    safe_starts = np.where(bad, 0, starts)
    headers = read_headers(arr, safe_starts)
    bad |= header_errors(headers) | (headers["total_size"] != sizes)
    if queue_offsets is not None:
        bad |= headers["queue_offset"] != queue_offsets
    if phys is not None:
        bad |= headers["phys_offset"] != phys
    good = np.flatnonzero(~bad)
    if good.size:
        crc_bad = crc_mismatches(arr, starts[good], sizes[good])
        bad[good[crc_bad]] = True
        good = np.delete(good, crc_bad)
    if len(good) == len(starts):  # the usual case: no copy of the (strided) headers
        return Records(arr, starts, headers), bad
    return Records(arr, starts[good], headers[good]), bad


def _segments(records: Records, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(int32 Arrow offsets, concatenated bytes) of one variable-length field of every record:
    the fields copied back to back in one C call (a memcpy each)."""
    lengths = records.headers[field].astype(np.int64)
    at = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=at[1:])
    data = np.empty(int(at[-1]), np.uint8)
    if len(data):
        gather(records.arr.data, records.field_starts[field], lengths, data, at[:-1])
    return at.astype(np.int32), data


def _var_array(records: Records, field: str, kind: pa.DataType, empty_is_null: bool = False) -> pa.Array:
    offsets, data = _segments(records, field)
    n = len(records.starts)
    validity, nulls = None, 0
    if empty_is_null:
        present = records.headers[field] > 0
        nulls = int(n - present.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def _empty_lists(n: int, kind: pa.DataType) -> pa.Array:
    """``n`` empty lists or maps: no text to split when no record has keys or properties."""
    offsets = pa.array(np.zeros(n + 1, np.int32))
    if isinstance(kind, pa.MapType):
        return pa.MapArray.from_arrays(offsets, pa.array([], kind.key_type), pa.array([], kind.item_type))
    return pa.ListArray.from_arrays(offsets, pa.array([], kind.value_type))


def _keys(records: Records) -> pa.Array:
    if not records.headers["keys_len"].any():
        return _empty_lists(len(records.starts), pa.list_(pa.string()))
    text = _var_array(records, "keys_len", pa.string())
    split = pc.split_pattern(text, KEY_SEPARATOR)
    empty = records.headers["keys_len"] == 0  # "" splits into [""]; no keys is []
    if not empty.any():
        return split
    list_lengths = pc.list_value_length(split).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(split).filter(pa.array(~np.repeat(empty, list_lengths)))
    offsets = np.zeros(len(list_lengths) + 1, np.int32)
    np.cumsum(list_lengths - empty, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _properties(records: Records) -> pa.Array:
    """``k\\x01v\\x02k\\x01v\\x02`` -> map<string,string>; a malformed one raises ValueError."""
    if not records.headers["props_len"].any():
        return _empty_lists(len(records.starts), pa.map_(pa.string(), pa.string()))
    text = _var_array(records, "props_len", pa.string())
    items = pc.split_pattern(text, PROP_SEPARATOR)  # a trailing separator leaves one "" per record
    per_record = pc.list_value_length(items).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(items)
    is_last = np.zeros(len(flat), bool)
    is_last[np.cumsum(per_record) - 1] = True
    if pc.any(pc.not_equal(flat.filter(pa.array(is_last)), "")).as_py():
        raise ValueError("properties do not end with the separator")
    pairs = pc.split_pattern(flat.filter(pa.array(~is_last)), PROP_NAME_VALUE_SEPARATOR, max_splits=1)
    if len(pairs) and pc.min(pc.list_value_length(pairs)).as_py() != 2:
        raise ValueError("a property has no name/value separator")
    names, values, counts = pc.list_element(pairs, 0), pc.list_element(pairs, 1), per_record - 1
    stamps = pc.equal(names, SEQUENCE_PROPERTY).to_numpy(zero_copy_only=False)
    if stamps.any():  # the idempotent producer's stamp is for the brokers only, as in the SDK's decode
        keep = pa.array(~stamps)
        names, values = names.filter(keep), values.filter(keep)
        counts = counts - np.bincount(np.repeat(np.arange(len(counts)), counts)[stamps], minlength=len(counts))
    offsets = np.zeros(len(per_record) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), names, values)


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64) * MS_TO_US, pa.timestamp("us", tz="UTC"))


def _msg_ids(records: Records, prefix: bytes | None) -> pa.Array:
    """Hex ``prefix`` + 16 hex digits of the commitlog offset (gms.msgid); null without a prefix."""
    n = len(records.starts)
    if prefix is None:
        return pa.nulls(n, pa.string())
    raw = records.headers["phys_offset"].astype(">i8").view(np.uint8).reshape(n, 8)
    digits = np.empty((n, len(prefix) + 16), np.uint8)
    digits[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    digits[:, len(prefix):].view(np.uint16)[...] = _HEX_PAIRS[raw]
    offsets = np.arange(n + 1, dtype=np.int32) * digits.shape[1]
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digits)])


_BUILDERS: dict[str, Callable[[Records, bytes | None], pa.Array]] = {
    "topic": lambda r, _: _var_array(r, "topic_len", pa.string()),
    "queue_id": lambda r, _: pa.array(r.headers["queue_id"].astype(np.int32)),
    "queue_offset": lambda r, _: pa.array(r.headers["queue_offset"].astype(np.int64)),
    "commit_log_offset": lambda r, _: pa.array(r.headers["phys_offset"].astype(np.int64)),
    "size": lambda r, _: pa.array(r.headers["total_size"].astype(np.int32)),
    "tag": lambda r, _: _var_array(r, "tag_len", pa.string(), empty_is_null=True),
    "keys": lambda r, _: _keys(r),
    "properties": lambda r, _: _properties(r),
    "born_timestamp": lambda r, _: _timestamps(r.headers["born_ts_ms"]),
    "store_timestamp": lambda r, _: _timestamps(r.headers["store_ts_ms"]),
    "born_host": lambda r, _: _var_array(r, "born_host_len", pa.string()),
    "reconsume_times": lambda r, _: pa.array(r.headers["reconsume_times"].astype(np.int32)),
    "body": lambda r, _: _var_array(r, "body_len", pa.binary()),
    "msg_id": _msg_ids,
}


def exact_tag_mask(records: Records, tags: frozenset[str]) -> np.ndarray:
    """Which records carry one of ``tags`` exactly (the index matched hashes, which collide)."""
    tag_column = _var_array(records, "tag_len", pa.string())
    return pc.is_in(tag_column, pa.array(sorted(tags), pa.string())).to_numpy(zero_copy_only=False)


def to_batch(records: Records, schema: pa.Schema, msg_id_prefix: bytes | None) -> pa.RecordBatch:
    """One record batch with exactly the columns of ``schema``."""
    arrays = [_BUILDERS[name](records, msg_id_prefix) for name in schema.names]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
