"""Fixtures of the web console's tests: a real cluster with known data (messages per queue, a
consumer group with a live member and known committed offsets), console processes on it, and
one headless Chromium for the whole directory."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cluster_data import ASSIGN_TIMEOUT_S, COMMITTED, GROUP, SENT_PER_QUEUE, TOPIC, ClusterData
from console_helpers import Browser, ConsoleProcess, chromium_missing, screenshot_dir
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer, ProducerRecord


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    running = LocalCluster(tmp_path_factory.mktemp("console-cluster")).start(nameservers=1, brokers=1)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="package")
def data(cluster: LocalCluster) -> Iterator[ClusterData]:
    """TOPIC with SENT_PER_QUEUE messages, and GROUP with one live member holding every queue
    and COMMITTED offsets."""
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(TOPIC, len(SENT_PER_QUEUE))
    with Producer(nameserver=cluster.nameserver) as producer:
        sent = list(producer.send_batch(
            ProducerRecord(TOPIC, f"order {q}-{i}".encode(), tag="created", keys=(f"o-{q}-{i}",),
                           properties={"source": "console-test"}, queue=q)
            for q, count in enumerate(SENT_PER_QUEUE) for i in range(count)))
    consumer = Consumer(nameserver=cluster.nameserver, group=GROUP, subscription={TOPIC: "*"},
                        start_from="first", auto_commit=False, heartbeat_interval_ms=1000)
    try:
        deadline = time.monotonic() + ASSIGN_TIMEOUT_S
        while len(consumer.assignment()) < len(SENT_PER_QUEUE):
            assert time.monotonic() < deadline, "the consumer was not assigned every queue"
            consumer.poll(100)
        consumer.commit({(TOPIC, q): offset for q, offset in COMMITTED.items()})
        yield ClusterData(cluster.nameserver, cluster.brokers[0].address, sent, consumer.member)
    finally:
        consumer.close()


@pytest.fixture(scope="package")
def console(data: ClusterData, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    """A read-only console on the cluster, sampling every second."""
    yield from _stopped_cleanly(ConsoleProcess(tmp_path_factory.mktemp("console"), data.nameserver))


@pytest.fixture(scope="package")
def admin_console(data: ClusterData, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    yield from _stopped_cleanly(ConsoleProcess(tmp_path_factory.mktemp("admin-console"), data.nameserver, "--admin",
                                               "--allow-host", "console.example"))


def _stopped_cleanly(process: ConsoleProcess) -> Iterator[ConsoleProcess]:
    """Yield the console, then stop it: a clean exit and no traceback in its log."""
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log_tail()
    assert "Traceback" not in process.log_tail(), process.log_tail()


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    reason = chromium_missing()
    if reason is not None:
        pytest.skip(reason)
    started = Browser(screenshot_dir())
    try:
        yield started
    finally:
        started.quit()


@pytest.fixture
def page(browser: Browser) -> Iterator[Browser]:
    """The browser, checked afterwards for JavaScript errors on the pages the test opened."""
    browser.script_errors()  # forget an earlier test's
    yield browser
    assert browser.script_errors() == []
