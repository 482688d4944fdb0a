"""The asyncio producer: :class:`gms.client.Producer`'s core driven from the caller's loop."""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

from gms.client._append import PlainFastPath
from gms.client.accumulator import _Outcome
from gms.client.aio._loop import running_loop
from gms.client.producer import BATCH_BYTES, BUFFER_BYTES_MAX, Producer, ProducerRecord, _keyed
from gms.client.routing import QueueRoute
from gms.client.runtime import REQUEST_TIMEOUT_MS, AwaitRequired
from gms.client.send_results import SendFuture, SendResult
from gms.client.tracing import TRACE_TOPIC, now_us
from gms.client.transactions import Transaction, TransactionChecker
from gms.errors import GmsError
from gms.net.busy_poll import CLIENT_WINDOW_US, LoopBusyPoll
from gms.security.client import ClientSecurity

log = logging.getLogger(__name__)

# A message whose topic's routes are being looked up: how to queue it once they are known (given
# where to send if the routes do not name the topic), and its future.
_Deferred = tuple[Callable[[QueueRoute | None], SendFuture], _Outcome]
# send_nowait's callback: a function or a coroutine function of the message's future.
SendCallback = Callable[[SendFuture], object]


def _copy(outcome: _Outcome, sent: SendFuture) -> None:
    """Resolve a message queued behind its routes' lookup as the batch it then joined was."""
    error = sent.exception()
    if error is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result([sent.result()])


class AsyncTransaction:
    """A transaction of an :class:`AsyncProducer`: send its messages with ``transaction=tx``, then
    ``await tx.commit()`` or ``await tx.rollback()``. ``async with`` commits on a clean exit and
    rolls back on an exception (as :class:`gms.client.Transaction`'s ``with``)."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction

    @property
    def tx_id(self) -> str:
        return self._transaction.tx_id

    @property
    def state(self) -> str:
        """"open", then "committed" or "rolled_back"."""
        return self._transaction.state

    @property
    def queues(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs the transaction's messages went to."""
        return self._transaction.queues

    async def commit(self) -> None:
        """Make every message visible (per queue all or nothing), once every queue's leader stored
        the commit per the producer's ``acks``."""
        await self._transaction._end_async(True)

    async def rollback(self) -> None:
        """Drop every message of the transaction: consumers never see them."""
        await self._transaction._end_async(False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            await self.commit()
            return
        try:
            await self.rollback()
        except GmsError as err:  # the check-back resolves it; the application's error matters more
            log.warning("transaction %s: rollback failed (%s); the brokers' check-back will resolve it",
                        self.tx_id, err)

    def __repr__(self) -> str:
        return f"Async{self._transaction!r}"


class AsyncProducer:
    """Sends messages from asyncio code: :class:`gms.client.Producer` on the caller's running loop.

    The options, errors and delivery guarantees are the synchronous producer's (idempotence,
    retries, batching of :meth:`send_nowait`, transactions); create it inside a coroutine and
    ``await aclose()`` it, or use ``async with``. Not thread-safe: use it from its loop."""

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
        *,
        nameserver: Sequence[str] | str | None = None,
        linger_ms: float = 5,
        batch_bytes: int = BATCH_BYTES,
        buffer_bytes_max: int = BUFFER_BYTES_MAX,
        acks: int = 1,
        retries: int = 3,
        retry_backoff_ms: float = 100,
        request_timeout_ms: float = REQUEST_TIMEOUT_MS,
        born_host: str | None = None,
        security: ClientSecurity | None = None,
        idempotence: bool = True,
        group: str | None = None,
        transaction_checker: TransactionChecker | None = None,
        transaction_timeout_ms: int | None = None,
        trace: bool = False,
        trace_topic: str = TRACE_TOPIC,
        busy_poll_us: int = CLIENT_WINDOW_US,
    ) -> None:
        """As :class:`gms.client.Producer`'s. ``transaction_checker`` is called on the loop:
        it must not block. ``trace``: the trace records are written by a task on the loop.
        ``busy_poll_us``: how long the loop polls (rather than sleeps) after a :meth:`send` or
        :meth:`send_batch` leaves, to catch its answer awake, as the sync ``send`` does
        (:mod:`gms.net.busy_poll`; 0: off)."""
        self._loop = running_loop("AsyncProducer")
        self._core = Producer(
            brokers, nameserver=nameserver, linger_ms=linger_ms, batch_bytes=batch_bytes,
            buffer_bytes_max=buffer_bytes_max, acks=acks, retries=retries, retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms, born_host=born_host, security=security, idempotence=idempotence,
            group=group, transaction_checker=transaction_checker, transaction_timeout_ms=transaction_timeout_ms,
            trace=trace, trace_topic=trace_topic, _loop=self._loop)
        self._trace = self._core._trace
        self._busy_poll = LoopBusyPoll(self._loop, busy_poll_us)
        self._runtime = self._core._runtime
        self._accumulator = self._core._accumulator
        # Per topic whose routes are being looked up, its messages queued meanwhile (in order).
        self._unrouted: dict[str, list[_Deferred]] = {}
        # send_nowait's plain messages are appended in C, without the accumulator's lock (all of
        # this producer runs on its loop's thread), the rest by the method below: one call each.
        self._fast = PlainFastPath(self._accumulator, self.send_nowait)
        vars(self)["send_nowait"] = self._fast
        self._lookups: set[asyncio.Future[Any]] = set()  # route lookups, callbacks' coroutines

    @property
    def producer_id(self) -> int | None:
        """The idempotent producer's id (None before its first send, or when not idempotent)."""
        return self._core.producer_id

    # --- sending -----------------------------------------------------------------------------

    async def send(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                   properties: Mapping[str, str] | None = None, queue: int | None = None,
                   key: str | bytes | None = None, *, deliver_at: datetime.datetime | int | None = None,
                   delay_ms: int | None = None, delay_level: int | None = None, reconsume_times: int = 0,
                   message_group: str | None = None, transaction: AsyncTransaction | None = None) -> SendResult:
        """Send one message; returns once the broker acknowledges it (per ``acks``). The
        arguments are :meth:`gms.client.Producer.send`'s. Cancelled, the message may or may not
        be stored (as after a timeout); it is never stored twice."""
        self._check_open()
        core = self._core
        keys, properties, key = _keyed(keys, properties, key, message_group)
        route = core._cached_route(topic, queue, key) or await core._route_async(topic, queue, key)
        tx = None if transaction is None else transaction._transaction
        records = core._encode_one(route, topic, body, tag, keys, properties, deliver_at, delay_ms, delay_level,
                                   reconsume_times, tx)
        self._busy_poll.touch()
        started = now_us() if self._trace is not None else 0
        result = await core._send_one_async(route, records, queue is None and key is None)
        if tx is not None:
            tx.sent(result.topic, result.queue_id)
        if self._trace is not None:
            self._trace.sent(started, tag, keys, len(body), result)
        return result

    async def send_batch(self, messages: Iterable[ProducerRecord | Mapping[str, Any]]) -> Sequence[SendResult]:
        """Send many messages, one request per target queue; results in input order (as
        :meth:`gms.client.Producer.send_batch`)."""
        self._check_open()
        core = self._core
        records = [m if isinstance(m, ProducerRecord) else ProducerRecord(**m) for m in messages]
        found: dict[str, list[QueueRoute] | QueueRoute] = {}
        for record in records:
            if record.topic not in found:
                core._encoder.topic(record.topic)
                routes = core._runtime.routes.cached(record.topic)
                found[record.topic] = await core._lookup(record.topic, record.queue) if routes is None else routes
        groups, count = core._grouped_batch(records, lambda topic, queue, key: core._choose(found[topic], queue, key))
        if not groups:
            return []
        bodies = {target: group.records.seal_counted() for target, group in groups.items()}
        self._busy_poll.touch()
        started = now_us() if self._trace is not None else 0
        results = core._batch_results(groups, await core._send_all(bodies), count)
        if self._trace is not None:
            self._trace.sent_batch(started, records, results)
        return results

    def send_nowait(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                    properties: Mapping[str, str] | None = None, queue: int | None = None,
                    key: str | bytes | None = None, callback: SendCallback | None = None, *,
                    deliver_at: datetime.datetime | int | None = None, delay_ms: int | None = None,
                    delay_level: int | None = None, message_group: str | None = None) -> SendFuture:
        """Queue a message for a batched send without waiting (:meth:`gms.client.Producer.send_async`):
        the returned :class:`SendFuture` is done when the broker answers the message's batch;
        ``await`` it for the :class:`SendResult` (or the send's error), or read ``result()`` once
        ``done()`` (before, it would block the loop that answers it). Bad input raises here.
        ``callback(future)`` runs on the loop once the future is done; a coroutine function's
        coroutine is run as a task, which :meth:`flush` waits for.

        It never blocks, not even when unanswered messages fill ``buffer_bytes_max``: then
        ``await drain()`` (as with an asyncio stream's ``write``) before queueing more."""
        if self._runtime.closed:
            raise RuntimeError("the producer is closed")
        queued = self._unrouted.get(topic) if self._unrouted else None
        if (queued is None and callback is None and not keys and properties is None and queue is None
                and key is None and deliver_at is None and delay_ms is None and delay_level is None
                and message_group is None):
            try:  # as most are: into the topic's sticky batch, routed when it opens
                return self._accumulator.append_plain(topic, body, tag)
            except AwaitRequired:  # its routes are to be looked up first
                pass
        keys, properties, key = _keyed(keys, properties, key, message_group)
        future = self._queue_routed(queued, topic, body, tag, keys, properties, queue, key, deliver_at, delay_ms,
                                    delay_level)
        if callback is not None:
            future.add_done_callback(functools.partial(self._run_callback, callback))
        return future

    def _queue_routed(self, queued: list[_Deferred] | None, topic: str, body: bytes, tag: str | None,
                      keys: Sequence[str], properties: Mapping[str, str] | None, queue: int | None,
                      key: str | bytes | None, deliver_at: datetime.datetime | int | None, delay_ms: int | None,
                      delay_level: int | None) -> SendFuture:
        """:meth:`send_nowait` of a message to route here, or behind its topic's routes' lookup
        (``queued``: the messages waiting for it already)."""
        core = self._core
        if queued is None and core._runtime.routes.cached(topic) is not None:
            return core._append_routed(core._route(topic, queue, key), body, tag, keys, properties,
                                       deliver_at, delay_ms, delay_level)
        # The routes are to be looked up first: queued behind that, in order.
        core._encoder.topic(topic)
        outcome = _Outcome()  # the message's own, resolved as its batch is once it is in one

        def later(fallback: QueueRoute | None) -> SendFuture:
            route = fallback or core._route(topic, queue, key)
            return core._append_routed(route, body, tag, keys, properties, deliver_at, delay_ms, delay_level)

        if queued is None:
            queued = self._unrouted[topic] = []
            self._fast.enabled = False  # plain messages to it too queue behind the lookup, in order
            task = self._loop.create_task(self._route_then_send(topic, queue))
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)
        queued.append((later, outcome))
        return SendFuture(outcome, 0)

    def _run_callback(self, callback: SendCallback, future: SendFuture) -> None:
        """A :meth:`send_nowait` callback (on the loop); its coroutine, if any, as a task."""
        outcome = callback(future)
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(outcome)
            self._lookups.add(task)  # flush waits for it
            task.add_done_callback(self._lookups.discard)

    async def _route_then_send(self, topic: str, queue: int | None) -> None:
        """Look ``topic``'s routes up, then queue the messages that waited for them, in order."""
        try:
            found = await self._core._lookup(topic, queue)
        except BaseException as err:  # the messages' own error (cancelled: the loop shuts down)
            for _, outcome in self._unrouted.pop(topic):
                outcome.set_exception(err)
            self._fast.enabled = not self._unrouted and not self._runtime.closed
            if isinstance(err, Exception):
                return
            raise
        fallback = found if isinstance(found, QueueRoute) else None  # fixed brokers, the topic unknown to them
        for queue_it, outcome in self._unrouted.pop(topic):
            try:
                queue_it(fallback).add_done_callback(functools.partial(_copy, outcome))
            except Exception as err:  # noqa: BLE001 - bad input found late: the message's own error
                outcome.set_exception(err)
        self._fast.enabled = not self._unrouted and not self._runtime.closed

    async def send_oneway(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                          properties: Mapping[str, str] | None = None, queue: int | None = None,
                          key: str | bytes | None = None) -> None:
        """Send without waiting for (or getting) any acknowledgement (acks=0): returns once the
        request is written (:meth:`gms.client.Producer.send_oneway`)."""
        self._check_open()
        core = self._core
        keys, properties, key = _keyed(keys, properties, key)
        route = core._cached_route(topic, queue, key) or await core._route_async(topic, queue, key)
        await core._oneway(route, topic, body, tag, keys, properties, queue is None and key is None)

    async def drain(self) -> None:
        """Let the loop send what :meth:`send_nowait` queued, and wait while its unanswered
        messages fill ``buffer_bytes_max`` (call it every so many messages: a coroutine that
        never awaits keeps the loop from sending anything)."""
        await asyncio.sleep(0)
        await self._accumulator.room()

    async def flush(self) -> None:
        """Send everything queued by :meth:`send_nowait` and wait for the answers."""
        while self._lookups:
            await asyncio.gather(*list(self._lookups), return_exceptions=True)
        await self._accumulator.flush()

    def begin_transaction(self) -> AsyncTransaction:
        """A new transaction (:meth:`gms.client.Producer.begin_transaction`)."""
        return AsyncTransaction(self._core.begin_transaction())

    # --- lifetime ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._runtime.closed:
            raise RuntimeError("the producer is closed")

    async def aclose(self) -> None:
        """Flush, then close the connections. Idempotent."""
        if self._runtime.closed:
            return
        self._fast.enabled = False  # (then send_nowait refuses once the connections are closed)
        try:
            await self.flush()
        finally:
            if self._core._transactions is not None:
                self._core._transactions.close()
            await self._runtime.aclose()
            if self._trace is not None:
                await self._trace.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
