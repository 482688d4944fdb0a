"""A broker's identity: its name, recorded in its store (``config/broker.json``) at its first start.

The cluster knows a broker by its name (the replicas of every queue, leaders, ISRs); the name
defaults to the address the broker first served on. Kept in the store, it survives a restart on
another port or host: the broker comes back as itself, its queues are still its own, and it
registers its new address. A ``--name`` that differs from the recorded one is refused (a store
holds one broker's replicas); the message says how to rename on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

from gms.broker.atomic_file import parsing, write_atomically
from gms.private_files import make_private_dir
from gms.store_errors import BrokerIdentityMismatch

IDENTITY_VERSION = 1


def recorded_name(path: Path, given: str) -> str:
    """The name recorded at ``path`` ("": none yet). Raises if ``given`` (not "") contradicts it."""
    if not path.exists():
        return ""
    with parsing(path, "the broker identity"):
        recorded = json.loads(path.read_bytes())["broker_name"]
        if not isinstance(recorded, str) or not recorded:
            raise ValueError(f"broker_name {recorded!r} is not a name")
    if given and given != recorded:
        raise BrokerIdentityMismatch(
            f"the store in {path.parent.parent} is broker {recorded!r}'s, not {given!r}: leave out --name"
            f" (the store's own is used) or give --name {recorded}. To rename the broker on purpose"
            f" (the cluster then knows it as a new broker), delete {path}")
    return recorded


def record_name(path: Path, name: str) -> None:
    """Record ``name`` at ``path`` (a store's first start)."""
    make_private_dir(path.parent)
    write_atomically(path, json.dumps({"version": IDENTITY_VERSION, "broker_name": name}, indent=1).encode())
