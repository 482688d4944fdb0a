"""NameServer over the wire against a real embedded etcd: routes from the cache, topic
administration all-or-nothing, typed errors for bad input, several nameservers on one etcd."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from processes import wait_until
from test_server_helpers import RunningNameServer

from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata, Keys
from gms.cluster.model import DEFAULT_COMPACTION, BrokerInfo
from gms.errors import (
    BadRequestError,
    InvalidTopicError,
    NotEnoughReplicasError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from gms.nameserver.embedded_etcd import EmbeddedEtcd
from gms.protocol.codes import RequestCode as C

BROKERS = {"b0": "10.0.0.1:10911", "b1": "10.0.0.2:10911", "b2": "10.0.0.3:10911"}


@pytest.fixture
def brokers(metadata: ClusterMetadata) -> Iterator[None]:
    regs = [metadata.register_broker(BrokerInfo(b, a), ttl_s=5) for b, a in BROKERS.items()]
    yield
    for reg in regs:
        reg.close()


@pytest.fixture
def ns(etcd: EmbeddedEtcd, prefix: str) -> Iterator[RunningNameServer]:
    server = RunningNameServer(etcd.endpoint, prefix)
    yield server
    server.stop()


def topic_keys(client: EtcdClient, prefix: str) -> list[bytes]:
    return [kv.key for kv in client.get_prefix(Keys(prefix).topics).kvs]


def test_create_spreads_queues_and_route_is_served_at_once(ns, brokers, client, prefix):
    created = ns.call(C.CREATE_TOPIC, {"topic": "orders", "queues": 6, "replicas": 2})
    route = ns.call(C.GET_ROUTE, {"topic": "orders", "settings": True})  # same nameserver: read-your-writes
    assert route == created
    assert route["replication_factor"] == 2 and route["settings"]["min_insync_replicas"] == 2
    assert "settings" not in ns.call(C.GET_ROUTE, {"topic": "orders"})  # clients' refreshes stay small
    assert route["topic"] == "orders"
    assert [q["queue_id"] for q in route["queues"]] == list(range(6))
    leaders = Counter(q["leader"] for q in route["queues"])
    assert leaders == dict.fromkeys(BROKERS.values(), 2)
    for q in route["queues"]:
        assert len(q["replicas"]) == 2 and q["replicas"][0] == q["leader"]
        assert q["leader_epoch"] == 0
        assert q["isr"] == q["replicas"]  # a new topic's ISR is every replica
    assert ns.call(C.TOPIC_LIST) == {"topics": {"orders": 6}}
    assert topic_keys(client, prefix) == [f"{prefix}topics/orders".encode()]


def test_update_grows_and_delete_removes(ns, brokers):
    ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 2})
    grown = ns.call(C.UPDATE_TOPIC, {"topic": "t", "queues": 5})
    assert len(grown["queues"]) == 5
    assert len(ns.call(C.GET_ROUTE, {"topic": "t"})["queues"]) == 5
    ns.call(C.UPDATE_TOPIC, {"topic": "t", "settings": {"message_size_bytes_max": 2048}})
    updated = ns.call(C.UPDATE_TOPIC, {"topic": "t", "settings": {"retention_ms": 1000}})
    assert updated["settings"] == {"retention_ms": 1000, "message_size_bytes_max": 2048,
                                   "min_insync_replicas": 1, "unclean_leader_election": False,
                                   "message_type": "mixed", "cleanup_policy": "delete", **DEFAULT_COMPACTION}
    assert ns.server.view.topic("t").settings.message_size_bytes_max == 2048  # kept: update names only what changes
    ns.call(C.DELETE_TOPIC, {"topic": "t"})
    with pytest.raises(TopicNotFoundError):
        ns.call(C.GET_ROUTE, {"topic": "t"})
    assert ns.call(C.TOPIC_LIST) == {"topics": {}}


def test_broker_list_and_cluster_status(ns, brokers, etcd, prefix):
    wait_until(lambda: len(ns.call(C.GET_BROKER_LIST)["brokers"]) == 3, 1)  # the view follows
    listed = ns.call(C.GET_BROKER_LIST)["brokers"]
    assert [(b["broker_id"], b["address"], b["cluster"]) for b in listed] == [
        (b, a, "DefaultCluster") for b, a in BROKERS.items()
    ]
    assert ns.call(C.GET_BROKER_LIST, {"cluster": "other"}) == {"brokers": []}
    status = ns.call(C.CLUSTER_STATUS)
    assert status["etcd"]["healthy"] is True
    assert status["etcd"]["endpoints"] == etcd.endpoint
    assert [n["address"] for n in status["nameservers"]] == [ns.address]
    assert len(status["brokers"]) == 3 and status["topics"] == 0
    assert ns.call(C.REGISTER_BROKER) == {"etcd": etcd.endpoint, "prefix": prefix}


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"topic": ""}, InvalidTopicError),
        ({"topic": "a/b"}, InvalidTopicError),
        ({"topic": ".."}, InvalidTopicError),
        ({"topic": "x" * 200}, InvalidTopicError),
        ({"topic": "t", "queues": 0}, InvalidTopicError),
        ({"topic": "t", "queues": -3}, InvalidTopicError),
        ({"topic": "t", "queues": 10**9}, InvalidTopicError),
        ({"topic": "t", "queues": "8"}, BadRequestError),
        ({"topic": "t", "replicas": 0}, InvalidTopicError),
        ({"topic": "t", "replicas": 4}, NotEnoughReplicasError),  # 3 brokers live
        ({"topic": "t", "settings": {"retention_ms": -1}}, InvalidTopicError),
        ({"topic": "t", "settings": {"colour": 1}}, InvalidTopicError),
        ({"queues": 8}, BadRequestError),
        ({"topic": 5}, BadRequestError),
    ],
)
def test_bad_create_is_a_typed_error_and_writes_nothing(ns, brokers, client, prefix, fields, error):
    with pytest.raises(error) as info:
        ns.call(C.CREATE_TOPIC, fields)
    assert str(info.value)  # the message says what is wrong
    assert topic_keys(client, prefix) == []
    assert ns.call(C.TOPIC_LIST) == {"topics": {}}


@pytest.mark.parametrize("settings", [
    {"max_reconsume_times": [1]}, {"max_reconsume_times": "3"}, {"max_reconsume_times": None},
    {"max_reconsume_times": 1.5}, {"retry_delays_ms": [None]}, {"retry_delays_ms": "1000"}, {"fifo": 1},
    {"colour": 1},
], ids=repr)
def test_bad_group_settings_are_a_bad_request_and_the_group_keeps_its_own(ns, settings):
    ns.call(C.GROUP_SETTINGS_PUT, {"group": "g", "settings": {"max_reconsume_times": 2}})
    with pytest.raises(BadRequestError) as info:
        ns.call(C.GROUP_SETTINGS_PUT, {"group": "g", "settings": settings})
    assert str(info.value)
    assert ns.call(C.GROUP_SETTINGS_GET, {"group": "g"})["settings"]["max_reconsume_times"] == 2


def test_no_brokers_means_no_topic(ns, client, prefix):
    with pytest.raises(NotEnoughReplicasError, match="0 live broker"):
        ns.call(C.CREATE_TOPIC, {"topic": "t"})
    assert topic_keys(client, prefix) == []


def test_existing_and_unknown_topics(ns, brokers):
    first = ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 3})
    with pytest.raises(TopicAlreadyExistsError):
        ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 7})
    assert ns.call(C.GET_ROUTE, {"topic": "t", "settings": True}) == first  # untouched
    with pytest.raises(InvalidTopicError, match="cannot be removed"):
        ns.call(C.UPDATE_TOPIC, {"topic": "t", "queues": 1})
    with pytest.raises(BadRequestError):
        ns.call(C.UPDATE_TOPIC, {"topic": "t"})
    for code in (C.GET_ROUTE, C.DELETE_TOPIC):
        with pytest.raises(TopicNotFoundError):
            ns.call(code, {"topic": "missing"})
    with pytest.raises(TopicNotFoundError):
        ns.call(C.UPDATE_TOPIC, {"topic": "missing", "queues": 2})
    assert ns.call(C.GET_ROUTE, {"topic": "t", "settings": True}) == first


def test_two_nameservers_on_one_etcd_agree(etcd, prefix, brokers):
    a, b = RunningNameServer(etcd.endpoint, prefix), RunningNameServer(etcd.endpoint, prefix)
    try:
        created = a.call(C.CREATE_TOPIC, {"topic": "shared", "queues": 4})
        wait_until(lambda: "shared" in b.call(C.TOPIC_LIST)["topics"], 2)
        assert b.call(C.GET_ROUTE, {"topic": "shared", "settings": True}) == created
        b.call(C.DELETE_TOPIC, {"topic": "shared"})
        wait_until(lambda: a.call(C.TOPIC_LIST)["topics"] == {}, 2)
        listed = sorted(n["address"] for n in a.call(C.CLUSTER_STATUS)["nameservers"])
        assert listed == sorted([a.address, b.address])
    finally:
        b.stop()
    # a stopped nameserver withdraws its key at once (its lease is revoked)
    assert [n["address"] for n in a.call(C.CLUSTER_STATUS)["nameservers"]] == [a.address]
    a.stop()


def test_route_follows_broker_death(ns, metadata):
    regs = [metadata.register_broker(BrokerInfo(b, a), ttl_s=5) for b, a in BROKERS.items()]
    try:
        ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 3})
        regs[1].close()  # b1 stops cleanly: its lease is revoked
        wait_until(lambda: ns.call(C.GET_ROUTE, {"topic": "t"})["queues"][1]["leader"] is None, 2)
        route = ns.call(C.GET_ROUTE, {"topic": "t"})
        assert [q["leader"] for q in route["queues"]] == [BROKERS["b0"], None, BROKERS["b2"]]
    finally:
        for reg in regs:
            reg.close()
