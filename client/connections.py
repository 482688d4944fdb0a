"""One pipelined connection per broker address, reopened after a failure.

Connections are created lazily on first use and replaced when found closed, so a broker
restart costs the caller one retriable error, not a dead client.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from gms.msgid import encode_msg_id
from gms.net import Connection
from gms.net.blocking import BlockingConnection
from gms.net.busy_poll import CLIENT_WINDOW_US
from gms.protocol.frame import Body, Frame
from gms.security.client import PLAINTEXT, ClientSecurity

CONNECT_TIMEOUT_MS = 3000
# Idle blocking connections kept per broker; callers beyond this use the event loop's.
BLOCKING_CONNECTIONS_MAX = 32
_PHYS_OFFSET_HEX_DIGITS = 16  # an i64 offset is the last 8 bytes of a message id


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → (host, port); ValueError says what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"broker address {address!r} is not host:port")
    return host.strip("[]"), int(port)


@lru_cache(maxsize=64)
def msg_id_prefix(address: str) -> str:
    """The part of every message id that names the broker at ``address`` (hex host + port)."""
    host, port = parse_address(address)
    return encode_msg_id(host, port, 0)[:-_PHYS_OFFSET_HEX_DIGITS]


def msg_id(prefix: str, phys_offset: int) -> str:
    return f"{prefix}{phys_offset:016X}"


class ConnectionPool:
    """Connections by broker address; all methods run on the client's event loop."""

    def __init__(self, *, request_timeout_ms: float, connect_timeout_ms: float = CONNECT_TIMEOUT_MS,
                 security: ClientSecurity = PLAINTEXT) -> None:
        self._request_timeout_ms = request_timeout_ms
        self._security = security
        self._connect_timeout_ms = connect_timeout_ms
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._closed = False

    async def get(self, address: str) -> Connection:
        """The open connection to ``address``, connecting (once, shared) if needed.

        The connect runs as a task of its own: a caller cancelled meanwhile (an asyncio client's
        task) leaves it to finish into the pool, where :meth:`close` closes it, never half open
        and unowned; the other callers waiting for it are not cancelled with it."""
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            if self._closed:
                raise RuntimeError("the client is closed")
            pending = self._connecting[address] = asyncio.ensure_future(self._connect(address))
            pending.add_done_callback(_retrieve)
        return await asyncio.shield(pending)

    async def _connect(self, address: str) -> Connection:
        try:
            host, port = parse_address(address)
            conn = await Connection.open(host, port, self._connect_timeout_ms,
                                         request_timeout_ms=self._request_timeout_ms, security=self._security)
        finally:
            del self._connecting[address]
        if self._closed:  # closed while connecting
            await conn.close_and_wait(self._connect_timeout_ms)
            raise RuntimeError("the client is closed")
        self._connections[address] = conn
        return conn

    def open(self, address: str) -> Connection | None:
        """The open connection to ``address``, if there is one now."""
        conn = self._connections.get(address)
        return None if conn is None or conn.closed else conn

    async def request(self, address: str, code: int, fields: Mapping[str, Any] | None = None,
                      body: Body = b"", *, timeout_ms: float | None = None) -> Frame:
        conn = self._connections.get(address)
        if conn is None or conn.closed:
            conn = await self.get(address)
        return await conn.request(code, fields, body, timeout_ms=timeout_ms)

    async def oneway(self, address: str, code: int, fields: Mapping[str, Any] | None = None,
                     body: Body = b"") -> None:
        conn = await self.get(address)
        await conn.oneway(code, fields, body)

    async def close(self) -> None:
        self._closed = True
        connecting = list(self._connecting.values())
        for pending in connecting:
            pending.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
        for conn in connections.values():
            await conn.wait_closed()


def _retrieve(future: asyncio.Future[Connection]) -> None:
    """Mark a connect's failure seen: its callers (if any still wait) raise it themselves."""
    if not future.cancelled():
        future.exception()


class BlockingPool:
    """Blocking connections by broker address, lent to one calling thread at a time.

    ``acquire`` never waits: it hands out an idle connection, opens a new one while fewer
    than ``connections_max`` exist for the address, or returns None (the caller then goes
    through the event loop). Thread-safe."""

    def __init__(self, *, connect_timeout_ms: float = CONNECT_TIMEOUT_MS,
                 connections_max: int = BLOCKING_CONNECTIONS_MAX, security: ClientSecurity = PLAINTEXT,
                 busy_poll_us: int = CLIENT_WINDOW_US) -> None:
        self._connect_timeout_ms = connect_timeout_ms
        self._busy_poll_us = busy_poll_us
        self._security = security
        self._connections_max = connections_max
        self._lock = threading.Lock()
        self._idle: dict[str, list[BlockingConnection]] = {}
        self._open_count: dict[str, int] = {}
        self._closed = False

    def acquire(self, address: str) -> BlockingConnection | None:
        with self._lock:
            if self._closed:
                return None
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
            if self._open_count.get(address, 0) >= self._connections_max:
                return None
            self._open_count[address] = self._open_count.get(address, 0) + 1
        try:
            host, port = parse_address(address)
            return BlockingConnection.open(host, port, self._connect_timeout_ms, security=self._security,
                                           busy_poll_us=self._busy_poll_us)
        except BaseException:
            self._forget(address)
            raise

    def release(self, address: str, conn: BlockingConnection) -> None:
        """Give ``conn`` back (a closed one is dropped)."""
        with self._lock:
            if not conn.closed and not self._closed:
                self._idle.setdefault(address, []).append(conn)
                return
        conn.close()
        self._forget(address)

    def _forget(self, address: str) -> None:
        with self._lock:
            self._open_count[address] -= 1

    def close(self) -> None:
        """Close the idle connections; lent ones are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for address, connections in idle.items():
            for conn in connections:
                conn.close()
                self._forget(address)
