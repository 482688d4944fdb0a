"""Broker registration and topic creation against a real etcd."""

import time

import pytest

from gms.cluster.errors import NotEnoughBrokers
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.cluster.model import BrokerInfo, TopicSettings
from gms.errors import InvalidTopicError, TopicAlreadyExistsError, TopicNotFoundError

SHORT_TTL_S = 2


def register(metadata: ClusterMetadata, *ids: str, ttl_s: int = SHORT_TTL_S):
    return [
        metadata.register_broker(BrokerInfo(b, f"127.0.0.1:{10000 + i}"), ttl_s=ttl_s)
        for i, b in enumerate(ids)
    ]


def test_registration_is_kept_alive_past_ttl_and_removed_on_close(metadata: ClusterMetadata):
    (reg,) = register(metadata, "b1")
    time.sleep(SHORT_TTL_S * 1.5)
    assert [b.broker_id for b in metadata.live_brokers()] == ["b1"]
    reg.close()
    assert metadata.live_brokers() == []


def test_registration_expires_without_keepalive(metadata: ClusterMetadata):
    (reg,) = register(metadata, "b1")
    reg.close(deregister=False)
    assert metadata.live_brokers() != []
    time.sleep(SHORT_TTL_S + 1.0)
    assert metadata.live_brokers() == []


def test_create_topic_spreads_replicas_round_robin(metadata: ClusterMetadata):
    regs = register(metadata, "b2", "b0", "b1")
    try:
        topic = metadata.create_topic("orders", queue_count=4, replicas=2)
    finally:
        for r in regs:
            r.close()
    assert [q.replicas for q in topic.queues] == [
        ("b0", "b1"), ("b1", "b2"), ("b2", "b0"), ("b0", "b1"),
    ]
    assert [q.leader for q in topic.queues] == ["b0", "b1", "b2", "b0"]
    assert all(q.isr == q.replicas and q.leader_epoch == 0 for q in topic.queues)
    assert metadata.get_topic("orders") == topic


def test_create_existing_topic_fails_and_keeps_original(metadata: ClusterMetadata):
    regs = register(metadata, "b0", "b1")
    try:
        first = metadata.create_topic("t", queue_count=2)
        with pytest.raises(TopicAlreadyExistsError):
            metadata.create_topic("t", queue_count=5, replicas=2)
    finally:
        for r in regs:
            r.close()
    assert metadata.get_topic("t") == first


@pytest.mark.parametrize(
    "name, queue_count, replicas",
    [
        ("", 1, 1),
        ("a" * 128, 1, 1),
        ("bad/name", 1, 1),
        ("spaces no", 1, 1),
        ("ümlaut", 1, 1),
        ("..", 1, 1),
        ("ok", 0, 1),
        ("ok", 1025, 1),
        ("ok", -3, 1),
        ("ok", 1, 0),
    ],
)
def test_invalid_topics_leave_nothing_behind(
    metadata: ClusterMetadata, client: EtcdClient, prefix: str, name, queue_count, replicas
):
    regs = register(metadata, "b0")
    try:
        with pytest.raises(InvalidTopicError):
            metadata.create_topic(name, queue_count=queue_count, replicas=replicas)
    finally:
        for r in regs:
            r.close()
    assert client.get_prefix(prefix).kvs == []


def test_longest_valid_name_and_max_queue_count(metadata: ClusterMetadata):
    regs = register(metadata, "b0")
    try:
        name = "A-z_0.9%" * 15 + "abcdefg"
        assert len(name) == 127
        assert metadata.create_topic(name, queue_count=1024).queue_count == 1024
    finally:
        for r in regs:
            r.close()


def test_too_few_brokers_is_a_clear_error(metadata: ClusterMetadata, client: EtcdClient, prefix: str):
    regs = register(metadata, "b0", "b1")
    try:
        with pytest.raises(NotEnoughBrokers, match=r"3 replica.*only 2 live broker"):
            metadata.create_topic("t", replicas=3)
    finally:
        for r in regs:
            r.close()
    with pytest.raises(NotEnoughBrokers):
        metadata.create_topic("t")  # no broker at all
    assert client.get_prefix(prefix).kvs == []


def test_update_grows_queues_and_changes_only_named_settings(metadata: ClusterMetadata):
    regs = register(metadata, "b0", "b1")
    try:
        metadata.create_topic("t", queue_count=2, replicas=2,
                              settings=TopicSettings(message_size_bytes_max=1024, unclean_leader_election=True))
        with pytest.raises(InvalidTopicError, match="cannot be removed"):
            metadata.update_topic("t", queue_count=1)
        topic = metadata.update_topic("t", queue_count=5, settings={"retention_ms": 1000})
        assert topic.settings == TopicSettings(1000, 1024, min_insync_replicas=2, unclean_leader_election=True)
        topic = metadata.update_topic("t", settings={"min_insync_replicas": 1, "message_size_bytes_max": None})
    finally:
        for r in regs:
            r.close()
    assert [q.replicas[0] for q in topic.queues] == ["b0", "b1", "b0", "b1", "b0"]
    assert metadata.get_topic("t") == topic
    # None restores a default; the rest stays as it was
    assert topic.settings == TopicSettings(1000, min_insync_replicas=1, unclean_leader_election=True)
    with pytest.raises(InvalidTopicError, match=r"min_insync_replicas must be 1\.\.2"):
        metadata.update_topic("t", settings={"min_insync_replicas": 3})
    with pytest.raises(TopicNotFoundError):
        metadata.update_topic("nope", queue_count=3)


def test_unknown_setting_rejected():
    with pytest.raises(InvalidTopicError, match="unknown topic setting"):
        TopicSettings.from_dict({"retention_ms": 5, "colour": 1})
    with pytest.raises(InvalidTopicError):
        TopicSettings(retention_ms=0)


def test_delete_topic(metadata: ClusterMetadata, client: EtcdClient, prefix: str):
    regs = register(metadata, "b0")
    try:
        metadata.create_topic("t")
    finally:
        for r in regs:
            r.close()
    metadata.delete_topic("t")
    assert client.get_prefix(prefix).kvs == []
    with pytest.raises(TopicNotFoundError):
        metadata.delete_topic("t")
