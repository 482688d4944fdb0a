"""The asyncio pop consumer: :class:`gms.client.SimpleConsumer`'s core (``PopClient``) on the
caller's loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Self, cast

from gms.client.aio._loop import running_loop
from gms.client.aio.producer import AsyncProducer
from gms.client.consumer_trace import ConsumerTrace
from gms.client.rebalance import StartFrom
from gms.client.retries import ensure_topic, group_settings, retry_delay_ms, retry_plan
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.simple_consumer import (
    AWAIT_DURATION_MS,
    INVISIBLE_DURATION_MS,
    Acknowledgeable,
    HandleColumns,
    PopClient,
    _handle_columns,
    _handles,
    checked_options,
    expired_error,
)
from gms.client.structs import PoppedMessage
from gms.client.subscriptions import Sql
from gms.client.tracing import TRACE_TOPIC, Connect, TraceDispatcher, now_us
from gms.cluster.model import GroupSettings
from gms.errors import ReceiptHandleExpiredError
from gms.naming import EXHAUSTED_REASON, dlq_topic
from gms.security.client import ClientSecurity

log = logging.getLogger(__name__)


class AsyncSimpleConsumer:
    """Receives messages of ``subscription`` as a member of ``group`` from asyncio code, each
    acknowledged on its own: :class:`gms.client.SimpleConsumer` on the caller's running loop
    (its options, errors and semantics; docs/pop.md). ``async with`` (or ``await start()``)
    first. Use it from one task at a time."""

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
        """As :class:`gms.client.SimpleConsumer`'s. ``trace``: the trace records are written by a
        task on the loop."""
        self._filters = checked_options(subscription, max_delivery_attempts, start_from)
        self._loop = running_loop("AsyncSimpleConsumer")
        self._group = group
        self._invisible_ms = invisible_duration_ms
        self._await_ms = await_duration_ms
        self._options = (max_delivery_attempts, retry_delays_ms, fifo, start_from)
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-simple-consumer", security=security, loop=self._loop)

        def make_producer() -> AsyncProducer:  # for the dead letters
            return AsyncProducer(brokers, nameserver=nameserver, security=security,
                                 request_timeout_ms=request_timeout_ms, acks=-1, retries=10)

        self._make_producer = make_producer
        self._dead_letters: AsyncProducer | None = None
        self._retry_delays_ms: tuple[int, ...] = ()
        self._pop: PopClient | None = None
        self._acks_on_the_way: set[asyncio.Task[None]] = set()
        self._trace = ConsumerTrace(TraceDispatcher(Connect(brokers, nameserver, security), trace_topic,
                                                    name="gms-simple-consumer-trace", loop=self._loop),
                                    group) if trace else None
        self._closed = False

    @property
    def group(self) -> str:
        return self._group

    async def start(self) -> None:
        """Read the group's settings (for the options not given). Idempotent."""
        self._check_open()
        if self._pop is not None:
            return
        max_delivery_attempts, retry_delays_ms, fifo, start_from = self._options
        settings = (await group_settings(self._runtime, self._group)
                    if None in (max_delivery_attempts, retry_delays_ms, fifo) else GroupSettings())
        self._retry_delays_ms = settings.retry_delays_ms if retry_delays_ms is None else tuple(retry_delays_ms)
        self._pop = PopClient.configured(self._runtime, self._group, self._filters, settings,
                                         max_delivery_attempts=max_delivery_attempts, start_from=start_from, fifo=fifo)

    async def _core(self) -> PopClient:
        if self._pop is None:
            await self.start()
        return cast(PopClient, self._pop)

    async def receive(self, max_messages: int = 32, invisible_duration_ms: int | None = None,
                      await_duration_ms: int | None = None) -> Sequence[PoppedMessage]:
        """:meth:`gms.client.SimpleConsumer.receive`: up to ``max_messages`` messages, waiting up to
        the await duration for the first; messages out of attempts go to the dead letters here."""
        self._check_open()
        core = await self._core()
        invisible_ms = self._invisible_ms if invisible_duration_ms is None else invisible_duration_ms
        await_ms = self._await_ms if await_duration_ms is None else await_duration_ms
        deadline = time.monotonic() + await_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            popped = await core.receive(max_messages, invisible_ms, left_ms)
            for message in popped.exhausted:
                await self.forward_to_dead_letters(cast(PoppedMessage, message), EXHAUSTED_REASON)
            if self._trace is not None:
                self._trace.received(popped.messages)
            if len(popped.messages) or not len(popped.exhausted) or time.monotonic() >= deadline:
                return cast(Sequence[PoppedMessage], popped.messages)

    async def __aiter__(self) -> AsyncIterator[PoppedMessage]:
        """Messages as they come, until the consumer is closed (acknowledge each)."""
        while not self._closed:
            for message in await self.receive():
                yield message

    async def ack(self, messages: Acknowledgeable | Iterable[Acknowledgeable]) -> None:
        """:meth:`gms.client.SimpleConsumer.ack`: ReceiptHandleExpiredError if a handle no longer
        holds (the others are acknowledged all the same)."""
        self._check_open()
        await self._ack(_handle_columns(messages))

    def ack_nowait(self, messages: Acknowledgeable | Iterable[Acknowledgeable]) -> asyncio.Future[None]:
        """:meth:`ack` without waiting (:meth:`gms.client.SimpleConsumer.ack_async`): the
        acknowledgement travels while the caller goes on; the returned future fails as
        :meth:`ack` would raise (bad input raises here). :meth:`aclose` waits for those still
        on their way."""
        self._check_open()
        task = self._loop.create_task(self._ack(_handle_columns(messages)))
        self._acks_on_the_way.add(task)
        task.add_done_callback(self._acks_on_the_way.discard)
        return task

    async def _ack(self, handles: HandleColumns) -> None:
        if not handles:
            return
        expired = await (await self._core()).ack(handles)
        if self._trace is not None:
            self._trace.acked_pop(handles, expired)
        if expired:
            raise expired_error(expired, sum(len(columns[0]) for columns in handles.values()))

    async def change_invisible_duration(self, message: Acknowledgeable, invisible_duration_ms: int) -> int:
        """Keep a message invisible for ``invisible_duration_ms`` from now (0: visible now);
        returns when it becomes visible (epoch ms)."""
        self._check_open()
        (handle,) = _handles([message])
        return await (await self._core()).change_invisible_duration(handle, invisible_duration_ms)

    async def nack(self, message: PoppedMessage, *, delay_ms: int | None = None) -> int:
        """Give ``message`` back to be handed out again after ``delay_ms`` (default: the retry
        backoff for its attempt). Returns when (epoch ms)."""
        await self._core()
        if delay_ms is None:
            delay_ms = retry_delay_ms(self._retry_delays_ms, message.delivery_attempt)
        visible_at = await self.change_invisible_duration(message, delay_ms)
        if self._trace is not None:
            self._trace.failed(message, message.topic, attempt=message.delivery_attempt, delay_ms=delay_ms)
        return visible_at

    async def forward_to_dead_letters(self, message: PoppedMessage, reason: str = "") -> str:
        """Move ``message`` to the group's dead-letter topic: stored there (acks=-1), then
        acknowledged here."""
        self._check_open()
        await self._core()
        topic, send = retry_plan(message, self._group, delay_ms=None, reason=reason or "forwarded",
                                 delays_ms=self._retry_delays_ms, max_reconsume_times=0,
                                 attempts=max(message.delivery_attempt, 1))
        assert topic == dlq_topic(self._group)
        await ensure_topic(self._runtime, topic)
        if self._dead_letters is None:
            self._dead_letters = self._make_producer()
        failed_us = now_us()
        copy = await self._dead_letters.send(topic, bytes(message.body), **send)
        if self._trace is not None:
            self._trace.failed_copy(message, topic, send, copy, failed_us)
        try:
            await self.ack(message)
        except ReceiptHandleExpiredError:
            log.info("%s went to %s but was handed out again meanwhile", message.receipt_handle, topic)
        return topic

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    async def aclose(self) -> None:
        """Wait for acknowledgements on their way, close the connections (messages in flight
        become visible again when their invisible duration ends). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._acks_on_the_way:
                await asyncio.wait(self._acks_on_the_way, timeout=self._runtime.request_timeout_ms / 1000)
            await self._runtime.aclose()
        finally:
            if self._dead_letters is not None:
                await self._dead_letters.aclose()
            if self._trace is not None:
                await self._trace.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
