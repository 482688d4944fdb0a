"""Sans-IO frame decoder: bytes in, :class:`Frame` values out (in the style of h11).

Feed it whatever the transport delivered, then call :meth:`FrameDecoder.next_frame` until
it returns ``Event.NEED_DATA``; ``feed(b"")`` marks the end of the stream, after which it
returns ``Event.CLOSED`` once every complete frame has been taken. Bad input raises a
:class:`ProtocolError` whose ``must_close`` says whether the stream can go on.

Copies: frames that arrive whole inside one fed ``bytes`` chunk are decoded in place and
their bodies are read-only memoryviews of that chunk (a body pins its chunk until
dropped). Only a frame split across chunks is assembled, into a bytearray of its own that
is never reused, so its body is a view too. Assembly appends to that bytearray, so feeding
a frame one byte at a time stays linear.

A receiver may instead read straight into the decoder (``get_buffer`` / ``buffer_updated``,
the shape of ``asyncio.BufferedProtocol``): then no received byte is copied at all, however
many reads a frame takes, since the decoder hands out room where the whole frame fits. One
decoder is fed one way or the other, not both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from enum import Enum
from typing import Any

import msgpack
import numpy as np

from gms.errors import FrameTooLargeError, MalformedFrameError, ProtocolError
from gms.protocol.frame import (
    EMPTY_FIELDS,
    FRAME_SIZE_MAX_BYTES,
    HEADER_SIZE_MAX_BYTES,
    LENGTH_FIELD_SIZE,
    PREFIX,
    PREFIX_SIZE,
    Buffer,
    Frame,
)

# The receive buffer a reading receiver gets: large enough for many small frames or a good
# share of a large one (a larger frame gets a buffer of its own size).
RECEIVE_BUFFER_BYTES = 256 * 1024
# Less free room than this at the end of the receive buffer, and the next read goes to a new
# buffer: reads that small would cost more in calls than the buffer's tail is worth.
RECEIVE_ROOM_MIN_BYTES = 16 * 1024


class Event(Enum):
    """What :meth:`FrameDecoder.next_frame` returns when it has no frame."""

    NEED_DATA = "need_data"  # feed more bytes
    CLOSED = "closed"  # the stream ended cleanly between frames


_HEADER_KEY_TYPES = (("flags", int), ("status", int), ("error", str), ("fields", dict))


def _unpack_header(view: memoryview) -> Any:
    try:
        return msgpack.unpackb(view, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        # ExtraData, FormatError, StackError, bad UTF-8 and non-string map keys all land here.
        raise MalformedFrameError(f"header is not valid msgpack: {err}", must_close=False) from err


def _parse_header(view: memoryview) -> tuple[int, int, int, int, str, Any]:
    """Validate the header map; the frame is already skipped, so errors keep the stream."""
    header = _unpack_header(view)
    if type(header) is not dict:
        raise MalformedFrameError(
            f"header is a {type(header).__name__}, not a map", must_close=False
        )
    request_id = header.get("id")
    if type(request_id) is not int or request_id < 0:
        raise MalformedFrameError("header id must be a non-negative integer", must_close=False)
    code = header.get("code")
    if type(code) is not int:
        raise MalformedFrameError(
            "header code must be an integer", must_close=False, request_id=request_id
        )
    for key, expected in _HEADER_KEY_TYPES:
        value = header.get(key)
        if value is not None and type(value) is not expected:
            raise MalformedFrameError(
                f"header {key} must be a {expected.__name__}, not {type(value).__name__}",
                must_close=False,
                request_id=request_id,
            )
    return (
        code,
        request_id,
        header.get("flags", 0),
        header.get("status", 0),
        header.get("error", ""),
        header.get("fields") or EMPTY_FIELDS,
    )


class FrameDecoder:
    """Incremental decoder for one direction of one connection."""

    def __init__(
        self,
        *,
        frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES,
        header_size_max_bytes: int = HEADER_SIZE_MAX_BYTES,
    ) -> None:
        self._frame_size_max_bytes = frame_size_max_bytes
        self._header_size_max_bytes = header_size_max_bytes
        self._chunks: deque[memoryview] = deque()  # fed, unread, immutable; never empty views
        self._chunk_bytes = 0
        self._partial = bytearray()  # the start of one frame split across chunks
        # The total size of the frame being assembled (or received into the receive buffer)
        # once its prefix is known, else 0.
        self._partial_size = 0
        # The receive buffer of a reading receiver: written only past _recv_end, so frames
        # handed out of [.., _recv_start) stay as they are; _frozen is its read-only twin.
        self._recv: memoryview | None = None
        self._frozen = memoryview(b"")
        self._recv_start = 0  # the first byte not yet handed out as a frame
        self._recv_end = 0  # the end of what was received
        self._eof = False
        self._fatal: ProtocolError | None = None
        self.frames_decoded = 0  # tells a receiver timing headers that a new frame has begun

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet handed out as frames."""
        return self._chunk_bytes + len(self._partial) + self._recv_end - self._recv_start

    @property
    def reserved_bytes(self) -> int:
        """Memory this decoder holds or is committed to hold: what is buffered, or the declared
        size of the frame being assembled once its prefix is in (it will be held whole)."""
        return max(self.buffered_bytes, self._partial_size)

    @property
    def header_pending(self) -> bool:
        """Whether a frame has begun to arrive but its prefix and header are not complete yet
        (a receiver times this: a peer that starts frames and never finishes their headers)."""
        partial = self._partial if self._recv is None else self._frozen[self._recv_start: self._recv_end]
        if not partial:
            return False
        if len(partial) < PREFIX_SIZE:
            return True
        return len(partial) < PREFIX_SIZE + PREFIX.unpack_from(partial)[1]

    def feed(self, data: Buffer) -> None:
        """Add received bytes; ``b""`` means the peer closed its side."""
        if self._eof:
            raise RuntimeError("feed() after end of stream")
        if not data:
            self._eof = True
            return
        if self._recv is not None:
            raise RuntimeError("feed() to a decoder that is read into")
        if type(data) is not bytes:
            data = bytes(data)  # bodies are views of it: it must never change
        self._chunks.append(memoryview(data))
        self._chunk_bytes += len(data)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go (``sizehint`` is ignored): the free end of the
        receive buffer, in a new buffer when the frame being received would not fit whole in
        this one (its start moves there; nothing else is ever copied)."""
        if self._eof:
            raise RuntimeError("get_buffer() after end of stream")
        if self._chunks or self._partial:
            raise RuntimeError("get_buffer() to a decoder that is fed")
        recv, start, end = self._recv, self._recv_start, self._recv_end
        if recv is None or not self._room_in(recv):
            # Uninitialised memory (no zeroing): only what was received is ever read. Room for
            # the frame being received whole, and for a fair read past what is unread (frames
            # not taken yet, when the receiver reads again before taking them).
            size = max(self._partial_size, end - start + RECEIVE_ROOM_MIN_BYTES, RECEIVE_BUFFER_BYTES)
            fresh = np.empty(size, np.uint8).data
            if recv is not None:
                fresh[: end - start] = recv[start:end]
            recv = self._recv = fresh
            self._frozen = fresh.toreadonly()
            self._recv_start, self._recv_end = 0, end - start
        return recv[self._recv_end:]

    def _room_in(self, recv: memoryview) -> bool:
        """Whether the next read may go to the end of ``recv``: the frame being received fits
        in it whole (once its size is known), else more than a tiny read's room is left."""
        if self._partial_size:
            return self._recv_start + self._partial_size <= len(recv) and self._recv_end < len(recv)
        return len(recv) - self._recv_end >= RECEIVE_ROOM_MIN_BYTES

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`."""
        self._recv_end += nbytes

    def next_frame(self) -> Frame | Event:
        """The next complete frame, ``Event.NEED_DATA`` or ``Event.CLOSED``."""
        if self._fatal is not None:
            raise self._fatal
        try:
            if self._recv is not None:
                frame = self._from_recv()
            else:
                frame = self._assemble() if self._partial else self._from_chunk()
        except ProtocolError as err:
            if err.must_close:
                self._fatal = err
            raise
        if frame is not None:
            return frame
        if self._eof:
            if self.buffered_bytes:
                self._fatal = MalformedFrameError(
                    f"stream ended inside a frame ({self.buffered_bytes} bytes pending)"
                )
                raise self._fatal
            return Event.CLOSED
        return Event.NEED_DATA

    def __iter__(self) -> Iterator[Frame]:
        """Yield every complete frame now available."""
        while True:
            frame = self.next_frame()
            if type(frame) is not Frame:
                return
            yield frame

    def _frame_size(self, prefix: Buffer) -> int:
        """Total size of the frame starting with these 8 bytes; checks the limits."""
        frame_length, header_length = PREFIX.unpack(prefix)
        size = LENGTH_FIELD_SIZE + frame_length
        if size > self._frame_size_max_bytes:
            raise FrameTooLargeError(
                f"frame of {size} bytes exceeds the limit of {self._frame_size_max_bytes}"
            )
        if header_length > self._header_size_max_bytes:
            raise FrameTooLargeError(
                f"header of {header_length} bytes exceeds the limit of "
                f"{self._header_size_max_bytes}"
            )
        if header_length == 0 or LENGTH_FIELD_SIZE + header_length > frame_length:
            raise MalformedFrameError(
                f"header length {header_length} does not fit frame length {frame_length}"
            )
        return size

    def _from_chunk(self) -> Frame | None:
        """Decode a frame lying whole in the head chunk in place, else start assembling."""
        if not self._chunks:
            return None
        chunk = self._chunks[0]
        available = len(chunk)
        if available >= PREFIX_SIZE:
            size = self._frame_size(chunk[:PREFIX_SIZE])
            if available >= size:
                self._advance(size)
                return self._decode(chunk[:size])
        self._partial = bytearray(chunk)
        self._advance(available)
        return self._assemble()

    def _from_recv(self) -> Frame | None:
        """Decode the frame at the start of the unread part of the receive buffer, if it is all in."""
        start = self._recv_start
        available = self._recv_end - start
        if not self._partial_size:
            if available < PREFIX_SIZE:
                return None
            self._partial_size = self._frame_size(self._frozen[start: start + PREFIX_SIZE])
        size = self._partial_size
        if available < size:
            return None
        self._partial_size = 0
        self._recv_start = start + size
        return self._decode(self._frozen[start: start + size])

    def _advance(self, size: int) -> None:
        """Consume ``size`` bytes of the head chunk."""
        rest = self._chunks[0][size:]
        if rest:
            self._chunks[0] = rest
        else:
            self._chunks.popleft()
        self._chunk_bytes -= size

    def _fill_partial(self, size: int) -> bool:
        """Move bytes from the chunks into the partial frame until it holds ``size`` bytes."""
        partial = self._partial
        while len(partial) < size and self._chunks:
            piece = self._chunks[0][: size - len(partial)]
            partial += piece
            self._advance(len(piece))
        return len(partial) >= size

    def _assemble(self) -> Frame | None:
        if not self._partial_size:
            if not self._fill_partial(PREFIX_SIZE):
                return None
            self._partial_size = self._frame_size(self._partial[:PREFIX_SIZE])
        if not self._fill_partial(self._partial_size):
            return None
        # A fresh bytearray for the next partial frame: this one is exported as the body.
        frame = memoryview(self._partial).toreadonly()
        self._partial = bytearray()
        self._partial_size = 0
        return self._decode(frame)

    def _decode(self, frame: memoryview) -> Frame:
        header_end = PREFIX_SIZE + PREFIX.unpack_from(frame)[1]
        self.frames_decoded += 1
        code, request_id, flags, status, error, fields = _parse_header(frame[PREFIX_SIZE:header_end])
        return Frame(code, request_id, flags, status, error, fields, frame[header_end:])
