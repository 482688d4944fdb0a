"""The Admin client a command talks through, opened from ``--nameserver`` and always closed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gms.client import Admin


@contextmanager
def open_admin(nameserver: str) -> Iterator[Admin]:
    admin = Admin(nameserver=nameserver)
    try:
        yield admin
    finally:
        admin.close()
