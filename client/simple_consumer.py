"""Pop consumption: RocketMQ 5's SimpleConsumer (Kafka's share groups).

Any number of consumers of a group receive messages from any queue of the subscribed topics
(more consumers than queues is fine: nothing is assigned). A received message is invisible to
the group for its invisible duration; acknowledge it (:meth:`SimpleConsumer.ack`) or it is
handed out again, to any consumer of the group, with ``delivery_attempt`` one higher. Once it
was handed out ``max_delivery_attempts`` times it goes to the group's dead-letter topic instead.
The brokers keep what is in flight (docs/pop.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np

from gms.client.connections import msg_id_prefix
from gms.client.consumer_trace import ConsumerTrace
from gms.client.fetcher import LEADER_LOST_ERRORS, TopicQueue, leader_of
from gms.client.producer import Producer
from gms.client.rebalance import StartFrom
from gms.client.retries import ensure_topic, load_group_settings, retry_delay_ms, retry_plan
from gms.client.routing import LONG_POLL_LEADER_CHECK_INTERVAL_MS, leader_request
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import PopBatch, PoppedMessage, ReceiptHandle, ReceivedMessages
from gms.client.subscriptions import Sql, parse_subscription
from gms.client.tracing import TRACE_TOPIC, Connect, TraceDispatcher
from gms.cluster.model import GroupSettings
from gms.errors import GmsError, ReceiptHandleExpiredError, TopicNotFoundError
from gms.naming import EXHAUSTED_REASON, dlq_topic
from gms.protocol.codes import RequestCode
from gms.protocol.fields import OFFSET_ARRAY, QUEUE_ID_ARRAY, int_array
from gms.protocol.groups import ExpiredHandle
from gms.protocol.rows import decode
from gms.record import RecordCheck, read_field_offsets, scan_records
from gms.security.client import ClientSecurity
from gms.store_errors import CorruptRecord
from gms.tags import TagFilter

log = logging.getLogger(__name__)

INVISIBLE_DURATION_MS = 30_000
AWAIT_DURATION_MS = 5_000  # how long a receive waits for messages (a long poll)
ROUTE_RETRIES = 3  # re-routed attempts of an ack or a change after a leader moved


Acknowledgeable = PoppedMessage | ReceiptHandle | str  # a message, its receipt handle, or that as text


HandleColumns = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # topic -> queue ids, offsets, attempts


class Popped(NamedTuple):
    """One receive's messages: those to process, and those whose attempts ran out."""

    messages: ReceivedMessages
    exhausted: ReceivedMessages


class PopClient:
    """The asyncio core of :class:`SimpleConsumer` (runs on the runtime's loop)."""

    def __init__(self, runtime: ClientRuntime, group: str, subscription: Mapping[str, TagFilter], *,
                 max_delivery_attempts: int, start_from: StartFrom, fifo: bool) -> None:
        self.runtime = runtime
        self.group = group
        self.subscription = dict(subscription)
        self.max_delivery_attempts = max_delivery_attempts
        self.start_from = start_from
        self.fifo = fifo
        self._turn = 0

    @classmethod
    def configured(cls, runtime: ClientRuntime, group: str, subscription: Mapping[str, TagFilter],
                   settings: GroupSettings, *, max_delivery_attempts: int | None, start_from: StartFrom,
                   fifo: bool | None) -> PopClient:
        """The options given, the group's ``settings`` (gms group config) for the others."""
        return cls(runtime, group, subscription, start_from=start_from,
                   max_delivery_attempts=settings.max_delivery_attempts if max_delivery_attempts is None
                   else max_delivery_attempts, fifo=settings.fifo if fifo is None else fifo)

    async def _targets(self) -> list[tuple[str, str]]:
        """(topic, broker) for every broker leading a queue of a subscribed topic."""
        targets: list[tuple[str, str]] = []
        for topic in self.subscription:
            brokers = sorted({route.broker for route in await self.runtime.routes.routes(topic)})
            targets += [(topic, broker) for broker in brokers]
        return targets

    async def receive(self, max_messages: int, invisible_ms: int, await_ms: int) -> Popped:
        """Pop from the brokers in turn: each once without waiting, then wait on the next one."""
        targets = await self._targets()
        start = self._turn
        self._turn += 1
        last_error: GmsError | None = None
        for i in range(len(targets)):
            topic, broker = targets[(start + i) % len(targets)]
            wait_ms = await_ms if i == len(targets) - 1 else 0
            try:
                popped = await self._pop(topic, broker, max_messages, invisible_ms, wait_ms)
            except (GmsError, CorruptRecord) as err:
                if isinstance(err, (*LEADER_LOST_ERRORS, TopicNotFoundError)):
                    self.runtime.routes.invalidate()
                log.debug("pop from %s at %s failed: %r", topic, broker, err)
                if isinstance(err, TopicNotFoundError):
                    # Routed there but not applied there yet (created a moment ago): the next
                    # receive asks the nameservers again, which say so if it was deleted.
                    continue
                last_error = err if isinstance(err, GmsError) else None
                continue
            if len(popped.messages) or len(popped.exhausted):
                return popped
        if last_error is not None and not getattr(last_error, "retriable", False):
            raise last_error
        return Popped(ReceivedMessages(), ReceivedMessages())

    async def _pop(self, topic: str, broker: str, max_messages: int, invisible_ms: int, wait_ms: int) -> Popped:
        fields: dict[str, Any] = {
            "group": self.group, "topic": topic, "tags": self.subscription[topic].expression, "max_msgs": max_messages,
            "invisible_ms": invisible_ms, "poll_ms": wait_ms, "max_attempts": self.max_delivery_attempts,
            "start": self.start_from, "fifo": self.fifo}
        if self.subscription[topic].sql:
            fields["sql"] = self.subscription[topic].sql
        # Given up once ``broker`` leads no queue of the topic any more (it lost its lease).
        frame = await leader_request(self.runtime.routes, self.runtime.pool, topic, None, broker,
                                     RequestCode.POP_MESSAGE, fields,
                                     timeout_ms=wait_ms + self.runtime.request_timeout_ms,
                                     check_interval_ms=LONG_POLL_LEADER_CHECK_INTERVAL_MS)
        body = frame.body
        if not body:
            return Popped(ReceivedMessages(), ReceivedMessages())
        body = memoryview(body)
        scan = scan_records(body, verify_crc=not frame.fields.get("crc_checked", False))
        if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
            raise CorruptRecord(scan.stop_pos, f"pop response holds {scan.stop.value} data")
        batch = PopBatch(body, scan.starts, msg_id_prefix(broker), read_field_offsets(body, scan.starts),
                         frame.fields.get("attempts", []))
        exhausted, messages = ReceivedMessages([batch]).split(int(frame.fields.get("exhausted", 0)))
        return Popped(messages, exhausted)

    async def ack(self, handles: HandleColumns) -> list[ReceiptHandle]:
        """Acknowledge deliveries ({topic: (queue ids, offsets, attempts)}); the handles that
        no longer held."""
        expired: list[ReceiptHandle] = []
        for topic, (queue_ids, offsets, attempts) in handles.items():
            pending = np.ones(len(queue_ids), bool)
            for attempt in range(ROUTE_RETRIES + 1):
                by_broker: dict[str, np.ndarray] = {}
                for queue_id in np.unique(queue_ids[pending]).tolist():
                    broker = await leader_of(self.runtime.routes, TopicQueue(topic, queue_id))
                    mine = pending & (queue_ids == queue_id)
                    by_broker[broker] = by_broker[broker] | mine if broker in by_broker else mine
                for broker, mine in by_broker.items():
                    try:
                        stale = await self._ack(topic, broker, queue_ids[mine], offsets[mine], attempts[mine])
                    except LEADER_LOST_ERRORS:
                        if attempt == ROUTE_RETRIES:
                            raise
                        self.runtime.routes.invalidate()
                        continue
                    pending &= ~mine
                    expired += stale
                if not pending.any():
                    break
        return expired

    async def _ack(self, topic: str, broker: str, queue_ids: np.ndarray, offsets: np.ndarray,
                   attempts: np.ndarray) -> list[ReceiptHandle]:
        frame = await leader_request(self.runtime.routes, self.runtime.pool, topic, int(queue_ids[0]), broker,
                                     RequestCode.ACK_MESSAGE, {
            "group": self.group, "topic": topic, "queue_ids": int_array(queue_ids, QUEUE_ID_ARRAY),
            "offsets": int_array(offsets, OFFSET_ARRAY), "attempts": int_array(attempts, QUEUE_ID_ARRAY)})
        expired = {decode(ExpiredHandle, row, "expired") for row in frame.fields.get("expired", [])}
        if not expired:
            return []
        return [ReceiptHandle(topic, q, o, a) for q, o, a in zip(queue_ids.tolist(), offsets.tolist(),
                                                                 attempts.tolist(), strict=True) if (q, o) in expired]

    async def change_invisible_duration(self, handle: ReceiptHandle, invisible_ms: int) -> int:
        """Make the delivery visible again ``invisible_ms`` from now; when (epoch ms)."""
        fields = {"group": self.group, "topic": handle.topic, "queue_id": handle.queue_id, "offset": handle.offset,
                  "attempt": handle.attempt, "invisible_ms": invisible_ms}
        for attempt in range(ROUTE_RETRIES + 1):
            broker = await leader_of(self.runtime.routes, TopicQueue(handle.topic, handle.queue_id))
            try:
                frame = await leader_request(self.runtime.routes, self.runtime.pool, handle.topic, handle.queue_id,
                                             broker, RequestCode.CHANGE_INVISIBLE_DURATION, fields)
                return int(frame.fields["visible_at"])
            except LEADER_LOST_ERRORS:
                if attempt == ROUTE_RETRIES:
                    raise
                self.runtime.routes.invalidate()
        raise AssertionError("unreachable")


class SimpleConsumer:
    """Receives messages of ``subscription`` ({topic: tag expression or ``Sql(...)``}) as a member of ``group``,
    acknowledging each on its own. Use from one thread.

    ``invisible_duration_ms``: how long a received message stays hidden from the group (default
    30 s) unless acknowledged; ``await_duration_ms``: how long :meth:`receive` waits for messages
    (default 5 s); ``max_delivery_attempts``: deliveries before a message goes to the group's
    dead-letter topic ``%DLQ%<group>`` (default: the group's settings, ``gms group config``,
    else 17: RocketMQ's 16 retries); ``retry_delays_ms``: :meth:`nack`'s backoff (the same);
    ``start_from``: where a new group starts on each queue ("last", "first" or a timestamp in ms);
    ``fifo`` (default: the group's settings): a queue's messages — each message group's — are
    handed out one batch at a time, in order: the next only once the previous ones were
    acknowledged (or went to the dead letters).
    """

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
        *,
        nameserver: Sequence[str] | str | None = None,
        group: str,
        subscription: Mapping[str, str | Sql],
        invisible_duration_ms: int = INVISIBLE_DURATION_MS,
        await_duration_ms: int = AWAIT_DURATION_MS,
        max_delivery_attempts: int | None = None,
        start_from: StartFrom = "last",
        retry_delays_ms: Sequence[int] | None = None,
        fifo: bool | None = None,
        request_timeout_ms: float = REQUEST_TIMEOUT_MS,
        security: ClientSecurity | None = None,
        trace: bool = False,
        trace_topic: str = TRACE_TOPIC,
    ) -> None:
        """``trace``: record deliveries, acks, retries and dead letters in ``trace_topic``
        (``gms msg trace``, docs/traces.md)."""
        filters = checked_options(subscription, max_delivery_attempts, start_from)
        self._group = group
        self._invisible_ms = invisible_duration_ms
        self._await_ms = await_duration_ms
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-simple-consumer", security=security)
        # What was not given comes from the group's settings (gms group config), else the defaults.
        settings = (load_group_settings(self._runtime, group) if None in (max_delivery_attempts, retry_delays_ms, fifo)
                    else GroupSettings())
        self._retry_delays_ms = settings.retry_delays_ms if retry_delays_ms is None else tuple(retry_delays_ms)
        self._core = PopClient.configured(self._runtime, group, filters, settings, start_from=start_from,
                                          max_delivery_attempts=max_delivery_attempts, fifo=fifo)
        self._dead_letters: Producer | None = None
        self._acks_on_the_way: set[Future[None]] = set()
        self._make_producer = lambda: Producer(brokers, nameserver=nameserver, security=security,
                                               request_timeout_ms=request_timeout_ms, acks=-1, retries=10)
        self._trace = ConsumerTrace(TraceDispatcher(Connect(brokers, nameserver, security), trace_topic,
                                                    name="gms-simple-consumer-trace"), group) if trace else None
        self._closed = False

    @property
    def group(self) -> str:
        return self._group

    def receive(self, max_messages: int = 32, invisible_duration_ms: int | None = None,
                await_duration_ms: int | None = None) -> Sequence[PoppedMessage]:
        """Up to ``max_messages`` messages (a :class:`ReceivedMessages` of :class:`PoppedMessage`:
        acknowledge it whole, the fastest way, or message by message), waiting up to the await
        duration for the first; each stays invisible to the group for ``invisible_duration_ms``.
        Messages handed out ``max_delivery_attempts`` times go to the dead-letter topic here
        instead of being returned."""
        self._check_open()
        invisible_ms = self._invisible_ms if invisible_duration_ms is None else invisible_duration_ms
        await_ms = self._await_ms if await_duration_ms is None else await_duration_ms
        deadline = time.monotonic() + await_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            popped = self._runtime.run(self._core.receive(max_messages, invisible_ms, left_ms),
                                       left_ms + self._runtime.request_timeout_ms)
            for message in popped.exhausted:
                self.forward_to_dead_letters(cast(PoppedMessage, message), EXHAUSTED_REASON)
            if self._trace is not None:
                self._trace.received(popped.messages)
            if len(popped.messages) or not len(popped.exhausted) or time.monotonic() >= deadline:
                return cast(Sequence[PoppedMessage], popped.messages)  # a ReceivedMessages of PopBatches

    def __iter__(self) -> Any:
        """Messages as they come, until the consumer is closed (acknowledge each)."""
        while not self._closed:
            yield from self.receive()

    def ack(self, messages: Acknowledgeable | Iterable[Acknowledgeable]) -> None:
        """Acknowledge a message (or many; or their receipt handles): it is done for the group.
        ReceiptHandleExpiredError if a handle no longer holds (its invisible duration ended and
        it was handed out again: that delivery is the one to acknowledge); the others are
        acknowledged all the same."""
        self.ack_async(messages).result()

    def ack_async(self, messages: Acknowledgeable | Iterable[Acknowledgeable]) -> Future[None]:
        """:meth:`ack` without waiting: the acknowledgement travels while the application goes
        on (the next :meth:`receive` included); the future fails as :meth:`ack` would raise.
        :meth:`close` waits for those still on their way."""
        self._check_open()
        handles = _handle_columns(messages)
        future: Future[None] = Future()
        if not handles:
            future.set_result(None)
            return future
        count = sum(len(columns[0]) for columns in handles.values())
        self._acks_on_the_way.add(future)
        sent = asyncio.run_coroutine_threadsafe(self._core.ack(handles), self._runtime.loop)
        sent.add_done_callback(lambda done: self._acked(done, future, count))
        if self._trace is not None:
            sent.add_done_callback(partial(self._trace.acked_handles, handles))
        return future

    def _acked(self, done: Future[list[ReceiptHandle]], future: Future[None], count: int) -> None:
        self._acks_on_the_way.discard(future)
        error = done.exception()
        if error is not None:
            future.set_exception(error)
        elif expired := done.result():
            future.set_exception(expired_error(expired, count))
        else:
            future.set_result(None)

    def change_invisible_duration(self, message: Acknowledgeable, invisible_duration_ms: int) -> int:
        """Keep a message invisible for ``invisible_duration_ms`` from now (longer processing),
        or make it visible sooner (0: now). Returns when it becomes visible (epoch ms)."""
        self._check_open()
        (handle,) = _handles([message])
        return self._runtime.run(self._core.change_invisible_duration(handle, invisible_duration_ms))

    def nack(self, message: PoppedMessage, *, delay_ms: int | None = None) -> int:
        """Give ``message`` back to be handed out again after ``delay_ms`` (default: the retry
        backoff for its attempt, 10 s, 30 s, 1 m ...). Returns when (epoch ms)."""
        if delay_ms is None:
            delay_ms = retry_delay_ms(self._retry_delays_ms, message.delivery_attempt)
        visible_at = self.change_invisible_duration(message, delay_ms)
        if self._trace is not None:
            self._trace.failed(message, message.topic, attempt=message.delivery_attempt, delay_ms=delay_ms)
        return visible_at

    def forward_to_dead_letters(self, message: PoppedMessage, reason: str = "") -> str:
        """Move ``message`` to the group's dead-letter topic (RocketMQ 5's
        ForwardMessageToDeadLetterQueue): stored there (acks=-1), then acknowledged here."""
        self._check_open()
        topic, send = retry_plan(message, self._group, delay_ms=None, reason=reason or "forwarded",
                                 delays_ms=self._retry_delays_ms, max_reconsume_times=0,
                                 attempts=max(message.delivery_attempt, 1))
        assert topic == dlq_topic(self._group)
        self._runtime.run(ensure_topic(self._runtime, topic))
        if self._dead_letters is None:
            self._dead_letters = self._make_producer()
        failed_us = time.time_ns() // 1000
        copy = self._dead_letters.send(topic, bytes(message.body), **send)
        if self._trace is not None:
            self._trace.failed_copy(message, topic, send, copy, failed_us)
        try:
            self.ack(message)
        except ReceiptHandleExpiredError:
            log.info("%s went to %s but was handed out again meanwhile", message.receipt_handle, topic)
        return topic

    def close(self) -> None:
        """Wait for acknowledgements on their way, close the connections (messages in flight
        become visible again when their invisible duration ends). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            futures_wait(list(self._acks_on_the_way), timeout=self._runtime.request_timeout_ms / 1000)
            self._runtime.close()
        finally:
            if self._dead_letters is not None:
                self._dead_letters.close()
            if self._trace is not None:
                self._trace.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def checked_options(subscription: Mapping[str, str | Sql], max_delivery_attempts: int | None,
                    start_from: StartFrom) -> dict[str, TagFilter]:
    """The subscription's filters, once the options are found valid (ValueError otherwise)."""
    if not subscription:
        raise ValueError("subscribe to at least one topic")
    if max_delivery_attempts is not None and max_delivery_attempts < 1:
        raise ValueError("max_delivery_attempts must be >= 1")
    if start_from not in ("first", "last") and (isinstance(start_from, bool) or not isinstance(start_from, int)):
        raise ValueError(f"start_from must be 'first', 'last' or a timestamp in ms, not {start_from!r}")
    return parse_subscription(subscription)  # a bad filter fails now rather than at the first receive


def expired_error(expired: Sequence[ReceiptHandle], count: int) -> ReceiptHandleExpiredError:
    """What an acknowledgement of ``count`` handles raises when ``expired`` of them no longer hold."""
    return ReceiptHandleExpiredError(
        f"{len(expired)} of {count} receipt handle(s) no longer hold (handed out again, or unknown"
        f" to the queue's leader): {', '.join(map(str, expired[:5]))}{' ...' if len(expired) > 5 else ''}",
        fields={"expired": [str(h) for h in expired]})


def _handles(items: Acknowledgeable | Iterable[Acknowledgeable]) -> list[ReceiptHandle]:
    if isinstance(items, (PoppedMessage, ReceiptHandle, str)):
        items = [items]
    handles = []
    for item in items:
        if isinstance(item, PoppedMessage):
            handles.append(item.receipt_handle)
        elif isinstance(item, ReceiptHandle):
            handles.append(item)
        elif isinstance(item, str):
            handles.append(ReceiptHandle.parse(item))
        else:
            raise TypeError(f"acknowledge PoppedMessage or receipt handles, not {type(item).__name__}")
    return handles


def _handle_columns(items: Acknowledgeable | Iterable[Acknowledgeable]) -> HandleColumns:
    """The receipt handles of ``items`` as columns per topic: straight from the received
    batches for what :meth:`SimpleConsumer.receive` returned, one by one otherwise."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    if isinstance(items, ReceivedMessages) and all(isinstance(b, PopBatch) for b, _, _ in items.parts()):
        for batch, start, stop in items.parts():
            topics, queue_ids, offsets, attempts = cast(PopBatch, batch).handle_columns(start, stop)
            if isinstance(topics, str):
                parts.setdefault(topics, []).append((queue_ids, offsets, attempts))
                continue
            named = np.array(topics, object)
            for topic in dict.fromkeys(topics):
                mine = named == topic
                parts.setdefault(topic, []).append((queue_ids[mine], offsets[mine], attempts[mine]))
    else:
        by_topic: dict[str, list[ReceiptHandle]] = {}
        for handle in _handles(items):
            by_topic.setdefault(handle.topic, []).append(handle)
        for topic, handles in by_topic.items():
            queue_ids, offsets, attempts = (np.array(column, np.int64) for column in zip(*(h[1:] for h in handles),
                                                                                      strict=True))
            parts[topic] = [(queue_ids, offsets, attempts)]
    return {topic: (np.concatenate([c[0] for c in columns]), np.concatenate([c[1] for c in columns]),
                    np.concatenate([c[2] for c in columns])) for topic, columns in parts.items()}
