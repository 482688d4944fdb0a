"""On a secured cluster (TLS, SCRAM users, ACLs) the console connects with the credentials it is
given, and the cluster's permissions decide what it may show and do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import ConsoleProcess
from security.secured_cluster import PASSWORDS, SecuredCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    cluster = SecuredCluster(tmp_path_factory.mktemp("console-secured")).start(brokers=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def console_as(cluster: SecuredCluster, workdir: Path, user: str, password: str | None = None) -> ConsoleProcess:
    """An --admin console connecting as ``user``, its credentials in GMS_* variables."""
    env = {"GMS_TLS_CA": str(cluster.pki.ca_cert), "GMS_USER": user,
           "GMS_PASSWORD": PASSWORDS[user] if password is None else password}
    return ConsoleProcess(workdir / user, cluster.nameserver, "--admin", env=env)


def test_the_console_acts_with_its_users_permissions(secured: SecuredCluster, tmp_path: Path) -> None:
    consoles = [console_as(secured, tmp_path, "admin"), console_as(secured, tmp_path, "alice"),
                console_as(secured, tmp_path, "bob", "not-bobs-password")]
    admin, alice, impostor = consoles
    try:
        status, cluster = admin.get("/api/cluster")
        assert status == 200 and [b["address"] for b in cluster["brokers"]] == [secured.brokers[0].address]
        status, created = admin.post("/api/topics", {"topic": "secured-orders", "queues": 2})
        assert status == 201 and len(created["queues"]) == 2

        status, answer = alice.post("/api/topics", {"topic": "alices-topic"})
        assert (status, answer["kind"]) == (403, "ForbiddenError")
        assert "alice" in answer["error"] and "gms acl add" in answer["error"]
        with secured.admin() as cluster_admin:
            assert "alices-topic" not in cluster_admin.topics()

        status, answer = impostor.get("/api/topics")
        assert (status, answer["kind"]) == (503, "UnauthenticatedError")
        assert "refused the console's credentials" in answer["error"] and "GMS_PASSWORD" in answer["error"]
    finally:
        for console in consoles:
            assert console.stop() == 0, console.log_tail()
    assert all("Traceback" not in console.log_tail() for console in consoles)
