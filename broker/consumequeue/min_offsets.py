"""Queue minimum offsets moved by per-topic retention, kept across restarts.

A queue's minimum is otherwise derived on open from its first consumeQueue file (the first
written entry) and from the commitlog's first file. Per-topic retention moves it past entries
whose records are still in the commitlog (shared with topics that keep them longer) and whose
index file is still needed, so without this file a restart would serve expired records again.
A minimum never moves back: applied on open as ``max(derived, saved)``, capped at the queue's end.

One small JSON file ``{"v": 1, "queues": {topic: {queue_id: min_offset}}}``, replaced atomically
after a retention run that moved a minimum, and when a topic is deleted (a re-created topic
must not inherit its predecessor's minimums).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gms.broker.atomic_file import write_atomically

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
VERSION = 1


def load_min_offsets(path: Path) -> dict[QueueKey, int]:
    """The saved minimums; an unreadable file only costs serving expired records until the next
    retention run, so it is logged and ignored, never fatal."""
    try:
        data = json.loads(path.read_bytes())
        if data.get("v") != VERSION:
            raise ValueError(f"unsupported version {data.get('v')!r}")
        return {(topic, int(q)): int(o) for topic, queues in data["queues"].items() for q, o in queues.items()}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        log.error("ignoring unreadable queue minimums %s: %s", path, err)
        return {}


def save_min_offsets(path: Path, minimums: dict[QueueKey, int]) -> None:
    queues: dict[str, dict[str, int]] = {}
    for (topic, queue_id), offset in sorted(minimums.items()):
        if offset > 0:
            queues.setdefault(topic, {})[str(queue_id)] = offset
    write_atomically(path, json.dumps({"v": VERSION, "queues": queues}, sort_keys=True).encode())
