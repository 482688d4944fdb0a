"""Hostile and unusual SendMessage requests through raw gRPC stubs against a real broker: a gzip
body is stored inflated; a gzip bomb, a corrupt gzip body, several messages in one request, a
message without an id and an unknown topic each get a clear RocketMQ status, and the broker
keeps serving."""

from __future__ import annotations

import gzip
import uuid

import grpc
import pytest

pytest.importorskip("rocketmq", reason="the RocketMQ API is the `rocketmq` extra: pip install '.[rocketmq]'")

from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from gms.client import Admin, SimpleConsumer
from tests.processes import wait_until

pytestmark = pytest.mark.timeout(60)
Code = definition_pb2.Code


def _message(topic: str, body: bytes, gzipped: bool = False, message_id: str | None = None) -> definition_pb2.Message:
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=body)
    system = message.system_properties
    system.message_id = uuid.uuid4().hex if message_id is None else message_id
    system.message_type = definition_pb2.MessageType.NORMAL
    system.body_encoding = definition_pb2.Encoding.GZIP if gzipped else definition_pb2.Encoding.IDENTITY
    return message


def _send(endpoint: str, *messages: definition_pb2.Message) -> definition_pb2.Status:
    with grpc.insecure_channel(endpoint) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            service_pb2.SendMessageRequest(messages=list(messages)), timeout=10)
    return answer.status


def test_gzip_bodies_are_inflated_and_bad_requests_are_refused_clearly(broker):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, 1)
    endpoint = broker.rocketmq
    original = b"compressible " * 1000
    assert _send(endpoint, _message(topic, gzip.compress(original), gzipped=True)).code == Code.OK

    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KiB: past the 4 MiB default
    refused = _send(endpoint, _message(topic, bomb, gzipped=True))
    assert refused.code == Code.BAD_REQUEST and "inflates past" in refused.message
    corrupt = _send(endpoint, _message(topic, b"\x1f\x8b not gzip at all", gzipped=True))
    assert corrupt.code == Code.BAD_REQUEST and "not valid gzip" in corrupt.message
    cut = _send(endpoint, _message(topic, gzip.compress(original)[:40], gzipped=True))
    assert cut.code == Code.BAD_REQUEST and "cut short" in cut.message
    two = _send(endpoint, _message(topic, b"a"), _message(topic, b"b"))
    assert two.code == Code.BAD_REQUEST
    no_id = _send(endpoint, _message(topic, b"x", message_id=""))
    assert no_id.code == Code.BAD_REQUEST and "message_id" in no_id.message
    assert _send(endpoint, _message("no-such-topic", b"x")).code == Code.TOPIC_NOT_FOUND

    assert _send(endpoint, _message(topic, b"still serving")).code == Code.OK
    consumer = SimpleConsumer([broker.address], group="g-bodies", subscription={topic: "*"}, start_from="first",
                              await_duration_ms=1000)
    try:
        got: list[bytes] = []
        wait_until(lambda: bool(got.extend(m.body for m in consumer.receive(16))) or len(got) >= 2, 10)
        assert got == [original, b"still serving"]  # nothing of the refused requests was stored
    finally:
        consumer.close()
