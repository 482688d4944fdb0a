"""Typed errors of the storage engine and the record codec.

All derive from ``gms.errors.GmsError`` (one error root); ``status`` values are the wire
status codes the broker answers with, ``retriable`` tells a client whether retrying can help.
"""

from gms.errors import (
    BadRequestError,
    GmsError,
    InvalidTopicError,
    MessageIllegalError,
    MessageNotFoundError,
    QueueNotFoundError,
    ServerError,
    ServiceUnavailableError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)


class StoreError(GmsError):
    """Base of the storage errors; each also derives from the wire error it is answered as."""


class CorruptRecord(StoreError, MessageIllegalError):
    """A record's bytes do not describe a valid record (bad length, magic or CRC)."""


    def __init__(self, pos: int, reason: str) -> None:
        super().__init__(f"corrupt record at byte {pos}: {reason}")
        self.pos = pos
        self.reason = reason


class InvalidRecord(StoreError, MessageIllegalError):
    """A message cannot be encoded or stored as given (a field out of its limits)."""


    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid {field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidTopicName(StoreError, InvalidTopicError):

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid topic name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class BodyTooLarge(InvalidRecord):

    def __init__(self, size_bytes: int, size_bytes_max: int) -> None:
        super().__init__("body", f"{size_bytes} bytes exceeds the limit of {size_bytes_max}")
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max


class MessageTooLarge(InvalidRecord):
    """A record is larger than its topic's ``message_size_bytes_max`` (the whole batch is refused)."""

    def __init__(self, topic: str, size_bytes: int, size_bytes_max: int) -> None:
        super().__init__("message", f"a record of {size_bytes} bytes exceeds topic {topic}'s limit of "
                                    f"{size_bytes_max} bytes (message_size_bytes_max, counted as stored:"
                                    " headers, topic, tag, keys, properties and body); nothing of the batch"
                                    f" was stored. To allow more: gms topic update {topic} --message-size-max N")
        self.topic = topic
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max


class UnknownTopic(StoreError, TopicNotFoundError):

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic


class UnknownQueue(StoreError, QueueNotFoundError):

    def __init__(self, topic: str, queue_id: int, queue_count: int) -> None:
        super().__init__(f"topic {topic!r} has no queue {queue_id} (it has {queue_count})")
        self.topic = topic
        self.queue_id = queue_id
        self.queue_count = queue_count


class TopicExists(StoreError, TopicAlreadyExistsError):

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class InvalidQueueCount(StoreError, BadRequestError):

    def __init__(self, queue_count: int, queue_count_max: int) -> None:
        super().__init__(f"queue count {queue_count} is outside 1..{queue_count_max}")


class MessageNotFound(StoreError, MessageNotFoundError):
    """No record starts at the physical offset asked for (expired, never written, or not a start)."""


    def __init__(self, phys_offset: int, reason: str) -> None:
        super().__init__(f"no message at physical offset {phys_offset}: {reason}")
        self.phys_offset = phys_offset


class StoreClosed(StoreError, ServiceUnavailableError):
    retriable = True

    def __init__(self) -> None:
        super().__init__("the message store is not open")


class StoreIOError(StoreError, ServerError):
    """The disk refused a write, a flush or a file creation."""

    retriable = True


class DescriptorLimitReached(StoreIOError):
    """A new store file would leave too few file descriptors below RLIMIT_NOFILE (refused before
    the process meets EMFILE; nothing of the request was stored)."""

    def __init__(self, path: str, in_use: int, limit: int, headroom: int) -> None:
        super().__init__(f"cannot create {path}: {in_use} file descriptors are open and the soft "
                         f"RLIMIT_NOFILE is {limit}; {headroom} are kept free for connections and "
                         "flushes (raise the limit, e.g. ulimit -n, or use fewer queues)")
        self.in_use = in_use
        self.limit = limit


class StoreReadOnly(StoreError, ServerError):
    """A flush failed earlier: the store takes no more writes until the broker restarts
    (fail-stop; see ``gms.broker.store.health``). Retrying on this broker cannot help."""

    retriable = False

    def __init__(self, cause: str) -> None:
        super().__init__(f"the store is read-only since a disk flush failed ({cause}); sends not yet "
                         "acknowledged may be lost: check the disk, then restart the broker (it recovers "
                         "from its last checkpoint)")
        self.cause = cause


class StoreCorrupt(StoreError, ServerError):
    """Stored files contradict each other in a way recovery cannot repair."""



class StoreInvariantBroken(StoreError, ServerError):
    """An invariant of the store's own bookkeeping does not hold (a bug): the write that found it
    stops there, before it could place data where readers or recovery do not expect it. Raised,
    not asserted, so ``python -O`` keeps the check."""


class StoreLayoutMismatch(StoreError, ServerError):
    """The store was created with another file geometry than the one configured."""


class BrokerIdentityMismatch(StoreError, ServerError):
    """The store belongs to a broker of another name than the one configured."""
