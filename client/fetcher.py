"""Per-queue background fetchers feeding one bounded, thread-safe buffer.

Each owned queue has a task on the I/O loop that finds where to start (unless told), then
long-polls the queue's current leader (PULL with poll_ms) and puts what it gets into
:class:`FetchBuffer` as one chunk per response. A queue may have at most ``PREFETCH_CHUNKS``
unconsumed chunks (a semaphore permit per chunk, given back when ``poll`` takes the chunk), so
memory is bounded by queues × chunks × fetch_max_bytes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

from gms.client.connections import msg_id_prefix
from gms.client.routing import LONG_POLL_LEADER_CHECK_INTERVAL_MS, LeaderMovedError, RouteProvider, leader_request
from gms.client.runtime import ClientRuntime
from gms.client.structs import DamagedRecord, MessageBatch, ReceivedMessages
from gms.errors import (
    BadRequestError,
    ConnectionClosedError,
    GmsError,
    NotLeaderError,
    OffsetIllegalError,
    QueueHeldError,
    ServiceUnavailableError,
)
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame
from gms.record import (
    FieldOffsets,
    RecordCheck,
    exact_tag_mask,
    read_field_offsets,
    scan_records,
)
from gms.store_errors import CorruptRecord
from gms.tags import TagFilter

log = logging.getLogger(__name__)

PREFETCH_CHUNKS = 4
FETCH_ERROR_BACKOFF_MS = 200


class TopicQueue(NamedTuple):
    """One queue of a topic, wherever its leader is."""

    topic: str
    queue_id: int


async def leader_of(routes: RouteProvider, queue: TopicQueue) -> str:
    """The address of the broker leading ``queue`` now (from the cached routes)."""
    for route in await routes.routes(queue.topic):
        if route.queue_id == queue.queue_id:
            return route.broker
    raise ServiceUnavailableError(f"queue {queue.topic}/{queue.queue_id} has no live leader now")


class QueueState:
    """One queue this consumer reads. ``position`` (next offset to hand out; None until the
    fetch task found where to start) is written by the polling thread once known; ``revoked``
    is set by the loop when the queue is taken away, ``paused`` by ``Consumer.pause``."""

    __slots__ = ("committed", "key", "paused", "permits", "position", "revoked", "task")

    def __init__(self, key: TopicQueue) -> None:
        self.key = key
        self.position: int | None = None
        self.committed: int | None = None
        self.revoked = False
        self.paused = False
        self.permits = asyncio.Semaphore(PREFETCH_CHUNKS)
        self.task: asyncio.Task[None] | None = None


class Chunk:
    """One PULL answer's messages and the damaged records the broker passed among them."""

    __slots__ = ("damaged", "holds_permit", "messages", "next_offset", "state")

    def __init__(self, state: QueueState, messages: ReceivedMessages, next_offset: int,
                 holds_permit: bool, damaged: Sequence[DamagedRecord] = ()) -> None:
        self.state = state
        self.messages = messages
        self.next_offset = next_offset
        self.holds_permit = holds_permit
        self.damaged = damaged  # in queue offset order, all below next_offset


class FetchBuffer:
    """Chunks waiting for ``poll``: filled by the loop thread, drained by the user thread."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._chunks: deque[Chunk] = deque()

    def put(self, chunk: Chunk) -> None:
        with self._ready:
            self._chunks.append(chunk)
            self._ready.notify()

    def take(self, max_messages: int, timeout_s: float) -> list[Chunk]:
        """Up to ``max_messages`` messages as chunks, waiting up to ``timeout_s`` for the first."""
        deadline = time.monotonic() + timeout_s
        taken: list[Chunk] = []
        room = max_messages
        with self._ready:
            while not self._chunks:
                left = deadline - time.monotonic()
                if (left <= 0 or not self._ready.wait(left)) and not self._chunks:
                    return taken
            chunks = self._chunks
            while chunks and room > 0:
                chunk = chunks[0]
                if len(chunk.messages) <= room:
                    chunks.popleft()
                    taken.append(chunk)
                    room -= len(chunk.messages)
                else:  # split: the rest stays first in line and keeps the permit
                    head, chunk.messages = chunk.messages.split(room)
                    cut = head.queue_offset(-1) + 1
                    damaged = chunk.damaged
                    chunk.damaged = [d for d in damaged if d.queue_offset >= cut]
                    taken.append(Chunk(chunk.state, head, cut, False,
                                       [d for d in damaged if d.queue_offset < cut]))
                    room = 0
        return taken

    def put_back(self, chunks: Sequence[Chunk]) -> None:
        """Return taken ``chunks`` to the front of the line, in order."""
        with self._ready:
            self._chunks.extendleft(reversed(chunks))
            self._ready.notify()

    def drop(self, is_dropped: Callable[[Chunk], bool]) -> None:
        with self._ready:
            self._chunks = deque(c for c in self._chunks if not is_dropped(c))

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


# A pull failing with one of these means the route is stale: the queue moved or its broker died.
LEADER_LOST_ERRORS = (NotLeaderError, ConnectionClosedError, ServiceUnavailableError, LeaderMovedError)

# Where a queue starts: (position, committed offset or None), asked when no position is given.
StartOffset = Callable[[TopicQueue], Awaitable[tuple[int, int | None]]]


class Fetcher:
    """Starts and runs the fetch task of each owned queue (on the I/O loop)."""

    def __init__(self, runtime: ClientRuntime, buffer: FetchBuffer, filters: Mapping[str, TagFilter], *,
                 group: str | None, member: str | None, max_messages: int, max_bytes: int,
                 long_poll_ms: int, on_leader_lost: Callable[[], None] = lambda: None) -> None:
        """``on_leader_lost`` hears of a queue whose broker no longer leads it or is unreachable:
        the consumer refreshes its routes and heartbeats at once instead of at the next beat."""
        self._runtime = runtime
        self._on_leader_lost = on_leader_lost
        self._buffer = buffer
        self._filters = filters
        self._owner: dict[str, Any] = {"group": group, "member": member} if member else {}
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._long_poll_ms = long_poll_ms

    def start(self, state: QueueState, start_offset: StartOffset) -> None:
        """Fetch ``state``'s queue from its position, or from ``start_offset`` if it has none yet."""
        state.task = asyncio.get_running_loop().create_task(self._run(state, start_offset))

    async def stop(self, state: QueueState) -> None:
        """Stop fetching ``state``'s queue and forget what it fetched but ``poll`` did not take."""
        task, state.task = state.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._buffer.drop(lambda chunk: chunk.state is state)
        state.permits = asyncio.Semaphore(PREFETCH_CHUNKS)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` until it succeeds, backing off after each failure."""
        while True:
            try:
                return await call()
            except (GmsError, CorruptRecord) as err:
                await self._back_off(what, err)

    async def _back_off(self, what: str, err: GmsError | CorruptRecord) -> None:
        """Log a failed request (quietly if it will pass), re-route if the leader is gone, wait."""
        quiet = isinstance(err, (BadRequestError, QueueHeldError)) or getattr(err, "retriable", False)
        log.log(logging.DEBUG if quiet else logging.WARNING, "%s failed: %r", what, err)
        if isinstance(err, LEADER_LOST_ERRORS):
            self._on_leader_lost()
        await asyncio.sleep(FETCH_ERROR_BACKOFF_MS / 1000)

    async def _run(self, state: QueueState, start_offset: StartOffset) -> None:
        key = state.key
        if state.position is None:
            state.position, state.committed = await self._retrying(
                f"finding where {key.topic}/{key.queue_id} starts", lambda: start_offset(key))
        tag_filter = self._filters[key.topic]
        fields = {"topic": key.topic, "queue_id": key.queue_id, "offset": state.position,
                  "max_msgs": self._max_messages, "max_bytes": self._max_bytes,
                  "tags": tag_filter.expression, "poll_ms": self._long_poll_ms, **self._owner}
        if tag_filter.sql:
            fields["sql"] = tag_filter.sql
        timeout_ms = self._long_poll_ms + self._runtime.request_timeout_ms
        pool = self._runtime.pool
        routes = self._runtime.routes

        def pull(broker: str, fields: Mapping[str, Any]) -> Awaitable[Frame]:
            """PULL from ``broker``, given up once another broker leads the queue (LeaderMovedError)."""
            return leader_request(routes, pool, key.topic, key.queue_id, broker, RequestCode.PULL, fields,
                                  timeout_ms=timeout_ms, check_interval_ms=LONG_POLL_LEADER_CHECK_INTERVAL_MS)

        ahead: _ReadAhead | None = None
        step = 0  # the offsets the last two answers each advanced by, when they agree; else 0
        last_advanced = 0
        try:
            while True:
                await state.permits.acquire()
                offset = fields["offset"]
                try:
                    if ahead is not None and ahead.offset == offset:
                        broker, pending = ahead.broker, ahead.task
                    else:
                        broker = await leader_of(routes, key)
                        pending = asyncio.ensure_future(pull(broker, fields))
                    if ahead is not None and ahead.task is not pending:
                        ahead.drop()
                    ahead = None
                    if step:  # ask for the answer after this one now: it is there, at offset + step
                        ahead = _ReadAhead(offset + step, broker, asyncio.ensure_future(
                            pull(broker, {**fields, "offset": offset + step})))
                    frame = await pending
                    messages = decode_pull_body(frame.body, msg_id_prefix(broker), tag_filter,
                                                verify_crc=not frame.fields.get("crc_checked", False))
                except OffsetIllegalError as err:
                    state.permits.release()
                    step = 0
                    fields["offset"] = _clamp(fields["offset"], err.fields)
                    log.warning("%s: %s; continuing at offset %d", key, err, fields["offset"])
                    continue
                except (GmsError, CorruptRecord) as err:
                    state.permits.release()
                    step = 0
                    await self._back_off(f"pull from {key.topic}/{key.queue_id}", err)
                    continue
                next_offset = frame.fields["next_offset"]
                damaged = [DamagedRecord(key.topic, key.queue_id, offset, f"{msg_id_prefix(broker)}{phys:016X}")
                           for offset, phys in frame.fields.get("damaged", ())]
                if messages:
                    self._buffer.put(Chunk(state, messages, next_offset, True, damaged))
                else:
                    state.permits.release()
                    if next_offset != fields["offset"]:  # skipped unmatched, expired or damaged entries
                        self._buffer.put(Chunk(state, ReceivedMessages(), next_offset, False, damaged))
                # Read ahead only while answers come full (more is stored than one answer holds)
                # and alike: then the next answer most likely ends where this one's step says.
                advanced = next_offset - offset
                full = bool(messages) and next_offset + advanced < frame.fields.get("max_offset", 0)
                step = advanced if full and advanced == last_advanced else 0
                last_advanced = advanced if full else 0
                fields["offset"] = next_offset
        finally:
            if ahead is not None:
                ahead.drop()


class _ReadAhead(NamedTuple):
    """A PULL sent before its turn, for the answer that most likely follows the awaited one."""

    offset: int
    broker: str
    task: asyncio.Future[Any]

    def drop(self) -> None:
        """Forget it (the awaited answer ended elsewhere): cancel it or swallow what it got."""
        self.task.cancel()
        self.task.add_done_callback(_swallow)


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _clamp(offset: int, bounds: Mapping[str, Any]) -> int:
    low, high = bounds.get("min_offset", 0), bounds.get("max_offset", 0)
    return min(max(offset, low), high)


def decode_pull_body(body: memoryview | bytes | bytearray, prefix: str, tag_filter: TagFilter, *,
                     verify_crc: bool = True) -> ReceivedMessages:
    """Messages of a PULL response body, checked (length, magic, CRC) and exact-tag filtered.

    The records are walked in one C call (:func:`gms.record.scan_records`). ``verify_crc=False``
    checks the framing only: the broker says it checked every record's CRC as it served it
    (``crc_checked``), so the check is paid once per message, not twice. Every header is
    checked as :func:`gms.record.decode_record` checks it (CorruptRecord otherwise)."""
    if not body:
        return ReceivedMessages()
    body = memoryview(body)
    scan = scan_records(body, verify_crc=verify_crc)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
        raise CorruptRecord(scan.stop_pos, f"pull response holds {scan.stop.value} data")
    starts = scan.starts
    offsets = read_field_offsets(body, starts)
    if tag_filter.tags is not None:  # the broker matched tag hashes; drop hash collisions
        keep = exact_tag_mask(body, offsets, tag_filter.tags)
        if not keep.all():
            starts = starts[keep]
            offsets = FieldOffsets(*(column[keep] for column in offsets))
    return ReceivedMessages([MessageBatch(body, starts, prefix, offsets)])
