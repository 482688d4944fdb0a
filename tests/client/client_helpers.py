"""Helpers shared by the client tests (a uniquely named module: every suite has a conftest)."""

from __future__ import annotations

import time

from gms.client import Consumer, ReceivedMessage

QUEUES = 8


def consume(consumer: Consumer, count: int, timeout_s: float = 10.0) -> list[ReceivedMessage]:
    """Poll until ``count`` messages arrived (or the deadline passed)."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(200)
    return got
