"""A real secured cluster for tests: embedded etcd, a nameserver and brokers as processes, all
with TLS (a development CA), authentication and ACLs, and users created in etcd up front."""

from __future__ import annotations

import time
from pathlib import Path

from processes import BrokerProcess, NameserverProcess

from gms.client import Admin
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.nameserver.embedded_etcd import EmbeddedEtcd
from gms.security.client import ClientSecurity
from gms.security.devca import DevPki, ensure_dev_pki
from gms.security.scram import Credential
from gms.security.tls import TlsFiles
from gms.security.users import User

REGISTER_TIMEOUT_S = 20.0
COMMITLOG_FILE_SIZE_BYTES = 32 * 1024 * 1024
PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw", "svc-broker": "broker-pw"}
ROLES = {"admin": "super", "alice": "normal", "bob": "normal", "svc-broker": "broker"}


class SecuredCluster:
    def __init__(self, root: Path, broker_toml: str = "") -> None:
        """``broker_toml``: a ``--config`` file for every broker (e.g. a short lease for failovers)."""
        self.root = root
        self.broker_toml = broker_toml
        self.pki: DevPki = ensure_dev_pki(root / "pki")
        self.etcd = EmbeddedEtcd(root / "etcd")
        self.nameservers: list[NameserverProcess] = []
        self.brokers: list[BrokerProcess] = []

    def server_args(self) -> list[str]:
        pki = self.pki
        return ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca_cert),
                "--authentication", "--acl"]

    def start(self, brokers: int = 2) -> SecuredCluster:
        try:
            self.etcd.start()
            with EtcdClient(self.etcd.endpoint) as client:
                metadata = ClusterMetadata(client)
                for name, password in PASSWORDS.items():
                    metadata.put_user(User(name, ROLES[name], Credential.for_password(password)))
            ns = NameserverProcess(self.root / "ns0", self.etcd.endpoint, self.server_args())
            self.nameservers.append(ns.start())
            for _ in range(brokers):
                self.add_broker()
            self.wait_registered(brokers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_broker(self) -> BrokerProcess:
        config: list[str] = []
        if self.broker_toml:
            path = self.root / f"broker{len(self.brokers)}.toml"
            path.write_text(self.broker_toml)
            config = ["--config", str(path)]
        broker = BrokerProcess(self.root / f"broker{len(self.brokers)}", [
            "--nameserver", self.nameserver, "--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES), *config,
            *self.server_args(), "--user", "svc-broker", "--password", PASSWORDS["svc-broker"]])
        self.brokers.append(broker)
        return broker.start()

    @property
    def nameserver(self) -> str:
        return ",".join(ns.address for ns in self.nameservers)

    def security(self, user: str = "", password: str | None = None, *, ca: Path | None = None) -> ClientSecurity:
        """TLS trusting the cluster's CA (or ``ca``), as ``user`` (with its password unless given)."""
        tls = TlsFiles(str(ca or self.pki.ca_cert))
        if not user:
            return ClientSecurity(tls)
        return ClientSecurity(tls, user, PASSWORDS[user] if password is None else password)

    def admin(self, user: str = "admin") -> Admin:
        return Admin(nameserver=self.nameserver, security=self.security(user))

    def wait_registered(self, count: int) -> None:
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        with self.admin() as admin:
            while len(admin.brokers()) < count:
                if time.monotonic() > deadline:
                    logs = "\n".join(b.log_tail() for b in self.brokers)
                    raise RuntimeError(f"secured brokers did not register: {logs}")
                time.sleep(0.1)

    def stop(self) -> None:
        for proc in [*self.brokers, *self.nameservers]:
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - stop the rest; the test already reported
                proc.kill()
        self.etcd.stop()
