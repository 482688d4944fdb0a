"""Transparent batching of ``send_async``: one open batch per target queue.

A batch is sent when it reaches ``batch_bytes`` or ``linger_ms`` after its first message,
whichever comes first (Kafka's linger.ms / batch.size). Plain messages (no key, no queue, no
keys or properties) stick to one open batch per topic, whose queue is chosen once per batch, not
per message (Kafka's sticky partitioner, KIP-480): batches fill up instead of being spread thin
over a topic's queues, and a message costs no routing. Callers append from any thread under
one lock; the event loop is woken once per batch, never per message. ``buffer_bytes_max``
bounds the memory of unsent messages: appends block while it is reached. A batch over the
broker's limit per send request goes out as several requests (``BatchBuilder.seal_counted``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence

from gms.client._append import AppenderBase
from gms.client.routing import QueueRoute
from gms.client.structs import SendFuture, SendResult
from gms.errors import ProtocolError
from gms.record.builder import BatchBuilder, RecordEncoder

# Sends one batch, sealed as one or more request bodies (with their record counts), to ``route``;
# results in order.
SendFn = Callable[[QueueRoute, list[tuple[bytearray, int]]], Awaitable[Sequence[SendResult]]]
# How long a thread that filled a batch waits for the loop to take it (see Accumulator._filled).
HANDOFF_WAIT_S = 0.002


class _OpenBatch(BatchBuilder):
    """A batch being filled: ``closed`` once taken out of the open batches (sent, or being sent)."""

    __slots__ = ("future", "route")

    def __new__(cls, route: QueueRoute) -> _OpenBatch:
        return super().__new__(cls, route.queue_id)

    def __init__(self, route: QueueRoute) -> None:
        self.route = route
        # One Future for the batch: each message's SendFuture reads its result out of it.
        self.future: concurrent.futures.Future[Sequence[SendResult]] = concurrent.futures.Future()


class Accumulator(AppenderBase):
    """``append_plain(topic, body, tag)`` (C, gms.client._append) appends a plain message to its
    topic's sticky batch, falling back to :meth:`_append_plain_slow` for anything it cannot."""

    def __init__(self, loop: asyncio.AbstractEventLoop, encoder: RecordEncoder, send: SendFn,
                 choose: Callable[[str], QueueRoute], *, linger_ms: float, batch_bytes: int,
                 buffer_bytes_max: int) -> None:
        """``choose(topic)``: the queue a topic's plain messages go to next (it may look the
        routes up: called outside the lock)."""
        self._loop = loop
        self._encoder = encoder
        self._send = send
        self._choose = choose
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_bytes
        self._buffer_bytes_max = buffer_bytes_max
        self._body_size_max = encoder.body_size_max_bytes
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._open: dict[QueueRoute, _OpenBatch] = {}
        self._sticky: dict[str, _OpenBatch] = {}  # topic -> the open batch its plain messages fill
        self._buffered_bytes = 0
        self._in_flight: set[asyncio.Task[None]] = set()

    def _append_plain_slow(self, topic: str, body: bytes, tag: str | None) -> SendFuture:
        """``append_plain`` in Python: waits while the buffer is full, packs a new shape, opens
        the topic's sticky batch on the queue ``choose`` gives when it has none, raises for bad
        input."""
        batch = self._sticky.get(topic)
        if batch is not None:
            future, filled = None, False
            with self._lock:
                while self._buffered_bytes >= self._buffer_bytes_max and not batch.closed:
                    self._space.wait()
                if not batch.closed:
                    future = self._add(batch, topic, body, tag)
                    filled = batch.closed
            if future is not None:
                if filled:
                    self._filled(batch)
                return future
        return self.append(self._choose(topic), body, tag, (), None, sticky=True)

    def append(self, route: QueueRoute, body: bytes, tag: str | None, keys: Sequence[str],
               properties: Mapping[str, str] | None, flags: int = 0, *, sticky: bool = False) -> SendFuture:
        """Append a message to ``route``'s open batch; ``sticky``: the topic's plain messages
        follow it there until it is sent."""
        with self._lock:
            while self._buffered_bytes >= self._buffer_bytes_max:
                self._space.wait()
            batch = self._open.get(route)
            is_new = batch is None
            if batch is None:
                batch = _OpenBatch(route)
            future = self._add(batch, route.topic, body, tag, keys, properties, flags)
            filled = batch.closed
            if is_new and not filled:
                self._open[route] = batch
            if sticky and not filled:
                self._sticky[route.topic] = batch
        if filled:
            self._filled(batch)
        elif is_new:
            self._loop.call_soon_threadsafe(self._arm_linger, route, batch)
        return future

    def _add(self, batch: _OpenBatch, topic: str, body: bytes, tag: str | None, keys: Sequence[str] = (),
             properties: Mapping[str, str] | None = None, flags: int = 0) -> SendFuture:
        """Encode a message into ``batch`` (under the lock) and return its future; a message
        that fills the batch closes it here, for the caller to dispatch."""
        self._buffered_bytes += self._encoder.add(batch, topic, body, tag, keys, properties, flags)
        if batch.size_bytes >= self._batch_bytes:
            self._close(batch)
        return SendFuture(batch.future, batch.count - 1)

    def _close(self, batch: _OpenBatch) -> None:
        """Take ``batch`` out of the open ones (under the lock): no message joins it any more."""
        batch.closed = True
        self._open.pop(batch.route, None)
        if self._sticky.get(batch.route.topic) is batch:
            del self._sticky[batch.route.topic]

    def _filled(self, batch: _OpenBatch) -> None:
        """Send ``batch``, closed because it filled up.

        The loop's thread needs the GIL to send it, and a thread that keeps appending holds the
        GIL for the interpreter's switch interval (5 ms) at a time: long enough for a queue's
        requests in flight to be answered and the pipe to run dry. So an appending thread hands
        over: it waits, the GIL released, until the loop has taken the batch (at most
        ``HANDOFF_WAIT_S``). On the loop's own thread (a callback that sends) it cannot wait."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._dispatch(batch.route, batch)
            return
        taken = threading.Event()
        self._loop.call_soon_threadsafe(self._take, batch, taken)
        taken.wait(HANDOFF_WAIT_S)

    def _take(self, batch: _OpenBatch, taken: threading.Event) -> None:
        taken.set()
        self._dispatch(batch.route, batch)

    def _arm_linger(self, route: QueueRoute, batch: _OpenBatch) -> None:
        self._loop.call_later(self._linger_s, self._linger_expired, route, batch)

    def _linger_expired(self, route: QueueRoute, batch: _OpenBatch) -> None:
        with self._lock:
            if batch.closed:
                return  # already sent because it filled up, or flushed
            self._close(batch)
        self._dispatch(route, batch)

    def _dispatch(self, route: QueueRoute, batch: _OpenBatch) -> None:
        task = self._loop.create_task(self._send_batch(route, batch))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _send_batch(self, route: QueueRoute, batch: _OpenBatch) -> None:
        try:
            results = await self._send(route, batch.seal_counted())
        except BaseException as err:
            batch.future.set_exception(err)
            if not isinstance(err, Exception):
                raise
        else:
            if results and len(results) != batch.count:
                batch.future.set_exception(ProtocolError(
                    f"{len(results)} results for a batch of {batch.count} messages", must_close=False))
            else:
                batch.future.set_result(results)  # acks=0: none, each message's result is None
        finally:
            with self._lock:
                self._buffered_bytes -= batch.size_bytes
                self._space.notify_all()

    async def flush(self) -> None:
        """Send every open batch now and wait until all batches in flight are answered."""
        with self._lock:
            batches = dict(self._open)
            for batch in batches.values():
                self._close(batch)
        for route, batch in batches.items():
            self._dispatch(route, batch)
        while self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)
