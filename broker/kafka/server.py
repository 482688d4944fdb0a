"""The Kafka endpoint of a broker: a TCP server on the broker's event loop speaking Kafka's framing
(a 4-byte big-endian size, then the request header and body).

Each connection serves its requests one at a time, in order, as a Kafka broker does (a Kafka
client pipelines, and expects its answers in the order it asked). A request this endpoint cannot
serve closes the connection: a frame over FRAME_BYTES_MAX, an API key or version not in
ApiVersions (ApiVersions itself answers UNSUPPORTED_VERSION, :mod:`.apis`), bytes that do not
follow the API's schema. A produce request with acks=0 gets no answer, as Kafka's.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from gms.address import join_address
from gms.broker.kafka.apis import ApiKey, Header, read_header, read_request, unsupported_api_versions, write_response
from gms.broker.kafka.cluster import Cluster
from gms.broker.kafka.data import Data, UnansweredError
from gms.broker.kafka.groups import KafkaGroups
from gms.broker.kafka.offsets import Offsets
from gms.broker.kafka.wire import Malformed, Reader
from gms.broker.services import Services

log = logging.getLogger(__name__)

FRAME_BYTES_MAX = 100 << 20  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")

Handler = Callable[[dict[str, Any], int, str], Awaitable[dict[str, Any] | None] | dict[str, Any] | None]


class KafkaEndpoint:
    """The server; ``endpoint`` is the host:port clients are told to use (Metadata, etcd)."""

    def __init__(self, server: asyncio.Server, port: int, endpoint: str, handlers: dict[ApiKey, Handler],
                 groups: KafkaGroups) -> None:
        self.server = server
        self.groups = groups
        self.port = port
        self.endpoint = endpoint
        self.handlers = handlers
        self._connections: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, services: Services, broker_id: str, address: str, host: str, port: int,
                    advertised_host: str, advertised: str, default_queue_count: int) -> KafkaEndpoint:
        """Listen on ``host:port`` (port 0: a free one). Clients are told ``advertised`` (host:port)
        or, when it is empty, ``advertised_host`` with the bound port; ``address``: the broker's
        gms address, ``broker_id`` its id."""
        endpoint: KafkaEndpoint | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert endpoint is not None
            await endpoint._serve(reader, writer)

        server = await asyncio.start_server(serve, host, port, limit=1 << 16)
        bound = server.sockets[0].getsockname()[1]
        public = advertised or join_address(advertised_host, bound)
        cluster = Cluster(services, broker_id, address, public, default_queue_count)
        data = Data(services)
        groups = KafkaGroups(services, address)
        offsets = Offsets(services, groups)
        handlers: dict[ApiKey, Handler] = {
            ApiKey.API_VERSIONS: lambda req, version, client: cluster.api_versions(req, version),
            ApiKey.METADATA: lambda req, version, client: cluster.metadata(req, version),
            ApiKey.FIND_COORDINATOR: lambda req, version, client: cluster.find_coordinator(req, version),
            ApiKey.CREATE_TOPICS: lambda req, version, client: cluster.create_topics(req, version),
            ApiKey.DELETE_TOPICS: lambda req, version, client: cluster.delete_topics(req, version),
            ApiKey.PRODUCE: data.produce,
            ApiKey.FETCH: data.fetch,
            ApiKey.LIST_OFFSETS: data.list_offsets,
            ApiKey.OFFSET_COMMIT: offsets.offset_commit,
            ApiKey.OFFSET_FETCH: offsets.offset_fetch,
            ApiKey.JOIN_GROUP: groups.join_group,
            ApiKey.SYNC_GROUP: groups.sync_group,
            ApiKey.HEARTBEAT: groups.heartbeat,
            ApiKey.LEAVE_GROUP: groups.leave_group,
        }
        endpoint = cls(server, bound, public, handlers, groups)
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
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        client = join_address(peer[0], peer[1]) if isinstance(peer, tuple) else ""
        try:
            while True:
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                if not 0 < size <= FRAME_BYTES_MAX:
                    log.info("kafka client %s: frame of %d bytes: closing", client, size)
                    return
                answer = await self._answer(await reader.readexactly(size), client)
                if answer is None:
                    return
                if answer:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, frame: bytes, client: str) -> bytes | bytearray | None:
        """The response frame; b"" for none (acks=0); None to close the connection."""
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
        return await self._handle(header, request, client)

    async def _handle(self, header: Header, request: dict[str, Any], client: str) -> bytes | bytearray | None:
        handler = self.handlers[ApiKey(header.api_key)]
        try:
            body = handler(request, header.api_version, client)
            if asyncio.iscoroutine(body):
                body = await body
        except UnansweredError as err:
            log.info("kafka client %s: %s: closing", client, err)
            return None
        except Exception:
            log.exception("kafka %s v%d from %s failed: closing", ApiKey(header.api_key).name, header.api_version,
                          client)
            return None
        if body is None:
            return b""
        return write_response(header, body)  # type: ignore[arg-type]
