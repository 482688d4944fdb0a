"""A development PKI for ``gms standalone --secure``: a CA, a server and a client certificate.

The keys are written unencrypted (0600) next to the data: this is for trying security out on one
machine, not for production, where certificates come from the organisation's own CA
(docs/security.md). Files are kept across restarts while the server certificate stays valid for
another 30 days and covers the same hosts, so clients that trust the CA keep working.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

RENEW_BEFORE = datetime.timedelta(days=30)
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class DevPki:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def ensure_dev_pki(directory: Path, *, hosts: Sequence[str] = DEFAULT_HOSTS, valid_days: int = 825,
                   client_name: str = "admin") -> DevPki:
    """The PKI in ``directory`` (made 0700), generated unless a valid one covering ``hosts`` is there."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = DevPki(*(directory / name for name in (
        "ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")))
    if not _still_good(pki, hosts):
        _generate(pki, hosts, valid_days, client_name)
    return pki


def describe(pki: DevPki) -> str:
    """How to point clients at ``pki``."""
    return (f"TLS is on. Point clients at the development CA and client certificate:\n"
            f"  export GMS_TLS_CA={pki.ca_cert}\n"
            f"  export GMS_TLS_CERT={pki.client_cert} GMS_TLS_KEY={pki.client_key}\n"
            f"  (or --tls-ca / --tls-cert / --tls-key on the gms CLI)")


def _still_good(pki: DevPki, hosts: Sequence[str]) -> bool:
    if not all(path.is_file() for path in vars(pki).values()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    covered = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    covered |= set(names.get_values_for_type(x509.DNSName))
    fresh = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > RENEW_BEFORE
    return fresh and all(_canonical(h) in covered for h in hosts)


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _generate(pki: DevPki, hosts: Sequence[str], valid_days: int, client_name: str) -> None:
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=valid_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gms development CA")])
    ca = (_builder(ca_name, ca_name, ca_key.public_key(), now, until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    Leaf = tuple[str, str, list[x509.ExtensionType], list[x509.ObjectIdentifier]]
    leaves: tuple[Leaf, ...] = (("server", "gms server", [x509.SubjectAlternativeName(alt)],
               [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
              ("client", client_name, [], [ExtendedKeyUsageOID.CLIENT_AUTH]))
    written: list[tuple[Path, bytes]] = [(pki.ca_cert, ca.public_bytes(serialization.Encoding.PEM)),
                                         (pki.ca_key, _pem_key(ca_key))]
    for kind, common_name, extensions, usages in leaves:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (_builder(subject, ca_name, key.public_key(), now, until)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        written += [(getattr(pki, f"{kind}_cert"), cert.public_bytes(serialization.Encoding.PEM)),
                    (getattr(pki, f"{kind}_key"), _pem_key(key))]
    for path, data in written:
        _write_private(path, data)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             now: datetime.datetime, until: datetime.datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until))


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` 0600 through a temporary file, so a crash never leaves half a key."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
