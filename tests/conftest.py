"""Fixtures shared by every suite: real server processes on ephemeral ports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from processes import BrokerProcess  # tests/ is on sys.path (rootdir conftest)

# Property tests check results, not speed: on a loaded host one example can take 100x its usual
# time, which hypothesis's default 200 ms deadline would report as a failure.
settings.register_profile("gms", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gms")


@pytest.fixture(scope="session")
def _main_thread_loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def main_thread_event_loop(_main_thread_loop) -> None:
    """The main thread's current event loop, set again for each test: an earlier test's
    ``asyncio.run`` ends with ``set_event_loop(None)``, after which the main thread has none. The
    official RocketMQ client creates gRPC calls on whichever thread completes its route query: on
    a loaded machine the answer may come before the test's thread registers its callback, which
    then runs there, and grpc.aio asks that thread for its event loop -- "There is no current
    event loop in thread 'MainThread'", the route is not cached, and the client fails with
    "failed to fetch topic route" (a CI run of test_rocketmq_cluster). A loop of its own, never
    run, as an untouched main thread gets one on request; the calls run on the client's loop."""
    asyncio.set_event_loop(_main_thread_loop)


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
