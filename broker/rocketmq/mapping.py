"""RocketMQ 5 ↔ gms: messages, receipt handles, timestamps and status codes.

Pure functions over the generated stubs of ``rocketmq-python-client`` (``rocketmq.grpc_protocol``);
the servicer (:mod:`gms.broker.rocketmq.service`) only moves them between gRPC and gms's handlers.

- A RocketMQ message becomes one gms record: topic, tag, keys, body, born host and time as they
  are; user properties as properties; the client's own message id in ``MESSAGE_ID_PROPERTY``;
  ``message_group`` as gms's FIFO property; ``delivery_timestamp`` as gms's scheduled delivery;
  a TRANSACTION message as a half message of gms's transactions (docs/transactions.md) whose
  transaction id is the message id (one message per RocketMQ transaction: a retried send joins
  its transaction instead of leaving an orphan) and whose producer group is the topic's
  (:func:`producer_group`; ``orphaned_transaction_recovery_duration`` as the transaction's timeout).
- A record read back becomes a RocketMQ message with the system properties the client reads:
  its message id (the client's, or gms's own id of the record for messages sent another way),
  receipt handle, born/store timestamps, delivery attempt, queue id and offset, and the body's
  CRC32 digest (8 upper-case hex digits, as the client checks it); a transaction's message (a
  half, a commit's copy) is of type TRANSACTION.
- A topic's message type (``gms topic create --message-type``) is the RocketMQ types it accepts
  (mixed: all four); a message of another type conflicts with it.
- A receipt handle is opaque to the client: the base64url of ``[topic, queue id, queue offset,
  delivery attempt, broker]`` as JSON, what gms's pop ack needs. A recall handle likewise holds
  ``[topic, broker, commitlog offset, message id]``, what gms's scheduled-message cancel needs.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from rocketmq.grpc_protocol import definition_pb2

from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    GmsError,
    MessageIllegalError,
    MessageNotFoundError,
    NotLeaderError,
    OffsetIllegalError,
    ReceiptHandleExpiredError,
    ServerBusyError,
    ServiceUnavailableError,
    TopicNotFoundError,
    TransactionNotFoundError,
)
from gms.record import Record
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_HALF,
    FLAG_SCHEDULED,
    MESSAGE_GROUP_PROPERTY,
    TX_GROUP_PROPERTY,
    TX_ID_PROPERTY,
    TX_TIMEOUT_PROPERTY,
)

Code = definition_pb2.Code
MessageType = definition_pb2.MessageType

GZIP_WBITS = 31  # zlib's window bits for the gzip format, as RocketMQ clients compress bodies
MESSAGE_ID_PROPERTY = "__RMQ_MSG_ID"  # the RocketMQ client's own id of the message
# Property names gms keeps for itself start with this: refused from RocketMQ users, never shown.
SYSTEM_PROPERTY_PREFIX = "__"
# The Python client 5.1.2 puts milliseconds in delivery_timestamp.seconds; a "seconds" value past
# this (year 5138) can only be milliseconds.
SECONDS_MAX_PLAUSIBLE = 100_000_000_000
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
# RocketMQ 5 producers have no group; the producer group of the transactions sent to a topic is
# this plus the topic: any producer publishing the topic answers its check-backs (as RocketMQ's proxy
# asks any producer client publishing the topic).
PRODUCER_GROUP_PREFIX = "%RMQ_PRODUCER%"

# A topic's message type (gms.cluster.model.TOPIC_MESSAGE_TYPES; None: mixed) → what it accepts.
_ACCEPTED_TYPES: dict[str | None, tuple[int, ...]] = {
    "normal": (MessageType.NORMAL,), "fifo": (MessageType.FIFO,), "delay": (MessageType.DELAY,),
    "transaction": (MessageType.TRANSACTION,),
    "mixed": (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION),
}
_ACCEPTED_TYPES[None] = _ACCEPTED_TYPES["mixed"]


class MessageTypeConflictError(BadRequestError):
    """A message of a type its topic does not accept (RocketMQ's MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)."""


class OffsetNotFoundError(GmsError):
    """The group committed no offset on the queue (RocketMQ's OFFSET_NOT_FOUND)."""


# gms errors → RocketMQ codes; the first matching class wins (subclasses first).
_ERROR_CODES: tuple[tuple[type[GmsError], int], ...] = (
    (MessageTypeConflictError, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (OffsetNotFoundError, Code.OFFSET_NOT_FOUND),
    (OffsetIllegalError, Code.ILLEGAL_OFFSET),
    (TopicNotFoundError, Code.TOPIC_NOT_FOUND),
    (BadTagExpressionError, Code.ILLEGAL_FILTER_EXPRESSION),
    (ReceiptHandleExpiredError, Code.INVALID_RECEIPT_HANDLE),
    (MessageNotFoundError, Code.NOT_FOUND),  # MESSAGE_NOT_FOUND is "no new message" to the clients
    (TransactionNotFoundError, Code.INVALID_TRANSACTION_ID),
    (MessageIllegalError, Code.BAD_REQUEST),
    (BadRequestError, Code.BAD_REQUEST),
    (NotLeaderError, Code.INTERNAL_SERVER_ERROR),  # no UNAVAILABLE code: the client retries these
    (ServiceUnavailableError, Code.INTERNAL_SERVER_ERROR),
    (ServerBusyError, Code.TOO_MANY_REQUESTS),
)


def status(code: int = Code.OK, message: str = "OK") -> definition_pb2.Status:
    return definition_pb2.Status(code=code, message=message)


def error_status(err: GmsError) -> definition_pb2.Status:
    """The RocketMQ status of a gms error (INTERNAL_SERVER_ERROR when unmapped)."""
    for cls, code in _ERROR_CODES:
        if isinstance(err, cls):
            return status(code, str(err))
    return status(Code.INTERNAL_SERVER_ERROR, str(err))


def accepted_types(topic_type: str | None) -> tuple[int, ...]:
    """The RocketMQ message types a topic of ``topic_type`` accepts (QueryRoute tells clients)."""
    return _ACCEPTED_TYPES[topic_type]


def check_message_type(message: Any, topic_type: str | None) -> None:
    """MessageTypeConflictError if the topic (of ``topic_type``) does not accept ``message``'s type."""
    sent = sent_type(message)
    if sent not in MessageType.values():
        raise BadRequestError(f"unknown message type {sent}")
    if sent not in accepted_types(topic_type):
        raise MessageTypeConflictError(
            f"topic {message.topic.name!r} accepts {topic_type or 'mixed'} messages, not"
            f" {MessageType.Name(sent)} ones (gms topic update {message.topic.name} --message-type ...)")


def filter_args(expression: Any) -> tuple[str, str]:
    """A FilterExpression as the ``tags`` and ``sql`` arguments of the pop and pull services."""
    if expression.type == definition_pb2.FilterType.SQL:
        return "*", expression.expression
    return expression.expression or "*", ""


def sent_type(message: Any) -> int:
    """A message's RocketMQ type; one that names none (a raw client's) is what its properties make it."""
    system = message.system_properties
    if system.message_type != MessageType.MESSAGE_TYPE_UNSPECIFIED:
        return int(system.message_type)
    if system.HasField("delivery_timestamp"):
        return MessageType.DELAY
    return MessageType.FIFO if system.HasField("message_group") else MessageType.NORMAL


def producer_group(topic: str) -> str:
    """The gms producer group of the RocketMQ clients' transactions on ``topic``."""
    return PRODUCER_GROUP_PREFIX + topic


# -- time ---------------------------------------------------------------------------------------


def timestamp_ms(ts: Any) -> int:
    """A protobuf Timestamp in epoch ms (see SECONDS_MAX_PLAUSIBLE for the client's ms quirk)."""
    if ts.seconds > SECONDS_MAX_PLAUSIBLE:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def set_timestamp(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)
    ts.nanos *= 1_000_000


def duration_ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


# -- receipt handles ------------------------------------------------------------------------------


def _encode_handle(fields: tuple[Any, ...]) -> str:
    raw = json.dumps(list(fields), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_handle(handle: str, types: tuple[type, ...]) -> list[Any]:
    """A handle's fields, checked against ``types``; ValueError if it is not one of ours."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))
    except (ValueError, TypeError) as err:
        raise ValueError(str(err)) from err
    if not isinstance(fields, list) or [type(f) for f in fields] != list(types):
        raise ValueError("wrong fields")
    return fields


class Receipt(NamedTuple):
    topic: str
    queue_id: int
    offset: int
    attempt: int
    broker: str

    def encode(self) -> str:
        return _encode_handle(self)

    @classmethod
    def decode(cls, handle: str) -> Receipt:
        """The receipt a handle holds (ReceiptHandleExpiredError if it is not one of ours)."""
        try:
            receipt = cls(*_decode_handle(handle, (str, int, int, int, str)))
            if not (0 <= receipt.queue_id <= INT32_MAX and 0 <= receipt.offset <= INT64_MAX
                    and 0 <= receipt.attempt <= INT32_MAX):  # forged: gms's int arrays would overflow
                raise ValueError("a number out of range")
        except ValueError as err:
            raise ReceiptHandleExpiredError(f"receipt handle {handle[:64]!r} is not one of gms's: {err}") from err
        return receipt


class RecallHandle(NamedTuple):
    """What a DELAY message's recall handle holds: where it is stored (what gms's scheduled-message
    cancel takes) and the client's message id (RecallMessage answers it)."""

    topic: str
    broker: str
    phys_offset: int
    message_id: str

    def encode(self) -> str:
        return _encode_handle(self)

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        try:
            return cls(*_decode_handle(handle, (str, str, int, str)))
        except ValueError as err:
            raise BadRequestError(f"recall handle {handle[:64]!r} is not one of gms's: {err}") from err


# -- messages ---------------------------------------------------------------------------------------


class Outgoing(NamedTuple):
    """What a RocketMQ message becomes in gms: the arguments of ``encode_record`` but the queue."""

    topic: str
    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    flags: int
    born_host: str
    born_ts_ms: int
    message_group: str | None
    message_id: str


def from_rocketmq(message: Any, now_ms: int, body_max: int) -> Outgoing:
    """A SendMessageRequest's message as a gms record's fields (BadRequestError if unusable).
    ``body_max``: the most a gzip-encoded body may inflate to (its topic's largest record)."""
    system = message.system_properties
    if not message.topic.name:
        raise BadRequestError("the message names no topic")
    if not system.message_id:
        raise BadRequestError("the message has no message_id (RocketMQ clients set one)")
    properties = dict(message.user_properties)
    reserved = [name for name in properties if name.startswith(SYSTEM_PROPERTY_PREFIX)]
    if reserved:
        raise BadRequestError(f"property names starting with {SYSTEM_PROPERTY_PREFIX!r} are gms's: {reserved}")
    properties[MESSAGE_ID_PROPERTY] = system.message_id
    flags = 0
    group = system.message_group if system.HasField("message_group") else None
    if group is not None:
        properties[MESSAGE_GROUP_PROPERTY] = group
    if system.HasField("delivery_timestamp"):
        deliver_at = timestamp_ms(system.delivery_timestamp)
        if deliver_at > now_ms:
            properties[DELIVER_AT_PROPERTY] = str(deliver_at)
            flags |= FLAG_SCHEDULED
    if system.message_type == definition_pb2.MessageType.TRANSACTION:
        properties[TX_ID_PROPERTY] = system.message_id
        properties[TX_GROUP_PROPERTY] = producer_group(message.topic.name)
        if system.HasField("orphaned_transaction_recovery_duration"):
            properties[TX_TIMEOUT_PROPERTY] = str(duration_ms(system.orphaned_transaction_recovery_duration))
        flags |= FLAG_HALF
    gzipped = system.body_encoding == definition_pb2.Encoding.GZIP
    body = _gunzip(message.body, body_max) if gzipped else message.body
    born_ms = timestamp_ms(system.born_timestamp) if system.HasField("born_timestamp") else now_ms
    return Outgoing(message.topic.name, body, system.tag if system.HasField("tag") else None,
                    tuple(system.keys), properties, flags, system.born_host, born_ms or now_ms, group,
                    system.message_id)


def _gunzip(body: bytes, body_max: int) -> bytes:
    """A gzip body inflated, never past ``body_max`` bytes (a small body may inflate to gigabytes)."""
    inflater = zlib.decompressobj(wbits=GZIP_WBITS)
    try:
        inflated = inflater.decompress(body, body_max + 1)
    except zlib.error as err:
        raise MessageIllegalError(f"the body is marked GZIP but is not valid gzip ({err})") from None
    if len(inflated) > body_max:
        raise MessageIllegalError(f"the gzip body inflates past the topic's largest message ({body_max} bytes)")
    if not inflater.eof:
        raise MessageIllegalError("the body is marked GZIP but its gzip stream is cut short")
    return inflated


def to_rocketmq(record: Record, attempt: int, receipt: Receipt, gms_message_id: str) -> definition_pb2.Message:
    """A popped record as the message a ReceiveMessage answers. ``gms_message_id``: the id of
    messages that carry no RocketMQ client's id (sent with gms's SDK)."""
    props: Mapping[str, str] = record.properties
    message = definition_pb2.Message()
    message.topic.name = record.topic
    body = bytes(record.body)
    message.body = body
    message.user_properties.update({k: v for k, v in props.items() if not k.startswith(SYSTEM_PROPERTY_PREFIX)})
    system = message.system_properties
    system.message_id = props.get(MESSAGE_ID_PROPERTY) or gms_message_id
    if record.tag:
        system.tag = record.tag
    system.keys.extend(record.keys)
    system.body_digest.type = definition_pb2.DigestType.CRC32
    system.body_digest.checksum = format(zlib.crc32(body) & 0xFFFFFFFF, "08X")
    system.body_encoding = definition_pb2.Encoding.IDENTITY
    set_timestamp(system.born_timestamp, record.born_ts_ms)
    system.born_host = record.born_host
    set_timestamp(system.store_timestamp, record.store_ts_ms)
    system.store_host = receipt.broker
    system.queue_id = record.queue_id
    system.queue_offset = record.queue_offset
    system.delivery_attempt = attempt
    system.receipt_handle = receipt.encode()
    system.message_type = definition_pb2.MessageType.NORMAL
    if (group := props.get(MESSAGE_GROUP_PROPERTY)) is not None:
        system.message_group = group
        system.message_type = definition_pb2.MessageType.FIFO
    if (deliver_at := props.get(DELIVER_AT_PROPERTY)) is not None and deliver_at.isdigit():
        set_timestamp(system.delivery_timestamp, int(deliver_at))
        system.message_type = definition_pb2.MessageType.DELAY
    if TX_ID_PROPERTY in props:
        system.message_type = definition_pb2.MessageType.TRANSACTION
    return message
