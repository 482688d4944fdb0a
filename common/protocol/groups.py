"""The queue rows of the consumer-side requests and answers: consumer groups (COMMIT_OFFSET,
FETCH_OFFSET, HEARTBEAT's ``held``, a member's queues in GET_CONSUMER_GROUP_MEMBERS,
RESET_OFFSETS, DELETE_GROUP), pop acknowledgements (ACK_MESSAGE's ``expired``) and open
transactions (LIST_TRANSACTIONS). Row kinds of :mod:`gms.protocol.rows` (``encode`` / ``decode``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gms.protocol.rows import I32, I64, QUEUE_ID, TOPIC, col, rows_field, wire_row


class QueueRef(NamedTuple):
    topic: str
    queue_id: int


class QueueOffset(NamedTuple):
    topic: str
    queue_id: int
    offset: int


class ExpiredHandle(NamedTuple):
    queue_id: int
    offset: int


class TransactionQueue(NamedTuple):
    topic: str
    queue_id: int
    messages: int


QUEUE_REF = wire_row(QueueRef, topic=TOPIC, queue_id=QUEUE_ID)
QUEUE_OFFSET = wire_row(
    QueueOffset,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    offset=col(I64, "an offset of the queue (a group's next offset to consume)"),
)
EXPIRED_HANDLE = wire_row(
    ExpiredHandle,
    queue_id=col(I32, "the queue (of the request's topic)"),
    offset=col(I64, "the message's queue offset: its handle no longer holds (handed out again since, or never here)"),
)
TRANSACTION_QUEUE = wire_row(
    TransactionQueue,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    messages=col(I64, "the transaction's half messages on it"),
)


def queue_refs(fields: Mapping[str, Any], name: str) -> list[QueueRef]:
    return rows_field(fields, name, QueueRef)


def queue_offsets(fields: Mapping[str, Any], name: str) -> list[QueueOffset]:
    return rows_field(fields, name, QueueOffset)
