"""Admin.create_topics: many topics in one CREATE_TOPICS round trip, against a real cluster
(embedded etcd, a nameserver process, a broker process) and a standalone broker; one topic's
failure (already exists, named twice, invalid name) is reported without failing the others."""

from __future__ import annotations

import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Producer, TopicSpec
from gms.cluster.metadata import TXN_OPS_MAX
from gms.errors import InvalidTopicError, TopicAlreadyExistsError, TopicNotFoundError

# More than one etcd transaction holds (the broker's registration fences each one), so the
# nameserver writes them in several.
MANY = TXN_OPS_MAX + 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cluster")).start(nameservers=1, brokers=1)
    try:
        yield running
    finally:
        running.stop()


def names(count: int) -> list[str]:
    prefix = f"b-{uuid.uuid4().hex[:6]}"
    return [f"{prefix}-{i}" for i in range(count)]


def test_many_topics_in_one_call_are_routed_and_each_takes_a_send(cluster):
    wanted = names(MANY)
    with Admin(nameserver=cluster.nameserver) as admin:
        results = admin.create_topics([(name, 1) for name in wanted])
        assert [r.topic for r in results] == wanted
        assert [r.error for r in results] == [None] * MANY
        assert {r.queues for r in results} == {1}
        assert {r.brokers for r in results} == {(cluster.brokers[0].address,)}
        listed = admin.topics()
        assert {name: listed.get(name) for name in wanted} == dict.fromkeys(wanted, 1)
    with Producer(nameserver=cluster.nameserver) as producer:
        sent = [producer.send(name, b"first") for name in wanted]
    assert [(r.topic, r.queue_offset) for r in sent] == [(name, 0) for name in wanted]


def test_a_batch_creates_the_valid_topics_and_reports_the_others(cluster):
    existing, fresh, other = names(3)
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(existing, 2)
        results = admin.create_topics([
            TopicSpec(fresh, 2, {"retention_ms": 60_000}), existing, (fresh, 3), "bad/name", (other, 0), other,
        ])
        assert [r.topic for r in results] == [fresh, existing, fresh, "bad/name", other, other]
        assert [r.created for r in results] == [True, False, False, False, False, True]
        assert isinstance(results[1].error, TopicAlreadyExistsError)
        assert "already exists" in str(results[1].error)
        assert isinstance(results[2].error, TopicAlreadyExistsError)
        assert "named more than once" in str(results[2].error)
        assert isinstance(results[3].error, InvalidTopicError)
        assert isinstance(results[4].error, InvalidTopicError)
        assert "queue count" in str(results[4].error)
        assert admin.route(fresh, settings=True)["settings"]["retention_ms"] == 60_000
        assert (len(admin.route(fresh)["queues"]), len(admin.route(other)["queues"])) == (2, 8)
        assert len(admin.route(existing)["queues"]) == 2  # left as it was
    with Producer(nameserver=cluster.nameserver) as producer:
        assert producer.send(fresh, b"x").topic == fresh


def test_a_standalone_broker_creates_a_batch(broker):
    fresh, other = names(2)
    with Admin([broker.address]) as admin:
        results = admin.create_topics([(fresh, 2), (fresh, 2), "%RETRY%g", (other, 0), (other, 3)])
        assert [r.created for r in results] == [True, False, False, False, True]
        assert [r.queues for r in results] == [2, None, None, None, 3]
        assert isinstance(results[1].error, TopicAlreadyExistsError)
        assert isinstance(results[2].error, InvalidTopicError)
        assert "queue count" in str(results[3].error)  # the broker's own CREATE_TOPIC: BAD_REQUEST
        assert {name: admin.topics().get(name) for name in (fresh, other)} == {fresh: 2, other: 3}
        assert isinstance(admin.create_topics([other])[0].error, TopicAlreadyExistsError)
    with Producer([broker.address]) as producer:
        assert producer.send(other, b"x").topic == other


def test_delete_topics_deletes_each_and_reports_the_others(cluster):
    first, second, missing = names(3)
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topics([(first, 1), (second, 1)])
        results = admin.delete_topics([first, missing, second])
        assert [r.topic for r in results] == [first, missing, second]
        assert [r.deleted for r in results] == [True, False, True]
        assert all(isinstance(r.error, TopicNotFoundError) for r in results if not r.deleted)
        assert not {first, second} & set(admin.topics())
