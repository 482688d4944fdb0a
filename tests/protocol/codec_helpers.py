"""Helpers for the codec tests: encode to one bytes object, drain a decoder."""

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
