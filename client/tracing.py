"""Message traces written by producers and consumers made with ``trace=True`` (RocketMQ's
client-side trace: ``AsyncTraceDispatcher``, ``TraceContext``, Pub / SubBefore / SubAfter).

What happens to each message — sent, stored, delivered, acknowledged, sent back for a retry,
dead-lettered — becomes trace records in a trace topic (``gms_trace`` by default), keyed by the
message ids, so ``Admin.trace(msg_id)`` / ``gms msg trace ID`` find them through the brokers'
key index. The format is in :mod:`gms.client.trace_format`; docs/traces.md says more.

Cheap and harmless by construction:

- the client's own threads only append one small item per call (a send, a batch, a poll, an
  ack) to a bounded buffer (:class:`TraceDispatcher`); message ids, columns and JSON are made
  later on a background thread, with numpy where a batch has many messages;
- the background thread flushes every ``FLUSH_INTERVAL_MS`` (sooner when much is waiting) with
  one ``send_batch`` of a producer of its own: one request to one trace queue per flush;
- a full buffer drops items (counted in ``dropped``, one warning per episode); a write that
  fails loses its records (counted in ``lost``, logged once per outage). The client's sends and
  receives never wait for traces and never fail because of them.

Not traced: ``send_oneway`` and ``acks=0`` sends (the broker answers no message id), and sends
that fail (no id either: the exception tells the caller).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from gms.client.accumulator import SendFn as SendBodies
from gms.client.retries import DLQ_REASON_PROPERTY, ORIGIN_MSG_ID_PROPERTY, ensure_topic
from gms.client.routing import QueueRoute
from gms.client.runtime import ClientRuntime
from gms.client.structs import (
    PopBatch,
    ReceiptHandle,
    ReceivedMessage,
    ReceivedMessages,
    SendResult,
    SendResults,
)
from gms.client.trace_format import (
    ACK,
    DEAD_LETTER,
    DELIVER,
    IDS_PER_RECORD_MAX,
    RETRY,
    SEND,
    TRACE_QUEUES,
    TRACE_TOPIC,
    column,
    encode_body,
    int_column,
    msg_ids,
    offsets_field,
    pack_ids,
    region_keys,
)
from gms.log_throttle import Outage
from gms.naming import RETRY_TOPIC_PREFIX, dlq_topic, validate_topic_name
from gms.record import keys_column, read_field_offsets, scan_records, text_column
from gms.security.client import ClientSecurity

if TYPE_CHECKING:
    from gms.client.aio.producer import AsyncProducer
    from gms.client.producer import Producer, ProducerRecord

log = logging.getLogger(__name__)

BUFFER_MESSAGES_MAX = 200_000  # traced messages waiting to be written; beyond, items are dropped
FLUSH_INTERVAL_MS = 100  # the longest an event waits to be written (a busy client flushes sooner)
FLUSH_MESSAGES = 50_000  # a flush starts at once when this many traced messages wait
WRITE_TIMEOUT_MS = 3000  # one trace write gives up after this; its records are lost (counted)
CLOSE_TIMEOUT_MS = 3000  # close waits this long for the last flush
CREATE_RETRY_S = 10.0  # a trace topic that could not be created is tried again after this
RECENT_DELIVERIES_MAX = 100_000  # pop deliveries remembered to name what an ack by handle covers

Event = tuple[str, list[str], dict[str, Any]]  # tag, message ids, fields (lists: one per message)


def now_us() -> int:
    return time.time_ns() // 1000


def client_id() -> str:
    """An id for a traced client that says where it runs: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Connect(NamedTuple):
    """Where the traced client connects: its trace records go to the same cluster."""

    brokers: Sequence[str] | str | None
    nameserver: Sequence[str] | str | None
    security: ClientSecurity | None


class TraceDispatcher:
    """The trace records of one client: a bounded buffer of items filled by the client's threads,
    turned into records and written by a background thread -- or, for an asyncio client
    (``loop``), by a task on its loop with an asyncio producer (no thread of its own)."""

    def __init__(self, connect: Connect, topic: str = TRACE_TOPIC, *, create_topic: bool | None = None,
                 buffer_messages_max: int = BUFFER_MESSAGES_MAX, flush_interval_ms: float = FLUSH_INTERVAL_MS,
                 name: str = "gms-trace", loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``create_topic``: create ``topic`` when missing (default: for the default topic only; a
        topic of your own is made with ``gms topic create``). ``loop``: the running loop of an
        asyncio client, whose calls :meth:`add` (close it with :meth:`aclose`)."""
        self.topic = validate_topic_name(topic)
        self._connect = connect
        self._create_topic = topic == TRACE_TOPIC if create_topic is None else create_topic
        self._created_at: float | None = None  # last creation attempt (monotonic)
        self._buffer_messages_max = buffer_messages_max
        self._flush_interval_s = flush_interval_ms / 1000
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[..., Iterable[Event]], tuple[Any, ...], int]] = []
        self._waiting = 0  # traced messages in _items
        self._full = Outage(log, f"trace buffer of {name} (events dropped)")
        self._writes = Outage(log, f"trace writes to {topic}")
        self._stopping = False
        self._producer: Producer | None = None
        self._async_producer: AsyncProducer | None = None
        self._flushes = 0
        self.dropped = 0  # traced messages whose events were dropped (buffer full)
        self.lost = 0  # traced messages whose records could not be made or written
        self.written = 0  # trace records written
        self._wake: threading.Event | asyncio.Event
        if loop is None:
            self._wake = threading.Event()
            self._thread: threading.Thread | None = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        else:
            self._wake = asyncio.Event()
            self._thread = None
            self._task = loop.create_task(self._run_async(), name=name)

    def add(self, build: Callable[..., Iterable[Event]], args: tuple[Any, ...], count: int) -> None:
        """Queue ``build(*args)`` (run later on the background thread) for ``count`` messages;
        dropped when the buffer is full. Never blocks on I/O, never raises."""
        with self._lock:
            if self._waiting + count > self._buffer_messages_max:
                self.dropped += count
                self._full.failed(f"{self._waiting} traced messages wait to be written")
                return
            if self._full.active:
                self._full.recovered()
            self._items.append((build, args, count))
            self._waiting += count
            wake = self._waiting >= FLUSH_MESSAGES
        if wake:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            cast(threading.Event, self._wake).wait(self._flush_interval_s)
            self._wake.clear()
            self.flush()
        self.flush()

    async def _run_async(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(cast(asyncio.Event, self._wake).wait(), self._flush_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.aflush()
        await self.aflush()

    def flush(self) -> None:
        """Write what is buffered now (the background thread's work; tests call it too)."""
        taken = self._take()
        if taken is not None:
            self._write(*taken)

    async def aflush(self) -> None:
        """:meth:`flush` of an asyncio client's dispatcher (its task's work)."""
        taken = self._take()
        if taken is None:
            return
        records, count = taken
        try:
            if self._topic_due():
                await ensure_topic(self._async_writer()._runtime, self.topic, queues=TRACE_QUEUES)
                self._create_topic = False
            await self._async_writer().send_batch(records)
        except Exception as err:  # noqa: BLE001 - lost and counted: traces never fail the traced client
            self._write_failed(err, count)
        else:
            self._wrote(records)

    def _take(self) -> tuple[list[ProducerRecord], int] | None:
        """The records of what is buffered now and how many traced messages they cover."""
        with self._lock:
            items, self._items, self._waiting = self._items, [], 0
        if not items:
            return None
        records: list[ProducerRecord] = []
        count = 0
        self._flushes += 1
        key = f"{id(self):x}-{self._flushes}"  # every record of a flush goes to one queue: one request
        for build, args, messages in items:
            try:
                for tag, ids, fields in build(*args):
                    records += self._records(tag, ids, fields, key)
                count += messages
            except Exception:  # a trace must never break its client: counted and logged
                self.lost += messages
                log.exception("cannot make the trace records of %s", getattr(build, "__name__", build))
        return (records, count) if records else None

    def _records(self, tag: str, ids: list[str], fields: dict[str, Any], key: str) -> Iterable[ProducerRecord]:
        from gms.client.producer import ProducerRecord
        for low in range(0, len(ids), IDS_PER_RECORD_MAX):
            high = low + IDS_PER_RECORD_MAX
            part = fields if len(ids) <= IDS_PER_RECORD_MAX else {
                name: value[low:high] if isinstance(value, list) else value for name, value in fields.items()}
            first = part.get("offset_from")
            if low and isinstance(first, int):
                part["offset_from"] = first + low
            covered = ids[low:high]
            yield ProducerRecord(self.topic, encode_body({"event": tag, "ids": pack_ids(covered), **part}), tag,
                                 region_keys(covered), key=key)

    def _write(self, records: list[ProducerRecord], count: int) -> None:
        try:
            self._ensure_topic()
            self._writer().send_batch(records)
        except Exception as err:  # noqa: BLE001 - lost and counted: traces never fail the traced client
            self._write_failed(err, count)
        else:
            self._wrote(records)

    def _write_failed(self, err: Exception, count: int) -> None:
        self.lost += count
        self._writes.failed(repr(err))

    def _wrote(self, records: list[ProducerRecord]) -> None:
        self.written += len(records)
        if self._writes.active:
            self._writes.recovered()

    def _writer(self) -> Producer:
        if self._producer is None:
            from gms.client.producer import Producer
            brokers, nameserver, security = self._connect
            self._producer = Producer(brokers, nameserver=nameserver, security=security, acks=1, retries=1,
                                      request_timeout_ms=WRITE_TIMEOUT_MS, linger_ms=0)
        return self._producer

    def _async_writer(self) -> AsyncProducer:
        if self._async_producer is None:
            from gms.client.aio.producer import AsyncProducer
            brokers, nameserver, security = self._connect
            self._async_producer = AsyncProducer(brokers, nameserver=nameserver, security=security, acks=1,
                                                 retries=1, request_timeout_ms=WRITE_TIMEOUT_MS, linger_ms=0)
        return self._async_producer

    def _topic_due(self) -> bool:
        """Whether to (try to) create the trace topic now (a failed try is made again after
        CREATE_RETRY_S)."""
        if not self._create_topic:
            return False
        now = time.monotonic()
        if self._created_at is not None and now - self._created_at < CREATE_RETRY_S:
            return False
        self._created_at = now
        return True

    def _ensure_topic(self) -> None:
        if not self._topic_due():
            return
        brokers, nameserver, security = self._connect
        runtime = ClientRuntime(brokers, nameserver=nameserver, security=security,
                                request_timeout_ms=WRITE_TIMEOUT_MS, name="gms-trace-setup")
        try:
            runtime.run(ensure_topic(runtime, self.topic, queues=TRACE_QUEUES), WRITE_TIMEOUT_MS * 2)
        finally:
            runtime.close()
        self._create_topic = False

    def close(self, timeout_ms: float = CLOSE_TIMEOUT_MS) -> None:
        """Write what is buffered (waiting up to ``timeout_ms``) and stop. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        if self._thread is None:
            raise RuntimeError("this dispatcher runs on an asyncio client's loop: await aclose() instead")
        self._thread.join(timeout_ms / 1000)
        if self._producer is not None:
            self._producer.close(timeout_ms)

    async def aclose(self, timeout_ms: float = CLOSE_TIMEOUT_MS) -> None:
        """:meth:`close` of an asyncio client's dispatcher. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_ms / 1000)
        except TimeoutError:
            self._task.cancel()
        finally:
            if self._async_producer is not None:
                await self._async_producer.aclose()


# --- producers --------------------------------------------------------------------------------


class ProducerTrace:
    """Traces a producer's sends: ``send`` and ``send_batch`` are wrapped on the traced instance
    only (an untraced producer runs the plain methods), ``send_async`` batches where the
    accumulator sends them (:meth:`batches`)."""

    def __init__(self, dispatcher: TraceDispatcher, born_host: str) -> None:
        self.dispatcher = dispatcher
        self.host = born_host
        self.client = client_id()

    def sent(self, started_us: int, tag: str | None, keys: Sequence[str], size: int, result: SendResult) -> None:
        """A ``send`` begun at ``started_us`` was answered ``result`` (None: acks=0, not traced)."""
        if result is not None:
            self.dispatcher.add(_sent_one, (now_us(), started_us, self.host, self.client, tag, keys, size, result), 1)

    def sent_batch(self, started_us: int, messages: Sequence[Any], results: Sequence[SendResult]) -> None:
        """A ``send_batch`` of ``messages`` begun at ``started_us`` was answered ``results``."""
        if len(results) and results[0] is not None:
            self.dispatcher.add(_sent_batch, (now_us(), started_us, self.host, self.client, messages, results),
                                len(results))

    def instrument(self, producer: Producer) -> None:
        send, send_batch = producer.send, producer.send_batch

        def traced_send(topic: str, body: bytes, tag: str | None = None, keys: Sequence[str] = (),
                        *args: Any, **kwargs: Any) -> SendResult:
            started = now_us()
            result = send(topic, body, tag, keys, *args, **kwargs)
            self.sent(started, tag, keys, len(body), result)
            return result

        def traced_send_batch(messages: Iterable[Any], *args: Any, **kwargs: Any) -> Sequence[SendResult]:
            started = now_us()
            if not isinstance(messages, (list, tuple)):
                messages = list(messages)
            results = send_batch(messages, *args, **kwargs)
            self.sent_batch(started, messages, results)
            return results

        traced_send.__doc__, traced_send_batch.__doc__ = send.__doc__, send_batch.__doc__
        vars(producer).update(send=traced_send, send_batch=traced_send_batch)

    def batches(self, send: SendBodies) -> SendBodies:
        """``send`` (the accumulator's: one batch of ``send_async``) tracing what it sent."""
        add, host, client = self.dispatcher.add, self.host, self.client

        async def traced(route: QueueRoute, bodies: list[tuple[bytearray, int]]) -> Sequence[SendResult]:
            results = await send(route, bodies)
            if len(results) and results[0] is not None:
                add(_sent_bodies, (now_us(), host, client, bodies, results), len(results))
            return results
        return traced

    def close(self) -> None:
        self.dispatcher.close()

    async def aclose(self) -> None:
        await self.dispatcher.aclose()


def _result_fields(results: Sequence[SendResult]) -> tuple[list[str], dict[str, Any]]:
    """The ids and the store fields (topic, broker, queue, offsets) of a send's results."""
    if isinstance(results, SendResults):
        prefix, queue_ids, queue_offsets, phys_offsets = results.arrays()
        return msg_ids(prefix, phys_offsets), {
            "topic": results.topic, "broker": results.broker, "queue": int_column(queue_ids, ">i4"),
            **offsets_field(queue_offsets)}
    return [r.msg_id for r in results], {
        "topic": column([r.topic for r in results]), "broker": column([r.broker for r in results]),
        "queue": column([r.queue_id for r in results]), **offsets_field([r.queue_offset for r in results])}


_TAG, _KEYS, _BODY = itemgetter(2), itemgetter(3), itemgetter(1)  # of a ProducerRecord


def _sent_one(acked_us: int, started_us: int, host: str, client: str, tag: str | None, keys: Sequence[str],
              size: int, result: SendResult) -> Iterable[Event]:
    yield SEND, [result.msg_id], {
        "time_us": acked_us, "host": host, "client": client, "topic": result.topic, "broker": result.broker,
        "queue": result.queue_id, "offset": result.queue_offset, "tag": tag, "keys": " ".join(keys),
        "size": size, "cost_us": acked_us - started_us, "status": "ok"}


def _sent_batch(acked_us: int, started_us: int, host: str, client: str, messages: Sequence[Any],
                results: Sequence[SendResult]) -> Iterable[Event]:
    from gms.client.producer import ProducerRecord
    if not all(map(isinstance, messages, repeat(ProducerRecord))):
        messages = [m if isinstance(m, ProducerRecord) else ProducerRecord(**m) for m in messages]
    keys = list(map(_KEYS, messages))
    ids, fields = _result_fields(results)
    yield SEND, ids, {
        "time_us": acked_us, "host": host, "client": client, **fields, "tag": column(list(map(_TAG, messages))),
        "keys": column(list(map(" ".join, keys))) if any(keys) else "",
        "size": int_column(np.fromiter(map(len, map(_BODY, messages)), np.int64, len(messages)), ">i4"),
        "cost_us": acked_us - started_us, "status": "ok"}


def _sent_bodies(acked_us: int, host: str, client: str, bodies: list[tuple[bytearray, int]],
                 results: Sequence[SendResult]) -> Iterable[Event]:
    """A ``send_async`` batch: tags, keys, sizes and born times read from the sent records."""
    tags: list[Any] = []
    keys: list[Any] = []
    sizes: list[int] = []
    born: list[int] = []
    for sealed, _ in bodies:
        body = memoryview(sealed)
        starts = scan_records(body, verify_crc=False).starts
        at = read_field_offsets(body, starts)
        headers = at.headers
        tags += text_column(body, at.tag_at, headers["tag_len"], groups=headers["tag_hash"], empty=None)
        keys += [" ".join(k) if isinstance(k, tuple) else ""
                 for k in keys_column(body, at.keys_at, headers["keys_len"])]
        sizes += headers["body_len"].tolist()
        born += headers["born_ts_ms"].tolist()
    ids, fields = _result_fields(results)
    born_ms = np.asarray(born, np.int64)
    yield SEND, ids, {
        "time_us": acked_us, "host": host, "client": client, **fields, "tag": column(tags), "keys": column(keys),
        "size": int_column(np.asarray(sizes), ">i4"), "born_ms": int_column(born_ms),
        "cost_us": int_column(acked_us - born_ms * 1000), "status": "ok"}


# --- consumers --------------------------------------------------------------------------------


class _Delivery:
    """What one poll / receive handed out; its ids are made once, on the background thread."""

    __slots__ = ("_ids", "messages", "time_us")

    def __init__(self, time_us: int, messages: ReceivedMessages) -> None:
        self.time_us = time_us
        self.messages = messages
        self._ids: tuple[list[str], dict[str, Any]] | None = None

    def ids(self) -> tuple[list[str], dict[str, Any]]:
        """The original ids of the messages (a redelivered copy's is its original's) and their
        deliver fields: topic, queue, offset (where this delivery came from: a retry topic for a
        copy) and attempt."""
        if self._ids is None:
            self._ids = _delivered_ids(self.messages)
        return self._ids


def _delivered_ids(messages: ReceivedMessages) -> tuple[list[str], dict[str, Any]]:
    ids: list[str] = []
    topics: list[Any] = []
    queues: list[int] = []
    offsets: list[int] = []
    attempts: list[int] = []
    for batch, start, stop in messages.parts():
        at = read_field_offsets(batch.buf, batch.starts[start:stop])
        rows = at.headers
        part_ids = msg_ids(batch.prefix, rows["phys_offset"])
        part_topics = text_column(batch.buf, at.topic_at, rows["topic_len"])
        if isinstance(batch, PopBatch):
            given = list(batch.attempts[start:stop])
            attempts += given + [1] * (stop - start - len(given))
        else:
            attempts += (rows["reconsume_times"] + 1).tolist()
        for i, name in enumerate(part_topics):
            if isinstance(name, str) and name.startswith(RETRY_TOPIC_PREFIX):  # a retry copy: its original's id
                part_ids[i] = batch[start + i].properties.get(ORIGIN_MSG_ID_PROPERTY, part_ids[i])
        ids += part_ids
        topics += [name if isinstance(name, str) else "?" for name in part_topics]
        queues += rows["queue_id"].tolist()
        offsets += rows["queue_offset"].tolist()
    return ids, {"topic": column(topics), "queue": int_column(np.asarray(queues), ">i4"),
                 **offsets_field(offsets), "attempt": int_column(np.asarray(attempts), ">i4")}


def origin_id(message: ReceivedMessage) -> str:
    """The id a message is traced under: a retry copy's original's."""
    if message.topic.startswith(RETRY_TOPIC_PREFIX):
        return message.properties.get(ORIGIN_MSG_ID_PROPERTY, message.msg_id)
    return message.msg_id


class ConsumerTrace:
    """Traces a consumer's deliveries, acks, retries and dead letters. ``Consumer``: the messages a
    poll returned count as consumed (acked) at the next poll or at close, except those nacked;
    ``SimpleConsumer``: acks are traced when the broker accepted them."""

    def __init__(self, dispatcher: TraceDispatcher, group: str, client: str | None = None) -> None:
        self.dispatcher = dispatcher
        self.group = group
        self.host = socket.gethostname()
        self.client = client or client_id()
        self._last: _Delivery | None = None
        self._nacked: set[str] = set()
        # (topic, queue, offset) -> (id, delivered at): pop deliveries an ack by handle names.
        self._recent: dict[tuple[str, int, int], tuple[str, int]] = {}

    def _fields(self, time_us: int) -> dict[str, Any]:
        return {"time_us": time_us, "host": self.host, "client": self.client, "group": self.group}

    def polled(self, messages: ReceivedMessages) -> None:
        """A poll returned ``messages``: the previous poll's are consumed now."""
        now = now_us()
        self._acked_last(now)
        if len(messages):
            self._last = _Delivery(now, messages)
            self.dispatcher.add(self._delivered, (self._last, self._fields(now)), len(messages))

    def received(self, messages: ReceivedMessages) -> None:
        """A pop receive handed out ``messages``."""
        if len(messages):
            now = now_us()
            self.dispatcher.add(self._delivered, (_Delivery(now, messages), self._fields(now), True), len(messages))

    def _delivered(self, delivery: _Delivery, fields: dict[str, Any], remember: bool = False) -> Iterable[Event]:
        ids, delivered = delivery.ids()
        if remember:
            self._remember(delivery, ids)
        yield DELIVER, ids, {**fields, **delivered}

    def _remember(self, delivery: _Delivery, ids: list[str]) -> None:
        recent = self._recent
        for message, msg_id in zip(delivery.messages, ids, strict=True):
            recent[(message.topic, message.queue_id, message.queue_offset)] = (msg_id, delivery.time_us)
        while len(recent) > RECENT_DELIVERIES_MAX:
            del recent[next(iter(recent))]

    def _acked_last(self, now: int) -> None:
        last, nacked = self._last, self._nacked
        if last is None:
            return
        self._last, self._nacked = None, set()
        self.dispatcher.add(self._acked, (last, nacked, self._fields(now)), len(last.messages))

    def _acked(self, delivery: _Delivery, nacked: set[str], fields: dict[str, Any]) -> Iterable[Event]:
        ids, _ = delivery.ids()
        if nacked:
            ids = [i for i in ids if i not in nacked]
        if ids:
            yield ACK, ids, {**fields, "cost_us": fields["time_us"] - delivery.time_us}

    def acked_handles(self, handles: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                      done: Future[list[ReceiptHandle]]) -> None:
        """A pop ack of ``handles`` ({topic: (queue ids, offsets, attempts)}) was answered."""
        if not done.cancelled() and done.exception() is None:
            self.acked_pop(handles, done.result())

    def acked_pop(self, handles: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                  expired_handles: Sequence[ReceiptHandle]) -> None:
        """A pop ack of ``handles`` was answered: ``expired_handles`` of them no longer held."""
        expired = {(h.topic, h.queue_id, h.offset) for h in expired_handles}
        count = sum(len(columns[0]) for columns in handles.values())
        self.dispatcher.add(self._acked_handles, (handles, expired, self._fields(now_us())), count)

    def _acked_handles(self, handles: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                       expired: set[tuple[str, int, int]], fields: dict[str, Any]) -> Iterable[Event]:
        ids: list[str] = []
        costs: list[int] = []
        for topic, (queue_ids, offsets, _) in handles.items():
            for where in zip([topic] * len(queue_ids), queue_ids.tolist(), offsets.tolist(), strict=True):
                known = self._recent.pop(where, None)
                if known is not None and where not in expired:
                    ids.append(known[0])
                    costs.append(fields["time_us"] - known[1])
        if ids:
            yield ACK, ids, {**fields, "cost_us": column(costs)}

    def failed(self, message: ReceivedMessage, to: str, *, attempt: int, delay_ms: int | None = None,
               reason: str | None = None, copy: SendResult | None = None, at_us: int | None = None) -> None:
        """``message`` failed its ``attempt`` (at ``at_us``, default now): it went to ``to`` (a
        retry topic, back to its own queue for FIFO, or the dead-letter topic) after ``delay_ms``."""
        msg_id = origin_id(message)
        if self._last is not None:  # Consumer: not acked when the next poll comes
            self._nacked.add(msg_id)
        now = now_us() if at_us is None else at_us
        event = DEAD_LETTER if to == dlq_topic(self.group) else RETRY
        fields = {**self._fields(now), "topic": message.topic, "attempt": attempt, "to": to}
        if delay_ms is not None:
            fields["delay_ms"] = delay_ms
        if reason:
            fields["reason"] = reason
        if copy is not None:
            fields["copy_id"] = copy.msg_id
        self.dispatcher.add(self._failed, (event, msg_id, fields, (message.topic, message.queue_id,
                                                                    message.queue_offset)), 1)

    def _failed(self, event: str, msg_id: str, fields: dict[str, Any], where: tuple[str, int, int]) -> Iterable[Event]:
        if event == DEAD_LETTER:
            self._recent.pop(where, None)  # a pop delivery dead-lettered: its ack is not traced
        yield event, [msg_id], fields

    def failed_copy(self, message: ReceivedMessage, to: str, send: Mapping[str, Any], copy: SendResult,
                    at_us: int) -> None:
        """``message`` failed at ``at_us`` and was copied to ``to`` as
        :func:`gms.client.retries.retry_plan` planned it."""
        self.failed(message, to, attempt=send["reconsume_times"], delay_ms=send.get("delay_ms"),
                    reason=send["properties"].get(DLQ_REASON_PROPERTY), copy=copy, at_us=at_us)

    def close(self) -> None:
        self._acked_last(now_us())
        self.dispatcher.close()

    async def aclose(self) -> None:
        self._acked_last(now_us())
        await self.dispatcher.aclose()


__all__ = ["TRACE_TOPIC", "Connect", "ConsumerTrace", "ProducerTrace", "TraceDispatcher"]
