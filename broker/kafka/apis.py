"""The Kafka APIs this adapter serves, at which versions, and the request and response headers.

ApiVersions advertises exactly :data:`SUPPORTED`; a request for any other API key or version is
not served (the connection is closed, as a Kafka broker closes it), except ApiVersions itself,
which answers UNSUPPORTED_VERSION with the list at version 0 so that the client retries with one
it shares (KIP-511).

Request header v1 (client id a nullable int16-length string) and v2 (v1 plus tagged fields) for
flexible versions; response header v0 (correlation id) and v1 (plus tagged fields), except that
an ApiVersions response always has header v0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gms.broker.kafka.schema import Message, message
from gms.broker.kafka.wire import FrameWriter, Reader, ResponseFrame


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    SASL_AUTHENTICATE = 36
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60


# The versions served: capped where a later one needs what gms lacks (topic ids in Produce and
# Fetch 13+, ListOffsets 7+'s max-timestamp lookup, the consumer protocol of KIP-848 in
# OffsetCommit / OffsetFetch 9+, DeleteTopics 6's topic ids, ListGroups 5's group types, DescribeGroups
# 6's error messages; DescribeConfigs 0 as Kafka 4 dropped it; SaslHandshake 0, whose tokens follow
# without Kafka's framing; InitProducerId 6, two-phase commit).
SUPPORTED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 6),
    ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 4),
    ApiKey.SASL_HANDSHAKE: (1, 1),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
}
# The schema's name: the key's name in CamelCase ("OFFSET_COMMIT" -> "OffsetCommit").
_NAMES = {key: "".join(word.capitalize() for word in key.name.split("_")) for key in ApiKey}


def request_schema(key: ApiKey) -> Message:
    return message(_NAMES[key] + "Request")


def response_schema(key: ApiKey) -> Message:
    return message(_NAMES[key] + "Response")


@dataclass(frozen=True, slots=True)
class Header:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None

    @property
    def served(self) -> bool:
        versions = SUPPORTED.get(self.api_key)  # type: ignore[call-overload]
        return versions is not None and versions[0] <= self.api_version <= versions[1]

    @property
    def flexible(self) -> bool:
        return self.served and request_schema(ApiKey(self.api_key)).is_flexible(self.api_version)


def read_header(reader: Reader) -> Header:
    """The request header; its tagged fields too when the API and version are served and flexible."""
    header = Header(reader.int16(), reader.int16(), reader.int32(), reader.string(False))
    if header.flexible:
        reader.tagged()
    return header


def write_response(header: Header, body: dict[str, object]) -> ResponseFrame:
    """The response frame (length prefix, header, body) to ``header``'s request, as buffers to
    write in order (large byte fields, a fetch's records, are not copied: :class:`FrameWriter`)."""
    key = ApiKey(header.api_key)
    version = header.api_version
    schema = response_schema(key)
    writer = FrameWriter()
    head = writer.buf  # the frame's first buffer, whatever follows
    writer.int32(0)  # the frame length, set below
    writer.int32(header.correlation_id)
    if key is not ApiKey.API_VERSIONS and schema.is_flexible(version):
        writer.uvarint(0)  # no tagged fields in the header
    schema.write(writer, body, version)
    head[0:4] = (writer.size() - 4).to_bytes(4, "big")
    return writer.parts()


def api_versions_body(error: int = 0) -> dict[str, object]:
    return {"error_code": error, "api_keys": [{"api_key": int(key), "min_version": low, "max_version": high}
                                              for key, (low, high) in sorted(SUPPORTED.items())]}


def unsupported_api_versions(header: Header) -> ResponseFrame:
    """ApiVersions at a version not served: UNSUPPORTED_VERSION and the list, at version 0."""
    return write_response(Header(header.api_key, 0, header.correlation_id, header.client_id),
                          api_versions_body(error=35))


def read_request(header: Header, reader: Reader) -> dict[str, object]:
    """The request's body. Bytes after it are ignored, as a Kafka broker ignores them (librdkafka's
    Metadata request for every topic carries three)."""
    return request_schema(ApiKey(header.api_key)).read(reader, header.api_version)
