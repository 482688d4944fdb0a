"""The trace events of consumers made with ``trace=True``: deliveries, acks, retries and
dead letters, written through a :class:`~gms.client.tracing.TraceDispatcher` (docs/traces.md)."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from gms.client.retries import DLQ_REASON_PROPERTY, ORIGIN_MSG_ID_PROPERTY
from gms.client.send_results import SendResult
from gms.client.structs import PopBatch, ReceiptHandle, ReceivedMessage, ReceivedMessages
from gms.client.trace_format import (
    ACK,
    DEAD_LETTER,
    DELIVER,
    RETRY,
    column,
    int_column,
    msg_ids,
    offsets_field,
)
from gms.client.tracing import Event, TraceDispatcher, client_id, now_us
from gms.naming import RETRY_TOPIC_PREFIX, dlq_topic
from gms.record import read_field_offsets, text_column

RECENT_DELIVERIES_MAX = 100_000  # pop deliveries remembered to name what an ack by handle covers


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
