"""The queue rows of the consumer-side requests and answers: consumer groups (COMMIT_OFFSET,
FETCH_OFFSET, HEARTBEAT's ``held``, a member's queues in GET_CONSUMER_GROUP_MEMBERS,
RESET_OFFSETS, DELETE_GROUP), pop acknowledgements (ACK_MESSAGE's ``expired``) and open
transactions (LIST_TRANSACTIONS). NamedTuples, as their users unpack them, each with its
:mod:`gms.protocol.rows` schema and ``to_wire`` / ``from_wire``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gms.protocol.fields import field
from gms.protocol.rows import I32, I64, STR, col, schema


class QueueRef(NamedTuple):
    topic: str
    queue_id: int

    def to_wire(self) -> list[Any]:
        return QUEUE_REF.encode(self)

    @classmethod
    def from_wire(cls, row: Any, field: str = "row") -> QueueRef:
        return cls(*QUEUE_REF.decode(row, field))


class QueueOffset(NamedTuple):
    topic: str
    queue_id: int
    offset: int

    def to_wire(self) -> list[Any]:
        return QUEUE_OFFSET.encode(self)

    @classmethod
    def from_wire(cls, row: Any, field: str = "row") -> QueueOffset:
        return cls(*QUEUE_OFFSET.decode(row, field))


class ExpiredHandle(NamedTuple):
    queue_id: int
    offset: int

    def to_wire(self) -> list[Any]:
        return EXPIRED_HANDLE.encode(self)

    @classmethod
    def from_wire(cls, row: Any, field: str = "row") -> ExpiredHandle:
        return cls(*EXPIRED_HANDLE.decode(row, field))


class TransactionQueue(NamedTuple):
    topic: str
    queue_id: int
    messages: int

    def to_wire(self) -> list[Any]:
        return TRANSACTION_QUEUE.encode(self)

    @classmethod
    def from_wire(cls, row: Any, field: str = "row") -> TransactionQueue:
        return cls(*TRANSACTION_QUEUE.decode(row, field))


QUEUE_REF = schema("QueueRef", [
    col("topic", STR, "the queue's topic"),
    col("queue_id", I32, "the queue"),
])
QUEUE_OFFSET = schema("QueueOffset", [
    col("topic", STR, "the queue's topic"),
    col("queue_id", I32, "the queue"),
    col("offset", I64, "an offset of the queue (a group's next offset to consume)"),
])
EXPIRED_HANDLE = schema("ExpiredHandle", [
    col("queue_id", I32, "the queue (of the request's topic)"),
    col("offset", I64, "the message's queue offset: its handle no longer holds (handed out again since, or never"
                       " here)"),
])
TRANSACTION_QUEUE = schema("TransactionQueue", [
    col("topic", STR, "the queue's topic"),
    col("queue_id", I32, "the queue"),
    col("messages", I64, "the transaction's half messages on it"),
])


def queue_refs(fields: Mapping[str, Any], name: str) -> list[QueueRef]:
    """The :class:`QueueRef` rows of the list field ``name`` (BadRequestError names a bad one)."""
    return [QueueRef.from_wire(row, name) for row in field(fields, name, list)]


def queue_offsets(fields: Mapping[str, Any], name: str) -> list[QueueOffset]:
    """The :class:`QueueOffset` rows of the list field ``name`` (BadRequestError names a bad one)."""
    return [QueueOffset.from_wire(row, name) for row in field(fields, name, list)]
