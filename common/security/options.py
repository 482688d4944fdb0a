"""The security flags of ``gms-broker`` and ``gms-nameserver`` (the ``[security]`` settings)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gms.security.gate import TLS_HANDSHAKE_TIMEOUT_MS

F = TypeVar("F", bound=Callable[..., Any])

_PEM = click.Path(dir_okay=False, exists=True, path_type=str)

_OPTIONS = (
    click.option("--tls-cert", type=_PEM, help="PEM certificate (chain) to serve TLS with; needs --tls-key."),
    click.option("--tls-key", type=_PEM, help="PEM private key of --tls-cert."),
    click.option("--tls-ca", type=_PEM,
                 help="PEM CA bundle: verifies client certificates and the peers this server connects to."),
    click.option("--tls-client-auth/--no-tls-client-auth", default=None,
                 help="Demand a client certificate signed by --tls-ca (mutual TLS); its common name is the user."),
    click.option("--tls-handshake-timeout-ms", type=click.IntRange(min=1),
                 help=f"Close a connection whose TLS handshake (or closing close_notify exchange) takes longer"
                      f" (default {TLS_HANDSHAKE_TIMEOUT_MS})."),
    click.option("--authentication/--no-authentication", default=None,
                 help="Clients must authenticate (SCRAM-SHA-256 user or client certificate); users live in etcd."),
    click.option("--acl/--no-acl", default=None,
                 help="Authorise with ACLs (`gms acl`), deny by default; needs --authentication."),
    click.option("--super-users", help="Comma-separated user names that may do everything."),
    click.option("--user", help="The user a broker registers with the nameservers as (role broker); unused by"
                                " nameservers."),
    click.option("--password", help="Password of --user (prefer the environment variable to the flag)."),
    click.option("--etcd-user", help="etcd user, when etcd has authentication on."),
    click.option("--etcd-password", help="Password of --etcd-user (prefer the environment variable)."),
    click.option("--etcd-ca", type=_PEM, help="PEM CA bundle that signed etcd's certificate (TLS to etcd)."),
)
NAMES = ("tls_cert", "tls_key", "tls_ca", "tls_client_auth", "tls_handshake_timeout_ms", "authentication", "acl",
         "super_users", "user", "password", "etcd_user", "etcd_password", "etcd_ca")


def security_options(command: F) -> F:
    """Stack the security flags on ``command`` (below ``@click.command``)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def pop_security_values(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the security flags out of a command's keyword arguments: the ones given."""
    values = {name: kwargs.pop(name) for name in NAMES}
    return {name: str(value) if isinstance(value, Path) else value
            for name, value in values.items() if value is not None}
