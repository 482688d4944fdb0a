"""What an etcd call's failure means: pyetcd's exceptions and gRPC statuses read as the gms errors
of gms.cluster.errors (:func:`translate`), and the answers of etcd the client acts on (a token
to renew, auth off, a user or role that exists already)."""

from __future__ import annotations

import grpc
from pyetcd import exceptions as etcd_exc

from gms.cluster.errors import EtcdAuthFailed, EtcdCompacted, EtcdError, EtcdUnavailable
from gms.cluster.etcd_types import EtcdAuth

# gRPC statuses of an endpoint that is down or unreachable (parked by pyetcd, retried elsewhere).
UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
# etcd's answers (rpctypes) that a fresh token may cure: the token expired or was revoked (a
# password change), the auth store changed since it was issued, or none was sent because auth
# was off when this client last looked. A watch refused for its token says "permission denied".
_TOKEN_REJECTED = ("invalid auth token", "revision of auth store is old", "user name is empty")
AUTH_NOT_ENABLED = "authentication is not enabled"
BAD_PASSWORD = "invalid user ID or password"
_NO_USER = "user name is empty"
ALREADY_EXISTS = "already exists"
_PERMISSION_DENIED = "permission denied"
# What gRPC says when a TLS handshake fails for etcd's certificate (CA, signature, host name).
_TLS_REFUSED_MARKS = ("certificate", "peer name", "ssl_error_ssl", "tsi_protocol_failure")
# A connection closed while being set up: what a plaintext client meets at a TLS port and a
# TLS client at a plaintext one, but also what an etcd that stops at that moment does.
_SOCKET_CLOSED = ("socket closed", "connection reset by peer")  # gRPC words it either way


class WatchRefused(etcd_exc.Etcd3Exception):
    """etcd answered a watch request with created + canceled (no permission, or a bad token)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason or "watch canceled at creation")
        self.reason = reason


def rpc_error(err: BaseException) -> grpc.RpcError | None:
    """The gRPC error behind ``err``: pyetcd raises its own exceptions from inside the handler
    of the gRPC one, which so becomes their ``__context__``."""
    if isinstance(err, grpc.RpcError):
        return err
    return err.__context__ if isinstance(err.__context__, grpc.RpcError) else None


def details_of(rpc: grpc.RpcError) -> str:
    return str(rpc.details() or "")


def why(err: BaseException) -> str:
    """The server's one-line reason for ``err``."""
    rpc = rpc_error(err)
    return details_of(rpc) if rpc is not None else str(err)


def token_rejected(err: BaseException) -> bool:
    """Whether a fresh token may get ``err``'s request through."""
    if isinstance(err, WatchRefused):
        return _PERMISSION_DENIED in err.reason.lower()
    rpc = rpc_error(err)
    return rpc is not None and any(mark in details_of(rpc) for mark in _TOKEN_REJECTED)


def translate(err: BaseException, auth: EtcdAuth, endpoints: list[str]) -> Exception:
    """The gms error for a pyetcd or gRPC failure of a call made with ``auth`` to ``endpoints``:
    what went wrong in the words an operator can act on."""
    if isinstance(err, etcd_exc.RevisionCompactedError):
        return EtcdCompacted(err.compacted_revision)
    if isinstance(err, WatchRefused):
        if _PERMISSION_DENIED in err.reason.lower():
            return EtcdAuthFailed(_denied_message(auth, f"watch refused: {err.reason}"))
        return EtcdError(f"etcd refused the watch: {err.reason}")
    rpc = rpc_error(err)
    if rpc is None:
        if isinstance(
            err,
            etcd_exc.ConnectionFailedError
            | etcd_exc.ConnectionTimeoutError
            | etcd_exc.NoServerAvailableError
            | etcd_exc.WatchTimedOut,
        ):
            return EtcdUnavailable(f"etcd unavailable: {str(err) or type(err).__name__}")
        return EtcdError(f"etcd error: {err!r}")
    code, details = rpc.code(), details_of(rpc)
    if BAD_PASSWORD in details:
        return EtcdAuthFailed(
            f"etcd refused user {auth.user!r}: wrong user name or password ({details});"
            " check the etcd user and password gms is configured with"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED or _NO_USER in details:
        return EtcdAuthFailed(_denied_message(auth, details))
    if any(mark in details for mark in _TOKEN_REJECTED):
        return EtcdAuthFailed(
            f"etcd refused the token it just gave user {auth.user!r} ({details});"
            " check the etcd user and password and etcd's --auth-token settings"
        )
    if code in UNAVAILABLE_CODES:
        lowered = details.lower()
        if auth.tls and any(mark in lowered for mark in _TLS_REFUSED_MARKS):
            return EtcdAuthFailed(
                f"TLS with etcd at {','.join(endpoints)} failed ({details}): check that the etcd"
                f" CA file {auth.ca} is the CA that signed etcd's certificate and that the"
                " certificate names the host of the endpoint"
            )
        return EtcdUnavailable(f"etcd unavailable: {code.name}: {details}{_closed_hint(auth, lowered)}")
    return EtcdError(f"etcd error {code.name}: {details}")


def _closed_hint(auth: EtcdAuth, details: str) -> str:
    """Why etcd may have closed a connection being set up (``details`` lower case)."""
    if not any(words in details for words in _SOCKET_CLOSED):
        return ""
    if auth.tls and "handshake" in details:
        return (
            "; etcd closed the connection in the TLS handshake, as an etcd that serves plaintext does:"
            " if its client URLs are http, not https, leave out the etcd CA file"
        )
    if not auth.tls and "failed to connect" in details:
        return (
            "; etcd closed the connection at once, as an etcd that serves TLS does to a plaintext"
            " client: if its client URLs are https, configure the etcd CA file"
        )
    return ""


def _denied_message(auth: EtcdAuth, details: str) -> str:
    if not auth.user:
        return (
            f"etcd refused access ({details}): it has authentication on and this client has no"
            " etcd user; configure the etcd user and password"
        )
    return (
        f"etcd denied user {auth.user!r} access ({details}): check that the user's etcd role"
        " grants read-write permission on the gms key prefix"
    )
