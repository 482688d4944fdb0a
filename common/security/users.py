"""Who may connect: users with a role and a SCRAM credential, and the principals they become.

Roles (RocketMQ ACL 2.0 has super and normal users; Kafka has ``super.users``):

- ``super``: may do everything, including managing users, topics and ACLs.
- ``normal``: a client: produce, consume, describe (per-resource ACLs narrow this).
- ``broker``: the service credential brokers are configured with: registering with the
  nameservers and learning the etcd endpoints, nothing else.
- ``replica``: one broker's own identity, ``broker:<broker id>``, created by that broker when it
  registers (it holds the password only in memory; the credential goes with its etcd lease).
  Only a replica principal whose id matches may fetch from a leader as that follower.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from gms.security.scram import Credential

ROLES = ("super", "normal", "broker", "replica")
USER_ROLES = ("super", "normal", "broker")  # the ones an operator gives
REPLICA_PREFIX = "broker:"
USER_VERSION = 1  # "v" in the stored JSON
_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def check_user_name(name: str) -> str:
    """``name`` if an operator may create it (ValueError says why not)."""
    if not _USER_NAME.fullmatch(name):
        raise ValueError(f"user name {name!r} must be 1-64 letters, digits, '.', '_', '@' or '-', "
                         "starting with a letter or digit")
    return name


def replica_user(broker_id: str) -> str:
    return REPLICA_PREFIX + broker_id


class Principal(NamedTuple):
    """An authenticated identity on a connection."""

    name: str
    role: str

    def __str__(self) -> str:
        return f"{self.role}:{self.name}" if self.role != "replica" else self.name

    @property
    def broker_id(self) -> str | None:
        """The broker a replica principal is (None for anyone else)."""
        return self.name[len(REPLICA_PREFIX):] if self.role == "replica" else None


@dataclass(frozen=True)
class User:
    name: str
    role: str
    credential: Credential

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(ROLES)}")

    def to_json(self) -> bytes:
        value = {"v": USER_VERSION, "name": self.name, "role": self.role, "scram": self.credential.to_json()}
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> User:
        data: dict[str, Any] = json.loads(raw)
        if data.get("v", USER_VERSION) != USER_VERSION:
            raise ValueError(f"user value version {data.get('v')!r} is not {USER_VERSION}: written by a newer gms")
        return cls(str(data["name"]), str(data["role"]), Credential.from_json(data["scram"]))
