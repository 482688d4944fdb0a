"""Messages: send, pull, fetch (many queues), a queue's offsets, view by position, find by key, recall a scheduled one.

Bodies stay in the stored record format both ways: a send body is appended as one batch, a pull
answers with zero-copy views of the stored records. The send path is the broker's hottest:
:meth:`MessageService.send` answers a stored batch's :class:`AppendResult` without an await, or
(sync flush, acks=-1) an awaitable of it.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np

from gms.broker.access import BrokerAccess
from gms.broker.config import BrokerConfig
from gms.broker.flush_waiters import FlushWaiters
from gms.broker.ha.replica_manager import LeadershipPendingError, ReplicaManager
from gms.broker.keyindex import TIME_MAX_MS
from gms.broker.long_poll import PullWaiters
from gms.broker.metrics import BrokerMetrics
from gms.broker.queue_claims import QueueClaims
from gms.broker.sql_filters import selector, sql_filter
from gms.broker.store import AppendResult, GetResult, GetStatus, QueueGet, RecordSelector, StoreAPI
from gms.broker.store.producer_state import DuplicateBatch
from gms.broker.timers import TimerService
from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    GmsError,
    MessageIllegalError,
    MessageNotFoundError,
    NotLeaderError,
    OffsetIllegalError,
    ServerError,
    ServiceUnavailableError,
    TopicNotFoundError,
)
from gms.protocol.fetch import EARLIEST, LATEST, FetchRequest, QueueFetch
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING, SEND_BODY_SIZE_MAX_BYTES, Buffer
from gms.record import OFF_PHYS_OFFSET, OFF_QUEUE_ID, Record, decode_record
from gms.record.batch import parse_batch, parse_one
from gms.record.layout import FLAG_SCHEDULED, PRODUCER_FLAGS
from gms.store_errors import UnknownTopic
from gms.tags import BadTagExpression, parse_tag_expression

_RECORD_SIZE = struct.Struct(">i")  # a record's first field: its total size
_I64 = struct.Struct(">q")
_QUEUE_POSITION = struct.Struct(">iq")  # a record's queue_id and queue_offset

PULL_MSGS_MAX = 4096
PULL_BYTES_MAX = 16 << 20
PULL_BYTES_DEFAULT = 4 << 20
ACKS = (0, 1, -1)
ACKS_ERROR = "acks must be 0, 1 or -1, not {}"
FIND_MESSAGES_DEFAULT = 32
# A FETCH's first round admits and reads its queues this many at a time (one store call each),
# and stops where its byte budget runs out.
FETCH_SEGMENT_QUEUES = 256
FIND_MESSAGES_MAX = 1024  # one answer holds at most this many records (each read and checked)

# (topic -> the queues of it a send names, timeout in s): returns once this broker leads them, or at the timeout
Arrival = Callable[[Mapping[str, Collection[int] | None], float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PullArgs:
    """One queue read from ``offset``: at most ``max_msgs`` / ``max_bytes`` (clamped), those
    passing the ``tags`` expression and ``sql`` filter, waiting up to ``poll_ms`` for some. A
    clustering ``member`` of ``group`` claims the queue while it reads it."""

    topic: str
    queue_id: int
    offset: int
    max_msgs: int = 32
    max_bytes: int = PULL_BYTES_DEFAULT
    poll_ms: int = 0
    tags: str = "*"
    sql: str = ""
    group: str = ""
    member: str = ""


class QueueRead(NamedTuple):
    """One queue's part of a fetch: the error of that queue alone (its position unchanged), or
    what was read (``size`` bytes of records). A tuple: a fetch makes one per queue read."""

    queue: QueueFetch
    error: GmsError | None
    result: GetResult | None = None
    size: int = 0


# (tag hashes or None, SQL selector or None) of a topic.
_Filter = tuple[frozenset[int] | None, RecordSelector | None]


def check_acks(acks: int) -> int:
    if acks not in ACKS:
        raise BadRequestError(ACKS_ERROR.format(acks))
    return acks


class MessageService:
    def __init__(self, config: BrokerConfig, store: StoreAPI, waiters: PullWaiters, claims: QueueClaims,
                 address: str, access: BrokerAccess | None = None, metrics: BrokerMetrics | None = None) -> None:
        """``access``: who may publish to and read which topic (None: authentication is off);
        ``metrics``: counts what is stored and served; ``address``: the broker's advertised one."""
        self.metrics = metrics
        self.config = config
        self.access = access
        self.store = store
        self.waiters = waiters
        # Cluster mode: who leads which queue, high watermarks, acks=-1 (None when standalone).
        self.replicas: ReplicaManager | None = None
        self.timers: TimerService | None = None  # scheduled messages (set by the server)
        self.claims = claims  # which member of a group reads each queue (clustering pulls)
        # Cluster mode: waits until a topic the cluster just created or moved here is taken
        # (TopicService.arrival with led_here; set by the server).
        self.arrival: Arrival | None = None
        self.address = address
        self._flush_waiters = (FlushWaiters(store, config.send_timeout_ms)
                               if store.config.flush_mode == "sync" else None)

    # -- send -----------------------------------------------------------------------

    def send(self, body: Buffer, acks: int, started: float) -> AppendResult | Awaitable[AppendResult]:
        """A producer's batch (checked: acks, size), stored as :meth:`store_records` stores it."""
        if acks not in ACKS:  # check_acks, inline: the hot path
            raise BadRequestError(ACKS_ERROR.format(acks))
        if not body:
            raise MessageIllegalError("a send request needs at least one record in its body")
        if len(body) > SEND_BODY_SIZE_MAX_BYTES and _RECORD_SIZE.unpack_from(body)[0] != len(body):
            raise MessageIllegalError(
                f"a send request of {len(body)} bytes holds several records and exceeds the limit of "
                f"{SEND_BODY_SIZE_MAX_BYTES} bytes (SEND_BODY_SIZE_MAX_BYTES): nothing was stored; "
                "split the batch")
        return self.store_records(body, acks, started)

    def store_records(self, body: Buffer, acks: int, started: float, *, allowed_flags: int = PRODUCER_FLAGS,
                      taken: bool = False) -> AppendResult | Awaitable[AppendResult]:
        """Append ``body`` and answer the records' positions, at once or (sync flush, acks=-1)
        once flushed and replicated. ``allowed_flags``: what the records may carry (the broker's
        own records, such as a transaction's copies, more than producers'). ``started``: when the
        request came (perf_counter), for the metrics. ``taken``: refused for a queue not led here
        already once, and its topics waited for: not waited for again."""
        replicas = self.replicas
        ends = None
        may_publish = self.access.check_topics("publish") if self.access is not None else None
        if replicas is None:
            result = self._append(body, may_publish, allowed_flags)
            self.waiters.notify(result.touched_queues)  # replicated queues wake pulls on HW moves
        else:
            def admit(queues: list[tuple[str, int]]) -> None:
                if may_publish is not None:
                    may_publish(queues)
                replicas.check_produce(queues, acks)
            try:
                result = self._append(body, admit, allowed_flags)
            except LeadershipPendingError as pending:
                return self._store_when_led(body, acks, started, allowed_flags, pending)
            except (NotLeaderError, TopicNotFoundError):
                if taken or self.arrival is None:
                    raise
                return self._store_when_taken(body, acks, started, allowed_flags)
            if acks == -1:
                ends = dict(zip(result.touched_queues, result.queue_ends, strict=True))
            replicas.on_appended(result.touched_queues, result.queue_ends)
        if self.metrics is not None:
            self.metrics.stored(result)
        wait_flush = self._flush_waiters is not None and acks != 0
        if wait_flush or ends is not None:
            return self._send_waits(len(body), result, wait_flush, ends, acks, started)
        if self.metrics is not None:
            self.metrics.acked(acks, time.perf_counter() - started)
        return result

    async def stored(self, body: Buffer, acks: int, *, allowed_flags: int = PRODUCER_FLAGS) -> AppendResult:
        """:meth:`store_records` for callers off the hot path: the result once it is acknowledged."""
        return await self._acknowledged(body, check_acks(acks), time.perf_counter(), allowed_flags)

    async def _store_when_led(self, body: Buffer, acks: int, started: float, allowed_flags: int,
                              pending: LeadershipPendingError) -> AppendResult:
        """Store the send once this broker, just made the leader of a queue it names, has its new
        epoch on disk (a moment; bounded by the send timeout): the send is not refused for it."""
        await self.replicas.wait_epoch_saved(pending, self.config.send_timeout_ms / 1000)  # type: ignore[union-attr]
        return await self._acknowledged(body, acks, started, allowed_flags)

    async def _store_when_taken(self, body: Buffer, acks: int, started: float, allowed_flags: int) -> AppendResult:
        """Store a send refused for a queue this broker does not lead, once each topic it names
        has arrived (TopicService.arrival: created a moment ago, or its leadership just moved
        here, and this broker is still taking it; bounded by the send timeout), or refuse it
        again: the send is not refused while the assignment is being applied (sends right after
        a burst of creations outran a producer's retries)."""
        arrival = cast(Arrival, self.arrival)
        parsed = parse_batch(memoryview(body).cast("B"), MESSAGE_SIZE_BYTES_MAX_CEILING, False, verify_crc=False)
        timeout_s = self.config.send_timeout_ms / 1000
        queue_ids = parsed.headers["queue_id"]
        await arrival({topic: set(np.unique(queue_ids[parsed.topic_index == i]).tolist())
                       for i, topic in enumerate(parsed.topics)}, timeout_s)
        return await self._acknowledged(body, acks, started, allowed_flags, taken=True)

    async def _acknowledged(self, body: Buffer, acks: int, started: float, allowed_flags: int,
                            taken: bool = False) -> AppendResult:
        """:meth:`store_records`' result once it is acknowledged (flushed, replicated)."""
        result = self.store_records(body, acks, started, allowed_flags=allowed_flags, taken=taken)
        return result if isinstance(result, AppendResult) else await result

    async def _send_waits(self, size: int, result: AppendResult, wait_flush: bool,
                          ends: dict[tuple[str, int], int] | None, acks: int, started: float) -> AppendResult:
        metrics = self.metrics
        if metrics is not None:
            metrics.waiting_bytes += size
        try:
            if wait_flush:
                await self._flush_waiters.wait(result.end_phys_offset)  # type: ignore[union-attr]
            if ends is not None:
                await self.replicas.wait_replicated(ends, self.config.send_timeout_ms)  # type: ignore[union-attr]
        finally:
            if metrics is not None:
                metrics.waiting_bytes -= size
        if metrics is not None:
            metrics.acked(acks, time.perf_counter() - started)
        return result

    def _append(self, body: Buffer, admit: Callable[[list[tuple[str, int]]], None] | None = None,
                allowed_flags: int = PRODUCER_FLAGS) -> AppendResult:
        try:
            return self.store.append(body, admit, allowed_flags=allowed_flags)
        except DuplicateBatch as duplicate:  # an idempotent producer's retry: answered with what is stored
            if duplicate.stored < duplicate.count:
                self._append_rest(body, duplicate, admit)
            return self.store.batch_result(duplicate.key, duplicate.base_offset, duplicate.count)
        except UnknownTopic as err:
            if not self.config.auto_create_topics or self.replicas is not None:
                raise  # in a cluster, topics come from the nameservers
            self.store.create_topic(err.topic, self.config.default_queue_count)
            return self.store.append(body, admit, allowed_flags=allowed_flags)

    def _append_rest(self, body: Buffer, duplicate: DuplicateBatch,
                     admit: Callable[[list[tuple[str, int]]], None] | None) -> None:
        """Store the records of a batch its queue holds only the first ``stored`` of (this replica
        had fetched part of it when it came to lead): the batch ends up stored once, whole."""
        view = memoryview(body)
        start = 0
        for _ in range(duplicate.stored):
            start += _RECORD_SIZE.unpack_from(view, start)[0]
        rest = self.store.append(view[start:], admit)
        if int(rest.queue_offsets[0]) != duplicate.base_offset + duplicate.stored:
            raise ServerError(f"{duplicate.key[0]}/{duplicate.key[1]}: the rest of a partly stored batch landed at "
                              f"{int(rest.queue_offsets[0])}, not {duplicate.base_offset + duplicate.stored}")

    # -- pull -----------------------------------------------------------------------

    async def pull(self, args: PullArgs) -> GetResult:
        """Records of one queue (:class:`PullArgs`), waiting for some up to ``poll_ms``: FOUND,
        or what the last look found (OFFSET_TOO_SMALL at once). An offset past the end raises
        OffsetIllegalError."""
        topic, queue_id, offset = args.topic, args.queue_id, args.offset
        max_msgs = min(max(args.max_msgs, 1), PULL_MSGS_MAX)
        max_bytes = min(max(args.max_bytes, 1), PULL_BYTES_MAX)
        poll_ms = min(max(args.poll_ms, 0), self.config.long_poll_max_ms)
        tag_hashes = tag_filter(args.tags)
        select = selector(sql_filter(args.sql)) if args.sql else None
        group, member = args.group, args.member
        if group and self.metrics is not None:
            self.metrics.subscriptions[group, topic] = tag_hashes
        if group and member:  # QueueHeldError while another member of the group still reads it
            self.claims.claim(group, member, topic, queue_id, _now_ms(), busy_ms=poll_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        replicas = self.replicas
        while True:
            limit = None if replicas is None else replicas.read_limit((topic, queue_id))
            result = consumer_read(self.store, topic, queue_id, offset, max_msgs, max_bytes, tag_hashes, limit,
                                   select)
            status = result.status
            if status is GetStatus.NO_MATCHED_MESSAGE and result.next_offset < result.max_offset:
                offset = result.next_offset  # keep scanning, but let other requests run
                await asyncio.sleep(0)
                continue
            remaining_s = deadline - loop.time()
            if status in (GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL) or remaining_s <= 0:
                if group and member:
                    self.claims.refresh(group, member, topic, queue_id, _now_ms())
                if self.metrics is not None and result.offsets is not None:
                    self.metrics.served(topic, queue_id, len(result.offsets), sum(v.nbytes for v in result.records))
                return result
            offset = result.next_offset
            if not await self.waiters.wait((topic, queue_id), remaining_s):
                deadline = loop.time()  # timed out or stopping: answer after one last look

    # -- fetch: many queues in one long poll ----------------------------------------------

    async def fetch(self, req: FetchRequest) -> list[QueueRead]:
        """Many queues of this broker in one long poll (Kafka's Fetch). Each queue is read as
        :meth:`pull` reads it and fails alone (its :class:`QueueRead` carries the error); the
        answer comes as soon as any queue has records (or moved its position), else after
        ``poll_ms``. While it waits, one waiter is parked for all its queues, and a wake-up reads
        again only the queues it names."""
        filters = self._fetch_filters(req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.poll_ms / 1000
        reads: list[QueueRead] = []
        live: dict[tuple[str, int], QueueFetch] = {}  # the queues read (again) when woken
        budget = req.max_total_bytes
        # The first round takes the queues a segment at a time, each admitted (filter, claim) as
        # it is reached: those past where the byte budget runs out cost nothing but their decoding
        # (the consumer asks for them again), not a claim, an index read and a place in the read.
        for start in range(0, len(req.queues), FETCH_SEGMENT_QUEUES):
            admitted = self._fetch_admit(req, req.queues[start:start + FETCH_SEGMENT_QUEUES], filters, reads, live)
            budget = self._fetch_round(req, admitted, filters, budget, reads, live)
            if budget <= 0:
                break
        while True:
            remaining_s = deadline - loop.time()
            if reads or not live or remaining_s <= 0:
                break
            woken = await self.waiters.wait_any(live, remaining_s)
            if not woken:  # timed out or stopping: answer after one last look at every queue
                deadline = loop.time()
                to_read = list(live.values())
            else:
                to_read = [q for key in woken if (q := live.get(key)) is not None]
            budget = self._fetch_round(req, to_read, filters, budget, reads, live)
        if req.member:
            now_ms = _now_ms()
            self.claims.refresh_many(req.group, req.member,
                                     [read.queue[:2] for read in reads if read.error is None], now_ms)
        if self.metrics is not None and req.group:
            for topic, found in filters.items():
                if not isinstance(found, GmsError):
                    self.metrics.subscriptions[req.group, topic] = found[0]
        return reads

    def _fetch_admit(self, req: FetchRequest, queues: list[QueueFetch], filters: dict[str, _Filter | GmsError],
                     reads: list[QueueRead], live: dict[tuple[str, int], QueueFetch]) -> list[QueueFetch]:
        """Those of ``queues`` this fetch may read, now in ``live``: the others (their topic's
        filter failed, another member of the group holds them) go to ``reads`` with their error."""
        admitted = []
        now_ms = _now_ms()
        for queue in queues:
            found = filters[queue.topic]
            if isinstance(found, GmsError):
                reads.append(QueueRead(queue, found))
                continue
            if req.member:
                try:  # QueueHeldError while another member of the group still reads it
                    self.claims.claim(req.group, req.member, queue.topic, queue.queue_id, now_ms,
                                      busy_ms=req.poll_ms)
                except GmsError as err:
                    reads.append(QueueRead(queue, err))
                    continue
            live[queue.topic, queue.queue_id] = queue
            admitted.append(queue)
        return admitted

    def _fetch_filters(self, req: FetchRequest) -> dict[str, _Filter | GmsError]:
        """Each topic's filter, or the error all its queues answer (a bad expression, no access)."""
        found: dict[str, _Filter | GmsError] = {}
        for topic in {q.topic for q in req.queues}:
            tags, sql = req.filters.get(topic, ("*", ""))
            try:
                if self.access is not None:
                    self.access.check_topic(topic, "subscribe")
                found[topic] = (tag_filter(tags), selector(sql_filter(sql)) if sql else None)
            except GmsError as err:
                found[topic] = err
        return found

    def _fetch_round(self, req: FetchRequest, queues: list[QueueFetch], filters: dict[str, _Filter | GmsError],
                     budget: int, reads: list[QueueRead], live: dict[tuple[str, int], QueueFetch]) -> int:
        """Read ``queues`` in order while ``budget`` (bytes) remains, as PULL reads each: those
        read (a record, a new position or an error) go to ``reads``, and leave ``live`` unless they
        are where they were. Runs of queues without filters are read in one store call (a group of
        many topics reads a few records of each). Returns the budget left."""
        batch: list[tuple[QueueFetch, QueueGet]] = []
        for queue in queues:
            tags, select = cast(_Filter, filters[queue.topic])  # live queues' topics have filters
            try:
                offset, limit = self._fetch_start(queue)
            except GmsError as err:
                budget = self._fetch_batch(req, batch, budget, reads, live)
                if budget <= 0:
                    return budget
                budget = self._fetched(QueueRead(queue, err), budget, reads, live)
                continue
            if tags is None and select is None:
                batch.append((queue, QueueGet(queue.topic, queue.queue_id, offset, limit)))
                continue
            budget = self._fetch_batch(req, batch, budget, reads, live)
            if budget <= 0:
                return budget
            try:
                result = consumer_read(self.store, queue.topic, queue.queue_id, offset, req.max_msgs,
                                       min(req.max_bytes, budget), tags, limit, select)
            except GmsError as err:
                budget = self._fetched(QueueRead(queue, err), budget, reads, live)
                continue
            budget = self._fetched_result(queue, result, budget, reads, live)
        return self._fetch_batch(req, batch, budget, reads, live)

    def _fetch_batch(self, req: FetchRequest, batch: list[tuple[QueueFetch, QueueGet]], budget: int,
                     reads: list[QueueRead], live: dict[tuple[str, int], QueueFetch]) -> int:
        """Read the queues of ``batch`` (then emptied) in one store call; the budget left."""
        if not batch or budget <= 0:
            return budget
        found = self.store.get_many([get for _, get in batch], req.max_msgs, req.max_bytes, budget)
        for (queue, get), result in zip(batch, found, strict=False):
            if isinstance(result, GmsError):
                budget = self._fetched(QueueRead(queue, result), budget, reads, live)
            elif result.status is GetStatus.OFFSET_OVERFLOW:
                budget = self._fetched(QueueRead(queue, offset_overflow(get.topic, get.queue_id, get.offset, result)),
                                       budget, reads, live)
            else:
                budget = self._fetched_result(queue, result, budget, reads, live)
        batch.clear()
        return budget

    def _fetch_start(self, queue: QueueFetch) -> tuple[int, int | None]:
        """Where a fetch reads ``queue`` from (EARLIEST, LATEST resolved) and up to (a replicated
        queue's high watermark; None: its end)."""
        topic, queue_id, offset = queue
        limit = None if self.replicas is None else self.replicas.read_limit((topic, queue_id))
        if offset == EARLIEST:
            offset = self.store.min_offset(topic, queue_id)
        elif offset == LATEST:
            offset = self.store.max_offset(topic, queue_id) if limit is None else limit
        return offset, limit

    def _fetched_result(self, queue: QueueFetch, result: GetResult, budget: int, reads: list[QueueRead],
                        live: dict[tuple[str, int], QueueFetch]) -> int:
        """A queue's read: answered unless it found nothing new (then it waits); the budget left."""
        if result.next_offset == queue.offset and not result.records:
            return budget
        records = result.records
        size = records[0].nbytes if len(records) == 1 else sum(view.nbytes for view in records)
        if self.metrics is not None and result.offsets is not None:
            self.metrics.served(queue.topic, queue.queue_id, len(result.offsets), size)
        return self._fetched(QueueRead(queue, None, result, size), budget, reads, live)

    @staticmethod
    def _fetched(read: QueueRead, budget: int, reads: list[QueueRead], live: dict[tuple[str, int], QueueFetch]
                 ) -> int:
        reads.append(read)
        if read.error is not None or read.result.next_offset != read.queue.offset:  # type: ignore[union-attr]
            del live[read.queue.topic, read.queue.queue_id]
        return budget - read.size

    # -- a queue's offsets ------------------------------------------------------------

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.store.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The end consumers see: a replicated queue's high watermark."""
        if self.replicas is not None:
            return self.replicas.read_limit((topic, queue_id))
        return self.store.max_offset(topic, queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    # -- by position, by key, recall ---------------------------------------------------

    def cancel_scheduled(self, phys_offset: int) -> Record:
        """Recall the scheduled message at ``phys_offset`` before its time (RocketMQ 5's recall):
        its header."""
        record = decode_record(self.store.read_at(phys_offset), verify_crc=True)
        if self.access is not None:
            self.access.check_topic(record.topic, "publish")
        if not record.flags & FLAG_SCHEDULED:
            raise BadRequestError(f"{record.topic}/{record.queue_id}@{record.queue_offset} is not a scheduled message")
        if self.timers is None:
            raise ServiceUnavailableError("the broker is starting: retry")
        self.timers.cancel(record.topic, record.queue_id, record.queue_offset)
        return record

    def entry(self, topic: str, queue_id: int, offset: int) -> memoryview | None:
        """The record at ``offset`` of a queue (None: the queue holds none there now)."""
        found = self.store.get(topic, queue_id, offset, max_msgs=1)
        if found.status is not GetStatus.FOUND or found.offsets is None or found.offsets[0] != offset:
            return None
        return found.records[0]

    def view(self, phys_offset: int, origin: str = "") -> Buffer:
        """The record at ``phys_offset``; with ``origin`` (another broker's address), this store's copy
        of the record that broker stored there (a message id resolved on a replica), with the
        origin's offset in its envelope so that it carries the id asked for."""
        record: Buffer
        if origin and origin != self.address:
            found = self.store.find_replicated(origin, phys_offset)
            if found is None:
                raise MessageNotFoundError(f"no copy here of the message {origin} stored at {phys_offset}")
            record = bytearray(found)
            _I64.pack_into(record, OFF_PHYS_OFFSET, phys_offset)
        else:
            record = self.store.read_at(phys_offset)
        if self.access is not None:
            topic = parse_one(memoryview(record), len(record), verify_tag_hash=False).topic
            self.access.check_topic(topic, "subscribe")
        return record

    def find_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = TIME_MAX_MS,
                    limit: int = FIND_MESSAGES_DEFAULT) -> list[memoryview]:
        """The newest records of ``topic`` carrying ``key`` stored in [begin_ms, end_ms] (at most
        ``limit``), those consumers may read."""
        if not 1 <= limit <= FIND_MESSAGES_MAX:
            raise BadRequestError(f"max_messages must be 1..{FIND_MESSAGES_MAX}, not {limit}")
        try:
            found = self.store.find_by_key(topic, key, begin_ms, end_ms, limit)
        except ValueError as err:  # a key no record can carry (empty, or holding the separator)
            raise BadRequestError(str(err)) from err
        replicas = self.replicas
        if replicas is not None:  # what consumers may read: not past a led queue's high watermark
            found = [record for record in found if _committed(replicas, topic, record)]
        return found


def tag_filter(expression: str) -> frozenset[int] | None:
    """The tag hashes a tag expression passes (None: all)."""
    try:
        return parse_tag_expression(expression).hashes
    except BadTagExpression as err:
        raise BadTagExpressionError(str(err)) from err


def consumer_read(store: StoreAPI, topic: str, queue_id: int, offset: int, max_msgs: int, max_bytes: int,
                  tag_hashes: frozenset[int] | None, limit: int | None,
                  select: RecordSelector | None) -> GetResult:
    """What a consumer's read (PULL, FETCH) of a queue serves from ``offset``: up to ``limit``
    (a replicated queue's high watermark), filtered; an offset past the end is an error."""
    result = store.get(topic, queue_id, offset, max_msgs, max_bytes, tag_hashes, limit, coalesce=True, select=select)
    if result.status is GetStatus.OFFSET_OVERFLOW:
        raise offset_overflow(topic, queue_id, offset, result)
    return result


def offset_overflow(topic: str, queue_id: int, offset: int, result: GetResult) -> OffsetIllegalError:
    """The error of a read from ``offset``, past the end of the queue (``result``: OFFSET_OVERFLOW)."""
    return OffsetIllegalError(
        f"offset {offset} is beyond the end of {topic}/{queue_id} (valid: {result.min_offset}..{result.max_offset})",
        fields={"min_offset": result.min_offset, "max_offset": result.max_offset})


def _committed(replicas: ReplicaManager, topic: str, record: memoryview) -> bool:
    """The record lies below its queue's high watermark, or this broker does not lead the queue
    (the Admin client keeps the answers of each queue's leader only)."""
    queue_id, offset = _QUEUE_POSITION.unpack_from(record, OFF_QUEUE_ID)
    try:
        return bool(offset < replicas.read_limit((topic, queue_id)))
    except NotLeaderError:
        return True


def _now_ms() -> int:
    return int(time.time() * 1000)
