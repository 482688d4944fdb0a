"""A fetch's stored gms records as one Kafka record batch, without a Python step per message.

The records a queue serves are read column by column (their headers in one C pass,
``gms.record.batch_headers``), and every Kafka record is laid out with numpy: its varints
(length, timestamp and offset deltas, key and value lengths) encoded for all records at once, its
key and value gathered from the stored bytes by index arrays. This covers records without a tag
and without properties (what gms's SDK and Kafka producers without headers store); a batch holding
any other is converted record by record (:func:`gms.broker.kafka.convert.from_gms`), which maps
properties to headers and the tag to ``gms.tag``.
"""

from __future__ import annotations

import numpy as np

from gms.broker.kafka.convert import from_gms
from gms.broker.kafka.records import encode_batch, wrap_batch
from gms.record import HEADER_SIZE, batch_headers, scan_records

_VARINT_BYTES_MAX = 10


def fetched_batch(views: list[memoryview]) -> bytes:
    """The Kafka batch of stored gms records (views of one or more adjacent records, in offset
    order, their CRCs checked by the store)."""
    columns = [_columns(view) for view in views]
    if any(c is None for c in columns):
        base, records = from_gms(views)
        return encode_batch(base, records)
    runs = [c for c in columns if c is not None]
    offsets = np.concatenate([c[1]["queue_offset"] for c in runs]).astype(np.int64)
    stamps = np.concatenate([c[1]["born_ts_ms"] for c in runs]).astype(np.int64)
    base_offset, base_ts = int(offsets[0]), int(stamps.min())
    body = b"".join(_records(view, starts, headers, base_offset, base_ts) for view, (starts, headers) in
                    zip(views, runs, strict=True))
    return wrap_batch(base_offset, body, len(offsets), int(offsets[-1]) - base_offset, base_ts, int(stamps.max()))


def _columns(view: memoryview) -> tuple[np.ndarray, np.ndarray] | None:
    """The starts and headers of the records of ``view``; None if one has a tag or properties."""
    starts = scan_records(view, verify_crc=False).starts
    headers = batch_headers(view, starts).headers
    if headers["tag_len"].any() or headers["props_len"].any():
        return None
    return starts, headers


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints of int64 ``values``: (bytes, one row per value; each row's length)."""
    rest = ((values << 1) ^ (values >> 63)).astype(np.uint64)
    out = np.zeros((len(values), _VARINT_BYTES_MAX), np.uint8)
    lengths = np.ones(len(values), np.int64)
    for column in range(_VARINT_BYTES_MAX):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest = rest >> np.uint64(7)
        more = rest != 0
        out[:, column] = low | (more.astype(np.uint8) << 7)
        if not more.any():
            break
        lengths += more
    return out, lengths


def _put_varints(out: np.ndarray, at: np.ndarray, varints: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Write each varint at its position; the positions after them."""
    encoded, lengths = varints
    mask = np.arange(_VARINT_BYTES_MAX) < lengths[:, None]
    out[(at[:, None] + np.arange(_VARINT_BYTES_MAX))[mask]] = encoded[mask]
    return at + lengths


def _gather(out: np.ndarray, at: np.ndarray, src: np.ndarray, src_at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Copy ``src[src_at[i]:src_at[i] + lengths[i]]`` to ``out[at[i]:]`` for every i, in one go."""
    total = int(lengths.sum())
    if total:
        before = np.cumsum(lengths) - lengths
        within = np.arange(total) - np.repeat(before, lengths)
        out[np.repeat(at, lengths) + within] = src[np.repeat(src_at, lengths) + within]
    return at + lengths


def _records(view: memoryview, starts: np.ndarray, headers: np.ndarray, base_offset: int, base_ts: int) -> bytes:
    """The Kafka records (v2 record format, no headers) of the gms records at ``starts``."""
    src = np.frombuffer(view, np.uint8)
    keys_len = headers["keys_len"].astype(np.int64)
    body_len = headers["body_len"].astype(np.int64)
    key_at = starts + HEADER_SIZE + headers["topic_len"] + headers["born_host_len"]  # no tag
    ts = _varints(headers["born_ts_ms"].astype(np.int64) - base_ts)
    delta = _varints(headers["queue_offset"].astype(np.int64) - base_offset)
    key = _varints(np.where(keys_len > 0, keys_len, -1))  # no key: null
    value = _varints(body_len)
    size = 1 + ts[1] + delta[1] + key[1] + keys_len + value[1] + body_len + 1  # attributes .. header count
    length = _varints(size)
    total = length[1] + size
    out = np.zeros(int(total.sum()), np.uint8)
    at = np.cumsum(total) - total
    at = _put_varints(out, at, length) + 1  # attributes 0
    at = _put_varints(out, _put_varints(out, at, ts), delta)
    at = _gather(out, _put_varints(out, at, key), src, key_at, keys_len)
    _gather(out, _put_varints(out, at, value), src, key_at + keys_len, body_len)  # then the header count, 0
    return out.tobytes()
