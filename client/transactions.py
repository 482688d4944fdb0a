"""Transactional messages in the SDK (RocketMQ's half messages; docs/transactions.md).

``producer.begin_transaction()`` gives a :class:`Transaction`; ``producer.send(...,
transaction=tx)`` stores a half message that no consumer sees; ``tx.commit()`` makes the
transaction's messages visible, ``tx.rollback()`` drops them (END_TRANSACTION to the current
leader of every queue the transaction touched, retried like a send). A producer created with a
``transaction_checker`` also answers the brokers' check-backs for its group: it long-polls every
broker for transactions left open past their timeout and tells each broker what the checker says.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gms.client.body_decode import decode_pull_body
from gms.client.connections import msg_id_prefix
from gms.client.runtime import ClientRuntime
from gms.client.structs import ReceivedMessage
from gms.errors import GmsError, TransactionNotFoundError
from gms.protocol.codes import RequestCode
from gms.record.layout import FLAG_HALF, TX_GROUP_PROPERTY, TX_ID_PROPERTY, TX_TIMEOUT_PROPERTY
from gms.tags import MATCH_ALL

log = logging.getLogger(__name__)

CHECK_POLL_MS = 5_000  # a checker's long poll on each broker (below the broker's long_poll_max_ms)
BROKER_LIST_REFRESH_S = 5.0  # how often a checker looks for brokers that came or went
CHECK_RETRY_S = 1.0  # after a failed poll (the broker is down or restarting)


class TransactionState(enum.Enum):
    """What a transaction checker answers: commit it, roll it back, or ask again later."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


TransactionChecker = Callable[[str, Sequence[ReceivedMessage]], TransactionState]
QueueKey = tuple[str, int]


class Transaction:
    """One transaction of a producer: send its messages with ``transaction=tx``, then commit or
    roll back. As a context manager it commits on a clean exit and rolls back on an exception."""

    def __init__(self, client: TransactionClient, tx_id: str) -> None:
        self._client = client
        self.tx_id = tx_id
        self.state = "open"  # then "committed" or "rolled_back"
        self._queues: dict[QueueKey, None] = {}  # touched queues, in order

    @property
    def queues(self) -> list[QueueKey]:
        """The (topic, queue id) pairs the transaction's messages went to."""
        return list(self._queues)

    def half(self, properties: Mapping[str, str] | None) -> tuple[dict[str, str], int]:
        """(properties, flags) of a half message of this transaction."""
        if self.state != "open":
            raise ValueError(f"transaction {self.tx_id} is {self.state.replace('_', ' ')}: begin a new one")
        return {**(properties or {}), **self._client.half_properties(self.tx_id)}, FLAG_HALF

    def sent(self, topic: str, queue_id: int) -> None:
        self._queues[(topic, queue_id)] = None

    def commit(self) -> None:
        """Make every message of the transaction visible (per queue all or nothing); returns
        once every queue's leader stored the commit per the producer's ``acks``."""
        self._end(True)

    def rollback(self) -> None:
        """Drop every message of the transaction: consumers never see them."""
        self._end(False)

    def _end(self, commit: bool) -> None:
        if self._ended(commit):
            return
        if self._queues:
            self._client.end_sync(self.tx_id, list(self._queues), commit)
        self.state = "committed" if commit else "rolled_back"

    async def _end_async(self, commit: bool) -> None:
        """:meth:`_end` on the producer's loop (asyncio producers)."""
        if self._ended(commit):
            return
        if self._queues:
            await self._client.end(self.tx_id, list(self._queues), commit)
        self.state = "committed" if commit else "rolled_back"

    def _ended(self, commit: bool) -> bool:
        """Whether it ended so already; ValueError if it ended the other way."""
        if self.state == "open":
            return False
        if self.state == ("committed" if commit else "rolled_back"):
            return True
        raise ValueError(f"transaction {self.tx_id} is {self.state.replace('_', ' ')} already")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            self.commit()
            return
        try:
            self.rollback()
        except GmsError as err:  # the check-back resolves it; the application's error matters more
            log.warning("transaction %s: rollback failed (%s); the brokers' check-back will resolve it",
                        self.tx_id, err)

    def __repr__(self) -> str:
        return f"Transaction({self.tx_id!r}, {self.state}, queues={self.queues})"


class TransactionClient:
    """A producer's transactions: END_TRANSACTION with retries, and its group's check-backs."""

    def __init__(self, runtime: ClientRuntime, group: str, *, acks: int, retries: int, retry_backoff_ms: float,
                 call_timeout_ms: float, timeout_ms: int | None = None,
                 checker: TransactionChecker | None = None) -> None:
        if not group:
            raise ValueError("transactions need a producer group: Producer(..., group='...')")
        if acks == 0:
            raise ValueError("transactions need acknowledged sends: acks=1 or acks=-1")
        self._runtime = runtime
        self.group = group
        self._acks = acks
        self._retries = retries
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._call_timeout_ms = call_timeout_ms
        self._timeout_ms = timeout_ms
        self._checker = checker
        self._checks: asyncio.Future[None] | None = None
        if checker is not None:
            self._checks = asyncio.run_coroutine_threadsafe(self._answer_checks(), runtime.loop)  # type: ignore[assignment]

    def begin(self) -> Transaction:
        return Transaction(self, uuid.uuid4().hex)

    def half_properties(self, tx_id: str) -> dict[str, str]:
        properties = {TX_ID_PROPERTY: tx_id, TX_GROUP_PROPERTY: self.group}
        if self._timeout_ms is not None:
            properties[TX_TIMEOUT_PROPERTY] = str(self._timeout_ms)
        return properties

    def end_sync(self, tx_id: str, queues: list[QueueKey], commit: bool) -> None:
        self._runtime.run(self.end(tx_id, queues, commit), self._call_timeout_ms * max(len(queues), 1))

    async def end(self, tx_id: str, queues: list[QueueKey], commit: bool) -> None:
        """END_TRANSACTION to the current leader of each of ``queues`` until each answered, with
        the producer's retries and backoff on retriable errors (routes looked up again first)."""
        pending = set(queues)
        routes = self._runtime.routes
        fields = {"tx_id": tx_id, "commit": commit, "acks": self._acks}
        for attempt in itertools.count():
            failure: GmsError | None = None
            try:
                leaders = await self._leaders(pending)
            except GmsError as err:
                if not err.retriable:
                    raise
                failure, leaders = err, {}
            brokers = list(leaders)
            answers = await asyncio.gather(*(self._runtime.pool.request(b, RequestCode.END_TRANSACTION, fields)
                                             for b in brokers), return_exceptions=True)
            for broker, answer in zip(brokers, answers, strict=True):
                if not isinstance(answer, BaseException):
                    pending -= leaders[broker]
                elif isinstance(answer, GmsError) and answer.retriable:
                    failure = answer
                else:
                    raise answer
            if not pending:
                return
            if attempt >= self._retries:
                assert failure is not None
                raise failure
            log.debug("transaction %s: %s not answered yet (%r), retry %d", tx_id, sorted(pending), failure,
                      attempt + 1)
            routes.invalidate()
            await asyncio.sleep(self._retry_backoff_s * (attempt + 1))
        raise AssertionError("unreachable")

    async def _leaders(self, queues: set[QueueKey]) -> dict[str, set[QueueKey]]:
        """The broker leading each queue now, with the queues it leads."""
        leaders: dict[str, set[QueueKey]] = defaultdict(set)
        for topic in {topic for topic, _ in queues}:
            by_queue = {route.queue_id: route.broker for route in await self._runtime.routes.routes(topic)}
            for key in queues:
                if key[0] == topic and key[1] in by_queue:
                    leaders[by_queue[key[1]]].add(key)
        return leaders

    # --- check-backs ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._checks is not None:
            self._checks.cancel()

    async def _answer_checks(self) -> None:
        """Long-poll every broker for this group's transactions due for a check-back."""
        polls: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                try:
                    brokers = set(await self._runtime.routes.live_brokers())
                except GmsError as err:
                    log.debug("transaction checker: cannot list the brokers (%r)", err)
                    brokers = set(polls)
                for broker in brokers:
                    if broker not in polls or polls[broker].done():
                        polls[broker] = asyncio.create_task(self._poll(broker))
                for broker in set(polls) - brokers:
                    polls.pop(broker).cancel()
                await asyncio.sleep(BROKER_LIST_REFRESH_S)
        finally:
            for task in polls.values():
                task.cancel()
            await asyncio.gather(*polls.values(), return_exceptions=True)

    async def _poll(self, broker: str) -> None:
        poll_ms = min(CHECK_POLL_MS, self._runtime.request_timeout_ms / 2)
        while True:
            try:
                frame = await self._runtime.pool.request(
                    broker, RequestCode.CHECK_TRANSACTIONS, {"group": self.group, "poll_ms": int(poll_ms)},
                    timeout_ms=poll_ms + self._runtime.request_timeout_ms)
                rows = frame.fields["transactions"]
                messages = list(decode_pull_body(frame.body, msg_id_prefix(broker), MATCH_ALL))
            except GmsError as err:
                log.debug("transaction checker: %s: %r", broker, err)
                await asyncio.sleep(CHECK_RETRY_S)
                continue
            start = 0
            for row in rows:
                count = int(row["count"])
                await self._check(broker, str(row["tx_id"]), messages[start:start + count])
                start += count

    async def _check(self, broker: str, tx_id: str, messages: list[ReceivedMessage]) -> None:
        assert self._checker is not None
        try:
            state = await asyncio.to_thread(self._checker, tx_id, messages)
        except Exception:  # the application's checker failed: ask again at the next check
            log.exception("transaction checker failed on %s", tx_id)
            return
        if state not in (TransactionState.COMMIT, TransactionState.ROLLBACK):
            return
        fields: Mapping[str, Any] = {"tx_id": tx_id, "commit": state is TransactionState.COMMIT, "acks": self._acks}
        try:
            await self._runtime.pool.request(broker, RequestCode.END_TRANSACTION, fields)
        except TransactionNotFoundError as err:
            log.info("transaction %s: %s (%s)", tx_id, state.value, err)
        except GmsError as err:
            log.warning("transaction %s: cannot %s it on %s yet (%s); asked again at the next check",
                        tx_id, state.value, broker, err)
