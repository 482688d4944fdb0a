"""Kafka's admin clients against gms (`gms standalone`): DescribeCluster (and Metadata's cluster id
and controller, the same); ListGroups, DescribeGroups and DeleteGroups of Kafka consumer groups
and gms consumer groups (NON_EMPTY_GROUP while members are alive); DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs and CreateTopics' configs as the topic's gms settings; CreatePartitions
growing a topic's queues. With confluent-kafka's AdminClient, kafka-python's KafkaAdminClient and
aiokafka's AIOKafkaAdminClient."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from gms.client import Consumer as GmsConsumer
from tests.kafka_api.conftest import PARTITIONS
from tests.kafka_api.test_kafka_wire import call, connect
from tests.processes import wait_until

WAIT_S = 30
NOT_EMPTY = r"NON_EMPTY_GROUP|not empty"  # librdkafka's name of the error, or its text


def _group_name() -> str:
    return f"kg-{uuid.uuid4().hex[:8]}"


def _member(bootstrap: str, group: str, topic: str) -> Consumer:
    """A confluent-kafka consumer of ``group`` subscribed to ``topic``, once it has its partitions."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10_000})
    consumer.subscribe([topic])
    wait_until(lambda: consumer.poll(0.2) is None and bool(consumer.assignment()), WAIT_S)
    return consumer


def _topic_configs(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(WAIT_S)


def test_describe_cluster_and_metadata_name_the_same_cluster_and_controller(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_cluster(request_timeout=WAIT_S).result(WAIT_S)
    metadata = admin.list_topics(timeout=WAIT_S)
    host, port = bootstrap.rsplit(":", 1)
    assert [(node.host, node.port) for node in described.nodes] == [(host, int(port))]
    assert described.cluster_id == metadata.cluster_id
    assert described.controller.id == metadata.controller_id == described.nodes[0].id
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        cluster = kp.describe_cluster()
    finally:
        kp.close()
    assert (cluster["cluster_id"], cluster["controller_id"]) == (metadata.cluster_id, metadata.controller_id)


def test_a_kafka_group_is_listed_described_and_deleted_once_its_members_left(bootstrap, topic):
    group = _group_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumer = _member(bootstrap, group, topic)
    try:
        listed = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(WAIT_S).valid
        assert group in {g.group_id for g in listed}
        described = admin.describe_consumer_groups([group])[group].result(WAIT_S)
        assert described.state == ConsumerGroupState.STABLE
        assert described.partition_assignor == "range"
        (member,) = described.members
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == list(range(PARTITIONS))
        with pytest.raises(KafkaException, match=NOT_EMPTY):
            admin.delete_consumer_groups([group])[group].result(WAIT_S)
        consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert kp.describe_groups([group])[group]["group_state"] in ("Empty", "Dead")
        assert group in {g["group_id"] for g in kp.list_groups()}  # its committed offset keeps it
        kp.delete_groups([group])
        assert group not in {g["group_id"] for g in kp.list_groups()}
    finally:
        kp.close()
    with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND"):
        admin.delete_consumer_groups([group])[group].result(WAIT_S)


def test_a_gms_group_is_described_with_its_members_queues_and_not_deleted_while_they_live(bootstrap, topic,
                                                                                             standalone):
    group = _group_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumer = GmsConsumer(nameserver=standalone["nameserver"], group=group, subscription={topic: "*"})
    try:
        def assigned() -> bool:
            consumer.poll(200)
            described = admin.describe_consumer_groups([group])[group].result(WAIT_S)
            return bool(described.members) and bool(described.members[0].assignment.topic_partitions)
        wait_until(assigned, WAIT_S)
        described = admin.describe_consumer_groups([group])[group].result(WAIT_S)
        assert (described.state, described.partition_assignor) == (ConsumerGroupState.STABLE, "gms")
        owned = described.members[0].assignment.topic_partitions  # the topic's queues, and its retry topic's
        assert sorted(tp.partition for tp in owned if tp.topic == topic) == list(range(PARTITIONS))
        with pytest.raises(KafkaException, match=NOT_EMPTY):
            admin.delete_consumer_groups([group])[group].result(WAIT_S)
    finally:
        consumer.close()
    _commit(bootstrap, group, topic)
    wait_until(lambda: _deleted(admin, group), WAIT_S)  # the member's session ends first
    described = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "group", "describe", group, "--nameserver",
                                standalone["nameserver"], "--json"], capture_output=True, text=True, timeout=60,
                               check=False)
    assert described.returncode != 0 or topic not in described.stdout


def _commit(bootstrap: str, group: str, topic: str) -> None:
    """A simple consumer's commit to ``group`` (once its gms member is gone), so it has offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wait_until(lambda: _committed(consumer, topic), WAIT_S)
    finally:
        consumer.close()


def _committed(consumer: Consumer, topic: str) -> bool:
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        return True
    except KafkaException:
        return False


def _deleted(admin: AdminClient, group: str) -> bool:
    try:
        admin.delete_consumer_groups([group])[group].result(WAIT_S)
        return True
    except KafkaException as err:
        assert re.search(NOT_EMPTY, str(err)), err
        time.sleep(0.5)
        return False


def test_created_topics_keep_their_configs_and_the_admin_clients_change_them(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"k-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.ms": "3600000", "max.message.bytes": "65536",
                                                       "cleanup.policy": "delete"})])[name].result(WAIT_S)
    configs = _topic_configs(admin, name)
    assert {k: configs[k].value for k in ("retention.ms", "max.message.bytes", "cleanup.policy",
                                          "gms.message.type")} == {
        "retention.ms": "3600000", "max.message.bytes": "65536", "cleanup.policy": "delete",
        "gms.message.type": "mixed"}
    assert not configs["retention.ms"].is_default and configs["gms.message.type"].is_default

    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([resource])[resource].result(WAIT_S)
    configs = _topic_configs(admin, name)
    assert configs["retention.ms"].value == "7200000" and configs["max.message.bytes"].is_default

    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        kp.alter_configs([KpConfigResource(KpResourceType.TOPIC, name, configs={"retention.ms": "1800000"})],
                         incremental=False)
        described = kp.describe_configs([KpConfigResource(KpResourceType.TOPIC, name)], config_filter="all")
    finally:
        kp.close()
    assert described["topic"][name]["retention.ms"]["value"] == "1800000"
    assert _topic_configs(admin, name)["retention.ms"].value == "1800000"


def test_cleanup_policy_compact_is_kept_with_its_settings(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"k-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "delete,compact",
                                                       "min.cleanable.dirty.ratio": "0.25",
                                                       "delete.retention.ms": "60000"})])[name].result(WAIT_S)
    configs = _topic_configs(admin, name)
    assert {k: configs[k].value for k in ("cleanup.policy", "min.cleanable.dirty.ratio", "delete.retention.ms",
                                          "min.compaction.lag.ms")} == {
        "cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.25", "delete.retention.ms": "60000",
        "min.compaction.lag.ms": "0"}


@pytest.mark.parametrize("config", [{"segment.bytes": "1024"}, {"cleanup.policy": "shrink"},
                                    {"min.cleanable.dirty.ratio": "1.5"},
                                    {"retention.ms": "-1"}, {"max.message.bytes": "many"}])
def test_a_config_gms_cannot_keep_is_refused_not_ignored(bootstrap, topic, config):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"k-{uuid.uuid4().hex[:10]}"
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(WAIT_S)
    assert name not in admin.list_topics(timeout=WAIT_S).topics
    (key, value), = config.items()
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        admin.incremental_alter_configs([resource])[resource].result(WAIT_S)


def test_broker_configs_are_described_read_only(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    node = admin.describe_cluster(request_timeout=WAIT_S).result(WAIT_S).nodes[0]
    resource = ConfigResource(ResourceType.BROKER, str(node.id))
    configs = admin.describe_configs([resource])[resource].result(WAIT_S)
    assert configs["num.partitions"].is_read_only and configs["auto.create.topics.enable"].value == "false"


def test_create_partitions_grows_the_topics_queues(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, PARTITIONS + 1)])[topic].result(WAIT_S)
    wait_until(lambda: len(admin.list_topics(topic, timeout=WAIT_S).topics[topic].partitions) == PARTITIONS + 1,
               WAIT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    delivered: list = []
    producer.produce(topic, b"new", partition=PARTITIONS, on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert producer.flush(WAIT_S) == 0
    assert delivered[0][0] is None and delivered[0][1].partition() == PARTITIONS
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions(topic, 1)])[topic].result(WAIT_S)

    async def grow_with_aiokafka() -> None:
        aio = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await aio.start()
        try:
            await aio.create_partitions({topic: AioNewPartitions(PARTITIONS + 2)})
            cluster = await aio.describe_cluster()
            assert cluster["cluster_id"]
        finally:
            await aio.close()
    asyncio.run(grow_with_aiokafka())
    wait_until(lambda: len(admin.list_topics(topic, timeout=WAIT_S).topics[topic].partitions) == PARTITIONS + 2,
               WAIT_S)


def test_what_the_admin_apis_do_not_serve_answers_kafkas_error(bootstrap, topic):
    with connect(bootstrap) as sock:
        controllers = call(sock, ApiKey.DESCRIBE_CLUSTER, 1, {"endpoint_type": 2})
        group_configs = call(sock, ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [
            {"resource_type": 32, "resource_name": "g", "configuration_keys": None}]})
        manual = call(sock, ApiKey.CREATE_PARTITIONS, 3, {"timeout_ms": 5000, "topics": [
            {"name": topic, "count": PARTITIONS + 1, "assignments": [{"broker_ids": [1]}]}]})
        missing = call(sock, ApiKey.CREATE_PARTITIONS, 3, {"timeout_ms": 5000, "topics": [
            {"name": "no-such-topic", "count": 3, "assignments": None}]})
    assert controllers["error_code"] == Err.MISMATCHED_ENDPOINT_TYPE
    assert group_configs["results"][0]["error_code"] == Err.INVALID_REQUEST
    assert manual["results"][0]["error_code"] == Err.INVALID_REQUEST
    assert missing["results"][0]["error_code"] == Err.UNKNOWN_TOPIC_OR_PARTITION
