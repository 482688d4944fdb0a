"""Transactions: end one (commit or roll back its half messages), a producer group's check-backs,
the listing (broker.transactions keeps the open transactions; docs/transactions.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from gms.broker.access import BrokerAccess
from gms.broker.services.groups import check_group_name
from gms.broker.services.messages import MessageService, check_acks
from gms.broker.store import AppendResult
from gms.broker.transactions import OpenTransaction, TransactionService
from gms.errors import BadRequestError, ForbiddenError, NotLeaderError, TransactionNotFoundError
from gms.record.layout import TIMER_FLAGS, TX_ID_CHARS_MAX


@dataclass(frozen=True, slots=True)
class Ended:
    """An END_TRANSACTION's outcome here: ``messages`` resolved (0: decided already)."""

    messages: int
    committed: bool


@dataclass(frozen=True, slots=True)
class DueCheck:
    """A transaction due for a check-back: its half messages (views into the log)."""

    tx_id: str
    checks: int
    halves: list[memoryview]


def check_tx_id(tx_id: str) -> str:
    if not 0 < len(tx_id) <= TX_ID_CHARS_MAX:
        raise BadRequestError(f"tx_id must have 1..{TX_ID_CHARS_MAX} characters")
    return tx_id


def state_name(committed: bool) -> str:
    return "committed" if committed else "rolled_back"


class TransactionOutcomeService:
    def __init__(self, state: TransactionService, messages: MessageService, access: BrokerAccess | None,
                 long_poll_max_ms: int) -> None:
        self.state = state
        self.messages = messages
        self.access = access
        self.long_poll_max_ms = long_poll_max_ms

    def end(self, tx_id: str, commit: bool, acks: int) -> Ended | Awaitable[Ended]:
        """Commit (visible copies) or roll back (cancels) the transaction's pending halves on the
        queues this broker leads, acknowledged per ``acks`` as a send of those records would be:
        at once, or an awaitable (sync flush, acks=-1). Idempotent: the same decision again
        answers 0 messages."""
        started = time.perf_counter()
        check_tx_id(tx_id)
        check_acks(acks)
        tx, decision = self.state.lookup(tx_id)
        if decision is not None and decision != commit:
            raise TransactionNotFoundError(f"transaction {tx_id} was {state_name(decision).replace('_', ' ')} already",
                                           fields={"state": state_name(decision)})
        halves = self.state.led_halves(tx) if tx is not None else {}
        if not halves:
            if decision is not None:
                return Ended(0, decision)
            if tx is not None:
                raise NotLeaderError(f"this broker leads none of the queues of transaction {tx_id} "
                                     f"({sorted(tx.halves)}): ask their leaders")
            raise TransactionNotFoundError(f"no open transaction {tx_id} on this broker")
        # One append: this broker's part of the transaction is all or nothing, across its queues.
        ((_, records),) = self.state.resolution(tx_id, halves, commit, batch_max=None)
        ended = Ended(sum(len(offsets) for offsets in halves.values()), commit)
        stored = self.messages.store_records(records, acks, started, allowed_flags=TIMER_FLAGS)
        if isinstance(stored, AppendResult):
            return ended

        async def when_stored() -> Ended:
            await stored
            return ended
        return when_stored()

    async def ended(self, tx_id: str, commit: bool, acks: int) -> Ended:
        """:meth:`end`, awaited."""
        ended = self.end(tx_id, commit, acks)
        return ended if isinstance(ended, Ended) else await ended

    async def due_checks(self, group: str, poll_ms: int) -> list[DueCheck]:
        """A producer group's long poll for its transactions due for a check-back (those whose
        topics the caller may publish to)."""
        check_group_name(group)
        poll_ms = min(max(poll_ms, 0), self.long_poll_max_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        state = self.state
        while True:
            due = [tx for tx in state.take_due(group) if self._may_publish(tx)]
            remaining_s = deadline - loop.time()
            if due or remaining_s <= 0 or state.stopped:
                break
            await state.wait_due(group, remaining_s)
        return [DueCheck(tx.tx_id, tx.checks, state.half_records(tx)) for tx in due]

    def _may_publish(self, tx: OpenTransaction) -> bool:
        if self.access is None:
            return True
        try:
            for topic in {topic for topic, _ in tx.halves}:
                self.access.check_topic(topic, "publish")
        except ForbiddenError:
            return False
        return True
