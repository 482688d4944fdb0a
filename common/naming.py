"""Topic-name rules shared by the store, the broker, the client and the CLI.

A topic name becomes a directory name under ``store/consumequeue/``, so the allowed alphabet
excludes every path separator and the names ``.`` and ``..`` are refused: no name can escape the
store directory.
"""

import re
from collections.abc import Mapping

from gms.store_errors import InvalidTopicName

TOPIC_NAME_BYTES_MAX = 127  # fits the record's u8 topic_len with a bit to spare, as RocketMQ
# A consumer group's own topics (RocketMQ's): messages it failed, redelivered after a backoff, and
# those it failed too often (docs/retries.md). Their access follows the group's.
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
_TOPIC_NAME_RE = re.compile(r"[A-Za-z0-9_.%-]+")
_RESERVED_NAMES = frozenset({".", ".."})


def validate_topic_name(name: str) -> str:
    """Return ``name`` unchanged if it is a legal topic name, else raise ``InvalidTopicName``."""
    if not isinstance(name, str):
        raise InvalidTopicName(repr(name), "must be a str")
    if not name:
        raise InvalidTopicName(name, "must not be empty")
    if len(name) > TOPIC_NAME_BYTES_MAX:
        raise InvalidTopicName(name, f"is {len(name)} characters, the limit is {TOPIC_NAME_BYTES_MAX}")
    if _TOPIC_NAME_RE.fullmatch(name) is None:
        raise InvalidTopicName(name, "may only contain characters from [A-Za-z0-9_.%-]")
    if name in _RESERVED_NAMES:
        raise InvalidTopicName(name, "is reserved")
    return name


# CREATE_TOPIC field: true when a client makes a group's own topic (``gms.client.retries.ensure_topic``);
# without it a name with a reserved prefix is refused, so no one makes one by mistake.
SYSTEM_TOPIC_FIELD = "system"
RESERVED_TOPIC_PREFIXES = (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX)


# The copy of a failed message in its group's retry or dead-letter topic (docs/retries.md) carries
# these properties; the SDK's consumers (gms.client.retries) and the broker's dead-letter service
# (gms.broker.services.dead_letters) make the same copy.
ORIGIN_TOPIC_PROPERTY = "__RETRY_TOPIC"  # the topic the failed message was first sent to
ORIGIN_MSG_ID_PROPERTY = "__RETRY_MSG_ID"  # its message id there
DLQ_REASON_PROPERTY = "__DLQ_REASON"  # why the last attempt failed (what nack was given)
GROUP_TOPIC_REPLICAS_MAX = 3  # a group's retry and dead-letter topics are replicated on up to this many brokers


def copy_properties(properties: Mapping[str, str], topic: str, msg_id: str) -> dict[str, str]:
    """The properties of the retry or dead-letter copy of a message of ``topic`` with id ``msg_id``:
    its own (not the internal ``__`` ones) and where it first came from (kept through copies)."""
    kept = {k: v for k, v in properties.items() if not k.startswith("__") or k in (ORIGIN_TOPIC_PROPERTY,
                                                                                    ORIGIN_MSG_ID_PROPERTY)}
    kept.setdefault(ORIGIN_TOPIC_PROPERTY, topic)
    kept.setdefault(ORIGIN_MSG_ID_PROPERTY, msg_id)
    return kept


def is_group_topic(name: str) -> bool:
    """Whether ``name`` has a consumer group's prefix (its retry or dead-letter topic)."""
    return name.startswith(RESERVED_TOPIC_PREFIXES)


def check_creatable(name: str, system: bool) -> str:
    """``name`` if a topic of that name may be created; a reserved prefix only by a client making a
    group's own topic (``system``). Raises ``InvalidTopicName`` saying what to do."""
    validate_topic_name(name)
    if not system and is_group_topic(name):
        prefix = next(p for p in RESERVED_TOPIC_PREFIXES if name.startswith(p))
        raise InvalidTopicName(name, f"names starting with {prefix} are reserved for consumer groups' retry and"
                                     " dead-letter topics, which their consumers create (docs/retries.md);"
                                     " pick another name")
    return name


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


# The reason a message moved to its group's dead-letter topic gives when its delivery attempts ran
# out (the SDK's SimpleConsumer and the RocketMQ endpoint's pops).
EXHAUSTED_REASON = "delivery attempts exhausted"


def group_of_topic(topic: str) -> str | None:
    """The consumer group whose retry or dead-letter topic ``topic`` is (None: an ordinary topic)."""
    for prefix in (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX):
        if topic.startswith(prefix) and len(topic) > len(prefix):
            return topic[len(prefix):]
    return None
