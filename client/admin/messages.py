"""Message administration: view a message by id, find messages by key, recall a scheduled one,
open transactions, and a message's trace."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from gms.client.admin.base import AdminBase
from gms.client.body_decode import decode_pull_body
from gms.client.connections import msg_id_prefix
from gms.client.routing import UNREACHABLE_ERRORS
from gms.client.structs import ReceivedMessage
from gms.client.trace_format import STORE, TRACE_TOPIC, TraceEvent, decode_events, ordered, region_key
from gms.errors import (
    GmsError,
    MessageNotFoundError,
    ServiceUnavailableError,
    TopicNotFoundError,
    TransactionNotFoundError,
)
from gms.msgid import MessageId, decode_msg_id
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame
from gms.protocol.groups import TransactionQueue
from gms.protocol.rows import decode
from gms.tags import MATCH_ALL

TRACE_RECORDS_MAX = 256  # trace records of one message each broker answers (FIND_BY_KEY)


class MessageAdmin(AdminBase):
    """The message and transaction calls of :class:`~gms.client.admin.AsyncAdmin`."""

    async def cancel_scheduled(self, msg_id: str) -> None:
        """Recall the scheduled message ``msg_id`` before its time (the id ``send`` returned).
        MessageNotFoundError if it was delivered or cancelled already."""
        located = decode_msg_id(msg_id)
        await self._runtime.pool.request(
            located.address, RequestCode.CANCEL_SCHEDULED, {"phys_offset": located.phys_offset})

    async def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message a message id points at: asked of the broker the id names, else (that broker
        is gone, or no longer holds it) of every live broker, where a replica that copied it from
        that broker answers (docs/replication.md)."""
        located = decode_msg_id(msg_id)
        try:
            frame = await self._runtime.pool.request(
                located.address, RequestCode.VIEW_MESSAGE_BY_ID, {"phys_offset": located.phys_offset})
        except (*UNREACHABLE_ERRORS, MessageNotFoundError) as err:
            frame = await self._replica_copy(located, err)
        return ReceivedMessage(memoryview(frame.body), 0, msg_id_prefix(located.address))

    async def _replica_copy(self, located: MessageId, cause: GmsError) -> Frame:
        """A replica's copy of the message ``located`` names (``cause``: why its broker did not answer)."""
        fields = {"phys_offset": located.phys_offset, "origin": located.address}
        live = await self.brokers()
        others = [broker for broker in live if broker != located.address]

        async def ask() -> list[Frame | BaseException]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, RequestCode.VIEW_MESSAGE_BY_ID, fields) for b in others),
                return_exceptions=True))
        for answer in await ask():
            if isinstance(answer, Frame):
                return answer
        if located.address not in live and isinstance(cause, UNREACHABLE_ERRORS):
            raise ServiceUnavailableError(
                f"the message id names broker {located.address}, which is not a live broker of this cluster"
                f" (live: {', '.join(live) or 'none'}), and no live broker holds a copy: the id may come from"
                " another cluster (check --nameserver / GMS_NAMESERVER), or its broker is down") from cause
        raise cause

    async def find_by_key(self, topic: str, key: str, *, begin_ms: int | None = None, end_ms: int | None = None,
                          max_messages: int = 32) -> list[ReceivedMessage]:
        """The newest ``max_messages`` messages of ``topic`` carrying ``key`` (stored in
        [begin_ms, end_ms], ms, inclusive; None: unbounded), oldest first. Each broker leading
        queues of the topic answers from its key index; its answers for those queues are kept
        (a follower's copies would repeat them). TopicNotFoundError for an unknown topic."""
        routes = await self._runtime.routes.routes(topic)
        led: dict[str, set[int]] = defaultdict(set)
        for route in routes:
            led[route.broker].add(route.queue_id)
        fields: dict[str, Any] = {"topic": topic, "key": key, "max_messages": max_messages}
        if begin_ms is not None:
            fields["begin_ms"] = begin_ms
        if end_ms is not None:
            fields["end_ms"] = end_ms
        brokers = list(led)

        async def ask() -> list[Any]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, RequestCode.FIND_BY_KEY, fields) for b in brokers)))
        found: dict[int, ReceivedMessage] = {}
        for broker, frame in zip(brokers, await ask(), strict=True):
            for message in decode_pull_body(frame.body, msg_id_prefix(broker), MATCH_ALL):
                if message.queue_id in led[broker]:
                    found.setdefault(message.queue_id << 48 | message.queue_offset, message)
        ordered = sorted(found.values(), key=lambda m: (m.store_timestamp_ms, m.queue_id, m.queue_offset))
        return ordered[-max_messages:]

    # --- transactions ----------------------------------------------------------------------------

    async def list_transactions(self) -> list[dict[str, Any]]:
        """The open transactions, oldest first: each broker's part of a transaction (on the queues
        it leads) as a row with ``tx_id``, ``group``, ``queues`` ([topic, queue id, messages]),
        ``messages``, ``age_ms``, ``checks``, ``state`` and ``broker``. Unreachable brokers are
        left out."""
        brokers = await self.brokers()
        rows = []
        for broker, answer in zip(brokers, await self._ask(brokers, RequestCode.LIST_TRANSACTIONS, errors=True),
                                  strict=True):
            if not isinstance(answer, BaseException):
                rows += [{**row, "queues": [decode(TransactionQueue, q, "queues") for q in row["queues"]],
                          "broker": broker} for row in answer["transactions"] if row["leader"]]
        return sorted(rows, key=lambda row: -row["age_ms"])

    async def end_transaction(self, tx_id: str, *, commit: bool) -> list[str]:
        """Commit or roll back an open transaction by hand (what its producer's checker would
        answer): every broker leading some of its queues applies it. The brokers that did;
        TransactionNotFoundError when none holds it."""
        brokers = await self.brokers()
        fields = {"tx_id": tx_id, "commit": commit, "acks": -1 if self._nameserver is not None else 1}
        answers = await self._ask(brokers, RequestCode.END_TRANSACTION, fields, errors=True)
        applied = [b for b, a in zip(brokers, answers, strict=True) if not isinstance(a, BaseException)]
        if applied:
            return applied
        decided = [a for a in answers if isinstance(a, TransactionNotFoundError) and a.fields.get("state")]
        if decided:
            raise decided[0]
        raise TransactionNotFoundError(f"no broker holds an open transaction {tx_id}")

    async def trace(self, msg_id: str, *, trace_topic: str = TRACE_TOPIC, max_records: int = TRACE_RECORDS_MAX,
                    ) -> list[TraceEvent]:
        """The life of the message ``msg_id`` as its traced clients recorded it (docs/traces.md),
        in time order: send and store, deliveries, retries, dead letter, acks. [] when nothing
        was traced (tracing off, or no trace topic). ValueError for a malformed id."""
        decode_msg_id(msg_id)
        try:
            found = await self.find_by_key(trace_topic, region_key(msg_id), max_messages=max_records)
        except TopicNotFoundError:
            return []
        events = [event for record in found for event in decode_events(record.body, msg_id)]
        if any(event.event == STORE for event in events):
            events = await self._store_times(msg_id, events)
        return ordered(events)

    async def _store_times(self, msg_id: str, events: list[TraceEvent]) -> list[TraceEvent]:
        """Store rows at the message's own store time while it is still there (else the time its
        producer got the answer)."""
        try:
            stored_ms = (await self.view_message(msg_id)).store_timestamp_ms
        except GmsError:
            return events
        sent_us = min((e.time_us for e in events if e.event == "send"), default=0)
        return [e._replace(time_us=max(stored_ms * 1000, sent_us), details={"store_time_ms": stored_ms})
                if e.event == STORE else e for e in events]
