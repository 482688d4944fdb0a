"""What every command connects with: the root options' TLS and user, and an Admin that is always
closed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from gms.client import Admin
from gms.security.client import ClientSecurity


def client_security() -> ClientSecurity:
    """The ``gms --tls-* --user --password`` options (or their GMS_* variables) of this run."""
    ctx = click.get_current_context(silent=True)
    security = ctx.find_root().obj if ctx is not None else None
    return security if isinstance(security, ClientSecurity) else ClientSecurity.from_env()


@contextmanager
def open_admin(nameserver: str) -> Iterator[Admin]:
    admin = Admin(nameserver=nameserver, security=client_security())
    try:
        yield admin
    finally:
        admin.close()
