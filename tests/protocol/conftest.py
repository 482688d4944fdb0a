"""Fixtures for the codec tests (helpers live in codec_helpers.py)."""

from __future__ import annotations

import pytest

from gms.protocol.decoder import FrameDecoder


@pytest.fixture
def decoder() -> FrameDecoder:
    return FrameDecoder()
