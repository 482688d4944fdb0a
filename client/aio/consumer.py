"""The asyncio consumer: :class:`gms.client.Consumer`'s core driven from the caller's loop."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Self

from gms.client.aio._loop import running_loop
from gms.client.aio.producer import AsyncProducer
from gms.client.consumer import ITER_POLL_MS, LONG_POLL_MS, MODES, Attached, Consumer, DamagedCallback, prepare
from gms.client.fetcher import QueueState, TopicQueue
from gms.client.local_offsets import DEFAULT_OFFSET_DIR
from gms.client.rebalance import RebalanceEvent, StartFrom
from gms.client.retries import ensure_topic
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import ReceivedMessage, ReceivedMessages
from gms.client.subscriptions import Sql
from gms.client.tracing import TRACE_TOPIC
from gms.errors import GmsError
from gms.naming import group_of_topic, retry_topic
from gms.security.client import ClientSecurity

# on_assigned / on_revoked: a function or a coroutine function of the queues.
AsyncRebalanceCallback = Callable[[list[TopicQueue]], Awaitable[None] | None]
# listen's listener: a function or a coroutine function of each message.
AsyncListener = Callable[[ReceivedMessage], object]

log = logging.getLogger(__name__)


class AsyncConsumer:
    """Reads subscribed topics as a member of ``group`` from asyncio code:
    :class:`gms.client.Consumer` on the caller's running loop.

    The options, errors and semantics are the synchronous consumer's (docs/consumer-groups.md):
    ``async with AsyncConsumer(...) as consumer`` joins the group (or ``await start()``), then
    ``async for message in consumer`` or ``await poll()``. ``on_assigned`` / ``on_revoked`` may be
    coroutine functions; they are awaited inside :meth:`poll`, as the sync consumer calls its own.
    Use it from one task at a time."""

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
        *,
        nameserver: Sequence[str] | str | None = None,
        group: str,
        subscription: Mapping[str, str | Sql],
        mode: str = "clustering",
        start_from: StartFrom = "last",
        auto_commit: bool = True,
        auto_commit_interval_ms: float = 1000,
        heartbeat_interval_ms: float | None = None,
        max_poll_messages: int = 1024,
        fetch_max_messages: int = 4096,
        fetch_max_bytes: int = 1024 * 1024,
        long_poll_ms: int = LONG_POLL_MS,
        request_timeout_ms: float = REQUEST_TIMEOUT_MS,
        on_assigned: AsyncRebalanceCallback | None = None,
        on_revoked: AsyncRebalanceCallback | None = None,
        on_damaged: DamagedCallback | None = None,
        damaged: str = "skip",
        instance_name: str | None = None,
        offset_dir: Path | str = DEFAULT_OFFSET_DIR,
        security: ClientSecurity | None = None,
        max_reconsume_times: int | None = None,
        retry_delays_ms: Sequence[int] | None = None,
        fifo: bool | None = None,
        trace: bool = False,
        trace_topic: str = TRACE_TOPIC,
    ) -> None:
        """As :class:`gms.client.Consumer`'s; nothing connects before :meth:`start`. ``trace``:
        the trace records are written by a task on the loop."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self._loop = running_loop("AsyncConsumer")
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

        self._make = partial(  # the core, once joined: make(_attached=...)
            Consumer, brokers, nameserver=nameserver, group=group, subscription=subscription, mode=mode,
            start_from=start_from, auto_commit=auto_commit, auto_commit_interval_ms=auto_commit_interval_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, max_poll_messages=max_poll_messages,
            fetch_max_messages=fetch_max_messages, fetch_max_bytes=fetch_max_bytes, long_poll_ms=long_poll_ms,
            request_timeout_ms=request_timeout_ms, on_damaged=on_damaged, damaged=damaged,
            instance_name=instance_name, offset_dir=offset_dir, security=security,
            max_reconsume_times=max_reconsume_times, retry_delays_ms=retry_delays_ms, fifo=fifo,
            trace=trace, trace_topic=trace_topic)
        self._connect = partial(ClientRuntime, brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                name="gms-consumer", security=security, loop=self._loop)
        self._make_retry_producer = partial(AsyncProducer, brokers, nameserver=nameserver, security=security,
                                            request_timeout_ms=request_timeout_ms, acks=-1, retries=10)  # nack's copies
        self._retry_producer: AsyncProducer | None = None
        self._group = group
        self._clustering = mode == "clustering"
        self._need_settings = None in (max_reconsume_times, retry_delays_ms, fifo)
        self._core: Consumer | None = None
        self._events: list[RebalanceEvent] = []  # taken from the membership, not handled yet
        self._closed = False

    async def start(self) -> None:
        """Join the group (its coordinator assigns queues from the next polls on). Idempotent."""
        if self._core is not None:
            return
        if self._closed:
            raise RuntimeError("the consumer is closed")
        runtime = self._connect()
        core = None
        try:
            settings, retry_topic_ready = await prepare(runtime, self._group, clustering=self._clustering,
                                                        need_settings=self._need_settings)
            core = self._make(_attached=Attached(runtime, settings, retry_topic_ready))
            await core._membership.start()
        except BaseException:
            await runtime.aclose()
            if core is not None and core._trace is not None:
                await core._trace.aclose()
            raise
        self._core = core

    @property
    def _c(self) -> Consumer:
        if self._core is None:
            raise RuntimeError("the consumer is closed" if self._closed else "start() the consumer first")
        return self._core

    @property
    def member(self) -> str:
        return self._c.member

    def assignment(self) -> list[TopicQueue]:
        """:meth:`gms.client.Consumer.assignment`."""
        return self._c.assignment()

    def paused(self) -> list[TopicQueue]:
        """The assigned queues paused now."""
        return self._c.paused()

    def position(self, topic: str, queue_id: int) -> int | None:
        """The offset of the next message :meth:`poll` returns from the queue (None until known)."""
        return self._c.position(topic, queue_id)

    @property
    def damaged_count(self) -> int:
        return self._c.damaged_count

    # --- polling -------------------------------------------------------------------------------

    async def poll(self, timeout_ms: float = ITER_POLL_MS) -> ReceivedMessages:
        """The next messages (up to ``max_poll_messages``), waiting up to ``timeout_ms`` for some
        (:meth:`gms.client.Consumer.poll`)."""
        core = self._c
        core._check_open()
        if core._pending_damaged is not None:
            error, core._pending_damaged = core._pending_damaged, None
            raise error
        await self._handle_rebalance(core)
        if core._held:  # once begun, runs to its end (a queue unpaused is restarted)
            await asyncio.shield(core._release_held())
        if core._auto_commit_s is not None and time.monotonic() - core._last_commit >= core._auto_commit_s:
            core._commit_in_background()
        await core._buffer.wait(core._poll_wait_ms(timeout_ms) / 1000)
        return core._deliver(core._buffer.take(core._max_poll_messages, 0))

    async def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        while not self._closed:
            for message in await self.poll(ITER_POLL_MS):
                yield message

    # --- failed messages -----------------------------------------------------------------------

    async def listen(self, listener: AsyncListener, *, stop: Callable[[], bool] = lambda: False) -> None:
        """:meth:`gms.client.Consumer.listen`: hand every message to ``listener`` (a function or
        a coroutine function, awaited before the next message) until ``stop()`` is true (checked
        between polls) or the consumer is closed; a listener that raises nacks its message with
        the exception as the reason, and the next message follows."""
        while not self._closed and not stop():
            for message in await self.poll(ITER_POLL_MS):
                if self.held(message):
                    continue
                try:
                    outcome = listener(message)
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception as err:  # noqa: BLE001 - the application's failure, handed to nack
                    log.debug("listener failed %s: %r", message.msg_id, err)
                    await self.nack(message, reason=f"{type(err).__name__}: {err}")

    async def nack(self, message: ReceivedMessage, *, delay_ms: int | None = None, reason: str = "") -> str:
        """:meth:`gms.client.Consumer.nack`: redeliver ``message`` to the group after ``delay_ms``
        (FIFO: hold its queue back), or send it to the dead letters once out of retries; returns
        the topic it went to, once the copy is stored."""
        core = self._c
        copy = core._retry_copy(message, delay_ms, reason)
        if copy is None:
            return await core._hold(message, delay_ms)
        topic, send = copy
        if topic != retry_topic(self._group):
            await ensure_topic(core._runtime, topic)
        if self._retry_producer is None:
            self._retry_producer = self._make_retry_producer()
        failed_us = time.time_ns() // 1000
        sent = await self._retry_producer.send(topic, bytes(message.body), **send)
        if core._trace is not None:
            core._trace.failed_copy(message, topic, send, sent, failed_us)
        return topic

    def held(self, message: ReceivedMessage) -> bool:
        """FIFO: whether ``message`` is held back (:meth:`gms.client.Consumer.held`): skip it."""
        return self._c.held(message)

    async def _handle_rebalance(self, core: Consumer) -> None:
        """:meth:`gms.client.Consumer._handle_rebalance`, awaiting what it runs. An event leaves
        the line once handled: a poll cancelled meanwhile leaves it to the next poll (which may
        run its callback again), and a release once begun runs to its end."""
        self._events += core._membership.take_events()
        while self._events:
            event = self._events[0]
            subscribed = [q for q in event.queues if group_of_topic(q.topic) is None]
            if event.assigned:
                if self._on_assigned is not None and subscribed:
                    await _call(self._on_assigned, subscribed)
                del self._events[0]
                continue
            core._buffer.drop(lambda chunk: chunk.state.revoked)
            if not event.lost and core._auto_commit_s is not None:
                await self._auto_commit(core, [s for q in event.queues if (s := core._membership.states.get(q))])
            if self._on_revoked is not None and subscribed:
                await _call(self._on_revoked, subscribed)
            del self._events[0]
            await asyncio.shield(core._membership.release(event.queues))

    # --- offsets -------------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """:meth:`gms.client.Consumer.commit`: ``offsets`` ({(topic, queue_id): next offset}), or
        the position after every message returned so far."""
        core = self._c
        core._check_open()
        explicit = (core._uncommitted(core._membership.states.values()) if offsets is None
                    else {TopicQueue(*queue): offset for queue, offset in offsets.items()})
        if explicit:
            await core._membership.commit(explicit)
            core._committed(explicit)

    async def _auto_commit(self, core: Consumer, states: list[QueueState]) -> None:
        offsets = core._uncommitted(states)
        try:
            if offsets:
                await core._membership.commit(offsets)
                core._committed(offsets)
        except GmsError as err:
            core._commit_outage.failed(repr(err))
        else:
            core._commit_outage.recovered()

    async def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Make the next :meth:`poll` read the queue from ``offset`` (an assigned queue)."""
        core = self._c
        await core._membership.restart(core._state(topic, queue_id), offset)

    async def seek_to_beginning(self, queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Seek ``queues`` (default: every assigned queue) to their first offset."""
        await self._seek_to("first", queues)

    async def seek_to_end(self, queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Seek ``queues`` (default: every assigned queue) past their last message."""
        await self._seek_to("last", queues)

    async def _seek_to(self, where: str, queues: Iterable[tuple[str, int]] | None) -> None:
        core = self._c
        for queue in core.assignment() if queues is None else [TopicQueue(*q) for q in queues]:
            state = core._state(*queue)
            await core._membership.restart(state, await core._membership.query_offset(queue, where))

    # --- flow control ----------------------------------------------------------------------------

    async def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """Stop fetching ``queues`` until :meth:`resume` (they stay assigned)."""
        await self._set_paused(queues, True)

    async def resume(self, queues: Iterable[tuple[str, int]]) -> None:
        """Fetch paused ``queues`` again from where :meth:`poll` left them."""
        await self._set_paused(queues, False)

    async def _set_paused(self, queues: Iterable[tuple[str, int]], paused: bool) -> None:
        core = self._c
        for queue in queues:
            state = core._state(*queue)
            if state.paused != paused:
                state.paused = paused
                await core._membership.restart(state, state.position)

    # --- lifetime --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Commit (with ``auto_commit``), leave the group and close the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        core, self._core = self._core, None
        if core is None:
            return
        try:
            await core._membership.stop()
            await core._fetcher.close()
            core._membership.take_events()
            if core._auto_commit_s is not None:
                await self._auto_commit(core, list(core._membership.states.values()))
            await core._membership.unregister()
        finally:
            core._closed = True
            await core._runtime.aclose()
            if self._retry_producer is not None:
                await self._retry_producer.aclose()
            if core._trace is not None:
                await core._trace.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _call(callback: AsyncRebalanceCallback, queues: list[TopicQueue]) -> None:
    """Run a rebalance callback, awaiting it if it is a coroutine function (or returns an awaitable)."""
    outcome = callback(queues)
    if inspect.isawaitable(outcome):
        await outcome
