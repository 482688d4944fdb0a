"""The Kafka endpoint of a broker: a TCP server on the broker's event loop speaking Kafka's framing
(a 4-byte big-endian size, then the request header and body).

Each connection serves its requests one at a time, in order, as a Kafka broker does (a Kafka
client pipelines, and expects its answers in the order it asked). A request this endpoint cannot
serve closes the connection: a frame over FRAME_BYTES_MAX, an API key or version not in
ApiVersions (ApiVersions itself answers UNSUPPORTED_VERSION, :mod:`.apis`), bytes that do not
follow the API's schema. A produce request with acks=0 gets no answer, as Kafka's. Connections
beyond the broker's ``connections_max`` are closed at once, and one silent for its
``idle_timeout_ms`` is closed (Kafka's connections.max.idle.ms, 10 min by default).

With the broker's security on, the endpoint serves TLS with the broker's certificate, a connection
authenticates before its requests are served (:mod:`.sasl`), and each request is held to gms's
ACLs (:mod:`.access`).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import Any

from gms.address import join_address
from gms.broker.kafka.access import Handler, KafkaAccess, served
from gms.broker.kafka.apis import ApiKey, Header, read_header, read_request, unsupported_api_versions, write_response
from gms.broker.kafka.cluster import Cluster
from gms.broker.kafka.configs import Configs
from gms.broker.kafka.data import Data, UnansweredError
from gms.broker.kafka.fetch_sessions import FetchSessions
from gms.broker.kafka.group_admin import GroupAdmin
from gms.broker.kafka.groups import KafkaGroups
from gms.broker.kafka.idempotence import ProducerIds
from gms.broker.kafka.offsets import Offsets
from gms.broker.kafka.partitions import Partitions
from gms.broker.kafka.sasl import SaslSession
from gms.broker.kafka.wire import Malformed, Reader, ResponseFrame
from gms.broker.services import Services
from gms.net.server import CONNECTIONS_MAX, IDLE_TIMEOUT_MS
from gms.security.authorizer import Authorizer
from gms.security.gate import ServerSecurity, current_principal

log = logging.getLogger(__name__)

FRAME_BYTES_MAX = 100 << 20  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")

@dataclass(frozen=True, slots=True)
class Limits:
    """How many clients at once, and how long one may stay silent (Kafka's connections.max.idle.ms)."""

    connections_max: int = CONNECTIONS_MAX
    idle_timeout_ms: int = IDLE_TIMEOUT_MS


class KafkaEndpoint:
    """The server; ``endpoint`` is the host:port clients are told to use (Metadata, etcd)."""

    def __init__(self, server: asyncio.Server, port: int, endpoint: str, handlers: dict[ApiKey, Handler],
                 groups: KafkaGroups, limits: Limits, security: ServerSecurity, access: KafkaAccess | None) -> None:
        self.server = server
        self.security = security
        self.access = access
        self.groups = groups
        self.limits = limits
        self.port = port
        self.endpoint = endpoint
        self.handlers = handlers
        self._connections: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, services: Services, broker_id: str, address: str, host: str, port: int,
                    advertised_host: str, advertised: str, default_queue_count: int,
                    limits: Limits | None = None, security: ServerSecurity | None = None,
                    authorizer: Authorizer | None = None) -> KafkaEndpoint:
        """Listen on ``host:port`` (port 0: a free one). Clients are told ``advertised`` (host:port)
        or, when it is empty, ``advertised_host`` with the bound port; ``address``: the broker's
        gms address, ``broker_id`` its id. ``security``: the broker's TLS and users (SASL,
        :mod:`.sasl`); ``authorizer``: its ACLs, applied per request (:mod:`.access`)."""
        security = security or ServerSecurity()
        endpoint: KafkaEndpoint | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert endpoint is not None
            await endpoint._serve(reader, writer)

        tls_timeout_s = security.tls_handshake_timeout_ms / 1000 if security.tls is not None else None
        server = await asyncio.start_server(serve, host, port, limit=1 << 16, ssl=security.tls,
                                            ssl_handshake_timeout=tls_timeout_s, ssl_shutdown_timeout=tls_timeout_s)
        bound = server.sockets[0].getsockname()[1]
        public = advertised or join_address(advertised_host, bound)
        cluster = Cluster(services, broker_id, address, public, default_queue_count)
        data = Data(services)
        groups = KafkaGroups(services, address)
        offsets = Offsets(services, groups)
        group_admin = GroupAdmin(services, groups)
        configs = Configs(services, default_queue_count)
        partitions = Partitions(services)
        handlers: dict[ApiKey, Handler] = {
            ApiKey.API_VERSIONS: lambda req, version, client: cluster.api_versions(req, version),
            ApiKey.METADATA: lambda req, version, client: cluster.metadata(req, version),
            ApiKey.FIND_COORDINATOR: lambda req, version, client: cluster.find_coordinator(req, version),
            ApiKey.CREATE_TOPICS: lambda req, version, client: cluster.create_topics(req, version),
            ApiKey.DELETE_TOPICS: lambda req, version, client: cluster.delete_topics(req, version),
            ApiKey.DESCRIBE_CLUSTER: lambda req, version, client: cluster.describe_cluster(req, version),
            ApiKey.DESCRIBE_CONFIGS: configs.describe_configs,
            ApiKey.ALTER_CONFIGS: configs.alter_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.incremental_alter_configs,
            ApiKey.CREATE_PARTITIONS: configs.create_partitions,
            ApiKey.PRODUCE: data.produce,
            ApiKey.INIT_PRODUCER_ID: ProducerIds(services).init_producer_id,
            ApiKey.FETCH: FetchSessions(data.fetch).fetch,
            ApiKey.LIST_OFFSETS: data.list_offsets,
            ApiKey.OFFSET_COMMIT: offsets.offset_commit,
            ApiKey.OFFSET_FETCH: offsets.offset_fetch,
            ApiKey.JOIN_GROUP: groups.join_group,
            ApiKey.SYNC_GROUP: groups.sync_group,
            ApiKey.HEARTBEAT: groups.heartbeat,
            ApiKey.LEAVE_GROUP: groups.leave_group,
            ApiKey.LIST_GROUPS: group_admin.list_groups,
            ApiKey.DESCRIBE_GROUPS: group_admin.describe_groups,
            ApiKey.DELETE_GROUPS: group_admin.delete_groups,
            ApiKey.OFFSET_DELETE: group_admin.offset_delete,
            ApiKey.DELETE_RECORDS: partitions.delete_records,
            ApiKey.ELECT_LEADERS: partitions.elect_leaders,
        }
        endpoint = cls(server, bound, public, handlers, groups, limits or Limits(), security,
                       KafkaAccess(authorizer) if authorizer is not None else None)
        groups.start()
        return endpoint

    async def stop(self) -> None:
        self.server.close()
        await self.groups.stop()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        client = join_address(peer[0], peer[1]) if isinstance(peer, tuple) else ""
        if len(self._connections) >= self.limits.connections_max:
            log.warning("kafka client %s refused: %d connections already", client, len(self._connections))
            writer.close()
            return
        self._connections.add(task)
        idle_s = self.limits.idle_timeout_ms / 1000
        session = SaslSession(self.security, writer.get_extra_info("ssl_object"), client)
        try:
            while not session.closing:
                size = _SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), idle_s))[0]
                if not 0 < size <= FRAME_BYTES_MAX:
                    log.info("kafka client %s: frame of %d bytes: closing", client, size)
                    return
                answer = await self._answer(await reader.readexactly(size), client, session)
                if answer is None:
                    return
                if answer:
                    writer.writelines(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, frame: bytes, client: str, session: SaslSession) -> ResponseFrame | None:
        """The response frame's buffers; [] for none (acks=0); None to close the connection."""
        reader = Reader(frame)
        try:
            header = read_header(reader)
        except Malformed as err:
            log.info("kafka client %s: unreadable request header (%s): closing", client, err)
            return None
        if not header.served:
            if header.api_key == ApiKey.API_VERSIONS:
                return unsupported_api_versions(header)
            log.info("kafka client %s (%s): API %d version %d is not served: closing", client, header.client_id,
                     header.api_key, header.api_version)
            return None
        try:
            request = read_request(header, reader)
        except Malformed as err:
            log.info("kafka client %s: malformed %s v%d (%s): closing", client, ApiKey(header.api_key).name,
                     header.api_version, err)
            return None
        key = ApiKey(header.api_key)
        if key is ApiKey.SASL_HANDSHAKE:
            return write_response(header, session.handshake(request, header.api_version, client))
        if key is ApiKey.SASL_AUTHENTICATE:
            return write_response(header, session.authenticate(request, header.api_version, client))
        if session.required and session.principal is None and key is not ApiKey.API_VERSIONS:
            log.info("kafka client %s: %s before authenticating: closing", client, key.name)
            return None
        return await self._handle(header, request, client, session)

    async def _handle(self, header: Header, request: dict[str, Any], client: str,
                      session: SaslSession) -> ResponseFrame | None:
        key = ApiKey(header.api_key)
        handler = self.handlers[key]
        principal = session.principal
        current_principal.set(principal)  # the services check what they learn of (a produce's topics)
        try:
            if self.access is not None and principal is not None:
                body = await self.access.answer(key, handler, request, header.api_version, client, principal)
            else:
                body = await served(handler, request, header.api_version, client)
        except UnansweredError as err:
            log.info("kafka client %s: %s: closing", client, err)
            return None
        except Exception:
            log.exception("kafka %s v%d from %s failed: closing", ApiKey(header.api_key).name, header.api_version,
                          client)
            return None
        if body is None:
            return []
        return write_response(header, body)
