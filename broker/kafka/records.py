"""Kafka's record batch v2 (magic 2): decode with its CRC-32C checked and its records decompressed
(gzip, snappy, lz4, zstd through ``cramjam``), and encode (uncompressed).

A batch::

    base_offset int64, batch_length int32, partition_leader_epoch int32, magic int8,
    crc uint32 (CRC-32C of what follows), attributes int16, last_offset_delta int32,
    base_timestamp int64, max_timestamp int64, producer_id int64, producer_epoch int16,
    base_sequence int32, record count int32, records (compressed as attributes & 7 says)

and a record: length, attributes int8, timestamp delta, offset delta, key, value (varint-prefixed,
-1: null) and headers (count, then each a varint-prefixed key and value).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import crc32c

from gms.broker.kafka.wire import Malformed, Reader, uvarint_bytes

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
CRC_START = 21  # attributes onwards are covered by the CRC
LENGTH_END = 12  # base offset + batch length: batch_length counts from here
COMPRESSION_MASK = 0x07
TRANSACTIONAL = 0x10
CONTROL = 0x20
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the Java client's snappy framing (xerial), blocks after a 16-byte header
assert BATCH_HEADER_SIZE == 61


class CorruptBatch(Malformed):
    """A batch whose CRC fails or whose records cannot be read (Kafka's CORRUPT_MESSAGE)."""


class UnsupportedBatch(Malformed):
    """A batch this broker does not store: an old magic, a transactional or control batch."""


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Batch:
    base_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[KafkaRecord]


def decompress(codec: int, data: memoryview) -> bytes:
    try:
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            return _snappy(data)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as err:
        raise CorruptBatch(f"records do not decompress: {err}") from err
    raise CorruptBatch(f"unknown compression codec {codec}")


def _snappy(data: memoryview) -> bytes:
    """Raw snappy (librdkafka) or the xerial framing of the Java client and kafka-python."""
    if bytes(data[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(data))
    r = Reader(data, 16)
    out = bytearray()
    while r.remaining():
        out += cramjam.snappy.decompress_raw(r.raw(r.int32()))
    return bytes(out)


def split_batches(data: memoryview) -> list[memoryview]:
    """The batches of a produce request's records (CorruptBatch: one does not fit)."""
    batches = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise CorruptBatch(f"a batch header needs {BATCH_HEADER_SIZE} bytes, {end - pos} left")
        length = struct.unpack_from(">i", data, pos + 8)[0]
        size = LENGTH_END + length
        if length < BATCH_HEADER_SIZE - LENGTH_END or pos + size > end:
            raise CorruptBatch(f"batch length {length} does not fit the {end - pos} bytes left")
        batches.append(data[pos:pos + size])
        pos += size
    return batches


def decode_batch(data: memoryview) -> Batch:
    """One batch (from :func:`split_batches`), CRC checked, records decompressed."""
    fields, raw, count, base_ts = open_batch(data)
    return Batch(*fields, decode_records(raw, count, base_ts))


def open_batch(data: memoryview) -> tuple[tuple[int, int, int, int, int], bytes, int, int]:
    """One batch's (base offset, attributes, producer id and epoch, base sequence), its records'
    bytes (decompressed), their count and base timestamp; its magic, CRC and kind checked."""
    (base_offset, _, _, magic, crc, attributes, _, base_ts, _, producer_id, producer_epoch, base_sequence,
     count) = BATCH_HEADER.unpack_from(data)
    if magic != 2:
        raise UnsupportedBatch(f"record batch magic {magic}: only v2 (magic 2) is supported")
    if crc32c.crc32c(data[CRC_START:]) != crc:
        raise CorruptBatch("record batch CRC-32C mismatch")
    if attributes & (TRANSACTIONAL | CONTROL):
        raise UnsupportedBatch("transactional and control batches are not supported")
    body = data[BATCH_HEADER_SIZE:]
    codec = attributes & COMPRESSION_MASK
    raw = decompress(codec, body) if codec else bytes(body)
    if count < 0 or count > len(raw):
        raise CorruptBatch(f"record count {count}")
    return (base_offset, attributes, producer_id, producer_epoch, base_sequence), raw, count, base_ts


def decode_records(raw: bytes, count: int, base_ts: int) -> list[KafkaRecord]:
    """The ``count`` records of an opened batch (:func:`open_batch`): the reference decoder, which
    the C conversion of a produce (``_convert.to_gms``) gives way to for any batch it does not take."""
    records, end = _decode_records(raw, count, base_ts)
    if end != len(raw):
        raise CorruptBatch(f"{len(raw) - end} bytes after the batch's {count} records")
    return records


def _decode_records(buf: bytes, count: int, base_ts: int) -> tuple[list[KafkaRecord], int]:
    """``count`` records from the start of a batch's records, and where they end. The fields are
    read inline: a call per field cost more than the rest of the record."""
    records = []
    pos = 0
    try:
        for _ in range(count):
            length, pos = _varint(buf, pos)
            stop = pos + length
            if length < 0 or stop > len(buf):
                raise CorruptBatch(f"record length {length}")
            ts, pos = _varint(buf, pos + 1)  # after the attributes (unused)
            delta, pos = _varint(buf, pos)
            key, pos = _varbytes(buf, pos, stop)
            value, pos = _varbytes(buf, pos, stop)
            header_count, pos = _varint(buf, pos)
            headers = []
            for _ in range(header_count):
                name, pos = _varbytes(buf, pos, stop)
                if name is None:
                    raise CorruptBatch("a header without a key")
                header_value, pos = _varbytes(buf, pos, stop)
                headers.append((name.decode(), header_value))
            if pos != stop:
                raise CorruptBatch(f"record of {length} bytes ends at {pos - stop:+d}")
            records.append(KafkaRecord(delta, base_ts + ts, key, value, headers))
    except IndexError as err:
        raise CorruptBatch("a record is cut short") from err
    except UnicodeDecodeError as err:
        raise CorruptBatch("a header key is not UTF-8") from err
    return records, pos


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` and the position after it (IndexError: cut short)."""
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    result, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
        if shift > 63:
            raise CorruptBatch("a varint longer than 10 bytes")


def _varbytes(buf: bytes, pos: int, stop: int) -> tuple[bytes | None, int]:
    """A varint-prefixed field (-1: null) inside a record ending at ``stop``."""
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > stop:
        raise CorruptBatch(f"a field of {n} bytes runs past its record")
    return buf[pos:pos + n], pos + n


def _varbytes_out(out: bytearray, v: bytes | None) -> None:
    if v is None:
        out += b"\x01"  # zig-zag -1
    else:
        out += _zigzag(len(v))
        out += v


def _zigzag(v: int) -> bytes:
    return uvarint_bytes((v << 1) ^ (v >> 63))


def encode_batch(base_offset: int, records: list[KafkaRecord], leader_epoch: int = -1) -> bytes:
    """An uncompressed batch of ``records`` (their offset deltas from ``base_offset``, timestamps
    CreateTime): the record-by-record reference of :mod:`.fetched`'s batches."""
    base_ts = min(rec.timestamp_ms for rec in records)
    return wrap_batch(base_offset, encode_records(records, base_ts), len(records), records[-1].offset_delta, base_ts,
                      max(rec.timestamp_ms for rec in records), leader_epoch)


def encode_records(records: list[KafkaRecord], base_ts: int) -> bytearray:
    """The records of a batch whose timestamps are deltas from ``base_ts``."""
    body = bytearray()
    for rec in records:
        one = bytearray(b"\x00")
        one += _zigzag(rec.timestamp_ms - base_ts)
        one += _zigzag(rec.offset_delta)
        _varbytes_out(one, rec.key)
        _varbytes_out(one, rec.value)
        one += _zigzag(len(rec.headers))
        for name, value in rec.headers:
            _varbytes_out(one, name.encode())
            _varbytes_out(one, value)
        body += _zigzag(len(one))
        body += one
    return body


def wrap_batch(base_offset: int, body: bytes | bytearray, count: int, last_offset_delta: int, base_ts: int,
               max_ts: int, leader_epoch: int = -1) -> bytes:
    """An uncompressed batch of ``count`` encoded records (``body``; timestamp deltas from
    ``base_ts``), with its header and CRC-32C."""
    batch = bytearray(BATCH_HEADER_SIZE) + body
    seal_batch(batch, base_offset, count, last_offset_delta, base_ts, max_ts, leader_epoch)
    return bytes(batch)


def seal_batch(batch: bytearray, base_offset: int, count: int, last_offset_delta: int, base_ts: int, max_ts: int,
               leader_epoch: int = -1) -> None:
    """Write the header and CRC-32C of an uncompressed batch whose records follow its first
    BATCH_HEADER_SIZE bytes (left for the header)."""
    BATCH_HEADER.pack_into(batch, 0, base_offset, len(batch) - LENGTH_END, leader_epoch, 2, 0, 0, last_offset_delta,
                           base_ts, max_ts, -1, -1, -1, count)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[CRC_START:]))
