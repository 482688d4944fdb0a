"""Transparent batching of ``send_async``: one open batch per target queue.

A batch is sent when it reaches ``batch_bytes`` or ``linger_ms`` after its first message,
whichever comes first (Kafka's linger.ms / batch.size). Plain messages (no key, no queue, no
keys or properties) stick to one open batch per topic, whose queue is chosen once per batch, not
per message (Kafka's sticky partitioner, KIP-480): batches fill up instead of being spread thin
over a topic's queues, and a message costs no routing. Callers append from any thread under
one lock; the event loop is woken once per batch, never per message. ``buffer_bytes_max``
bounds the memory of unsent messages: appends block while it is reached (appends on the loop
itself, an asyncio producer's, never block: they await :meth:`Accumulator.room` instead). A batch over the
broker's limit per send request goes out as several requests (``BatchBuilder.seal_counted``).

A batch that is due (full, or ``linger_ms`` old) is ready for its broker; the ready batches of a
broker go out together, as one request (``SendManyFn``: the broker stores them in one append),
whenever that broker has fewer than ``REQUESTS_PER_BROKER`` requests in flight. While it has that
many, a lingered batch stays open and keeps taking messages: a producer spread over many topics
sends fewer, fuller requests the busier its broker is (Kafka's sender drains a broker's ready
batches into one request too). A request sent while its broker has others in flight takes at most
OPEN_BATCHES_PER_BUSY_REQUEST batches that are still open (closed ones, full or flushed, are not
counted): each batch costs both sides about as much as dozens of messages, and the open ones left
keep growing until a request takes them, so a busy producer over a thousand topics sends batches
of a hundred messages or more rather than hundreds of batches of a few each (the buffer,
``buffer_bytes_max``, bounds how long they wait). A batch alone, one over the limit per request, one of a
replicated queue and every batch when there is no ``SendManyFn`` go through ``SendFn``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import cast

from gms.client._append import AppenderBase, GilMutex
from gms.client.routing import QueueRoute
from gms.client.send_results import SendFuture, SendResult
from gms.client.sender import FIRST_ANSWER
from gms.errors import ProtocolError
from gms.protocol.frame import SEND_BODY_SIZE_MAX_BYTES
from gms.record.builder import REQUEST_BYTES_MAX, BatchBuilder, RecordEncoder
from gms.record.sequence import STAMP_BYTES

# Sends one batch, sealed as one or more request bodies (with their record counts), to ``route``;
# results in order.
SendFn = Callable[[QueueRoute, list[tuple[bytearray, int]]], Awaitable[Sequence[SendResult]]]
# Sends batches of different queues of one broker (route, batch, record count) as one request,
# sealing them (Sender.send_many: an idempotent producer's with their stamps, in one copy); per
# batch, its results or the error it failed with.
SendManyFn = Callable[[str, list[tuple[QueueRoute, BatchBuilder, int]]],
                      Awaitable[list[Sequence[SendResult] | BaseException]]]
log = logging.getLogger(__name__)

# How long a thread that filled a batch waits for the loop to take it (see Accumulator._filled).
HANDOFF_WAIT_S = 0.002
# Requests in flight per broker before its ready batches wait (and grow) for the next one.
REQUESTS_PER_BROKER = 4
# Open (lingered, still growing) batches a request takes while its broker has others in flight.
OPEN_BATCHES_PER_BUSY_REQUEST = 16
# A request this close to SEND_BODY_SIZE_MAX_BYTES takes no more batches (see _take_ready).
REQUEST_FULL_MARGIN_BYTES = 32 * 1024


class _Outcome:
    """A batch's results or error, set once (on the loop): what its messages' SendFutures read
    (``result``, ``exception``, ``done``, ``cancelled``, ``add_done_callback``, as a
    concurrent.futures.Future's). A thread that waits makes the Event it waits on; a batch nobody
    waits for (send_async then flush) costs no lock or condition of its own: a producer spread
    over many topics opens a batch per topic and round."""

    __slots__ = ("__weakref__", "_callbacks", "_done", "_error", "_event", "_results")
    _lock = threading.Lock()  # shared: held a moment, to hand over the Event and the callbacks

    def __init__(self) -> None:
        self._done = False
        self._results: Sequence[SendResult] | None = None
        self._error: BaseException | None = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[_Outcome], object]] | None = []

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with self._lock:
            if not self._done and self._event is None:
                self._event = threading.Event()
            event = self._event
        if event is not None and not event.wait(timeout) and not self._done:
            raise TimeoutError()

    def result(self, timeout: float | None = None) -> Sequence[SendResult]:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return cast(Sequence[SendResult], self._results)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[_Outcome], object]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        self._call(fn)

    def set_result(self, results: Sequence[SendResult]) -> None:
        self._results = results
        self._set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._set()

    def _set(self) -> None:
        with self._lock:
            if self._done:
                raise RuntimeError("a batch's outcome is set once")
            self._done = True
            event, callbacks, self._callbacks = self._event, self._callbacks, None
        if event is not None:
            event.set()
        for fn in callbacks or ():
            self._call(fn)

    def _call(self, fn: Callable[[_Outcome], object]) -> None:
        try:
            fn(self)
        except Exception:  # as concurrent.futures does: a callback's error is the caller's, logged
            log.exception("exception calling callback for %r", self)


class _OpenBatch(BatchBuilder):
    """A batch being filled: ``closed`` once taken out of the open batches (sent, or being sent);
    ``outcome``: its results, which each of its messages' SendFuture reads."""

    __slots__ = ("ready", "route")

    def __new__(cls, route: QueueRoute) -> _OpenBatch:
        return super().__new__(cls, route.queue_id)

    def __init__(self, route: QueueRoute) -> None:
        self.route = route
        self.ready = False  # in its broker's ready batches (on the loop)
        self.outcome = _Outcome()


class _Slot:
    """One of a broker's requests in flight: freed once (its first answer, or its end)."""

    __slots__ = ("accumulator", "broker")

    def __init__(self, accumulator: Accumulator, broker: str) -> None:
        self.accumulator: Accumulator | None = accumulator
        self.broker = broker

    def __call__(self) -> None:
        accumulator, self.accumulator = self.accumulator, None
        if accumulator is not None:
            accumulator._free_slot(self.broker)


class Accumulator(AppenderBase):
    """``append_plain(topic, body, tag)`` (C, gms.client._append) appends a plain message to its
    topic's sticky batch, falling back to :meth:`_append_plain_slow` for anything it cannot."""

    def __init__(self, loop: asyncio.AbstractEventLoop, encoder: RecordEncoder, send: SendFn,
                 choose: Callable[[str], QueueRoute], *, linger_ms: float, batch_bytes: int,
                 buffer_bytes_max: int, send_many: SendManyFn | None = None) -> None:
        """``choose(topic)``: the queue a topic's plain messages go to next (it may look the
        routes up: called outside the lock)."""
        self._loop = loop
        self._encoder = encoder
        self._send = send
        self._send_many = send_many
        self._choose = choose
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_bytes
        self._buffer_bytes_max = buffer_bytes_max
        self._body_size_max = encoder.body_size_max_bytes
        self._lock = GilMutex()  # taken per message by the C path: no atomics, no method calls
        self._space = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._open: dict[QueueRoute, _OpenBatch] = {}
        self._sticky: dict[str, _OpenBatch] = {}  # topic -> the open batch its plain messages fill
        self._buffered_bytes = 0
        # Open batches by age, with when each lingered enough (monotonic s), under the lock; one
        # timer on the loop for the oldest (armed while there are any): a producer over many
        # topics opens a batch per topic and round, and a timer each was a loop wake-up each.
        self._lingering: deque[tuple[float, _OpenBatch]] = deque()
        self._linger_armed = False
        self._in_flight: set[asyncio.Task[None]] = set()
        # On the loop: per broker, its ready batches (oldest first) and its requests in flight.
        self._ready: dict[str, list[_OpenBatch]] = {}
        self._requests: dict[str, int] = {}
        self._room_waiters: list[asyncio.Future[None]] = []  # asyncio producers awaiting room (on the loop)

    def _on_loop(self) -> bool:
        """Whether the caller runs on the loop, which must not block (it answers the batches)."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    @property
    def full(self) -> bool:
        """Whether unanswered messages fill ``buffer_bytes_max``."""
        return self._buffered_bytes >= self._buffer_bytes_max

    async def room(self) -> None:
        """Wait (on the loop) until the buffer has room again."""
        while self.full:
            waiter = self._loop.create_future()
            self._room_waiters.append(waiter)
            await waiter

    def _append_plain_slow(self, topic: str, body: bytes, tag: str | None) -> SendFuture:
        """``append_plain`` in Python: waits while the buffer is full, packs a new shape, opens
        the topic's sticky batch on the queue ``choose`` gives when it has none, raises for bad
        input."""
        batch = self._sticky.get(topic)
        if batch is not None:
            future, filled = None, False
            with self._lock:
                while self._buffered_bytes >= self._buffer_bytes_max and not batch.closed and not self._on_loop():
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
            while self._buffered_bytes >= self._buffer_bytes_max and not self._on_loop():
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
            arm = False
            if is_new and not filled:
                self._lingering.append((time.monotonic() + self._linger_s, batch))
                arm, self._linger_armed = not self._linger_armed, True
        if filled:
            self._filled(batch)
        elif arm:
            self._loop.call_soon_threadsafe(self._linger_due)
        return future

    def _add(self, batch: _OpenBatch, topic: str, body: bytes, tag: str | None, keys: Sequence[str] = (),
             properties: Mapping[str, str] | None = None, flags: int = 0) -> SendFuture:
        """Encode a message into ``batch`` (under the lock) and return its future; a message
        that fills the batch closes it here, for the caller to dispatch."""
        self._buffered_bytes += self._encoder.add(batch, topic, body, tag, keys, properties, flags)
        if batch.size_bytes >= self._batch_bytes:
            self._close(batch)
        return SendFuture(batch, batch.count - 1)

    def _close(self, batch: _OpenBatch) -> None:
        """Take ``batch`` out of the open ones (under the lock): no message joins it any more. (A
        batch closed before may have a successor open on its route.)"""
        if batch.closed:
            return
        batch.closed = True
        if self._open.get(batch.route) is batch:
            del self._open[batch.route]
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
            self._make_ready(batch)
            return
        taken = threading.Event()
        self._loop.call_soon_threadsafe(self._take, batch, taken)
        taken.wait(HANDOFF_WAIT_S)

    def _take(self, batch: _OpenBatch, taken: threading.Event) -> None:
        taken.set()
        self._make_ready(batch)

    def _linger_due(self) -> None:
        """(On the loop.) Make the batches that lingered enough ready, then wait for the next one."""
        now = time.monotonic()
        lingering = self._lingering
        with self._lock:
            due = []
            while lingering and lingering[0][0] <= now:
                due.append(lingering.popleft()[1])
            next_due = lingering[0][0] if lingering else None
            self._linger_armed = next_due is not None
        for batch in due:
            self._make_ready(batch)
        if next_due is not None:
            self._loop.call_later(next_due - now, self._linger_due)

    def _make_ready(self, batch: _OpenBatch) -> None:
        """``batch`` is due (full or lingered; on the loop): send it with its broker's next request.
        Until then an open one takes more messages."""
        if batch.ready:
            return
        batch.ready = True
        broker = batch.route.broker
        ready = self._ready.get(broker)
        if ready is None:
            ready = self._ready[broker] = []
        ready.append(batch)
        self._drain(broker)

    def _drain(self, broker: str) -> None:
        """Send ``broker``'s ready batches while it has fewer than REQUESTS_PER_BROKER requests
        whose first attempt is unanswered (a batch being retried, or waiting for its queue's turn,
        takes no slot: the broker's other queues go on)."""
        ready = self._ready.get(broker)
        while ready and (busy := self._requests.get(broker, 0)) < REQUESTS_PER_BROKER:
            with self._lock:
                taken = self._take_ready(ready, OPEN_BATCHES_PER_BUSY_REQUEST if busy else len(ready))
            self._requests[broker] = busy + 1
            task = self._loop.create_task(self._send_request(broker, taken, _Slot(self, broker)))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    def _free_slot(self, broker: str) -> None:
        self._requests[broker] -= 1
        self._drain(broker)

    def _take_ready(self, ready: list[_OpenBatch], open_max: int) -> list[_OpenBatch]:
        """The batches of the next request, out of ``ready`` and closed (under the lock): the oldest,
        alone if it must go alone, else with the others that fit one request, one per queue, until
        the request is within REQUEST_FULL_MARGIN_BYTES of the limit or holds ``open_max`` batches
        that were open (the rest are not looked at: with a batch per topic, a thousand may be ready)."""
        first = ready[0]
        growing = 0 if first.closed else 1
        self._close(first)
        if self._send_many is None or not self._combinable(first):
            del ready[0]
            return [first]
        taken, left, routes = [first], [], {first.route}
        size = first.size_bytes + STAMP_BYTES
        for k in range(1, len(ready)):  # under the lock their sizes hold still; the ones left stay open
            batch = ready[k]
            if growing >= open_max and not batch.closed:
                left += ready[k:]
                break
            if batch.route in routes or not self._combinable(batch) or (
                    size + batch.size_bytes + STAMP_BYTES > SEND_BODY_SIZE_MAX_BYTES):
                left.append(batch)
                if size > SEND_BODY_SIZE_MAX_BYTES - REQUEST_FULL_MARGIN_BYTES:
                    left += ready[k + 1:]
                    break
                continue
            growing += not batch.closed
            self._close(batch)
            size += batch.size_bytes + STAMP_BYTES
            taken.append(batch)
            routes.add(batch.route)
        ready[:] = left
        return taken

    @staticmethod
    def _combinable(batch: _OpenBatch) -> bool:
        """Whether ``batch`` may share a request (a replicated queue's send follows its leader alone)."""
        return batch.size_bytes <= REQUEST_BYTES_MAX and not batch.route.replicated

    async def _send_request(self, broker: str, batches: list[_OpenBatch], slot: _Slot) -> None:
        FIRST_ANSWER.set(slot)  # this task's own context (and that of the tasks it starts)
        try:
            if len(batches) == 1:
                await self._send_batch(batches[0])
            else:
                await self._send_batches(broker, batches)
        finally:
            slot()

    async def _send_batches(self, broker: str, batches: list[_OpenBatch]) -> None:
        """Several batches of ``broker`` in one request (``SendManyFn``)."""
        outcomes: list[Sequence[SendResult] | BaseException]
        try:
            outcomes = await cast(SendManyFn, self._send_many)(
                broker, [(batch.route, batch, batch.count) for batch in batches])
        except BaseException as err:
            outcomes = [err] * len(batches)
            if not isinstance(err, Exception):
                raise
        finally:
            self._release(sum(batch.size_bytes for batch in batches))  # one wake-up for all
            for batch, outcome in zip(batches, outcomes, strict=True):
                self._resolve(batch, outcome)

    async def _send_batch(self, batch: _OpenBatch) -> None:
        outcome: Sequence[SendResult] | BaseException
        try:
            outcome = await self._send(batch.route, batch.seal_counted())
        except BaseException as err:
            outcome = err
            if not isinstance(err, Exception):
                raise
        finally:
            self._release(batch.size_bytes)
            self._resolve(batch, outcome)

    def _release(self, size_bytes: int) -> None:
        """Answered batches of ``size_bytes`` leave the buffer: appends waiting for room go on."""
        with self._lock:
            self._buffered_bytes -= size_bytes
            self._space.notify_all()
        if self._room_waiters and not self.full:
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _resolve(self, batch: _OpenBatch, outcome: Sequence[SendResult] | BaseException) -> None:
        """Give ``batch``'s messages their results (acks=0: none, each message's is None) or error,
        and let its records go: the handles of its messages keep the batch, for its outcome."""
        if isinstance(outcome, BaseException):
            batch.outcome.set_exception(outcome)
        elif outcome and len(outcome) != batch.count:
            batch.outcome.set_exception(ProtocolError(
                f"{len(outcome)} results for a batch of {batch.count} messages", must_close=False))
        else:
            batch.outcome.set_result(outcome)
        batch.release()

    async def flush(self) -> None:
        """Send every open batch now and wait until all batches in flight are answered."""
        with self._lock:
            batches = list(self._open.values())
            for batch in batches:
                self._close(batch)
        for batch in batches:
            self._make_ready(batch)
        while self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)
