"""gms.net.writes: what is left of a frame's buffers after a partial write."""

from __future__ import annotations

import pytest

from gms.net.writes import unsent

PARTS = [b"abc", bytearray(b""), bytearray(b"de"), memoryview(b"fghij")[1:]]
WHOLE = b"abcdeghij"


@pytest.mark.parametrize("sent", range(len(WHOLE) + 1))
def test_what_is_left_is_the_frame_past_the_bytes_sent(sent):
    rest = unsent(PARTS, sent)
    assert b"".join(bytes(part) for part in rest) == WHOLE[sent:]
    assert len(rest) <= len(PARTS)
