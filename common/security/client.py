"""How an SDK client, the CLI or a broker connects when the cluster is secured: TLS and a user.

``ClientSecurity.from_env()`` reads ``GMS_TLS_CA``, ``GMS_TLS_CERT``, ``GMS_TLS_KEY`` (any of
them turns TLS on; ``GMS_TLS=1`` turns it on with the system's trusted CAs), ``GMS_USER`` and
``GMS_PASSWORD``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gms.security.scram import ScramClientExchange
from gms.security.tls import TlsFiles

ENV_TLS = "GMS_TLS"
ENV_TLS_CA = "GMS_TLS_CA"
ENV_TLS_CERT = "GMS_TLS_CERT"
ENV_TLS_KEY = "GMS_TLS_KEY"
ENV_USER = "GMS_USER"
ENV_PASSWORD = "GMS_PASSWORD"


@dataclass(frozen=True)
class ClientSecurity:
    """TLS (None: plaintext) and SCRAM credentials (empty: none) for outgoing connections."""

    tls: TlsFiles | None = None
    username: str = ""
    password: str = ""

    def __post_init__(self) -> None:
        if bool(self.username) != bool(self.password):
            raise ValueError("give both a user and a password, or neither")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ClientSecurity:
        files = TlsFiles(environ.get(ENV_TLS_CA, ""), environ.get(ENV_TLS_CERT, ""), environ.get(ENV_TLS_KEY, ""))
        tls_on = any((files.ca, files.cert)) or environ.get(ENV_TLS, "").lower() in ("1", "true", "yes")
        return cls(files if tls_on else None, environ.get(ENV_USER, ""), environ.get(ENV_PASSWORD, ""))

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls is not None else None

    def exchange(self) -> ScramClientExchange | None:
        """A fresh SCRAM exchange for one connection (None: no credentials to present)."""
        return ScramClientExchange(self.username, self.password) if self.username else None


PLAINTEXT = ClientSecurity()
