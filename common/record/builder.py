"""Producer-side record encoding for many messages at once.

:func:`gms.record.encode_record` costs about 2 µs a message (validation, a fresh buffer and a
CRC pass each). Here a record is three pieces: the first 12 bytes (size, magic, CRC), a
*shape* (the broker's envelope, the CRC-covered fixed fields, topic, tag, born host, keys,
properties) and the body. A batch's messages mostly share a shape (same topic, tag and body
length, no keys or properties), so each shape is packed once per batch together with the
CRC of its covered part; a message then costs one C call (``BatchCore.add``: the CRC continued
over the body, the record copied into the batch's one buffer). ``BatchBuilder.seal`` copies that
buffer out once. The layout is :mod:`gms.record`'s.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from gms.errors import InvalidTopicError, MessageIllegalError
from gms.naming import validate_topic_name
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING, SEND_BODY_SIZE_MAX_BYTES
from gms.record import (
    BORN_HOST_BYTES_MAX,
    HEADER,
    HEADER_SIZE,
    KEYS_BYTES_MAX,
    MAGIC_V1,
    OFF_CRC_START,
    OFF_QUEUE_ID,
    PROPS_BYTES_MAX,
    TAG_BYTES_MAX,
    encode_keys,
    encode_properties,
    tag_hash,
)
from gms.record._recordcheck import BatchCore
from gms.record.sequence import STAMP_BYTES
from gms.store_errors import InvalidRecord, InvalidTopicName

_OFF_SHAPE = 12  # total_size, magic, crc32: the per-record start add_record writes
assert _OFF_SHAPE == OFF_QUEUE_ID
# Records travel in one frame; no topic may allow more, so say it early. Each topic's own limit
# (message_size_bytes_max, 4 MiB by default) is the broker's to check: its refusal names the topic.
BODY_SIZE_MAX_BYTES = MESSAGE_SIZE_BYTES_MAX_CEILING
_CACHE_ENTRIES_MAX = 4096
# A request body's limit, less the room an idempotent producer's stamp takes in its first record.
REQUEST_BYTES_MAX = SEND_BODY_SIZE_MAX_BYTES - STAMP_BYTES
# Distinct shapes one batch keeps; past this, shapes are still packed but no longer kept.
_SHAPES_PER_BATCH_MAX = 256


class RecordEncoder:
    """Validates and encodes messages; caches the encoded topic names and tags."""

    def __init__(self, born_host: str = "", body_size_max_bytes: int = BODY_SIZE_MAX_BYTES) -> None:
        host_raw = born_host.encode()
        if len(host_raw) > BORN_HOST_BYTES_MAX:
            raise ValueError(f"born_host is longer than {BORN_HOST_BYTES_MAX} bytes")
        self._host_raw = host_raw
        self.body_size_max_bytes = body_size_max_bytes
        self._topics: dict[str, bytes] = {}
        self._tags: dict[str | None, tuple[bytes, int]] = {}

    def topic(self, topic: str) -> bytes:
        raw = self._topics.get(topic)
        if raw is None:
            try:
                raw = validate_topic_name(topic).encode()
            except InvalidTopicName as err:
                raise InvalidTopicError(str(err)) from err
            if len(self._topics) >= _CACHE_ENTRIES_MAX:
                self._topics.clear()
            self._topics[topic] = raw
        return raw

    def _tag(self, tag: str | None) -> tuple[bytes, int]:
        found = self._tags.get(tag)
        if found is None:
            raw = (tag or "").encode()
            if len(raw) > TAG_BYTES_MAX:
                raise MessageIllegalError(f"tag of {len(raw)} bytes exceeds the limit of {TAG_BYTES_MAX}")
            if len(self._tags) >= _CACHE_ENTRIES_MAX:
                self._tags.clear()
            found = self._tags[tag] = (raw, tag_hash(tag))
        return found

    def add(self, batch: BatchBuilder, topic: str, body: bytes | bytearray | memoryview,
            tag: str | None = None, keys: Sequence[str] = (),
            properties: Mapping[str, str] | None = None, flags: int = 0, reconsume_times: int = 0) -> int:
        """Append one record to ``batch``; returns its size. Raises a typed error for bad input.
        ``flags``: record flags (FLAG_SCHEDULED; such a record carries properties)."""
        if type(body) is not bytes and not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"message body must be bytes-like, not {type(body).__name__}")
        body_len = len(body)
        if body_len > self.body_size_max_bytes:
            raise MessageIllegalError(
                f"body of {body_len} bytes exceeds the limit of {self.body_size_max_bytes}")
        if keys or properties or flags or reconsume_times:
            shape, shape_crc, total = self._shape(batch, topic, body_len, tag, keys, properties, flags,
                                                  reconsume_times)
        else:
            found = batch.shapes.get((topic, tag, body_len))
            if found is None:
                found = self._shape(batch, topic, body_len, tag, (), None)
                if len(batch.shapes) < _SHAPES_PER_BATCH_MAX:
                    batch.shapes[(topic, tag, body_len)] = found
            shape, shape_crc, total = found
        batch.add(total, shape_crc, shape, body)  # size/magic/CRC, shape, body
        return total

    def _shape(self, batch: BatchBuilder, topic: str, body_len: int, tag: str | None,
               keys: Sequence[str], properties: Mapping[str, str] | None, flags: int = 0,
               reconsume_times: int = 0) -> tuple[bytes, int, int]:
        """Header bytes from the queue id on plus the variable fields before the body, the CRC
        of their covered part, and the record's total size."""
        topic_raw = self.topic(topic)
        tag_raw, hashed = self._tag(tag)
        keys_raw = props_raw = b""
        try:
            if keys:
                if isinstance(keys, str):
                    keys = (keys,)
                keys_raw = encode_keys(keys)
                if len(keys_raw) > KEYS_BYTES_MAX:
                    raise InvalidRecord("keys", f"{len(keys_raw)} bytes exceeds {KEYS_BYTES_MAX}")
            if properties:
                props_raw = encode_properties(properties)
                if len(props_raw) > PROPS_BYTES_MAX:
                    raise InvalidRecord("properties", f"{len(props_raw)} bytes exceeds {PROPS_BYTES_MAX}")
        except InvalidRecord as err:
            raise MessageIllegalError(str(err)) from err
        host_raw = self._host_raw
        total = (HEADER_SIZE + len(topic_raw) + len(tag_raw) + len(host_raw) + len(keys_raw)
                 + len(props_raw) + body_len)
        header = HEADER.pack(total, MAGIC_V1, 0, batch.queue_id, 0, 0, 0, flags, batch.born_ts_ms, hashed,
                             reconsume_times,
                             body_len, len(topic_raw), len(tag_raw), len(host_raw), 0,
                             len(keys_raw), len(props_raw))
        shape = b"".join((header[_OFF_SHAPE:], topic_raw, tag_raw, host_raw, keys_raw, props_raw))
        return shape, zlib.crc32(memoryview(shape)[OFF_CRC_START - _OFF_SHAPE:]), total


class BatchBuilder(BatchCore):
    """Records being collected for one send request to one queue: ``BatchBuilder(queue_id)``.
    Its state and ``add`` are C (``BatchCore``), so that send_async's plain path appends to it
    in one C call (gms.client._append)."""

    __slots__ = ()

    def __len__(self) -> int:
        return self.count

    def seal_requests(self, size_bytes_max: int = REQUEST_BYTES_MAX) -> list[bytearray]:
        """The records as request bodies of at most ``size_bytes_max`` bytes each (a bigger
        record alone), in order: what the broker accepts in one send request."""
        return [body for body, _ in self.seal_counted(size_bytes_max)]

    def seal_counted(self, size_bytes_max: int = REQUEST_BYTES_MAX) -> list[tuple[bytearray, int]]:
        """:meth:`seal_requests`, each body with the number of records it holds."""
        if self.size_bytes <= size_bytes_max:
            return [(self.seal(), self.count)]
        ends = np.frombuffer(self.record_ends(), np.int64)
        bodies = []
        first = 0  # the first record of the next body
        while first < len(ends):
            start_bytes = int(ends[first - 1]) if first else 0
            stop = max(int(np.searchsorted(ends, start_bytes + size_bytes_max, "right")), first + 1)
            bodies.append((self.seal(start_bytes, int(ends[stop - 1])), stop - first))
            first = stop
        return bodies
