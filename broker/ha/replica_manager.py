"""The broker's replication: the role of each queue, the produce/consume checks, acks=-1 waits,
ISR maintenance and the follower fetchers.

Runs on the broker's event loop. The cluster metadata (leader, ISR, leader epoch per queue)
arrives as assignments from :class:`gms.broker.registration.BrokerRegistration`; ISR changes this
broker makes as a leader go back to etcd through ``update_isr`` (a compare-and-swap on the
queue's leader and epoch, so a deposed leader cannot write one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from gms.broker.ha.epochs import EpochHistory
from gms.broker.ha.fetcher import FetcherPool
from gms.broker.ha.partition import FollowerProgress, Partition, QueueKey, Role
from gms.broker.ha.state_file import ReplicationStateFile
from gms.broker.offsets import OffsetStore
from gms.broker.registration import Assignments, QueueAssignment
from gms.broker.store import MessageStore
from gms.errors import (
    STORED_FIELD,
    GmsError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimeoutError,
)
from gms.monitoring.loop import LoopHistograms
from gms.security.client import PLAINTEXT, ClientSecurity

log = logging.getLogger(__name__)
HW_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

UpdateIsr = Callable[..., bool]  # (topic, queue_id, *, leader_epoch, isr, based_on) -> bool, blocking


@dataclass(frozen=True, kw_only=True)
class ReplicationConfig:
    replica_lag_time_max_ms: int = 10_000  # GMS/Kafka: a follower silent this long leaves the ISR
    fetch_wait_ms: int = 500  # a caught-up follower's fetch parks this long at the leader
    fetch_bytes_max: int = 8 << 20  # per fetch response, all queues together
    hw_checkpoint_interval_ms: int = 5_000  # as Kafka's replica.high.watermark.checkpoint.interval.ms
    # Followers flush what they fetched before their next fetch acknowledges it (acks=-1 then
    # means "on disk on every ISR member", with the leader's flush=sync).
    fsync_before_ack: bool = False
    # How followers connect to leaders: TLS, and this broker's own replica identity.
    security: ClientSecurity = PLAINTEXT


class LeadershipPendingError(NotLeaderError):
    """A send to a queue this broker has just been made leader of, before the new epoch is on
    disk: the send handler waits for the write (``wait_epoch_saved``) rather than refusing it."""

    def __init__(self, message: str, key: QueueKey, fields: dict[str, object]) -> None:
        super().__init__(message, fields=fields)
        self.key = key


class ReplicaManager:
    def __init__(self, store: MessageStore, offsets: OffsetStore, broker_id: str, config: ReplicationConfig,
                 state_file: ReplicationStateFile, *, update_isr: UpdateIsr,
                 lease_alive: Callable[[], bool], notify_readers: Callable[[Iterable[QueueKey]], None],
                 may_join_isr: Callable[[str], bool], on_caught_up: Callable[[], None] | None = None) -> None:
        """``may_join_isr(broker_id)``: whether a caught-up replica may be taken into an ISR (it is
        registered, not catching up after an unclean restart). ``on_caught_up`` (blocking, run in
        a thread), after an unclean restart: called once every queue followed here reached its
        leader's high watermark, to make this broker electable again (KIP-966)."""
        self.store = store
        self.offsets = offsets  # committed consumer-group offsets, replicated with the queues
        self.broker_id = broker_id
        self.config = config
        self._state_file = state_file
        self._update_isr = update_isr
        self._lease_alive = lease_alive
        self._notify_readers = notify_readers
        self._may_join_isr = may_join_isr
        self._on_caught_up = on_caught_up
        self.partitions: dict[QueueKey, Partition] = {}
        self._held: dict[str, tuple[QueueKey, ...]] = {}  # per topic, its queues held here
        self._histories, self._saved_hws = state_file.load()
        self._hw_dirty = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._epoch_saved: asyncio.Future[None] | None = None  # done at the next epoch write
        self._chore: asyncio.Task[None] | None = None
        self._data_waiters: dict[QueueKey, set[asyncio.Future[None]]] = {}
        self.fetchers = FetcherPool(self)
        self.hw_latency = LoopHistograms(  # served by the broker's metrics
            "gms_broker_hw_advance_seconds", "From a leader's append to the high watermark covering it"
            " (replicated queues)", [], HW_BUCKETS_S)
        self._hw_waits = self.hw_latency.child()

    @property
    def lag_max_s(self) -> float:
        return self.config.replica_lag_time_max_ms / 1000

    def start(self) -> None:
        self._chore = asyncio.get_running_loop().create_task(self._maintain())

    async def stop(self) -> None:
        await self.fetchers.stop()
        tasks = [*self._tasks, *([self._chore] if self._chore else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in self.partitions.values():
            p.fail_waiters(NotLeaderError("the broker is stopping"))
        self.save_state()
        self._state_file.close()

    # --- assignments ---------------------------------------------------------------------------
    def apply(self, changed: Assignments, removed: Iterable[str] = ()) -> None:
        """Take the cluster's view of the queues of the topics in ``changed`` (the ones whose
        assignment changed, or all of them) and drop those of the ``removed`` topics: become
        leader or follower. Costs what changed, however many queues the broker holds."""
        gone: set[QueueKey] = set()
        unheld: set[str] = set()
        for topic in removed:
            held = self._held.pop(topic, None)
            if held is None:
                unheld.add(topic)
            else:
                gone.update(held)
        if unheld:  # a topic removed from the store at the start: forget the state the file kept of it
            gone.update(key for key in self._histories.keys() | self._saved_hws.keys() if key[0] in unheld)
        histories_changed: list[QueueKey] = []
        followers_moved = False
        for topic, assignment in changed.items():
            keys = tuple((topic, queue.queue_id) for queue in assignment.queues)
            gone.update(set(self._held.get(topic, ())) - set(keys))
            self._held[topic] = keys
            for key, queue in zip(keys, assignment.queues, strict=True):
                p = self._partition(key)
                before = (p.role, p.leader_address)
                if self._apply_queue(p, queue, assignment.min_insync_replicas or 1):
                    histories_changed.append(key)
                followers_moved |= (p.role, p.leader_address) != before and Role.FOLLOWER in (p.role, before[0])
        for key in gone:  # topic deleted (or replica moved): a recreated one starts afresh
            dropped = self.partitions.pop(key, None)
            if dropped is not None:
                followers_moved |= dropped.role is Role.FOLLOWER
                dropped.fail_waiters(NotLeaderError(f"queue {key[0]}/{key[1]} is no longer on this broker"))
            self._histories.pop(key, None)
            self._saved_hws.pop(key, None)
        if gone or histories_changed:
            # One write for every queue that changed, off the loop; a queue whose new epoch is
            # not on disk yet takes no append (check_produce) until it is.
            self._save_epochs(histories_changed, gone)
        if followers_moved:
            self.fetchers.rebalance()
        self.check_caught_up()

    def _save_epochs(self, keys: list[QueueKey], removed: Iterable[QueueKey] = ()) -> None:
        """Write the epoch histories of ``keys`` (and forget ``removed``) in the background; the
        queues of ``keys`` take appends again once it is done (retried every second on failure)."""
        epochs = {}
        for key in keys:
            p = self.partitions[key]
            p.unsaved_epoch = epochs[key] = p.leader_epoch
        saved = self._state_file.save(*self._snapshot(keys), set(removed))
        if not keys:
            return
        loop = asyncio.get_running_loop()

        def on_disk(future: Future[None]) -> None:
            err = future.exception()
            if err is not None:
                log.error("cannot write the replication state (%s): %d queue(s) take no appends until it is"
                          " written; retrying", err, len(keys))
                loop.call_later(1.0, self._save_epochs, [k for k in keys if self._unsaved(k, epochs[k])])
                return
            for key, epoch in epochs.items():
                if self._unsaved(key, epoch):
                    self.partitions[key].unsaved_epoch = None
            if self._epoch_saved is not None:
                self._epoch_saved.set_result(None)
                self._epoch_saved = None

        saved.add_done_callback(lambda future: loop.call_soon_threadsafe(on_disk, future))

    def _unsaved(self, key: QueueKey, epoch: int) -> bool:
        p = self.partitions.get(key)
        return p is not None and p.unsaved_epoch == epoch

    def _partition(self, key: QueueKey) -> Partition:
        p = self.partitions.get(key)
        if p is None:
            history = self._histories.setdefault(key, EpochHistory())
            p = self.partitions[key] = Partition(key, history, hw=self._saved_hws.get(key, 0))
        return p

    def _apply_queue(self, p: Partition, queue: QueueAssignment, min_insync: int) -> bool:
        """Whether the queue's epoch history changed (the caller saves it)."""
        role = (Role.LEADER if queue.leader_id == self.broker_id
                else Role.OFFLINE if queue.leader_id is None or self.broker_id not in queue.replicas
                else Role.FOLLOWER)
        changed = role is not p.role or queue.leader_epoch != p.leader_epoch or queue.leader_id != p.leader_id
        p.replicas, p.min_insync, p.leader_address = queue.replicas, min_insync, queue.leader_address
        if p.leader_epoch > queue.leader_epoch:
            return False  # an older snapshot than what we already acted on
        p.stored_isr = queue.isr
        if not changed:
            if role is Role.LEADER and not p.isr_update_pending:
                self._set_isr(p, queue.isr)
            return False
        previous = p.role
        p.role, p.leader_id, p.leader_epoch, p.isr = role, queue.leader_id, queue.leader_epoch, queue.isr
        p.fetch_paused_until = 0.0
        p.caught_up = False
        p.forget_appends()
        if previous is Role.LEADER and role is not Role.LEADER:
            p.fail_waiters(NotLeaderError(f"queue {p.key[0]}/{p.key[1]}: leadership moved",
                                          fields=_leader_fields(p)))
            self._notify_readers((p.key,))  # parked pulls and fetches look again: not the leader any more
        history_changed = False
        if role is Role.LEADER:
            history_changed = self._become_leader(p)
        elif role is Role.FOLLOWER:
            p.needs_truncation = True
        log.info("queue %s/%d: %s in epoch %d (leader %s, isr %s)", *p.key, role.value,
                 queue.leader_epoch, queue.leader_id, list(queue.isr))
        return history_changed

    def _become_leader(self, p: Partition) -> bool:
        """Lead the queue; whether its epoch history changed."""
        leo = self.store.max_offset(*p.key)
        history_changed = p.history.assign(p.leader_epoch, leo)
        now = time.monotonic()
        # Kafka: every ISR member counts as caught up now; it has the lag window to show it.
        p.followers = {b: FollowerProgress(last_caught_up_s=now) for b in p.replicas if b != self.broker_id}
        p.hw = min(p.hw, leo)
        self._advance(p, leo)
        return history_changed

    def _set_isr(self, p: Partition, isr: tuple[str, ...]) -> None:
        if isr == p.isr:
            return
        for broker in set(p.isr) - set(isr):
            # Forget what it fetched: it rejoins only after fetching again and catching up, so a
            # paused broker the controller took out is not taken back on its old progress.
            p.followers[broker] = FollowerProgress()
        p.isr = isr
        if len(isr) < p.min_insync:
            p.fail_waiters(NotEnoughReplicasAfterAppendError(
                f"queue {p.key[0]}/{p.key[1]}: the ISR {list(isr)} fell below min_insync_replicas"
                f" {p.min_insync} after the append; the batch is on the leader but not acknowledged"))
        self._advance(p, self.store.max_offset(*p.key))

    # --- produce and consume checks ------------------------------------------------------------
    def leader_of(self, key: QueueKey) -> Partition:
        """The partition of a queue this broker leads now; NotLeaderError otherwise."""
        p = self.partitions.get(key)
        if p is None or p.role is not Role.LEADER:
            where = f"; its leader is {p.leader_address}" if p is not None and p.leader_address else ""
            raise NotLeaderError(f"this broker does not lead {key[0]}/{key[1]}{where}",
                                 fields=_leader_fields(p) if p is not None else {})
        return p

    def check_produce(self, keys: Iterable[QueueKey], acks: int) -> None:
        """Refuse a send before it is stored: not the leader, lease lost, or (acks=-1) too few
        in sync — never a silent downgrade to acks=1."""
        lease_alive = None  # asked once, at the first queue led here
        for key in keys:
            p = self.leader_of(key)
            if p.unsaved_epoch is not None:
                raise LeadershipPendingError(f"queue {key[0]}/{key[1]}: taking over its leadership (epoch"
                                             f" {p.unsaved_epoch} is being written)", key, _leader_fields(p))
            if lease_alive is None:
                lease_alive = self._lease_alive()
            if not lease_alive:
                raise NotLeaderError(f"this broker lost its cluster lease; {key[0]}/{key[1]} may have"
                                     " a new leader", fields=_leader_fields(p))
            if acks == -1 and len(p.isr) < p.min_insync:
                raise NotEnoughReplicasError(
                    f"queue {key[0]}/{key[1]}: {len(p.isr)} in-sync replica(s) {list(p.isr)},"
                    f" acks=-1 needs min_insync_replicas={p.min_insync}")

    async def wait_epoch_saved(self, pending: LeadershipPendingError, timeout_s: float) -> None:
        """Return once ``pending``'s queue is led here with its epoch on disk; raise ``pending``
        after ``timeout_s``, and NotLeaderError if another broker leads it meanwhile."""
        deadline = time.monotonic() + timeout_s
        while self.leader_of(pending.key).unsaved_epoch is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise pending
            if self._epoch_saved is None:
                self._epoch_saved = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._epoch_saved), left)
            except TimeoutError:
                raise pending from None

    def read_limit(self, key: QueueKey) -> int:
        """Consumers read below the high watermark of a queue this broker leads."""
        return self.leader_of(key).hw

    def on_appended(self, keys: Sequence[QueueKey], ends: Sequence[int] | None = None) -> None:
        """The leader appended to ``keys`` (``ends``: where each ends now, if known): wake parked
        follower fetches, move single-replica HWs (the readers of the queues whose HW moved are
        woken once for all: a send may carry the batches of thousands of queues)."""
        now = time.monotonic()
        moved = []
        partitions, leader = self.partitions, Role.LEADER
        for i, key in enumerate(keys):
            p = partitions.get(key)
            if p is not None and p.role is leader:
                leo = self.store.max_offset(*key) if ends is None else ends[i]
                if len(p.isr) > 1:
                    p.note_append(leo, now)
                if p.advance_hw(self.broker_id, leo):
                    moved.append(p)
        if moved:
            self._hw_dirty = True
            self._notify_readers([p.key for p in moved])
            for p in moved:
                for waited in p.replicated_waits(now):
                    self._hw_waits.observe(waited)
        self.wake_fetches(keys)

    def wake_fetches(self, keys: Iterable[QueueKey]) -> None:
        """Answer the follower fetches parked on ``keys`` now (new records or new commits)."""
        for key in keys:
            for future in self._data_waiters.pop(key, ()):
                if not future.done():
                    future.set_result(None)

    async def wait_replicated(self, ends: dict[QueueKey, int], timeout_ms: int) -> None:
        """acks=-1: wait until each queue's HW covers its end offset in ``ends``."""
        try:
            futures = [self.leader_of(key).wait_for_hw(end) for key, end in ends.items()]
        except NotLeaderError as err:  # leadership moved since the append: the batch is stored here
            err.fields = {**err.fields, STORED_FIELD: True}
            raise
        try:
            await asyncio.wait_for(asyncio.gather(*futures), timeout_ms / 1000)
        except TimeoutError as err:
            for key, future in zip(ends, futures, strict=True):
                p = self.partitions.get(key)
                if p is not None:
                    p.forget_waiter(future)
            isr = {f"{k[0]}/{k[1]}": list(self.partitions[k].isr) for k in ends if k in self.partitions}
            raise RequestTimeoutError(
                f"acks=-1: the in-sync replicas {isr} did not all store the batch within {timeout_ms} ms;"
                " it is on the leader and may still be replicated (a retry may duplicate it)") from err

    async def wait_for_data(self, keys: Iterable[QueueKey], timeout_s: float) -> None:
        """Park a caught-up follower fetch until one of ``keys`` gets an append (or timeout)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._data_waiters.setdefault(key, set()).add(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._data_waiters.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._data_waiters[key]

    # --- leader bookkeeping --------------------------------------------------------------------
    def _advance(self, p: Partition, leo: int) -> None:
        if p.advance_hw(self.broker_id, leo):
            self._hw_dirty = True
            self._notify_readers((p.key,))
            for waited in p.replicated_waits(time.monotonic()):
                self._hw_waits.observe(waited)

    def after_fetch(self, p: Partition, leo: int) -> None:
        """A follower fetched: maybe move the HW, maybe take a caught-up replica back in."""
        self._advance(p, leo)
        if not p.isr_update_pending:
            rejoining = tuple(b for b in p.rejoining(time.monotonic(), self.lag_max_s) if self._may_join_isr(b))
            if rejoining:
                self._propose_isr(p, tuple(b for b in p.replicas if b in p.isr or b in rejoining))

    def _propose_isr(self, p: Partition, isr: tuple[str, ...]) -> None:
        p.isr_update_pending = True
        task = asyncio.get_running_loop().create_task(self._write_isr(p, p.leader_epoch, p.isr, isr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_isr(self, p: Partition, epoch: int, base: tuple[str, ...], isr: tuple[str, ...]) -> None:
        """Write ``isr`` (computed from ``base``), then act on what etcd holds: ours, or what the
        watch delivered meanwhile (the controller may have taken a dead broker out)."""
        try:
            ok = await asyncio.to_thread(self._update_isr, p.key[0], p.key[1], leader_epoch=epoch, isr=isr,
                                         based_on=base)
        except GmsError as err:
            log.warning("queue %s/%d: ISR update to %s failed: %s", *p.key, list(isr), err)
            ok = False
        finally:
            p.isr_update_pending = False
        if ok:
            log.info("queue %s/%d: ISR %s -> %s", *p.key, list(base), list(isr))
        else:
            log.info("queue %s/%d: ISR update to %s refused (leader, epoch or ISR changed)", *p.key, list(isr))
        if p.role is Role.LEADER and p.leader_epoch == epoch:
            self._set_isr(p, isr if ok and p.stored_isr == base else p.stored_isr)

    def check_caught_up(self) -> None:
        """After an unclean restart: once every followed queue reached its leader's HW and no
        queue led here still has a caught-up ISR member to hand over to, publish that this
        broker is electable again (retried at the next check if etcd fails)."""
        callback = self._on_caught_up
        if callback is None or not all(self._settled(p) for p in self.partitions.values()):
            return
        self._on_caught_up = None
        task = asyncio.get_running_loop().create_task(self._publish_caught_up(callback))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _settled(self, p: Partition) -> bool:
        """Whether ``p`` no longer holds this broker back from being electable. A queue it still
        leads from before the restart is not settled while another ISR member is registered and
        caught up: the controller hands such a queue over (KIP-966), and publishing "caught up"
        first would make it keep a leader that may have lost acknowledged records."""
        if p.role is Role.FOLLOWER:
            return p.caught_up
        if p.role is Role.LEADER:
            return not any(self._may_join_isr(b) for b in p.isr if b != self.broker_id)
        return True

    async def _publish_caught_up(self, callback: Callable[[], None]) -> None:
        try:
            await asyncio.to_thread(callback)
        except GmsError as err:
            log.warning("could not publish that this broker caught up: %s; retrying", err)
            self._on_caught_up = callback
            return
        log.info("caught up with every leader after the unclean restart: electable again")

    async def _maintain(self) -> None:
        """Shrink ISRs of lagging followers; checkpoint high watermarks."""
        interval_s = min(self.lag_max_s / 4, self.config.hw_checkpoint_interval_ms / 1000)
        last_checkpoint = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for p in list(self.partitions.values()):
                if p.role is Role.LEADER and not p.isr_update_pending:
                    lagging = p.lagging(self.broker_id, now, self.lag_max_s)
                    if lagging:
                        self._propose_isr(p, tuple(b for b in p.isr if b not in lagging))
            if now - last_checkpoint >= self.config.hw_checkpoint_interval_ms / 1000:
                last_checkpoint = now
                if self._hw_dirty:
                    await asyncio.wrap_future(self._state_file.save(*self._hw_checkpoint()))

    def _hw_checkpoint(self) -> tuple[dict[QueueKey, list[list[int]]], dict[QueueKey, int]]:
        """The HWs that moved since the last checkpoint (no epoch history: those are written when
        they change)."""
        self._hw_dirty = False
        saved = self._saved_hws
        moved = {key: p.hw for key, p in self.partitions.items() if saved.get(key) != p.hw}
        saved.update(moved)
        return {}, moved

    def hw_moved(self) -> None:
        """A follower's HW moved: include it in the next checkpoint."""
        self._hw_dirty = True

    def save_state(self, keys: Iterable[QueueKey] | None = None, removed: Iterable[QueueKey] = ()) -> None:
        """Write the epoch histories of ``keys`` (None: of every queue) now, and forget the
        ``removed`` queues: epoch histories must be on disk before the queue moves on."""
        self._state_file.save(*self._snapshot(keys), set(removed)).result()

    def _snapshot(self, keys: Iterable[QueueKey] | None = None) -> tuple[dict[QueueKey, list[list[int]]],
                                                                         dict[QueueKey, int]]:
        """Copies of the epoch histories and HWs of ``keys`` (None: of every queue), taken on the
        event loop so that the state file's writer thread can write them while the loop goes on
        changing the originals."""
        if keys is None:
            self._hw_dirty = False
            self._saved_hws = {**self._saved_hws, **{key: p.hw for key, p in self.partitions.items()}}
            return {k: h.to_list() for k, h in self._histories.items()}, dict(self._saved_hws)
        histories, hws = {}, {}
        for key in keys:
            histories[key] = self._histories[key].to_list()
            if (p := self.partitions.get(key)) is not None:
                hws[key] = self._saved_hws[key] = p.hw
        return histories, hws


def _leader_fields(p: Partition) -> dict[str, object]:
    return {"leader": p.leader_address, "leader_epoch": p.leader_epoch} if p.leader_address else {}
