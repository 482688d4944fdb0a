"""RocketMQ 5's pull consumer RPCs over the broker's services: QueryOffset (a queue's min or max
offset, or the first stored at a time, as QUERY_MIN_OFFSET / QUERY_MAX_OFFSET /
QUERY_OFFSET_BY_TIME answer them), GetOffset and UpdateOffset (a group's committed offset, as
FETCH_OFFSET / COMMIT_OFFSET: what `gms group describe` shows) and PullMessage (as PULL: long
polling, tag and SQL92 filters). Offsets are gms queue offsets, as RocketMQ's are consume-queue offsets; a committed
offset is the next one to consume in both. Only the queues this broker leads are served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from rocketmq.grpc_protocol import definition_pb2

from gms.address import split_address
from gms.broker.rocketmq.mapping import (
    OffsetNotFoundError,
    Receipt,
    filter_args,
    status,
    timestamp_ms,
    to_rocketmq,
)
from gms.broker.services.groups import check_group_name
from gms.broker.services.messages import PullArgs
from gms.broker.store import GetStatus
from gms.errors import BadRequestError, OffsetIllegalError
from gms.msgid import encode_msg_id
from gms.protocol.groups import QueueOffset, QueueRef
from gms.record import iter_records

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

Code = definition_pb2.Code
Policy = definition_pb2.QueryOffsetPolicy
PULL_BATCH_MAX = 1024  # messages in one PullMessage; the broker's PULL caps it further


class Pulled(NamedTuple):
    """What a PullMessage answers: its status, the messages, the offset to pull from next."""

    status: definition_pb2.Status
    messages: list[definition_pb2.Message]
    next_offset: int


class Offsets:
    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker

    def _queue(self, queue: Any) -> tuple[str, int]:
        """A MessageQueue's topic and queue id, if led here."""
        self.broker.services.topics.check_led(queue.topic.name, queue.id)
        return queue.topic.name, queue.id

    async def query(self, request: Any) -> int:
        """QueryOffset: the queue's first offset (BEGINNING), its end (END: the next offset a
        message gets) or the first offset stored at or after a time (TIMESTAMP)."""
        topic, queue_id = self._queue(request.message_queue)
        messages = self.broker.services.messages
        policy = request.query_offset_policy
        if policy == Policy.BEGINNING:
            return messages.min_offset(topic, queue_id)
        if policy == Policy.END:
            return messages.max_offset(topic, queue_id)
        if policy == Policy.TIMESTAMP:
            return messages.offset_for_timestamp(topic, queue_id, timestamp_ms(request.timestamp))
        raise BadRequestError(f"unknown query_offset_policy {policy}")

    async def get(self, request: Any) -> int:
        """GetOffset: the group's committed offset of the queue (OffsetNotFoundError: none)."""
        topic, queue_id = self._queue(request.message_queue)
        (offset,) = self.broker.services.groups.committed_offsets(request.group.name, [QueueRef(topic, queue_id)])
        if offset is None:
            raise OffsetNotFoundError(f"group {request.group.name!r} committed no offset on {topic}/{queue_id}")
        return offset

    async def update(self, request: Any) -> None:
        """UpdateOffset: commit the group's offset of the queue."""
        topic, queue_id = self._queue(request.message_queue)
        entry = QueueOffset(topic, queue_id, request.offset)
        await self.broker.services.groups.commit_offsets(request.group.name, [entry])

    async def pull(self, request: Any, poll_ms: int) -> Pulled:
        """PullMessage: up to ``batch_size`` messages from ``offset`` passing the filter, waiting
        up to ``poll_ms`` for some. An offset out of the queue answers ILLEGAL_OFFSET and where to
        pull from instead."""
        topic, queue_id = self._queue(request.message_queue)
        check_group_name(request.group.name)  # gms's PULL takes none, RocketMQ's always has one
        messages = self.broker.services.messages
        tags, sql = filter_args(request.filter_expression)
        try:
            result = await messages.pull(PullArgs(
                topic, queue_id, request.offset, max_msgs=min(max(request.batch_size, 1), PULL_BATCH_MAX),
                poll_ms=poll_ms, tags=tags, sql=sql, group=request.group.name))
        except OffsetIllegalError as err:  # past the end: pull from the end instead
            return Pulled(status(Code.ILLEGAL_OFFSET, str(err)), [], messages.max_offset(topic, queue_id))
        next_offset = result.next_offset
        if result.status is GetStatus.OFFSET_TOO_SMALL:
            return Pulled(status(Code.ILLEGAL_OFFSET, f"offset {request.offset} is below the first one still"
                                 f" stored ({next_offset})"), [], next_offset)
        host, port = split_address(self.broker.address, "broker address")
        found = [to_rocketmq(record, 1, Receipt(record.topic, record.queue_id, record.queue_offset, 1,
                                                self.broker.address), encode_msg_id(host, port, record.phys_offset))
                 for view in result.records for record in iter_records(view, False)]
        if not found:
            return Pulled(status(Code.MESSAGE_NOT_FOUND, "no new message"), [], next_offset)
        return Pulled(status(), found, next_offset)
