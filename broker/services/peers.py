"""The broker's own connections to the other brokers, one per broker, for the services that act
at a queue's leader elsewhere (a dead letter stored there, a Kafka consumer's commit)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.address import split_address
from gms.errors import GmsError
from gms.net import Connection
from gms.protocol.codes import RequestCode
from gms.security.client import ClientSecurity

REQUEST_TIMEOUT_MS = 10_000


class Peers:
    def __init__(self, security: ClientSecurity) -> None:
        self.security = security  # this broker's outgoing security (its identity when secured)
        self._connections: dict[str, Connection] = {}  # address: connection

    async def request(self, address: str, code: RequestCode, fields: dict[str, Any],
                      body: bytes = b"") -> Mapping[str, Any]:
        """One request to the broker at ``address``: its answer's fields, or its error. A closed
        connection is opened again by the next request."""
        connection = self._connections.get(address)
        if connection is None or connection.closed:
            host, port = split_address(address, "broker address")
            connection = await Connection.open(host, port, REQUEST_TIMEOUT_MS, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                               security=self.security)
            self._connections[address] = connection
        try:
            return (await connection.request(code, fields, body, timeout_ms=REQUEST_TIMEOUT_MS)).fields
        except GmsError:
            if connection.closed:
                self._connections.pop(address, None)
            raise

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
