"""Kafka clients against gms: a `gms standalone` serving the Kafka API on a free port (embedded
etcd, nameserver, broker), and a fresh topic per test created through the Kafka admin API."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cli.test_cli_standalone import running_standalone

PARTITIONS = 2


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The banner's addresses (``kafka``: the Kafka API's host:port) of a running `gms standalone`,
    and its ``data_dir``."""
    data_dir = tmp_path_factory.mktemp("sa")
    yield from ({**banner, "data_dir": str(data_dir)} for banner in running_standalone(data_dir))


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
