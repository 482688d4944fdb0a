"""RocketMQ 5's pull consumer RPCs over the broker's own handlers: QueryOffset (a queue's min or
max offset, or the first stored at a time: QUERY_MIN_OFFSET / QUERY_MAX_OFFSET /
QUERY_OFFSET_BY_TIME), GetOffset and UpdateOffset (a group's committed offset: FETCH_OFFSET /
COMMIT_OFFSET, what `gms group describe` shows) and PullMessage (PULL: long polling, tag and SQL92
filters). Offsets are gms queue offsets, as RocketMQ's are consume-queue offsets; a committed
offset is the next one to consume in both. Only the queues this broker leads are served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from rocketmq.grpc_protocol import definition_pb2

from gms.address import split_address
from gms.broker.group_handlers import group_name_field
from gms.broker.rocketmq.calls import request_frame, settled
from gms.broker.rocketmq.mapping import (
    OffsetNotFoundError,
    Receipt,
    filter_fields,
    status,
    timestamp_ms,
    to_rocketmq,
)
from gms.broker.store import GetStatus
from gms.errors import BadRequestError, NotLeaderError, OffsetIllegalError
from gms.msgid import encode_msg_id
from gms.protocol.codes import RequestCode
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

    def _queue(self, queue: Any) -> dict[str, Any]:
        """A MessageQueue as the ``topic`` and ``queue_id`` fields of a request, if led here."""
        topic, queue_id = queue.topic.name, queue.id
        if queue_id not in self.broker.queues_led(topic):
            if not 0 <= queue_id < (self.broker.store.topics().get(topic) or 0):
                raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
            raise NotLeaderError(f"this broker does not lead {topic}/{queue_id}: refresh the route")
        return {"topic": topic, "queue_id": queue_id}

    async def query(self, request: Any) -> int:
        """QueryOffset: the queue's first offset (BEGINNING), its end (END: the next offset a
        message gets) or the first offset stored at or after a time (TIMESTAMP)."""
        fields = self._queue(request.message_queue)
        messages = self.broker.message_handlers
        policy = request.query_offset_policy
        if policy == Policy.BEGINNING:
            answer = await messages.query_min_offset(request_frame(RequestCode.QUERY_MIN_OFFSET, fields))
        elif policy == Policy.END:
            answer = await messages.query_max_offset(request_frame(RequestCode.QUERY_MAX_OFFSET, fields))
        elif policy == Policy.TIMESTAMP:
            fields["timestamp_ms"] = timestamp_ms(request.timestamp)
            answer = await messages.query_offset_by_time(request_frame(RequestCode.QUERY_OFFSET_BY_TIME, fields))
        else:
            raise BadRequestError(f"unknown query_offset_policy {policy}")
        return int(answer.fields["offset"])

    async def get(self, request: Any) -> int:
        """GetOffset: the group's committed offset of the queue (OffsetNotFoundError: none)."""
        queue = self._queue(request.message_queue)
        answer = await settled(self.broker.group_handlers.fetch(request_frame(RequestCode.FETCH_OFFSET, {
            "group": request.group.name, "queues": [[queue["topic"], queue["queue_id"]]]})))
        offset = int(answer.fields["offsets"][0])
        if offset < 0:
            raise OffsetNotFoundError(f"group {request.group.name!r} committed no offset on"
                                      f" {queue['topic']}/{queue['queue_id']}")
        return offset

    async def update(self, request: Any) -> None:
        """UpdateOffset: commit the group's offset of the queue."""
        queue = self._queue(request.message_queue)
        await settled(self.broker.group_handlers.commit(request_frame(RequestCode.COMMIT_OFFSET, {
            "group": request.group.name, "offsets": [[queue["topic"], queue["queue_id"], request.offset]]})))

    async def pull(self, request: Any, poll_ms: int) -> Pulled:
        """PullMessage: up to ``batch_size`` messages from ``offset`` passing the filter, waiting
        up to ``poll_ms`` for some. An offset out of the queue answers ILLEGAL_OFFSET and where to
        pull from instead."""
        fields = {**self._queue(request.message_queue), "offset": request.offset, "group": request.group.name,
                  "max_msgs": min(max(request.batch_size, 1), PULL_BATCH_MAX), "poll_ms": poll_ms,
                  **filter_fields(request.filter_expression)}
        group_name_field(fields)  # gms's PULL takes none, RocketMQ's always has one
        messages = self.broker.message_handlers
        try:
            answer = await settled(messages.pull(request_frame(RequestCode.PULL, fields)))
        except OffsetIllegalError as err:  # past the end: pull from the end instead
            end = await messages.query_max_offset(request_frame(RequestCode.QUERY_MAX_OFFSET, fields))
            return Pulled(status(Code.ILLEGAL_OFFSET, str(err)), [], int(end.fields["offset"]))
        next_offset = int(answer.fields["next_offset"])
        result = GetStatus(answer.fields["result"])
        if result is GetStatus.OFFSET_TOO_SMALL:
            return Pulled(status(Code.ILLEGAL_OFFSET, f"offset {request.offset} is below the first one still"
                                 f" stored ({next_offset})"), [], next_offset)
        views: list[memoryview] = answer.body or []  # type: ignore[assignment]  # pull answers a list of record views
        host, port = split_address(self.broker.address, "broker address")
        found = [to_rocketmq(record, 1, Receipt(record.topic, record.queue_id, record.queue_offset, 1,
                                                self.broker.address), encode_msg_id(host, port, record.phys_offset))
                 for view in views for record in iter_records(view, False)]
        if not found:
            return Pulled(status(Code.MESSAGE_NOT_FOUND, "no new message"), [], next_offset)
        return Pulled(status(), found, next_offset)
