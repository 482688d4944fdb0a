"""`gms group create` through `gms standalone`: the group's settings are the ones `gms group
config` keeps and changes, and a RocketMQ consumer's Telemetry settings carry them (max delivery
attempts, FIFO); creating a group that exists is refused."""

from __future__ import annotations

import json
import uuid

import pytest

pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

import grpc
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

pytestmark = pytest.mark.timeout(90)


def _telemetry_settings(endpoint: str, group: str) -> definition_pb2.Settings:
    """The settings a SimpleConsumer of ``group`` is answered (a raw Telemetry call)."""
    settings = definition_pb2.Settings(client_type=definition_pb2.ClientType.SIMPLE_CONSUMER)
    settings.subscription.group.name = group
    with grpc.insecure_channel(endpoint) as channel:
        answers = service_pb2_grpc.MessagingServiceStub(channel).Telemetry(
            iter([service_pb2.TelemetryCommand(settings=settings)]), timeout=10)
        [answer] = list(answers)
    assert answer.status.code == definition_pb2.Code.OK, answer.status.message
    return answer.settings


def test_group_create_then_config_reach_the_rocketmq_consumer(standalone, gms):
    group = f"g-{uuid.uuid4().hex[:8]}"
    created = gms("group", "create", group, "--fifo", "--max-delivery-attempts", "5", "--json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {**json.loads(created.stdout), "own": True, "fifo": True,
                                          "max_reconsume_times": 4}
    settings = _telemetry_settings(standalone["rocketmq"], group)
    assert settings.subscription.fifo and settings.backoff_policy.max_attempts == 5

    again = gms("group", "create", group, "--max-delivery-attempts", "3")
    assert again.returncode == 1 and f"consumer group {group} already exists" in again.stderr
    assert json.loads(gms("group", "config", group, "--json").stdout)["max_reconsume_times"] == 4  # unchanged

    changed = gms("group", "config", group, "--no-fifo", "--json")
    assert changed.returncode == 0 and json.loads(changed.stdout)["fifo"] is False
    assert json.loads(changed.stdout)["max_reconsume_times"] == 4  # config changes only what it names


def test_group_create_with_defaults(standalone, gms):
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert "max reconsume times  16 (max delivery attempts 17)" in gms("group", "create", group).stdout
    assert json.loads(gms("group", "config", group, "--json").stdout)["own"] is True
    settings = _telemetry_settings(standalone["rocketmq"], group)
    assert not settings.subscription.fifo and settings.backoff_policy.max_attempts == 17


def test_group_create_refuses_a_group_that_consumed(standalone, gms):
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    assert gms("topic", "create", topic, "--queues", "1").returncode == 0
    queue = definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=topic), id=0)
    with grpc.insecure_channel(standalone["rocketmq"]) as channel:  # a pull consumer's commit
        answer = service_pb2_grpc.MessagingServiceStub(channel).UpdateOffset(service_pb2.UpdateOffsetRequest(
            group=definition_pb2.Resource(name=group), message_queue=queue, offset=0), timeout=10)
    assert answer.status.code == definition_pb2.Code.OK, answer.status.message
    refused = gms("group", "create", group, "--fifo")
    assert refused.returncode == 1 and "already exists (it has consumed)" in refused.stderr
    assert json.loads(gms("group", "config", group, "--json").stdout)["own"] is False  # nothing stored
