"""Kafka's primitive types: fixed-width integers, (unsigned) varints, strings, bytes, arrays, and
the compact forms of flexible versions (lengths as unsigned varints plus one), with tagged fields.

Everything is big-endian. :class:`Reader` raises :class:`Malformed` for anything short or out of
range: the server answers a request it cannot read by closing the connection, as Kafka does.
"""

from __future__ import annotations

import struct
import uuid

_I8, _I16, _U16, _I32, _U32, _I64, _F64 = (struct.Struct(f">{c}") for c in "bhHiIqd")
# A length no request of this adapter can reach (the frame size bounds it first): a guard against
# allocating what a malformed length names.
LENGTH_MAX = 1 << 30


BY_REFERENCE_MIN = 64 << 10  # a byte field this large is not copied into a response frame
ResponseFrame = list[bytes | bytearray | memoryview]  # a response frame's buffers, written in order


class Malformed(ValueError):
    """A request's bytes do not follow its schema."""


class Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _take(self, n: int) -> int:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise Malformed(f"needs {n} bytes at {pos}, has {self.end - pos}")
        self.pos = pos + n
        return pos

    def _fixed(self, fmt: struct.Struct) -> int:
        return int(fmt.unpack_from(self.buf, self._take(fmt.size))[0])

    def int8(self) -> int:
        return self._fixed(_I8)

    def int16(self) -> int:
        return self._fixed(_I16)

    def uint16(self) -> int:
        return self._fixed(_U16)

    def int32(self) -> int:
        return self._fixed(_I32)

    def uint32(self) -> int:
        return self._fixed(_U32)

    def int64(self) -> int:
        return self._fixed(_I64)

    def float64(self) -> float:
        return float(_F64.unpack_from(self.buf, self._take(8))[0])

    def boolean(self) -> bool:
        return self._fixed(_I8) != 0

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self.raw(16)))

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self.buf[self._take(1)]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise Malformed("varint longer than 10 bytes")

    def varint(self) -> int:
        """A zig-zag signed varint (record fields)."""
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def raw(self, n: int) -> memoryview:
        pos = self._take(n)
        return self.buf[pos:pos + n]

    def length(self, compact: bool, what: str) -> int:
        """An array's or string's length: -1 for null."""
        n = self.uvarint() - 1 if compact else self.int32() if what != "string" else self.int16()
        if n < -1 or n > LENGTH_MAX:
            raise Malformed(f"{what} length {n}")
        return n

    def string(self, compact: bool) -> str | None:
        n = self.length(compact, "string")
        if n < 0:
            return None
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as err:
            raise Malformed(f"string is not UTF-8: {err}") from err

    def blob(self, compact: bool) -> memoryview | None:
        n = self.length(compact, "bytes")
        return None if n < 0 else self.raw(n)

    def tagged(self) -> dict[int, memoryview]:
        """A tagged-field section: tag -> raw value."""
        return {self.uvarint(): self.raw(self.uvarint()) for _ in range(self.uvarint())}

    def remaining(self) -> int:
        return self.end - self.pos


class Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> None:
        self.buf += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self.buf += _U16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def float64(self, v: float) -> None:
        self.buf += _F64.pack(v)

    def boolean(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def uuid(self, v: uuid.UUID | None) -> None:
        self.buf += (v or uuid.UUID(int=0)).bytes

    def uvarint(self, v: int) -> None:
        self.buf += uvarint_bytes(v)

    def varint(self, v: int) -> None:
        self.buf += uvarint_bytes((v << 1) ^ (v >> 63))

    def length(self, n: int, compact: bool, string: bool = False) -> None:
        if compact:
            self.uvarint(n + 1)
        elif string:
            self.int16(n)
        else:
            self.int32(n)

    def string(self, v: str | None, compact: bool) -> None:
        if v is None:
            self.length(-1, compact, True)
            return
        raw = v.encode()
        self.length(len(raw), compact, True)
        self.buf += raw

    def blob(self, v: bytes | bytearray | memoryview | None, compact: bool) -> None:
        if v is None:
            self.length(-1, compact)
            return
        self.length(len(v), compact)
        self.buf += v


class FrameWriter(Writer):
    """A Writer of one response frame that keeps its large byte fields (a fetch's record batches)
    by reference instead of copying them in: :meth:`parts` are the frame's buffers, in order, for
    one ``writelines`` (a fetch of 1.7 MB was copied once more here, and its answer written)."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        super().__init__()
        self._parts: ResponseFrame = []
        self._size = 0  # the bytes in _parts

    def blob(self, v: bytes | bytearray | memoryview | None, compact: bool) -> None:
        if v is None or len(v) < BY_REFERENCE_MIN:
            super().blob(v, compact)
            return
        self.length(len(v), compact)
        self._parts += (self.buf, v)
        self._size += len(self.buf) + len(v)
        self.buf = bytearray()

    def size(self) -> int:
        return self._size + len(self.buf)

    def parts(self) -> ResponseFrame:
        return [*self._parts, self.buf]


def uvarint_bytes(v: int) -> bytes:
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)
