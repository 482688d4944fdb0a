"""RocketMQ 5's pull consumer RPCs (QueryOffset, GetOffset, UpdateOffset, PullMessage) against
`gms standalone`, as raw gRPC calls (the Python client has no pull consumer): offsets are gms's
queue offsets, a commit is what `gms group describe` shows, and a pull honours tags and offsets."""

from __future__ import annotations

import json
import time
import uuid

import pytest

pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

import grpc
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from gms.client import Admin, Producer

pytestmark = pytest.mark.timeout(90)
Code = definition_pb2.Code
Policy = definition_pb2.QueryOffsetPolicy


@pytest.fixture
def sent(standalone):
    """A one-queue topic with a0 a1 a2 (tag A), then b3 b4 (tag B); the time between them (ms)."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=standalone["nameserver"]) as admin:
        admin.create_topic(topic, 1)
    with Producer(nameserver=standalone["nameserver"]) as producer:
        for i in range(3):
            producer.send(topic, f"a{i}".encode(), tag="A")
        time.sleep(0.05)
        between_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(3, 5):
            producer.send(topic, f"b{i}".encode(), tag="B")
    return topic, between_ms


@pytest.fixture
def stub(standalone):
    with grpc.insecure_channel(standalone["rocketmq"]) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


def _queue(topic: str, queue_id: int = 0) -> definition_pb2.MessageQueue:
    return definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=topic), id=queue_id)


def _group(name: str) -> definition_pb2.Resource:
    return definition_pb2.Resource(name=name)


def _query(stub, topic: str, policy: int, at_ms: int = 0) -> service_pb2.QueryOffsetResponse:
    request = service_pb2.QueryOffsetRequest(message_queue=_queue(topic), query_offset_policy=policy)
    request.timestamp.FromMilliseconds(at_ms)
    return stub.QueryOffset(request, timeout=10)


def _pull(stub, topic: str, offset: int, tags: str = "*", poll_ms: int = 0):
    """(status code, [(queue offset, body)], next offset) of one PullMessage."""
    request = service_pb2.PullMessageRequest(
        group=_group("g-pull"), message_queue=_queue(topic), offset=offset, batch_size=16,
        filter_expression=definition_pb2.FilterExpression(type=definition_pb2.FilterType.TAG, expression=tags))
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    answers = list(stub.PullMessage(request, timeout=10))
    assert answers[-1].HasField("next_offset") or answers[0].status.code != Code.OK, answers
    messages = [(a.message.system_properties.queue_offset, a.message.body) for a in answers if a.HasField("message")]
    return answers[0].status.code, messages, answers[-1].next_offset


def test_query_offset_beginning_end_and_time(stub, sent):
    topic, between_ms = sent
    assert _query(stub, topic, Policy.BEGINNING).offset == 0
    assert _query(stub, topic, Policy.END).offset == 5
    by_time = _query(stub, topic, Policy.TIMESTAMP, between_ms)
    assert (by_time.status.code, by_time.offset) == (Code.OK, 3)
    unknown = stub.QueryOffset(service_pb2.QueryOffsetRequest(message_queue=_queue(topic, 7)), timeout=10)
    assert unknown.status.code == Code.BAD_REQUEST and "no queue 7" in unknown.status.message


def test_pull_with_tags_from_an_offset(stub, sent):
    topic, _ = sent
    assert _pull(stub, topic, 0) == (Code.OK, [(i, f"{'ab'[i >= 3]}{i}".encode()) for i in range(5)], 5)
    assert _pull(stub, topic, 0, tags="B") == (Code.OK, [(3, b"b3"), (4, b"b4")], 5)
    assert _pull(stub, topic, 1, tags="A") == (Code.OK, [(1, b"a1"), (2, b"a2")], 5)  # b3 b4 scanned past
    started = time.monotonic()
    assert _pull(stub, topic, 5, poll_ms=1500) == (Code.MESSAGE_NOT_FOUND, [], 5)
    assert time.monotonic() - started > 0.5  # it long-polled
    assert _pull(stub, topic, 100) == (Code.ILLEGAL_OFFSET, [], 5)


def test_update_then_get_offset_and_group_describe(stub, sent, gms):
    topic, _ = sent
    group = f"g-{uuid.uuid4().hex[:8]}"
    missing = stub.GetOffset(service_pb2.GetOffsetRequest(group=_group(group), message_queue=_queue(topic)), timeout=10)
    assert missing.status.code == Code.OFFSET_NOT_FOUND
    updated = stub.UpdateOffset(service_pb2.UpdateOffsetRequest(group=_group(group), message_queue=_queue(topic),
                                                                offset=3), timeout=10)
    assert updated.status.code == Code.OK, updated.status.message
    got = stub.GetOffset(service_pb2.GetOffsetRequest(group=_group(group), message_queue=_queue(topic)), timeout=10)
    assert (got.status.code, got.offset) == (Code.OK, 3)
    described = gms("group", "describe", group, "--json")
    assert described.returncode == 0, described.stderr
    [row] = [r for r in json.loads(described.stdout)["queues"] if r["topic"] == topic]
    assert (row["queue_id"], row["committed"], row["lag"]) == (0, 3, 2)
