"""``gms standalone --secure``: a development CA, an ``admin`` super user and a broker credential.

Everything is kept in the data dir (0600 files in 0700 directories) and reused on the next start:
``tls/`` (the CA, the servers' and a client certificate), ``secrets/admin.password`` and
``secrets/broker.password``. The admin user is created in etcd only when it is missing, so a
password changed with ``gms user add admin`` stays changed. Passwords reach the children through
their environment, never their command line.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata, Keys
from gms.nameserver.embedded_etcd import EmbeddedEtcd
from gms.private_files import make_private_dir, write_private
from gms.security.devca import DEFAULT_HOSTS, DevPki, ensure_dev_pki
from gms.security.scram import Credential
from gms.security.users import User

ADMIN_USER = "admin"
BROKER_USER = "broker"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class SecuredStandalone:
    pki: DevPki
    admin_password_file: Path
    broker_password: str

    def server_args(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(flags for both servers, the nameserver's extra environment, the broker's)."""
        args = ["--tls-cert", str(self.pki.server_cert), "--tls-key", str(self.pki.server_key),
                "--tls-ca", str(self.pki.ca_cert), "--authentication", "--acl"]
        broker_env = {"GMS_BROKER_USER": BROKER_USER, "GMS_BROKER_PASSWORD": self.broker_password}
        return args, {}, broker_env

    def describe(self) -> str:
        return ("  security    TLS (development CA), authentication, ACLs; super user "
                f"{ADMIN_USER!r}\n"
                "  clients     export GMS_TLS_CA=" + str(self.pki.ca_cert) + f" GMS_USER={ADMIN_USER}"
                f" GMS_PASSWORD=$(cat {self.admin_password_file})")


def secure_setup(data_dir: Path, host: str, etcd: EmbeddedEtcd) -> SecuredStandalone:
    """Certificates, passwords and the two users, before the servers start."""
    hosts = list(DEFAULT_HOSTS) + ([host] if host not in WILDCARD_HOSTS and host not in DEFAULT_HOSTS else [])
    pki = ensure_dev_pki(data_dir / "tls", hosts=hosts, client_name=ADMIN_USER)
    secrets_dir = data_dir / "secrets"
    make_private_dir(secrets_dir)
    admin_password = _password(secrets_dir / "admin.password")
    broker_password = _password(secrets_dir / "broker.password")
    with EtcdClient(etcd.endpoint) as client:
        metadata = ClusterMetadata(client, DEFAULT_PREFIX)
        if client.get(Keys(DEFAULT_PREFIX).user(ADMIN_USER)) is None:
            metadata.put_user(User(ADMIN_USER, "super", Credential.for_password(admin_password)))
        metadata.put_user(User(BROKER_USER, "broker", Credential.for_password(broker_password)))
    return SecuredStandalone(pki, secrets_dir / "admin.password", broker_password)


def _password(path: Path) -> str:
    """The password kept in ``path``, made (and kept, 0600) the first time."""
    if path.is_file():
        kept = path.read_text().strip()
        if kept:
            return kept
    password = secrets.token_urlsafe(18)
    write_private(path, password.encode() + b"\n")
    return password
