"""``gms standalone --secure``: a development CA, a secured etcd, an ``admin`` super user and a
broker credential.

Everything is kept in the data dir (0600 files in 0700 directories) and reused on the next start:
``tls/`` (the CA, the servers' and a client certificate), ``secrets/`` (the passwords of the
``admin`` and ``broker`` gms users and of etcd's ``root`` and ``gms`` users). etcd serves TLS with
the servers' certificate and has authentication on; the nameserver and the broker reach it as
``gms``, confined to the cluster's key prefix. The admin user is created only when it is missing,
so a password changed with ``gms user add admin`` stays changed. Passwords reach the children
through their environment, never their command line. Once secured, a data dir stays secured (its
etcd has authentication on).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata, Keys
from gms.nameserver.embedded_etcd import EmbeddedEtcd, EmbeddedEtcdAuth
from gms.private_files import kept_secret
from gms.security.devca import DEFAULT_HOSTS, DevPki, ensure_dev_pki
from gms.security.scram import Credential
from gms.security.tls import TlsFiles
from gms.security.users import User

ADMIN_USER = "admin"
BROKER_USER = "broker"
ETCD_USER = "gms"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class SecuredStandalone:
    pki: DevPki
    secrets_dir: Path
    passwords: dict[str, str]  # admin, broker, etcd-root, etcd-gms

    @property
    def admin_password_file(self) -> Path:
        return self.secrets_dir / "admin.password"

    @property
    def etcd_tls(self) -> TlsFiles:
        return TlsFiles(str(self.pki.ca_cert), str(self.pki.server_cert), str(self.pki.server_key))

    @property
    def etcd_auth(self) -> EmbeddedEtcdAuth:
        return EmbeddedEtcdAuth(self.passwords["etcd-root"], ETCD_USER, self.passwords["etcd-gms"], DEFAULT_PREFIX)

    def create_users(self, etcd: EmbeddedEtcd) -> None:
        """The admin (when missing) and broker users, in the started etcd."""
        with EtcdClient(etcd.endpoint, auth=etcd.client_auth) as client:
            metadata = ClusterMetadata(client, DEFAULT_PREFIX)
            if client.get(Keys(DEFAULT_PREFIX).user(ADMIN_USER)) is None:
                metadata.put_user(User(ADMIN_USER, "super", Credential.for_password(self.passwords["admin"])))
            metadata.put_user(User(BROKER_USER, "broker", Credential.for_password(self.passwords["broker"])))

    def server_args(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(flags for both servers, the nameserver's extra environment, the broker's)."""
        ca = str(self.pki.ca_cert)
        args = ["--tls-cert", str(self.pki.server_cert), "--tls-key", str(self.pki.server_key), "--tls-ca", ca,
                "--authentication", "--acl", "--etcd-user", ETCD_USER, "--etcd-ca", ca]
        etcd_password = self.passwords["etcd-gms"]
        nameserver_env = {"GMS_NAMESERVER_ETCD_PASSWORD": etcd_password}
        broker_env = {"GMS_BROKER_USER": BROKER_USER, "GMS_BROKER_PASSWORD": self.passwords["broker"],
                      "GMS_BROKER_ETCD_PASSWORD": etcd_password}
        return args, nameserver_env, broker_env

    def client_env(self) -> dict[str, str]:
        """What a client child (the console) needs to reach the secured cluster as the admin."""
        return {"GMS_TLS_CA": str(self.pki.ca_cert), "GMS_USER": ADMIN_USER, "GMS_PASSWORD": self.passwords["admin"]}

    def describe(self) -> str:
        return ("  security    TLS (development CA), authentication, ACLs, etcd with TLS and authentication;"
                f" super user {ADMIN_USER!r}\n"
                "  clients     export GMS_TLS_CA=" + str(self.pki.ca_cert) + f" GMS_USER={ADMIN_USER}"
                f" GMS_PASSWORD=$(cat {self.admin_password_file})")


def prepare_secure(data_dir: Path, host: str) -> SecuredStandalone:
    """Certificates and passwords, made the first time and reused after that."""
    hosts = list(DEFAULT_HOSTS) + ([host] if host not in WILDCARD_HOSTS and host not in DEFAULT_HOSTS else [])
    pki = ensure_dev_pki(data_dir / "tls", hosts=hosts, client_name=ADMIN_USER)
    secrets_dir = _secrets_dir(data_dir)
    passwords = {name: kept_secret(secrets_dir / f"{name}.password")
                 for name in ("admin", "broker", "etcd-root", "etcd-gms")}
    return SecuredStandalone(pki, secrets_dir, passwords)



def secured_before(data_dir: Path) -> bool:
    """Whether ``data_dir`` was started with ``--secure`` (its etcd has authentication on since)."""
    return (_secrets_dir(data_dir) / "etcd-root.password").exists()


def _secrets_dir(data_dir: Path) -> Path:
    return data_dir / "secrets"
