"""TLS contexts for gms listeners and connections, from PEM files.

One :class:`TlsFiles` names a CA bundle (whom to trust), a certificate chain and its key (who we
are). Servers always present a certificate; with ``require_client_cert`` they also demand one
from every client (mutual TLS) and verify it against the CA. Clients verify the server against
the CA (the system's trust store when none is given) and its host name, and present their own
certificate when one is configured.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

# TLS 1.2 is the oldest version without known protocol breaks; 1.3 is negotiated when both can.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: ``ca`` to verify peers with, ``cert`` + ``key`` to present (empty: none)."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a TLS certificate needs its key and a key its certificate (give both)")
        for what, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS {what} file {path} does not exist")

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """A listener's context; it needs ``cert`` and ``key`` (and ``ca`` for client certs)."""
        if not self.cert:
            raise ValueError("a TLS listener needs a certificate and key (tls_cert, tls_key)")
        if require_client_cert and not self.ca:
            raise ValueError("verifying client certificates needs the CA that issued them (tls_ca)")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_VERSION
        context.load_cert_chain(self.cert, self.key)
        if self.ca:
            context.load_verify_locations(cafile=self.ca)
            context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return context

    def client_context(self) -> ssl.SSLContext:
        """A connecting side's context: verifies the server and its host name."""
        context = ssl.create_default_context(cafile=self.ca or None)
        context.minimum_version = MINIMUM_VERSION
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context


def peer_common_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The subject common name of the verified certificate the peer presented, if any."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for attribute in rdn:
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None

