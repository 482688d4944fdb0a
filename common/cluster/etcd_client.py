"""A small etcd API over `pyetcd` (etcd-sdk-python), in the style of aetcd.

Why an adapter: the rest of the nameserver sees plain result types and gms errors, never protobuf
messages, gRPC status codes or pyetcd exceptions; every call funnels through ``_translated``,
the one place that maps failures. Several endpoints (``host:port,host:port``) fail over: a
failed endpoint is skipped for ``ENDPOINT_RETRY_S`` and the caller's retry goes to the next.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import grpc
import pyetcd
from pyetcd import events as etcd_events
from pyetcd import exceptions as etcd_exc
from pyetcd import transactions as etcd_txn
from pyetcd import utils as etcd_utils
from pyetcd.watch import WatchResponse

from gms.address import split_address
from gms.cluster.errors import EtcdCompacted, EtcdError, EtcdUnavailable

REQUEST_TIMEOUT_S = 5.0
# pyetcd's default parks a failed endpoint for 300 s, which would outlast any etcd restart.
ENDPOINT_RETRY_S = 0.2
_GRPC_OPTIONS = [
    # Reconnect quickly after etcd comes back instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a silently dead connection (no RST) on the watch stream; etcd's default minimum
    # permitted client ping interval is 5 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
]
_UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)

P = ParamSpec("P")
R = TypeVar("R")


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


def _translate(err: BaseException) -> Exception:
    if isinstance(err, etcd_exc.RevisionCompactedError):
        return EtcdCompacted(err.compacted_revision)
    if isinstance(
        err,
        etcd_exc.ConnectionFailedError
        | etcd_exc.ConnectionTimeoutError
        | etcd_exc.NoServerAvailableError
        | etcd_exc.WatchTimedOut,
    ):
        return EtcdUnavailable(f"etcd unavailable: {err}")
    if isinstance(err, grpc.RpcError) and err.code() in _UNAVAILABLE_CODES:
        return EtcdUnavailable(f"etcd unavailable: {err.code().name}")
    if isinstance(err, grpc.RpcError):
        return EtcdError(f"etcd error {err.code().name}: {err.details()}")
    return EtcdError(f"etcd error: {err!r}")


def _translated(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as err:
            raise _translate(err) from err

    return wrapper


def parse_endpoints(endpoints: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:2379,h2:2379"`` or a list of ``host:port`` strings -> [(host, port), ...]."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for item in items:
        parsed.append(split_address(item, "etcd endpoint"))
    if not parsed:
        raise ValueError("no etcd endpoint given")
    return parsed


def _kv(raw: object) -> KeyValue:
    return KeyValue(
        key=raw.key,  # type: ignore[attr-defined]
        value=raw.value,  # type: ignore[attr-defined]
        create_revision=raw.create_revision,  # type: ignore[attr-defined]
        mod_revision=raw.mod_revision,  # type: ignore[attr-defined]
        version=raw.version,  # type: ignore[attr-defined]
        lease_id=raw.lease,  # type: ignore[attr-defined]
    )


def _prefix_end(prefix: str) -> bytes:
    return etcd_utils.prefix_range_end(prefix.encode())


class EtcdClient:
    """Synchronous etcd client; thread-safe as far as gRPC channels are (calls may interleave)."""

    def __init__(
        self, endpoints: str | Sequence[str], *, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        self._timeout_s = timeout_s
        self.endpoints = [f"{h}:{p}" for h, p in parse_endpoints(endpoints)]
        self._client = self._connect(self.endpoints)

    def _connect(self, endpoints: list[str]) -> pyetcd.MultiEndpointEtcd3Client:
        eps = [
            pyetcd.Endpoint(h, p, secure=False, time_retry=ENDPOINT_RETRY_S, opts=_GRPC_OPTIONS)
            for h, p in parse_endpoints(endpoints)
        ]
        return pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=self._timeout_s, failover=True)

    def reconnect(self, endpoints: str | Sequence[str]) -> None:
        """Talk to ``endpoints`` from now on (etcd moved). Leases, keys and the users of this
        client carry on; watches on the old endpoints end (their callback gets an error), so
        watchers re-watch here. The old connection closes once calls in flight have timed out."""
        self.endpoints = [f"{h}:{p}" for h, p in parse_endpoints(endpoints)]
        old, self._client = self._client, self._connect(self.endpoints)
        closer = threading.Timer(self._timeout_s, old.close)
        closer.daemon = True
        closer.start()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- key/value -------------------------------------------------------------------------
    @_translated
    def get(self, key: str) -> KeyValue | None:
        resp = self._client.get_response(key)
        return _kv(resp.kvs[0]) if resp.kvs else None

    @_translated
    def get_prefix(self, prefix: str) -> Snapshot:
        resp = self._client.get_prefix_response(prefix)
        return Snapshot([_kv(kv) for kv in resp.kvs], resp.header.revision)

    @_translated
    def put(self, key: str, value: bytes, *, lease_id: int = 0) -> int:
        """Returns the revision of the write."""
        return int(self._client.put(key, value, lease=lease_id or None).header.revision)

    @_translated
    def delete(self, key: str) -> bool:
        return bool(self._client.delete(key))

    @_translated
    def delete_prefix(self, prefix: str) -> int:
        return int(self._client.delete_prefix(prefix).deleted)

    @_translated
    def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> bool:
        """Apply ``success`` if every compare holds, else ``failure``; True if they held."""
        succeeded, _ = self._client.transaction(
            compare=[self._compare(c) for c in compare],
            success=[self._op(op) for op in success],
            failure=[self._op(op) for op in failure],
        )
        return bool(succeeded)

    @staticmethod
    def _compare(c: Compare) -> etcd_txn.BaseCompare:
        if isinstance(c, KeyMissing):
            return etcd_txn.Version(c.key) == 0
        if isinstance(c, CreateRevisionIs):
            return etcd_txn.Create(c.key) == c.create_revision
        return etcd_txn.Mod(c.key) == c.mod_revision

    @staticmethod
    def _op(op: Op) -> etcd_txn.Put | etcd_txn.Delete:
        if isinstance(op, Put):
            return etcd_txn.Put(op.key, op.value, lease=op.lease_id or None)
        return etcd_txn.Delete(op.key)

    # -- leases ----------------------------------------------------------------------------
    @_translated
    def grant_lease(self, ttl_s: int) -> int:
        return int(self._client.lease(ttl_s).id)

    @_translated
    def refresh_lease(self, lease_id: int) -> int:
        """One keep-alive; returns the renewed TTL in seconds, 0 if the lease is gone."""
        responses = list(self._client.refresh_lease(lease_id))
        return int(responses[0].TTL) if responses else 0

    @_translated
    def revoke_lease(self, lease_id: int) -> None:
        self._client.revoke_lease(lease_id)

    # -- watches ---------------------------------------------------------------------------
    @_translated
    def watch_prefix(self, prefix: str, start_revision: int, callback: WatchCallback) -> int:
        """Call ``callback`` from pyetcd's watch thread with each batch of changes at or after
        ``start_revision``, or once with an exception when the watch ends (etcd gone, stream
        closed, revision compacted). Never call back into the watch API from the callback."""

        def on_response(resp: WatchResponse | Exception | None) -> None:
            if isinstance(resp, WatchResponse):
                events = [
                    WatchEvent(_kv(ev._event.kv), isinstance(ev, etcd_events.DeleteEvent))
                    for ev in resp.events
                ]
                callback(WatchBatch(events, resp.header.revision))
            elif resp is None:
                callback(EtcdUnavailable("etcd watch stream closed"))
            else:
                callback(_translate(resp))

        return int(
            self._client.add_watch_callback(
                prefix, on_response, range_end=_prefix_end(prefix), start_revision=start_revision
            )
        )

    @_translated
    def cancel_watch(self, watch_id: int) -> None:
        self._client.cancel_watch(watch_id)

    # -- maintenance -----------------------------------------------------------------------
    @_translated
    def status(self) -> EtcdStatus:
        status = self._client.status()
        return EtcdStatus(status.version, status.db_size, status.raft_index, status.raft_term)
