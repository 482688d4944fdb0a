"""The values of the etcd adapter (gms.cluster.etcd_client): how a client connects
(:class:`EtcdAuth`), and what its calls take and answer, plain types instead of etcd's protobuf
messages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EtcdAuth:
    """How a client proves who it is to etcd and checks that it talks to the right etcd.

    An empty ``user`` means no authentication (fine while etcd has auth off). With ``ca`` set
    the connection is TLS, and etcd's certificate must be signed by that CA (PEM file) and name
    the endpoint's host; ``cert`` + ``key`` add a client certificate for an etcd run with
    ``--client-cert-auth``. Without ``ca`` the connection is plaintext. The password stays out
    of ``repr``.
    """

    user: str = ""
    password: str = field(default="", repr=False)
    ca: str = ""
    cert: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        if self.password and not self.user:
            raise ValueError("an etcd password needs its etcd user name")
        if bool(self.cert) != bool(self.key):
            raise ValueError("an etcd client certificate needs its key and a key its certificate")
        if self.cert and not self.ca:
            raise ValueError("an etcd client certificate needs TLS: give the CA file of etcd's certificate too")

    @property
    def tls(self) -> bool:
        return bool(self.ca)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The keys under a prefix and the store revision they were read at (watch from +1)."""

    kvs: list[KeyValue]
    revision: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kv: KeyValue
    deleted: bool


@dataclass(frozen=True, slots=True)
class WatchBatch:
    events: list[WatchEvent]
    revision: int


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    version: str
    db_size_bytes: int
    raft_index: int
    raft_term: int


# Transaction building blocks: compares ...
@dataclass(frozen=True, slots=True)
class KeyMissing:
    key: str


@dataclass(frozen=True, slots=True)
class ModRevisionIs:
    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class CreateRevisionIs:
    """The key exists and is the incarnation created at ``create_revision`` (0: missing).
    Fences a controller: its election key, re-created, would have a new create revision."""

    key: str
    create_revision: int


# ... and operations.
@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Compare = KeyMissing | ModRevisionIs | CreateRevisionIs
Op = Put | Delete
WatchCallback = Callable[[WatchBatch | Exception], None]
# (operation, seconds, the error it raised or None): hears of every call, for metrics.
EtcdObserver = Callable[[str, float, Exception | None], None]


def kv_of(raw: object) -> KeyValue:
    """A KeyValue from etcd's protobuf message."""
    return KeyValue(
        key=raw.key,  # type: ignore[attr-defined]
        value=raw.value,  # type: ignore[attr-defined]
        create_revision=raw.create_revision,  # type: ignore[attr-defined]
        mod_revision=raw.mod_revision,  # type: ignore[attr-defined]
        version=raw.version,  # type: ignore[attr-defined]
        lease_id=raw.lease,  # type: ignore[attr-defined]
    )
