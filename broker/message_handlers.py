"""Send, pull, offset queries and lookup by id: the broker's data path.

Bodies stay in the stored record format both ways: a send body is appended as
one batch, a pull answers with zero-copy views of the stored records.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

from gms.broker.access import BrokerAccess
from gms.broker.config import BrokerConfig
from gms.broker.flush_waiters import FlushWaiters
from gms.broker.ha.replica_manager import LeadershipPendingError, ReplicaManager
from gms.broker.keyindex import TIME_MAX_MS
from gms.broker.long_poll import PullWaiters
from gms.broker.metrics import BrokerMetrics
from gms.broker.producer_state import DuplicateBatch
from gms.broker.queue_claims import QueueClaims
from gms.broker.sql_filters import selector, sql_filter
from gms.broker.store import AppendResult, GetResult, GetStatus, MessageStore, RecordSelector
from gms.broker.timers import TimerService
from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    MessageIllegalError,
    MessageNotFoundError,
    NotLeaderError,
    OffsetIllegalError,
    ServerError,
    ServiceUnavailableError,
)
from gms.protocol.fields import INT32, OFFSET_ARRAY, QUEUE_ID_ARRAY, field, int_array
from gms.protocol.frame import HEADER_SIZE_MAX_BYTES, SEND_BODY_SIZE_MAX_BYTES, Buffer, Frame, Response
from gms.record import HEADER_SIZE as RECORD_HEADER_SIZE
from gms.record import OFF_PHYS_OFFSET, OFF_QUEUE_ID, decode_record
from gms.record.batch import parse_one
from gms.record.layout import FLAG_SCHEDULED, PRODUCER_FLAGS
from gms.store_errors import UnknownTopic
from gms.tags import BadTagExpression, parse_tag_expression

_RECORD_SIZE = struct.Struct(">i")  # a record's first field: its total size
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

PULL_MSGS_MAX = 4096
PULL_BYTES_MAX = 16 << 20
PULL_BYTES_DEFAULT = 4 << 20
ACKS = (0, 1, -1)


class MessageHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        waiters: PullWaiters,
        claims: QueueClaims,
        advertised_address: str,
        access: BrokerAccess | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        """``access``: who may publish to and read which topic (None: authentication is off);
        ``metrics``: counts what is stored and served."""
        self.metrics = metrics
        self.config = config
        self.access = access
        self.store = store
        self.waiters = waiters
        # Cluster mode: who leads which queue, high watermarks, acks=-1 (None when standalone).
        self.replicas: ReplicaManager | None = None
        self.timers: TimerService | None = None  # scheduled messages (set by the server)
        self.claims = claims  # which member of a group reads each queue (clustering pulls)
        self.advertised_address = advertised_address
        self._flush_waiters = (FlushWaiters(store, config.send_timeout_ms)
                               if store.config.flush_mode == "sync" else None)

    # -- send -----------------------------------------------------------------------

    def send(self, request: Frame) -> Response | Awaitable[Response | None] | None:
        """Store the batch and answer at once, or (sync flush, acks=-1) return what waits for the
        flush and the replicas (the server runs it as a task): a direct handler, see
        :data:`gms.net.server.DirectHandler`."""
        started = time.perf_counter()
        acks = field(request.fields, "acks", INT32, 1)
        if acks not in ACKS:
            raise BadRequestError(f"acks must be 0, 1 or -1, not {acks}")
        body = request.body
        if not body:
            raise MessageIllegalError("a send request needs at least one record in its body")
        if len(body) > SEND_BODY_SIZE_MAX_BYTES and _RECORD_SIZE.unpack_from(body)[0] != len(body):
            raise MessageIllegalError(
                f"a send request of {len(body)} bytes holds several records and exceeds the limit of "
                f"{SEND_BODY_SIZE_MAX_BYTES} bytes (SEND_BODY_SIZE_MAX_BYTES): nothing was stored; "
                "split the batch")
        return self.store_records(request, body, acks, started)

    def store_records(self, request: Frame, body: Buffer, acks: int, started: float, *,
                      allowed_flags: int = PRODUCER_FLAGS) -> Response | Awaitable[Response | None] | None:
        """Append ``body`` as a send does and answer with the records' positions, at once or (sync
        flush, acks=-1) once flushed and replicated. ``allowed_flags``: what the records may carry
        (the broker's own records, such as a transaction's copies, more than producers')."""
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
                return self._store_when_led(request, body, acks, started, allowed_flags, pending)
            if acks == -1:
                ends = {key: self.store.max_offset(*key) for key in result.touched_queues}
            replicas.on_appended(result.touched_queues)
        if self.metrics is not None:
            self.metrics.stored(result)
        wait_flush = self._flush_waiters is not None and acks != 0
        if wait_flush or ends is not None:
            return self._send_waits(request, len(body), result, wait_flush, ends, acks, started)
        if self.metrics is not None:
            self.metrics.acked(acks, time.perf_counter() - started)
        return None if request.is_oneway else self._send_response(result)

    async def _store_when_led(self, request: Frame, body: Buffer, acks: int, started: float, allowed_flags: int,
                              pending: LeadershipPendingError) -> Response | None:
        """Store the send once this broker, just made the leader of a queue it names, has its new
        epoch on disk (a moment; bounded by the send timeout): the send is not refused for it."""
        await self.replicas.wait_epoch_saved(pending, self.config.send_timeout_ms / 1000)  # type: ignore[union-attr]
        response = self.store_records(request, body, acks, started, allowed_flags=allowed_flags)
        return response if response is None or isinstance(response, Response) else await response

    async def _send_waits(self, request: Frame, size: int, result: AppendResult, wait_flush: bool,
                          ends: dict[tuple[str, int], int] | None, acks: int, started: float) -> Response | None:
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
        return None if request.is_oneway else self._send_response(result)

    def _send_response(self, result: AppendResult) -> Response:
        if len(result.queue_ids) == 1:  # a single send: no numpy conversions
            queue_ids = _I32.pack(int(result.queue_ids[0]))
            queue_offsets = _I64.pack(int(result.queue_offsets[0]))
            phys_offsets = _I64.pack(int(result.phys_offsets[0]))
        else:
            queue_ids = int_array(result.queue_ids, QUEUE_ID_ARRAY)
            queue_offsets = int_array(result.queue_offsets, OFFSET_ARRAY)
            phys_offsets = int_array(result.phys_offsets, OFFSET_ARRAY)
        return Response({"queue_ids": queue_ids, "queue_offsets": queue_offsets, "phys_offsets": phys_offsets,
                         "broker": self.advertised_address})

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

    # -- pull -----------------------------------------------------------------------

    async def pull(self, request: Frame) -> Response:
        fields = request.fields
        topic = field(fields, "topic", str)
        queue_id = field(fields, "queue_id", INT32)
        offset = field(fields, "offset", int)
        max_msgs = min(max(field(fields, "max_msgs", INT32, 32), 1), PULL_MSGS_MAX)
        max_bytes = min(max(field(fields, "max_bytes", int, PULL_BYTES_DEFAULT), 1), PULL_BYTES_MAX)
        poll_ms = min(max(field(fields, "poll_ms", int, 0), 0), self.config.long_poll_max_ms)
        try:
            tag_hashes = parse_tag_expression(field(fields, "tags", str, "*")).hashes
        except BadTagExpression as err:
            raise BadTagExpressionError(str(err)) from err
        sql_expression = field(fields, "sql", str, "")
        select = selector(sql_filter(sql_expression)) if sql_expression else None
        group, member = field(fields, "group", str, ""), field(fields, "member", str, "")
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
                # crc_checked: every record in the body passed its CRC check here (the SDK
                # then checks only the framing); damaged ones are listed, not sent.
                answer: dict[str, object] = {
                    "result": status.value, "next_offset": result.next_offset, "min_offset": result.min_offset,
                    "max_offset": result.max_offset, "crc_checked": True}
                if result.damaged:  # left out of the body; the consumer passes them
                    answer["damaged"] = [list(d) for d in result.damaged]
                if self.metrics is not None and result.offsets is not None:
                    self.metrics.served(topic, queue_id, len(result.offsets), sum(v.nbytes for v in result.records))
                return Response(answer, body=result.records)
            offset = result.next_offset
            if not await self.waiters.wait((topic, queue_id), remaining_s):
                deadline = loop.time()  # timed out or stopping: answer after one last look

    # -- offsets and lookups -----------------------------------------------------------

    async def query_min_offset(self, request: Frame) -> Response:
        topic, queue_id = _queue_fields(request)
        return Response({"offset": self.store.min_offset(topic, queue_id)})

    async def query_max_offset(self, request: Frame) -> Response:
        topic, queue_id = _queue_fields(request)
        if self.replicas is not None:  # consumers see offsets below the high watermark only
            return Response({"offset": self.replicas.read_limit((topic, queue_id))})
        return Response({"offset": self.store.max_offset(topic, queue_id)})

    async def query_offset_by_time(self, request: Frame) -> Response:
        topic, queue_id = _queue_fields(request)
        timestamp_ms = field(request.fields, "timestamp_ms", int)
        return Response({"offset": self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)})

    async def cancel_scheduled(self, request: Frame) -> Response:
        """Recall a scheduled message before its time (RocketMQ 5's recall), by its position."""
        record = decode_record(self.store.read_at(field(request.fields, "phys_offset", int)), verify_crc=True)
        if self.access is not None:
            self.access.check_topic(record.topic, "publish")
        if not record.flags & FLAG_SCHEDULED:
            raise BadRequestError(f"{record.topic}/{record.queue_id}@{record.queue_offset} is not a scheduled message")
        if self.timers is None:
            raise ServiceUnavailableError("the broker is starting: retry")
        self.timers.cancel(record.topic, record.queue_id, record.queue_offset)
        return Response({"topic": record.topic, "queue_id": record.queue_id, "queue_offset": record.queue_offset})

    async def view_message(self, request: Frame) -> Response:
        """The record at ``phys_offset``; with ``origin`` (another broker's address), this store's copy
        of the record that broker stored there (a message id resolved on a replica), answered
        with the origin's offset in its envelope so that it carries the id asked for."""
        phys_offset = field(request.fields, "phys_offset", int)
        origin = field(request.fields, "origin", str, "")
        record: Buffer
        if origin and origin != self.advertised_address:
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
        return Response(body=record)

    async def find_by_key(self, request: Frame) -> Response:
        """The newest records of ``topic`` carrying ``key`` stored in [begin_ms, end_ms], back to back
        in the body as a pull answer holds them (``count`` of them)."""
        fields = request.fields
        topic = field(fields, "topic", str)
        limit = field(fields, "max_messages", INT32, FIND_MESSAGES_DEFAULT)
        if not 1 <= limit <= FIND_MESSAGES_MAX:
            raise BadRequestError(f"max_messages must be 1..{FIND_MESSAGES_MAX}, not {limit}")
        try:
            found = self.store.find_by_key(topic, field(fields, "key", str), field(fields, "begin_ms", int, 0),
                                           field(fields, "end_ms", int, TIME_MAX_MS), limit)
        except ValueError as err:  # a key no record can carry (empty, or holding the separator)
            raise BadRequestError(str(err)) from err
        replicas = self.replicas
        if replicas is not None:  # what consumers may read: not past a led queue's high watermark
            found = [record for record in found if _committed(replicas, topic, record)]
        return Response({"count": len(found)}, body=b"".join(found))


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


def consumer_read(store: MessageStore, topic: str, queue_id: int, offset: int, max_msgs: int, max_bytes: int,
                  tag_hashes: frozenset[int] | None, limit: int | None,
                  select: RecordSelector | None) -> GetResult:
    """What a consumer's read (PULL, FETCH) of a queue serves from ``offset``: up to ``limit``
    (a replicated queue's high watermark), filtered; an offset past the end is an error."""
    result = store.get(topic, queue_id, offset, max_msgs, max_bytes, tag_hashes, limit, coalesce=True, select=select)
    if result.status is GetStatus.OFFSET_OVERFLOW:
        raise OffsetIllegalError(
            f"offset {offset} is beyond the end of {topic}/{queue_id} "
            f"(valid: {result.min_offset}..{result.max_offset})",
            fields={"min_offset": result.min_offset, "max_offset": result.max_offset})
    return result


FIND_MESSAGES_DEFAULT = 32
FIND_MESSAGES_MAX = 1024  # one answer holds at most this many records (each read and checked)


_QUEUE_POSITION = struct.Struct(">iq")  # a record's queue_id and queue_offset


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


def _queue_fields(request: Frame) -> tuple[str, int]:
    return field(request.fields, "topic", str), field(request.fields, "queue_id", INT32)


