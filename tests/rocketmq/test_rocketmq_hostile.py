"""A hostile or buggy client against every RPC of the RocketMQ endpoint, through raw gRPC stubs
and a real broker: each malformed, forged or absurd request gets a RocketMQ status of its own
(never gRPC's UNKNOWN or INTERNAL from an uncaught exception, never a hang), the broker logs no
traceback for any of them, and it keeps serving a normal send and receive afterwards."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

pytest.importorskip("rocketmq", reason="the RocketMQ API is the `rocketmq` extra: pip install '.[rocketmq]'")

from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from gms.client import Admin
from tests.rocketmq.conftest import rocketmq_broker

pytestmark = pytest.mark.timeout(60)
Code = definition_pb2.Code
FilterType = definition_pb2.FilterType
MessageType = definition_pb2.MessageType
LONG_POLL_MAX_MS = 1500  # the broker's cap on any long poll: a receive asking for days answers within it
CALL_TIMEOUT_S = 10  # no hostile request may keep its caller waiting longer (a hang fails the test)
INT64_MAX = 2**63 - 1

# What a refused request may answer: a RocketMQ status saying what is wrong with it.
REFUSED = frozenset({
    Code.BAD_REQUEST, Code.ILLEGAL_TOPIC, Code.ILLEGAL_CONSUMER_GROUP, Code.ILLEGAL_MESSAGE_TAG,
    Code.ILLEGAL_MESSAGE_KEY, Code.ILLEGAL_MESSAGE_GROUP, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, Code.ILLEGAL_MESSAGE_ID,
    Code.ILLEGAL_FILTER_EXPRESSION, Code.ILLEGAL_INVISIBLE_TIME, Code.ILLEGAL_DELIVERY_TIME, Code.ILLEGAL_POLLING_TIME,
    Code.ILLEGAL_OFFSET, Code.INVALID_RECEIPT_HANDLE, Code.INVALID_TRANSACTION_ID, Code.TOPIC_NOT_FOUND,
    Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, Code.MESSAGE_PROPERTIES_TOO_LARGE, Code.MESSAGE_BODY_TOO_LARGE,
    Code.PAYLOAD_TOO_LARGE, Code.NOT_FOUND,
})
TOPIC_REFUSED = frozenset({Code.TOPIC_NOT_FOUND, Code.ILLEGAL_TOPIC, Code.BAD_REQUEST})
HANDLE_REFUSED = frozenset({Code.INVALID_RECEIPT_HANDLE, Code.BAD_REQUEST})


@dataclass
class Target:
    """The broker under attack: its stub, two topics and a real receipt handle of each."""

    stub: Any
    topic: str
    other: str
    handle: str  # of a message of ``topic``, received by group "g"
    other_handle: str  # of a message of ``other``, received by group "g"


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("rmq-hostile")
    config = root / "broker.toml"
    config.write_text(f"[broker]\nlong_poll_max_ms = {LONG_POLL_MAX_MS}\n")
    yield from rocketmq_broker(root, "--config", str(config))


@pytest.fixture(scope="module")
def target(broker) -> Iterator[Target]:
    topic, other = (f"t-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with Admin([broker.address]) as admin:
        admin.create_topic(topic, 2)
        admin.create_topic(other, 1)
    with grpc.insecure_channel(broker.rocketmq) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        handles = []
        for name in (topic, other):
            assert _send(stub, _message(name, b"held")).status.code == Code.OK
            received = _receive(stub, "g", name, invisible_s=600)
            assert len(received) == 1
            handles.append(received[0].system_properties.receipt_handle)
        yield Target(stub, topic, other, *handles)


# -- requests -----------------------------------------------------------------------------------


def _resource(name: str) -> definition_pb2.Resource:
    return definition_pb2.Resource(name=name)


def _queue(topic: str, queue_id: int = 0) -> definition_pb2.MessageQueue:
    return definition_pb2.MessageQueue(topic=_resource(topic), id=queue_id)


def _message(topic: str, body: bytes = b"x", **system: Any) -> definition_pb2.Message:
    message = definition_pb2.Message(topic=_resource(topic), body=body)
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = MessageType.NORMAL
    for name, value in system.items():
        if name in ("delivery_timestamp", "born_timestamp", "orphaned_transaction_recovery_duration"):
            getattr(message.system_properties, name).seconds = value
        elif name == "keys":
            message.system_properties.keys.extend(value)
        else:
            setattr(message.system_properties, name, value)
    return message


def _send(stub: Any, *messages: definition_pb2.Message) -> Any:
    return stub.SendMessage(service_pb2.SendMessageRequest(messages=list(messages)), timeout=CALL_TIMEOUT_S)


def _receive_request(group: str, topic: str, *, batch: int = 16, invisible_s: int = 30, poll_s: int = 0,
                     expression: str = "*", filter_type: int = FilterType.TAG,
                     queue_id: int = -1) -> service_pb2.ReceiveMessageRequest:
    request = service_pb2.ReceiveMessageRequest(group=_resource(group), message_queue=_queue(topic, queue_id),
                                                batch_size=batch)
    request.filter_expression.type = filter_type
    request.filter_expression.expression = expression
    request.invisible_duration.seconds = invisible_s
    request.long_polling_timeout.seconds = poll_s
    return request


def _receive(stub: Any, group: str, topic: str, **kwargs: Any) -> list[definition_pb2.Message]:
    answers = list(stub.ReceiveMessage(_receive_request(group, topic, **kwargs), timeout=CALL_TIMEOUT_S))
    assert answers[0].status.code in (Code.OK, Code.MESSAGE_NOT_FOUND), answers[0].status
    return [answer.message for answer in answers if answer.HasField("message")]


def _forged(*fields: Any) -> str:
    """A receipt or recall handle as gms encodes them, with whatever fields."""
    return base64.urlsafe_b64encode(json.dumps(list(fields)).encode()).decode().rstrip("=")


def _pull(group: str, topic: str, *, queue_id: int = 0, offset: int = 0, batch: int = 16, poll_s: int = 0,
          expression: str = "*", filter_type: int = FilterType.TAG) -> service_pb2.PullMessageRequest:
    request = service_pb2.PullMessageRequest(group=_resource(group), message_queue=_queue(topic, queue_id),
                                             offset=offset, batch_size=batch)
    request.filter_expression.type = filter_type
    request.filter_expression.expression = expression
    request.long_polling_timeout.seconds = poll_s
    return request


def _ack(topic: str, group: str, *handles: str) -> service_pb2.AckMessageRequest:
    return service_pb2.AckMessageRequest(
        topic=_resource(topic), group=_resource(group),
        entries=[service_pb2.AckMessageEntry(message_id="00", receipt_handle=h) for h in handles])


def _change(topic: str, group: str, handle: str, seconds: int = 30) -> service_pb2.ChangeInvisibleDurationRequest:
    request = service_pb2.ChangeInvisibleDurationRequest(topic=_resource(topic), group=_resource(group),
                                                         receipt_handle=handle, message_id="00")
    request.invisible_duration.seconds = seconds
    return request


def _forward(topic: str, group: str, handle: str) -> service_pb2.ForwardMessageToDeadLetterQueueRequest:
    return service_pb2.ForwardMessageToDeadLetterQueueRequest(
        topic=_resource(topic), group=_resource(group), receipt_handle=handle, message_id="00",
        delivery_attempt=1, max_delivery_attempts=16)


def _query_offset(topic: str, queue_id: int = 0, policy: int = 0, at_s: int = 0) -> service_pb2.QueryOffsetRequest:
    request = service_pb2.QueryOffsetRequest(message_queue=_queue(topic, queue_id), query_offset_policy=policy)
    request.timestamp.seconds = at_s
    return request


def _end(topic: str, transaction_id: str, resolution: int = definition_pb2.TransactionResolution.COMMIT,
         message_id: str = "00") -> service_pb2.EndTransactionRequest:
    return service_pb2.EndTransactionRequest(topic=_resource(topic), message_id=message_id,
                                             transaction_id=transaction_id, resolution=resolution,
                                             source=definition_pb2.TransactionSource.SOURCE_CLIENT)


# -- the cases: (RPC, the request, the codes it may answer) --------------------------------------

Case = tuple[str, Callable[[Target], Any], frozenset[int]]
LONG = "t" * 10_000
SQL_DEEP = "(" * 5000 + "a = 1" + ")" * 5000

CASES: dict[str, Case] = {
    # routes
    "route-no-topic": ("QueryRoute", lambda t: service_pb2.QueryRouteRequest(), TOPIC_REFUSED),
    "route-unknown-topic": ("QueryRoute", lambda t: service_pb2.QueryRouteRequest(topic=_resource("nope")),
                            TOPIC_REFUSED),
    "route-long-topic": ("QueryRoute", lambda t: service_pb2.QueryRouteRequest(topic=_resource(LONG)), TOPIC_REFUSED),
    "route-bad-chars": ("QueryRoute", lambda t: service_pb2.QueryRouteRequest(topic=_resource("a/../b\x00é")),
                        TOPIC_REFUSED),
    "assignment-no-topic": ("QueryAssignment", lambda t: service_pb2.QueryAssignmentRequest(group=_resource("g")),
                            TOPIC_REFUSED),
    "assignment-no-group": ("QueryAssignment", lambda t: service_pb2.QueryAssignmentRequest(topic=_resource(t.topic)),
                            frozenset({Code.BAD_REQUEST, Code.ILLEGAL_CONSUMER_GROUP})),
    "assignment-bad-topic": ("QueryAssignment", lambda t: service_pb2.QueryAssignmentRequest(
        topic=_resource(LONG), group=_resource("g")), TOPIC_REFUSED),
    # sends
    "send-none": ("SendMessage", lambda t: service_pb2.SendMessageRequest(), REFUSED),
    "send-many": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic) for _ in range(100)]), REFUSED),
    "send-no-topic": ("SendMessage", lambda t: service_pb2.SendMessageRequest(messages=[_message("")]), REFUSED),
    "send-long-topic": ("SendMessage", lambda t: service_pb2.SendMessageRequest(messages=[_message(LONG)]),
                        TOPIC_REFUSED),
    "send-bad-chars": ("SendMessage", lambda t: service_pb2.SendMessageRequest(messages=[_message("a b/\x00")]),
                       TOPIC_REFUSED),
    "send-huge-body": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, bytes(5 << 20))]), REFUSED),  # past the 4 MiB default
    "send-huge-tag": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, tag="x" * 100_000)]), REFUSED),
    "send-many-keys": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, keys=[f"k{i}" for i in range(100_000)])]), REFUSED),
    "send-huge-key": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, keys=["k" * 100_000])]), REFUSED),
    "send-huge-property": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_with_properties(_message(t.topic), {"p": "v" * 1_000_000})]), REFUSED),
    "send-many-properties": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_with_properties(_message(t.topic), {f"p{i}": "v" for i in range(100_000)})]), REFUSED),
    "send-empty-property-name": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_with_properties(_message(t.topic), {"": "v"})]), REFUSED | {Code.OK}),
    "send-huge-message-id": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_id="Z" * 100_000)]), REFUSED),
    "send-non-hex-message-id": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_id="not hex! \x00")]), REFUSED | {Code.OK}),
    "send-huge-group": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_group="g" * 100_000, message_type=MessageType.FIFO)]), REFUSED),
    "send-huge-born-host": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, born_host="h" * 100_000)]), REFUSED),
    "send-unknown-type": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_type=99)]), REFUSED),
    "send-empty-group": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_group="", message_type=MessageType.FIFO)]), REFUSED | {Code.OK}),
    "send-unknown-encoding": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, body_encoding=99)]), REFUSED | {Code.OK}),
    "send-delivery-negative": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, delivery_timestamp=-10**12, message_type=MessageType.DELAY)]),
        REFUSED | {Code.OK}),
    "send-delivery-past": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, delivery_timestamp=1, message_type=MessageType.DELAY)]), REFUSED | {Code.OK}),
    "send-delivery-far-future": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, delivery_timestamp=INT64_MAX, message_type=MessageType.DELAY)]), REFUSED),
    "send-delivery-year-2500": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, delivery_timestamp=16_725_225_600, message_type=MessageType.DELAY)]), REFUSED),
    "send-born-negative": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, born_timestamp=-10**12)]), REFUSED | {Code.OK}),
    "send-born-huge": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, born_timestamp=INT64_MAX)]), REFUSED | {Code.OK}),
    "send-tx-negative-recovery": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_type=MessageType.TRANSACTION,
                           orphaned_transaction_recovery_duration=-10**9)]), REFUSED | {Code.OK}),
    "send-tx-huge-recovery": ("SendMessage", lambda t: service_pb2.SendMessageRequest(
        messages=[_message(t.topic, message_type=MessageType.TRANSACTION,
                           orphaned_transaction_recovery_duration=INT64_MAX)]), REFUSED | {Code.OK}),
    # receives
    "receive-no-group": ("ReceiveMessage", lambda t: _receive_request("", t.topic), REFUSED),
    "receive-long-group": ("ReceiveMessage", lambda t: _receive_request("g" * 10_000, t.topic), REFUSED),
    "receive-no-topic": ("ReceiveMessage", lambda t: _receive_request("g", ""), TOPIC_REFUSED),
    "receive-unknown-topic": ("ReceiveMessage", lambda t: _receive_request("g", "nope"), TOPIC_REFUSED),
    "receive-long-topic": ("ReceiveMessage", lambda t: _receive_request("g", LONG), TOPIC_REFUSED),
    "receive-invisible-zero": ("ReceiveMessage", lambda t: _receive_request("g", t.topic, invisible_s=0), REFUSED),
    "receive-invisible-negative": ("ReceiveMessage", lambda t: _receive_request("g", t.topic, invisible_s=-5),
                                   REFUSED),
    "receive-invisible-huge": ("ReceiveMessage", lambda t: _receive_request("g", t.topic, invisible_s=INT64_MAX),
                               REFUSED),
    "receive-batch-zero": ("ReceiveMessage", lambda t: _receive_request("g-b", t.topic, batch=0),
                           REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "receive-batch-negative": ("ReceiveMessage", lambda t: _receive_request("g-b", t.topic, batch=-7),
                               REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "receive-poll-negative": ("ReceiveMessage", lambda t: _receive_request("g-b", t.topic, poll_s=-5),
                              REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "receive-poll-int64": ("ReceiveMessage", lambda t: _receive_request("g-b", t.topic, poll_s=INT64_MAX),
                           frozenset({Code.OK, Code.MESSAGE_NOT_FOUND})),  # clamped
    "receive-broken-sql": ("ReceiveMessage", lambda t: _receive_request(
        "g", t.topic, expression="a >", filter_type=FilterType.SQL), frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    "receive-deep-sql": ("ReceiveMessage", lambda t: _receive_request(
        "g", t.topic, expression=SQL_DEEP, filter_type=FilterType.SQL), frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    "receive-long-sql": ("ReceiveMessage", lambda t: _receive_request(
        "g", t.topic, expression=" OR ".join(["a = 1"] * 50_000), filter_type=FilterType.SQL),
        frozenset({Code.ILLEGAL_FILTER_EXPRESSION, Code.MESSAGE_NOT_FOUND})),
    "receive-unknown-filter": ("ReceiveMessage", lambda t: _receive_request(
        "g", t.topic, expression="a = 1", filter_type=99), frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    "receive-bad-tags": ("ReceiveMessage", lambda t: _receive_request("g", t.topic, expression="||| |"),
                         frozenset({Code.ILLEGAL_FILTER_EXPRESSION, Code.MESSAGE_NOT_FOUND})),
    # acks and invisibility
    "ack-no-entries": ("AckMessage", lambda t: _ack(t.topic, "g"), REFUSED | {Code.OK}),
    "ack-garbage": ("AckMessage", lambda t: _ack(t.topic, "g", "!!!not a handle"), HANDLE_REFUSED),
    "ack-empty-handle": ("AckMessage", lambda t: _ack(t.topic, "g", ""), HANDLE_REFUSED),
    "ack-truncated": ("AckMessage", lambda t: _ack(t.topic, "g", t.handle[:-7]), HANDLE_REFUSED),
    "ack-bad-base64": ("AckMessage", lambda t: _ack(t.topic, "g", t.handle[:5] + "\u00e9\x00" + t.handle[5:]),
                       HANDLE_REFUSED),
    "ack-wrong-fields": ("AckMessage", lambda t: _ack(t.topic, "g", _forged(t.topic, "0", 0, 1, "b")),
                         HANDLE_REFUSED),
    "ack-forged-queue": ("AckMessage", lambda t: _ack(t.topic, "g", _forged(t.topic, 99, 0, 1, "b")), HANDLE_REFUSED),
    "ack-forged-negative-queue": ("AckMessage", lambda t: _ack(t.topic, "g", _forged(t.topic, -1, 0, 1, "b")),
                                  HANDLE_REFUSED),
    "ack-forged-huge-numbers": ("AckMessage", lambda t: _ack(t.topic, "g", _forged(t.topic, 2**70, 2**70, 2**70, "b")),
                                HANDLE_REFUSED),
    "ack-forged-unknown-topic": ("AckMessage", lambda t: _ack("nope", "g", _forged("nope", 0, 0, 1, "b")),
                                 HANDLE_REFUSED | TOPIC_REFUSED),
    "ack-other-topic": ("AckMessage", lambda t: _ack(t.topic, "g", t.other_handle), HANDLE_REFUSED),
    "ack-other-group": ("AckMessage", lambda t: _ack(t.topic, "other-group", t.handle), HANDLE_REFUSED),
    "ack-no-group": ("AckMessage", lambda t: _ack(t.topic, "", t.handle), REFUSED),
    "change-garbage": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "g", "garbage"), HANDLE_REFUSED),
    "change-forged-huge": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "g", _forged(t.topic, 2**40, 2**70,
                                                                                              -1, "b")),
                           HANDLE_REFUSED),
    "change-negative": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "g", t.handle, -30), REFUSED),
    "change-huge": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "g", t.handle, INT64_MAX), REFUSED),
    "change-other-topic": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "g", t.other_handle),
                           HANDLE_REFUSED),
    "change-other-group": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "other-group", t.handle),
                           HANDLE_REFUSED),
    "change-no-group": ("ChangeInvisibleDuration", lambda t: _change(t.topic, "", t.handle), REFUSED),
    "forward-garbage": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(t.topic, "g", "garbage"),
                        HANDLE_REFUSED),
    "forward-forged-negative": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(
        t.topic, "g", _forged(t.topic, -1, -5, 1, "b")), HANDLE_REFUSED),
    "forward-forged-huge": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(
        t.topic, "g", _forged(t.topic, 2**40, 2**70, 1, "b")), HANDLE_REFUSED),
    "forward-forged-past-end": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(
        t.topic, "g", _forged(t.topic, 0, 10**6, 1, "b")), HANDLE_REFUSED),
    "forward-forged-unknown-topic": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(
        "nope", "g", _forged("nope", 0, 0, 1, "b")), HANDLE_REFUSED | TOPIC_REFUSED),
    "forward-other-topic": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(t.topic, "g", t.other_handle),
                            HANDLE_REFUSED),
    "forward-other-group": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(t.topic, "other-group", t.handle),
                            HANDLE_REFUSED),
    "forward-no-group": ("ForwardMessageToDeadLetterQueue", lambda t: _forward(t.topic, "", t.handle), REFUSED),
    # offsets
    "query-offset-negative-queue": ("QueryOffset", lambda t: _query_offset(t.topic, -1), REFUSED),
    "query-offset-huge-queue": ("QueryOffset", lambda t: _query_offset(t.topic, 2**31 - 1), REFUSED),
    "query-offset-unknown-topic": ("QueryOffset", lambda t: _query_offset("nope"), TOPIC_REFUSED),
    "query-offset-no-topic": ("QueryOffset", lambda t: _query_offset(""), TOPIC_REFUSED),
    "query-offset-unknown-policy": ("QueryOffset", lambda t: _query_offset(t.topic, policy=99), REFUSED),
    "query-offset-negative-time": ("QueryOffset", lambda t: _query_offset(t.topic, policy=2, at_s=-10**12),
                                   REFUSED | {Code.OK}),
    "query-offset-huge-time": ("QueryOffset", lambda t: _query_offset(t.topic, policy=2, at_s=INT64_MAX),
                               REFUSED | {Code.OK}),
    "get-offset-no-group": ("GetOffset", lambda t: service_pb2.GetOffsetRequest(message_queue=_queue(t.topic)),
                            REFUSED),
    "get-offset-negative-queue": ("GetOffset", lambda t: service_pb2.GetOffsetRequest(
        group=_resource("g"), message_queue=_queue(t.topic, -3)), REFUSED),
    "get-offset-unknown-topic": ("GetOffset", lambda t: service_pb2.GetOffsetRequest(
        group=_resource("g"), message_queue=_queue("nope")), TOPIC_REFUSED),
    "update-offset-no-group": ("UpdateOffset", lambda t: service_pb2.UpdateOffsetRequest(
        message_queue=_queue(t.topic), offset=1), REFUSED),
    "update-offset-negative": ("UpdateOffset", lambda t: service_pb2.UpdateOffsetRequest(
        group=_resource("g-off"), message_queue=_queue(t.topic), offset=-5), REFUSED),
    "update-offset-huge-queue": ("UpdateOffset", lambda t: service_pb2.UpdateOffsetRequest(
        group=_resource("g-off"), message_queue=_queue(t.topic, 2**31 - 1), offset=1), REFUSED),
    "update-offset-past-end": ("UpdateOffset", lambda t: service_pb2.UpdateOffsetRequest(
        group=_resource("g-off"), message_queue=_queue(t.topic), offset=INT64_MAX), REFUSED | {Code.OK}),
    "pull-negative-offset": ("PullMessage", lambda t: _pull("g", t.topic, offset=-5), REFUSED),
    "pull-huge-offset": ("PullMessage", lambda t: _pull("g", t.topic, offset=INT64_MAX), REFUSED),
    "pull-negative-queue": ("PullMessage", lambda t: _pull("g", t.topic, queue_id=-1), REFUSED),
    "pull-huge-queue": ("PullMessage", lambda t: _pull("g", t.topic, queue_id=2**31 - 1), REFUSED),
    "pull-unknown-topic": ("PullMessage", lambda t: _pull("g", "nope"), TOPIC_REFUSED),
    "pull-no-group": ("PullMessage", lambda t: _pull("", t.topic), REFUSED),
    "pull-batch-zero": ("PullMessage", lambda t: _pull("g", t.topic, batch=0),
                        REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "pull-batch-negative": ("PullMessage", lambda t: _pull("g", t.topic, batch=-1),
                            REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "pull-batch-huge": ("PullMessage", lambda t: _pull("g", t.topic, batch=10**9),
                        REFUSED | {Code.OK, Code.MESSAGE_NOT_FOUND}),
    "pull-poll-negative": ("PullMessage", lambda t: _pull("g", t.topic, poll_s=-9),
                           frozenset({Code.OK, Code.MESSAGE_NOT_FOUND})),
    "pull-poll-int64": ("PullMessage", lambda t: _pull("g", t.topic, queue_id=1, poll_s=INT64_MAX),
                        frozenset({Code.OK, Code.MESSAGE_NOT_FOUND})),  # clamped
    "pull-broken-sql": ("PullMessage", lambda t: _pull("g", t.topic, expression="a >", filter_type=FilterType.SQL),
                        frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    "pull-deep-sql": ("PullMessage", lambda t: _pull("g", t.topic, expression=SQL_DEEP, filter_type=FilterType.SQL),
                      frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    "pull-unknown-filter": ("PullMessage", lambda t: _pull("g", t.topic, expression="a = 1", filter_type=99),
                            frozenset({Code.ILLEGAL_FILTER_EXPRESSION})),
    # transactions and recalls
    "end-unknown-tx": ("EndTransaction", lambda t: _end(t.topic, uuid.uuid4().hex), REFUSED),
    "end-empty-tx": ("EndTransaction", lambda t: _end(t.topic, ""), REFUSED),
    "end-garbage-tx": ("EndTransaction", lambda t: _end(t.topic, "\x00\xff" * 50_000), REFUSED),
    "end-no-topic": ("EndTransaction", lambda t: _end("", uuid.uuid4().hex), REFUSED),
    "end-rollback-unknown": ("EndTransaction", lambda t: _end(
        t.topic, "nope", definition_pb2.TransactionResolution.ROLLBACK), REFUSED),
    "recall-garbage": ("RecallMessage", lambda t: service_pb2.RecallMessageRequest(
        topic=_resource(t.topic), recall_handle="garbage!"), REFUSED),
    "recall-empty": ("RecallMessage", lambda t: service_pb2.RecallMessageRequest(topic=_resource(t.topic)), REFUSED),
    "recall-receipt-handle": ("RecallMessage", lambda t: service_pb2.RecallMessageRequest(
        topic=_resource(t.topic), recall_handle=t.handle), REFUSED),
}


def _with_properties(message: definition_pb2.Message, properties: dict[str, str]) -> definition_pb2.Message:
    message.user_properties.update(properties)
    return message


def _forged_recalls(target: Target, broker: Any) -> dict[str, str]:
    """Recall handles naming this broker with absurd or wrong commitlog offsets."""
    return {
        "negative": _forged(target.topic, broker.address, -1, "00"),
        "huge": _forged(target.topic, broker.address, 2**70, "00"),
        "past-end": _forged(target.topic, broker.address, 10**12, "00"),
        "not-scheduled": _forged(target.topic, broker.address, 0, "00"),
        "other-topic": _forged(target.other, broker.address, 0, "00"),
    }


def _status(rpc: str, request: Any, stub: Any) -> definition_pb2.Status:
    """The RPC's status; a gRPC error (an uncaught exception, a hang past the timeout) fails."""
    answer = getattr(stub, rpc)(request, timeout=CALL_TIMEOUT_S)
    if rpc in ("ReceiveMessage", "PullMessage"):
        answers = list(answer)
        assert answers and answers[0].HasField("status"), answers
        return answers[0].status
    return answer.status


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_request_gets_a_rocketmq_status(target: Target, case: str) -> None:
    rpc, make, allowed = CASES[case]
    answered = _status(rpc, make(target), target.stub)
    assert answered.code in allowed, f"{rpc} answered {Code.Name(answered.code)}: {answered.message}"


def test_forged_recall_handles_are_refused(target: Target, broker: Any) -> None:
    for name, handle in _forged_recalls(target, broker).items():
        answered = _status("RecallMessage", service_pb2.RecallMessageRequest(
            topic=_resource(target.topic), recall_handle=handle), target.stub)
        assert answered.code in REFUSED, f"{name}: {Code.Name(answered.code)}: {answered.message}"


def test_a_long_poll_asking_for_ages_is_bounded(target: Target) -> None:
    """RocketMQ's proxy clamps long polling; so does the broker (long_poll_max_ms)."""
    started = time.monotonic()
    assert _receive(target.stub, "g-poll", target.other, poll_s=10**9, expression="no-such-tag") == []
    assert time.monotonic() - started < LONG_POLL_MAX_MS / 1000 + 3


def test_a_huge_batch_size_is_clamped(target: Target) -> None:
    for i in range(3):
        assert _send(target.stub, _message(target.other, b"batch %d" % i)).status.code == Code.OK
    received = _receive(target.stub, "g-batch", target.other, batch=2**31 - 1)
    assert 3 <= len(received) <= 4  # the 3 and the one the fixture sent; never an error


def test_calls_cancelled_mid_way(target: Target) -> None:
    """Long polls the client gives up on: the broker drops them quietly (the final test reads its log)."""
    receive = _receive_request("g-cancel", target.other, poll_s=5, expression="no-such-tag")
    pull = _pull("g-cancel", target.other, poll_s=5, expression="no-such-tag")
    calls = [target.stub.ReceiveMessage(receive, timeout=CALL_TIMEOUT_S) for _ in range(20)]
    calls += [target.stub.PullMessage(pull, timeout=CALL_TIMEOUT_S) for _ in range(20)]
    time.sleep(0.3)
    for call in calls:
        call.cancel()
    with pytest.raises(grpc.RpcError):  # only 0.2 s to answer a 5 s long poll: the client's deadline ends it
        list(target.stub.ReceiveMessage(_receive_request("g-cancel", target.other, poll_s=5, expression="nope"),
                                        timeout=0.2))
    assert _send(target.stub, _message(target.topic)).status.code == Code.OK


def _telemetry(stub: Any, commands: list[Any], *, hold_s: float = 0.0) -> list[Any]:
    """Send the commands down a Telemetry stream (kept open ``hold_s`` more), then close it; the answers."""
    def requests() -> Iterator[Any]:
        yield from commands
        time.sleep(hold_s)
    return list(stub.Telemetry(requests(), timeout=CALL_TIMEOUT_S))


def test_telemetry_garbage_gets_statuses(target: Target) -> None:
    settings_of = service_pb2.TelemetryCommand
    garbage = [
        settings_of(),  # no command at all
        settings_of(status=definition_pb2.Status(code=Code.INTERNAL_ERROR)),
        settings_of(thread_stack_trace=service_pb2.ThreadStackTrace(nonce="x", thread_stack_trace="y")),
        settings_of(verify_message_result=service_pb2.VerifyMessageResult(nonce="x")),
        settings_of(recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
            transaction_id="x")),
    ]
    for command in garbage:
        answers = _telemetry(target.stub, [command])
        assert len(answers) == 1 and answers[0].status.code in (Code.NOT_IMPLEMENTED, Code.BAD_REQUEST), answers

    for group in ("", "g" * 10_000):  # refused before the endpoint keeps or looks up anything of it
        settings = definition_pb2.Settings(client_type=definition_pb2.ClientType.SIMPLE_CONSUMER)
        settings.subscription.group.name = group
        answers = _telemetry(target.stub, [service_pb2.TelemetryCommand(settings=settings)])
        assert len(answers) == 1 and answers[0].status.code in REFUSED, answers
    publishing = definition_pb2.Settings(client_type=definition_pb2.ClientType.PRODUCER)
    publishing.publishing.topics.extend([_resource(""), _resource(LONG), _resource("nope")])
    answers = _telemetry(target.stub, [service_pb2.TelemetryCommand(settings=publishing)], hold_s=0.3)
    assert len(answers) == 1 and answers[0].status.code == Code.OK, answers


def test_telemetry_streams_closed_abruptly_and_many_at_once(target: Target, broker: Any) -> None:
    """Streams cancelled mid-way, and 200 open at once (a producer's each): the broker keeps serving.
    (Each stream's 100 empty commands keep it open past its first answer; 1,000 each, 200,000 in
    all, outlasted the 10 s deadline on a slow shared host running the suite on both cores.)"""
    settings = definition_pb2.Settings(client_type=definition_pb2.ClientType.PRODUCER)
    settings.publishing.topics.append(_resource(target.topic))
    command = service_pb2.TelemetryCommand(settings=settings)
    with grpc.insecure_channel(broker.rocketmq) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        calls = [stub.Telemetry(iter([command] + [service_pb2.TelemetryCommand()] * 100), timeout=CALL_TIMEOUT_S)
                 for _ in range(200)]
        for call in calls:
            assert next(call).status.code == Code.OK
        for call in calls:
            call.cancel()
    assert _send(target.stub, _message(target.topic)).status.code == Code.OK


def test_the_broker_still_serves_and_logged_no_traceback(target: Target, broker: Any) -> None:
    """Last in the module: after every attack above a normal send and receive work, and nothing
    an attack did reached the log as an uncaught exception."""
    body = uuid.uuid4().bytes
    assert _send(target.stub, _message(target.topic, body)).status.code == Code.OK
    deadline = time.monotonic() + 10
    got: list[bytes] = []
    while body not in got and time.monotonic() < deadline:
        got += [m.body for m in _receive(target.stub, f"g-{uuid.uuid4().hex[:6]}", target.topic, batch=64, poll_s=1)]
    assert body in got
    log = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
