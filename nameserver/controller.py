"""The cluster controller: every nameserver runs one, one is elected, and it moves the leaders of
queues whose leader broker is gone and takes gone brokers out of every ISR (rules in
:mod:`gms.nameserver.failover`), so acks=-1 sends wait for no dead or paused broker past its lease.

Why event-driven: a broker's death is its etcd key's deletion when its lease expires; the
ClusterView's watch delivers that as BROKER_DOWN within milliseconds, and the controller acts
on it at once, so failover takes the broker lease TTL plus a few etcd round trips. Nothing
polls. The callback only marks topics dirty; a worker thread takes every dirty topic at once,
computes their new states from the view (no etcd read) and writes the changed ones in as few
fenced transactions as etcd takes (up to 127 topics each: a broker that led 5,000 queues of 2,500
topics moves them in 20), as Kafka's controller sends one LeaderAndIsr per broker, not per
partition. Each transaction also compares every topic's mod revision, so a concurrent ISR change
is never overwritten: a refused transaction reads its topics back in the same round trip, and
only those changed meanwhile are computed again (:meth:`ClusterMetadata.update_topics`).

Epoch and fencing: the controller epoch is the create revision of this controller's election
key (see :mod:`gms.nameserver.election`); every write also compares that key, so a deposed
controller (lease lost, partitioned, paused) cannot write after its successor took over. On
gaining leadership the controller re-scans every topic, which finishes a failover its
predecessor died in the middle of, and repairs offline queues whose replicas came back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gms.cluster.cluster_view import ChangeKind, ClusterView, ViewChange
from gms.cluster.errors import ClusterError, ControllerFenced
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata
from gms.cluster.model import TopicMetadata
from gms.errors import TopicNotFoundError
from gms.nameserver.election import DEFAULT_ELECTION_TTL_S, Election
from gms.nameserver.failover import reassign_leaders

log = logging.getLogger(__name__)

ELECTION_NAME = "controller"  # the election's key directory: <prefix>election/controller/
RETRY_AFTER_ERROR_S = 0.2  # etcd unreachable: retry the dirty topics this often


@dataclass(frozen=True, slots=True)
class ControllerStatus:
    controller_id: str | None  # the acting controller's candidate id (None: none known)
    epoch: int  # its epoch (create revision of its election key); 0 if unknown
    is_self: bool  # this process is the acting controller


class Controller:
    """``on_leaders_moved(count)`` hears, from the worker thread, of each write that changed the
    leaders of ``count`` queues (the failovers metric); ``on_txn(topics)`` of each transaction
    sent, with the number of topics it wrote (0: refused, a topic changed meanwhile).
    ``before_write(topic)``, for tests only, runs on the worker thread when the topic's new state
    is computed, before the fenced transaction that writes it: it lets a test stop a controller
    mid-failover or change the topic concurrently."""

    def __init__(
        self,
        client: EtcdClient,
        view: ClusterView,
        candidate_id: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        ttl_s: int = DEFAULT_ELECTION_TTL_S,
        on_leaders_moved: Callable[[int], None] | None = None,
        on_txn: Callable[[int], None] | None = None,
        before_write: Callable[[str], None] | None = None,
    ) -> None:
        self._metadata = ClusterMetadata(client, prefix)
        self._view = view
        self._on_leaders_moved = on_leaders_moved
        self._on_txn = on_txn
        self._before_write = before_write
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._rescan = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._election = Election(
            client,
            ELECTION_NAME,
            candidate_id,
            ttl_s=ttl_s,
            prefix=prefix,
            on_gain=self._on_gain,
            on_loss=self._wake.set,
        )

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    @property
    def epoch(self) -> int:
        """This candidate's epoch (valid as the controller epoch while it leads)."""
        return self._election.epoch

    @property
    def lease_id(self) -> int:
        return self._election.lease_id

    def status(self) -> ControllerStatus:
        """The acting controller as this candidate last saw it (no etcd round trip)."""
        return ControllerStatus(
            self._election.leader_id, self._election.leader_epoch, self._election.is_leader
        )

    def start(self) -> Controller:
        """Campaign (blocks for one etcd round trip; errors propagate) and start acting when
        elected. The view must be started."""
        self._view.subscribe(self._on_change)
        self._thread = threading.Thread(target=self._run, name="gms-controller", daemon=True)
        self._thread.start()
        try:
            self._election.start()
        except BaseException:
            self.close(resign=False)
            raise
        return self

    def close(self, *, resign: bool = True) -> None:
        """``resign`` hands over at once; otherwise the successor waits out the lease."""
        self._view.unsubscribe(self._on_change)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._election.close(resign=resign)

    # -- triggers (watch and election threads: quick, no etcd) -----------------------------
    def _on_gain(self) -> None:
        log.info("controller: %s elected (epoch %d)", self._election.candidate_id, self.epoch)
        self._mark_all()

    def _on_change(self, change: ViewChange) -> None:
        if change.kind in (ChangeKind.BROKER_DOWN, ChangeKind.BROKER_UP):
            self._mark(t.name for t in self._view.topics() if _places(t, change.name))
        elif change.kind is ChangeKind.TOPIC_UPDATED:
            self._mark([change.name])
        elif change.kind is ChangeKind.HEALTH and change.name == "healthy":
            self._mark_all()  # a resync may have skipped events; cheap when nothing changed

    def _mark(self, names: Iterable[str]) -> None:
        with self._lock:
            self._dirty.update(names)
        self._wake.set()

    def _mark_all(self) -> None:
        with self._lock:
            self._rescan = True
        self._wake.set()

    def _take(self) -> list[str]:
        with self._lock:
            names, self._dirty = self._dirty, set()
            rescan, self._rescan = self._rescan, False
        if rescan:
            names.update(t.name for t in self._view.topics())
        return sorted(names)

    # -- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                break
            names = self._take()
            if not self._election.is_leader:
                continue  # whoever leads does the work; on gaining leadership we re-scan
            try:
                self._reconcile(names)
            except ControllerFenced as err:
                log.warning("controller: deposed, stopping this pass: %s", err)
            except ClusterError as err:
                log.warning("controller: %d topics: %s; retrying", len(names), err)
                self._mark(names)  # those written meanwhile are no-ops next time
                self._stop.wait(RETRY_AFTER_ERROR_S)  # _mark woke us for the retry
            except Exception:  # a bug must not end failovers for good: the next event retries
                log.exception("controller: pass over %d topics failed", len(names))

    def _reconcile(self, names: list[str]) -> None:
        """Bring the topics ``names`` to their wanted states, in batched fenced transactions."""
        fence = self._election.fence()
        if fence is None:
            return
        epoch = fence.create_revision  # the fence and the stamped epoch are one candidacy
        brokers = self._view.brokers()
        live = frozenset(b.broker_id for b in brokers)
        catching_up = frozenset(b.broker_id for b in brokers if not b.caught_up)

        def wanted(topic: TopicMetadata) -> TopicMetadata:
            return reassign_leaders(topic, live, controller_epoch=epoch, catching_up=catching_up)

        def change(stored: TopicMetadata) -> TopicMetadata:
            if self._before_write is not None:
                self._before_write(stored.name)
            return wanted(stored)

        stale = []
        for name in names:
            try:
                seen, revision = self._view.topic_state(name)
            except TopicNotFoundError:
                continue  # deleted meanwhile
            if wanted(seen) is not seen:  # the common case (ISR changes, healthy topics): nothing to write
                stale.append((seen, revision))
        if not stale:
            return
        for written in self._metadata.update_topics(stale, change, fence=fence):
            self._written(epoch, written)
            if self._stop.is_set() or not self._election.is_leader:
                return  # the rest is the next controller's (it re-scans on election)

    def _written(self, epoch: int, written: list[tuple[TopicMetadata, TopicMetadata]]) -> None:
        """Log and count one transaction's topics, as (as stored, as written)."""
        if self._on_txn is not None:
            self._on_txn(len(written))
        moved = 0
        for old, new in written:
            for before, after in zip(old.queues, new.queues, strict=True):
                if before != after:
                    moved += before.leader != after.leader
                    log.info(
                        "controller epoch %d: %s/%d leader %s -> %s, leader epoch %d -> %d, isr %s",
                        epoch, new.name, after.queue_id, before.leader, after.leader,
                        before.leader_epoch, after.leader_epoch, list(after.isr),
                    )
        if moved and self._on_leaders_moved is not None:
            self._on_leaders_moved(moved)


def _places(topic: TopicMetadata, broker_id: str) -> bool:
    return any(broker_id in q.replicas for q in topic.queues)
