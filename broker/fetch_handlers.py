"""FETCH: many queues of this broker in one long poll (Kafka's Fetch), for the SDK's consumer.

Each queue is read as PULL reads it (committed records only below a replicated queue's high
watermark, tag and SQL filters on the broker, a clustering member's claim), and fails alone: its
row carries the error (offset out of range, not the leader, held by another member, unknown
topic, forbidden) and the others are served. The answer goes out as soon as any queue has
records (or moved its position), else after ``poll_ms``; while it waits, one waiter is parked
for all its queues, and a wake-up reads again only the queues it names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gms.broker.access import BrokerAccess
from gms.broker.long_poll import PullWaiters
from gms.broker.message_handlers import consumer_read
from gms.broker.metrics import BrokerMetrics
from gms.broker.queue_claims import QueueClaims
from gms.broker.sql_filters import selector, sql_filter
from gms.broker.store import MessageStore, RecordSelector
from gms.errors import BadTagExpressionError, GmsError
from gms.protocol.fetch import EARLIEST, LATEST, OK, FetchedQueue, FetchRequest, QueueFetch, decode_fetch_request
from gms.protocol.frame import Frame, Response
from gms.tags import BadTagExpression, parse_tag_expression

# (tag hashes or None, SQL selector or None) of a topic, or the error its filter or access gave.
_Filter = tuple[frozenset[int] | None, RecordSelector | None]


class FetchHandlers:
    def __init__(self, store: MessageStore, waiters: PullWaiters, claims: QueueClaims,
                 read_limit: Callable[[tuple[str, int]], int | None], poll_ms_max: int,
                 access: BrokerAccess | None = None, metrics: BrokerMetrics | None = None) -> None:
        """``read_limit``: what consumers may read of a queue (its high watermark; None: its end;
        NotLeaderError where this broker does not lead it)."""
        self.store = store
        self.waiters = waiters
        self.claims = claims
        self.read_limit = read_limit
        self.poll_ms_max = poll_ms_max
        self.access = access
        self.metrics = metrics

    async def fetch(self, request: Frame) -> Response:
        req = decode_fetch_request(request.fields, self.poll_ms_max)
        filters = self._filters(req)
        now_ms = _now_ms()
        rows: list[FetchedQueue] = []
        live: dict[tuple[str, int], QueueFetch] = {}  # the queues read (again) when woken
        for queue in req.queues:
            found = filters[queue.topic]
            if isinstance(found, GmsError):
                rows.append(FetchedQueue.failed(queue, found))
                continue
            if req.member:
                try:  # QueueHeldError while another member of the group still reads it
                    self.claims.claim(req.group, req.member, queue.topic, queue.queue_id, now_ms,
                                      busy_ms=req.poll_ms)
                except GmsError as err:
                    rows.append(FetchedQueue.failed(queue, err))
                    continue
            live[queue.topic, queue.queue_id] = queue
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.poll_ms / 1000
        body: list[memoryview] = []
        budget = req.max_total_bytes
        to_read = list(live.values())
        while True:
            for queue in to_read:
                if budget <= 0:
                    break
                row, records = self._read(req, queue, filters[queue.topic], budget)  # type: ignore[arg-type]
                if row is None:
                    continue
                rows.append(row)
                if records:
                    body += records
                    budget -= row.size
                if row.status != OK or row.next_offset != queue.offset:
                    del live[queue.topic, queue.queue_id]
            remaining_s = deadline - loop.time()
            if rows or not live or remaining_s <= 0:
                break
            woken = await self.waiters.wait_any(live, remaining_s)
            if not woken:  # timed out or stopping: answer after one last look at every queue
                deadline = loop.time()
                to_read = list(live.values())
            else:
                to_read = [q for key in woken if (q := live.get(key)) is not None]
        if req.member:
            now_ms = _now_ms()
            for row in rows:
                if row.status == OK:
                    self.claims.refresh(req.group, req.member, row.topic, row.queue_id, now_ms)
        if self.metrics is not None and req.group:
            for topic, found in filters.items():
                if not isinstance(found, GmsError):
                    self.metrics.subscriptions[req.group, topic] = found[0]
        # crc_checked: every record in the body passed its CRC check here (the SDK then checks only
        # the framing); damaged ones are listed in their rows, not sent.
        return Response({"queues": [row.row() for row in rows], "crc_checked": True}, body=body)

    def _filters(self, req: FetchRequest) -> dict[str, _Filter | GmsError]:
        """Each topic's filter, or the error all its queues answer (a bad expression, no access)."""
        found: dict[str, _Filter | GmsError] = {}
        for topic in {q.topic for q in req.queues}:
            tags, sql = req.filters.get(topic, ("*", ""))
            try:
                if self.access is not None:
                    self.access.check_topic(topic, "subscribe")
                try:
                    hashes = parse_tag_expression(tags).hashes
                except BadTagExpression as err:
                    raise BadTagExpressionError(str(err)) from err
                found[topic] = (hashes, selector(sql_filter(sql)) if sql else None)
            except GmsError as err:
                found[topic] = err
        return found

    def _read(self, req: FetchRequest, queue: QueueFetch, queue_filter: _Filter,
              budget: int) -> tuple[FetchedQueue | None, list[memoryview]]:
        """One queue read as PULL reads it: its row (None: nothing new) and records."""
        topic, queue_id, offset = queue
        tags, select = queue_filter
        try:
            limit = self.read_limit((topic, queue_id))
            if offset == EARLIEST:
                offset = self.store.min_offset(topic, queue_id)
            elif offset == LATEST:
                offset = self.store.max_offset(topic, queue_id) if limit is None else limit
            result = consumer_read(self.store, topic, queue_id, offset, req.max_msgs, min(req.max_bytes, budget),
                                   tags, limit, select)
        except GmsError as err:
            return FetchedQueue.failed(queue, err), []
        if result.next_offset == queue.offset and not result.records:
            return None, []
        size = sum(view.nbytes for view in result.records)
        if self.metrics is not None and result.offsets is not None:
            self.metrics.served(topic, queue_id, len(result.offsets), size)
        return FetchedQueue(topic, queue_id, OK, result.next_offset, result.min_offset, result.max_offset, size,
                            damaged=result.damaged), result.records


def _now_ms() -> int:
    return int(time.time() * 1000)
