"""The nameserver's monitoring endpoint on real processes: /metrics counts the registered
brokers, route lookups and the failovers its controller wrote; /readyz turns 503 with the reason
when its etcd goes away."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gms_cluster import LocalCluster
from processes import NameserverProcess, wait_until
from scrape import get, scrape

from gms.client import Admin, Producer
from gms.errors import TopicNotFoundError

pytestmark = pytest.mark.timeout(90)

# Brokers whose death the controller sees within seconds (lease) and whose followers leave the
# ISR quickly.
QUICK_BROKER_TOML = """
[broker]
lease_ttl_s = 2
replica_lag_time_max_ms = 1500
replica_fetch_wait_ms = 200
"""
FAILOVER_TIMEOUT_S = 20.0


def sample(port: int, name: str, **labels: str) -> float:
    """One series' value; 0 while it has none."""
    return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def cluster(tmp_path) -> Iterator[LocalCluster]:
    """An etcd and nothing on it yet: each test adds its nameservers and brokers."""
    cluster = LocalCluster(tmp_path)
    cluster.etcd.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def add_monitored_nameserver(cluster: LocalCluster) -> int:
    """Start a nameserver of ``cluster`` with --metrics-listen on a free port; its metrics port,
    read from --metrics-port-file."""
    root = cluster.root / f"ns{len(cluster.nameservers)}"
    port_file = root.with_suffix(".metrics-port")
    ns = NameserverProcess(root, cluster.etcd.endpoint,
                           ["--metrics-listen", "127.0.0.1:0", "--metrics-port-file", str(port_file)])
    cluster.nameservers.append(ns)
    ns.start()
    wait_until(port_file.exists, 5)  # written right after the main port file
    return int(port_file.read_text())


def test_metrics_count_brokers_and_route_lookups_on_the_controller(cluster):
    port = add_monitored_nameserver(cluster)
    assert get(port, "/healthz") == (200, "ok\n")
    wait_until(lambda: get(port, "/readyz") == (200, "ready\n"), 10)  # once it knows the controller
    for _ in range(2):
        cluster.add_broker()
    cluster.wait_registered(2)
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic("orders", queues=2)
        with pytest.raises(TopicNotFoundError):
            admin.route("nowhere")
    found_before = sample(port, "gms_nameserver_route_lookups_total", result="found")
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send("orders", b"routed")
    metrics = scrape(port)
    assert metrics["gms_nameserver_brokers", ()] == 2
    assert metrics["gms_nameserver_topics", ()] == 1
    assert metrics["gms_nameserver_route_lookups_total", (("result", "found"),)] > found_before
    assert metrics["gms_nameserver_route_lookups_total", (("result", "not_found"),)] == 1
    assert metrics["gms_nameserver_is_controller", ()] == 1
    assert metrics["gms_nameserver_controller_epoch", ()] > 0
    assert metrics["gms_nameserver_view_healthy", ()] == 1
    assert metrics["gms_nameserver_up_seconds", ()] > 0
    routes = (("code", "GET_ROUTE"), ("status", "TOPIC_NOT_FOUND"))
    assert metrics["gms_nameserver_request_seconds_count", routes] == 1
    assert metrics["gms_nameserver_etcd_request_seconds_count", (("op", "txn"),)] >= 1  # the topic's creation
    assert metrics["gms_nameserver_etcd_errors_total", (("op", "txn"),)] == 0
    assert metrics["gms_nameserver_failovers_total", ()] == 0


def test_readiness_names_a_lost_etcd(cluster):
    port = add_monitored_nameserver(cluster)
    # Ready once it has seen who the controller is (an election round after it started).
    wait_until(lambda: get(port, "/readyz") == (200, "ready\n"), 10)
    cluster.etcd.stop()
    wait_until(lambda: get(port, "/readyz")[0] == 503, 10)
    status, reasons = get(port, "/readyz")
    assert status == 503
    assert reasons.splitlines()[0].startswith("etcd unreachable"), reasons  # one reason per line
    assert get(port, "/healthz") == (200, "ok\n")  # alive: routes are still served from the cache
    assert sample(port, "gms_nameserver_view_healthy") == 0


def test_failovers_counted_by_the_controller_that_wrote_them(cluster):
    port = add_monitored_nameserver(cluster)
    config = cluster.root / "broker.toml"
    config.write_text(QUICK_BROKER_TOML)
    for _ in range(2):
        cluster.add_broker("--config", str(config))
    cluster.wait_registered(2)
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic("replicated", queues=2, replicas=2)  # each broker leads one queue
    assert sample(port, "gms_nameserver_failovers_total") == 0
    cluster.brokers[1].kill()
    wait_until(lambda: sample(port, "gms_nameserver_failovers_total") >= 1, FAILOVER_TIMEOUT_S)
    assert sample(port, "gms_nameserver_brokers") == 1
    assert sample(port, "gms_nameserver_failovers_total") == 1  # its one queue moved, once
    # in one write of the topic, by one transaction (or more, if a broker's ISR write refused one)
    assert sample(port, "gms_nameserver_controller_topic_writes_total") == 1
    assert sample(port, "gms_nameserver_controller_transactions_total") >= 1
