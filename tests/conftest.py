"""Fixtures shared by every suite: real server processes on ephemeral ports."""

from __future__ import annotations

from pathlib import Path

import pytest
from processes import BrokerProcess  # tests/ is on sys.path (rootdir conftest)


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers (``broker_factory(*args, store_dir=None)``); all are stopped afterwards."""
    started: list[BrokerProcess] = []

    def start(*args: str, store_dir: Path | None = None) -> BrokerProcess:
        proc = BrokerProcess(store_dir or tmp_path / f"broker{len(started)}", list(args))
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()
