"""The SDK routed by nameservers, against a real cluster (embedded etcd, two nameserver
processes, three broker processes): spread, consume, nameserver failover, nameserver outage,
a SIGKILLed broker leaving the routes while producers move on."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

import pytest
from client_helpers import consume
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, NameserverRoutes, Producer
from gms.client.connections import ConnectionPool
from gms.errors import TopicNotFoundError
from gms.net import LoopThread

BROKERS = 3
QUEUES = 6
LEASE_TTL_S = 10  # the broker's default registration lease


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cluster")).start(nameservers=2, brokers=BROKERS)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def topic(cluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(name, QUEUES)
    return name


def leaders(cluster, topic: str) -> list[str | None]:
    with Admin(nameserver=cluster.nameserver) as admin:
        return [q["leader"] for q in admin.route(topic)["queues"]]


def test_sends_spread_over_every_broker_and_consumers_read_them_all(cluster, topic):
    assert sorted(set(leaders(cluster, topic))) == sorted(b.address for b in cluster.brokers)
    with Producer(nameserver=cluster.nameserver) as producer:
        results = [producer.send(topic, b"m%d" % i) for i in range(60)]
        keyed = {producer.send(topic, b"k", key="same-key").queue_id for _ in range(5)}
    assert Counter(r.queue_id for r in results) == dict.fromkeys(range(QUEUES), 10)
    assert {r.broker for r in results} == {b.address for b in cluster.brokers}
    assert len(keyed) == 1
    with Consumer(nameserver=cluster.nameserver, group="g", subscription={topic: "*"},
                  start_from="first") as consumer:
        got = consume(consumer, 65)
        assigned = consumer.assignment()
    assert sorted(m.body for m in got) == sorted([b"m%d" % i for i in range(60)] + [b"k"] * 5)
    assert assigned == [(topic, q) for q in range(QUEUES)]  # the coordinator assigned every broker's queues


def test_unknown_topic_is_an_error_from_the_nameserver(cluster):
    with Producer(nameserver=cluster.nameserver) as producer, pytest.raises(TopicNotFoundError):
        producer.send("no-such-topic", b"x")


def test_client_fails_over_to_the_second_nameserver(cluster, topic):
    first = cluster.nameservers[0]
    first.kill()
    try:
        with Producer(nameserver=cluster.nameserver) as producer:
            assert producer.send(topic, b"after failover").topic == topic
        with Admin(nameserver=cluster.nameserver) as admin:
            assert admin.topics()[topic] == QUEUES
    finally:
        first.restart()


def test_all_nameservers_down_keeps_cached_routes_and_says_so_once(cluster, topic, caplog):
    with LoopThread() as loop:
        pool = ConnectionPool(request_timeout_ms=2000)
        routes = NameserverRoutes(cluster.nameserver, pool, refresh_interval_ms=100)
        before = loop.run(routes.routes(topic))
        with Producer(nameserver=cluster.nameserver) as producer:
            producer.send(topic, b"warm the route cache")
            for ns in cluster.nameservers:
                ns.kill()
            try:
                with caplog.at_level(logging.WARNING, logger="gms.client.routing"):
                    for _ in range(5):
                        time.sleep(0.25)  # past the refresh interval: every call tries the nameservers
                        assert loop.run(routes.routes(topic)) == before
                    results = [producer.send(topic, b"during the outage") for _ in range(10)]
            finally:
                for ns in cluster.nameservers:
                    ns.restart()
            outage_logs = [r for r in caplog.records if "working on cached routes" in r.getMessage()]
            assert len(outage_logs) == 1
            assert {r.queue_id for r in results} == set(range(QUEUES))
            time.sleep(1.1)  # NAMESERVER_RETRY_MS: the next call asks a nameserver again
            with caplog.at_level(logging.INFO, logger="gms.client.routing"):
                assert loop.run(routes.routes(topic)) == before
            assert any("recovered after" in r.getMessage() for r in caplog.records)
        loop.run(pool.close())


def test_routes_that_age_out_are_refreshed_without_stopping_sends(cluster, topic):
    """A producer keeps sending on routes past their refresh interval while it fetches them again
    in the background (Kafka's metadata.max.age.ms): nameservers that do not answer (paused) hold
    up no send_async. Before, each topic's first batch after its routes aged out waited for a
    lookup: the nameservers' timeouts here, a round trip each for a producer over a thousand topics."""
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send(topic, b"warm the route cache")
        producer._runtime.routes._refresh_interval_s = 0.2  # aged out in moments (the default is 30 s)
        time.sleep(0.3)
        for ns in cluster.nameservers:
            ns.pause()
        try:
            start = time.monotonic()
            futures = [producer.send_async(topic, b"aged %d" % i) for i in range(50)]
            queued_s = time.monotonic() - start
            producer.flush()
        finally:
            for ns in cluster.nameservers:
                ns.resume()
    assert queued_s < 1.0, f"send_async waited {queued_s:.1f} s for a route lookup"
    assert {f.result().topic for f in futures} == {topic}


@pytest.mark.slow
def test_killed_broker_leaves_routes_and_producers_move_on(cluster, topic):
    victim = cluster.brokers[-1]
    with Producer(nameserver=cluster.nameserver, retries=5) as producer:
        assert {producer.send(topic, b"before").broker for _ in range(QUEUES)} >= {victim.address}
        victim.kill()
        killed = time.monotonic()
        # Sends go on without an error: the failed broker is avoided, then dropped from routes.
        after = [producer.send(topic, b"after %d" % i) for i in range(30)]
        assert {r.broker for r in after} == {b.address for b in cluster.brokers[:-1]}
        while victim.address in leaders(cluster, topic):
            assert time.monotonic() - killed <= LEASE_TTL_S + 1, "the broker stayed in the routes"
            time.sleep(0.1)
        victim.restart()
        cluster.wait_registered(BROKERS)
        deadline = time.monotonic() + 5
        while victim.address not in leaders(cluster, topic):  # its queues come back
            assert time.monotonic() < deadline
            time.sleep(0.1)
