"""Client fixtures: one broker per test module (starting one costs ~1 s), a fresh topic per test.

Tests that restart or kill brokers use the function-scoped ``broker_factory`` instead.
"""

from __future__ import annotations

import time
import uuid

import pytest
from processes import BrokerProcess

from gms.client import Admin, Consumer, ReceivedMessage

QUEUES = 8


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("broker") / "store", [])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def admin(broker):
    with Admin([broker.address]) as client:
        yield client


@pytest.fixture
def topic(admin) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topic(name, queues=QUEUES)
    return name


def consume(consumer: Consumer, count: int, timeout_s: float = 10.0) -> list[ReceivedMessage]:
    """Poll until ``count`` messages arrived (or the deadline passed)."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(200)
    return got
