"""Admin.create_topics: many topics in one CREATE_TOPICS round trip, against a real cluster
(embedded etcd, a nameserver process, a broker process) and a standalone broker; one topic's
failure (already exists, named twice, invalid name) is reported without failing the others."""

from __future__ import annotations

import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Producer, TopicSpec
from gms.cluster.metadata import TXN_OPS_MAX
from gms.errors import BadRequestError, InvalidTopicError, TopicAlreadyExistsError, TopicNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode, Status

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


def test_topics_stats_reads_many_topics_in_one_request_per_broker(cluster):
    """Admin.topics_stats (the console's charts, ``gms group describe``): one TOPIC_STATS per
    broker for all the topics, each as its own topic_stats reads it; a missing topic is left out."""
    wanted = names(30)
    with Admin(nameserver=cluster.nameserver) as admin, Producer(nameserver=cluster.nameserver) as producer:
        assert [r.error for r in admin.create_topics([(name, 2) for name in wanted])] == [None] * len(wanted)
        for i, name in enumerate(wanted):
            for _ in range(i % 3):
                producer.send(name, b"x", queue=1)
        stats = admin.topics_stats([*wanted, "no-such-topic"])
        assert list(stats) == wanted
        assert stats == {name: admin.topic_stats(name) for name in wanted}
        assert [[q["max_offset"] for q in stats[name]] for name in wanted] == [[0, i % 3] for i in range(len(wanted))]
        with pytest.raises(TopicNotFoundError):
            admin.topic_stats("no-such-topic")


def request(address: str, code: int, fields: dict) -> dict:
    async def ask() -> dict:
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return dict((await conn.request(code, fields, b"", timeout_ms=10_000)).fields)
        finally:
            conn.close()
    return run(ask())


def test_a_topic_stats_request_answers_each_topic_and_refuses_a_bad_list(broker):
    """TOPIC_STATS with ``topics``: a row per topic, an unknown one failing alone; not a list of
    1..1000 names is BAD_REQUEST, and the broker keeps serving."""
    with Admin(broker.address) as admin:
        admin.create_topic("known", 2)
    rows = request(broker.address, RequestCode.TOPIC_STATS, {"topics": ["known", "unknown"]})["topics"]
    assert rows[0] == {"topic": "known", "status": Status.SUCCESS,
                       "queues": [{"queue_id": 0, "min_offset": 0, "max_offset": 0},
                                  {"queue_id": 1, "min_offset": 0, "max_offset": 0}]}
    assert (rows[1]["topic"], rows[1]["status"]) == ("unknown", Status.TOPIC_NOT_FOUND)
    for bad in ([], "known", ["x"] * 1001):
        with pytest.raises(BadRequestError):
            request(broker.address, RequestCode.TOPIC_STATS, {"topics": bad})
    assert request(broker.address, RequestCode.TOPIC_STATS, {"topic": "known"})["queues"][1]["queue_id"] == 1
