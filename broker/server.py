"""The broker: a message store served over the gms wire protocol.

Wires the store, consumer groups, long polling and the request handlers into
one :class:`gms.net.RpcServer`, and runs the broker's periodic chores
(persisting committed offsets, expiring silent group members).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from gms.address import advertised_address, split_address
from gms.broker.access import BrokerAccess
from gms.broker.admin_handlers import AdminHandlers
from gms.broker.config import BrokerConfig
from gms.broker.fetch_handlers import FetchHandlers
from gms.broker.group_handlers import GroupHandlers
from gms.broker.groups import GroupCoordinator, coordinator_index
from gms.broker.ha.leader_handlers import LeaderHandlers
from gms.broker.ha.partition import Role
from gms.broker.ha.replica_manager import ReplicaManager, ReplicationConfig
from gms.broker.ha.state_file import ReplicationStateFile
from gms.broker.identity import record_name, recorded_name
from gms.broker.kafka.server import KafkaEndpoint
from gms.broker.kafka.server import Limits as KafkaLimits
from gms.broker.long_poll import PullWaiters
from gms.broker.message_handlers import MessageHandlers
from gms.broker.metrics import BrokerMetrics
from gms.broker.offsets import OffsetStore
from gms.broker.pop import PopService
from gms.broker.pop_handlers import PopHandlers
from gms.broker.queue_claims import QueueClaims
from gms.broker.registration import Assignments, BrokerRegistration
from gms.broker.services import Services
from gms.broker.services.consumption import ConsumptionService
from gms.broker.services.dead_letters import DeadLetterService
from gms.broker.services.groups import GroupService
from gms.broker.services.messages import MessageService
from gms.broker.services.peers import Peers
from gms.broker.services.replication import ReplicationService
from gms.broker.services.topics import TopicService
from gms.broker.services.transactions import TransactionOutcomeService
from gms.broker.store import MessageStore
from gms.broker.store.paths import StorePaths
from gms.broker.store.topic_table import TopicLimits
from gms.broker.timers import TimerService
from gms.broker.transaction_handlers import TransactionHandlers
from gms.broker.transactions import TransactionConfig, TransactionService
from gms.cluster.model import BrokerInfo
from gms.errors import TopicNotFoundError
from gms.monitoring.http import MonitoringServer
from gms.net import RpcServer
from gms.protocol.codes import RequestCode
from gms.record.layout import TIMER_FLAGS
from gms.security.acl import AclTable
from gms.security.authorizer import Authorizer
from gms.security.client import ClientSecurity
from gms.security.scram import Credential
from gms.security.users import User, replica_user

if TYPE_CHECKING:
    from gms.broker.rocketmq.service import RocketMQEndpoint

log = logging.getLogger(__name__)


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        paths = StorePaths.of_broker(config.store_dir)
        self.store = MessageStore.open(paths.root, config.store)
        try:  # the cluster knows a broker by its name: the store's, whatever the port (see gms.broker.identity)
            self._recorded_name = recorded_name(paths.identity, config.broker_name)
        except BaseException:
            self.store.close()
            raise
        self.offsets = OffsetStore(paths.consumer_offsets)
        self.groups = GroupCoordinator(self._queue_count, config.member_expiry_ms)
        self.claims = QueueClaims(config.member_expiry_ms)
        self.waiters = PullWaiters()
        # Scheduled messages of the local queues; delivered where this broker leads.
        self.timers = TimerService(self.store, self.store.paths.timers, may_fire=self.leads,
                                   append=self._append_timer_copies)
        self.store.set_timer_listener(self.timers)
        # Transactions' half messages (followed by the timers), their decisions and check-backs.
        self.transactions = TransactionService(
            self.store, self.timers, TransactionConfig(timeout_ms=config.transaction_timeout_ms,
                                                       check_interval_ms=config.transaction_check_interval_ms,
                                                       check_max=config.transaction_check_max),
            leads=self.leads, append=self._append_timer_copies)
        # What each consumer group popping from the queues this broker leads has in flight.
        self.pop = PopService(self.store, self.offsets, serves=self.leads, readable=self.readable,
                              on_commit=self.offsets_changed)
        security = config.security
        # With authentication on, what each principal may ask (users and ACLs from etcd's view).
        self.access = (BrokerAccess(Authorizer(self._acls if security.acl else None, security.super_users))
                       if security.authentication else None)
        # Kept only where they are served (--metrics-listen): nothing is counted otherwise.
        self.metrics = (BrokerMetrics(self, per_queue=config.metrics_per_queue) if config.metrics_listen
                        else None)
        self.rpc = RpcServer(config=config.server_config, security=security.server_security(
            self._user, self.access.authorize if self.access is not None else None),
            observe=self.metrics.requests.observe if self.metrics is not None else None)
        self.monitoring: MonitoringServer | None = None  # /metrics, /healthz, /readyz (--metrics-listen)
        self.address = ""
        self.name = self._recorded_name or config.broker_name  # final once serving (start)
        self.started_monotonic = time.monotonic()
        self._chores: list[asyncio.Task[None]] = []
        self.registration: BrokerRegistration | None = None
        self.replicas: ReplicaManager | None = None  # cluster mode only
        self._services: Services | None = None
        self.rocketmq: RocketMQEndpoint | None = None  # the RocketMQ 5 gRPC API (--rocketmq-listen)
        self.kafka: KafkaEndpoint | None = None  # the Kafka API (--kafka-listen)
        # The newest assignments from the etcd watch thread not yet applied on the event loop.
        self._assignments_lock = threading.Lock()
        self._assignments_next: Assignments | None = None
        self._applying: asyncio.Task[None] | None = None
        self._applied: Assignments = {}  # the assignments applied last, per topic
        self._strays_checked = False  # local topics the cluster no longer has: removed once, at the start

    @property
    def port(self) -> int:
        return self.rpc.port

    def _user(self, name: str) -> User | None:
        return self.registration.user(name) if self.registration is not None else None

    def _acls(self) -> AclTable:
        return self.registration.acls() if self.registration is not None else AclTable.empty()

    def _queue_count(self, topic: str) -> int:
        """``topic``'s queues over the cluster (a standalone broker: its own)."""
        if self.registration is not None:
            return self.registration.queue_count(topic)
        return self.store.queue_count(topic) or 0

    def coordinator_of(self, group: str) -> str:
        """The address of ``group``'s coordinator: a live broker chosen by the group's hash (this
        broker when standalone)."""
        brokers = self.registration.live_brokers() if self.registration is not None else []
        return brokers[coordinator_index(group, len(brokers))].address if brokers else self.address

    async def start(self) -> None:
        if self.store.recovered_from_crash:
            log.warning("the last run did not stop cleanly; the store was recovered")
        host, port = self.config.host_port
        try:
            await self.rpc.start(host, port)
        except OSError:
            self.store.close()
            raise
        self.address = self.config.advertised_address or advertised_address(host, self.rpc.port)
        self.name = self._recorded_name or self.config.broker_name or self.address
        if not self._recorded_name:
            try:
                record_name(self.store.paths.identity, self.name)
            except OSError:
                await self.stop()
                raise
        self._register_handlers()
        self.started_monotonic = time.monotonic()
        self.store.set_expiry_limit(self._expiry_limit)
        self.timers.start()
        self.transactions.start()
        if self.metrics is not None:
            self.monitoring = await MonitoringServer.start(*self.config.metrics_host_port, self.metrics.registry,
                                                           self.problems)
        self._chores = [
            asyncio.create_task(self._every(self.config.offset_persist_interval_ms, self.offsets.persist_async)),
            asyncio.create_task(self._every(1000, self._expire_members)),
        ]
        if self.config.rocketmq_listen:
            await self._start_rocketmq(host)
        if self.config.kafka_listen:
            await self._start_kafka()
        if self.config.nameserver:
            await self._register()

    async def _start_rocketmq(self, listen_host: str) -> None:
        from gms.broker.rocketmq.service import RocketMQEndpoint  # the optional `rocketmq` extra

        host, port = self.config.rocketmq_host_port
        advertised_host = split_address(self.address, "advertised address")[0]
        try:
            self.rocketmq = await RocketMQEndpoint.start(self, host, port, advertised_host)
        except OSError:
            await self.stop()
            raise

    async def _start_kafka(self) -> None:
        config = self.config
        try:
            self.kafka = await KafkaEndpoint.start(
                self.services, broker_id_for(self.name), self.address, *config.kafka_host_port,
                advertised_host=split_address(self.address, "advertised address")[0],
                advertised=config.kafka_advertised, default_queue_count=config.default_queue_count,
                limits=KafkaLimits(config.connections_max, config.idle_timeout_ms),
                security=config.security.server_security(self._user, None),
                authorizer=self.access.authorizer if self.access is not None else None)
        except OSError:
            await self.stop()
            raise

    @property
    def services(self) -> Services:
        """The broker's services (what protocol adapters call); set once started."""
        assert self._services is not None, "the broker is not started"
        return self._services

    def queues_led(self, topic: str) -> list[int]:
        """The queues of ``topic`` this broker leads now (TopicNotFoundError: no such topic here)."""
        return self._queues_led(topic)

    async def _register(self) -> None:
        """Join the cluster: register under our own etcd lease and follow our queue assignment."""
        loop = asyncio.get_running_loop()
        info = BrokerInfo(
            broker_id=broker_id_for(self.name), address=self.address, cluster=self.config.cluster,
            caught_up=not self.store.recovered_from_crash,  # KIP-966: not electable until caught up
            rocketmq="" if self.rocketmq is None else self.rocketmq.endpoint,
            kafka="" if self.kafka is None else self.kafka.endpoint,
        )

        def on_assignments(assignments: Assignments) -> None:
            # Called on the etcd watch thread: hand the change to the event loop. Each change is
            # the whole picture, so changes that arrive while one is waiting replace it: a burst
            # of topic creations is applied in a few steps, not one (O(queues)) step each.
            with self._assignments_lock:
                scheduled = self._assignments_next is not None
                self._assignments_next = assignments
            if not scheduled:
                loop.call_soon_threadsafe(self._apply_latest_assignments)

        security = self.config.security
        # Secured: this broker's own replica identity, its password only in this process's memory;
        # leaders let only it fetch as this broker.
        identity, replica_password = None, ""
        if security.authentication:
            replica_password = secrets.token_urlsafe(24)
            identity = User(replica_user(info.broker_id), "replica", Credential.for_password(replica_password))
        registration = self.registration = BrokerRegistration(
            self.config.nameserver, info, on_assignments,
            ttl_s=self.config.lease_ttl_s,
            start_timeout_s=self.config.register_timeout_s,
            security=security.outgoing(),
            identity=identity,
            etcd_auth=security.etcd_auth(),
        )
        self._start_replication(info.broker_id, registration,
                                security.outgoing(identity.name if identity else "", replica_password))
        try:
            await asyncio.to_thread(self.registration.start)
        except Exception:
            self.registration = None
            await self.stop()
            raise
        log.info("registered with the cluster through %s as %s", self.config.nameserver, info.broker_id)

    def _expiry_limit(self, topic: str, queue_id: int) -> int | None:
        """Retention never passes a queue's high watermark (records not yet committed), nor its
        oldest scheduled message still to deliver."""
        limits = []
        if self.replicas is not None and (p := self.replicas.partitions.get((topic, queue_id))) is not None:
            limits.append(p.hw)
        if (low := self.timers.low(topic, queue_id)) is not None:
            limits.append(low)
        return min(limits) if limits else None

    def problems(self) -> list[str]:
        """Why the broker is not ready to serve, if it is not (``/readyz``)."""
        found = []
        if self.store.health.value != "writable":
            found.append(f"store {self.store.health.value}: sends are refused")
        if self.config.nameserver:
            if self.registration is None:
                found.append("not registered with the cluster yet")
            elif not self.registration.alive:
                found.append("registration lease lost: this broker serves no queue until it is back")
        return found

    def readable(self, key: tuple[str, int]) -> tuple[int, int]:
        """The offsets consumers may read on a queue stored here: [minimum, end), the end being
        the high watermark on a replicated queue."""
        low = self.store.min_offset(*key)  # unknown topic or queue: its error
        end = self.store.max_offset(*key) if self.replicas is None else self.replicas.read_limit(key)
        return low, end

    def read_limit(self, key: tuple[str, int]) -> int | None:
        """What consumers may read up to on a queue: its high watermark (None standalone: its end)."""
        return None if self.replicas is None else self.replicas.read_limit(key)

    def _queues_led(self, topic: str) -> list[int]:
        """The queues of ``topic`` this broker leads now."""
        count = self.store.queue_count(topic)
        if count is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist on this broker")
        return [queue_id for queue_id in range(count) if self.leads((topic, queue_id))]

    def leads(self, key: tuple[str, int]) -> bool:
        """Whether this broker serves sends to the queue now (the one to deliver its scheduled messages)."""
        if self.replicas is None:
            return not self.config.nameserver
        partition = self.replicas.partitions.get(key)
        return partition is not None and partition.role is Role.LEADER

    def _append_timer_copies(self, records: bytes, key: tuple[str, int]) -> None:
        """Store delivered copies of scheduled messages as a send would (acks=1)."""
        replicas = self.replicas
        if replicas is None:
            result = self.store.append(records, allowed_flags=TIMER_FLAGS)
            self.waiters.notify(result.touched_queues)
        else:
            result = self.store.append(records, lambda queues: replicas.check_produce(queues, 1),
                                       allowed_flags=TIMER_FLAGS)
            replicas.on_appended(result.touched_queues)

    def _apply_latest_assignments(self) -> None:
        if self._applying is None or self._applying.done():
            self._applying = asyncio.get_running_loop().create_task(self._apply_assignment_steps())

    async def _apply_assignment_steps(self) -> None:
        """Apply the newest assignments, one step at a time, until none is waiting."""
        while True:
            with self._assignments_lock:
                assignments, self._assignments_next = self._assignments_next, None
            if assignments is None:
                return
            try:
                await self._apply_assignments(assignments)
            except Exception:  # the topics it failed on are applied again with the next change
                log.exception("applying the cluster's queue assignment failed")

    async def _apply_assignments(self, assignments: Assignments) -> None:
        """Create or grow local topics for the queues the cluster placed here; drop removed ones.

        Costs what changed: a topic whose assignment is the object applied last is skipped (the
        registration reuses it while the topic's metadata is unchanged), and the topic table and
        the files of deleted topics are written on the store's topic worker, never here."""
        applied = self._applied
        changed = {t: a for t, a in assignments.items() if applied.get(t) is not a}
        gone = [t for t in applied if t not in assignments]
        local = self.store.topics()
        if not self._strays_checked and assignments:
            # The first assignment after joining: a local topic the cluster does not place here
            # was deleted (or moved away) while this broker was down or before it had removed it
            # (a crash mid-deletion). It is removed, as the deletion would have: kept, a topic
            # created again under its name would serve the old one's messages. An empty
            # assignment removes nothing (a wiped or wrong etcd must not wipe the store).
            self._strays_checked = True
            strays = sorted(local.keys() - assignments.keys() - applied.keys())
            if strays:
                log.warning("%d local topic(s) the cluster does not place here (deleted or moved while this"
                            " broker was away): removing them: %s", len(strays), ", ".join(strays[:10]))
                gone += strays
        removed = [t for t in gone if t in local]
        if removed:
            self.store.delete_topics(removed).add_done_callback(_log_failure("removing deleted topics' files"))
            self.offsets.delete_topics(removed)
            log.info("%d topic(s) deleted from the cluster, removed locally: %s", len(removed),
                     ", ".join(removed[:10]) + (" ..." if len(removed) > 10 else ""))
        new: dict[str, tuple[int, TopicLimits]] = {}
        waits: dict[str, Future[None]] = {}
        for topic, assignment in changed.items():
            settings = assignment.settings
            limits = TopicLimits.of(settings)
            count = local.get(topic)
            if count is None:
                new[topic] = (assignment.queue_count, limits)
            elif count < assignment.queue_count or self.store.topic_limits(topic) != limits:
                # grows the queue count, follows settings changes (a leader change changes neither)
                waits[topic] = self.store.update_topic_async(topic, max(count, assignment.queue_count), limits)
        if new:  # one save of the topic table for all of them
            created = self.store.create_topics_async(new)
            waits.update(dict.fromkeys(new, created))
        failed: set[str] = set()
        for topic, done in waits.items():  # no queue is led before its topic is on disk
            try:
                await asyncio.wrap_future(done)
            except Exception:
                log.exception("topic %s: cannot take its assignment locally; retried with the next change", topic)
                failed.add(topic)
        for topic in new.keys() - failed:
            log.info("topic %s: created locally (queues %s)", topic, list(assignments[topic].leader_queue_ids))
        changed = {t: a for t, a in changed.items() if t not in failed}
        self._applied = {t: applied[t] if t in failed else a for t, a in assignments.items()
                         if t not in failed or t in applied}
        if self.replicas is not None:
            self.replicas.apply(changed, gone)
        self._assignments_applied()

    def _assignments_applied(self) -> None:
        """Tell the parts that follow this broker's leadership, and the sends waiting for it."""
        self.timers.leadership_changed()
        self.transactions.leadership_changed()
        self.pop.leadership_changed()
        if self._services is not None:
            self._services.topics.assignments_applied()

    def _start_replication(self, broker_id: str, registration: BrokerRegistration,
                           security: ClientSecurity) -> None:
        config = self.config
        self.replicas = ReplicaManager(
            self.store, self.offsets, broker_id,
            ReplicationConfig(replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                              fetch_wait_ms=config.replica_fetch_wait_ms,
                              fetch_bytes_max=config.replica_fetch_bytes_max,
                              hw_checkpoint_interval_ms=config.hw_checkpoint_interval_ms,
                              fsync_before_ack=config.replica_fsync_before_ack,
                              security=security),
            ReplicationStateFile(self.store.paths.replication_state),
            update_isr=registration.update_isr,
            lease_alive=lambda: registration.alive,
            notify_readers=self.waiters.notify,
            may_join_isr=registration.may_join_isr,
            on_caught_up=None if registration.info.caught_up else registration.mark_caught_up,
        )
        self.replicas.start()
        if self.metrics is not None:
            self.metrics.hw_latency = self.replicas.hw_latency
        if self._services is not None:
            self._services.messages.replicas = self.replicas
        leader = LeaderHandlers(ReplicationService(self.replicas))
        self.rpc.register(RequestCode.REPLICA_FETCH, leader.replica_fetch)
        self.rpc.register(RequestCode.OFFSET_FOR_LEADER_EPOCH, leader.offset_for_leader_epoch)
        self.rpc.register(RequestCode.REPLICA_COMPACTED, leader.replica_compacted)

    def _register_handlers(self) -> None:
        messages = MessageService(self.config, self.store, self.waiters, self.claims, self.address, self.access,
                                  self.metrics)
        messages.timers = self.timers
        messages.replicas = self.replicas
        peers = Peers(self.config.security.outgoing())
        topics = TopicService(self)
        self._services = services = Services(
            messages=messages,
            consumption=ConsumptionService(self.pop, self.waiters, self.config.long_poll_max_ms,
                                           queues_led=self._queues_led, read_limit=self.read_limit,
                                           metrics=self.metrics),
            groups=GroupService(self.groups, self.claims, self.offsets, self._queue_count, self.coordinator_of,
                                self.address, self.readable, on_commit=self.offsets_changed,
                                leader_of=self._leader_of, peers=peers,
                                arrival=functools.partial(topics.arrivals, timeout_s=self.config.send_timeout_ms / 1000,
                                                          led_here=False)),
            transactions=TransactionOutcomeService(self.transactions, messages, self.access,
                                                   self.config.long_poll_max_ms),
            topics=topics,
            dead_letters=DeadLetterService(self, peers))
        messages.arrival = functools.partial(services.topics.arrivals, led_here=True)
        wire = MessageHandlers(messages)
        groups = GroupHandlers(services.groups)
        admin = AdminHandlers(services.topics, services.groups, self.config.default_queue_count)
        transactions = TransactionHandlers(services.transactions)
        pop = PopHandlers(services.consumption)
        for code, handler in {
            RequestCode.SEND: wire.send,
            RequestCode.SEND_BATCH: wire.send,
            RequestCode.PULL: wire.pull,
            RequestCode.FETCH: FetchHandlers(messages).fetch,
            RequestCode.QUERY_MIN_OFFSET: wire.query_min_offset,
            RequestCode.QUERY_MAX_OFFSET: wire.query_max_offset,
            RequestCode.QUERY_OFFSET_BY_TIME: wire.query_offset_by_time,
            RequestCode.VIEW_MESSAGE_BY_ID: wire.view_message,
            RequestCode.FIND_BY_KEY: wire.find_by_key,
            RequestCode.CANCEL_SCHEDULED: wire.cancel_scheduled,
            RequestCode.END_TRANSACTION: transactions.end_transaction,
            RequestCode.CHECK_TRANSACTIONS: transactions.check_transactions,
            RequestCode.LIST_TRANSACTIONS: transactions.list_transactions,
            RequestCode.POP_MESSAGE: pop.pop,
            RequestCode.ACK_MESSAGE: pop.ack,
            RequestCode.CHANGE_INVISIBLE_DURATION: pop.change_invisible_duration,
            RequestCode.HEARTBEAT: groups.heartbeat,
            RequestCode.UNREGISTER_CONSUMER: groups.unregister,
            RequestCode.COMMIT_OFFSET: groups.commit,
            RequestCode.FETCH_OFFSET: groups.fetch,
            RequestCode.GET_CONSUMER_GROUP_MEMBERS: groups.describe,
            RequestCode.FIND_COORDINATOR: groups.find_coordinator,
            RequestCode.CREATE_TOPIC: admin.create_topic,
            RequestCode.CREATE_TOPICS: admin.create_topics,
            RequestCode.UPDATE_TOPIC: admin.update_topic,
            RequestCode.DELETE_TOPIC: admin.delete_topic,
            RequestCode.TOPIC_LIST: admin.topic_list,
            RequestCode.TOPIC_STATS: admin.topic_stats,
            RequestCode.BROKER_STATUS: admin.broker_status,
            RequestCode.RESET_OFFSETS: admin.reset_offsets,
            RequestCode.DELETE_GROUP: admin.delete_group,
            RequestCode.DELETE_OFFSETS: admin.delete_offsets,
        }.items():
            self.rpc.register(code, handler)

    def _leader_of(self, topic: str, queue_id: int) -> str | None:
        """The address of a queue's leader as the cluster routes it (None: no nameservers, or not
        known: the caller acts here)."""
        if self.registration is None:
            return None
        try:
            queues = self.registration.route(topic).queues
        except TopicNotFoundError:
            return None
        return next((queue.leader_address for queue in queues if queue.queue_id == queue_id), None)

    def offsets_changed(self, queues: list[tuple[str, int]]) -> None:
        """Followers copy commits (and deletes) with their fetches: answer the fetches parked on
        these queues."""
        if self.replicas is not None:
            self.replicas.wake_fetches(queues)

    async def _every(self, interval_ms: int, chore: Callable[[], Awaitable[None] | None]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                done = chore()
                if done is not None:
                    await done
            except Exception:  # a failed chore must not stop the broker; it is retried next time
                log.exception("periodic task %s failed", getattr(chore, "__name__", chore))

    def _expire_members(self) -> None:
        now_ms = int(time.time() * 1000)
        for group, member in self.groups.expire(now_ms):
            log.info("consumer %s of group %s expired", member, group)
        for group in self.groups.group_names():
            if self.coordinator_of(group) != self.address:
                self.groups.forget(group)
                log.info("group %s: coordinated by %s now", group, self.coordinator_of(group))
        self.claims.prune(now_ms)

    async def stop(self) -> None:
        if self.registration is not None:
            await asyncio.to_thread(self.registration.stop)
            self.registration = None
        if self._applying is not None:
            self._applying.cancel()
            await asyncio.gather(self._applying, return_exceptions=True)
        if self.replicas is not None:
            await self.replicas.stop()
        await self.transactions.stop()
        await self.timers.stop()
        if self.monitoring is not None:
            await self.monitoring.stop()
        for task in self._chores:
            task.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        self.waiters.close()  # long-polling receives answer now
        if self.rocketmq is not None:
            await self.rocketmq.stop()
            self.rocketmq = None
        if self.kafka is not None:
            await self.kafka.stop()
            self.kafka = None
        if self._services is not None:
            self._services.dead_letters.close()
        await self.rpc.stop()
        try:
            await self.offsets.persist_async()
        finally:  # the store still flushes and checkpoints when the offsets cannot be written
            self.store.close()


def _log_failure(what: str) -> Callable[[Future[None]], None]:
    """A done callback logging the future's exception, if it has one."""
    def done(future: Future[None]) -> None:
        if not future.cancelled() and (err := future.exception()) is not None:
            log.error("%s failed: %s", what, err, exc_info=err)
    return done


def broker_id_for(name: str) -> str:
    """A broker id for etcd keys: the name with characters outside [A-Za-z0-9_.%-] replaced."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_.%-" else "_" for c in name)
