"""Message traces written by producers and consumers made with ``trace=True`` (RocketMQ's
client-side trace: ``AsyncTraceDispatcher``, ``TraceContext``, Pub / SubBefore / SubAfter).

What happens to each message — sent, stored, delivered, acknowledged, sent back for a retry,
dead-lettered — becomes trace records in a trace topic (``gms_trace`` by default), keyed by the
message ids, so ``Admin.trace(msg_id)`` / ``gms msg trace ID`` find them through the brokers'
key index. The format is in :mod:`gms.client.trace_format`, the consumers' events in
:mod:`gms.client.consumer_trace`; docs/traces.md says more.

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
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from gms.client.accumulator import SendFn as SendBodies
from gms.client.retries import ensure_topic
from gms.client.routing import QueueRoute
from gms.client.runtime import ClientRuntime
from gms.client.send_results import SendResult, SendResults
from gms.client.trace_format import (
    IDS_PER_RECORD_MAX,
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
from gms.naming import validate_topic_name
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


__all__ = ["TRACE_TOPIC", "Connect", "ProducerTrace", "TraceDispatcher"]
