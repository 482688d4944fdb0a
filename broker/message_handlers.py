"""SEND, PULL, offset queries, lookups by id and key, recall: the gms wire adapter of
:class:`gms.broker.services.messages.MessageService` (decode the frame, one service call, encode
the answer).

SEND is a direct handler (:data:`gms.net.server.DirectHandler`): a stored batch is answered
without an await; the answer lists each record's queue id and offsets as packed arrays.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Awaitable

from gms.broker.keyindex import TIME_MAX_MS
from gms.broker.services.messages import (
    FIND_MESSAGES_DEFAULT,
    PULL_BYTES_DEFAULT,
    MessageService,
    PullArgs,
)
from gms.broker.store import AppendResult
from gms.protocol.fields import INT32, OFFSET_ARRAY, QUEUE_ID_ARRAY, field, int_array
from gms.protocol.frame import HEADER_SIZE_MAX_BYTES, SEND_BODY_SIZE_MAX_BYTES, Frame, Response
from gms.record import HEADER_SIZE as RECORD_HEADER_SIZE

_I32 = struct.Struct(">i")  # QUEUE_ID_ARRAY's item
_I64 = struct.Struct(">q")  # OFFSET_ARRAY's item
assert _I32.size == QUEUE_ID_ARRAY.itemsize and _I64.size == OFFSET_ARRAY.itemsize
# A send's answer holds a queue id (4 bytes) and two offsets (8 each) per record in its header:
# even a request of the smallest records (a header and a one-byte topic) must fit the header
# limit, or the broker would store a batch it cannot acknowledge. The rest of that header (keys,
# bin lengths, the broker's address) takes far less than the slack.
_RESULT_BYTES_PER_RECORD = 4 + 8 + 8
_RESULT_HEADER_SLACK_BYTES = 64 * 1024
assert (SEND_BODY_SIZE_MAX_BYTES // (RECORD_HEADER_SIZE + 1) * _RESULT_BYTES_PER_RECORD
        + _RESULT_HEADER_SLACK_BYTES <= HEADER_SIZE_MAX_BYTES)


class MessageHandlers:
    def __init__(self, service: MessageService) -> None:
        self.service = service

    def send(self, request: Frame) -> Response | Awaitable[Response | None] | None:
        """Store the batch and answer at once, or return what waits for the flush and the
        replicas (sync flush, acks=-1; the server runs it as a task)."""
        started = time.perf_counter()
        result = self.service.send(request.body, field(request.fields, "acks", INT32, 1), started)
        if isinstance(result, AppendResult):
            return None if request.is_oneway else self.send_response(result)
        return self._answer_when_stored(request, result)

    async def _answer_when_stored(self, request: Frame, stored: Awaitable[AppendResult]) -> Response | None:
        result = await stored
        return None if request.is_oneway else self.send_response(result)

    def send_response(self, result: AppendResult) -> Response:
        if len(result.queue_ids) == 1:  # a single send: no numpy conversions
            queue_ids = _I32.pack(int(result.queue_ids[0]))
            queue_offsets = _I64.pack(int(result.queue_offsets[0]))
            phys_offsets = _I64.pack(int(result.phys_offsets[0]))
        else:
            queue_ids = int_array(result.queue_ids, QUEUE_ID_ARRAY)
            queue_offsets = int_array(result.queue_offsets, OFFSET_ARRAY)
            phys_offsets = int_array(result.phys_offsets, OFFSET_ARRAY)
        return Response({"queue_ids": queue_ids, "queue_offsets": queue_offsets, "phys_offsets": phys_offsets,
                         "broker": self.service.address})

    async def pull(self, request: Frame) -> Response:
        fields = request.fields
        result = await self.service.pull(PullArgs(
            topic=field(fields, "topic", str), queue_id=field(fields, "queue_id", INT32),
            offset=field(fields, "offset", int), max_msgs=field(fields, "max_msgs", INT32, 32),
            max_bytes=field(fields, "max_bytes", int, PULL_BYTES_DEFAULT), poll_ms=field(fields, "poll_ms", int, 0),
            tags=field(fields, "tags", str, "*"), sql=field(fields, "sql", str, ""),
            group=field(fields, "group", str, ""), member=field(fields, "member", str, "")))
        # crc_checked: every record in the body passed its CRC check here (the SDK then checks
        # only the framing); damaged ones are listed, not sent.
        answer: dict[str, object] = {
            "result": result.status.value, "next_offset": result.next_offset, "min_offset": result.min_offset,
            "max_offset": result.max_offset, "crc_checked": True}
        if result.damaged:  # left out of the body; the consumer passes them
            answer["damaged"] = [list(d) for d in result.damaged]
        return Response(answer, body=result.records)

    async def query_min_offset(self, request: Frame) -> Response:
        return Response({"offset": self.service.min_offset(*_queue_fields(request))})

    async def query_max_offset(self, request: Frame) -> Response:
        return Response({"offset": self.service.max_offset(*_queue_fields(request))})

    async def query_offset_by_time(self, request: Frame) -> Response:
        timestamp_ms = field(request.fields, "timestamp_ms", int)
        return Response({"offset": self.service.offset_for_timestamp(*_queue_fields(request), timestamp_ms)})

    async def cancel_scheduled(self, request: Frame) -> Response:
        record = self.service.cancel_scheduled(field(request.fields, "phys_offset", int))
        return Response({"topic": record.topic, "queue_id": record.queue_id, "queue_offset": record.queue_offset})

    async def view_message(self, request: Frame) -> Response:
        fields = request.fields
        return Response(body=self.service.view(field(fields, "phys_offset", int), field(fields, "origin", str, "")))

    async def find_by_key(self, request: Frame) -> Response:
        """The records back to back in the body as a pull answer holds them (``count`` of them)."""
        fields = request.fields
        found = self.service.find_by_key(
            field(fields, "topic", str), field(fields, "key", str), field(fields, "begin_ms", int, 0),
            field(fields, "end_ms", int, TIME_MAX_MS), field(fields, "max_messages", INT32, FIND_MESSAGES_DEFAULT))
        return Response({"count": len(found)}, body=b"".join(found))


def _queue_fields(request: Frame) -> tuple[str, int]:
    return field(request.fields, "topic", str), field(request.fields, "queue_id", INT32)
