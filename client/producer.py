"""The producer: sync ``send``/``send_batch``, batched ``send_async``, ``send_oneway``.

Every send goes through one async path (:meth:`gms.client.sender.Sender.send`: one SEND_BATCH request for one
target queue, retried with backoff on retriable errors); ``send_async``'s batches due together for
one broker go out as one request first (:meth:`gms.client.sender.Sender.send_many`). A batch over the broker's limit per
request (``SEND_BODY_SIZE_MAX_BYTES``) goes out as several requests, one after the other. Queue
choice: an explicit ``queue``, else a stable hash of ``key`` (same key → same queue → ordered),
else round robin from a random queue. A ``key`` is stored with the message too, as its first key
(compacted topics keep the latest message per key; Kafka consumers read it as the record key).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import logging
import random
import socket
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import xxhash

from gms.client.accumulator import Accumulator
from gms.client.connections import BlockingPool
from gms.client.delivery import deliver_at_ms
from gms.client.idempotence import Sequencer, Ticket, random_producer_id
from gms.client.routing import (
    LEADER_CHECK_INTERVAL_MS,
    BackgroundRefresh,
    BrokerFaults,
    LeaderMovedError,
    NameserverRoutes,
    QueueRoute,
    leader_moved,
)
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.send_results import SendFuture, SendResult, SendResults
from gms.client.sender import Sender, joined, one_result, results
from gms.client.tracing import TRACE_TOPIC, Connect, ProducerTrace, TraceDispatcher
from gms.client.transactions import Transaction, TransactionChecker, TransactionClient
from gms.errors import (
    GmsError,
    QueueNotFoundError,
    TopicNotFoundError,
    UnknownCodeError,
)
from gms.net.busy_poll import CLIENT_WINDOW_US
from gms.protocol.codes import RequestCode
from gms.protocol.fields import INT32
from gms.protocol.frame import Frame
from gms.record.builder import BatchBuilder, RecordEncoder
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_SCHEDULED,
    KAFKA_KEY_PROPERTY,
    KEY_SEPARATOR,
    MESSAGE_GROUP_PROPERTY,
)
from gms.security.client import ClientSecurity

log = logging.getLogger(__name__)

ACKS_VALUES = (0, 1, -1)
# send_async's batches are sent at this size (or after linger_ms): under load fewer, larger requests
# cost both sides less (1 KiB messages went ~20 % faster than in 256 KiB batches).
BATCH_BYTES = 1 << 20
# Unanswered messages a producer holds at most. A producer over many topics has a batch open per
# topic: with 32 MiB those of 1,000 topics held ~250 messages each, and such a producer sent
# 1.25-1.39 M msg/s against 1.50-1.61 M with 64 MiB (bench_scale's produce; 128 MiB: no more).
BUFFER_BYTES_MAX = 64 << 20
# The round robin starts at a random count below this (uniform enough modulo any queue count).
ROUND_ROBIN_START_RANGE = 1 << 30


class ProducerRecord(NamedTuple):
    """One message of :meth:`Producer.send_batch`; the fields are ``send``'s arguments."""

    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] | None = None
    queue: int | None = None
    key: str | bytes | None = None


class _Group(NamedTuple):
    """The messages of one ``send_batch`` call that go to one queue in one request."""

    records: BatchBuilder
    indexes: list[int]  # positions in the caller's input


def _in_input_order(groups: list[_Group], answers: list[SendResults | list[SendResult]],
                    count: int) -> Sequence[SendResult]:
    """The results of several requests of one ``send_batch``, back in the caller's order."""
    order = np.empty(count, np.intp)
    order[np.concatenate([np.asarray(g.indexes, np.intp) for g in groups])] = np.arange(count)
    all_results = joined(answers)
    if isinstance(all_results, SendResults):
        return all_results.take(order)
    return [all_results[i] for i in order.tolist()]


def _check_settings(acks: int, retries: int, linger_ms: float, batch_bytes: int, busy_poll_us: int) -> None:
    if acks not in ACKS_VALUES:
        raise ValueError(f"acks must be one of {ACKS_VALUES}, not {acks!r}")
    if retries < 0 or linger_ms < 0 or batch_bytes <= 0 or busy_poll_us < 0:
        raise ValueError("retries, linger_ms and busy_poll_us must be >= 0 and batch_bytes > 0")


def _call_timeout_ms(request_timeout_ms: float, retries: int, retry_backoff_ms: float) -> float:
    """How long a sync call waits: the whole retry schedule, never forever."""
    return request_timeout_ms * (retries + 1) + retry_backoff_ms * retries * (retries + 1)


class Producer:
    """Sends messages to gms brokers. Thread-safe; use as a context manager or call close().

    Routes come from ``nameserver="host:9876[,host2:9876]"`` (a cluster) or from a fixed
    ``brokers`` list (each broker asked for its topics)."""

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
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """``born_host``: stored in every record as where it was produced (``gms msg show``);
        None means this machine's host name, looked up once here. ``security``: TLS and user
        (None: from the ``GMS_TLS_*``, ``GMS_USER``, ``GMS_PASSWORD`` environment variables).
        ``idempotence``: retries never store a batch twice (docs/idempotence.md; off with acks=0).
        ``group``: the producer group, needed for transactions; ``transaction_checker(tx_id,
        messages)`` answers the brokers' check-backs of the group's open transactions, and
        ``transaction_timeout_ms`` sets when the first check comes (docs/transactions.md).
        ``trace``: record every send in ``trace_topic`` (``gms msg trace``, docs/traces.md).
        ``busy_poll_us``: how long a synchronous send polls for its answer before its thread
        sleeps: ~25 µs less per ``send()`` on a virtual machine, for up to that much CPU
        (:mod:`gms.net.busy_poll`; 0: off). ``_loop``: the running loop of an
        :class:`gms.client.aio.AsyncProducer` that drives this one (no thread of its own)."""
        _check_settings(acks, retries, linger_ms, batch_bytes, busy_poll_us)
        born_host = socket.gethostname() if born_host is None else born_host
        self._trace = ProducerTrace(TraceDispatcher(
            Connect(brokers, nameserver, security), trace_topic, name="gms-producer-trace", loop=_loop),
            born_host) if trace else None
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-producer", security=security, loop=_loop)
        self._encoder = RecordEncoder(born_host)
        self._faults = BrokerFaults()
        self._route_cache = BackgroundRefresh(self._runtime.routes, self._runtime.loop)
        self._sequencer = (Sequencer(self._allocate_producer_id, self._runtime.loop)
                           if idempotence and acks != 0 else None)
        self._sender = Sender(self._runtime, self._faults, acks=acks, retries=retries,
                               retry_backoff_ms=retry_backoff_ms, sequencer=self._sequencer)
        self._accumulator = self._batching(linger_ms, batch_bytes, buffer_bytes_max)
        # A random start: short-lived producers (one per `gms produce`) would all begin at queue 0.
        self._round_robin = itertools.count(random.randrange(ROUND_ROBIN_START_RANGE))
        self._acks = acks
        self._request_timeout_ms = request_timeout_ms
        self._blocking = BlockingPool(security=self._runtime.security, busy_poll_us=busy_poll_us)
        self._call_timeout_ms = _call_timeout_ms(request_timeout_ms, retries, retry_backoff_ms)
        self._transactions = None if group is None else TransactionClient(
            self._runtime, group, acks=acks, retries=retries, retry_backoff_ms=retry_backoff_ms,
            call_timeout_ms=self._call_timeout_ms, timeout_ms=transaction_timeout_ms, checker=transaction_checker)
        if self._trace is not None:
            self._trace.instrument(self)

    def _batching(self, linger_ms: float, batch_bytes: int, buffer_bytes_max: int) -> Accumulator:
        """send_async's batching; a traced producer's batches each go alone (traced per batch)."""
        sender, trace = self._sender, self._trace
        return Accumulator(self._runtime.loop, self._encoder,
                           sender.send_bodies if trace is None else trace.batches(sender.send_bodies),
                           self._route_any, linger_ms=linger_ms, batch_bytes=batch_bytes,
                           buffer_bytes_max=buffer_bytes_max, send_many=sender.send_many if trace is None else None)

    @property
    def producer_id(self) -> int | None:
        """The idempotent producer's id (None before its first send, or when not idempotent)."""
        return None if self._sequencer is None else self._sequencer.producer_id

    async def _allocate_producer_id(self) -> int:
        routes = self._runtime.routes
        if isinstance(routes, NameserverRoutes):
            try:
                return int((await routes.request(RequestCode.INIT_PRODUCER_ID)).fields["producer_id"])
            except UnknownCodeError:  # a nameserver older than idempotence
                log.info("the nameservers allocate no producer ids: using a random one")
        return random_producer_id()

    def _stamp(self, route: QueueRoute, body: bytearray, count: int) -> Ticket | None:
        """Number a body sent from the caller's thread (idempotent producers)."""
        sequencer = self._sequencer
        if sequencer is None:
            return None
        if sequencer.producer_id is None:
            self._runtime.run(sequencer.ready(), self._call_timeout_ms)
        return sequencer.stamp(body, route.topic, route.queue_id, count)

    # --- queue selection ---------------------------------------------------------------------

    def _route(self, topic: str, queue: int | None, key: str | bytes | None) -> QueueRoute:
        return self._cached_route(topic, queue, key) or self._choose(
            self._runtime.run(self._lookup(topic, queue), self._call_timeout_ms), queue, key)

    async def _route_async(self, topic: str, queue: int | None, key: str | bytes | None) -> QueueRoute:
        """:meth:`_route` on the loop (asyncio producers)."""
        return self._cached_route(topic, queue, key) or self._choose(await self._lookup(topic, queue), queue, key)

    def _cached_route(self, topic: str, queue: int | None, key: str | bytes | None) -> QueueRoute | None:
        """The route the cached routes give (None: they are to be looked up); routes that aged
        out serve while they are fetched again (:class:`BackgroundRefresh`)."""
        self._encoder.topic(topic)  # a bad name fails here, before any I/O
        routes = self._route_cache.routes(topic)
        return None if routes is None else self._choose(routes, queue, key)

    async def _lookup(self, topic: str, queue: int | None) -> list[QueueRoute] | QueueRoute:
        """The routes of ``topic``, or where to send to it if the routes do not name it (fixed
        brokers that may create it on first use)."""
        try:
            return await self._runtime.routes.routes(topic)
        except TopicNotFoundError:
            fallback = self._runtime.routes.unknown_topic_route(topic, queue)
            if fallback is None:
                raise
            return fallback

    def _choose(self, routes: list[QueueRoute] | QueueRoute, queue: int | None, key: str | bytes | None) -> QueueRoute:
        if isinstance(routes, QueueRoute):
            return routes
        if queue is not None:
            if not 0 <= queue <= INT32.high:  # would not fit the record's int32 queue id
                raise QueueNotFoundError(f"topic {routes[0].topic!r} has no queue {queue}"
                                         f" (queue ids are 0..{len(routes) - 1})")
            for route in routes:
                if route.queue_id == queue:
                    return route
            return QueueRoute(routes[0].topic, queue, routes[0].broker)  # the broker answers QUEUE_NOT_FOUND
        if key is not None:
            raw = key.encode() if isinstance(key, str) else key
            return routes[xxhash.xxh64_intdigest(raw) % len(routes)]
        return self._faults.pick(routes, next(self._round_robin))

    # --- sending -----------------------------------------------------------------------------

    def send(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
             properties: Mapping[str, str] | None = None, queue: int | None = None,
             key: str | bytes | None = None, *, deliver_at: datetime.datetime | int | None = None,
             delay_ms: int | None = None, delay_level: int | None = None, reconsume_times: int = 0,
             message_group: str | None = None, transaction: Transaction | None = None) -> SendResult:
        """Send one message and wait until the broker acknowledges it (per ``acks``).

        ``deliver_at`` (a datetime or epoch ms), ``delay_ms`` or ``delay_level`` (RocketMQ's
        1..18) schedule it: stored and acknowledged now, delivered to consumers at that time
        (docs/scheduled-messages.md). ``reconsume_times``: how often it was consumed and failed
        (set by consumer retries). ``message_group``: FIFO order with the group's other messages
        (docs/fifo.md): they go to one queue, in the order sent. ``transaction``: a half message of
        that transaction (:meth:`begin_transaction`), hidden until it commits."""
        keys, properties, key = _keyed(keys, properties, key, message_group)
        route = self._route(topic, queue, key)
        records = self._encode_one(route, topic, body, tag, keys, properties, deliver_at, delay_ms, delay_level,
                                   reconsume_times, transaction)
        result = self._send_one(route, records, queue is None and key is None)
        if transaction is not None:
            transaction.sent(result.topic, result.queue_id)
        return result

    def _encode_one(self, route: QueueRoute, topic: str, body: bytes, tag: str | None, keys: Sequence[str],
                    properties: Mapping[str, str] | None, deliver_at: datetime.datetime | int | None,
                    delay_ms: int | None, delay_level: int | None, reconsume_times: int,
                    transaction: Transaction | None) -> bytearray:
        """The request body of :meth:`send`'s message."""
        batch = BatchBuilder(route.queue_id)
        properties, flags = _scheduled(properties, deliver_at, delay_ms, delay_level)
        if transaction is not None:
            if flags:
                raise ValueError("a transaction's message cannot be scheduled")
            properties, flags = transaction.half(properties)
        self._encoder.add(batch, topic, body, tag, keys, properties, flags, reconsume_times)
        return batch.seal()

    async def _send_one_async(self, route: QueueRoute, records: bytearray, movable: bool) -> SendResult:
        """:meth:`_send_one` on the loop (asyncio producers): numbered as a sync send is, its first
        attempt straight on the broker's open connection (as a sync send's on its thread's own),
        the retries of a failed one and any first attempt that cannot go so through the sender."""
        sequencer = self._sequencer
        ticket = None
        if sequencer is not None:
            if sequencer.producer_id is None:
                await sequencer.ready()
            ticket = sequencer.stamp(records, route.topic, route.queue_id, 1)
        with self._numbered(ticket):
            first_error = None
            conn = self._runtime.pool.open(route.broker)
            if (conn is not None and self._acks and not route.replicated
                    and (ticket is None or cast(Sequencer, sequencer).may_go(ticket))):
                try:
                    frame = await conn.request(RequestCode.SEND_BATCH, {"acks": self._acks}, records)
                except GmsError as err:
                    first_error = err  # retried with backoff by the sender, if retriable
                else:
                    if ticket is not None:
                        cast(Sequencer, sequencer).acked(ticket)
                    return one_result(route.topic, frame.fields)
            sent = await self._sender.send(route, records, movable=movable, first_error=first_error, ticket=ticket)
        return sent[0] if sent else None  # type: ignore[return-value]

    def _send_one(self, route: QueueRoute, records: bytearray, movable: bool) -> SendResult:
        ticket = self._stamp(route, records, 1)
        with self._numbered(ticket):
            first_error = None
            if self._acks:
                frame, first_error = self._send_blocking(route, records, ticket)
                if frame is not None:
                    return one_result(route.topic, frame.fields)
            send = self._sender.send(route, records, movable=movable, first_error=first_error, ticket=ticket)
            sent = self._runtime.run(send, self._call_timeout_ms)
        return sent[0] if sent else None  # type: ignore[return-value]

    @contextlib.contextmanager
    def _numbered(self, ticket: Ticket | None) -> Iterator[None]:
        """A sync send of a numbered batch: a failure that never reached the sender (the client
        closed, the call timed out) gives the number up too, or its queue's later batches would
        wait for it."""
        try:
            yield
        except BaseException:
            if ticket is not None:
                cast(Sequencer, self._sequencer).gave_up(ticket, maybe_stored=True)  # a no-op if it did
            raise

    def _send_blocking(self, route: QueueRoute, records: bytearray,
                       ticket: Ticket | None) -> tuple[Frame | None, GmsError | None]:
        """The first attempt of a send on the calling thread's own connection: no hand-off to the
        I/O thread and back. (answer, None), or (None, the error to retry on the I/O loop), or
        (None, None) when every blocking connection is lent out or a batch of the queue waits to
        be sent again (then the I/O loop sends, in the queue's order)."""
        sequencer = cast(Sequencer, self._sequencer)  # set whenever a ticket is given
        if ticket is not None and not sequencer.may_go(ticket):
            return None, None
        try:
            conn = self._blocking.acquire(route.broker)
            if conn is None:
                return None, None
            # A replicated queue's send is given up once another broker leads the queue.
            abandon = (lambda: self._leader_moved(route)) if route.replicated else None
            try:
                frame = conn.request(RequestCode.SEND_BATCH, {"acks": self._acks}, records,
                                     timeout_ms=self._request_timeout_ms, abandon=abandon,
                                     check_interval_ms=LEADER_CHECK_INTERVAL_MS)
            finally:
                self._blocking.release(route.broker, conn)
        except GmsError as err:
            return None, err  # retried with backoff on the I/O loop, if retriable
        if ticket is not None:
            sequencer.acked(ticket)
        return frame, None

    def _leader_moved(self, route: QueueRoute) -> LeaderMovedError | None:
        """Asked while a blocking send waits: has another broker taken ``route``'s queue over?"""
        moved = leader_moved(self._runtime.routes, route.topic, route.queue_id, route.broker,
                             LEADER_CHECK_INTERVAL_MS / 1000)
        return self._runtime.run(moved, self._call_timeout_ms)

    def send_batch(self, messages: Iterable[ProducerRecord | Mapping[str, Any]]) -> Sequence[SendResult]:
        """Send many messages, one request per target queue; results are in input order.

        The results are a sequence (equal to, and concatenable with, lists) whose items are
        made when read; with ``acks=0`` every item is None."""
        groups, count = self._grouped_batch(messages, self._route)
        if not groups:
            return []
        bodies = {target: group.records.seal_counted() for target, group in groups.items()}
        if len(bodies) == 1 and self._acks:  # one request (the usual batch): sent from this thread
            ((route, movable), ((request_body, request_count), *more)), = bodies.items()
            if not more:
                ticket = self._stamp(route, request_body, request_count)
                with self._numbered(ticket):
                    frame, first_error = self._send_blocking(route, request_body, ticket)
                    if frame is not None:
                        return results(route.topic, frame.fields)
                    send = self._sender.send(route, request_body, movable=movable, first_error=first_error,
                                             ticket=ticket)
                    return self._runtime.run(send, self._call_timeout_ms)
        # Each group's requests go one after the other, each with its own retry schedule.
        timeout_ms = self._call_timeout_ms * max(map(len, bodies.values()))
        return self._batch_results(groups, self._runtime.run(self._send_all(bodies), timeout_ms), count)

    def _grouped_batch(self, messages: Iterable[ProducerRecord | Mapping[str, Any]],
                       route_of: Callable[[str, int | None, str | bytes | None], QueueRoute],
                       ) -> tuple[dict[tuple[QueueRoute, bool], _Group], int]:
        """``send_batch``'s messages encoded by target queue (and whether they may move), and
        their count; ``route_of(topic, queue, key)`` routes what the cached routes do not."""
        # Messages without a key or explicit queue may move to another queue on failure, so
        # they travel apart from pinned ones. Pinned messages are routed once per (topic,
        # queue, key); the others round robin over the topic's routes looked up once.
        groups: dict[tuple[QueueRoute, bool], _Group] = {}
        pinned_routes: dict[tuple[str, int | None, str | bytes | None], QueueRoute] = {}
        topic_routes: dict[str, list[QueueRoute] | None] = {}
        add, pick, round_robin = self._encoder.add, self._faults.pick, self._round_robin
        count = 0
        for count, given in enumerate(messages, 1):
            message = given if isinstance(given, ProducerRecord) else ProducerRecord(**given)
            topic, body, tag, keys, properties, queue, key = message
            if key is not None:
                keys, properties = _with_key(keys, properties, key)
            movable = queue is None and key is None
            if movable:
                routes = topic_routes.get(topic, ())
                if routes == ():
                    routes = topic_routes[topic] = self._runtime.routes.cached(topic)
                route = pick(routes, next(round_robin)) if routes else route_of(topic, None, None)
            else:
                route = pinned_routes.get((topic, queue, key))  # type: ignore[assignment]
                if route is None:
                    route = pinned_routes[(topic, queue, key)] = route_of(topic, queue, key)
            group = groups.get((route, movable))
            if group is None:
                group = groups[(route, movable)] = _Group(BatchBuilder(route.queue_id), [])
            add(group.records, topic, body, tag, keys, properties)
            group.indexes.append(count - 1)
        return groups, count

    @staticmethod
    def _batch_results(groups: dict[tuple[QueueRoute, bool], _Group], answers: list[SendResults | list[SendResult]],
                       count: int) -> Sequence[SendResult]:
        """``send_batch``'s results from the answers of its groups (:meth:`_send_all`)."""
        if not answers[0]:
            return [None] * count  # type: ignore[list-item]  # acks=0
        if len(answers) == 1:
            return answers[0]
        return _in_input_order(list(groups.values()), answers, count)  # acks != 0

    async def _send_all(self, bodies: dict[tuple[QueueRoute, bool], list[tuple[bytearray, int]]],
                        ) -> list[SendResults | list[SendResult]]:
        return list(await asyncio.gather(*(
            self._sender.send_bodies(route, group_bodies, movable=movable)
            for (route, movable), group_bodies in bodies.items())))

    def send_async(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                   properties: Mapping[str, str] | None = None, queue: int | None = None,
                   key: str | bytes | None = None,
                   callback: Callable[[SendFuture], object] | None = None, *,
                   deliver_at: datetime.datetime | int | None = None, delay_ms: int | None = None,
                   delay_level: int | None = None, message_group: str | None = None) -> SendFuture:
        """Queue a message for a batched send; the returned :class:`SendFuture` resolves when
        the broker answers its batch (``flush()`` waits for every one).

        ``callback(future)`` runs on the I/O thread once the future is done: keep it short.
        Bad input raises here; send failures are set on the future. ``deliver_at``, ``delay_ms``,
        ``delay_level``, ``message_group``: as for :meth:`send`.

        Messages without ``key``, ``queue`` or ``message_group`` go to one queue of the topic until
        their batch is sent, then the next batch to the next queue (Kafka's sticky partitioner):
        full batches rather than thin ones on every queue.
        """
        if (keys or properties or queue is not None or key is not None or callback is not None
                or deliver_at is not None or delay_ms is not None or delay_level is not None
                or message_group is not None):
            keys, properties, key = _keyed(keys, properties, key, message_group)
            future = self._append_routed(self._route(topic, queue, key), body, tag, keys, properties,
                                         deliver_at, delay_ms, delay_level)
            if callback is not None:
                future.add_done_callback(callback)
            return future
        # A plain message, as most are: into its topic's sticky batch, nothing to route or schedule.
        return self._accumulator.append_plain(topic, body, tag)

    def _append_routed(self, route: QueueRoute, body: bytes, tag: str | None, keys: Sequence[str],
                       properties: Mapping[str, str] | None, deliver_at: datetime.datetime | int | None,
                       delay_ms: int | None, delay_level: int | None) -> SendFuture:
        if deliver_at is None and delay_ms is None and delay_level is None:  # as most are
            if not keys and not properties:  # queue= alone (a key= is stored as a key or property): C
                return self._accumulator.append_open(route, body, tag)
            return self._accumulator.append(route, body, tag, keys, properties)
        return self._accumulator.append(route, body, tag, keys,
                                        *_scheduled(properties, deliver_at, delay_ms, delay_level))

    def _route_any(self, topic: str) -> QueueRoute:
        """The next queue of ``topic`` in round robin (skipping brokers that just failed)."""
        return self._route(topic, None, None)

    def send_oneway(self, topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                    properties: Mapping[str, str] | None = None, queue: int | None = None,
                    key: str | bytes | None = None) -> None:
        """Send without waiting for (or getting) any acknowledgement (acks=0)."""
        keys, properties, key = _keyed(keys, properties, key)
        route = self._route(topic, queue, key)
        self._runtime.run(self._oneway(route, topic, body, tag, keys, properties, queue is None and key is None),
                          self._call_timeout_ms)

    def _oneway(self, route: QueueRoute, topic: str, body: bytes, tag: str | None, keys: Sequence[str],
                properties: Mapping[str, str] | None,
                movable: bool) -> Coroutine[Any, Any, SendResults | list[SendResult]]:
        """The send of :meth:`send_oneway`'s message (encoded now, bad input raising here)."""
        batch = BatchBuilder(route.queue_id)
        self._encoder.add(batch, topic, body, tag, keys, properties)
        return self._sender.send(route, batch.seal(), acks=0, movable=movable)

    def begin_transaction(self) -> Transaction:
        """A new transaction: send its messages with ``send(..., transaction=tx)``, then
        ``tx.commit()`` or ``tx.rollback()`` (or use it as a context manager)."""
        if self._transactions is None:
            raise ValueError("transactions need a producer group: Producer(..., group='...')")
        return self._transactions.begin()

    def flush(self, timeout_ms: float | None = None) -> None:
        """Send everything queued by send_async and wait for the answers."""
        self._runtime.run(self._accumulator.flush(), timeout_ms)

    def close(self, timeout_ms: float | None = None) -> None:
        """Flush, then close the connections. Idempotent."""
        if self._runtime.closed:
            return
        try:
            self.flush(timeout_ms)
        finally:
            if self._transactions is not None:
                self._transactions.close()
            self._blocking.close()
            self._runtime.close()
            if self._trace is not None:
                self._trace.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _scheduled(properties: Mapping[str, str] | None, deliver_at: datetime.datetime | int | None,
               delay_ms: int | None, delay_level: int | None) -> tuple[Mapping[str, str] | None, int]:
    """(properties, flags) of a message, scheduled when a delivery time in the future is given."""
    at = deliver_at_ms(deliver_at, delay_ms, delay_level)
    if at is None:
        return properties, 0
    return {**(properties or {}), DELIVER_AT_PROPERTY: str(at)}, FLAG_SCHEDULED


def _keyed(keys: Sequence[str], properties: Mapping[str, str] | None, key: str | bytes | None,
           message_group: str | None = None
           ) -> tuple[Sequence[str], Mapping[str, str] | None, str | bytes | None]:
    """(keys, properties, routing key) a message is stored and routed with.

    Its ``key`` is stored as its first key when it is one word of text, else whole (base64) in
    the property ``__KAFKA_KEY``, as the Kafka API stores a record's key: compacted topics keep
    the latest message per key, and Kafka consumers read it as the record's key. A message of
    ``message_group`` is routed by the group, which it carries in a property (FIFO consumers
    hold a failed message's group back)."""
    if key is not None:
        keys, properties = _with_key(keys, properties, key)
    if message_group is None:
        return keys, properties, key
    if not message_group:
        raise ValueError("message_group must not be empty")
    return keys, {**(properties or {}), MESSAGE_GROUP_PROPERTY: message_group}, message_group


def _with_key(keys: Sequence[str], properties: Mapping[str, str] | None, key: str | bytes
              ) -> tuple[Sequence[str], Mapping[str, str] | None]:
    try:
        text = key if isinstance(key, str) else key.decode()
    except UnicodeDecodeError:
        text = ""
    if text and KEY_SEPARATOR not in text:
        return (text, *(k for k in keys if k != text)), properties
    raw = key.encode() if isinstance(key, str) else key
    return keys, {**(properties or {}), KAFKA_KEY_PROPERTY: base64.b64encode(raw).decode()}
