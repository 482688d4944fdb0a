"""One queue's replication state on this broker: its role, the leader's view of its followers,
the high watermark and the acks=-1 sends waiting for it.

Pure bookkeeping on the broker's event loop (no I/O): the replica manager feeds it fetches and
appends and acts on what it returns.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
from collections import deque
from dataclasses import dataclass, field

from gms.broker.ha.epochs import EpochHistory
from gms.errors import STORED_FIELD, GmsError

QueueKey = tuple[str, int]
APPENDS_TIMED_MAX = 10_000  # leader appends waiting for the HW that are timed (metrics); more are not


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    OFFLINE = "offline"  # no leader elected, or this broker was removed from the replicas


@dataclass(slots=True)
class FollowerProgress:
    """The leader's view of one follower (Kafka's Replica state on the leader)."""

    leo: int = 0  # the follower has every offset below this (its last fetch offset)
    known: bool = False  # False until its first fetch in the current epoch
    last_caught_up_s: float = 0.0  # last time it had everything the leader had
    last_fetch_s: float = 0.0
    last_fetch_leo: int = 0  # the leader's log end offset when it answered the last fetch


@dataclass(slots=True)
class Partition:
    key: QueueKey
    history: EpochHistory
    hw: int = 0
    role: Role = Role.OFFLINE
    leader_id: str | None = None
    leader_address: str | None = None
    leader_epoch: int = -1
    isr: tuple[str, ...] = ()  # the ISR this broker acts on (as leader: once etcd took it)
    stored_isr: tuple[str, ...] = ()  # the ISR etcd holds, as the watch last delivered it
    replicas: tuple[str, ...] = ()
    min_insync: int = 1
    followers: dict[str, FollowerProgress] = field(default_factory=dict)
    # Follower side: the queue must be truncated (OFFSET_FOR_LEADER_EPOCH) before fetching.
    needs_truncation: bool = False
    # Follower side: its log end reached the leader's HW in this leader epoch.
    caught_up: bool = False
    # Follower side: the leader refused (epochs differ, not the leader): retry after this
    # monotonic time, when one of the two has learnt the new metadata.
    fetch_paused_until: float = 0.0
    isr_update_pending: bool = False
    # Leader side: the leader epoch whose history entry is not on disk yet; no append is taken
    # in it until it is (a restart must know where the epoch began).
    unsaved_epoch: int | None = None
    # Follower side: (leader's offset-store session, seq) of the consumer-group commits of this
    # queue already copied from the leader (see OffsetStore.changed_since).
    offsets_seen: tuple[int, int] = (0, 0)
    _waiters: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    _waiter_seq: int = 0
    # Leader side: (log end after an append, when) of appends the HW has not reached yet.
    _appends: deque[tuple[int, float]] = field(default_factory=deque)

    # --- leader side -------------------------------------------------------------------------
    def record_fetch(self, follower: str, fetch_offset: int, leader_leo: int, now_s: float) -> None:
        """A follower fetched from ``fetch_offset``: it holds everything below it (Kafka's
        rule for "caught up": it reached the leader's end as of now or of its previous fetch)."""
        progress = self.followers.setdefault(follower, FollowerProgress(last_caught_up_s=now_s))
        if fetch_offset >= leader_leo:
            progress.last_caught_up_s = now_s
        elif progress.known and fetch_offset >= progress.last_fetch_leo:
            progress.last_caught_up_s = max(progress.last_caught_up_s, progress.last_fetch_s)
        progress.leo = fetch_offset
        progress.known = True
        progress.last_fetch_s = now_s
        progress.last_fetch_leo = leader_leo

    def advance_hw(self, self_id: str, leader_leo: int) -> bool:
        """HW = lowest log end offset over the ISR (never moves back); True if it moved."""
        low = leader_leo
        for broker in self.isr:
            if broker == self_id:
                continue
            progress = self.followers.get(broker)
            low = min(low, progress.leo if progress is not None and progress.known else 0)
        if low > self.hw:
            self.hw = low
            self._release(low)
            return True
        return False

    def note_append(self, leo: int, now_s: float) -> None:
        """The leader appended up to ``leo``: time how long the HW takes to reach it."""
        if leo > self.hw and len(self._appends) < APPENDS_TIMED_MAX:
            self._appends.append((leo, now_s))

    def replicated_waits(self, now_s: float) -> list[float]:
        """Seconds each timed append waited for the HW, of those it has reached since last asked."""
        waits = []
        while self._appends and self._appends[0][0] <= self.hw:
            waits.append(now_s - self._appends.popleft()[1])
        return waits

    def forget_appends(self) -> None:
        """Leadership changed: appends of an earlier term are not timed."""
        self._appends.clear()

    def lagging(self, self_id: str, now_s: float, lag_max_s: float) -> tuple[str, ...]:
        """ISR members that have not caught up within the lag window."""
        out = []
        for broker in self.isr:
            if broker == self_id:
                continue
            progress = self.followers.get(broker)
            if progress is None or now_s - progress.last_caught_up_s > lag_max_s:
                out.append(broker)
        return tuple(out)

    def rejoining(self, now_s: float, lag_max_s: float) -> tuple[str, ...]:
        """Replicas outside the ISR that have caught up (to the HW, within the lag window)."""
        return tuple(
            broker for broker in self.replicas
            if broker not in self.isr and (p := self.followers.get(broker)) is not None
            and p.known and p.leo >= self.hw and now_s - p.last_caught_up_s <= lag_max_s
        )

    # --- acks=-1 waiters ---------------------------------------------------------------------
    def wait_for_hw(self, offset: int) -> asyncio.Future[None]:
        """A future resolved once the HW reaches ``offset``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.hw >= offset:
            future.set_result(None)
            return future
        self._waiter_seq += 1
        bisect.insort(self._waiters, (offset, self._waiter_seq, future))
        return future

    def _release(self, hw: int) -> None:
        cut = bisect.bisect_right(self._waiters, (hw, float("inf")))
        ready, self._waiters = self._waiters[:cut], self._waiters[cut:]
        for _, _, future in ready:
            if not future.done():
                future.set_result(None)

    def fail_waiters(self, error: GmsError) -> None:
        """Fail the sends waiting for the HW; their batches are stored here (``STORED_FIELD``)."""
        error.fields = {**error.fields, STORED_FIELD: True}
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(error)

    def forget_waiter(self, future: asyncio.Future[None]) -> None:
        self._waiters = [w for w in self._waiters if w[2] is not future]
