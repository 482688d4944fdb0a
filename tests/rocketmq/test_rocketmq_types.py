"""Topic message types through `gms standalone`: `gms topic create --message-type` is kept with the
topic's settings, QueryRoute tells RocketMQ clients what the topic accepts, and SendMessage refuses
another type with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (the official client already refuses it
from the route)."""

from __future__ import annotations

import json
import uuid

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

import grpc  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

from gms.client import Admin  # noqa: E402
from tests.processes import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(90)
MessageType = definition_pb2.MessageType
ALL_TYPES = [MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION]


def _route_types(endpoint: str, topic: str) -> list[int] | None:
    """The accept_message_types of the topic's queues (all the same), None while the broker lacks the topic."""
    with grpc.insecure_channel(endpoint) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10)
    if answer.status.code == definition_pb2.Code.TOPIC_NOT_FOUND:
        return None
    assert answer.status.code == definition_pb2.Code.OK, answer.status.message
    types = {tuple(queue.accept_message_types) for queue in answer.message_queues}
    assert len(types) == 1, types
    return list(types.pop())


def _wait_route_types(endpoint: str, topic: str, expected: list[int]) -> None:
    wait_until(lambda: _route_types(endpoint, topic) == expected, 15)


def _raw_send(endpoint: str, topic: str, message_group: str | None = None) -> definition_pb2.Status:
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"typed")
    message.system_properties.message_id = uuid.uuid4().hex
    if message_group is None:
        message.system_properties.message_type = MessageType.NORMAL
    else:
        message.system_properties.message_type = MessageType.FIFO
        message.system_properties.message_group = message_group
    with grpc.insecure_channel(endpoint) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            service_pb2.SendMessageRequest(messages=[message]), timeout=10)
    return answer.status


def test_fifo_topic_accepts_only_fifo_messages(standalone, gms):
    topic = f"fifo-{uuid.uuid4().hex[:8]}"
    created = gms("topic", "create", topic, "--queues", "2", "--message-type", "fifo", "--json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["settings"]["message_type"] == "fifo"
    described = gms("topic", "describe", topic, "--json")
    assert json.loads(described.stdout)["settings"]["message_type"] == "fifo"
    assert "message type" in gms("topic", "describe", topic).stdout
    _wait_route_types(standalone["rocketmq"], topic, [MessageType.FIFO])

    refused = _raw_send(standalone["rocketmq"], topic)
    assert refused.code == definition_pb2.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert "accepts fifo messages, not NORMAL" in refused.message
    assert _raw_send(standalone["rocketmq"], topic, message_group="order-1").code == definition_pb2.Code.OK

    producer = rocketmq.Producer(rocketmq.ClientConfiguration(standalone["rocketmq"], rocketmq.Credentials()),
                                 (topic,))
    producer.startup()
    try:
        message = rocketmq.Message()
        message.topic, message.body = topic, b"normal"
        with pytest.raises(rocketmq.v5.exception.IllegalArgumentException):  # the route told the client
            producer.send(message)
        message.message_group = "order-2"
        assert producer.send(message).message_id
    finally:
        producer.shutdown()


def test_topic_without_a_type_is_mixed_until_updated(standalone, gms):
    topic = f"mixed-{uuid.uuid4().hex[:8]}"
    assert gms("topic", "create", topic, "--queues", "2").returncode == 0
    _wait_route_types(standalone["rocketmq"], topic, ALL_TYPES)
    assert _raw_send(standalone["rocketmq"], topic).code == definition_pb2.Code.OK

    assert gms("topic", "update", topic, "--message-type", "delay").returncode == 0
    _wait_route_types(standalone["rocketmq"], topic, [MessageType.DELAY])  # the broker follows the change
    assert _raw_send(standalone["rocketmq"], topic).code == definition_pb2.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


def test_unknown_message_type_is_a_usage_error(gms):
    result = gms("topic", "create", "t-bad", "--message-type", "lite")
    assert result.returncode == 2 and "lite" in result.stderr


def test_broker_without_nameserver_keeps_the_type(broker):
    topic = f"delay-{uuid.uuid4().hex[:8]}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, 2, settings={"message_type": "delay"})
    assert _route_types(broker.rocketmq, topic) == [MessageType.DELAY]
    assert _raw_send(broker.rocketmq, topic).code == definition_pb2.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    with Admin([broker.address]) as admin:
        admin.update_topic(topic, settings={"message_type": "normal"})
    assert _route_types(broker.rocketmq, topic) == [MessageType.NORMAL]
    assert _raw_send(broker.rocketmq, topic).code == definition_pb2.Code.OK
