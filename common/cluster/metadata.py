"""Cluster metadata in etcd: broker registrations and topics, written atomically.

Keys (all under ``prefix``, default ``/gms/``; see docs/etcd-layout.md):

    brokers/<broker_id>   BrokerInfo JSON, attached to the broker's lease
    security/users/<name> a user's role and salted SCRAM verifier (gms.security.users.User);
                          ``broker:<broker_id>`` is a broker's own identity, on its lease
    security/acls/<id>    one access rule (gms.security.acl.AclRule JSON) under its ``rule_id``
    topics/<topic>        TopicMetadata JSON: settings and every queue's placement/partition state

A topic and all of its queues are one value, so creating, growing or deleting a topic is one
etcd transaction that either happens entirely or not at all (and stays clear of etcd's
128-operations-per-transaction default that 1024 per-queue keys would break).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

from gms.cluster.errors import ConcurrentUpdate, ControllerFenced, EtcdUnavailable
from gms.cluster.etcd_client import (
    Compare,
    CreateRevisionIs,
    Delete,
    EtcdClient,
    KeyMissing,
    KeyValue,
    ModRevisionIs,
    Put,
)
from gms.cluster.lease import LeaseKeeper
from gms.cluster.model import (
    DEFAULT_QUEUE_COUNT,
    BrokerInfo,
    GroupSettings,
    TopicMetadata,
    TopicSettings,
    new_topic,
    validate_name,
)
from gms.errors import BadRequestError, GmsError, TopicAlreadyExistsError, TopicNotFoundError
from gms.security.acl import AclRule
from gms.security.users import User, check_user_name

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PREFIX = "/gms/"
DEFAULT_BROKER_TTL_S = 10
CAS_ATTEMPTS_MAX = 8  # compare-and-swap retries before reporting a concurrent writer
# ISR updates of different queues of one topic race on the same key (every leader of every
# queue may shrink at once after a broker dies), so they get more attempts.
ISR_CAS_ATTEMPTS_MAX = 64
# etcd's defaults: --max-txn-ops 128 (compares and puts counted apart) and --max-request-bytes
# 1.5 MiB; a batch of new topics is written in transactions within both.
TXN_OPS_MAX = 128
TXN_VALUE_BYTES_MAX = 1024 * 1024


class Keys:
    """The key layout, in one place."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"metadata prefix must start and end with '/', got {prefix!r}")
        self.prefix = prefix
        self.brokers = prefix + "brokers/"
        self.topics = prefix + "topics/"
        self.election = prefix + "election/"
        self.users = prefix + "security/users/"
        self.acls = prefix + "security/acls/"
        self.groups = prefix + "groups/"
        self.producer_ids = prefix + "producer_ids"

    def user(self, name: str) -> str:
        return self.users + name

    def acl(self, rule_id: str) -> str:
        return self.acls + rule_id

    def broker(self, broker_id: str) -> str:
        return self.brokers + broker_id

    def group(self, name: str) -> str:
        return self.groups + validate_name("group", name, BadRequestError)

    def topic(self, name: str) -> str:
        return self.topics + name


class BrokerRegistration:
    """A broker's key under its lease; ``close()`` deregisters at once (clean stop)."""

    def __init__(self, client: EtcdClient, keys: Keys, info: BrokerInfo, ttl_s: int,
                 identity: User | None = None) -> None:
        """``identity``: the broker's own credential (secured clusters), kept under the same lease."""
        self.info = info
        self._client = client
        self._key = keys.broker(info.broker_id)
        self._identity = identity
        self._identity_key = keys.user(identity.name) if identity is not None else ""
        self._keeper = LeaseKeeper(client, ttl_s, self._put, name=f"broker-{info.broker_id}")

    def _put(self, lease_id: int) -> None:
        if self._identity is not None:  # first: peers may check it as soon as the broker shows up
            self._client.put(self._identity_key, self._identity.to_json(), lease_id=lease_id)
        self._client.put(self._key, self.info.to_json(), lease_id=lease_id)

    def update(self, info: BrokerInfo) -> None:
        """Publish new info for the same broker under the same lease (a re-granted lease gets it
        too). Blocking; raises the etcd layer's errors."""
        if info.broker_id != self.info.broker_id:
            raise ValueError(f"broker {self.info.broker_id} cannot publish info of {info.broker_id}")
        self.info = info
        lease_id = self._keeper.lease_id
        if lease_id:  # else the lease is being re-granted, which publishes ``info``
            self._put(lease_id)

    @property
    def lease_id(self) -> int:
        return self._keeper.lease_id

    @property
    def alive(self) -> bool:
        return self._keeper.alive

    def start(self) -> BrokerRegistration:
        self._keeper.start()
        return self

    def close(self, *, deregister: bool = True) -> None:
        """``deregister=False`` leaves the key to expire with the lease (as after a crash)."""
        self._keeper.stop(revoke=deregister)


class ClusterMetadata:
    """Reads and writes brokers and topics. Every call is an etcd round trip: serve routes from
    :class:`gms.cluster.cluster_view.ClusterView` instead."""

    def __init__(self, client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.keys = Keys(prefix)

    # -- brokers ---------------------------------------------------------------------------
    def register_broker(self, info: BrokerInfo, ttl_s: int = DEFAULT_BROKER_TTL_S,
                        identity: User | None = None) -> BrokerRegistration:
        """Register under a fresh lease kept alive by a daemon thread. Re-registering the same
        broker id replaces the old entry (a restarted broker need not wait out its old lease)."""
        return BrokerRegistration(self.client, self.keys, info, ttl_s, identity).start()

    # -- users -----------------------------------------------------------------------------
    def put_user(self, user: User) -> None:
        """Create a user or replace its role and credential."""
        self.client.put(self.keys.user(check_user_name(user.name)), user.to_json())

    def delete_user(self, name: str) -> bool:
        """False if there was no such user."""
        return self.client.delete(self.keys.user(check_user_name(name)))

    def list_users(self) -> list[User]:
        """The users an operator created (not the brokers' own identities)."""
        users = (User.from_json(kv.value) for kv in self.client.get_prefix(self.keys.users).kvs)
        return sorted((u for u in users if u.role != "replica"), key=lambda u: u.name)

    # -- ACLs ------------------------------------------------------------------------------
    def put_acl(self, rule: AclRule) -> bool:
        """Add ``rule``; False if it was already there (a rule's key is its ``rule_id``)."""
        key = self.keys.acl(rule.rule_id)
        return self.client.txn([KeyMissing(key)], [Put(key, rule.to_json())])

    def delete_acl(self, rule: AclRule) -> bool:
        """Remove ``rule``; False if it was not there."""
        return self.client.delete(self.keys.acl(rule.rule_id))

    def list_acls(self) -> list[AclRule]:
        """Every rule, in listing order (``AclRule.sort_key``, as ``AclTable.rules()``)."""
        rules = (AclRule.from_json(kv.value) for kv in self.client.get_prefix(self.keys.acls).kvs)
        return sorted(rules, key=lambda r: r.sort_key)

    # -- consumer group settings ---------------------------------------------------------------
    def put_group_settings(self, name: str, settings: GroupSettings, *, create: bool = False) -> None:
        """With ``create``, only if the group has no settings yet (one transaction):
        BadRequestError otherwise."""
        key = self.keys.group(name)
        if not create:
            self.client.put(key, settings.to_json())
        elif not self.client.txn([KeyMissing(key)], [Put(key, settings.to_json())]):
            raise BadRequestError(f"consumer group {name} already exists: change its settings with"
                                  f" `gms group config {name}`")

    def get_group_settings(self, name: str) -> GroupSettings | None:
        """None: the group has no settings of its own (its consumers use theirs)."""
        kv = self.client.get(self.keys.group(name))
        return None if kv is None else GroupSettings.from_json(kv.value)

    def delete_group_settings(self, name: str) -> bool:
        return self.client.delete(self.keys.group(name))

    # -- idempotent producers -------------------------------------------------------------------
    def allocate_producer_ids(self, count: int) -> int:
        """Reserve ``count`` producer ids no other caller gets; the first of them. A counter in etcd,
        moved by compare-and-swap (ids start at 1)."""
        key = self.keys.producer_ids
        for _ in range(ISR_CAS_ATTEMPTS_MAX):  # every nameserver of a cluster may allocate at once
            kv = self.client.get(key)
            first = 1 if kv is None else int(json.loads(kv.value)["next"])
            value = json.dumps({"v": 1, "next": first + count}, sort_keys=True).encode()
            compare: Compare = KeyMissing(key) if kv is None else ModRevisionIs(key, kv.mod_revision)
            if self.client.txn([compare], [Put(key, value)]):
                return first
        raise ConcurrentUpdate("producer ids kept being allocated by others; retry")

    def live_brokers(self) -> list[BrokerInfo]:
        return [BrokerInfo.from_json(kv.value) for kv in self._broker_kvs()]

    def _broker_kvs(self) -> list[KeyValue]:
        return sorted(self.client.get_prefix(self.keys.brokers).kvs, key=lambda kv: kv.key)

    # -- topics ----------------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        queue_count: int = DEFAULT_QUEUE_COUNT,
        replicas: int = 1,
        settings: TopicSettings | None = None,
    ) -> TopicMetadata:
        """Place the queues on the live brokers and write the topic in one transaction that
        fails if the topic exists or any chosen broker's registration changed meanwhile."""
        validate_name("topic", name)
        (result,) = self.create_topics([NewTopic(name, queue_count, replicas, settings or TopicSettings())])
        if isinstance(result, GmsError):
            raise result
        return result

    def create_topics(self, specs: Sequence[NewTopic]) -> list[TopicMetadata | GmsError]:
        """Create many topics: each one's written topic, or the error that topic alone met
        (invalid, already exists, too few brokers, etcd lost mid-way). The live brokers are read
        once and every topic placed on them; the topics are then written as few transactions as
        etcd takes (:func:`_txn_chunks`), each failing if one of its topics exists or a broker's
        registration changed meanwhile. A failed transaction's topics that exist are reported;
        the others are placed again and retried. EtcdUnavailable fails the call while nothing is
        written, else the topics not written yet."""
        results: list[TopicMetadata | GmsError | None] = [None] * len(specs)
        pending = list(range(len(specs)))
        for _ in range(CAS_ATTEMPTS_MAX):
            try:
                pending = self._place_and_write(specs, pending, results)
            except EtcdUnavailable as err:
                if not any(isinstance(r, TopicMetadata) for r in results):
                    raise
                results = [err if r is None else r for r in results]
                pending = []
            if not pending:
                break
        for i in pending:
            results[i] = ConcurrentUpdate(f"brokers kept changing while creating topic {specs[i].name}")
        return [r for r in results if r is not None]

    def _place_and_write(self, specs: Sequence[NewTopic], pending: list[int],
                         results: list[TopicMetadata | GmsError | None]) -> list[int]:
        """Place the ``pending`` topics on the live brokers and write them; those to place again."""
        broker_kvs = self._broker_kvs()
        broker_ids = [BrokerInfo.from_json(kv.value).broker_id for kv in broker_kvs]
        fences: list[Compare] = [ModRevisionIs(kv.key.decode(), kv.mod_revision) for kv in broker_kvs]
        placed: dict[int, TopicMetadata] = {}
        for i in pending:
            try:
                placed[i] = new_topic(*specs[i], broker_ids)
            except GmsError as err:
                results[i] = err
        again: list[int] = []
        for chunk in _txn_chunks([(i, topic.to_json()) for i, topic in placed.items()], len(fences)):
            again += self._write_new_topics(chunk, fences, specs, placed, results)
        return again

    def _write_new_topics(self, chunk: list[tuple[int, bytes]], fences: list[Compare], specs: Sequence[NewTopic],
                          placed: dict[int, TopicMetadata], results: list[TopicMetadata | GmsError | None],
                          ) -> list[int]:
        """One transaction of new topics; those to place again (a broker changed) are returned."""
        keys = {i: self.keys.topic(specs[i].name) for i, _ in chunk}
        compare = fences + [KeyMissing(keys[i]) for i, _ in chunk]
        if self.client.txn(compare, [Put(keys[i], value) for i, value in chunk]):
            for i, _ in chunk:
                results[i] = placed[i]
            return []
        again = []
        for i, _ in chunk:
            if self.client.get(keys[i]) is not None:
                results[i] = TopicAlreadyExistsError(f"topic {specs[i].name} already exists")
            else:
                again.append(i)
        return again

    def get_topic(self, name: str) -> TopicMetadata:
        kv = self.client.get(self.keys.topic(validate_name("topic", name)))
        if kv is None:
            raise TopicNotFoundError(f"topic {name} does not exist")
        return TopicMetadata.from_json(kv.value)

    def list_topics(self) -> list[TopicMetadata]:
        kvs = self.client.get_prefix(self.keys.topics).kvs
        return sorted((TopicMetadata.from_json(kv.value) for kv in kvs), key=lambda t: t.name)

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> TopicMetadata:
        """Grow the queue count (new queues placed on the live brokers) and/or change the
        settings ``settings`` names, keeping the others (``TopicSettings.merged``); merged with
        what etcd holds inside a compare-and-swap on the topic's mod revision, so concurrent
        updates of different settings both land."""
        key = self.keys.topic(validate_name("topic", name))
        for _ in range(CAS_ATTEMPTS_MAX):
            kv = self.client.get(key)
            if kv is None:
                raise TopicNotFoundError(f"topic {name} does not exist")
            topic = TopicMetadata.from_json(kv.value)
            if settings:
                topic = replace(topic, settings=topic.settings.merged(settings))
            if queue_count is not None and queue_count != topic.queue_count:
                topic = topic.with_queue_count(queue_count, self._live_broker_ids())
            if self.client.txn([ModRevisionIs(key, kv.mod_revision)], [Put(key, topic.to_json())]):
                return topic
        raise ConcurrentUpdate(f"topic {name} kept changing; update not applied")

    def delete_topic(self, name: str) -> None:
        key = self.keys.topic(validate_name("topic", name))
        kv = self.client.get(key)
        if kv is None or not self.client.txn([ModRevisionIs(key, kv.mod_revision)], [Delete(key)]):
            if self.client.get(key) is None:
                raise TopicNotFoundError(f"topic {name} does not exist")
            raise ConcurrentUpdate(f"topic {name} changed while deleting it; retry")

    # -- partition state: leader brokers and the controller ----------------------------------
    def update_isr(
        self,
        topic: str,
        queue_id: int,
        *,
        leader_id: str,
        leader_epoch: int,
        isr: Sequence[str],
        based_on: Sequence[str] | None = None,
    ) -> bool:
        """The leader of a queue sets its ISR (kept in replica order). Compare-and-swap on the
        topic key: True once written (or already so), False if the queue's leader or
        leader_epoch is no longer the given one (or the topic/queue is gone) -- the caller was
        deposed and must follow the metadata, not retry -- or if ``based_on`` (the ISR the
        caller computed ``isr`` from) is given and no longer stored: someone else changed it
        (the controller took a dead broker out), and writing ``isr`` would undo that. Writes to
        other queues of the same topic in between are retried over. ``isr`` must hold the
        leader and only replicas."""
        key = self.keys.topic(validate_name("topic", topic))
        wanted = set(isr)
        if leader_id not in wanted:
            raise BadRequestError(f"ISR {list(isr)} of {topic}/{queue_id} lacks its leader {leader_id}")
        for _ in range(ISR_CAS_ATTEMPTS_MAX):
            kv = self.client.get(key)
            if kv is None:
                return False
            current = TopicMetadata.from_json(kv.value)
            if not 0 <= queue_id < current.queue_count:
                return False
            q = current.queues[queue_id]
            if q.leader != leader_id or q.leader_epoch != leader_epoch:
                return False
            if based_on is not None and set(q.isr) != set(based_on):
                return set(q.isr) == wanted
            if not wanted <= set(q.replicas):
                raise BadRequestError(
                    f"ISR {list(isr)} of {topic}/{queue_id} is not within replicas {list(q.replicas)}"
                )
            new_isr = tuple(r for r in q.replicas if r in wanted)
            if new_isr == q.isr:
                return True
            queues = list(current.queues)
            queues[queue_id] = replace(q, isr=new_isr)
            updated = replace(current, queues=tuple(queues))
            if self.client.txn([ModRevisionIs(key, kv.mod_revision)], [Put(key, updated.to_json())]):
                return True
        raise ConcurrentUpdate(f"topic {topic} kept changing; ISR of queue {queue_id} not written")

    def update_topics(
        self,
        topics: Iterable[tuple[TopicMetadata, int]],
        change: Callable[[TopicMetadata], TopicMetadata],
        *,
        fence: CreateRevisionIs,
    ) -> Iterator[list[tuple[TopicMetadata, TopicMetadata]]]:
        """The controller's write: ``change`` maps a topic as stored to the wanted one (any number
        of queues changed). ``topics`` are (topic, its key's mod revision) as last seen, e.g. from
        a ClusterView. The changed ones are written in as few transactions as etcd takes
        (:func:`_txn_chunks`), each requiring ``fence`` (the controller's election key, see
        ``Election.fence``) and every one of its topics' mod revisions. A transaction refused
        reads its keys in the same round trip: a failed fence raises :class:`ControllerFenced`;
        only the topics changed meanwhile (a leader's ISR update, say) are changed again from
        what is now stored, then written again with the others of that transaction (deleted
        ones are dropped).
        Yields, per transaction sent (but one the fence refused), the (as stored, as written)
        pairs it wrote (none if refused), so the caller can stop between transactions;
        ConcurrentUpdate after CAS_ATTEMPTS_MAX rounds that left topics unwritten."""
        pending = list(topics)
        for _ in range(CAS_ATTEMPTS_MAX):
            todo, pending = pending, []
            changed = ((stored, revision, change(stored)) for stored, revision in todo)
            values = (((stored, revision, new), new.to_json()) for stored, revision, new in changed if new != stored)
            for chunk in _txn_chunks(values, 1):
                pending += yield from self._write_topics([item for item, _ in chunk], [value for _, value in chunk],
                                                         fence)
            if not pending:
                return
        raise ConcurrentUpdate(f"topics {', '.join(t.name for t, _ in pending[:5])} kept changing;"
                               " controller update not applied")

    def _write_topics(self, items: list[tuple[TopicMetadata, int, TopicMetadata]], values: list[bytes],
                      fence: CreateRevisionIs,
                      ) -> Generator[list[tuple[TopicMetadata, TopicMetadata]], None, list[tuple[TopicMetadata, int]]]:
        """One fenced transaction of changed topics (see :meth:`update_topics`); returns the
        topics to change again, with what is stored now."""
        keys = [self.keys.topic(stored.name) for stored, _, _ in items]
        compare: list[Compare] = [fence, *(ModRevisionIs(k, rev) for k, (_, rev, _) in zip(keys, items, strict=True))]
        puts = [Put(k, v) for k, v in zip(keys, values, strict=True)]
        written, current = self.client.txn_or_read(compare, puts, [fence.key, *keys])
        if written:
            yield [(stored, new) for stored, _, new in items]
            return []
        election = current[0]
        if election is None or election.create_revision != fence.create_revision:
            raise ControllerFenced(f"election key {fence.key} (epoch {fence.create_revision}) is gone;"
                                   f" writes to {len(items)} topics refused")
        yield []
        again: list[tuple[TopicMetadata, int]] = []
        for (stored, revision, _), kv in zip(items, current[1:], strict=True):
            if kv is None:
                continue  # deleted meanwhile
            if kv.mod_revision == revision:
                again.append((stored, revision))  # refused for another topic's sake
                continue
            try:
                again.append((TopicMetadata.from_json(kv.value), kv.mod_revision))
            except (ValueError, KeyError, TypeError) as err:
                log.error("topic %s: undecodable value left as it is: %s", stored.name, err)
        return again

    def _live_broker_ids(self) -> Sequence[str]:
        return [info.broker_id for info in self.live_brokers()]


class NewTopic(NamedTuple):
    """A topic to create: what ``new_topic`` places."""

    name: str
    queue_count: int = DEFAULT_QUEUE_COUNT
    replicas: int = 1
    settings: TopicSettings = TopicSettings()


def _txn_chunks(values: Iterable[tuple[T, bytes]], fences: int) -> Iterator[list[tuple[T, bytes]]]:
    """``values`` in runs one etcd transaction takes: at most TXN_OPS_MAX compares (the
    ``fences`` plus one per value; as many reads if refused) and TXN_VALUE_BYTES_MAX of values
    (one at least). Lazy: a full run is yielded before the next value is asked for."""
    per_txn = max(1, TXN_OPS_MAX - fences)
    chunk: list[tuple[T, bytes]] = []
    size = 0
    for item in values:
        if chunk and size + len(item[1]) > TXN_VALUE_BYTES_MAX:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item[1])
        if len(chunk) >= per_txn:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk
