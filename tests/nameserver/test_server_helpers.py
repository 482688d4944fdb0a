"""Helpers for the nameserver service tests (no tests here): an in-process NameServer on a
loop thread and a synchronous RPC client. Process-tree and waiting helpers are in tests/processes.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.nameserver.server import NameServer
from gms.net import Connection, LoopThread
from gms.protocol.frame import Frame

REQUEST_TIMEOUT_MS = 10_000


class Rpc:
    """A synchronous client for one server, over a connection living on ``loop``."""

    def __init__(self, loop: LoopThread, port: int) -> None:
        self._loop = loop
        self.conn: Connection = loop.run(Connection.open("127.0.0.1", port))

    def call(self, code: int, fields: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        frame: Frame = self._loop.run(self.conn.request(code, fields or {}), REQUEST_TIMEOUT_MS)
        return frame.fields

    def close(self) -> None:
        self.conn.close()


class RunningNameServer:
    """A NameServer started on its own loop thread; ``rpc`` is a client connected to it."""

    def __init__(self, etcd_endpoints: str, prefix: str, ttl_s: int = 10, *, listen: str = "127.0.0.1:0") -> None:
        self.loop = LoopThread(name="test-nameserver")
        self.server = NameServer(etcd_endpoints, listen, prefix=prefix, ttl_s=ttl_s)
        self.loop.run(self.server.start(), REQUEST_TIMEOUT_MS * 2)
        self.address = f"127.0.0.1:{self.server.port}"
        self.rpc = Rpc(self.loop, self.server.port)

    def call(self, code: int, fields: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        return self.rpc.call(code, fields)

    def stop(self) -> None:
        self.rpc.close()
        self.loop.run(self.server.stop(), REQUEST_TIMEOUT_MS * 2)
        self.loop.stop()
