"""Per-queue background fetchers feeding one bounded, thread-safe buffer.

Each owned queue has a task on the I/O loop that long-polls the broker (PULL with poll_ms)
and puts what it gets into :class:`FetchBuffer` as one chunk per response. A queue may have
at most ``PREFETCH_CHUNKS`` unconsumed chunks (a semaphore permit per chunk, given back when
``poll`` takes the chunk), so memory is bounded by queues × chunks × fetch_max_bytes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gms.errors import BadRequestError, GmsError, OffsetIllegalError
from gms.protocol.codes import RequestCode
from gms.record import RecordCheck, record_tag, scan_records
from gms.store_errors import CorruptRecord
from gms.tags import TagFilter

from gms.client.connections import msg_id_prefix
from gms.client.routing import QueueRoute
from gms.client.runtime import ClientRuntime
from gms.client.structs import ReceivedMessage

log = logging.getLogger(__name__)

PREFETCH_CHUNKS = 2
FETCH_ERROR_BACKOFF_MS = 200


class QueueState:
    """One queue this consumer reads. ``position`` (next offset to hand out) is written only
    by the polling thread; ``revoked`` is set by the loop when the queue is taken away."""

    __slots__ = ("route", "position", "committed", "revoked", "permits", "task")

    def __init__(self, route: QueueRoute, position: int, committed: int) -> None:
        self.route = route
        self.position = position
        self.committed = committed
        self.revoked = False
        self.permits = asyncio.Semaphore(PREFETCH_CHUNKS)
        self.task: asyncio.Task[None] | None = None


class Chunk:
    __slots__ = ("state", "messages", "next_offset", "holds_permit")

    def __init__(self, state: QueueState, messages: list[ReceivedMessage], next_offset: int,
                 holds_permit: bool) -> None:
        self.state = state
        self.messages = messages
        self.next_offset = next_offset
        self.holds_permit = holds_permit


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
                if left <= 0 or not self._ready.wait(left):
                    if not self._chunks:
                        return taken
            chunks = self._chunks
            while chunks and room > 0:
                chunk = chunks[0]
                if len(chunk.messages) <= room:
                    chunks.popleft()
                    taken.append(chunk)
                    room -= len(chunk.messages)
                else:  # split: the rest stays first in line and keeps the permit
                    head = chunk.messages[:room]
                    chunk.messages = chunk.messages[room:]
                    taken.append(Chunk(chunk.state, head, head[-1].queue_offset + 1, False))
                    room = 0
        return taken

    def drop(self, is_dropped: Callable[[Chunk], bool]) -> None:
        with self._ready:
            self._chunks = deque(c for c in self._chunks if not is_dropped(c))

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


class Fetcher:
    """Starts and runs the fetch task of each owned queue (on the I/O loop)."""

    def __init__(self, runtime: ClientRuntime, buffer: FetchBuffer, filters: Mapping[str, TagFilter], *,
                 group: str | None, member: str | None, max_messages: int, max_bytes: int,
                 long_poll_ms: int) -> None:
        self._runtime = runtime
        self._buffer = buffer
        self._filters = filters
        self._owner: dict[str, Any] = {"group": group, "member": member} if member else {}
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._long_poll_ms = long_poll_ms

    def start(self, state: QueueState) -> None:
        state.task = asyncio.get_running_loop().create_task(self._run(state))

    async def _run(self, state: QueueState) -> None:
        route = state.route
        tag_filter = self._filters[route.topic]
        fields = {"topic": route.topic, "queue_id": route.queue_id, "offset": state.position,
                  "max_msgs": self._max_messages, "max_bytes": self._max_bytes,
                  "tags": tag_filter.expression, "poll_ms": self._long_poll_ms, **self._owner}
        timeout_ms = self._long_poll_ms + self._runtime.request_timeout_ms
        prefix = msg_id_prefix(route.broker)
        pool = self._runtime.pool
        while True:
            await state.permits.acquire()
            try:
                frame = await pool.request(route.broker, RequestCode.PULL, fields, timeout_ms=timeout_ms)
                messages = decode_pull_body(frame.body, prefix, tag_filter)
            except OffsetIllegalError as err:
                state.permits.release()
                fields["offset"] = _clamp(fields["offset"], err.fields)
                log.warning("%s: %s; continuing at offset %d", route, err, fields["offset"])
                continue
            except (GmsError, CorruptRecord) as err:
                state.permits.release()
                level = logging.DEBUG if isinstance(err, BadRequestError) or err.retriable else logging.WARNING
                log.log(level, "pull from %s failed: %r", route, err)
                await asyncio.sleep(FETCH_ERROR_BACKOFF_MS / 1000)
                continue
            next_offset = frame.fields["next_offset"]
            if messages:
                self._buffer.put(Chunk(state, messages, next_offset, True))
            else:
                state.permits.release()
                if next_offset != fields["offset"]:  # skipped unmatched or expired entries
                    self._buffer.put(Chunk(state, [], next_offset, False))
            fields["offset"] = next_offset


def _clamp(offset: int, bounds: Mapping[str, Any]) -> int:
    low, high = bounds.get("min_offset", 0), bounds.get("max_offset", 0)
    return min(max(offset, low), high)


def decode_pull_body(body: memoryview | bytes, prefix: str, tag_filter: TagFilter) -> list[ReceivedMessage]:
    """Messages of a PULL response body, checked (length, magic, CRC) and exact-tag filtered."""
    if not body:
        return []
    scan = scan_records(body)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
        raise CorruptRecord(scan.stop_pos, f"pull response holds {scan.stop.value} data")
    starts = scan.starts
    tags = tag_filter.tags
    if tags is not None:  # the broker matched tag hashes; drop hash collisions
        starts = [pos for pos in starts if record_tag(body, pos) in tags]
    return [ReceivedMessage(body, pos, prefix) for pos in starts]
