"""A 3-broker cluster with short leases and lag windows (see ha_helpers.HaCluster)."""

from __future__ import annotations

import pytest
from ha_helpers import HaCluster


@pytest.fixture
def ha_cluster(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=1, brokers=3)
    yield cluster
    cluster.stop()


@pytest.fixture
def ha_cluster_two_nameservers(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=2, brokers=3)
    yield cluster
    cluster.stop()


@pytest.fixture
def ha_cluster_sync_flush(tmp_path):
    cluster = HaCluster(tmp_path, broker_args=("--flush", "sync")).start(nameservers=1, brokers=3)
    yield cluster
    cluster.stop()
