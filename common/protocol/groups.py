"""The queue rows of consumer-group requests and answers (COMMIT_OFFSET, FETCH_OFFSET, HEARTBEAT's
``held``, RESET_OFFSETS, DELETE_GROUP): ``[topic, queue_id]`` and ``[topic, queue_id, offset]``.
NamedTuples, as the handlers unpack them, each with its :mod:`gms.protocol.rows` schema."""

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


class QueueOffset(NamedTuple):
    topic: str
    queue_id: int
    offset: int

    def to_wire(self) -> list[Any]:
        return QUEUE_OFFSET.encode(self)


QUEUE_REF = schema("QueueRef", [
    col("topic", STR, "the queue's topic"),
    col("queue_id", I32, "the queue"),
])
QUEUE_OFFSET = schema("QueueOffset", [
    col("topic", STR, "the queue's topic"),
    col("queue_id", I32, "the queue"),
    col("offset", I64, "an offset of the queue (a group's next offset to consume)"),
])


def queue_refs(fields: Mapping[str, Any], name: str) -> list[QueueRef]:
    """The :class:`QueueRef` rows of the list field ``name`` (BadRequestError names a bad one)."""
    return [QueueRef(*QUEUE_REF.decode(row, name)) for row in field(fields, name, list)]


def queue_offsets(fields: Mapping[str, Any], name: str) -> list[QueueOffset]:
    """The :class:`QueueOffset` rows of the list field ``name`` (BadRequestError names a bad one)."""
    return [QueueOffset(*QUEUE_OFFSET.decode(row, name)) for row in field(fields, name, list)]
