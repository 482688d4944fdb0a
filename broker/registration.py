"""A broker's membership in the cluster: registration under its own etcd lease, and the topics
and queues assigned to it.

The broker asks any reachable nameserver (REGISTER_BROKER) where etcd is, then talks to etcd
itself: its key hangs on a lease that *this* process keeps alive, so a crashed broker leaves
every route within the TTL no matter what the nameservers do. A watch-fed ClusterView tells it
which queues it leads or follows; ``on_assignment`` hears about every change.

etcd can move (a nameserver restarted with its embedded etcd on another port, an operator
replacing the etcd cluster): when etcd has not answered for ``rediscover_after_s``, the broker
asks the nameservers again and, if they name other endpoints, points its etcd client there. The
lease, the key and the watch carry on (the keep-alive re-grants and re-registers if the new etcd
does not know the lease), so registration works as if etcd had only been briefly away.

Independent of the broker's internals on purpose: it takes a :class:`BrokerInfo` and a
callback, and the broker server wires it in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gms.cluster.cluster_view import ChangeKind, ClusterView, TopicRoute, ViewChange
from gms.cluster.errors import EtcdUnavailable
from gms.cluster.etcd_client import EtcdAuth, EtcdClient, parse_endpoints
from gms.cluster.metadata import DEFAULT_BROKER_TTL_S, ClusterMetadata
from gms.cluster.metadata import BrokerRegistration as EtcdRegistration
from gms.cluster.model import BrokerInfo, GroupSettings, TopicMetadata, TopicSettings
from gms.errors import GmsError, InvalidTopicError, ServiceUnavailableError, TopicNotFoundError
from gms.log_throttle import Outage
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.security.acl import AclTable
from gms.security.client import PLAINTEXT, ClientSecurity
from gms.security.users import User

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0  # a broker started together with its nameserver waits this long for it
NAMESERVER_RETRY_S = 0.5
NAMESERVER_TIMEOUT_MS = 3000
ETCD_CHECK_INTERVAL_S = 0.25  # how often the watchdog looks at etcd's health (no round trip)


@dataclass(frozen=True, slots=True)
class QueueAssignment:
    """The partition state of one queue this broker holds a replica of (from etcd)."""

    queue_id: int
    leader_id: str | None  # None while the queue is offline (no eligible leader)
    leader_address: str | None  # None while the leader is not registered
    leader_epoch: int
    isr: tuple[str, ...]  # broker ids, leader included
    replicas: tuple[str, ...]  # broker ids, preferred leader first


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """What one broker holds of one topic."""

    queue_count: int  # the topic's total queue count (queue ids 0..queue_count-1)
    leader_queue_ids: tuple[int, ...]  # queues this broker leads (serves sends and pulls)
    follower_queue_ids: tuple[int, ...]  # queues this broker replicates but does not lead
    settings: TopicSettings
    queues: tuple[QueueAssignment, ...] = ()  # every queue with a replica here, by queue id
    min_insync_replicas: int = 1


Assignments = dict[str, TopicAssignment]
AssignmentCallback = Callable[[Assignments], None]


def assignments_for(
    broker_id: str, topics: list[TopicMetadata], brokers: list[BrokerInfo] | None = None
) -> Assignments:
    """Every topic with at least one queue (led or replicated) on ``broker_id``; ``brokers``
    (the registered ones) give the leaders' addresses."""
    addresses = {b.broker_id: b.address for b in brokers or ()}
    result: Assignments = {}
    for topic in topics:
        assignment = topic_assignment(broker_id, topic, addresses)
        if assignment is not None:
            result[topic.name] = assignment
    return result


def topic_assignment(broker_id: str, topic: TopicMetadata, addresses: Mapping[str, str]) -> TopicAssignment | None:
    """The queues of ``topic`` on ``broker_id`` (None: none); ``addresses``: broker id → address."""
    held = [q for q in topic.queues if broker_id in q.replicas or q.leader == broker_id]
    if not held:
        return None
    led = tuple(q.queue_id for q in held if q.leader == broker_id)
    followed = tuple(q.queue_id for q in held if q.leader != broker_id)
    queues = tuple(
        QueueAssignment(q.queue_id, q.leader, addresses.get(q.leader) if q.leader else None,
                        q.leader_epoch, tuple(q.isr), tuple(q.replicas))
        for q in held
    )
    return TopicAssignment(
        topic.queue_count, led, followed, topic.settings, queues,
        topic.settings.min_insync_replicas or 1,  # always resolved in a TopicMetadata
    )


async def ask_etcd_endpoints(nameserver: str, timeout_ms: float,
                             security: ClientSecurity = PLAINTEXT) -> tuple[str, str]:
    """REGISTER_BROKER on one nameserver -> (etcd endpoints, metadata prefix)."""
    host, port = parse_endpoints(nameserver)[0]
    conn = await Connection.open(host, port, timeout_ms, request_timeout_ms=timeout_ms, security=security)
    try:
        fields = (await conn.request(RequestCode.REGISTER_BROKER, {})).fields
    finally:
        conn.close()
    etcd, prefix = fields.get("etcd"), fields.get("prefix")
    if not isinstance(etcd, str) or not isinstance(prefix, str):
        raise ServiceUnavailableError(f"nameserver {nameserver} gave no etcd endpoints: {fields!r}")
    return etcd, prefix


class BrokerRegistration:
    """Register ``info`` in the cluster and follow its assignment.

    ``on_assignment(assignments)`` is called with the initial assignment before :meth:`start`
    returns (possibly {}), then from the ClusterView's watch thread whenever it changes (never
    concurrently, always in order). It must be quick and must not block: hand the work to the
    broker's event loop (``loop.call_soon_threadsafe``). ``start`` and ``stop`` block (etcd and
    nameserver round trips): call them from a thread, e.g. ``await asyncio.to_thread(reg.start)``.
    """

    def __init__(
        self,
        nameservers: str,
        info: BrokerInfo,
        on_assignment: AssignmentCallback,
        *,
        ttl_s: int = DEFAULT_BROKER_TTL_S,
        start_timeout_s: float = START_TIMEOUT_S,
        rediscover_after_s: float | None = None,
        security: ClientSecurity = PLAINTEXT,
        identity: User | None = None,
        etcd_auth: EtcdAuth | None = None,
    ) -> None:
        """``security``: how to reach the nameservers (TLS, the broker credential); ``identity``:
        this broker's own replica credential, registered under its lease (secured clusters);
        ``etcd_auth``: how to reach a secured etcd."""
        self.nameservers = [f"{h}:{p}" for h, p in parse_endpoints(nameservers)]
        self.info = info
        self._on_assignment = on_assignment
        self._security = security
        self._identity = identity
        self._etcd_auth = etcd_auth
        self._ttl_s = ttl_s
        self._start_timeout_s = start_timeout_s
        # Default: a third of the TTL, so a moved etcd is found while the lease still holds.
        self._rediscover_after_s = ttl_s / 3 if rediscover_after_s is None else rediscover_after_s
        self._prefix = ""
        self._stop_watchdog = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._lock = threading.Lock()  # serialises assignment computation and callbacks
        self._assignments: Assignments | None = None
        # What _refresh computed last: broker addresses, and per topic its metadata and assignment.
        self._addresses: dict[str, str] = {}
        self._by_topic: dict[str, tuple[TopicMetadata, TopicAssignment | None]] = {}
        self._client: EtcdClient | None = None
        self._registration: EtcdRegistration | None = None
        self._metadata: ClusterMetadata | None = None
        self._view: ClusterView | None = None
        self._rediscover_outage = Outage(log, "asking the nameservers where etcd is")
        self.etcd_endpoints = ""

    @property
    def assignments(self) -> Assignments:
        """The last assignment handed to the callback ({} before start)."""
        return dict(self._assignments or {})

    def live_brokers(self) -> list[BrokerInfo]:
        """The registered brokers, sorted by id (from the watch-fed view; no I/O)."""
        view = self._view
        return [] if view is None else view.brokers()

    def user(self, name: str) -> User | None:
        """A user or broker identity from the watch-fed view (None: unknown, or not started)."""
        view = self._view
        return None if view is None else view.user(name)

    def acls(self) -> AclTable:
        """The ACL rules from the watch-fed view (none before start)."""
        view = self._view
        return AclTable.empty() if view is None else view.acls()

    def route(self, topic: str) -> TopicRoute:
        """``topic``'s route as the nameservers serve it (from the watch-fed view; no I/O).
        Raises TopicNotFoundError."""
        view = self._view
        if view is None:
            raise TopicNotFoundError(f"topic {topic} does not exist (not registered yet)")
        return view.route(topic)

    def topic(self, name: str) -> TopicMetadata:
        """``name``'s metadata, settings included (watch-fed view; no I/O). Raises TopicNotFoundError."""
        view = self._view
        if view is None:
            raise TopicNotFoundError(f"topic {name} does not exist (not registered yet)")
        return view.topic(name)

    def topic_queue_counts(self) -> dict[str, int]:
        """Every topic of the cluster with its queue count (watch-fed view; no I/O)."""
        view = self._view
        return {} if view is None else {topic.name: topic.queue_count for topic in view.topics()}

    def has_topic(self, name: str) -> bool:
        """Whether the watch-fed view holds topic ``name`` (no I/O)."""
        view = self._view
        return view is not None and view.has_topic(name)

    def group_settings(self, name: str) -> GroupSettings | None:
        """Group ``name``'s settings in etcd (``gms group config``; None: it has none). A blocking
        etcd round trip: call it from a thread. ServiceUnavailableError before registering."""
        metadata = self._metadata
        if metadata is None:
            raise ServiceUnavailableError("not registered with the cluster yet")
        return metadata.get_group_settings(name)

    def topic_in_etcd(self, name: str) -> bool:
        """Whether etcd holds topic ``name`` now, ahead of the view when it was just created
        (blocking etcd round trip; call it from a thread). EtcdUnavailable if etcd does not answer."""
        metadata = self._metadata
        if metadata is None:
            return False
        try:
            metadata.get_topic(name)
        except (TopicNotFoundError, InvalidTopicError):  # a name no topic can have
            return False
        return True

    def queue_count(self, topic: str) -> int:
        """``topic``'s queue count over the whole cluster; 0 if it does not exist (no I/O)."""
        view = self._view
        if view is None:
            return 0
        try:  # a lookup, not a walk: a heartbeat asks it for every topic of its subscription
            return view.topic(topic).queue_count
        except TopicNotFoundError:
            return 0

    @property
    def alive(self) -> bool:
        """True while this broker's lease is surely alive in etcd."""
        return self._registration is not None and self._registration.alive

    def may_join_isr(self, broker_id: str) -> bool:
        """Whether a leader here may take ``broker_id`` into an ISR: it is registered (its lease
        is alive, as Kafka's KIP-841) and not catching up after an unclean restart (no I/O)."""
        view = self._view
        return view is not None and any(b.broker_id == broker_id and b.caught_up for b in view.brokers())

    def mark_caught_up(self) -> None:
        """This broker, started after an unclean stop, caught up with its leaders: publish that
        it is electable again (blocking etcd round trip; call it from a thread)."""
        self.info = replace(self.info, caught_up=True)
        if self._registration is not None:
            self._registration.update(self.info)

    def start(self) -> BrokerRegistration:
        """Find etcd through the nameservers, register, start following assignments.

        Retries the nameserver list, and then the registration while etcd is unavailable, until
        ``start_timeout_s`` (a broker started with its cluster may find etcd still starting);
        raises :class:`ServiceUnavailableError` (or the etcd layer's :class:`EtcdUnavailable`)
        if that fails, with nothing left running."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            etcd, prefix = self._discover_etcd(deadline)
            try:
                self._register(etcd, prefix)
                break
            except EtcdUnavailable as err:
                if time.monotonic() + NAMESERVER_RETRY_S >= deadline:
                    raise
                log.warning("cannot register in etcd %s yet (%s); retrying", etcd, err)
                time.sleep(NAMESERVER_RETRY_S)
        self._stop_watchdog.clear()
        self._watchdog = threading.Thread(target=self._watch_etcd, name="gms-etcd-watchdog", daemon=True)
        self._watchdog.start()
        log.info("broker %s registered in etcd %s", self.info.broker_id, etcd)
        return self

    def _register(self, etcd: str, prefix: str) -> None:
        """Register in ``etcd`` and follow the cluster there; on failure nothing is left running."""
        self.etcd_endpoints, self._prefix = etcd, prefix
        self._client = EtcdClient(etcd, auth=self._etcd_auth)
        try:
            self._metadata = ClusterMetadata(self._client, prefix)
            self._registration = self._metadata.register_broker(self.info, self._ttl_s, self._identity)
            self._view = ClusterView(self._client, prefix)
            self._view.subscribe(self._on_change)
            self._view.start()
            self._refresh()
        except BaseException:
            self.stop()
            raise

    def _discover_etcd(self, deadline: float) -> tuple[str, str]:
        errors: dict[str, str] = {}
        while True:
            for nameserver in self.nameservers:
                try:
                    return run(ask_etcd_endpoints(nameserver, NAMESERVER_TIMEOUT_MS, self._security))
                except (GmsError, ValueError) as err:
                    errors[nameserver] = str(err)
            if time.monotonic() >= deadline:
                detail = "; ".join(f"{ns}: {e}" for ns, e in errors.items())
                raise ServiceUnavailableError(
                    f"no nameserver reachable within {self._start_timeout_s} s ({detail});"
                    " start one (`gms-nameserver`) or fix --nameserver"
                )
            time.sleep(NAMESERVER_RETRY_S)

    def _etcd_answers(self) -> bool:
        view, registration = self._view, self._registration
        return view is not None and view.healthy and registration is not None and registration.alive

    def _watch_etcd(self) -> None:
        """Re-ask the nameservers where etcd is while it does not answer (every
        ``rediscover_after_s``); move the client if the answer names other endpoints."""
        silent_since: float | None = None
        while not self._stop_watchdog.wait(ETCD_CHECK_INTERVAL_S):
            now = time.monotonic()
            if self._etcd_answers():
                silent_since = None
            elif silent_since is None:
                silent_since = now
            elif now - silent_since >= self._rediscover_after_s:
                silent_since = now  # the next question after another rediscover_after_s
                self._rediscover()

    def _rediscover(self) -> None:
        for nameserver in self.nameservers:
            try:
                etcd, prefix = run(ask_etcd_endpoints(nameserver, NAMESERVER_TIMEOUT_MS, self._security))
            except (GmsError, ValueError) as err:
                self._rediscover_outage.failed(f"etcd {self.etcd_endpoints} does not answer; nameserver {nameserver}"
                                               f" neither: {err}")
                continue
            self._rediscover_outage.recovered()
            if prefix != self._prefix:
                log.error("nameserver %s serves cluster prefix %r, this broker is in %r; ignoring it"
                          " (fix --nameserver)", nameserver, prefix, self._prefix)
                continue
            client = self._client
            if client is not None and sorted(parse_endpoints(etcd)) != sorted(parse_endpoints(self.etcd_endpoints)):
                log.warning("etcd moved from %s to %s (per nameserver %s); reconnecting",
                            self.etcd_endpoints, etcd, nameserver)
                self.etcd_endpoints = etcd
                client.reconnect(etcd)
            return

    def stop(self) -> None:
        """Deregister at once (revoke the lease) and stop following etcd. Idempotent."""
        self._stop_watchdog.set()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.join()
        registration, self._registration = self._registration, None
        if registration is not None:
            registration.close(deregister=True)
        view, self._view = self._view, None
        if view is not None:
            view.stop()
        client, self._client = self._client, None
        self._metadata = None
        if client is not None:
            client.close()

    def update_isr(self, topic: str, queue_id: int, *, leader_epoch: int, isr: tuple[str, ...],
                   based_on: tuple[str, ...]) -> bool:
        """Write a new ISR for a queue this broker leads, computed from the ISR ``based_on``
        (blocking etcd round trips; call it from a thread). False when the queue's leader, epoch
        or ISR changed meanwhile: this broker's view is stale and the watch brings the new state."""
        if self._metadata is None:
            return False
        return self._metadata.update_isr(
            topic, queue_id, leader_id=self.info.broker_id, leader_epoch=leader_epoch, isr=list(isr),
            based_on=list(based_on),
        )

    def _on_change(self, change: ViewChange) -> None:
        if change.kind in (ChangeKind.TOPIC_UPDATED, ChangeKind.TOPIC_DELETED):
            self._refresh(change.name)
        elif change.kind is not ChangeKind.HEALTH:  # brokers give or take away the leaders' addresses
            self._refresh()

    def _refresh(self, name: str | None = None) -> None:
        """Compute this broker's assignment again: of topic ``name`` alone (a topic's change; the
        view's first sync is one per topic, so a walk per change would cost topics²), or of
        every topic (None: the brokers changed); hand it on if it changed."""
        view = self._view
        if view is None:
            return
        with self._lock:
            addresses = {b.broker_id: b.address for b in view.brokers()}
            if addresses != self._addresses:  # every leader address may have moved
                self._addresses, self._by_topic, name = addresses, {}, None
            if name is None or self._assignments is None:
                current = self._assign_all(view, addresses)
                if current == self._assignments:
                    return
            else:
                current = self._assign_one(view, addresses, name, self._assignments)
                if current is self._assignments:
                    return
            self._assignments = current  # replaced, never mutated: assignments() copies it unlocked
            self._on_assignment(dict(current))

    def _assign_all(self, view: ClusterView, addresses: dict[str, str]) -> Assignments:
        """Every topic's assignment; a topic whose metadata is the same object as last time has
        the same assignment: only the changed topics are computed again."""
        by_topic: dict[str, tuple[TopicMetadata, TopicAssignment | None]] = {}
        current: Assignments = {}
        for topic in view.topics():
            known = self._by_topic.get(topic.name)
            assignment = (known[1] if known is not None and known[0] is topic
                          else topic_assignment(self.info.broker_id, topic, addresses))
            by_topic[topic.name] = (topic, assignment)
            if assignment is not None:
                current[topic.name] = assignment
        self._by_topic = by_topic
        return current

    def _assign_one(self, view: ClusterView, addresses: dict[str, str], name: str,
                    assignments: Assignments) -> Assignments:
        """``assignments`` with topic ``name``'s computed again (the same object if unchanged)."""
        try:
            topic: TopicMetadata | None = view.topic(name)
        except TopicNotFoundError:
            topic = None
        if topic is None:
            self._by_topic.pop(name, None)
            assignment = None
        else:
            assignment = topic_assignment(self.info.broker_id, topic, addresses)
            self._by_topic[name] = (topic, assignment)
        if assignment == assignments.get(name):
            return assignments
        current = dict(assignments)
        if assignment is None:
            del current[name]
        else:
            current[name] = assignment
        return current
