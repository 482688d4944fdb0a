"""Producer-side record encoding for many messages at once.

:func:`gms.record.encode_record` costs about 2 µs a message (validation, a fresh buffer and a
CRC call each). Here the checks that depend only on the topic or tag are cached, each message
adds its parts to a list, and :meth:`BatchBuilder.seal` joins them once and patches every CRC
in one pass: about 0.6 µs a 100-byte message. The layout is :mod:`gms.record`'s.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Mapping, Sequence

from gms.errors import InvalidTopicError, MessageIllegalError
from gms.naming import validate_topic_name
from gms.record import (
    BORN_HOST_BYTES_MAX,
    HEADER,
    HEADER_SIZE,
    KEYS_BYTES_MAX,
    MAGIC_V1,
    OFF_CRC,
    OFF_CRC_START,
    PROPS_BYTES_MAX,
    TAG_BYTES_MAX,
    encode_keys,
    encode_properties,
    tag_hash,
)
from gms.store_errors import InvalidRecord, InvalidTopicName

_CRC = struct.Struct(">I")
# Records travel in one frame; the broker refuses bigger ones anyway, so say it early.
BODY_SIZE_MAX_BYTES = 4 * 1024 * 1024
_CACHE_ENTRIES_MAX = 4096


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
            properties: Mapping[str, str] | None = None, queue_id: int = 0) -> int:
        """Append one record to ``batch``; returns its size. Raises a typed error for bad input."""
        topic_raw = self.topic(topic)
        tag_raw, hashed = self._tag(tag)
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"message body must be bytes-like, not {type(body).__name__}")
        body_len = len(body)
        if body_len > self.body_size_max_bytes:
            raise MessageIllegalError(
                f"body of {body_len} bytes exceeds the limit of {self.body_size_max_bytes}")
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
        batch.parts += (
            HEADER.pack(total, MAGIC_V1, 0, queue_id, 0, 0, 0, 0, batch.born_ts_ms, hashed, 0,
                        body_len, len(topic_raw), len(tag_raw), len(host_raw), 0,
                        len(keys_raw), len(props_raw)),
            topic_raw, tag_raw, host_raw, keys_raw, props_raw, body,
        )
        batch.sizes.append(total)
        batch.size_bytes += total
        return total


class BatchBuilder:
    """Records being collected for one send request."""

    __slots__ = ("parts", "sizes", "size_bytes", "born_ts_ms")

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray | memoryview] = []
        self.sizes: list[int] = []
        self.size_bytes = 0
        self.born_ts_ms = int(time.time() * 1000)

    def __len__(self) -> int:
        return len(self.sizes)

    def seal(self) -> bytearray:
        """The request body: all records, each with its CRC."""
        buf = bytearray(b"".join(self.parts))
        view = memoryview(buf)
        crc, pack_into = zlib.crc32, _CRC.pack_into
        pos = 0
        for size in self.sizes:
            pack_into(buf, pos + OFF_CRC, crc(view[pos + OFF_CRC_START: pos + size]))
            pos += size
        view.release()
        return buf
