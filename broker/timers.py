"""Scheduled messages: hidden in their queue until their time, then delivered as a visible copy.

A producer sends a record with ``FLAG_SCHEDULED`` and its delivery time in the property
``__DELIVER_AT_MS``. The store appends it to its queue like any message (acknowledged per the
flush and acks mode, replicated to the queue's followers) but indexes it as hidden, so consumers
skip it. At its time the queue's leader appends a copy without the flag (``FLAG_TIMER_COPY``,
property ``__TIMER_ORIGIN`` = the scheduled record's queue offset): that copy is what consumers
receive. Both live in the same queue, so scheduled messages are as durable as the queue and
follow its leadership.

Every replica of a queue follows its scheduled records (the store tells :class:`TimerService`
of each append, the replicated ones included) and forgets those whose copy, or cancel, it sees;
only the leader fires. What is pending survives restarts without a timer log: a checkpoint
keeps, per queue, the lowest offset with an undelivered scheduled record, and a restart rescans
the queue from there (the rescan sees copies too, so nothing delivered before a crash is
delivered again, unless the copy itself was lost in it). Retention never passes that offset.
At-least-once: a leader that dies after appending a copy its followers have not fetched leaves
a new leader to fire the message again.

A transaction's half messages (``FLAG_HALF``) are followed the same way, as pending records
without a time: they never fire by themselves; the :class:`TransactionListener`
(broker/transactions.py) hears of them and of the copies and cancels that carry their
transaction id, and appends those itself (docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from gms.broker.atomic_file import write_atomically
from gms.broker.store import MessageStore, TimerRecord
from gms.errors import GmsError, MessageNotFoundError
from gms.record import decode_record, encode_record
from gms.record.codec import Record
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_HALF,
    FLAG_SCHEDULED,
    FLAG_TIMER_CANCEL,
    FLAG_TIMER_COPY,
    ORIGIN_PROPERTY,
    TX_ID_PROPERTY,
)
from gms.store_errors import StoreError

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
OFFSET_BITS = 40  # a wheel entry packs (queue index << OFFSET_BITS | queue offset) in one int64
CHECKPOINT_INTERVAL_S = 1.0
IDLE_RECHECK_S = 1.0  # how often due messages of queues this broker does not lead are looked at again
FIRE_BATCH_MAX = 1000  # copies per append
RETRY_BACKOFF_S = 0.5
NEVER_MS = 1 << 62  # the "delivery time" of a half message: pending until its transaction is decided


def now_ms() -> int:
    return int(time.time() * 1000)


class PendingQueue:
    """The undelivered scheduled records of one queue, compactly (16 bytes each, a million in
    16 MB): their offsets (ascending: records are followed in queue order) and delivery times in
    two arrays; delivered or cancelled ones are set aside in ``_done`` and compacted away once
    they are half of the arrays."""

    __slots__ = ("_at", "_done", "_first", "_offsets")

    def __init__(self) -> None:
        self._offsets: array[int] = array("q")
        self._at: array[int] = array("q")
        self._done: set[int] = set()
        self._first = 0  # no live entry before this index

    def __len__(self) -> int:
        return len(self._offsets) - len(self._done)

    def add(self, offset: int, at: int) -> None:
        offsets = self._offsets
        if not offsets or offset > offsets[-1]:
            offsets.append(offset)
            self._at.append(at)
            return
        i = bisect_left(offsets, offset)
        if offsets[i] == offset:  # followed again (a rescan): it is pending, at its time
            self._done.discard(offset)
            self._at[i] = at
            self._first = min(self._first, i)
            return
        offsets.insert(i, offset)
        self._at.insert(i, at)
        self._first = min(self._first, i)

    def at(self, offset: int) -> int | None:
        """When the record at ``offset`` is due (None: not pending)."""
        offsets = self._offsets
        i = bisect_left(offsets, offset)
        if i == len(offsets) or offsets[i] != offset or offset in self._done:
            return None
        return self._at[i]

    def remove(self, offset: int) -> None:
        """Delivered or cancelled."""
        if self.at(offset) is None:
            return
        self._done.add(offset)
        if len(self._done) > 1024 and 2 * len(self._done) > len(self._offsets):
            self._compact()

    def low(self) -> int | None:
        """The lowest pending offset."""
        offsets, done = self._offsets, self._done
        first = self._first
        while first < len(offsets) and offsets[first] in done:
            first += 1
        self._first = first
        return offsets[first] if first < len(offsets) else None

    def _compact(self) -> None:
        offsets = np.frombuffer(self._offsets, np.int64)
        keep = ~np.isin(offsets, np.fromiter(self._done, np.int64, len(self._done)))
        self._offsets = array("q", offsets[keep].tobytes())
        self._at = array("q", np.frombuffer(self._at, np.int64)[keep].tobytes())
        self._done = set()
        self._first = 0


class TransactionListener(Protocol):
    """What the transaction service hears from the timer service (on the broker's loop)."""

    def half(self, key: QueueKey, offset: int, stored: Record) -> None:
        """A half message was stored at ``offset`` (sent, replicated, or seen again by a rescan)."""

    def decided(self, key: QueueKey, origin: int, offset: int, stored: Record) -> None:
        """A copy (commit) or cancel (rollback) of the half message at ``origin``, naming its
        transaction, was stored at ``offset``."""

    def forget_queue(self, key: QueueKey) -> None:
        """What is known of the queue is gone (truncated: it is rescanned; or deleted)."""

    def hold(self, key: QueueKey) -> int | None:
        """The lowest offset of the queue that a restart must rescan for transactions (None: none)."""


class TimerService:
    """Follows the scheduled records of every local queue and fires those this broker leads.

    ``may_fire(key)``: whether this broker leads the queue now. ``append(records, key)``: store
    the copies as a send would (leadership checked, replicas and waiting pulls told); raises a
    GmsError when it cannot. All methods run on the broker's event loop (the store's appends do).
    """

    def __init__(self, store: MessageStore, checkpoint_path: Path, *, may_fire: Callable[[QueueKey], bool],
                 append: Callable[[bytes, QueueKey], None]) -> None:
        self.store = store
        self._checkpoint_path = checkpoint_path
        self._may_fire = may_fire
        self._append = append
        # What is pending, compactly (a million pending messages cost ~24 bytes each): per queue
        # its offsets and delivery times, and a wheel of one-second slots, each an array of packed
        # (queue index, offset) entries, pruned lazily (a delivered or cancelled entry is skipped).
        self._pending: dict[QueueKey, PendingQueue] = {}
        self._keys: list[QueueKey] = []
        self._key_index: dict[QueueKey, int] = {}
        self._wheel: dict[int, array[int]] = {}
        self._slots: list[int] = []  # heap of the wheel's slot seconds
        # Entries of the seconds that came due, as a heap of (deliver at ms, packed entry).
        self._near: list[tuple[int, int]] = []
        self._near_second = -1
        self._sleeping_until = 1 << 62  # when the firing loop wakes next by itself (ms)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._saved: dict[str, int] = {}
        self.transactions: TransactionListener | None = None  # half messages' transactions (set by the server)

    # --- what is pending -------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return sum(len(p) for p in self._pending.values())

    def low(self, topic: str, queue_id: int) -> int | None:
        """The queue's lowest offset holding an undelivered scheduled record or an undecided half
        message, or a transaction decision still needed by a restart (None: none)."""
        pending = self._pending.get((topic, queue_id))
        low = pending.low() if pending is not None else None
        hold = self.transactions.hold((topic, queue_id)) if self.transactions is not None else None
        return hold if low is None else low if hold is None else min(low, hold)

    def deliver_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """When the scheduled record at ``offset`` fires (None: not pending)."""
        pending = self._pending.get((topic, queue_id))
        return pending.at(offset) if pending is not None else None

    def appended(self, records: list[TimerRecord]) -> None:
        """The store's listener: follow new scheduled records, forget delivered or cancelled ones."""
        for record in records:
            self._follow(record)
        soonest = self._soonest()
        if soonest is not None and soonest < self._sleeping_until:
            self._wake.set()  # due sooner than what the firing loop waits for

    def truncated(self, topic: str, queue_id: int) -> None:
        """A follower's queue was cut back: what is pending there is recomputed from the checkpoint."""
        key = (topic, queue_id)
        low = self._checkpoint_low(key)
        self._pending.pop(key, None)
        if self.transactions is not None:
            self.transactions.forget_queue(key)
        self._rescan(key, low)
        self._wake.set()

    def deleted(self, topic: str) -> None:
        """The topic was deleted: its scheduled messages went with it."""
        for key in [k for k in self._pending if k[0] == topic]:
            del self._pending[key]
            if self.transactions is not None:
                self.transactions.forget_queue(key)

    def _follow(self, record: TimerRecord) -> None:
        key = (record.topic, record.queue_id)
        try:
            stored = decode_record(self.store.read_at(record.phys), verify_crc=False)
        except (StoreError, ValueError) as err:
            log.error("%s/%d@%d: cannot read a timer record: %s", *key, record.queue_offset, err)
            return
        if record.flags & FLAG_HALF:
            self._pending_queue(key).add(record.queue_offset, NEVER_MS)
            if self.transactions is not None:
                self.transactions.half(key, record.queue_offset, stored)
        elif record.flags & FLAG_SCHEDULED:
            try:
                at = int(stored.properties[DELIVER_AT_PROPERTY])
            except (KeyError, ValueError):
                log.error("%s/%d@%d: scheduled record without a valid %s; delivering it now",
                          *key, record.queue_offset, DELIVER_AT_PROPERTY)
                at = 0
            self._pending_queue(key).add(record.queue_offset, at)
            self._schedule(key, record.queue_offset, at)
        elif record.flags & (FLAG_TIMER_COPY | FLAG_TIMER_CANCEL):
            try:
                origin = int(stored.properties[ORIGIN_PROPERTY])
            except (KeyError, ValueError):
                return
            pending = self._pending.get(key)
            if pending is not None:
                pending.remove(origin)
            if self.transactions is not None and TX_ID_PROPERTY in stored.properties:
                self.transactions.decided(key, origin, record.queue_offset, stored)

    def _pending_queue(self, key: QueueKey) -> PendingQueue:
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = PendingQueue()
        return pending

    def _schedule(self, key: QueueKey, offset: int, at: int) -> None:
        index = self._key_index.get(key)
        if index is None:
            index = self._key_index[key] = len(self._keys)
            self._keys.append(key)
        packed = index << OFFSET_BITS | offset
        second = at // 1000
        if second <= self._near_second:
            heapq.heappush(self._near, (at, packed))
            return
        slot = self._wheel.get(second)
        if slot is None:
            slot = self._wheel[second] = array("q")
            heapq.heappush(self._slots, second)
        slot.append(packed)

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Rescan every queue from its checkpoint, then fire what comes due."""
        saved = self._load_checkpoint()
        for key in self.store.queues_opened():  # the others hold no record, so nothing scheduled
            self._rescan(key, saved.get(_name(key), 0))
        if self._pending:
            log.info("%d scheduled message(s) pending", self.pending_count)
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoints())

    async def stop(self) -> None:
        for task in (self._task, self._checkpoint_task):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._checkpoint_task) if t is not None),
                             return_exceptions=True)
        self._save_checkpoint()

    def cancel(self, topic: str, queue_id: int, offset: int) -> None:
        """Cancel the pending scheduled message at ``offset``: a hidden cancel record is appended
        to its queue (replicated like the rest); MessageNotFoundError if it is not pending."""
        key = (topic, queue_id)
        if self.deliver_at(topic, queue_id, offset) is None:
            raise MessageNotFoundError(f"{topic}/{queue_id}@{offset} is not a scheduled message still to deliver"
                                       " (delivered or cancelled already)")
        self._append(cancel_record(key, offset), key)

    def leadership_changed(self) -> None:
        """Queues may have come to this broker: look at what is due."""
        self._wake.set()

    def _rescan(self, key: QueueKey, start: int) -> None:
        try:
            records = list(self.store.timer_records(*key, start))
        except (StoreError, ValueError) as err:
            log.error("%s/%d: cannot rescan for scheduled messages: %s", *key, err)
            return
        for record in records:
            self._follow(record)

    # --- firing -------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            next_due = self._fire_due()
            self._sleeping_until = next_due if next_due is not None else 1 << 62
            delay = None if next_due is None else max(next_due - now_ms(), 0) / 1000
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _soonest(self) -> int | None:
        """When the next pending entry is due (to the second for those still in the wheel)."""
        candidates = [self._near[0][0]] if self._near else []
        if self._slots:
            candidates.append(self._slots[0] * 1000)
        return min(candidates) if candidates else None

    def _fire_due(self) -> int | None:
        """Append copies of what is due on queues this broker leads (those it cannot deliver now,
        on a queue led elsewhere or after a failed append, are looked at again a little later);
        when the next one is due."""
        now = now_ms()
        mask = (1 << OFFSET_BITS) - 1
        near = self._near
        while self._slots and self._slots[0] <= now // 1000:  # slots come due: into the near heap
            second = heapq.heappop(self._slots)
            for packed in self._wheel.pop(second):
                at = self.deliver_at(*self._keys[packed >> OFFSET_BITS], packed & mask)
                if at is not None:
                    heapq.heappush(near, (at, packed))
        self._near_second = max(self._near_second, now // 1000)
        due: dict[QueueKey, dict[int, None]] = {}  # ordered sets: a rescan may have scheduled one twice
        while near and near[0][0] <= now:
            packed = heapq.heappop(near)[1]
            key, offset = self._keys[packed >> OFFSET_BITS], packed & mask
            if self.deliver_at(*key, offset) is not None:  # not delivered or cancelled meanwhile
                due.setdefault(key, {})[offset] = None
        retry_at = now + int(IDLE_RECHECK_S * 1000)
        for key, offset_set in due.items():
            offsets = list(offset_set)
            held = offsets if not self._may_fire(key) else self._fire(key, offsets)
            for offset in held:
                heapq.heappush(near, (retry_at, self._key_index[key] << OFFSET_BITS | offset))
        return self._soonest()

    def _fire(self, key: QueueKey, offsets: list[int]) -> list[int]:
        """Append the copies of ``offsets``; the ones not delivered come back."""
        for start in range(0, len(offsets), FIRE_BATCH_MAX):
            chunk = offsets[start:start + FIRE_BATCH_MAX]
            try:
                copies = b"".join(self.copy(key, offset) for offset in chunk)
                self._append(copies, key)
            except (GmsError, StoreError, ValueError) as err:
                log.warning("%s/%d: cannot deliver %d scheduled message(s) yet: %s", *key, len(chunk), err)
                return offsets[start:]
        return []

    def copy(self, key: QueueKey, offset: int) -> bytes:
        """The visible copy of the scheduled record (or half message) at ``offset``."""
        original = decode_record(self.store.read_entry(*key, offset), verify_crc=True)
        properties = {**original.properties, ORIGIN_PROPERTY: str(offset)}
        return encode_record(topic=original.topic, body=original.body, tag=original.tag, keys=original.keys,
                             properties=properties, queue_id=key[1], flags=FLAG_TIMER_COPY,
                             born_host=original.born_host, born_ts_ms=original.born_ts_ms,
                             reconsume_times=original.reconsume_times)

    # --- checkpoints ------------------------------------------------------------------------------

    def _checkpoint_low(self, key: QueueKey) -> int:
        return self._saved.get(_name(key), 0)

    def _current_checkpoint(self) -> dict[str, int]:
        """Per queue: its lowest pending offset, else its end (nothing below needs a rescan).
        Only the queues the store has opened: an empty queue is not opened for it (thousands of
        them would be, at every checkpoint), and one that gets records later is rescanned whole."""
        lows: dict[str, int] = {}
        for key in self.store.queues_opened():
            low = self.low(*key)
            try:
                lows[_name(key)] = low if low is not None else self.store.max_offset(*key)
            except StoreError:
                continue
        return lows

    async def _checkpoints(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            lows = self._current_checkpoint()
            if lows == self._saved:
                continue
            try:  # the encoding and the fsyncs off the event loop
                await asyncio.to_thread(self._write_checkpoint, lows)
            except OSError as err:
                log.warning("cannot save the timer checkpoint: %s", err)

    def _save_checkpoint(self) -> None:
        lows = self._current_checkpoint()
        if lows != self._saved:
            self._write_checkpoint(lows)

    def _write_checkpoint(self, lows: dict[str, int]) -> None:
        write_atomically(self._checkpoint_path, json.dumps(lows, sort_keys=True).encode())
        self._saved = lows

    def _load_checkpoint(self) -> dict[str, int]:
        try:
            self._saved = {str(k): int(v) for k, v in json.loads(self._checkpoint_path.read_bytes()).items()}
        except FileNotFoundError:
            self._saved = {}
        except (OSError, ValueError, AttributeError) as err:
            log.warning("timer checkpoint %s unreadable (%s): rescanning every queue", self._checkpoint_path, err)
            self._saved = {}
        return self._saved


def _name(key: QueueKey) -> str:
    return f"{key[0]}/{key[1]}"


def cancel_record(key: QueueKey, offset: int, properties: dict[str, str] | None = None) -> bytes:
    """The hidden record cancelling the pending record at ``offset`` of queue ``key``."""
    return encode_record(topic=key[0], body=b"\0", queue_id=key[1], flags=FLAG_TIMER_CANCEL,
                         properties={**(properties or {}), ORIGIN_PROPERTY: str(offset)})
