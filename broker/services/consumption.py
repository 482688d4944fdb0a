"""Consumption by pop: pop, acknowledge, change a delivery's invisible duration (broker.pop keeps
the state of every group on every queue).

A pop hands out records like a pull (zero-copy views of the stored records), first those handed
out again — the ones whose attempts ran out (``exhausted``, for the consumer to move to the
dead-letter queue) then the others — then fresh ones (attempt 1).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gms.broker.long_poll import PullWaiters
from gms.broker.metrics import BrokerMetrics
from gms.broker.pop import INVISIBLE_MS_MAX, GroupQueue, PopQueue, PopService, QueueKey, StartFrom
from gms.broker.services.groups import check_group_name
from gms.broker.sql_filters import selector, sql_filter
from gms.broker.store import GetStatus
from gms.errors import BadRequestError, BadTagExpressionError, NotLeaderError, ReceiptHandleExpiredError
from gms.record import exact_tag_mask, read_field_offsets, record_views, scan_records
from gms.sql92 import SqlFilter
from gms.store_errors import StoreError
from gms.tags import BadTagExpression, TagFilter, parse_tag_expression

log = logging.getLogger(__name__)

POP_MSGS_MAX = 4096
POP_BYTES_MAX = 16 << 20
POP_BYTES_DEFAULT = 4 << 20


@dataclass(frozen=True, slots=True)
class PopArgs:
    """A pop of ``group`` from the queues of ``topic`` led here: at most ``max_msgs`` /
    ``max_bytes`` (clamped) passing the ``tags`` expression and ``sql`` filter, invisible for
    ``invisible_ms``, waiting up to ``poll_ms`` for some. ``max_attempts`` (0: no limit): a
    record due for a later attempt comes back exhausted; ``fifo``: a queue hands out nothing new
    while anything of it is in flight; ``start``: where a group without a committed offset starts."""

    group: str
    topic: str
    invisible_ms: int
    max_msgs: int = 32
    max_bytes: int = POP_BYTES_DEFAULT
    poll_ms: int = 0
    max_attempts: int = 0
    fifo: bool = False
    start: StartFrom = "last"
    tags: str = "*"
    sql: str = ""


class Popped:
    """What one pop hands out, in answer order: exhausted, handed out again (each with its
    delivery attempt), fresh (attempt 1, several records per view); ``visible_at``: when the
    deliveries become visible again (epoch ms)."""

    __slots__ = ("again", "again_attempts", "bytes", "count", "exhausted", "exhausted_attempts", "fresh", "passed",
                 "visible_at")

    def __init__(self) -> None:
        self.exhausted: list[memoryview] = []
        self.exhausted_attempts: list[int] = []
        self.again: list[memoryview] = []
        self.again_attempts: list[int] = []
        self.fresh: list[memoryview] = []
        self.count = 0
        self.bytes = 0
        self.passed = False  # messages the filters left out were passed: more may follow at once
        self.visible_at = 0


class ConsumptionService:
    """``queues_led(topic)``: the topic's queues this broker leads (TopicNotFoundError: no such
    topic here); ``read_limit(key)``: a replicated queue's high watermark (None: standalone)."""

    def __init__(self, state: PopService, waiters: PullWaiters, long_poll_max_ms: int, *,
                 queues_led: Callable[[str], list[int]], read_limit: Callable[[QueueKey], int | None],
                 metrics: BrokerMetrics | None = None) -> None:
        self.state = state
        self.store = state.store
        self.waiters = waiters
        self.long_poll_max_ms = long_poll_max_ms
        self.queues_led = queues_led
        self.read_limit = read_limit
        self.metrics = metrics
        self._turns: dict[tuple[str, str], int] = {}  # which queue a group's next pop starts at

    # -- pop ------------------------------------------------------------------------------------

    async def pop(self, args: PopArgs) -> Popped:
        group, topic = check_group_name(args.group), args.topic
        max_msgs = min(max(args.max_msgs, 1), POP_MSGS_MAX)
        max_bytes = min(max(args.max_bytes, 1), POP_BYTES_MAX)
        invisible_ms = check_invisible_ms(args.invisible_ms, minimum=1)
        poll_ms = min(max(args.poll_ms, 0), self.long_poll_max_ms)
        max_attempts = max(args.max_attempts, 0)
        start = check_start(args.start)
        try:
            tags = parse_tag_expression(args.tags)
        except BadTagExpression as err:
            raise BadTagExpressionError(str(err)) from err
        sql = sql_filter(args.sql) if args.sql else None
        queue_ids = self.queues_led(topic)
        if not queue_ids:
            raise NotLeaderError(f"this broker leads no queue of {topic!r} now: refresh the route")
        if self.metrics is not None:
            self.metrics.subscriptions[group, topic] = tags.hashes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        while True:
            now = _now_ms()
            taken = self._take(group, topic, queue_ids, (tags, sql), start, now, invisible_ms, max_msgs, max_bytes,
                               max_attempts, args.fifo)
            remaining_s = deadline - loop.time()
            if not taken.count and taken.passed and remaining_s > 0:
                await asyncio.sleep(0)  # scan on past what the filters left out, letting others run
                continue
            if taken.count or remaining_s <= 0:
                if self.metrics is not None:
                    self.metrics.served(topic, None, taken.count, taken.bytes)
                taken.visible_at = now + invisible_ms
                return taken
            visible = [at for q in queue_ids if (at := self.state.queue(group, topic, q, start).next_visible())]
            wait_s = min(remaining_s, (min(visible) - now) / 1000) if visible else remaining_s
            woken = await self.waiters.wait_any([(topic, q) for q in queue_ids], max(wait_s, 0.001))
            if not woken and self.waiters.closed:
                deadline = loop.time()  # stopping: answer after one last look
            queue_ids = [q for q in queue_ids if self.state.serves((topic, q))]
            if not queue_ids:
                raise NotLeaderError(f"this broker no longer leads a queue of {topic!r}: refresh the route")

    def _take(self, group: str, topic: str, queue_ids: list[int], filters: tuple[TagFilter, SqlFilter | None],
              start: StartFrom, now: int, invisible_ms: int, max_msgs: int, max_bytes: int, max_attempts: int,
              fifo: bool) -> Popped:
        """Hand out what is due again and fresh messages, queue after queue. ``fifo``: a queue
        hands out nothing new while anything of it is in flight (RocketMQ 5's FIFO pop: a
        queue's messages, and so each message group's, are processed one batch at a time, in
        order), and what comes again comes in offset order."""
        taken = Popped()
        visible_at = now + invisible_ms
        turn = self._turns.get((group, topic), 0)
        self._turns[group, topic] = turn + 1
        touched: list[GroupQueue] = []
        for i in range(len(queue_ids)):
            if taken.count >= max_msgs or taken.bytes >= max_bytes:
                break
            queue_id = queue_ids[(turn + i) % len(queue_ids)]
            state = self.state.queue(group, topic, queue_id, start)
            before = (state.next, len(state.inflight))
            due = (state.due_in_order if fifo else state.due)(now, max_msgs - taken.count)
            again = self._hand_out_again(state, topic, queue_id, due, visible_at, max_attempts, taken)
            if not (fifo and state.inflight):
                self._hand_out_fresh(state, topic, queue_id, filters, visible_at, max_msgs, max_bytes, taken)
            if again or (state.next, len(state.inflight)) != before:
                touched.append((group, topic, queue_id))
        self.state.commit(touched)
        return taken

    def _hand_out_again(self, state: PopQueue, topic: str, queue_id: int, due: list[int], visible_at: int,
                        max_attempts: int, taken: Popped) -> bool:
        """``due`` messages (their invisible duration ended) go out again (attempt + 1); those past
        ``max_attempts`` as exhausted. Ones retention deleted or found damaged are dropped."""
        if not due:
            return False
        served, records, gone = [], [], []
        for offset in due:
            try:
                records.append(self.store.read_entry(topic, queue_id, offset))
                served.append(offset)
            except (StoreError, ValueError) as err:
                log.warning("%s/%d@%d: cannot hand a popped message out again (%s); dropped", topic, queue_id,
                            offset, err)
                gone.append(offset)
        state.drop(gone)
        for record, attempt in zip(records, state.redeliver(served, visible_at), strict=True):
            if max_attempts and attempt > max_attempts:
                taken.exhausted.append(record)
                taken.exhausted_attempts.append(attempt)
            else:
                taken.again.append(record)
                taken.again_attempts.append(attempt)
            taken.bytes += record.nbytes
        taken.count += len(records)
        return True

    def _hand_out_fresh(self, state: PopQueue, topic: str, queue_id: int,
                        filters: tuple[TagFilter, SqlFilter | None], visible_at: int, max_msgs: int, max_bytes: int,
                        taken: Popped) -> None:
        """Messages from ``next`` on go out for the first time (as many as the state has room for);
        those the filters leave out are passed."""
        tags, sql = filters
        want = min(state.room(), max_msgs - taken.count)
        if want <= 0 or taken.bytes >= max_bytes:
            return
        result = self.store.get(topic, queue_id, state.next, want, max_bytes - taken.bytes, tags.hashes,
                                self.read_limit((topic, queue_id)), coalesce=True,
                                select=None if sql is None else selector(sql))
        if result.status is GetStatus.OFFSET_OVERFLOW:  # the queue was cut back below our position
            state.drop([o for o in state.inflight if o >= result.max_offset])
            state.next = result.max_offset
            return
        if result.status is GetStatus.OFFSET_TOO_SMALL:  # retention passed our position
            state.drop([o for o in state.inflight if o < result.min_offset])
            state.next = max(state.next, result.next_offset)
            return
        if result.damaged:
            log.error("%s/%d: damaged record(s) at offsets %s passed by pop consumption", topic, queue_id,
                      [d[0] for d in result.damaged])
        views, offsets = result.records, result.offsets
        if views and tags.tags is not None:
            views, offsets = _exact_tags(views, tags.tags)
        handed = offsets.tolist() if offsets is not None and len(views) else []
        taken.passed = taken.passed or (not handed and result.next_offset > state.next)
        state.hand_out(handed, visible_at, result.next_offset)
        taken.fresh += views
        taken.count += len(handed)
        taken.bytes += sum(v.nbytes for v in views)

    # -- ack and invisibility ---------------------------------------------------------------------

    def ack(self, group: str, topic: str, queue_ids: np.ndarray, offsets: np.ndarray,
            attempts: np.ndarray) -> list[tuple[int, int]]:
        """Acknowledge deliveries (one per index of the three arrays); answers the (queue id,
        offset) of those whose handle no longer holds."""
        check_group_name(group)
        if not len(queue_ids) == len(offsets) == len(attempts):
            raise BadRequestError("queue_ids, offsets and attempts must have the same length")
        states = self._led_states(group, topic, np.unique(queue_ids).tolist())
        expired: list[tuple[int, int]] = []
        for queue_id, state in states.items():
            mine = queue_ids == queue_id
            stale = (np.ones(int(mine.sum()), bool) if state is None
                     else state.ack(offsets[mine].astype(np.int64), attempts[mine].astype(np.int64)))
            if stale.any():
                expired += [(queue_id, offset) for offset in offsets[mine][stale].tolist()]
        self.state.commit((group, topic, q) for q, s in states.items() if s is not None)
        return expired

    def change_invisible(self, group: str, topic: str, queue_id: int, offset: int, attempt: int,
                         invisible_ms: int) -> int:
        """The delivery (its receipt: queue, offset, attempt) becomes visible again
        ``invisible_ms`` from now (that time, epoch ms); ReceiptHandleExpiredError if it is no
        longer in flight."""
        check_group_name(group)
        visible_at = _now_ms() + check_invisible_ms(invisible_ms, minimum=0)
        state = self._led_states(group, topic, [queue_id])[queue_id]
        if state is None or not state.change_invisible(offset, attempt, visible_at):
            raise ReceiptHandleExpiredError(
                f"{topic}/{queue_id}@{offset} attempt {attempt} of group {group!r} is not in flight here: acknowledged,"
                " handed out again, or never popped")
        self.state.commit([(group, topic, queue_id)])
        return visible_at

    def _led_states(self, group: str, topic: str, queue_ids: Iterable[int]) -> dict[int, PopQueue | None]:
        """The group's pop state on each queue (None: it never popped there); NotLeaderError if
        this broker does not lead one of them (the client re-routes and retries)."""
        states: dict[int, PopQueue | None] = {}
        for queue_id in queue_ids:
            if not self.state.serves((topic, queue_id)):
                raise NotLeaderError(f"this broker does not lead {topic}/{queue_id}: refresh the route",
                                     fields={"topic": topic, "queue_id": queue_id})
            states[queue_id] = self.state.existing(group, topic, queue_id)
        return states


def check_invisible_ms(invisible_ms: int, *, minimum: int) -> int:
    if not minimum <= invisible_ms <= INVISIBLE_MS_MAX:
        raise BadRequestError(f"invisible_ms must be {minimum}..{INVISIBLE_MS_MAX} (12 h), not {invisible_ms}")
    return invisible_ms


def check_start(value: Any) -> StartFrom:
    if value in ("first", "last", "whole"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise BadRequestError(f"start must be 'first', 'last', 'whole' or a timestamp in ms, not {value!r}")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _exact_tags(views: list[memoryview], tags: frozenset[str]) -> tuple[list[memoryview], Any]:
    """The records among ``views`` whose tag is exactly one of ``tags`` (a tag-hash match may be
    a collision), and their queue offsets."""
    kept: list[memoryview] = []
    offsets = []
    for view in views:
        scan = scan_records(view, verify_crc=False)
        fields = read_field_offsets(view, scan.starts)
        keep = exact_tag_mask(view, fields, tags)
        queue_offsets = fields.headers["queue_offset"]
        if keep.all():
            kept.append(view)
            offsets.append(queue_offsets)
        elif keep.any():
            kept += record_views(view, scan.starts[keep], fields.headers["total_size"][keep])
            offsets.append(queue_offsets[keep])
    return kept, (np.concatenate(offsets) if offsets else np.empty(0, np.int64))

