"""Typed errors of the storage engine and the record codec.

All derive from ``gms.errors.GmsError`` (one error root); ``status`` values are the wire
status codes the broker answers with, ``retriable`` tells a client whether retrying can help.
"""

from gms.errors import GmsError


class StoreError(GmsError):
    """Base of the storage errors."""

    status = 200


class CorruptRecord(StoreError):
    """A record's bytes do not describe a valid record (bad length, magic or CRC)."""

    status = 201

    def __init__(self, pos: int, reason: str) -> None:
        super().__init__(f"corrupt record at byte {pos}: {reason}")
        self.pos = pos
        self.reason = reason


class InvalidRecord(StoreError):
    """A message cannot be encoded or stored as given (a field out of its limits)."""

    status = 202

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid {field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidTopicName(StoreError):
    status = 203

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid topic name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class BodyTooLarge(InvalidRecord):
    status = 204

    def __init__(self, size_bytes: int, size_bytes_max: int) -> None:
        super().__init__("body", f"{size_bytes} bytes exceeds the limit of {size_bytes_max}")
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max


class EmptyBody(InvalidRecord):
    status = 205

    def __init__(self) -> None:
        super().__init__("body", "must not be empty")


class UnknownTopic(StoreError):
    status = 206

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic


class UnknownQueue(StoreError):
    status = 207

    def __init__(self, topic: str, queue_id: int, queue_count: int) -> None:
        super().__init__(f"topic {topic!r} has no queue {queue_id} (it has {queue_count})")
        self.topic = topic
        self.queue_id = queue_id
        self.queue_count = queue_count


class TopicExists(StoreError):
    status = 208

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class InvalidQueueCount(StoreError):
    status = 209

    def __init__(self, queue_count: int, queue_count_max: int) -> None:
        super().__init__(f"queue count {queue_count} is outside 1..{queue_count_max}")


class MessageNotFound(StoreError):
    """No record starts at the physical offset asked for (expired, never written, or not a start)."""

    status = 210

    def __init__(self, phys_offset: int, reason: str) -> None:
        super().__init__(f"no message at physical offset {phys_offset}: {reason}")
        self.phys_offset = phys_offset


class StoreClosed(StoreError):
    status = 211
    retriable = True

    def __init__(self) -> None:
        super().__init__("the message store is not open")


class StoreIOError(StoreError):
    """The disk refused a write, a flush or a file creation."""

    status = 212
    retriable = True


class StoreCorrupt(StoreError):
    """Stored files contradict each other in a way recovery cannot repair."""

    status = 213
