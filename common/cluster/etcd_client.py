"""A small etcd API over `pyetcd` (etcd-sdk-python), in the style of aetcd.

Why an adapter: the rest of the nameserver sees plain result types and gms errors, never protobuf
messages, gRPC status codes or pyetcd exceptions; every call funnels through ``EtcdClient._call``,
the one place that maps failures. Several endpoints (``host:port,host:port``) fail over: a
failed endpoint is skipped for ``ENDPOINT_RETRY_S`` and the caller's retry goes to the next.

Security (:class:`EtcdAuth`): TLS to etcd verified against a CA file, and etcd's user/password
authentication. etcd answers a password with a token that expires once unused for
``--auth-token-ttl`` (300 s by default) and that a password change revokes; a call refused for
its token re-authenticates once and is retried (a refused request was not applied), so a client
idle for hours just works. pyetcd's own ``user=``/``password=`` are not used: they authenticate
once in its constructor, never again, and send the token as gRPC call credentials, which gRPC
refuses on a plaintext channel; the token travels as plain ``token`` metadata here.

Watches run one gRPC stream each (:class:`gms.cluster.etcd_watch.WatchStream`) instead of on pyetcd's shared watcher:
its stream keeps the token of the moment it was opened, so once that token expires every new
watch on it is refused, and it takes a refused watch (etcd answers created + canceled, echoing
watch id 0) for a created one, handing it the callback of watch 0. An established watch keeps
delivering after its token expires (etcd checks the token when the watch is created).

The adapter's parts: the values its calls take and answer (gms.cluster.etcd_types), what a
failure means (gms.cluster.etcd_failures), a watch's stream (gms.cluster.etcd_watch); this
module holds the client: connection and endpoints, authentication, key/value, transactions,
leases, watches and etcd's auth set-up.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd import transactions as etcd_txn
from pyetcd import utils as etcd_utils

from gms.address import split_address
from gms.cluster.errors import EtcdAuthFailed, EtcdUnavailable
from gms.cluster.etcd_failures import (
    ALREADY_EXISTS,
    AUTH_NOT_ENABLED,
    BAD_PASSWORD,
    UNAVAILABLE_CODES,
    details_of,
    token_rejected,
    translate,
    why,
)
from gms.cluster.etcd_types import (
    Compare,
    CreateRevisionIs,
    Delete,
    EtcdAuth,
    EtcdObserver,
    EtcdStatus,
    KeyMissing,
    KeyValue,
    ModRevisionIs,
    Op,
    Put,
    Snapshot,
    WatchBatch,
    WatchCallback,
    WatchEvent,
    kv_of,
)
from gms.cluster.etcd_watch import WatchStream

# The adapter's API: the client and the values its calls take and answer.
__all__ = [
    "Compare", "CreateRevisionIs", "Delete", "EtcdAuth", "EtcdClient", "EtcdObserver", "EtcdStatus", "KeyMissing",
    "KeyValue", "ModRevisionIs", "Op", "Put", "Snapshot", "WatchBatch", "WatchCallback", "WatchEvent",
    "parse_endpoints",
]

log = logging.getLogger(__name__)

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
_READWRITE = etcdrpc.Permission.READWRITE

P = ParamSpec("P")
R = TypeVar("R")


def _channel_credentials(auth: EtcdAuth) -> grpc.ChannelCredentials | None:
    if not auth.tls:
        return None
    pem: dict[str, bytes | None] = {}
    for what, path in (("CA", auth.ca), ("certificate", auth.cert), ("key", auth.key)):
        try:
            pem[what] = Path(path).read_bytes() if path else None
        except OSError as err:
            raise EtcdAuthFailed(f"cannot read the etcd TLS {what} file {path}: {err.strerror}") from err
    return grpc.ssl_channel_credentials(pem["CA"], pem["key"], pem["certificate"])


class _Etcd3Client(pyetcd.MultiEndpointEtcd3Client):
    """pyetcd's client plus etcd's Auth service, which it has no methods for."""

    def authenticate(self, user: str, password: str) -> str:
        """A fresh token for ``user``; ``""`` when etcd has authentication off."""
        try:
            request = etcdrpc.AuthenticateRequest(name=user, password=password)
            return str(self.authstub.Authenticate(request, self.timeout).token)
        except grpc.RpcError as err:
            if AUTH_NOT_ENABLED in details_of(err):
                return ""
            self._manage_grpc_errors(err)  # parks a dead endpoint, raises
            raise

    def watch(
        self,
        request: object,
        on_batch: Callable[[WatchBatch], None],
        on_end: Callable[[BaseException | None], None],
        timeout_s: float,
    ) -> WatchStream:
        """A created watch on its own stream, with this client's token."""
        stream = WatchStream(self.channel, request, self.metadata, on_batch, on_end)
        try:
            stream.wait_created(timeout_s)
        except grpc.RpcError as err:
            self._manage_grpc_errors(err)  # parks a dead endpoint, raises
            raise
        return stream

    def auth_call(self, method: str, request: object) -> Any:
        """One Auth service RPC with this client's token. Refusals stay gRPC errors (their
        details say what is wrong); a dead endpoint is parked as for any other call."""
        try:
            return getattr(self.authstub, method)(request, self.timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            if err.code() in UNAVAILABLE_CODES:
                self._manage_grpc_errors(err)
            raise


def parse_endpoints(endpoints: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:2379,h2:2379"`` or a list of ``host:port`` strings -> [(host, port), ...]."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for item in items:
        parsed.append(split_address(item, "etcd endpoint"))
    if not parsed:
        raise ValueError("no etcd endpoint given")
    return parsed


def _kv_read(found: tuple[bytes, Any]) -> KeyValue:
    """A KeyValue from a transaction's range result: (value, pyetcd's KVMetadata)."""
    value, meta = found
    return KeyValue(key=meta.key, value=value, create_revision=meta.create_revision,
                    mod_revision=meta.mod_revision, version=meta.version, lease_id=meta.lease_id)


def _prefix_end(prefix: str) -> bytes:
    return etcd_utils.prefix_range_end(prefix.encode())


def _etcd_call(fn: Callable[Concatenate[EtcdClient, P], R]) -> Callable[Concatenate[EtcdClient, P], R]:
    @functools.wraps(fn)
    def wrapper(self: EtcdClient, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._call(fn.__name__, lambda: fn(self, *args, **kwargs))

    return wrapper


class EtcdClient:
    """Synchronous etcd client; thread-safe as far as gRPC channels are (calls may interleave).

    ``auth`` (default: none) gives TLS and the etcd user; the client authenticates on its first
    call and again whenever etcd refuses its token (see the module docstring). ``observe``
    hears of every call: its method's name (``get_prefix``, ``txn``...), how long it took
    (re-authentication included) and the gms error it raised, if any."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        auth: EtcdAuth | None = None,
        observe: EtcdObserver | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._observe = observe
        self.auth = auth or EtcdAuth()
        self._channel_credentials = _channel_credentials(self.auth)
        # None: not authenticated yet; "": etcd had authentication off when we asked.
        self._token: str | None = None
        self._auth_lock = threading.Lock()
        self._watches: dict[int, WatchStream] = {}
        self._watch_ids = itertools.count(1)
        self._watch_lock = threading.Lock()
        self.endpoints = [f"{h}:{p}" for h, p in parse_endpoints(endpoints)]
        self._client = self._connect(self.endpoints)

    def _connect(self, endpoints: list[str]) -> _Etcd3Client:
        secure = self._channel_credentials is not None
        eps = [
            pyetcd.Endpoint(
                h, p, secure=secure, creds=self._channel_credentials, time_retry=ENDPOINT_RETRY_S, opts=_GRPC_OPTIONS
            )
            for h, p in parse_endpoints(endpoints)
        ]
        client = _Etcd3Client(endpoints=eps, timeout=self._timeout_s, failover=True)
        client.metadata = (("token", self._token),) if self._token else None
        return client

    def reconnect(self, endpoints: str | Sequence[str]) -> None:
        """Talk to ``endpoints`` from now on (etcd moved), with the same credentials. Leases,
        keys and the users of this client carry on; watches on the old endpoints end (their
        callback gets an error), so watchers re-watch here. The old connection closes once
        calls in flight have timed out."""
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

    # -- the one way in: timing, authentication, one retry with a fresh token, error translation
    def _call(self, op: str, attempt: Callable[[], R]) -> R:
        observe = self._observe
        if observe is None:
            return self._authenticated(attempt)
        started = time.perf_counter()
        try:
            result = self._authenticated(attempt)
        except Exception as err:
            observe(op, time.perf_counter() - started, err)
            raise
        observe(op, time.perf_counter() - started, None)
        return result

    def _authenticated(self, attempt: Callable[[], R]) -> R:
        try:
            if self.auth.user and self._token is None:
                self._authenticate(stale=None)
            token = self._token
            try:
                return attempt()
            except (etcd_exc.Etcd3Exception, grpc.RpcError) as err:
                if not (self.auth.user and token_rejected(err)):
                    raise
                log.debug("etcd refused the token of user %s (%s); authenticating again", self.auth.user, why(err))
            # etcd refuses a request for its token before applying it: the retry is safe.
            self._authenticate(stale=token)
            return attempt()
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as err:
            raise translate(err, self.auth, self.endpoints) from err

    def _authenticate(self, stale: str | None) -> None:
        """Get a new token unless another thread already replaced ``stale``."""
        with self._auth_lock:
            if self._token != stale:
                return
            client = self._client
            token = client.authenticate(self.auth.user, self.auth.password)
            self._token = token
            client.metadata = (("token", token),) if token else None
            if token:
                log.debug("etcd: authenticated as %s", self.auth.user)
            else:
                log.debug("etcd has authentication off: calls go without a token")

    # -- key/value -------------------------------------------------------------------------
    @_etcd_call
    def get(self, key: str) -> KeyValue | None:
        resp = self._client.get_response(key)
        return kv_of(resp.kvs[0]) if resp.kvs else None

    @_etcd_call
    def get_prefix(self, prefix: str) -> Snapshot:
        resp = self._client.get_prefix_response(prefix)
        return Snapshot([kv_of(kv) for kv in resp.kvs], resp.header.revision)

    @_etcd_call
    def put(self, key: str, value: bytes, *, lease_id: int = 0) -> int:
        """Returns the revision of the write."""
        return int(self._client.put(key, value, lease=lease_id or None).header.revision)

    @_etcd_call
    def delete(self, key: str) -> bool:
        return bool(self._client.delete(key))

    @_etcd_call
    def delete_prefix(self, prefix: str) -> int:
        return int(self._client.delete_prefix(prefix).deleted)

    @_etcd_call
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

    @_etcd_call
    def txn_or_read(
        self, compare: Sequence[Compare], success: Sequence[Op], read: Sequence[str]
    ) -> tuple[bool, list[KeyValue | None]]:
        """As :meth:`txn` without failure ops, but when a compare fails the same round trip reads
        the keys ``read`` (each one's KeyValue, None if missing, in order; all at one revision),
        so a caller learns which of its compares failed and what to compare against next.
        ``(True, [])`` when the compares held."""
        succeeded, responses = self._client.transaction(
            compare=[self._compare(c) for c in compare],
            success=[self._op(op) for op in success],
            failure=[etcd_txn.Get(key) for key in read],
        )
        if succeeded:
            return True, []
        return False, [_kv_read(found[0]) if found else None for found in responses]

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
    @_etcd_call
    def grant_lease(self, ttl_s: int) -> int:
        return int(self._client.lease(ttl_s).id)

    @_etcd_call
    def refresh_lease(self, lease_id: int) -> int:
        """One keep-alive; returns the renewed TTL in seconds, 0 if the lease is gone."""
        responses = list(self._client.refresh_lease(lease_id))
        return int(responses[0].TTL) if responses else 0

    @_etcd_call
    def revoke_lease(self, lease_id: int) -> None:
        self._client.revoke_lease(lease_id)

    # -- watches ---------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int, callback: WatchCallback) -> int:
        """Call ``callback`` from the watch's thread with each batch of changes at or after
        ``start_revision``, or once with an exception when the watch ends (etcd gone, stream
        closed, revision compacted, this client closed). Never call back into the watch API from
        the callback. Raises :class:`EtcdCompacted` if ``start_revision`` is compacted already."""
        watch_id = next(self._watch_ids)
        request = etcdrpc.WatchRequest(
            create_request=etcdrpc.WatchCreateRequest(
                key=prefix.encode(), range_end=_prefix_end(prefix), start_revision=start_revision
            )
        )

        def on_end(err: BaseException | None) -> None:
            with self._watch_lock:
                self._watches.pop(watch_id, None)
            callback(EtcdUnavailable("etcd watch stream closed") if err is None
                     else translate(err, self.auth, self.endpoints))

        stream = self._call("watch_prefix", lambda: self._client.watch(request, callback, on_end, self._timeout_s))
        with self._watch_lock:
            if not stream.ended:  # else on_end has run or will find nothing to drop
                self._watches[watch_id] = stream
        return watch_id

    def cancel_watch(self, watch_id: int) -> None:
        with self._watch_lock:
            stream = self._watches.pop(watch_id, None)
        if stream is not None:
            stream.cancel()

    # -- maintenance -----------------------------------------------------------------------
    @_etcd_call
    def status(self) -> EtcdStatus:
        status = self._client.status()
        return EtcdStatus(status.version, status.db_size, status.raft_index, status.raft_term)

    # -- authentication set-up (as etcd's root user once auth is on) ------------------------
    @_etcd_call
    def ensure_user(self, name: str, password: str, roles: Sequence[str]) -> None:
        """Make ``name`` exist with exactly this password and these roles (idempotent; the
        password is changed only if it does not work, which revokes the user's tokens)."""
        client = self._client
        try:
            client.auth_call("UserAdd", etcdrpc.AuthUserAddRequest(name=name, password=password))
        except grpc.RpcError as err:
            if ALREADY_EXISTS not in details_of(err):
                raise
            if not self._password_works(name, password):
                change = etcdrpc.AuthUserChangePasswordRequest(name=name, password=password)
                client.auth_call("UserChangePassword", change)
        current = set(client.auth_call("UserGet", etcdrpc.AuthUserGetRequest(name=name)).roles)
        for role in current - set(roles):
            client.auth_call("UserRevokeRole", etcdrpc.AuthUserRevokeRoleRequest(name=name, role=role))
        for role in sorted(set(roles) - current):
            client.auth_call("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=name, role=role))

    def _password_works(self, name: str, password: str) -> bool:
        """Whether etcd accepts the password; False while auth is off (nothing to check then)."""
        try:
            return bool(self._client.authenticate(name, password))
        except grpc.RpcError as err:
            if BAD_PASSWORD in details_of(err):
                return False
            raise

    @_etcd_call
    def ensure_role(self, name: str, prefix: str) -> None:
        """Make role ``name`` exist with read-write permission on exactly the keys under
        ``prefix`` (as ``etcdctl role grant-permission --prefix``); other permissions go."""
        if not prefix:
            raise ValueError("a role's key prefix must not be empty")
        client = self._client
        try:
            client.auth_call("RoleAdd", etcdrpc.AuthRoleAddRequest(name=name))
        except grpc.RpcError as err:
            if ALREADY_EXISTS not in details_of(err):
                raise
        wanted = (_READWRITE, prefix.encode(), _prefix_end(prefix))
        granted = False
        for perm in client.auth_call("RoleGet", etcdrpc.AuthRoleGetRequest(role=name)).perm:
            if (perm.permType, perm.key, perm.range_end) == wanted:
                granted = True
                continue
            revoke = etcdrpc.AuthRoleRevokePermissionRequest(
                role=name, key=perm.key.decode(), range_end=perm.range_end.decode()
            )
            client.auth_call("RoleRevokePermission", revoke)
        if not granted:
            perm = etcdrpc.Permission(permType=_READWRITE, key=wanted[1], range_end=wanted[2])
            client.auth_call("RoleGrantPermission", etcdrpc.AuthRoleGrantPermissionRequest(name=name, perm=perm))

    @_etcd_call
    def enable_auth(self) -> None:
        """Turn authentication on (idempotent); etcd needs a ``root`` user with the ``root``
        role first. From then on every client needs a user."""
        self._client.auth_call("AuthEnable", etcdrpc.AuthEnableRequest())
