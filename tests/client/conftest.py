"""Client fixtures: one broker per test module (starting one costs ~1 s), a fresh topic per test.

Tests that restart or kill brokers use the function-scoped ``broker_factory`` instead.
"""

from __future__ import annotations

import uuid

import pytest
from client_helpers import QUEUES
from processes import BrokerProcess

from gms.client import Admin


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
