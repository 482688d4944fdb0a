"""Topic-name rules shared by the store, the broker, the client and the CLI.

A topic name becomes a directory name under ``store/consumequeue/``, so the allowed alphabet
excludes every path separator and the names ``.`` and ``..`` are refused: no name can escape the
store directory.
"""

import re

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


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


def group_of_topic(topic: str) -> str | None:
    """The consumer group whose retry or dead-letter topic ``topic`` is (None: an ordinary topic)."""
    for prefix in (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX):
        if topic.startswith(prefix) and len(topic) > len(prefix):
            return topic[len(prefix):]
    return None
