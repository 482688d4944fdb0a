"""FETCH: many queues of this broker in one long poll (Kafka's Fetch), for the SDK's consumer;
the gms wire adapter of :meth:`gms.broker.services.messages.MessageService.fetch`.

Each queue is read as PULL reads it (committed records only below a replicated queue's high
watermark, tag and SQL filters on the broker, a clustering member's claim), and fails alone: its
row carries the error (offset out of range, not the leader, held by another member, unknown
topic, forbidden) and the others are served.
"""

from __future__ import annotations

from gms.broker.services.messages import MessageService
from gms.protocol.fetch import OK, FetchedQueue, decode_fetch_request
from gms.protocol.frame import Frame, Response


class FetchHandlers:
    def __init__(self, service: MessageService) -> None:
        self.service = service

    async def fetch(self, request: Frame) -> Response:
        reads = await self.service.fetch(decode_fetch_request(request.fields, self.service.config.long_poll_max_ms))
        rows, body = [], []
        for read in reads:
            if read.error is not None:
                rows.append(FetchedQueue.failed(read.queue, read.error).row())
                continue
            result = read.result
            assert result is not None  # a read without an error has its result
            rows.append(FetchedQueue(read.queue.topic, read.queue.queue_id, OK, result.next_offset, result.min_offset,
                                     result.max_offset, read.size, damaged=result.damaged).row())
            body += result.records
        # crc_checked: every record in the body passed its CRC check here (the SDK then checks only
        # the framing); damaged ones are listed in their rows, not sent.
        return Response({"queues": rows, "crc_checked": True}, body=body)
