"""Errors raised by the nameserver's etcd layer and metadata model.

Topic errors are the shared wire classes of :mod:`gms.errors` (``TopicNotFoundError``,
``TopicAlreadyExistsError``, ``InvalidTopicError``), so ``except`` works on both sides of the
wire. The classes here add what only the etcd layer knows; where a wire class fits they also
derive from it, which gives them its status code and ``retriable`` flag.
"""

from gms.errors import (
    GmsError,
    NotEnoughReplicasError,
    ServerBusyError,
    ServiceUnavailableError,
)


class ClusterError(GmsError):
    """Root of the nameserver's errors."""


class EtcdUnavailable(ClusterError, ServiceUnavailableError):
    """No etcd endpoint answered in time; cached data may still be served."""


class EtcdError(ClusterError):
    """etcd answered with an error that retrying will not fix (bad request, internal error)."""


class EtcdAuthFailed(ClusterError):
    """etcd refused this client: no or wrong user/password, no permission on the keys, or a TLS
    handshake that failed (CA, certificate). Retrying will not help until the configuration
    changes; the message says what to check."""


class EtcdCompacted(ClusterError):
    """A watch asked for a revision etcd has compacted away; the caller must re-read."""

    retriable = True

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"etcd revision compacted up to {compacted_revision}")
        self.compacted_revision = compacted_revision


class EmbeddedEtcdError(ClusterError):
    """The embedded etcd binary is missing or did not become healthy."""


class NotEnoughBrokers(ClusterError, NotEnoughReplicasError):
    """Fewer live brokers than the replicas asked for; retriable once brokers register."""

    def __init__(self, replicas: int, live_brokers: int) -> None:
        super().__init__(
            f"{replicas} replica(s) requested but only {live_brokers} live broker(s) registered"
        )
        self.replicas = replicas
        self.live_brokers = live_brokers


class ConcurrentUpdate(ClusterError, ServerBusyError):
    """Another writer kept changing the same key; the compare-and-swap gave up."""


class ControllerFenced(ClusterError):
    """A controller's write was refused because its election key is gone or re-created: a
    newer controller may be acting, so this one must stop."""
