"""An idempotent producer's batch sequence, carried by the first record of each batch.

The producer stamps the first record of every request body with ``FLAG_SEQUENCED`` and, as its
last property, ``__PRODUCER_SEQ`` = ``<producer id>.<epoch>.<sequence>.<count>`` in fixed-width
hex: who sent the batch, its number among that producer's batches to the queue, and how many
records it holds (docs/idempotence.md). The stamp is in the log, so every replica and every
restart knows the last batches of each producer per queue; fixed width lets a batch moved to
another queue be restamped in place. Stamping costs one insertion into the body and the CRC of
its first record, once per batch.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import numpy as np

from gms.record._recordcheck import read_stamps
from gms.record.codec import seal_crc
from gms.record.layout import FLAG_SEQUENCED, HEADER, HEADER_SIZE, OFFSETS, PROPS_BYTES_MAX, SEQUENCE_PROPERTY
from gms.store_errors import InvalidRecord

Buffer = bytes | bytearray | memoryview | np.ndarray  # a store file's array too
_NAME = (SEQUENCE_PROPERTY + "\x01").encode()
_VALUE_BYTES = 16 + 1 + 8 + 1 + 16 + 1 + 8  # producer id . epoch . sequence . count
STAMP_BYTES = len(_NAME) + _VALUE_BYTES + 1  # name, value, property separator
# what BatchSequence.encode writes (int() alone would also take signs, underscores and blanks)
_VALUE = re.compile(rb"([0-9a-f]{16})\.([0-9a-f]{8})\.([0-9a-f]{16})\.([0-9a-f]{8})")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_OFF_FLAGS, _OFF_PROPS_LEN = OFFSETS["flags"], OFFSETS["props_len"]


# Kafka's producers number a queue's records, not its batches: a batch's sequence is the number of
# its first record, the next batch's that plus its count (modulo 2**31, where Kafka's wrap). Their
# stamps (the Kafka endpoint's, broker/kafka/idempotence.py) carry this bit in the epoch; gms's own
# producers number batches 0, 1, 2 ... under epochs that never reach it.
RECORD_NUMBERED = 1 << 30
KAFKA_SEQUENCE_WRAP = 1 << 31


class BatchSequence(NamedTuple):
    producer_id: int  # 0..2**63-1
    epoch: int  # 0..2**31-1: bumped by the producer to restart its sequence of a queue at 0
    sequence: int  # the batch's number among the producer's batches to its queue in this epoch
    records: int  # how many the batch holds

    @property
    def following(self) -> int:
        """The sequence of the producer's next batch to the queue after this one (same epoch)."""
        if self.epoch & RECORD_NUMBERED:
            return (self.sequence + self.records) % KAFKA_SEQUENCE_WRAP
        return self.sequence + 1

    def encode(self) -> bytes:
        return f"{self.producer_id:016x}.{self.epoch:08x}.{self.sequence:016x}.{self.records:08x}".encode()

    def stamp(self) -> bytes:
        """The property a batch's first record carries last (STAMP_BYTES): name, value, separator."""
        return b"".join((_NAME, self.encode(), b"\x02"))


def _props_end(buf: Buffer, pos: int) -> tuple[int, int, int]:
    """(flags, props_len, end of the properties) of the record at ``pos``."""
    (_, _, _, _, _, _, _, flags, _, _, _, _, topic_len, tag_len, host_len, _, keys_len,
     props_len) = HEADER.unpack_from(buf, pos)  # type: ignore[arg-type]  # numpy arrays are buffers
    return flags, props_len, pos + HEADER_SIZE + topic_len + tag_len + host_len + keys_len + props_len


def stamp_sequence(body: bytearray, sequence: BatchSequence) -> None:
    """Stamp the first record of ``body`` (restamp it if stamped already); ValueError if its
    properties have no room left."""
    flags, props_len, end = _props_end(body, 0)
    if flags & FLAG_SEQUENCED:
        body[end - 1 - _VALUE_BYTES:end - 1] = sequence.encode()
    else:
        if props_len + STAMP_BYTES > PROPS_BYTES_MAX:
            raise ValueError("the first record's properties leave no room for the producer sequence")
        body[end:end] = sequence.stamp()
        _I32.pack_into(body, 0, _I32.unpack_from(body)[0] + STAMP_BYTES)
        _I32.pack_into(body, _OFF_FLAGS, flags | FLAG_SEQUENCED)
        _U16.pack_into(body, _OFF_PROPS_LEN, props_len + STAMP_BYTES)
    seal_crc(body)


def read_sequences(buf: Buffer, ends: np.ndarray) -> list[BatchSequence] | None:
    """:func:`read_sequence` of many records in one C call (``read_stamps``): ``ends`` are where
    their properties end. None if any stamp is not exactly as :func:`stamp_sequence` writes it
    (:func:`read_sequence` then says what is wrong)."""
    stamps = read_stamps(buf, ends.astype(np.int64, copy=False), _NAME)
    return None if stamps is None else list(map(BatchSequence._make, stamps))


def read_sequence(buf: Buffer, pos: int = 0) -> BatchSequence:
    """The sequence stamped on the record at ``pos`` (which carries FLAG_SEQUENCED);
    InvalidRecord if it is not where and how :func:`stamp_sequence` writes it."""
    _, props_len, end = _props_end(buf, pos)
    stamp = bytes(buf[end - STAMP_BYTES:end]) if props_len >= STAMP_BYTES else b""
    if not stamp.startswith(_NAME) or stamp[-1] != 2:
        raise InvalidRecord(SEQUENCE_PROPERTY, "a sequenced record carries the producer sequence as its last property")
    value = _VALUE.fullmatch(stamp, len(_NAME), STAMP_BYTES - 1)
    if value is None:
        raise InvalidRecord(SEQUENCE_PROPERTY, "the producer sequence is not four fixed-width hex numbers")
    producer_id, epoch, sequence, records = [int(part, 16) for part in value.groups()]
    if records < 1 or producer_id >= 1 << 63 or epoch >= 1 << 31:
        raise InvalidRecord(SEQUENCE_PROPERTY, "the producer sequence is out of range")
    return BatchSequence(producer_id, epoch, sequence, records)
