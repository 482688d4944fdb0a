"""Kafka clients against gms: a `gms standalone` serving the Kafka API on a free port (embedded
etcd, nameserver, broker), and a fresh topic per test created through the Kafka admin API."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from gms.client import Admin
from tests.cli.test_cli_standalone import read_addresses
from tests.processes import FREE_MONITORING_PORTS, wait_until

PARTITIONS = 2


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The banner's addresses (``kafka``: the Kafka API's host:port) of a running `gms standalone`."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(tmp_path_factory.mktemp("sa")),
         "--nameserver-port", "0", "--broker-port", "0", "--no-console", *FREE_MONITORING_PORTS,
         "--commitlog-file-size", str(32 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = read_addresses(proc)
        banner["kafka"] = banner["kafka"].split()[0]
        with Admin(nameserver=banner["nameserver"]) as admin:
            wait_until(lambda: bool(admin.cluster_status()["brokers"]), 15)
        yield banner
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.fixture
def bootstrap(standalone) -> str:
    return standalone["kafka"]


@pytest.fixture
def topic(bootstrap) -> str:
    """A new topic of PARTITIONS partitions, created with confluent-kafka's AdminClient."""
    name = f"k-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the result: its futures fail once it goes
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name
