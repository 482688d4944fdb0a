"""Run gms servers as real child processes for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gms.nameserver.embedded_etcd import free_port  # noqa: F401  (re-exported for tests)

START_TIMEOUT_S = 20.0
# Test brokers use small commitlog files: the store preallocates each file (and the next one),
# and a suite starts dozens of brokers.
TEST_COMMITLOG_FILE_SIZE_BYTES = 32 * 1024 * 1024
TEST_CQ_FILE_ENTRIES = 20_000  # 400 KB consumeQueue files instead of 6 MB


class BrokerProcess:
    """A ``gms-broker`` child on 127.0.0.1 with an ephemeral port (read from its port file)."""

    module = "gms.broker"

    def __init__(self, store_dir: Path, args: list[str]) -> None:
        self.store_dir = store_dir
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = store_dir.parent / f"{store_dir.name}.log"

    def location_args(self) -> list[str]:
        return ["--store-dir", str(self.store_dir),
                "--commitlog-file-size", str(TEST_COMMITLOG_FILE_SIZE_BYTES),
                "--cq-file-entries", str(TEST_CQ_FILE_ENTRIES)]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, listen_port: int = 0) -> BrokerProcess:
        port_file = self.store_dir.parent / f"{self.store_dir.name}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-P", "-m", self.module, "--listen", f"127.0.0.1:{listen_port}",
               *self.location_args(), "--port-file", str(port_file), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.module} did not start: {self.log_tail()}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        return self

    def restart(self) -> BrokerProcess:
        """Start again on the same port and store (after stop or kill)."""
        return self.start(self.port)

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait: a clean stop (flush, checkpoint)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


class NameserverProcess(BrokerProcess):
    """A ``gms-nameserver`` child: on ``etcd`` when given, else with its own embedded etcd
    under ``data_dir``. Same life cycle as :class:`BrokerProcess` (start, stop, kill, restart)."""

    module = "gms.nameserver"

    def __init__(self, data_dir: Path, etcd: str | None = None, args: list[str] | None = None) -> None:
        super().__init__(data_dir, list(args or ()))
        self.etcd = etcd

    def location_args(self) -> list[str]:
        return ["--etcd", self.etcd] if self.etcd else ["--data-dir", str(self.store_dir)]


# --- waiting and process-tree inspection (from /proc; no psutil) ----------------------------


# `gms standalone` flags that put its metrics endpoints, console and RocketMQ API on free ports too.
FREE_MONITORING_PORTS = ("--nameserver-metrics-port", "0", "--broker-metrics-port", "0", "--console-port", "0",
                         "--rocketmq-port", "0", "--kafka-port", "0")


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
