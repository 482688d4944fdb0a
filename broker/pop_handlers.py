"""POP_MESSAGE, ACK_MESSAGE and CHANGE_INVISIBLE_DURATION: the gms wire adapter of
:class:`gms.broker.services.consumption.ConsumptionService`.

A pop answers records like a pull (zero-copy views of the stored records), first those handed
out again — the ones whose attempts ran out (``exhausted``, for the consumer to move to the
dead-letter queue) then the others — then fresh ones; ``attempts`` gives the delivery attempt
of each record handed out again (fresh ones are attempt 1).
"""

from __future__ import annotations

from gms.broker.services.consumption import POP_BYTES_DEFAULT, ConsumptionService, PopArgs
from gms.protocol.fields import INT32, OFFSET_ARRAY, QUEUE_ID_ARRAY, field, read_int_array
from gms.protocol.frame import Frame, Response
from gms.protocol.groups import ExpiredHandle
from gms.protocol.rows import encode

ATTEMPTS_ARRAY = QUEUE_ID_ARRAY  # delivery attempts travel as big-endian int32


class PopHandlers:
    def __init__(self, service: ConsumptionService) -> None:
        self.service = service

    async def pop(self, request: Frame) -> Response:
        fields = request.fields
        popped = await self.service.pop(PopArgs(
            group=field(fields, "group", str), topic=field(fields, "topic", str),
            invisible_ms=field(fields, "invisible_ms", int), max_msgs=field(fields, "max_msgs", INT32, 32),
            max_bytes=field(fields, "max_bytes", int, POP_BYTES_DEFAULT), poll_ms=field(fields, "poll_ms", int, 0),
            max_attempts=field(fields, "max_attempts", INT32, 0), fifo=field(fields, "fifo", bool, False),
            start=fields.get("start", "last"), tags=field(fields, "tags", str, "*"),
            sql=field(fields, "sql", str, "")))
        return Response({"exhausted": len(popped.exhausted),
                         "attempts": popped.exhausted_attempts + popped.again_attempts,
                         "visible_at": popped.visible_at, "crc_checked": True},
                        body=popped.exhausted + popped.again + popped.fresh)

    async def ack(self, request: Frame) -> Response:
        """Acknowledge deliveries (``queue_ids``, ``offsets``, ``attempts`` arrays); answers the
        ones whose handle no longer holds as ``expired`` [[queue id, offset], ...]."""
        fields = request.fields
        expired = self.service.ack(
            field(fields, "group", str), field(fields, "topic", str),
            read_int_array(field(fields, "queue_ids", bytes), QUEUE_ID_ARRAY),
            read_int_array(field(fields, "offsets", bytes), OFFSET_ARRAY),
            read_int_array(field(fields, "attempts", bytes), ATTEMPTS_ARRAY))
        return Response({"expired": [encode(ExpiredHandle(*handle)) for handle in expired]})

    async def change_invisible_duration(self, request: Frame) -> Response:
        fields = request.fields
        visible_at = self.service.change_invisible(
            field(fields, "group", str), field(fields, "topic", str), field(fields, "queue_id", INT32),
            field(fields, "offset", int), field(fields, "attempt", INT32), field(fields, "invisible_ms", int))
        return Response({"visible_at": visible_at})
