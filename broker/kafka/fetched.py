"""A fetch's stored gms records as one Kafka record batch, without a Python step per message.

The records a queue serves are read column by column (their headers in one C pass,
``gms.record.batch_headers``), and every Kafka record is laid out with numpy: its varints
(length, timestamp and offset deltas, key and value lengths) encoded for all records at once, its
key and value gathered from the stored bytes by index arrays. This covers records without a tag
and without properties (what gms's SDK and Kafka producers without headers store); each other one
is converted alone (:func:`gms.broker.kafka.convert.kafka_record`), mapping properties to headers
and the tag to ``gms.tag`` (an idempotent producer stamps the first record of each batch: one
such record per batch).
"""

from __future__ import annotations

import numpy as np

from gms.broker.kafka.convert import kafka_record
from gms.broker.kafka.records import encode_records, wrap_batch
from gms.record import HEADER_SIZE, batch_headers, decode_record, scan_records

_VARINT_BYTES_MAX = 10


def fetched_batch(views: list[memoryview]) -> bytes:
    """The Kafka batch of stored gms records (views of one or more adjacent records, in offset
    order, their CRCs checked by the store)."""
    runs = [(view, *_columns(view)) for view in views]
    offsets = np.concatenate([headers["queue_offset"] for _, _, headers in runs]).astype(np.int64)
    stamps = np.concatenate([headers["born_ts_ms"] for _, _, headers in runs]).astype(np.int64)
    base_offset, base_ts = int(offsets[0]), int(stamps.min())
    parts: list[bytes | bytearray] = []
    for view, starts, headers in runs:
        plain = (headers["tag_len"] == 0) & (headers["props_len"] == 0)
        for run in np.split(np.arange(len(plain)), np.flatnonzero(np.diff(plain.astype(np.int8))) + 1):
            if plain[run[0]]:
                parts.append(_records(view, starts[run], headers[run], base_offset, base_ts))
            else:  # a tag or properties (an idempotent producer's stamp too): record by record
                parts.append(encode_records([kafka_record(decode_record(view, int(starts[i]), verify_crc=False),
                                                          base_offset) for i in run], base_ts))
    return wrap_batch(base_offset, b"".join(parts), len(offsets), int(offsets[-1]) - base_offset, base_ts,
                      int(stamps.max()))


def _columns(view: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """The starts and headers of the records of ``view``."""
    starts = scan_records(view, verify_crc=False).starts
    return starts, batch_headers(view, starts).headers


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
