"""Fixtures shared by every suite: real server processes on ephemeral ports."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from processes import BrokerProcess  # tests/ is on sys.path (rootdir conftest)

# Property tests check results, not speed: on a loaded host one example can take 100x its usual
# time, which hypothesis's default 200 ms deadline would report as a failure.
settings.register_profile("gms", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gms")


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
