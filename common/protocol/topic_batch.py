"""CREATE_TOPICS, the batched topic creation (nameserver and standalone broker): the request's
``topics`` entries and the per-topic result rows, shared by the servers and the Admin client.

A result row is ``{"topic", "status"}`` plus ``"error"`` (the message) when ``status`` is not
SUCCESS; the statuses are the wire statuses CREATE_TOPIC fails with (TOPIC_ALREADY_EXISTS,
INVALID_TOPIC, NOT_ENOUGH_REPLICAS, SERVICE_UNAVAILABLE...), so one topic's failure is reported
as its single-topic request would have been, and the others are created all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.errors import BadRequestError, GmsError, TopicAlreadyExistsError
from gms.protocol.codes import Status
from gms.protocol.fields import field

# Topics per CREATE_TOPICS request: keeps the request and its answer far below the 1 MiB header
# bound (the Admin client splits longer lists into requests of this many).
CREATE_TOPICS_MAX = 1000


def topic_entries(fields: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The request's ``topics``: a list of 1..CREATE_TOPICS_MAX objects (each checked by its user,
    so one bad entry fails alone). A non-object entry is kept as ``{"topic": entry}``."""
    entries = field(fields, "topics", list)
    if not 1 <= len(entries) <= CREATE_TOPICS_MAX:
        raise BadRequestError(f"'topics' must list 1..{CREATE_TOPICS_MAX} topics, not {len(entries)}")
    return [entry if isinstance(entry, dict) else {"topic": entry} for entry in entries]


def entry_name(entry: Mapping[str, Any]) -> Any:
    """The entry's name as given (whatever it is), to label its result row."""
    return entry.get("topic")


def repeated_name(name: str, seen: set[str]) -> None:
    """TOPIC_ALREADY_EXISTS for a name given earlier in the same request."""
    if name in seen:
        raise TopicAlreadyExistsError(f"topic {name} is named more than once in this request")
    seen.add(name)


def ok_row(name: str, **extra: Any) -> dict[str, Any]:
    return {"topic": name, "status": int(Status.SUCCESS), **extra}


def error_row(name: Any, err: GmsError) -> dict[str, Any]:
    return {"topic": name, "status": int(err.status), "error": str(err)}
