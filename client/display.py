"""How received messages and a group's lag read for people, shared by the CLI (``gms``) and the
web console: message bodies that are safe to show, a message as JSON, a group's lag per queue."""

from __future__ import annotations

import base64
from typing import Any

from gms.client.admin import Admin
from gms.client.structs import ReceivedMessage
from gms.errors import GmsError

NO_COMMIT = -1  # a queue's committed offset in a group description when the group committed none


def body_text(body: bytes) -> str:
    """Readable text as is; anything else (binary, control characters) escaped like a bytes repr."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return _escaped(body)
    if all(c.isprintable() or c == "\t" for c in text):
        return text
    return _escaped(body)


def _escaped(body: bytes) -> str:
    return repr(body)[2:-1]


def message_dict(msg: ReceivedMessage) -> dict[str, Any]:
    """One message for ``--format json`` / ``--json``: text bodies as text, others in base64."""
    body = msg.body
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "topic": msg.topic, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
        "msg_id": msg.msg_id, "tag": msg.tag, "keys": list(msg.keys),
        "properties": dict(msg.properties), "born_host": msg.born_host,
        "born_timestamp_ms": msg.born_timestamp_ms, "store_timestamp_ms": msg.store_timestamp_ms,
        "body": text if text is not None else base64.b64encode(body).decode("ascii"),
        "body_encoding": "utf-8" if text is not None else "base64",
    }


def group_lag(admin: Admin, described: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per queue of every topic the group committed on or is assigned: committed, max
    offset, lag (a queue without a commit is behind by all its messages, as for a new member)."""
    owners = {(m["broker"], topic, q): m["member"] for m in described["members"] for topic, q in m["queues"]}
    keys = set(owners)
    for broker, topics in described["offsets"].items():
        keys.update((broker, topic, q) for topic, queues in topics.items() for q in queues)
    max_offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
    # A topic deleted since is left out: its committed offsets are shown without a max.
    for topic, stats in admin.topics_stats(sorted({t for _, t, _ in keys})).items():
        if isinstance(stats, GmsError):
            raise stats
        max_offsets.update({(s["broker"], topic, s["queue_id"]): (s["min_offset"], s["max_offset"]) for s in stats})
    keys.update(max_offsets)
    rows = []
    for broker, topic, q in sorted(keys, key=lambda k: (k[1], k[2], k[0])):
        committed = described["offsets"].get(broker, {}).get(topic, {}).get(q, NO_COMMIT)
        bounds = max_offsets.get((broker, topic, q))
        high = lag = None
        if bounds is not None:
            low, high = bounds
            lag = high - (committed if committed >= 0 else low)  # nothing committed: all of the queue is behind
        rows.append({"topic": topic, "queue_id": q, "broker": broker, "member": owners.get((broker, topic, q)),
                     "committed": committed if committed >= 0 else None, "max_offset": high, "lag": lag})
    return rows
