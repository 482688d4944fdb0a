"""The nameserver's wire service: routes and broker lists from the watch-fed cache, topic
administration through etcd transactions.

Reads (GET_ROUTE, GET_BROKER_LIST, TOPIC_LIST) never touch etcd: they come from
:class:`ClusterView`, so they keep answering while etcd is down. Writes (CREATE/UPDATE/
DELETE_TOPIC, CREATE_TOPICS) are etcd round trips run off the event loop, then wait for this
nameserver's view to show them (:mod:`gms.nameserver.writes`); with etcd unreachable they fail
with SERVICE_UNAVAILABLE. Users and ACLs are :mod:`gms.nameserver.access_admin`'s. Each
nameserver also keeps a key under its own lease (``nameservers/<lease>``) so the cluster status
lists the live ones, and runs a :class:`Controller` candidate: the elected one moves
queue leaders off dead brokers. Its metrics (:mod:`gms.nameserver.metrics`) and readiness are
served on the optional monitoring endpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gms.address import advertised_address, join_address, split_address
from gms.cluster.cluster_view import ChangeKind, ClusterView, TopicRoute, ViewChange, compute_route
from gms.cluster.errors import ClusterError, EtcdUnavailable
from gms.cluster.etcd_client import EtcdClient, parse_endpoints
from gms.cluster.lease import LeaseKeeper
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata, Keys, NewTopic
from gms.cluster.model import (
    DEFAULT_QUEUE_COUNT,
    BrokerInfo,
    GroupSettings,
    TopicMetadata,
    TopicSettings,
    validate_queue_count,
    validate_replicas,
)
from gms.errors import BadRequestError, GmsError, ServiceUnavailableError, TopicNotFoundError
from gms.monitoring.http import MonitoringServer
from gms.nameserver.access import NameserverAccess
from gms.nameserver.access_admin import AccessAdmin
from gms.nameserver.controller import Controller, ControllerStatus
from gms.nameserver.metrics import NameserverMetrics
from gms.nameserver.writes import MetadataWrites
from gms.naming import SYSTEM_TOPIC_FIELD, check_creatable
from gms.net import RpcServer
from gms.protocol.codes import RequestCode
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.topic_batch import entry_name, error_row, ok_row, repeated_name, topic_entries
from gms.security.acl import AclTable
from gms.security.authorizer import Authorizer
from gms.security.config import SecurityConfig
from gms.security.users import User

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876
NAMESERVER_TTL_S = 10
ETCD_REQUEST_TIMEOUT_S = 3.0  # a topic write that waits longer than this is reported, not hung
LAYOUT_VERSION = 1
PRODUCER_ID_BLOCK = 1000  # producer ids a nameserver reserves in etcd at a time


def nameservers_prefix(keys: Keys) -> str:
    """``<prefix>nameservers/``: one key per live nameserver, under that nameserver's lease."""
    return keys.prefix + "nameservers/"


def split_listen(listen: str) -> tuple[str, int]:
    """A listen address; ``:9876`` means every interface."""
    return split_address("0.0.0.0" + listen if listen.startswith(":") else listen, "listen address",
                         port_zero_ok=True)


def route_fields(route: TopicRoute) -> dict[str, Any]:
    return {
        "topic": route.topic,
        "queues": [
            {
                "queue_id": q.queue_id,
                "leader": q.leader_address,
                "replicas": list(q.replica_addresses),
                "leader_epoch": q.leader_epoch,
                "isr": list(q.isr_addresses),
            }
            for q in route.queues
        ],
    }


def settings_fields(topic: TopicMetadata) -> dict[str, Any]:
    return {"replication_factor": topic.replication_factor, "settings": asdict(topic.settings)}


def broker_fields(info: BrokerInfo) -> dict[str, Any]:
    return {
        "broker_id": info.broker_id,
        "address": info.address,
        "cluster": info.cluster,
        "capacity_bytes": info.capacity_bytes,
    }


def queue_health(topics: list[TopicMetadata], brokers: list[BrokerInfo]) -> dict[str, list[dict[str, Any]]]:
    """Queues that cannot take sends as configured: no live leader (``leader`` null, or its
    broker not registered), or a live leader whose ISR is below the topic's minimum."""
    live = {b.broker_id for b in brokers}
    without_leader: list[dict[str, Any]] = []
    under_min_isr: list[dict[str, Any]] = []
    for topic in topics:
        minimum = topic.settings.min_insync_replicas or 1  # always resolved in a TopicMetadata
        for q in topic.queues:
            if q.leader is None or q.leader not in live:
                without_leader.append({"topic": topic.name, "queue_id": q.queue_id, "leader": q.leader})
            elif len(q.isr) < minimum:
                under_min_isr.append({"topic": topic.name, "queue_id": q.queue_id, "isr": list(q.isr),
                                      "min_insync_replicas": minimum})
    return {"without_leader": without_leader, "under_min_isr": under_min_isr}


class NameServer:
    """One nameserver process's service. ``start()``/``stop()`` run on its event loop.

    ``metrics_listen`` (``host:port``, port 0 for a free one; empty for none) serves
    ``/metrics``, ``/healthz`` and ``/readyz`` there (:attr:`monitoring`)."""

    def __init__(
        self,
        etcd_endpoints: str,
        listen: str = f"0.0.0.0:{DEFAULT_PORT}",
        *,
        advertised: str = "",
        prefix: str = DEFAULT_PREFIX,
        ttl_s: int = NAMESERVER_TTL_S,
        security: SecurityConfig | None = None,
        metrics_listen: str = "",
    ) -> None:
        parse_endpoints(etcd_endpoints)  # ValueError names a bad endpoint before anything starts
        self.security = security = security or SecurityConfig()
        self.etcd_endpoints = etcd_endpoints
        self._host, self._port = split_listen(listen)
        self._metrics_listen = split_listen(metrics_listen) if metrics_listen else None
        self.metrics = NameserverMetrics(self)
        self.monitoring: MonitoringServer | None = None
        self.started_monotonic = time.monotonic()
        self._advertised = advertised
        self._ttl_s = ttl_s
        self._keys = Keys(prefix)
        self._client: EtcdClient | None = None
        self._metadata: ClusterMetadata | None = None
        self._view: ClusterView | None = None
        self._keeper: LeaseKeeper | None = None
        self._controller: Controller | None = None
        self._writes = MetadataWrites(etcd_endpoints, self._require_metadata, lambda: self.view)
        self._rpc = RpcServer(
            {
                RequestCode.GET_ROUTE: self._get_route,
                RequestCode.GET_BROKER_LIST: self._get_broker_list,
                RequestCode.CLUSTER_STATUS: self._cluster_status,
                RequestCode.REGISTER_BROKER: self._register_broker,
                RequestCode.TOPIC_LIST: self._topic_list,
                RequestCode.CREATE_TOPIC: self._create_topic,
                RequestCode.CREATE_TOPICS: self._create_topics,
                RequestCode.UPDATE_TOPIC: self._update_topic,
                RequestCode.DELETE_TOPIC: self._delete_topic,
                RequestCode.GROUP_SETTINGS_PUT: self._put_group_settings,
                RequestCode.GROUP_SETTINGS_GET: self._get_group_settings,
                RequestCode.GROUP_SETTINGS_DELETE: self._delete_group_settings,
                RequestCode.INIT_PRODUCER_ID: self._init_producer_id,
                **AccessAdmin(self._writes).handlers(),
            },
            security=security.server_security(self._user, self._access().authorize if security.authentication
                                              else None),
            observe=self.metrics.requests.observe,
        )
        # GET_ROUTE is the hot path: the response fields are built once per route object.
        self._route_cache: dict[str, tuple[TopicRoute, dict[str, Any]]] = {}
        self._known_nameservers: list[dict[str, Any]] = []
        self._producer_ids = [0, 0]  # the block of producer ids reserved: [next, end)
        self._producer_ids_lock = asyncio.Lock()
        self.address = ""

    @property
    def port(self) -> int:
        return self._rpc.port

    @property
    def metrics_address(self) -> str:
        """``host:port`` of the monitoring endpoint; empty without one."""
        if self._metrics_listen is None or self.monitoring is None:
            return ""
        return join_address(self._metrics_listen[0], self.monitoring.port)

    def _access(self) -> NameserverAccess:
        return NameserverAccess(Authorizer(self._acls if self.security.acl else None, self.security.super_users))

    def _acls(self) -> AclTable:
        return self._view.acls() if self._view is not None else AclTable.empty()

    def _user(self, name: str) -> User | None:
        return self._view.user(name) if self._view is not None else None

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            raise RuntimeError("nameserver is not started")
        return self._view

    async def start(self) -> None:
        """Sync the view from etcd, listen, then announce this nameserver in etcd.

        Raises :class:`EtcdUnavailable` if etcd does not answer and ``OSError`` if the
        listen address cannot be bound; nothing is left running then."""
        self._writes.serve_on(asyncio.get_running_loop())
        self._client = EtcdClient(self.etcd_endpoints, timeout_s=ETCD_REQUEST_TIMEOUT_S,
                                  auth=self.security.etcd_auth(), observe=self.metrics.etcd_call)
        self._metadata = ClusterMetadata(self._client, self._keys.prefix)
        self._view = ClusterView(self._client, self._keys.prefix)
        self._view.subscribe(self._on_view_change)
        try:
            await asyncio.to_thread(self._view.start)
            await self._rpc.start(self._host, self._port)
            self.address = self._advertised or advertised_address(self._host, self._rpc.port)
            self._keeper = LeaseKeeper(
                self._client, self._ttl_s, self._announce, name="nameserver"
            )
            await asyncio.to_thread(self._keeper.start)
            self._controller = Controller(
                self._client, self._view, self.address, prefix=self._keys.prefix, ttl_s=self._ttl_s,
                on_leaders_moved=self.metrics.failovers.inc,
                on_txn=self.metrics.controller_txn,
            )
            await asyncio.to_thread(self._controller.start)
            self.started_monotonic = time.monotonic()
            if self._metrics_listen is not None:
                self.monitoring = await MonitoringServer.start(*self._metrics_listen, self.metrics.registry,
                                                               self.problems)
        except BaseException:
            await self.stop()
            raise
        log.info("nameserver %s serving (etcd %s)", self.address, self.etcd_endpoints)

    async def stop(self) -> None:
        """Stop serving, withdraw this nameserver's key and stop following etcd. Idempotent."""
        monitoring, self.monitoring = self.monitoring, None
        if monitoring is not None:
            await monitoring.stop()
        await self._rpc.stop()
        controller, self._controller = self._controller, None
        if controller is not None:
            await asyncio.to_thread(controller.close)  # resign: the next takes over at once
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await asyncio.to_thread(keeper.stop)
        view, self._view = self._view, None
        if view is not None:
            await asyncio.to_thread(view.stop)
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def problems(self) -> list[str]:
        """Why this nameserver is not ready to serve, if it is not (``/readyz``)."""
        found = []
        if self._view is None or not self._view.healthy:
            found.append("etcd unreachable (cluster view not current): routes come from the cache, topic changes fail")
        if self._keeper is None or not self._keeper.alive:
            found.append("not registered: this nameserver's etcd lease is lost")
        if self.controller_status().controller_id is None:
            found.append("no controller known: the queues of a failed broker keep their dead leader")
        return found

    def controller_status(self) -> ControllerStatus:
        """The acting controller as this nameserver's candidate last saw it."""
        if self._controller is None:
            return ControllerStatus(None, 0, False)
        return self._controller.status()

    def _announce(self, lease_id: int) -> None:
        assert self._client is not None
        value = {"v": LAYOUT_VERSION, "address": self.address, "started_ms": int(time.time() * 1000)}
        key = f"{nameservers_prefix(self._keys)}{lease_id:x}"
        self._client.put(key, json.dumps(value, sort_keys=True).encode(), lease_id=lease_id)

    # -- view change notifications (from the watch thread) ---------------------------------
    def _on_view_change(self, change: ViewChange) -> None:
        if change.kind is ChangeKind.TOPIC_DELETED:
            self._route_cache.pop(change.name, None)  # a deleted topic's answer is not kept
        self._writes.view_changed()

    # -- reads from the cache --------------------------------------------------------------
    async def _get_route(self, request: Frame) -> Response:
        """A topic's route; with ``"settings": true`` (``gms topic describe``) also its
        replication factor and settings, so clients' route refreshes stay as small as before."""
        topic = field(request.fields, "topic", str)
        try:
            route = self.view.route(topic)
        except TopicNotFoundError:
            self.metrics.route_not_found.inc()
            raise
        self.metrics.route_found.inc()
        cached = self._route_cache.get(topic)
        if cached is None or cached[0] is not route:
            cached = (route, route_fields(route))
            self._route_cache[topic] = cached
        if field(request.fields, "settings", bool, False):
            return Response(fields={**cached[1], **settings_fields(self.view.topic(topic))})
        return Response(fields=cached[1])

    async def _get_broker_list(self, request: Frame) -> Response:
        cluster = field(request.fields, "cluster", str, "")
        brokers = [b for b in self.view.brokers() if not cluster or b.cluster == cluster]
        return Response(fields={"brokers": [broker_fields(b) for b in brokers]})

    async def _topic_list(self, request: Frame) -> Response:
        return Response(fields={"topics": {t.name: t.queue_count for t in self.view.topics()}})

    async def _register_broker(self, request: Frame) -> Response:
        """Brokers learn the etcd endpoints here, then hold their own lease in etcd."""
        return Response(fields={"etcd": self.etcd_endpoints, "prefix": self._keys.prefix})

    async def _cluster_status(self, request: Frame) -> Response:
        view = self.view
        healthy = view.healthy
        etcd: dict[str, Any] = {"endpoints": self.etcd_endpoints, "healthy": healthy}
        if healthy:
            try:
                status, nameservers = await asyncio.to_thread(self._read_status)
                etcd["version"] = status
                self._known_nameservers = nameservers
            except ClusterError as err:
                etcd["healthy"] = False
                etcd["error"] = str(err)
        else:
            etcd["error"] = "etcd unreachable; routes are served from the cache"
        controller = self.controller_status()
        return Response(
            fields={
                "etcd": etcd,
                "nameservers": self._known_nameservers,
                "controller": {"id": controller.controller_id, "epoch": controller.epoch, "this": controller.is_self},
                "brokers": [broker_fields(b) for b in view.brokers()],
                "topics": len(view.topics()),
                "queues": queue_health(view.topics(), view.brokers()),
            }
        )

    def _read_status(self) -> tuple[str, list[dict[str, Any]]]:
        assert self._client is not None
        version = self._client.status().version
        kvs = self._client.get_prefix(nameservers_prefix(self._keys)).kvs
        nameservers = []
        for kv in kvs:
            try:
                value = json.loads(kv.value)
                nameservers.append({"address": value["address"], "started_ms": value["started_ms"]})
            except (ValueError, KeyError, TypeError):
                log.error("skipping undecodable nameserver key %r", kv.key)
        nameservers.sort(key=lambda n: n["address"])
        return version, nameservers

    # -- topic administration through etcd -------------------------------------------------
    async def _create_topic(self, request: Frame) -> Response:
        fields = request.fields
        name = check_creatable(field(fields, "topic", str), field(fields, SYSTEM_TOPIC_FIELD, bool, False))
        queues = field(fields, "queues", int, DEFAULT_QUEUE_COUNT)
        replicas = field(fields, "replicas", int, 1)
        settings = TopicSettings.from_dict(field(fields, "settings", dict, {}))
        metadata = self._writes.metadata()
        topic: TopicMetadata = await self._writes.write(
            f"create topic {name}",
            lambda: metadata.create_topic(name, queues, replicas, settings),
        )
        await self._writes.until_view(lambda: self.view.has_topic(name))
        return Response(fields=self._placement(topic))

    async def _create_topics(self, request: Frame) -> Response:
        """Many topics in one request (docs/protocol.md): each entry checked as CREATE_TOPIC checks
        its fields, the valid ones written together (``ClusterMetadata.create_topics``); a row
        per entry, in request order, says what became of it."""
        rows: list[dict[str, Any] | None] = []
        specs: list[NewTopic] = []
        seen: set[str] = set()
        for entry in topic_entries(request.fields):
            try:
                specs.append(self._new_topic(entry, seen))
                rows.append(None)
            except GmsError as err:
                rows.append(error_row(entry_name(entry), err))
        metadata = self._writes.metadata()
        written: list[TopicMetadata | GmsError] = await self._writes.write(
            f"create {len(specs)} topics", lambda: metadata.create_topics(specs)) if specs else []
        created = {t.name for t in written if isinstance(t, TopicMetadata)}
        await self._writes.until_view(lambda: all(map(self.view.has_topic, created)))
        addresses = {b.broker_id: b.address for b in self.view.brokers()}
        results = iter(zip(specs, written, strict=True))
        for n, row in enumerate(rows):
            if row is None:
                rows[n] = self._created_row(*next(results), addresses)
        return Response(fields={"topics": rows})

    @staticmethod
    def _new_topic(entry: Mapping[str, Any], seen: set[str]) -> NewTopic:
        name = check_creatable(field(entry, "topic", str), field(entry, SYSTEM_TOPIC_FIELD, bool, False))
        spec = NewTopic(name, validate_queue_count(field(entry, "queues", int, DEFAULT_QUEUE_COUNT)),
                        validate_replicas(field(entry, "replicas", int, 1)),
                        TopicSettings.from_dict(field(entry, "settings", dict, {})))
        repeated_name(name, seen)  # only a valid entry takes its name
        return spec

    def _created_row(self, spec: NewTopic, result: TopicMetadata | GmsError,
                     addresses: Mapping[str, str]) -> dict[str, Any]:
        """A written topic's row: its queue count, replication factor and the brokers holding it
        (not the route: a thousand routes would not fit one answer)."""
        if isinstance(result, EtcdUnavailable):
            return error_row(spec.name, self._writes.unavailable(f"create topic {spec.name}"))
        if isinstance(result, GmsError):
            return error_row(spec.name, result)
        brokers = sorted({addresses.get(r, r) for q in result.queues for r in q.replicas})
        return ok_row(result.name, queues=result.queue_count, replication_factor=result.replication_factor,
                      brokers=brokers)

    async def _update_topic(self, request: Frame) -> Response:
        fields = request.fields
        name = field(fields, "topic", str)
        queues = field(fields, "queues", int, None)
        settings = field(fields, "settings", dict, {})
        if queues is None and not settings:
            raise BadRequestError("update_topic needs 'queues' and/or 'settings'")
        TopicSettings.from_dict(settings)  # names and values checked before any etcd round trip
        metadata = self._writes.metadata()
        topic: TopicMetadata = await self._writes.write(
            f"update topic {name}",
            lambda: metadata.update_topic(name, queue_count=queues, settings=settings),
        )
        await self._writes.until_view(lambda: self._view_has(topic))
        return Response(fields=self._placement(topic))

    async def _delete_topic(self, request: Frame) -> Response:
        name = field(request.fields, "topic", str)
        metadata = self._writes.metadata()
        await self._writes.write(f"delete topic {name}", lambda: metadata.delete_topic(name))
        await self._writes.until_view(lambda: not self.view.has_topic(name))
        return Response()

    # -- consumer group settings -----------------------------------------------------------------
    async def _put_group_settings(self, request: Frame) -> Response:
        """Set a group's settings: those given replace the stored ones, the rest stay (or take
        their defaults); answers the settings now in force. With ``"create": true`` only for a
        group without settings (``gms group create``)."""
        name = field(request.fields, "group", str)
        changes = field(request.fields, "settings", dict)
        create = field(request.fields, "create", bool, False)
        metadata = self._writes.metadata()

        def put() -> GroupSettings:
            current = None if create else metadata.get_group_settings(name)
            settings = GroupSettings.from_dict({**(current.to_dict() if current else {}), **changes})
            metadata.put_group_settings(name, settings, create=create)
            return settings
        settings = await self._writes.write(f"save the settings of group {name}", put)
        return Response({"settings": settings.to_dict()})

    async def _get_group_settings(self, request: Frame) -> Response:
        name = field(request.fields, "group", str)
        metadata = self._writes.metadata()
        settings = await self._writes.write(f"read the settings of group {name}",
                                            lambda: metadata.get_group_settings(name))
        return Response({"settings": None if settings is None else settings.to_dict()})

    async def _delete_group_settings(self, request: Frame) -> Response:
        name = field(request.fields, "group", str)
        metadata = self._writes.metadata()
        deleted = await self._writes.write(f"delete the settings of group {name}",
                                    lambda: metadata.delete_group_settings(name))
        return Response({"deleted": bool(deleted)})

    # -- idempotent producers --------------------------------------------------------------
    async def _init_producer_id(self, request: Frame) -> Response:
        """A producer id of its own for an idempotent producer, from a block this nameserver reserved
        in etcd (one etcd write per PRODUCER_ID_BLOCK producers)."""
        async with self._producer_ids_lock:
            if self._producer_ids[0] >= self._producer_ids[1]:
                metadata = self._writes.metadata()
                first = await self._writes.write("allocate producer ids",
                                          lambda: metadata.allocate_producer_ids(PRODUCER_ID_BLOCK))
                self._producer_ids = [first, first + PRODUCER_ID_BLOCK]
            producer_id = self._producer_ids[0]
            self._producer_ids[0] += 1
        return Response({"producer_id": producer_id, "epoch": 0})

    def _require_metadata(self) -> ClusterMetadata:
        if self._metadata is None:
            raise ServiceUnavailableError("nameserver is not started")
        return self._metadata

    def _view_has(self, topic: TopicMetadata) -> bool:
        try:
            return self.view.topic(topic.name) == topic
        except GmsError:
            return False

    def _placement(self, topic: TopicMetadata) -> dict[str, Any]:
        brokers = {b.broker_id: b for b in self.view.brokers()}
        return {**route_fields(compute_route(topic, brokers)), **settings_fields(topic)}
