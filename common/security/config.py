"""The ``[security]`` settings of a broker or nameserver, and what they turn into.

One table, the same for both servers (``gms-broker --config`` files, flags of the same names on
both commands, ``gms standalone --secure``):

- ``tls_cert`` / ``tls_key`` (+ ``tls_ca``): serve TLS; ``tls_client_auth`` also demands a client
  certificate signed by ``tls_ca`` (mutual TLS), whose common name then names the user.
  ``tls_handshake_timeout_ms`` bounds a client's TLS handshake (and the close_notify exchange).
- ``authentication``: every connection authenticates (SCRAM-SHA-256 or a client certificate)
  before any request but PING; users live in etcd (``gms user add``).
- ``acl``: authorised by ACLs, deny by default (``gms acl add``); without it any authenticated
  user may publish, subscribe and describe, and administration stays with super users.
- ``super_users``: names that may do everything whatever their stored role.
- ``user`` / ``password``: this server's own credential for the connections it opens (a broker
  registering with the nameservers; role ``broker``).
- ``etcd_user`` / ``etcd_password`` / ``etcd_ca``: how it reaches a secured etcd.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from gms.cluster.etcd_client import EtcdAuth
from gms.security.client import ClientSecurity
from gms.security.gate import TLS_HANDSHAKE_TIMEOUT_MS, Authorize, ServerSecurity
from gms.security.tls import TlsFiles
from gms.security.users import User


@dataclass(frozen=True, kw_only=True)
class SecurityConfig:
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_client_auth: bool = False
    tls_handshake_timeout_ms: int = TLS_HANDSHAKE_TIMEOUT_MS
    authentication: bool = False
    acl: bool = False
    super_users: tuple[str, ...] = ()
    user: str = ""
    password: str = ""
    etcd_user: str = ""
    etcd_password: str = ""
    etcd_ca: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.super_users, str):  # a TOML string or a comma-separated flag
            object.__setattr__(self, "super_users", tuple(u.strip() for u in self.super_users.split(",") if u.strip()))
        else:
            object.__setattr__(self, "super_users", tuple(self.super_users))
        self.files  # noqa: B018 - checks the files exist and come in pairs
        if self.tls_handshake_timeout_ms <= 0:
            raise ValueError(f"tls_handshake_timeout_ms must be positive, not {self.tls_handshake_timeout_ms}")
        if self.tls_client_auth and not (self.tls_cert and self.tls_ca):
            raise ValueError("tls_client_auth needs tls_cert, tls_key and the CA of the clients' certificates (tls_ca)")
        if self.acl and not self.authentication:
            raise ValueError("acl needs authentication: ACLs name users, so clients must say who they are")
        if bool(self.user) != bool(self.password):
            raise ValueError("give this server's user and password together (user, password)")
        if bool(self.etcd_user) != bool(self.etcd_password):
            raise ValueError("give etcd_user and etcd_password together")

    @property
    def files(self) -> TlsFiles:
        return TlsFiles(self.tls_ca, self.tls_cert, self.tls_key)

    @property
    def tls(self) -> bool:
        """Whether this server's listener (and its outgoing connections) use TLS."""
        return bool(self.tls_cert)

    @property
    def enabled(self) -> bool:
        return self.tls or self.authentication

    def listener_context(self) -> ssl.SSLContext | None:
        return self.files.server_context(require_client_cert=self.tls_client_auth) if self.tls else None

    def server_security(self, users: Callable[[str], User | None], authorize: Authorize | None) -> ServerSecurity:
        """What this server's listener enforces; ``users`` looks a user up (the watch-fed view)."""
        tls = self.listener_context()
        if not self.authentication:
            return ServerSecurity(tls=tls, tls_handshake_timeout_ms=self.tls_handshake_timeout_ms)
        return ServerSecurity(tls=tls, users=users, authorize=authorize, cert_users=self.tls_client_auth,
                              tls_handshake_timeout_ms=self.tls_handshake_timeout_ms)

    def etcd_auth(self) -> EtcdAuth | None:
        """How to reach etcd (None: plaintext, no etcd user)."""
        if not (self.etcd_user or self.etcd_ca):
            return None
        return EtcdAuth(self.etcd_user, self.etcd_password, self.etcd_ca)

    def outgoing(self, user: str = "", password: str = "") -> ClientSecurity:
        """How this server connects to its peers: TLS as it serves (presenting its own certificate
        as a client certificate when client certificates are demanded), as ``user`` (default: its
        configured credential) when authentication is on."""
        tls = None
        if self.tls:
            tls = self.files if self.tls_client_auth else TlsFiles(self.tls_ca)
        if not self.authentication:
            return ClientSecurity(tls)
        if not user:
            user, password = self.user, self.password
        return ClientSecurity(tls, user, password)
