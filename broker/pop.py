"""Pop consumption state (RocketMQ 5's SimpleConsumer, Kafka's share groups): what a group has
in flight on each queue this broker leads.

Any number of consumers of a group pop messages from any queue; each message is acknowledged on
its own, by its delivery (queue, offset and delivery attempt: the receipt handle), or becomes
visible again when its invisible duration ends, and is then handed out with its attempt one
higher. Per group and queue a :class:`PopQueue` holds ``next`` (the first offset never handed
out) and what is in flight: offset → (delivery attempt, visible again at ms). Every offset below
``next`` that is not in flight is done (acknowledged, or not the group's: another tag, a hidden
scheduled record, a damaged record).

Durability: the lowest offset in flight (else ``next``) is the group's committed offset on the
queue, and the state rides along with it in the offset store (:class:`gms.broker.offsets.
OffsetStore`): persisted with the offsets and replicated to the queue's followers with every
commit, so a restarted broker or a new leader carries on where the state was last saved or
replicated. What changed after that (a crash, a failover) is handed out again: at least once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Literal

import numpy as np

from gms.broker.offsets import OffsetStore, PopWire
from gms.broker.store import MessageStore

QueueKey = tuple[str, int]
GroupQueue = tuple[str, str, int]  # group, topic, queue id
# Where a group without a committed offset starts: "whole" is RocketMQ's rule for a new group,
# the first offset while the queue still holds every message it ever had, else the last.
StartFrom = Literal["first", "last", "whole"] | int

INFLIGHT_MAX = 20_000  # messages a group may have in flight per queue (Kafka's record locks)
WINDOW_MAX = 200_000  # and offsets from its lowest one in flight to its next fresh one
INVISIBLE_MS_MAX = 12 * 3600 * 1000  # RocketMQ's longest invisible duration
# An in-flight entry is one int: its delivery attempt above its visible-again time (epoch ms < 2**41).
ATTEMPT_SHIFT = 41
VISIBLE_MASK = (1 << ATTEMPT_SHIFT) - 1


def _entry(attempt: int, visible_at: int) -> int:
    return attempt << ATTEMPT_SHIFT | visible_at


class PopQueue:
    """A group's pop state on one queue: see the module docstring. ``inflight`` maps an offset
    to its entry, ``attempt << ATTEMPT_SHIFT | visible again at (ms)``."""

    __slots__ = ("_expiry", "_order", "_seq", "inflight", "next")

    def __init__(self, next_offset: int, inflight: dict[int, int] | None = None) -> None:
        self.next = next_offset
        self.inflight: dict[int, int] = inflight if inflight is not None else {}
        self._order: deque[int] = deque(sorted(self.inflight))  # handed-out offsets, ascending
        # Heap of (visible at, seq, offsets): an offset counts only while its entry's visible-at
        # time is still this one (acked or changed since: skipped when popped).
        self._expiry: list[tuple[int, int, tuple[int, ...]]] = []
        self._seq = itertools.count()
        for offset, entry in self.inflight.items():
            heapq.heappush(self._expiry, (entry & VISIBLE_MASK, next(self._seq), (offset,)))

    @classmethod
    def from_wire(cls, wire: PopWire, committed: int, low: int, high: int) -> PopQueue:
        """The state saved as ``wire`` (:meth:`wire`), cut to ``committed`` (the group's
        committed offset, which may be newer) and to the queue's readable ``[low, high)``."""
        next_offset, flat = int(wire[0]), wire[1]
        inflight = {int(flat[i]): _entry(int(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat) - 2, 3)
                    if max(committed, low) <= int(flat[i]) < high}
        return cls(min(max(next_offset, committed, low), high), inflight)

    def wire(self) -> PopWire:
        """``[next, [offset, attempt, visible at, ...]]``: what the offset store keeps and sends."""
        return [self.next, [n for offset, entry in self.inflight.items()
                            for n in (offset, entry >> ATTEMPT_SHIFT, entry & VISIBLE_MASK)]]

    def attempt(self, offset: int) -> int | None:
        """The delivery attempt of an offset in flight (None: not in flight)."""
        entry = self.inflight.get(offset)
        return None if entry is None else entry >> ATTEMPT_SHIFT

    def low(self) -> int:
        """The lowest offset in flight, else ``next``: everything below is done."""
        order, inflight = self._order, self.inflight
        while order and order[0] not in inflight:
            order.popleft()
        return order[0] if order else self.next

    def room(self) -> int:
        """How many fresh messages may be handed out now."""
        return max(0, min(INFLIGHT_MAX - len(self.inflight), self.low() + WINDOW_MAX - self.next))

    def _live(self, offset: int, visible_at: int) -> bool:
        entry = self.inflight.get(offset)
        return entry is not None and entry & VISIBLE_MASK == visible_at

    def next_visible(self) -> int | None:
        """When the next message in flight becomes visible again (ms; None: none in flight)."""
        expiry = self._expiry
        while expiry:
            at, _, offsets = expiry[0]
            if any(self._live(o, at) for o in offsets):
                return at
            heapq.heappop(expiry)
        return None

    def due(self, now_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` offsets in flight whose invisible duration is over (ascending): the
        caller hands each out again (:meth:`redeliver`) or drops it."""
        expiry = self._expiry
        found: dict[int, None] = {}
        while expiry and expiry[0][0] <= now_ms and len(found) < limit:
            at, _, offsets = heapq.heappop(expiry)
            live = [o for o in offsets if self._live(o, at) and o not in found]
            take, rest = live[:limit - len(found)], live[limit - len(found):]
            found.update(dict.fromkeys(take))
            if rest:
                heapq.heappush(expiry, (at, next(self._seq), tuple(rest)))
        return sorted(found)

    def due_in_order(self, now_ms: int, limit: int) -> list[int]:
        """FIFO: the offsets in flight from the lowest on whose invisible duration is over, up to
        the first that is still invisible (nothing after a message goes out before it)."""
        found: list[int] = []
        for offset in sorted(self.inflight):
            if self.inflight[offset] & VISIBLE_MASK > now_ms or len(found) == limit:
                break
            found.append(offset)
        return found

    def hand_out(self, offsets: list[int], visible_at: int, next_offset: int) -> None:
        """Fresh ``offsets`` (ascending, from ``next``) go out for the first time; ``next`` moves
        to ``next_offset`` (the offsets passed between them are done)."""
        self.inflight.update(zip(offsets, repeat(_entry(1, visible_at))))
        self._order.extend(offsets)
        if offsets:
            heapq.heappush(self._expiry, (visible_at, next(self._seq), tuple(offsets)))
        self.next = max(self.next, next_offset)

    def redeliver(self, offsets: list[int], visible_at: int) -> list[int]:
        """``offsets`` (due) go out again; their new delivery attempts."""
        inflight = self.inflight
        attempts = []
        for offset in offsets:
            attempt = (inflight[offset] >> ATTEMPT_SHIFT) + 1
            inflight[offset] = _entry(attempt, visible_at)
            attempts.append(attempt)
        if offsets:
            heapq.heappush(self._expiry, (visible_at, next(self._seq), tuple(offsets)))
        return attempts

    def ack(self, offsets: np.ndarray, attempts: np.ndarray) -> np.ndarray:
        """Acknowledge deliveries (offsets and their attempts); a mask of those whose handle no
        longer holds (handed out again since, or never handed out here). Acknowledging a done
        message again is fine. Vectorised: no Python step per message but the dict's own."""
        inflight = self.inflight
        listed = offsets.tolist()
        entries = np.fromiter(map(inflight.get, listed, repeat(-1)), np.int64, len(listed))
        held = (entries >= 0) & ((entries >> ATTEMPT_SHIFT) == attempts)
        if held.any():
            deque(map(inflight.pop, offsets[held].tolist(), repeat(None)), maxlen=0)  # a repeated one: once
        return ~held & ((entries >= 0) | (offsets >= self.next))

    def change_invisible(self, offset: int, attempt: int, visible_at: int) -> bool:
        """Make a delivery visible again at ``visible_at``; False if the handle no longer holds."""
        if self.attempt(offset) != attempt:
            return False
        self.inflight[offset] = _entry(attempt, visible_at)
        heapq.heappush(self._expiry, (visible_at, next(self._seq), (offset,)))
        return True

    def drop(self, offsets: Iterable[int]) -> None:
        """Forget messages that cannot be served any more (deleted by retention, damaged)."""
        for offset in offsets:
            self.inflight.pop(offset, None)


class PopService:
    """The pop state of every group on every queue this broker leads, kept in the offset store.

    ``serves(key)``: whether this broker leads the queue now; ``readable(key)``: its readable
    offsets ``(min, end)`` (end: the high watermark on a replicated queue); ``on_commit``: hears
    of queues whose committed offsets changed (followers copy them)."""

    def __init__(self, store: MessageStore, offsets: OffsetStore, *, serves: Callable[[QueueKey], bool],
                 readable: Callable[[QueueKey], tuple[int, int]],
                 on_commit: Callable[[list[QueueKey]], None]) -> None:
        self.store = store
        self.offsets = offsets
        self.serves = serves
        self.readable = readable
        self._on_commit = on_commit
        self._live: dict[GroupQueue, PopQueue] = {}

    def queue(self, group: str, topic: str, queue_id: int, start: StartFrom = "last") -> PopQueue:
        """The group's state on a queue this broker leads: the live one, else the one the offset
        store holds (saved, or replicated from the previous leader), else a new one at the
        group's committed offset or at ``start``."""
        key = (group, topic, queue_id)
        live = self._live.get(key)
        offsets = self.offsets
        if live is not None and offsets.pop_state(*key) is live:
            return live  # not reset, deleted or replaced by a replicated commit since
        low, high = self.readable((topic, queue_id))
        committed = offsets.get(*key)
        saved = offsets.pop_state(*key)
        if committed is not None and isinstance(saved, list):
            state = PopQueue.from_wire(saved, committed, low, high)
        else:
            state = PopQueue(min(max(committed if committed is not None else self._start(topic, queue_id, start),
                                     low), high))
        self._live[key] = state
        self.commit([key])
        return state

    def existing(self, group: str, topic: str, queue_id: int) -> PopQueue | None:
        """The group's state on the queue if it pops there (as :meth:`queue`; None: it never did,
        or its offsets were reset or deleted since)."""
        if self.offsets.pop_state(group, topic, queue_id) is None:
            return None
        return self.queue(group, topic, queue_id)

    def _start(self, topic: str, queue_id: int, start: StartFrom) -> int:
        if start == "first":
            return self.store.min_offset(topic, queue_id)
        if start == "last":
            return self.readable((topic, queue_id))[1]
        if start == "whole":
            low, high = self.readable((topic, queue_id))
            return low if low == 0 else high
        return self.store.offset_for_timestamp(topic, queue_id, int(start))

    def commit(self, keys: Iterable[GroupQueue]) -> None:
        """Commit the groups' states on these queues (their lowest offsets in flight)."""
        changed: list[QueueKey] = []
        for key in keys:
            state = self._live.get(key)
            if state is not None:
                group, topic, queue_id = key
                self.offsets.commit(group, topic, queue_id, state.low(), state)
                changed.append((topic, queue_id))
        if changed:
            self._on_commit(changed)

    def leadership_changed(self) -> None:
        """Forget the live state of queues this broker no longer leads (the offset store keeps
        their last commit; a new leader's replicated commits replace it)."""
        for key in [k for k in self._live if not self.serves((k[1], k[2]))]:
            state = self._live.pop(key)
            if self.offsets.pop_state(*key) is state:
                self.offsets.commit(*key, state.low(), state.wire())  # frozen: no longer changes

    def in_flight(self) -> int:
        """Messages popped from queues led here and not yet acknowledged."""
        return sum(len(s.inflight) for s in list(self._live.values()))
