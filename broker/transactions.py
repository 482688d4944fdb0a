"""Transactional messages (RocketMQ's half messages): what each transaction holds, its decision,
its check-backs.

A half message (``FLAG_HALF``, properties ``__TX_ID`` and ``__TX_GROUP``) is stored hidden in its
own topic and queue; the :class:`~gms.broker.timers.TimerService` follows it on every replica as a
pending record without a time, and tells this service. A commit is the visible copies of the
transaction's pending halves on a queue (``FLAG_TIMER_COPY``, keeping ``__TX_ID``), a rollback
hidden cancels naming them (also carrying ``__TX_ID``); the timer service tells this service of
those too, whoever appended them (an END_TRANSACTION here, a replicated leader's, a rescan after
a restart). So the log alone holds every transaction's state, and this service only indexes it:

- the open transactions: tx id → its pending halves per queue, producer group, first store time;
- the recent decisions (bounded): tx id → committed or rolled back, for idempotent answers and
  for finishing a transaction whose decision is in the log but whose halves on some queue this
  broker leads are still pending (a crash in the middle of a commit, a failover);
- per queue, the offsets of recent decision records, which the timer checkpoint does not pass
  (a restart rescans them, so it knows the decisions again).

The leader of a queue counts check-backs of the open transactions with halves there: the first
when ``transaction_timeout_ms`` passed since the first half was stored, then every
``transaction_check_interval_ms``; after ``transaction_check_max`` checks it rolls the transaction
back. Producers of the group long-poll for the due ones (CHECK_TRANSACTIONS). Check counts live
in memory only: after a restart or failover they start again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import insort
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gms.broker.store import MessageStore
from gms.broker.timers import QueueKey, TimerService, cancel_record
from gms.errors import GmsError
from gms.protocol.groups import TransactionQueue
from gms.protocol.rows import encode
from gms.record.codec import Record
from gms.record.layout import FLAG_TIMER_COPY, TX_GROUP_PROPERTY, TX_ID_PROPERTY, TX_TIMEOUT_PROPERTY
from gms.store_errors import StoreError

log = logging.getLogger(__name__)

DECISIONS_MAX = 100_000  # recent decisions kept in memory (idempotent END_TRANSACTION answers)
# A decision record stays in the rescan range of a restart this long (and while its transaction
# still has halves pending on this broker): a producer retrying its commit after a broker crash
# gets OK, not TRANSACTION_NOT_FOUND.
DECISION_MEMORY_MS = 60_000
TICK_S = 0.2  # how often due check-backs, timeouts and unfinished decisions are looked at
CHECK_ANSWER_TRANSACTIONS_MAX = 64  # transactions per CHECK_TRANSACTIONS answer
RESOLVE_BATCH_MAX = 1000  # copies or cancels per append


@dataclass(frozen=True, kw_only=True)
class TransactionConfig:
    """RocketMQ's defaults: first check-back after 6 s, then every 30 s, at most 15 checks."""

    timeout_ms: int = 6_000
    check_interval_ms: int = 30_000
    check_max: int = 15

    def __post_init__(self) -> None:
        if self.timeout_ms < 0 or self.check_interval_ms <= 0 or self.check_max < 0:
            raise ValueError("transaction_timeout_ms and transaction_check_max must be >= 0, "
                             "transaction_check_interval_ms > 0")


class OpenTransaction:
    """A transaction with pending halves on this broker (on queues it leads or follows)."""

    __slots__ = ("checks", "group", "halves", "next_check_ms", "stored_ms", "tx_id")

    def __init__(self, tx_id: str, group: str, stored_ms: int, first_check_ms: int) -> None:
        self.tx_id = tx_id
        self.group = group
        self.stored_ms = stored_ms  # store time of its first half seen here
        self.halves: dict[QueueKey, list[int]] = {}  # pending halves' queue offsets, ascending
        self.checks = 0  # check-backs counted (by this broker, since it started or took the queues)
        self.next_check_ms = first_check_ms


def now_ms() -> int:
    return int(time.time() * 1000)


class TransactionService:
    """Indexes the transactions of the local queues and resolves those this broker leads.

    ``leads(key)``: whether this broker leads the queue now. ``append(records, key)``: store
    records the broker writes (copies, cancels) as a send with acks=1 would (GmsError when it
    cannot). Runs on the broker's event loop."""

    def __init__(self, store: MessageStore, timers: TimerService, config: TransactionConfig, *,
                 leads: Callable[[QueueKey], bool], append: Callable[[bytes, QueueKey], None]) -> None:
        self.store = store
        self.timers = timers
        self.config = config
        self._leads = leads
        self._append = append
        self._open: dict[str, OpenTransaction] = {}
        self._decided: OrderedDict[str, bool] = OrderedDict()  # tx id → committed
        self._marks: dict[QueueKey, deque[tuple[int, int, str]]] = {}  # (offset, store ms, tx id)
        self._due: dict[str, dict[str, None]] = {}  # group → tx ids to ask its producers about
        # group → (its event, how many long polls wait on it): gone when none does (clients name groups)
        self._due_waits: dict[str, tuple[asyncio.Event, list[int]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        timers.transactions = self

    # --- what the timer service tells ------------------------------------------------------------

    def half(self, key: QueueKey, offset: int, stored: Record) -> None:
        properties = stored.properties
        tx_id = properties.get(TX_ID_PROPERTY, "")
        tx = self._open.get(tx_id)
        if tx is None:
            try:
                timeout_ms = int(properties.get(TX_TIMEOUT_PROPERTY, self.config.timeout_ms))
            except ValueError:
                timeout_ms = self.config.timeout_ms
            # bounded like the furthest delivery time: a half never checked would hold retention for good
            timeout_ms = min(max(timeout_ms, 0), self.store.config.schedule_max_delay_ms)
            tx = self._open[tx_id] = OpenTransaction(tx_id, properties.get(TX_GROUP_PROPERTY, ""),
                                                     stored.store_ts_ms, stored.store_ts_ms + timeout_ms)
        offsets = tx.halves.setdefault(key, [])
        if offset not in offsets:  # a rescan sees it again
            insort(offsets, offset)
        if tx_id in self._decided:
            self._wake.set()  # decided already (a rescan of a half below a decision): finish it

    def decided(self, key: QueueKey, origin: int, offset: int, stored: Record) -> None:
        tx_id = stored.properties[TX_ID_PROPERTY]
        self._remember(tx_id, bool(stored.flags & FLAG_TIMER_COPY))
        tx = self._open.get(tx_id)
        if tx is not None:
            offsets = tx.halves.get(key, [])
            if origin in offsets:
                offsets.remove(origin)
                if not offsets:
                    del tx.halves[key]
            if not tx.halves:
                del self._open[tx_id]
            else:
                self._wake.set()  # halves left elsewhere: finish them where this broker leads
        marks = self._marks.setdefault(key, deque())
        if not marks or offset > marks[-1][0]:
            marks.append((offset, stored.store_ts_ms, tx_id))

    def forget_queue(self, key: QueueKey) -> None:
        self._marks.pop(key, None)
        for tx_id, tx in list(self._open.items()):
            if tx.halves.pop(key, None) is not None and not tx.halves:
                del self._open[tx_id]

    def hold(self, key: QueueKey) -> int | None:
        marks = self._marks.get(key)
        if not marks:
            return None
        oldest = now_ms() - DECISION_MEMORY_MS
        while marks and marks[0][1] < oldest and marks[0][2] not in self._open:
            marks.popleft()
        return marks[0][0] if marks else None

    def _remember(self, tx_id: str, committed: bool) -> None:
        decided = self._decided
        decided[tx_id] = committed
        decided.move_to_end(tx_id)
        if len(decided) > DECISIONS_MAX:
            decided.popitem(last=False)

    # --- queries ------------------------------------------------------------------------------------

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def pending_halves(self) -> int:
        return sum(len(offsets) for tx in self._open.values() for offsets in tx.halves.values())

    def lookup(self, tx_id: str) -> tuple[OpenTransaction | None, bool | None]:
        """The open transaction (None: no pending half here) and its decision (None: undecided
        or forgotten)."""
        return self._open.get(tx_id), self._decided.get(tx_id)

    def led_halves(self, tx: OpenTransaction) -> dict[QueueKey, list[int]]:
        """The transaction's pending halves on queues this broker leads."""
        return {key: list(offsets) for key, offsets in tx.halves.items() if self._leads(key)}

    def resolution(self, tx_id: str, halves: dict[QueueKey, list[int]], commit: bool,
                   batch_max: int | None = RESOLVE_BATCH_MAX) -> list[tuple[QueueKey, bytes]]:
        """The records that commit (visible copies) or roll back (cancels) ``halves``, as appends
        of at most ``batch_max`` records (None: one append), each with a queue it touches."""
        tag = {TX_ID_PROPERTY: tx_id}
        records = [(key, self.timers.copy(key, offset) if commit else cancel_record(key, offset, tag))
                   for key in sorted(halves) for offset in halves[key]]
        step = batch_max or len(records)
        return [(records[i][0], b"".join(r for _, r in records[i:i + step])) for i in range(0, len(records), step)]

    def listing(self) -> list[dict[str, Any]]:
        """The open transactions (LIST_TRANSACTIONS rows): their halves on the queues this broker
        leads (``leader``), else on all the queues it follows."""
        now = now_ms()
        rows = []
        for tx in self._open.values():
            decision = self._decided.get(tx.tx_id)
            led = [key for key in sorted(tx.halves) if self._leads(key)]
            shown = led or sorted(tx.halves)
            rows.append({
                "tx_id": tx.tx_id, "group": tx.group, "age_ms": max(now - tx.stored_ms, 0), "checks": tx.checks,
                "queues": [encode(TransactionQueue(topic, queue_id, len(tx.halves[(topic, queue_id)])))
                           for topic, queue_id in shown],
                "messages": sum(len(tx.halves[key]) for key in shown), "leader": bool(led),
                "state": "open" if decision is None else "committing" if decision else "rolling back",
            })
        return rows

    # --- check-backs ------------------------------------------------------------------------------

    def take_due(self, group: str, limit: int = CHECK_ANSWER_TRANSACTIONS_MAX) -> list[OpenTransaction]:
        """Up to ``limit`` transactions of ``group`` due for a check-back, each handed out once
        per check."""
        due = self._due.get(group)
        taken: list[OpenTransaction] = []
        while due and len(taken) < limit:
            tx_id = next(iter(due))
            del due[tx_id]
            tx = self._open.get(tx_id)
            if tx is not None and tx_id not in self._decided and self.led_halves(tx):
                taken.append(tx)
        return taken

    async def wait_due(self, group: str, timeout_s: float) -> None:
        """Until a transaction of ``group`` comes due (after this call began), ``timeout_s`` or stop."""
        event, waiting = self._due_waits.setdefault(group, (asyncio.Event(), [0]))
        event.clear()
        waiting[0] += 1
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            waiting[0] -= 1
            if not waiting[0]:
                del self._due_waits[group]

    def half_records(self, tx: OpenTransaction) -> list[memoryview]:
        """The stored half messages of ``tx`` on the queues this broker leads."""
        return [self.store.read_entry(*key, offset) for key, offsets in sorted(self.led_halves(tx).items())
                for offset in offsets]

    # --- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """After the timer service's rescan: finish what the log decided, count check-backs."""
        if self._open:
            log.info("%d open transaction(s)", len(self._open))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for event, _ in self._due_waits.values():
            event.set()

    @property
    def stopped(self) -> bool:
        return self._task is None or self._task.done()

    def leadership_changed(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                self._tick(now_ms())
            except Exception:  # a bug here must not stop check-backs for good
                log.exception("transaction check failed")
            try:
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _tick(self, now: int) -> None:
        for tx in list(self._open.values()):
            led = self.led_halves(tx)
            if not led:
                continue
            decision = self._decided.get(tx.tx_id)
            if decision is not None:
                log.info("transaction %s: %s its halves on %s", tx.tx_id,
                         "committing" if decision else "rolling back", sorted(led))
                self._resolve(tx.tx_id, led, decision)
            elif now >= tx.next_check_ms:
                if tx.checks >= self.config.check_max:
                    log.warning("transaction %s of producer group %r: no decision after %d check-back(s) "
                                "over %d ms; rolled back", tx.tx_id, tx.group, tx.checks, now - tx.stored_ms)
                    self._resolve(tx.tx_id, led, False)
                    continue
                tx.checks += 1
                tx.next_check_ms = now + self.config.check_interval_ms
                self._due.setdefault(tx.group, {})[tx.tx_id] = None
                if (waits := self._due_waits.get(tx.group)) is not None:
                    waits[0].set()

    def _resolve(self, tx_id: str, halves: dict[QueueKey, list[int]], commit: bool) -> None:
        try:
            for key, records in self.resolution(tx_id, halves, commit):
                self._append(records, key)
        except (GmsError, StoreError, ValueError) as err:
            log.warning("transaction %s: cannot %s yet (%s); retrying", tx_id, "commit" if commit else "roll back", err)
