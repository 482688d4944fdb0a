"""Helpers for the nameserver service tests (no tests here): an in-process NameServer on a
loop thread, a synchronous RPC client, process-tree inspection."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

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

    def __init__(self, etcd_endpoints: str, prefix: str, ttl_s: int = 10) -> None:
        self.loop = LoopThread(name="test-nameserver")
        self.server = NameServer(etcd_endpoints, "127.0.0.1:0", prefix=prefix, ttl_s=ttl_s)
        self.loop.run(self.server.start(), REQUEST_TIMEOUT_MS * 2)
        self.address = f"127.0.0.1:{self.server.port}"
        self.rpc = Rpc(self.loop, self.server.port)

    def call(self, code: int, fields: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        return self.rpc.call(code, fields)

    def stop(self) -> None:
        self.rpc.close()
        self.loop.run(self.server.stop(), REQUEST_TIMEOUT_MS * 2)
        self.loop.stop()


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``predicate`` held; fails the test after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.01)
    return time.monotonic() - start


def descendants(pid: int) -> set[int]:
    """All live descendants of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (e.g. a test's data dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found
