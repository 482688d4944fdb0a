"""END_TRANSACTION, CHECK_TRANSACTIONS and LIST_TRANSACTIONS: transactions on the wire
(docs/transactions.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from gms.broker.access import BrokerAccess
from gms.broker.group_handlers import group_name_field
from gms.broker.message_handlers import ACKS, MessageHandlers
from gms.broker.transactions import OpenTransaction, TransactionService
from gms.errors import BadRequestError, ForbiddenError, NotLeaderError, TransactionNotFoundError
from gms.protocol.fields import INT32, field
from gms.protocol.frame import Frame, Response
from gms.record.layout import TIMER_FLAGS, TX_ID_CHARS_MAX


def _state(committed: bool) -> str:
    return "committed" if committed else "rolled_back"


def tx_id_field(fields: Mapping[str, Any]) -> str:
    tx_id = field(fields, "tx_id", str)
    if not 0 < len(tx_id) <= TX_ID_CHARS_MAX:
        raise BadRequestError(f"tx_id must have 1..{TX_ID_CHARS_MAX} characters")
    return tx_id


class TransactionHandlers:
    def __init__(self, service: TransactionService, messages: MessageHandlers, access: BrokerAccess | None,
                 long_poll_max_ms: int) -> None:
        self.service = service
        self.messages = messages
        self.access = access
        self.long_poll_max_ms = long_poll_max_ms

    def end_transaction(self, request: Frame) -> Response | Awaitable[Response | None] | None:
        """Commit (visible copies) or roll back (cancels) the transaction's pending halves on the
        queues this broker leads, answered per ``acks`` as a send of those records would be, with
        how many were appended (``messages``; not their positions: a transaction may hold more
        than a send's answer can list). Idempotent: the same decision again answers OK, 0."""
        started = time.perf_counter()
        fields = request.fields
        tx_id = tx_id_field(fields)
        commit = field(fields, "commit", bool)
        acks = field(fields, "acks", INT32, 1)
        if acks not in ACKS:
            raise BadRequestError(f"acks must be 0, 1 or -1, not {acks}")
        tx, decision = self.service.lookup(tx_id)
        if decision is not None and decision != commit:
            raise TransactionNotFoundError(f"transaction {tx_id} was {_state(decision).replace('_', ' ')} already",
                                           fields={"state": _state(decision)})
        halves = self.service.led_halves(tx) if tx is not None else {}
        if not halves:
            if decision is not None:
                return self._answer(0, decision)
            if tx is not None:
                raise NotLeaderError(f"this broker leads none of the queues of transaction {tx_id} "
                                     f"({sorted(tx.halves)}): ask their leaders")
            raise TransactionNotFoundError(f"no open transaction {tx_id} on this broker")
        # One append: this broker's part of the transaction is all or nothing, across its queues.
        ((_, records),) = self.service.resolution(tx_id, halves, commit, batch_max=None)
        count = sum(len(offsets) for offsets in halves.values())
        stored = self.messages.store_records(request, records, acks, started, allowed_flags=TIMER_FLAGS)
        if stored is None or isinstance(stored, Response):
            return self._answer(count, commit)

        async def answer_when_stored() -> Response:
            await stored
            return self._answer(count, commit)
        return answer_when_stored()

    def _answer(self, count: int, committed: bool) -> Response:
        return Response({"messages": count, "state": _state(committed), "broker": self.messages.advertised_address})

    async def check_transactions(self, request: Frame) -> Response:
        """A producer group's long poll for its transactions due for a check-back: their ids and
        half messages (``transactions``: rows with ``count`` records each, back to back in the
        body)."""
        fields = request.fields
        group = group_name_field(fields)
        poll_ms = min(max(field(fields, "poll_ms", int, 0), 0), self.long_poll_max_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        service = self.service
        while True:
            due = [tx for tx in service.take_due(group) if self._may_publish(tx)]
            remaining_s = deadline - loop.time()
            if due or remaining_s <= 0 or service.stopped:
                break
            await service.wait_due(group, remaining_s)
        rows, body = [], []
        for tx in due:
            records = service.half_records(tx)
            rows.append({"tx_id": tx.tx_id, "checks": tx.checks, "count": len(records)})
            body += records
        return Response({"transactions": rows}, body=body)

    async def list_transactions(self, request: Frame) -> Response:
        return Response({"transactions": self.service.listing(), "broker": self.messages.advertised_address})

    def _may_publish(self, tx: OpenTransaction) -> bool:
        if self.access is None:
            return True
        try:
            for topic in {topic for topic, _ in tx.halves}:
                self.access.check_topic(topic, "publish")
        except ForbiddenError:
            return False
        return True
