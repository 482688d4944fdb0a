"""One real embedded etcd per test module; each test gets its own key prefix."""

import uuid
from collections.abc import Iterator

import pytest

from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.nameserver.embedded_etcd import EmbeddedEtcd


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    with EmbeddedEtcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def client(etcd: EmbeddedEtcd) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.endpoint, timeout_s=2.0) as c:
        yield c


@pytest.fixture
def prefix(client: EtcdClient) -> Iterator[str]:
    """A fresh subtree per test; checked empty-able and wiped afterwards (as aetcd's tests do)."""
    p = f"/gms-test-{uuid.uuid4().hex[:8]}/"
    yield p
    client.delete_prefix(p)


@pytest.fixture
def metadata(client: EtcdClient, prefix: str) -> ClusterMetadata:
    return ClusterMetadata(client, prefix)
