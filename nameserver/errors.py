"""Errors raised by the nameserver's etcd layer and metadata model.

All derive from :class:`gms.errors.GmsError`; ``retriable`` says whether the same call may
succeed later (etcd back, a broker registered, a concurrent writer done). Wire status codes are
inherited until the protocol assigns one per class.
"""

from gms.errors import GmsError


class NameserverError(GmsError):
    """Root of the nameserver's errors."""


class EtcdUnavailable(NameserverError):
    """No etcd endpoint answered in time; cached data may still be served."""

    retriable = True


class EtcdError(NameserverError):
    """etcd answered with an error that retrying will not fix (bad request, internal error)."""


class EtcdCompacted(NameserverError):
    """A watch asked for a revision etcd has compacted away; the caller must re-read."""

    retriable = True

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"etcd revision compacted up to {compacted_revision}")
        self.compacted_revision = compacted_revision


class EmbeddedEtcdError(NameserverError):
    """The embedded etcd binary is missing or did not become healthy."""


class InvalidTopicConfig(NameserverError):
    """A topic name, queue count, replica count or setting breaks the rules."""


class TopicExists(NameserverError):
    """create_topic on a name that is already taken."""


class TopicNotFound(NameserverError):
    """The topic is not in etcd (or not in the view's cache)."""


class NotEnoughBrokers(NameserverError):
    """Fewer live brokers than the replicas asked for; retriable once brokers register."""

    retriable = True

    def __init__(self, replicas: int, live_brokers: int) -> None:
        super().__init__(
            f"{replicas} replica(s) requested but only {live_brokers} live broker(s) registered"
        )
        self.replicas = replicas
        self.live_brokers = live_brokers


class ConcurrentUpdate(NameserverError):
    """Another writer kept changing the same key; the compare-and-swap gave up."""

    retriable = True
