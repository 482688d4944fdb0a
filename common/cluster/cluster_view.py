"""A watch-fed, in-memory copy of the cluster metadata that routes are served from.

One read of the whole prefix gives a snapshot and its revision; a prefix watch from the next
revision keeps it current. When the watch ends (etcd down, stream closed, history compacted)
the view turns unhealthy, keeps serving what it has, and a background thread re-reads and
re-watches with backoff. Routes are precomputed on change so a lookup is one dict access.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from gms.cluster.errors import ClusterError, EtcdUnavailable
from gms.cluster.etcd_client import EtcdClient, KeyValue, WatchBatch
from gms.cluster.metadata import DEFAULT_PREFIX, Keys
from gms.cluster.model import BrokerInfo, TopicMetadata
from gms.errors import TopicNotFoundError
from gms.log_throttle import Outage
from gms.security.acl import AclRule, AclTable
from gms.security.users import User

log = logging.getLogger(__name__)

T = TypeVar("T")

RESYNC_BACKOFF_S_MIN = 0.1
RESYNC_BACKOFF_S_MAX = 2.0  # bounds how long after etcd's return the view stays stale
START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class QueueRoute:
    queue_id: int
    leader_address: str | None  # None while the leader broker is not registered
    replica_addresses: tuple[str, ...]  # registered replicas only, preferred leader first
    leader_epoch: int
    isr_addresses: tuple[str, ...]  # registered in-sync replicas, leader included


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueRoute, ...]


class ChangeKind(enum.Enum):
    BROKER_UP = "broker_up"  # registered or re-registered with new info
    BROKER_DOWN = "broker_down"
    TOPIC_UPDATED = "topic_updated"  # created or changed
    TOPIC_DELETED = "topic_deleted"
    HEALTH = "health"  # name is "healthy" or "unhealthy"


@dataclass(frozen=True, slots=True)
class ViewChange:
    kind: ChangeKind
    name: str


ChangeCallback = Callable[[ViewChange], None]


def compute_route(topic: TopicMetadata, brokers: dict[str, BrokerInfo]) -> TopicRoute:
    def address(broker_id: str | None) -> str | None:
        info = brokers.get(broker_id) if broker_id is not None else None
        return info.address if info is not None else None

    queues = []
    for q in topic.queues:
        replicas = tuple(a for a in map(address, q.replicas) if a is not None)
        isr = tuple(a for a in map(address, q.isr) if a is not None)
        queues.append(QueueRoute(q.queue_id, address(q.leader), replicas, q.leader_epoch, isr))
    return TopicRoute(topic.name, tuple(queues))


class ClusterView:
    def __init__(self, client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._keys = Keys(prefix)
        self._lock = threading.Lock()  # serialises writers; readers take immutable snapshots
        self._brokers: dict[str, BrokerInfo] = {}
        self._topics: dict[str, TopicMetadata] = {}
        self._revisions: dict[str, int] = {}  # each topic's key's mod revision: the controller's CAS
        self._routes: dict[str, TopicRoute] = {}
        self._users: dict[str, User] = {}
        self._acl_rules: dict[str, AclRule] = {}  # by the id in the key
        self._acls = AclTable.EMPTY  # rebuilt from _acl_rules when one changes
        self._revision = 0
        self._healthy = False
        self._generation = 0  # bumps per (re)sync; events from older watches are dropped
        self._callbacks: list[ChangeCallback] = []
        self._watch_broken = threading.Event()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch_id: int | None = None
        self._sync_outage = Outage(log, "cluster view: etcd sync")

    # -- reads (no etcd round trip) --------------------------------------------------------
    @property
    def healthy(self) -> bool:
        """False while etcd is unreachable; the cached data is still served meanwhile."""
        return self._healthy

    @property
    def revision(self) -> int:
        return self._revision

    def route(self, topic: str) -> TopicRoute:
        route = self._routes.get(topic)
        if route is None:
            raise TopicNotFoundError(f"topic {topic} does not exist")
        return route

    def topic(self, name: str) -> TopicMetadata:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFoundError(f"topic {name} does not exist")
        return topic

    def topic_state(self, name: str) -> tuple[TopicMetadata, int]:
        """A topic and the mod revision of its key as this view holds it (one snapshot)."""
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                raise TopicNotFoundError(f"topic {name} does not exist")
            return topic, self._revisions[name]

    def has_topic(self, name: str) -> bool:
        return name in self._topics

    def topics(self) -> list[TopicMetadata]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def brokers(self) -> list[BrokerInfo]:
        return sorted(self._brokers.values(), key=lambda b: b.broker_id)

    def user(self, name: str) -> User | None:
        """The user (or broker identity) of ``name``, None if unknown."""
        return self._users.get(name)

    def acls(self) -> AclTable:
        """The access rules as of the last etcd change seen (an immutable snapshot)."""
        return self._acls

    def subscribe(self, callback: ChangeCallback) -> None:
        """``callback`` runs on the watch or sync thread; it must be quick and not block."""
        self._callbacks.append(callback)

    def unsubscribe(self, callback: ChangeCallback) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> ClusterView:
        """Start syncing; wait up to ``timeout_s`` for the first snapshot."""
        self._thread = threading.Thread(target=self._run, name="gms-cluster-view", daemon=True)
        self._thread.start()
        if not self._synced.wait(timeout_s):
            self.stop()
            raise EtcdUnavailable(f"no etcd snapshot within {timeout_s} s")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watch_broken.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._cancel_watch()

    def __enter__(self) -> ClusterView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- sync loop -------------------------------------------------------------------------
    def _run(self) -> None:
        backoff_s = RESYNC_BACKOFF_S_MIN
        while not self._stop.is_set():
            try:
                self._sync()
                self._sync_outage.recovered()
                backoff_s = RESYNC_BACKOFF_S_MIN
                self._watch_broken.wait()
            except ClusterError as err:
                self._sync_outage.failed(err)
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, RESYNC_BACKOFF_S_MAX)
            self._set_healthy(False)
            self._cancel_watch()

    def _sync(self) -> None:
        self._watch_broken.clear()
        snapshot = self._client.get_prefix(self._keys.prefix)
        with self._lock:
            self._generation += 1
            generation = self._generation
            brokers: dict[str, BrokerInfo] = {}
            topics: dict[str, TopicMetadata] = {}
            revisions: dict[str, int] = {}
            users: dict[str, User] = {}
            acl_rules: dict[str, AclRule] = {}
            for kv in snapshot.kvs:
                if not self._user_change(kv, False, users) and not self._acl_change(kv, False, acl_rules):
                    self._decode_into(kv, brokers, topics, revisions)
            changes = _diff(self._brokers, brokers, ChangeKind.BROKER_UP, ChangeKind.BROKER_DOWN)
            changes += _diff(self._topics, topics, ChangeKind.TOPIC_UPDATED, ChangeKind.TOPIC_DELETED)
            self._brokers, self._topics, self._revisions, self._users = brokers, topics, revisions, users
            if acl_rules != self._acl_rules:
                self._acl_rules, self._acls = acl_rules, AclTable(acl_rules.values())
            self._routes = {name: compute_route(t, brokers) for name, t in topics.items()}
            self._revision = snapshot.revision
        self._emit(changes)
        self._watch_id = self._client.watch_prefix(
            self._keys.prefix, snapshot.revision + 1, lambda r: self._on_watch(generation, r)
        )
        self._set_healthy(True)
        self._synced.set()

    def _cancel_watch(self) -> None:
        watch_id, self._watch_id = self._watch_id, None
        if watch_id is not None:
            try:
                self._client.cancel_watch(watch_id)
            except ClusterError:
                pass  # the stream is already gone with etcd

    def _on_watch(self, generation: int, response: WatchBatch | Exception) -> None:
        if generation != self._generation:
            return
        if isinstance(response, Exception):
            log.warning("cluster view: watch ended: %s", response)
            self._set_healthy(False)
            self._watch_broken.set()
            return
        with self._lock:
            if generation != self._generation:
                return
            brokers, topics, users = dict(self._brokers), dict(self._topics), dict(self._users)
            revisions = dict(self._revisions)
            acl_rules = dict(self._acl_rules)
            acls_touched = False
            changes = []
            for event in response.events:
                if self._user_change(event.kv, event.deleted, users):
                    continue
                if self._acl_change(event.kv, event.deleted, acl_rules):
                    acls_touched = True
                else:
                    changes.append(self._apply(event.kv, event.deleted, brokers, topics, revisions))
            if acls_touched:
                self._acl_rules, self._acls = acl_rules, AclTable(acl_rules.values())
            self._routes = _routes_after(self._routes, topics, brokers,
                                         None if brokers != self._brokers else changes)
            self._brokers, self._topics, self._revisions, self._users = brokers, topics, revisions, users
            self._revision = response.revision
        self._emit([c for c in changes if c is not None])

    def _apply(
        self,
        kv: KeyValue,
        deleted: bool,
        brokers: dict[str, BrokerInfo],
        topics: dict[str, TopicMetadata],
        revisions: dict[str, int],
    ) -> ViewChange | None:
        key = kv.key.decode()
        if key.startswith(self._keys.brokers):
            name = key[len(self._keys.brokers) :]
            if deleted:
                return ViewChange(ChangeKind.BROKER_DOWN, name) if brokers.pop(name, None) else None
        elif key.startswith(self._keys.topics):
            name = key[len(self._keys.topics) :]
            if deleted:
                revisions.pop(name, None)
                return ViewChange(ChangeKind.TOPIC_DELETED, name) if topics.pop(name, None) else None
        else:
            return None  # election keys and other subtrees are not the view's business
        return self._decode_into(kv, brokers, topics, revisions)

    def _user_change(self, kv: KeyValue, deleted: bool, users: dict[str, User]) -> bool:
        """Apply ``kv`` to ``users`` if it is a user's key (whether it was)."""
        return _keyed_change(kv, deleted, self._keys.users, users, User.from_json, "user")

    def _acl_change(self, kv: KeyValue, deleted: bool, rules: dict[str, AclRule]) -> bool:
        """Apply ``kv`` to ``rules`` if it is an access rule's key (whether it was)."""
        return _keyed_change(kv, deleted, self._keys.acls, rules, AclRule.from_json, "ACL rule")

    def _decode_into(
        self, kv: KeyValue, brokers: dict[str, BrokerInfo], topics: dict[str, TopicMetadata],
        revisions: dict[str, int],
    ) -> ViewChange | None:
        key = kv.key.decode()
        try:
            if key.startswith(self._keys.brokers):
                info = BrokerInfo.from_json(kv.value)
                brokers[info.broker_id] = info
                return ViewChange(ChangeKind.BROKER_UP, info.broker_id)
            if key.startswith(self._keys.topics):
                topic = TopicMetadata.from_json(kv.value)
                topics[topic.name] = topic
                revisions[topic.name] = kv.mod_revision
                return ViewChange(ChangeKind.TOPIC_UPDATED, topic.name)
        except (ClusterError, ValueError, KeyError, TypeError) as err:
            log.error("cluster view: skipping undecodable %s: %s", key, err)
        return None

    def _set_healthy(self, healthy: bool) -> None:
        if self._healthy != healthy:
            self._healthy = healthy
            self._emit([ViewChange(ChangeKind.HEALTH, "healthy" if healthy else "unhealthy")])

    def _emit(self, changes: list[ViewChange]) -> None:
        for change in changes:
            for callback in list(self._callbacks):
                try:
                    callback(change)
                except Exception:  # a subscriber's bug must not stop the view
                    log.exception("cluster view: change callback failed")


def _routes_after(routes: dict[str, TopicRoute], topics: dict[str, TopicMetadata], brokers: dict[str, BrokerInfo],
                  changes: list[ViewChange | None] | None) -> dict[str, TopicRoute]:
    """The routes after ``changes``: only the changed topics' are computed again, unless the
    brokers changed (``changes`` None), which may move any route."""
    if changes is None:
        return {name: compute_route(t, brokers) for name, t in topics.items()}
    routes = dict(routes)
    for change in changes:
        if change is not None and change.kind in (ChangeKind.TOPIC_UPDATED, ChangeKind.TOPIC_DELETED):
            topic = topics.get(change.name)
            if topic is None:
                routes.pop(change.name, None)
            else:
                routes[change.name] = compute_route(topic, brokers)
    return routes


def _diff(
    old: Mapping[str, object], new: Mapping[str, object], up: ChangeKind, down: ChangeKind
) -> list[ViewChange]:
    changes = [ViewChange(down, name) for name in old.keys() - new.keys()]
    changes += [ViewChange(up, name) for name, value in new.items() if old.get(name) != value]
    return changes


def _keyed_change(kv: KeyValue, deleted: bool, prefix: str, into: dict[str, T], decode: Callable[[bytes], T],
                  what: str) -> bool:
    """Apply ``kv`` to ``into`` (by the key's name under ``prefix``) if it lies under ``prefix``
    (whether it did); an undecodable value is logged and dropped."""
    key = kv.key.decode()
    if not key.startswith(prefix):
        return False
    name = key[len(prefix):]
    if deleted:
        into.pop(name, None)
        return True
    try:
        into[name] = decode(kv.value)
    except (ValueError, KeyError, TypeError) as err:
        into.pop(name, None)
        log.error("cluster view: skipping undecodable %s %s: %s", what, name, err)
    return True
