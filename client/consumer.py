"""The consumer: ``poll`` / iteration over subscribed topics, commits, seeks, pauses, group
membership.

Like Kafka's consumer, group work that must be ordered with the application's processing
happens inside :meth:`Consumer.poll`: messages returned by earlier polls count as processed,
so a revoked queue's position is committed there (with ``auto_commit``), ``on_revoked`` runs,
its buffered messages are dropped and the queue is released before the coordinator may hand it
to another member; ``on_assigned`` runs there too. Delivery is at-least-once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

from gms.client.consumer_trace import ConsumerTrace
from gms.client.fetch_buffer import Chunk, FetchBuffer, received
from gms.client.fetcher import Fetcher, Permits, QueueState, TopicQueue
from gms.client.local_offsets import DEFAULT_OFFSET_DIR, LocalOffsetStore
from gms.client.producer import Producer
from gms.client.rebalance import Membership, StartFrom
from gms.client.retries import ensure_topic, group_settings, retry_plan
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import DamagedRecord, DamagedRecordError, ReceivedMessage, ReceivedMessages
from gms.client.subscriptions import Sql, parse_subscription
from gms.client.tracing import TRACE_TOPIC, Connect, TraceDispatcher
from gms.cluster.model import GroupSettings
from gms.errors import ForbiddenError, GmsError, UnauthenticatedError
from gms.log_throttle import Outage
from gms.naming import group_of_topic, retry_topic
from gms.security.client import ClientSecurity
from gms.tags import TagFilter, parse_tag_expression

log = logging.getLogger(__name__)

MODES = ("clustering", "broadcasting")
LONG_POLL_MS = 5000
ITER_POLL_MS = 1000
FIFO_RETRY_DELAY_MS = 1000  # a FIFO queue waits this long after a failure (RocketMQ's suspend time)

DAMAGED_MODES = ("skip", "raise")

RebalanceCallback = Callable[[list[TopicQueue]], None]
DamagedCallback = Callable[[DamagedRecord], None]


class Attached(NamedTuple):
    """What an asyncio consumer (gms.client.aio) prepared on its loop (:func:`prepare`) for the
    :class:`Consumer` core it drives."""

    runtime: ClientRuntime
    settings: GroupSettings
    retry_topic_ready: bool


async def prepare(runtime: ClientRuntime, group: str, *, clustering: bool,
                  need_settings: bool) -> tuple[GroupSettings, bool]:
    """A consumer's I/O before it joins: the group's settings (when some option was not given) and
    whether its retry topic exists (clustering: nacked messages come back through it)."""
    settings = await group_settings(runtime, group) if clustering and need_settings else GroupSettings()
    if not clustering:
        return settings, False
    try:
        await ensure_topic(runtime, retry_topic(group))
    except (ForbiddenError, UnauthenticatedError):
        raise
    except GmsError as err:  # reading still works; nack says so again when it is needed
        log.warning("group %s: cannot create its retry topic %s (%s); nacked messages will not come back"
                    " to this consumer", group, retry_topic(group), err)
        return settings, False
    return settings, True


def _check_options(mode: str, start_from: StartFrom, subscription: Mapping[str, str | Sql], damaged: str,
                   fifo: bool | None, max_reconsume_times: int | None, retry_delays_ms: Sequence[int] | None) -> None:
    """ValueError for a :class:`Consumer` option out of its range."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if start_from not in ("first", "last") and (isinstance(start_from, bool) or not isinstance(start_from, int)):
        raise ValueError(f"start_from must be 'first', 'last' or a timestamp in ms, not {start_from!r}")
    if not subscription:
        raise ValueError("subscribe to at least one topic")
    if damaged not in DAMAGED_MODES:
        raise ValueError(f"damaged must be one of {DAMAGED_MODES}, not {damaged!r}")
    if (max_reconsume_times is not None and max_reconsume_times < 0) or (
            retry_delays_ms is not None and (not retry_delays_ms or min(retry_delays_ms) < 0)):
        raise ValueError("max_reconsume_times must be >= 0 and retry_delays_ms non-empty and >= 0")
    if fifo and mode != "clustering":
        raise ValueError("fifo needs a clustering consumer group")


def _connect(brokers: Sequence[str] | str | None, nameserver: Sequence[str] | str | None, request_timeout_ms: float,
             security: ClientSecurity | None, group: str, *, clustering: bool, need_settings: bool) -> Attached:
    """A loop thread of its own for a :class:`Consumer`, and what it needs before it joins
    (:func:`prepare`)."""
    runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                            name="gms-consumer", security=security)
    try:
        return Attached(runtime, *runtime.run(prepare(runtime, group, clustering=clustering,
                                                      need_settings=need_settings)))
    except BaseException:
        runtime.close()
        raise


class Consumer:
    """Reads subscribed topics as a member of ``group``. Use from one thread.

    Routes come from ``nameserver="host:9876[,...]"`` or a fixed ``brokers`` list. The group's
    coordinator (one broker) assigns each clustering member its share of every subscribed
    queue on every broker. Broadcasting members read every queue and keep their offsets in a
    file of their own, ``<offset_dir>/<group>/<instance_name>.json`` (give each consumer process
    on a host its own ``instance_name``).

    ``on_assigned(queues)`` / ``on_revoked(queues)`` run inside :meth:`poll` when queues are
    given to / taken from this consumer (revoked queues may still be committed there).

    A record the broker finds damaged (its CRC fails) is never delivered as a message. With
    ``damaged="skip"`` (default) :meth:`poll` passes it: it is logged, counted
    (:attr:`damaged_count`) and handed to ``on_damaged(record)``. With ``damaged="raise"``
    :meth:`poll` first returns the messages before it, then raises :class:`DamagedRecordError`;
    the record counts as consumed, so the poll after that goes on behind it."""

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
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
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
        _attached: Attached | None = None,
    ) -> None:
        """``trace``: record deliveries, acks, retries and dead letters in ``trace_topic``
        (``gms msg trace``, docs/traces.md). ``_attached``: driven by an asyncio consumer
        (gms.client.aio), which joins the group itself."""
        _check_options(mode, start_from, subscription, damaged, fifo, max_reconsume_times, retry_delays_ms)
        filters = parse_subscription(subscription)
        self._clustering, self._group = mode == "clustering", group
        self._member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._make_retry_producer = lambda: Producer(brokers, nameserver=nameserver, security=security,
                                                     request_timeout_ms=request_timeout_ms, acks=-1, retries=10)
        self._auto_commit_s = auto_commit_interval_ms / 1000 if auto_commit else None
        self._max_poll_messages, self._raise_on_damaged = max_poll_messages, damaged == "raise"
        self._on_assigned, self._on_revoked, self._on_damaged = on_assigned, on_revoked, on_damaged
        self._init_bookkeeping()
        self._runtime, settings, retry_topic_ready = _attached or _connect(
            brokers, nameserver, request_timeout_ms, security, group, clustering=self._clustering,
            need_settings=None in (max_reconsume_times, retry_delays_ms, fifo))
        if retry_topic_ready:
            filters[retry_topic(group)] = parse_tag_expression("*")
        self._max_reconsume_times = settings.max_reconsume_times if max_reconsume_times is None else max_reconsume_times
        self._retry_delays_ms = settings.retry_delays_ms if retry_delays_ms is None else tuple(retry_delays_ms)
        self._fifo = (settings.fifo and self._clustering) if fifo is None else fifo
        self._read(filters, start_from=start_from, heartbeat_interval_ms=heartbeat_interval_ms,
                   fetch_max_messages=fetch_max_messages, fetch_max_bytes=fetch_max_bytes, long_poll_ms=long_poll_ms,
                   local_offsets=None if self._clustering
                   else LocalOffsetStore(offset_dir, group, instance_name or socket.gethostname()),
                   join=_attached is None)
        self._trace = ConsumerTrace(TraceDispatcher(
            Connect(brokers, nameserver, security), trace_topic, name="gms-consumer-trace",
            loop=None if _attached is None else self._runtime.loop), group, self._member) if trace else None

    def _init_bookkeeping(self) -> None:
        """What the consumer keeps track of as it runs (FIFO holds, damaged records, commits)."""
        # FIFO: queues held back after a failure (until when, from which offset), failures so far.
        self._held: dict[TopicQueue, tuple[float, int]] = {}
        self._fifo_attempts: dict[tuple[str, int, int], int] = {}
        self._retry_producer: Producer | None = None
        self._damaged_count = 0
        self._pending_damaged: DamagedRecordError | None = None  # raised by the next poll
        self._last_commit = time.monotonic()
        self._background_commit: Future[None] | None = None
        # Auto commits run on the polling thread and in the background; one outage for both.
        self._commit_outage = Outage(log, f"auto commit of group {self._group}")
        self._closed = False

    def _read(self, filters: dict[str, TagFilter], *, start_from: StartFrom, heartbeat_interval_ms: float | None,
              fetch_max_messages: int, fetch_max_bytes: int, long_poll_ms: int,
              local_offsets: LocalOffsetStore | None, join: bool) -> None:
        """The fetcher filling poll's buffer and the group membership giving it queues; ``join``:
        join the group now (the first heartbeat: the queues this member reads)."""
        self._buffer = FetchBuffer()
        self._fetcher = Fetcher(
            self._runtime, self._buffer, filters,
            group=self._group if self._clustering else None, member=self._member if self._clustering else None,
            max_messages=fetch_max_messages, max_bytes=fetch_max_bytes, long_poll_ms=long_poll_ms,
            on_leader_lost=self._leader_lost,
        )
        self._membership = Membership(
            self._runtime, self._fetcher, group=self._group, member=self._member, clustering=self._clustering,
            subscription={t: f.expression for t, f in filters.items()}, start_from=start_from,
            heartbeat_interval_ms=heartbeat_interval_ms, local_offsets=local_offsets,
        )
        if not join:
            return
        try:
            self._runtime.run(self._membership.start())
        except BaseException:
            self._runtime.close()
            raise

    @property
    def member(self) -> str:
        return self._member

    def _leader_lost(self) -> None:
        """A fetch found its queue's leader gone: refresh routes, and heartbeat now (I/O loop)."""
        self._runtime.routes.invalidate()
        self._membership.wake()

    def assignment(self) -> list[TopicQueue]:
        """The queues of the subscribed topics this consumer reads now (revoked ones excluded; the
        group's retry queue, which one member reads besides, is not listed)."""
        return sorted(q for q, s in list(self._membership.states.items())
                      if not s.revoked and group_of_topic(q.topic) is None)

    @property
    def damaged_count(self) -> int:
        """Damaged records passed so far (never delivered as messages)."""
        return self._damaged_count

    def poll(self, timeout_ms: float = ITER_POLL_MS) -> ReceivedMessages:
        """The next messages (up to ``max_poll_messages``), waiting up to ``timeout_ms`` for some.

        A sequence that makes each :class:`ReceivedMessage` when it is iterated or indexed."""
        self._check_open()
        if self._pending_damaged is not None:
            error, self._pending_damaged = self._pending_damaged, None
            raise error
        self._handle_rebalance()
        if self._held:
            self._runtime.run(self._release_held())
        if self._auto_commit_s is not None and time.monotonic() - self._last_commit >= self._auto_commit_s:
            self._commit_in_background()
        return self._deliver(self._buffer.take(self._max_poll_messages, self._poll_wait_ms(timeout_ms) / 1000))

    def _deliver(self, chunks: list[Chunk]) -> ReceivedMessages:
        """What :meth:`poll` returns of the ``chunks`` it took (positions advanced past them)."""
        delivered: list[Chunk] = []
        taken: list[Permits] = []  # given back in one call to the loop (not a wake-up per chunk)
        error = None
        for index, chunk in enumerate(chunks):
            state = chunk.state
            if state.revoked:
                continue  # taken away since it was fetched
            if chunk.damaged and self._raise_on_damaged:
                error = self._stop_at_damaged(chunk, chunks[index + 1:], delivered)
                break
            self._passed_damaged(chunk.damaged)
            delivered.append(chunk)
            state.position = chunk.next_offset
            if chunk.holds_permit:
                taken.append(state.permits)
        if taken:
            self._runtime.loop.call_soon_threadsafe(Permits.release_all, taken)
        messages = received(delivered)
        if error is not None:
            if not messages:
                raise error
            self._pending_damaged = error
        if self._trace is not None:
            self._trace.polled(messages)
        return messages

    def _stop_at_damaged(self, chunk: Chunk, later: Sequence[Chunk], delivered: list[Chunk]) -> DamagedRecordError:
        """``damaged="raise"``: take the chunk's messages before its first damaged record, pass
        that record, and put the rest back in line for the next poll."""
        first, *rest = chunk.damaged
        batch, start = chunk.batch, chunk.start
        cut = start if batch is None else start + bisect_left(range(start, chunk.stop), first.queue_offset,
                                                              key=batch.queue_offset)
        delivered.append(Chunk(chunk.state, batch, start, cut, first.queue_offset + 1, False))
        chunk.state.position = first.queue_offset + 1
        self._buffer.put_back([Chunk(chunk.state, batch, cut, chunk.stop, chunk.next_offset, chunk.holds_permit, rest),
                               *later])
        self._passed_damaged([first])
        return DamagedRecordError(first)

    def _passed_damaged(self, records: Sequence[DamagedRecord]) -> None:
        for record in records:
            self._damaged_count += 1
            log.warning("skipping damaged record %s/%d@%d (id %s): CRC mismatch on the broker",
                        record.topic, record.queue_id, record.queue_offset, record.msg_id)
            if self._on_damaged is not None:
                self._on_damaged(record)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while not self._closed:
            yield from self.poll(ITER_POLL_MS)

    # --- failed messages -----------------------------------------------------------------------

    def listen(self, listener: Callable[[ReceivedMessage], object], *,
               stop: Callable[[], bool] = lambda: False) -> None:
        """Hand every message to ``listener`` until ``stop()`` is true (checked between polls) or
        the consumer is closed. A listener that raises fails its message: :meth:`nack` with the
        exception as the reason (RocketMQ's RECONSUME_LATER), and the next message follows (FIFO:
        the next one of another queue; its own queue waits for the failed one)."""
        while not self._closed and not stop():
            for message in self.poll(ITER_POLL_MS):
                if self.held(message):
                    continue
                try:
                    listener(message)
                except Exception as err:  # noqa: BLE001 - the application's failure, handed to nack
                    log.debug("listener failed %s: %r", message.msg_id, err)
                    self.nack(message, reason=f"{type(err).__name__}: {err}")


    def nack(self, message: ReceivedMessage, *, delay_ms: int | None = None, reason: str = "") -> str:
        """The application failed ``message``: redeliver it to this group after ``delay_ms`` (by
        default the group's backoff for its attempt: 10 s, 30 s, 1 m ...), with
        ``reconsume_times`` one higher; once retried ``max_reconsume_times`` times, its next nack
        sends it to the group's dead-letter topic with ``reason`` instead. Returns the topic it went to. The
        message itself counts as consumed (its offset is committed as usual): the copy is stored
        (acknowledged) before this returns. Clustering groups only."""
        copy = self._retry_copy(message, delay_ms, reason)
        if copy is None:
            return self._runtime.run(self._hold(message, delay_ms))
        topic, send = copy
        if topic != retry_topic(self._group):
            self._runtime.run(ensure_topic(self._runtime, topic))
        if self._retry_producer is None:
            self._retry_producer = self._make_retry_producer()
        failed_us = time.time_ns() // 1000
        sent = self._retry_producer.send(topic, bytes(message.body), **send)
        if self._trace is not None:
            self._trace.failed_copy(message, topic, send, sent, failed_us)
        return topic

    def _retry_copy(self, message: ReceivedMessage, delay_ms: int | None,
                    reason: str) -> tuple[str, dict[str, Any]] | None:
        """What :meth:`nack` does with ``message``: send a copy (the topic and ``send``'s
        arguments: the retry topic, or the dead-letter topic once out of retries), or, FIFO, hold
        its queue back (None: :meth:`_hold`)."""
        self._check_open()
        if not self._clustering:
            raise ValueError("nack needs a clustering consumer group (broadcasting consumers have no retry topic)")
        attempts = None
        if self._fifo:
            where = (message.topic, message.queue_id, message.queue_offset)
            attempts = self._fifo_attempts.get(where, 0) + 1
            if attempts <= self._max_reconsume_times:
                self._fifo_attempts[where] = attempts
                return None
            self._fifo_attempts.pop(where, None)  # out of retries: to the dead letters, the queue moves on
        return retry_plan(message, self._group, delay_ms=delay_ms, reason=reason, delays_ms=self._retry_delays_ms,
                          max_reconsume_times=self._max_reconsume_times, attempts=attempts)

    def held(self, message: ReceivedMessage) -> bool:
        """FIFO: whether ``message`` is held back (its queue waits for a failed earlier message,
        which comes again first): skip it, it comes again too."""
        hold = self._held.get(TopicQueue(message.topic, message.queue_id))
        return hold is not None and message.queue_offset >= hold[1]

    async def _hold(self, message: ReceivedMessage, delay_ms: int | None) -> str:
        """FIFO nack: the queue goes back to the failed message and waits ``delay_ms`` (default
        1 s, RocketMQ's suspend time), so nothing after it is delivered first; after
        ``max_reconsume_times`` retries its next failure goes to the dead-letter topic and the queue
        moves on (:meth:`_retry_copy`)."""
        state = self._state(message.topic, message.queue_id)
        state.paused = True
        await self._membership.restart(state, message.queue_offset)
        delay_s = (FIFO_RETRY_DELAY_MS if delay_ms is None else max(delay_ms, 0)) / 1000
        self._held[state.key] = (time.monotonic() + delay_s, message.queue_offset)
        if self._trace is not None:
            attempts = self._fifo_attempts[(message.topic, message.queue_id, message.queue_offset)]
            self._trace.failed(message, message.topic, attempt=attempts, delay_ms=round(delay_s * 1000))
        return message.topic

    async def _release_held(self) -> None:
        """FIFO: queues whose wait after a failure is over are read again (from the failed message)."""
        now = time.monotonic()
        for queue, (until, _) in list(self._held.items()):
            if until <= now:
                del self._held[queue]
                state = self._membership.states.get(queue)
                if state is not None and not state.revoked and state.paused:
                    state.paused = False
                    await self._membership.restart(state, state.position)

    def _poll_wait_ms(self, timeout_ms: float) -> float:
        """How long a poll may wait: until a held FIFO queue may be read again, at the latest."""
        if not self._held:
            return timeout_ms
        return min(timeout_ms, max(0.0, min(u for u, _ in self._held.values()) - time.monotonic()) * 1000)

    # --- offsets ---------------------------------------------------------------------------------

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` ({(topic, queue_id): next offset to read}), or by default the
        position after every message returned so far on every assigned queue. Broadcasting
        consumers write their own offset file."""
        self._check_open()
        if offsets is None:
            self._commit(list(self._membership.states.values()))
            return
        explicit = {TopicQueue(*queue): offset for queue, offset in offsets.items()}
        self._runtime.run(self._membership.commit(explicit))
        self._committed(explicit)

    def _commit(self, states: list[QueueState]) -> None:
        offsets = self._uncommitted(states)
        if offsets:
            self._runtime.run(self._membership.commit(offsets))
            self._committed(offsets)

    def _uncommitted(self, states: Iterable[QueueState]) -> dict[TopicQueue, int]:
        """The positions of ``states`` not committed yet, to commit now."""
        self._last_commit = time.monotonic()
        return {s.key: s.position for s in states if s.position is not None and s.position != s.committed}

    def _committed(self, offsets: Mapping[TopicQueue, int]) -> None:
        for queue, offset in offsets.items():
            state = self._membership.states.get(queue)
            if state is not None:
                state.committed = offset

    def _commit_in_background(self) -> None:
        """The periodic auto commit: sent without waiting (one at a time), so a slow or hung
        leader does not stall ``poll``; a failure is retried at the next interval."""
        self._last_commit = time.monotonic()
        if self._background_commit is not None and not self._background_commit.done():
            return
        offsets = {s.key: s.position for s in self._membership.states.values()
                   if s.position is not None and s.position != s.committed}
        if not offsets:
            return
        future = asyncio.run_coroutine_threadsafe(self._membership.commit(offsets), self._runtime.loop)
        future.add_done_callback(lambda done: self._committed_in_background(done, offsets))
        self._background_commit = future

    def _committed_in_background(self, done: Future[None], offsets: Mapping[TopicQueue, int]) -> None:
        if done.cancelled() or done.exception() is not None:
            self._commit_outage.failed(repr(None if done.cancelled() else done.exception()))
            return
        self._commit_outage.recovered()
        self._committed(offsets)

    def _auto_commit(self, states: list[QueueState]) -> None:
        """Commit like :meth:`commit`; a failure is retried at the next auto commit."""
        try:
            self._commit(states)
        except GmsError as err:
            self._commit_outage.failed(repr(err))
        else:
            self._commit_outage.recovered()

    def position(self, topic: str, queue_id: int) -> int | None:
        """The offset of the next message :meth:`poll` returns from the queue (None until known)."""
        return self._state(topic, queue_id).position

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Make the next :meth:`poll` read the queue from ``offset`` (an assigned queue)."""
        state = self._state(topic, queue_id)
        self._runtime.run(self._membership.restart(state, offset))

    def seek_to_beginning(self, queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Seek ``queues`` (default: every assigned queue) to their first offset."""
        self._seek_to("first", queues)

    def seek_to_end(self, queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Seek ``queues`` (default: every assigned queue) past their last message."""
        self._seek_to("last", queues)

    def _seek_to(self, where: str, queues: Iterable[tuple[str, int]] | None) -> None:
        for queue in self.assignment() if queues is None else [TopicQueue(*q) for q in queues]:
            state = self._state(*queue)
            offset = self._runtime.run(self._membership.query_offset(queue, where))
            self._runtime.run(self._membership.restart(state, offset))

    # --- flow control ----------------------------------------------------------------------------

    def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """Stop fetching ``queues``: :meth:`poll` returns nothing of them until :meth:`resume`.
        They stay assigned (heartbeats go on)."""
        for queue in queues:
            state = self._state(*queue)
            if not state.paused:
                state.paused = True
                self._runtime.run(self._membership.restart(state, state.position))

    def resume(self, queues: Iterable[tuple[str, int]]) -> None:
        """Fetch paused ``queues`` again from where :meth:`poll` left them."""
        for queue in queues:
            state = self._state(*queue)
            if state.paused:
                state.paused = False
                self._runtime.run(self._membership.restart(state, state.position))

    def paused(self) -> list[TopicQueue]:
        """The assigned queues paused now."""
        return sorted(q for q, s in list(self._membership.states.items()) if s.paused and not s.revoked)

    def _state(self, topic: str, queue_id: int) -> QueueState:
        self._check_open()
        state = self._membership.states.get(TopicQueue(topic, queue_id))
        if state is None or state.revoked:
            raise ValueError(f"queue {topic}/{queue_id} is not assigned to this consumer")
        return state

    # --- rebalancing -----------------------------------------------------------------------------

    def _handle_rebalance(self) -> None:
        """Run the assignments and revocations the heartbeats brought, in order."""
        for event in self._membership.take_events():
            subscribed = [q for q in event.queues if group_of_topic(q.topic) is None]  # as assignment()
            if event.assigned:
                if self._on_assigned is not None and subscribed:
                    self._on_assigned(subscribed)
                continue
            self._buffer.drop(lambda chunk: chunk.state.revoked)
            if not event.lost:
                states = [s for q in event.queues if (s := self._membership.states.get(q)) is not None]
                if self._auto_commit_s is not None:
                    self._auto_commit(states)
            if self._on_revoked is not None and subscribed:
                self._on_revoked(subscribed)
            self._runtime.run(self._membership.release(event.queues))

    def close(self) -> None:
        """Commit (with ``auto_commit``), leave the group and close the connections. Idempotent."""
        if self._closed:
            return
        try:
            self._runtime.run(self._membership.stop())
            # Its long polls end now, not failing as the connections close (each failure would
            # look up the routes of every subscribed topic again).
            self._runtime.run(self._fetcher.close())
            self._membership.take_events()
            if self._auto_commit_s is not None:
                self._auto_commit(list(self._membership.states.values()))
            self._runtime.run(self._membership.unregister())
        finally:
            self._closed = True
            self._runtime.close()
            if self._retry_producer is not None:
                self._retry_producer.close()
            if self._trace is not None:
                self._trace.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
