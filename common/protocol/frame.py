"""The gms frame: layout, limits, the decoded value and the encoder.

Every message on a gms connection, in both directions, is one frame::

    0               4               8                    8 + H                 4 + L
    +---------------+---------------+--------------------+---------------------+
    | frame_length  | header_length | header             | body                |
    | u32 BE  (= L) | u32 BE  (= H) | msgpack map, H B   | raw bytes, L - 4 - H|
    +---------------+---------------+--------------------+---------------------+

``frame_length`` counts the bytes after itself. The header is a msgpack map::

    {"code": int, "id": int, "flags": int, "status": int, "error": str, "fields": {str: any}}

``code`` and ``id`` are required; the others default to 0, 0, "" and {} and are left out
when they hold the default. Receivers ignore keys they do not know. The body is opaque to
the codec (for example concatenated stored records) and is never copied or re-encoded by
it: :func:`encode_frame` returns a list of buffers for ``transport.writelines``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, TypeAlias

import msgpack

from gms.errors import FrameTooLargeError
from gms.protocol.codes import Flag

PREFIX = struct.Struct(">II")  # frame_length, header_length
PREFIX_SIZE = PREFIX.size
LENGTH_FIELD_SIZE = 4  # frame_length counts everything after its own four bytes
assert PREFIX_SIZE == 8

# A frame is held whole in memory by both ends, so the body limit bounds the memory one
# request can pin. 64 MiB fits the largest producer batch and pull response the broker
# allows, with room to spare; bigger payloads must be split by the sender.
BODY_SIZE_MAX_BYTES = 64 * 1024 * 1024
# The header is msgpack-decoded eagerly, before any handler runs, so it needs its own,
# smaller bound. Request fields are a few scalars and names; 1 MiB still fits listings that
# grow with the cluster (topic lists, routes) without moving them into the body.
HEADER_SIZE_MAX_BYTES = 1024 * 1024
# The largest message a topic may allow (``message_size_bytes_max``): one record travels whole in a
# send request and in a pull answer, with room beside it in the frame.
MESSAGE_SIZE_BYTES_MAX_CEILING = BODY_SIZE_MAX_BYTES // 2
FRAME_SIZE_MAX_BYTES = LENGTH_FIELD_SIZE + HEADER_SIZE_MAX_BYTES + BODY_SIZE_MAX_BYTES
# The body of one SEND / SEND_BATCH request, unless it is a single record (which may be as large
# as the broker's message size limit). The broker appends a request in one piece on its event
# loop at about 1-2 us a record, so 2 MiB of the smallest records (~27,000) is about the 50 ms
# other clients may be kept waiting; it still holds a 1,000-message batch of 1 KiB bodies in one
# request. The SDK splits bigger batches; the broker refuses them before storing anything.
SEND_BODY_SIZE_MAX_BYTES = 2 * 1024 * 1024

EMPTY_FIELDS: Mapping[str, Any] = MappingProxyType({})

# What callers may pass as a body: one bytes-like object, or several sent back to back.
Buffer: TypeAlias = bytes | bytearray | memoryview
Body: TypeAlias = Buffer | Sequence[Buffer]


class Frame(NamedTuple):
    """One decoded frame. ``body`` is a read-only view into received bytes (zero-copy)."""

    code: int
    request_id: int
    flags: int = 0
    status: int = 0
    error: str = ""
    fields: Mapping[str, Any] = EMPTY_FIELDS
    body: Buffer = b""

    @property
    def is_response(self) -> bool:
        return bool(self.flags & _RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & _ONEWAY)


# Plain ints: IntFlag arithmetic costs about 1 µs, and these are asked of every frame.
_RESPONSE = int(Flag.RESPONSE)
_ONEWAY = int(Flag.ONEWAY)


class Response(NamedTuple):
    """What a request handler answers on success; the server adds code, id and status."""

    fields: Mapping[str, Any] = EMPTY_FIELDS
    body: Body = b""


_packb = msgpack.Packer(use_bin_type=True).pack


def _nbytes(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def encode_frame(
    code: int,
    request_id: int,
    *,
    flags: int = 0,
    status: int = 0,
    error: str = "",
    fields: Mapping[str, Any] | None = None,
    body: Body = b"",
    frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES,
) -> list[Buffer]:
    """Encode one frame as buffers to write in order; body buffers are passed through.

    Raises :class:`FrameTooLargeError` (``must_close`` false: nothing was sent) when the
    frame would exceed the receiver's limits.
    """
    header: dict[str, Any] = {"code": code, "id": request_id}
    if flags:
        header["flags"] = int(flags)
    if status:
        header["status"] = int(status)
    if error:
        header["error"] = error
    if fields:
        header["fields"] = fields
    header_bytes = _packb(header)
    header_size = len(header_bytes)
    if isinstance(body, (bytes, bytearray, memoryview)):
        parts: list[Buffer] = [body] if body else []
    else:
        parts = [part for part in body if part]
    body_size = sum(map(_nbytes, parts))
    frame_length = LENGTH_FIELD_SIZE + header_size + body_size
    if header_size > HEADER_SIZE_MAX_BYTES or frame_length > frame_size_max_bytes:
        raise FrameTooLargeError(
            f"frame of {frame_length} bytes (header {header_size}) exceeds the limit of "
            f"{frame_size_max_bytes} bytes (header {HEADER_SIZE_MAX_BYTES})",
            must_close=False,
            request_id=request_id,
        )
    return [PREFIX.pack(frame_length, header_size) + header_bytes, *parts]
