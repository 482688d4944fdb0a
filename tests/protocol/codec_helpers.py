"""Helpers for the codec tests: encode to one bytes object, give it to a decoder, drain it."""

from __future__ import annotations

from typing import Any

from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import Frame, encode_frame


def encode(code: int = 10, request_id: int = 1, **kwargs: Any) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(code, request_id, **kwargs))


def drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while True:
        item = decoder.next_frame()
        if isinstance(item, Event):
            return frames
        frames.append(item)


def read_into(decoder: FrameDecoder, data: bytes, read_size: int | None = None) -> None:
    """Give ``data`` to ``decoder`` as a reading receiver does (``get_buffer`` /
    ``buffer_updated``), ``read_size`` bytes at most per read (else as much as each buffer takes)."""
    while data:
        buffer = decoder.get_buffer(-1)
        n = min(len(buffer), len(data), read_size or len(data))
        buffer[:n] = data[:n]
        decoder.buffer_updated(n)
        data = data[n:]


def give(decoder: FrameDecoder, data: bytes, mode: str) -> None:
    """``data`` to ``decoder`` either way: "feed" or "read" (:func:`read_into`); b"" ends the stream."""
    if mode == "feed" or not data:
        decoder.feed(data)
    else:
        read_into(decoder, data)
